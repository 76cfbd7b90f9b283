//! Builds the [`Status`] document from the tracker's window and charts, the gateway's
//! current snapshot (what is configured, each endpoint's health) and its reloads; then
//! lists what must stand out ([`alerts`]).

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tailguard_config::DEFAULT_CONFIG_NAME;
use tailguard_overload::OverloadMode;
use tailguard_proxy::Gateway;
use tailguard_proxy::snapshot::Snapshot;

use crate::model::{
    AccessLogStatus, Alert, BreakerStatus, Chart, CheckStatus, ConcurrencyStatus, ConfigSource,
    EndpointStatus, GatewayStatus, HealthSettingsStatus, History, NamedChart, ReloadStatus,
    RetryBudgetStatus, RouteStatus, SCHEMA_VERSION, Severity, ShedderStatus, Status, StatusClasses,
    TracingStatus, UpstreamStatus,
};
use crate::window::{Rates, Series, Tracker, history_interval};

/// What the page knows of the process, given at start.
#[derive(Debug, Clone)]
pub struct Info {
    /// The running build's version.
    pub version: String,
    /// Serving threads.
    pub threads: usize,
    /// When the process started.
    pub started: Instant,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, millis)
}

/// Each configured route's id and its upstream's name (`None`: it answers by itself): what
/// a sample needs to give an upstream its routes' requests. Built once per snapshot (see
/// `StatusPage::tick_at`), not per tick: 110,000 routes took 70 ms of every second.
pub(crate) fn route_upstreams(snapshot: &Snapshot) -> HashMap<String, Option<String>> {
    snapshot
        .router
        .routes()
        .iter()
        .map(|r| {
            let upstream = snapshot
                .upstreams
                .get(r.upstream)
                .map(|u| u.name.to_string());
            (r.id.to_string(), upstream)
        })
        .collect()
}

/// Builds the document as of `now`; `None` before the tracker's first tick.
pub(crate) fn build(
    info: &Info,
    tracker: &Tracker,
    gateway: &Gateway,
    now: Instant,
) -> Option<Status> {
    let snapshot = gateway.snapshot();
    let (new, old, seconds) = tracker.window()?;
    let per_s = |n: f64, o: f64| {
        if seconds > 0.0 {
            (n - o).max(0.0) / seconds
        } else {
            0.0
        }
    };
    let g = Rates::between(&new.gateway, Some(&old.gateway), seconds, &new.bounds);
    let reloads = gateway.reloads().recent();
    let config = &snapshot.config;
    let etcd = new.gauges.etcd;
    let source = ConfigSource {
        kind: if etcd.is_some() {
            "etcd"
        } else if config.source == DEFAULT_CONFIG_NAME {
            "default"
        } else {
            "file"
        },
        name: config.source.clone(),
        cached: etcd.map(|e| e.cached),
        connected: etcd.map(|e| e.connected),
        revision: etcd.map(|e| e.revision),
    };
    let gateway_status = GatewayStatus {
        version: info.version.clone(),
        uptime_s: now.saturating_duration_since(info.started).as_secs_f64(),
        config: source,
        reloads: reloads
            .iter()
            .rev()
            .map(|r| ReloadStatus {
                at_ms: epoch_ms(r.at),
                source: r.source.clone(),
                ok: r.error.is_none(),
                error: r.error.clone(),
            })
            .collect(),
        last_reload_ok: new.gauges.last_reload_ok,
        threads: info.threads,
        connections_open: new.gauges.connections_open,
        connections_parked: new.gauges.connections_parked,
        in_flight: new.gauges.in_flight,
        requests_per_s: g.rate,
        status_per_s: StatusClasses::from_array(g.classes),
        p50_ms: g.p50_ms,
        p99_ms: g.p99_ms,
    };

    let routes: Vec<RouteStatus> = snapshot
        .router
        .routes()
        .iter()
        .map(|r| {
            let id = r.id.to_string();
            let n = new.routes.get(&id);
            let o = old.routes.get(&id);
            let rates =
                n.map(|n| Rates::between(&n.traffic, o.map(|o| &o.traffic), seconds, &new.bounds));
            let rates = rates.unwrap_or_default();
            let delta = |f: fn(&crate::sample::RouteSample) -> f64| {
                per_s(n.map_or(0.0, f), o.map_or(0.0, f))
            };
            RouteStatus {
                upstream: snapshot
                    .upstreams
                    .get(r.upstream)
                    .map(|u| u.name.to_string()),
                requests_per_s: rates.rate,
                status_per_s: StatusClasses::from_array(rates.classes),
                p50_ms: rates.p50_ms,
                p99_ms: rates.p99_ms,
                rate_limited_per_s: delta(|r| r.rate_limited),
                shed_per_s: delta(|r| r.shed),
                retries_per_s: delta(|r| r.retries),
                shedding: new.gauges.hot_routes.contains(&id),
                id,
            }
        })
        .collect();

    let tolerance = config.overload.limit_config().map(|l| l.tolerance);
    let upstreams: Vec<UpstreamStatus> = snapshot
        .upstreams
        .iter()
        .enumerate()
        .map(|(index, u)| {
            let name = u.name.to_string();
            let cfg = config.upstreams.iter().find(|c| *c.name.get_ref() == name);
            let n = new.upstreams.get(&name);
            let o = old.upstreams.get(&name);
            let rates = n
                .map(|n| {
                    Rates::between(
                        &n.traffic,
                        o.map(|o| &o.traffic),
                        seconds,
                        &new.upstream_bounds,
                    )
                })
                .unwrap_or_default();
            let endpoints: Vec<EndpointStatus> = u
                .endpoints
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    let key = (name.clone(), e.addr.to_string());
                    let en = new.endpoints.get(&key);
                    let eo = old.endpoints.get(&key);
                    let latency = en.map(|en| en.latency.since(eo.map(|eo| &eo.latency)));
                    let report = e.health.report(now);
                    EndpointStatus {
                        address: key.1,
                        name: e.name.as_ref().map(ToString::to_string),
                        weight: e.weight,
                        state: report.state,
                        reason: report.reason,
                        since_ms: report.since.map(millis),
                        ejected_for_ms: report.ejected_for.map(millis),
                        last_check: report.last_check.map(|(age, ok, result)| CheckStatus {
                            age_ms: millis(age),
                            ok,
                            result,
                        }),
                        failures: report.failures,
                        in_flight: u.balance.in_flight(i),
                        ewma_ms: u
                            .balance
                            .latency_estimate(i)
                            .map(|d| d.as_secs_f64() * 1000.0),
                        latency_ms: latency
                            .filter(|l| l.count() > 0)
                            .map(|l| l.sum / l.count() as f64 * 1000.0),
                        picks_per_s: per_s(
                            en.map_or(0.0, |e| e.picks),
                            eo.map_or(0.0, |e| e.picks),
                        ),
                        pooled: e.pool.idle_count(),
                    }
                })
                .collect();
            let limit = new.gauges.limits.get(&name);
            let mut breakers: Vec<BreakerStatus> = new
                .gauges
                .breakers
                .iter()
                .filter(|((upstream, _), _)| *upstream == name)
                .map(|((_, route), (state, ratio))| BreakerStatus {
                    route: route.clone(),
                    state: match *state as i64 {
                        0 => "closed",
                        1 => "throttling",
                        _ => "open",
                    },
                    reject_ratio: *ratio,
                })
                .collect();
            breakers.sort_by(|a, b| a.route.cmp(&b.route));
            UpstreamStatus {
                protocol: u.protocol.as_str().to_owned(),
                balance: match cfg.map(|c| c.balance) {
                    Some(tailguard_config::BalanceKind::P2cEwma) => "p2c_ewma",
                    _ => "round_robin",
                }
                .to_owned(),
                unavailable: u.unavailable.as_ref().map(ToString::to_string),
                endpoints_up: endpoints.iter().filter(|e| e.state == "up").count(),
                endpoints_total: endpoints.len(),
                requests_per_s: rates.rate,
                errors_per_s: rates.classes[4],
                p50_ms: rates.p50_ms,
                p99_ms: rates.p99_ms,
                retries_per_s: per_s(n.map_or(0.0, |n| n.retries), o.map_or(0.0, |o| o.retries)),
                retry_budget: snapshot
                    .overload
                    .retry_budget(index)
                    .map(|r| RetryBudgetStatus {
                        used: r.used,
                        allowed: r.allowed,
                    }),
                concurrency: limit.map(|l| ConcurrencyStatus {
                    limit: l.limit,
                    in_flight: l.in_flight,
                    min_rtt_ms: l.min_rtt.map(|s| s * 1000.0),
                    target_ms: l
                        .min_rtt
                        .zip(tolerance)
                        .map(|(s, t)| s * (1.0 + t) * 1000.0),
                    overloaded: l.overloaded,
                    refused_per_s: per_s(
                        n.map_or(0.0, |n| n.limited),
                        o.map_or(0.0, |o| o.limited),
                    ),
                }),
                breakers,
                health: u.health.as_ref().map(|h| HealthSettingsStatus {
                    check_path: h.active.as_ref().map(|a| a.path.clone()),
                    check_interval_ms: h.active.as_ref().map(|a| millis(a.interval)),
                    ejection: h.ejection.is_some(),
                }),
                endpoints,
                name,
            }
        })
        .collect();

    let t = (&new.totals, &old.totals);
    let rate_of = |f: fn(&crate::sample::Totals) -> Option<f64>| {
        per_s(f(t.0).unwrap_or(0.0), f(t.1).unwrap_or(0.0))
    };
    let overload = &config.overload;
    let shedder = ShedderStatus {
        mode: match overload.mode {
            OverloadMode::Off => "off",
            OverloadMode::Adaptive => "adaptive",
            OverloadMode::Gozero => "gozero",
        }
        .to_owned(),
        cpu: new
            .gauges
            .cpu
            .filter(|_| overload.mode != OverloadMode::Off),
        threshold: overload.threshold,
        shed_per_s: per_s(new.totals.shed, old.totals.shed),
        shedding_routes: new.gauges.hot_routes.clone(),
    };
    let tracing = TracingStatus {
        enabled: new.totals.spans_exported.is_some(),
        spans_exported: new.totals.spans_exported.unwrap_or(0.0),
        spans_dropped: new.totals.spans_dropped.unwrap_or(0.0),
        export_errors: new.totals.export_errors.unwrap_or(0.0),
        exported_per_s: rate_of(|t| t.spans_exported),
        dropped_per_s: rate_of(|t| t.spans_dropped),
        queue: new.gauges.trace_queue.unwrap_or(0.0),
    };
    let logs = |c: &tailguard_access_log::Config| c.path != tailguard_access_log::Output::Off;
    let access_log = AccessLogStatus {
        enabled: logs(&config.access_log)
            || config
                .listeners
                .iter()
                .any(|l| l.access_log.as_ref().is_some_and(logs)),
        lines_written: new.totals.log_written.unwrap_or(0.0),
        lines_dropped: new.totals.log_dropped.unwrap_or(0.0),
        write_errors: new.totals.log_write_errors.unwrap_or(0.0),
        written_per_s: rate_of(|t| t.log_written),
        dropped_per_s: rate_of(|t| t.log_dropped),
    };
    let history = History {
        interval_s: history_interval().as_secs(),
        gateway: chart(&tracker.gateway),
        upstreams: upstreams
            .iter()
            .map(|u| NamedChart {
                name: u.name.clone(),
                chart: tracker
                    .upstreams
                    .get(&u.name)
                    .map(chart)
                    .unwrap_or_default(),
            })
            .collect(),
    };
    let mut status = Status {
        schema: SCHEMA_VERSION,
        generated_at_ms: epoch_ms(SystemTime::now()),
        alerts: Vec::new(),
        gateway: gateway_status,
        routes,
        upstreams,
        shedder,
        tracing,
        access_log,
        history,
    };
    status.alerts = alerts(&status);
    Some(status)
}

fn chart(series: &Series) -> Chart {
    Chart {
        requests_per_s: series.0.iter().map(|p| round(p.rate)).collect(),
        errors_per_s: series.0.iter().map(|p| round(p.errors)).collect(),
        p99_ms: series.0.iter().map(|p| p.p99_ms.map(round)).collect(),
    }
}

/// Three significant decimals are plenty for a chart, and keep the JSON small.
fn round(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// What must stand out, red before amber.
pub(crate) fn alerts(s: &Status) -> Vec<Alert> {
    let mut out = Vec::new();
    let mut push = |severity, kind, subject: &str, message: String| {
        out.push(Alert {
            severity,
            kind,
            subject: subject.to_owned(),
            message,
        });
    };
    if !s.gateway.last_reload_ok {
        let why = s
            .gateway
            .reloads
            .iter()
            .find(|r| !r.ok)
            .and_then(|r| r.error.as_deref().map(|e| format!("{}: {e}", r.source)))
            .unwrap_or_else(|| "see the log".to_owned());
        push(
            Severity::Red,
            "reload_failed",
            "gateway",
            format!(
                "the last config reload was rejected; the previous config keeps serving ({why})"
            ),
        );
    }
    if s.gateway.config.connected == Some(false) {
        push(
            Severity::Amber,
            "etcd_disconnected",
            "gateway",
            format!(
                "the etcd watch is down: serving {} until etcd answers",
                s.gateway.config.name
            ),
        );
    }
    for u in &s.upstreams {
        if let Some(why) = &u.unavailable {
            push(
                Severity::Red,
                "upstream_down",
                &u.name,
                format!("no endpoint: {why}"),
            );
        } else if u.endpoints_total > 0 && u.endpoints_up == 0 {
            push(
                Severity::Red,
                "upstream_down",
                &u.name,
                format!("every endpoint of {} is down: its requests get 503", u.name),
            );
        }
        for e in &u.endpoints {
            if e.state != "up" {
                let mut message = format!("{} is {}", e.address, e.state);
                if let Some(why) = &e.reason {
                    message.push_str(&format!(" ({why})"));
                }
                if let Some(left) = e.ejected_for_ms {
                    message.push_str(&format!(", back in {:.1} s", left as f64 / 1000.0));
                }
                push(
                    Severity::Red,
                    "endpoint_down",
                    &format!("{}/{}", u.name, e.address),
                    message,
                );
            }
        }
        for b in &u.breakers {
            if b.state != "closed" {
                push(
                    Severity::Red,
                    "breaker_open",
                    &format!("{}/{}", u.name, b.route),
                    format!(
                        "the breaker of route {} to {} is {}: it rejects {:.0} % of requests",
                        b.route,
                        u.name,
                        b.state,
                        b.reject_ratio * 100.0
                    ),
                );
            }
        }
        if let Some(c) = &u.concurrency
            && (c.overloaded || c.refused_per_s > 0.0)
        {
            push(
                Severity::Amber,
                "upstream_overloaded",
                &u.name,
                format!(
                    "{} is at its concurrency limit ({:.0} in flight of {:.0}), refusing {:.1} / s",
                    u.name, c.in_flight, c.limit, c.refused_per_s
                ),
            );
        }
    }
    for r in &s.routes {
        if r.shed_per_s > 0.0 {
            push(
                Severity::Red,
                "route_shedding",
                &r.id,
                format!(
                    "route {} sheds {:.1} requests / s (503)",
                    r.id, r.shed_per_s
                ),
            );
        } else if r.status_per_s.c5xx > 0.0 {
            push(
                Severity::Amber,
                "route_errors",
                &r.id,
                format!(
                    "route {} answers {:.1} 5xx / s of {:.1} requests / s",
                    r.id, r.status_per_s.c5xx, r.requests_per_s
                ),
            );
        }
    }
    if s.tracing.dropped_per_s > 0.0 {
        push(
            Severity::Amber,
            "spans_dropped",
            "tracing",
            format!("{:.1} spans / s dropped", s.tracing.dropped_per_s),
        );
    }
    if s.access_log.dropped_per_s > 0.0 {
        push(
            Severity::Amber,
            "log_lines_dropped",
            "access_log",
            format!(
                "{:.1} access-log lines / s dropped",
                s.access_log.dropped_per_s
            ),
        );
    }
    out.sort_by_key(|a| a.severity);
    out
}

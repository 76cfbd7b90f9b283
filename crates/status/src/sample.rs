//! One reading of the registry: the totals the page derives its rates from, summed per
//! route, upstream and endpoint from the same shards a scrape sums, and the gauges as they
//! stand.
//!
//! The families are found by the names `docs/metrics.md` lists; a family that is not
//! registered (tracing off, no etcd) reads as absent, never as zero.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Instant;

use tailguard_metrics::{SeriesReading, Snapshot};

/// A latency histogram's buckets (not cumulative, `+Inf` last) and sum.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Latency {
    pub(crate) buckets: Vec<u64>,
    pub(crate) sum: f64,
}

impl Latency {
    fn add(&mut self, series: &SeriesReading<'_>) {
        series.add_buckets(&mut self.buckets);
        self.sum += series.sum();
    }

    fn add_latency(&mut self, other: &Latency) {
        if self.buckets.len() < other.buckets.len() {
            self.buckets.resize(other.buckets.len(), 0);
        }
        for (total, n) in self.buckets.iter_mut().zip(&other.buckets) {
            *total = total.wrapping_add(*n);
        }
        self.sum += other.sum;
    }

    /// What was observed between `older` and `self`.
    pub(crate) fn since(&self, older: Option<&Latency>) -> Latency {
        let Some(older) = older else {
            return self.clone();
        };
        Latency {
            buckets: self
                .buckets
                .iter()
                .enumerate()
                .map(|(i, n)| n.saturating_sub(older.buckets.get(i).copied().unwrap_or(0)))
                .collect(),
            sum: (self.sum - older.sum).max(0.0),
        }
    }

    /// Observations counted.
    pub(crate) fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The `q` quantile in seconds, interpolated inside its bucket as Prometheus's
    /// `histogram_quantile` does (the `+Inf` bucket answers its lower bound); `None` without
    /// observations.
    pub(crate) fn quantile(&self, bounds: &[f64], q: f64) -> Option<f64> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        let rank = q * count as f64;
        let mut below = 0u64;
        for (i, &n) in self.buckets.iter().enumerate() {
            if n > 0 && (below + n) as f64 >= rank {
                let Some(&upper) = bounds.get(i) else {
                    return bounds.last().copied();
                };
                let lower = if i == 0 { 0.0 } else { bounds[i - 1] };
                let into = ((rank - below as f64) / n as f64).clamp(0.0, 1.0);
                return Some(lower + (upper - lower) * into);
            }
            below += n;
        }
        bounds.last().copied()
    }
}

/// Requests by status class and their latency.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Traffic {
    pub(crate) requests: f64,
    /// `1xx` ... `5xx`; a request that ended without a status counts in none.
    pub(crate) classes: [f64; 5],
    pub(crate) latency: Latency,
}

/// A route's totals.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RouteSample {
    pub(crate) traffic: Traffic,
    pub(crate) rate_limited: f64,
    pub(crate) shed: f64,
    pub(crate) retries: f64,
}

/// An upstream's totals: its routes' requests, its endpoints' latency.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct UpstreamSample {
    pub(crate) traffic: Traffic,
    pub(crate) retries: f64,
    pub(crate) limited: f64,
}

/// An endpoint's totals.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct EndpointSample {
    pub(crate) latency: Latency,
    pub(crate) picks: f64,
}

/// Process-wide totals (absent when their family is not registered).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Totals {
    pub(crate) shed: f64,
    pub(crate) spans_exported: Option<f64>,
    pub(crate) spans_dropped: Option<f64>,
    pub(crate) export_errors: Option<f64>,
    pub(crate) log_written: Option<f64>,
    pub(crate) log_dropped: Option<f64>,
    pub(crate) log_write_errors: Option<f64>,
}

/// An upstream's concurrency limit as it stands.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LimitGauges {
    pub(crate) limit: f64,
    pub(crate) in_flight: f64,
    pub(crate) min_rtt: Option<f64>,
    pub(crate) overloaded: bool,
}

/// The etcd source as it stands.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct EtcdGauges {
    pub(crate) revision: f64,
    pub(crate) cached: bool,
    pub(crate) connected: bool,
}

/// Values that are read as they stand, not as rates.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Gauges {
    pub(crate) connections_open: f64,
    pub(crate) connections_parked: f64,
    pub(crate) in_flight: f64,
    pub(crate) last_reload_ok: bool,
    pub(crate) cpu: Option<f64>,
    pub(crate) hot_routes: Vec<String>,
    pub(crate) limits: HashMap<String, LimitGauges>,
    /// By (upstream, route): state (0 closed, 1 throttling, 2 open) and reject ratio.
    pub(crate) breakers: HashMap<(String, String), (f64, f64)>,
    pub(crate) trace_queue: Option<f64>,
    pub(crate) etcd: Option<EtcdGauges>,
}

/// Everything one tick read.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub(crate) at: Instant,
    pub(crate) gateway: Traffic,
    pub(crate) routes: HashMap<String, RouteSample>,
    pub(crate) upstreams: HashMap<String, UpstreamSample>,
    pub(crate) endpoints: HashMap<(String, String), EndpointSample>,
    pub(crate) totals: Totals,
    pub(crate) gauges: Gauges,
    /// Bucket bounds of the request and upstream latency histograms.
    pub(crate) bounds: Vec<f64>,
    pub(crate) upstream_bounds: Vec<f64>,
}

/// Calls `each` with the label values and series of every series of `family`.
fn each<'a>(
    snapshot: &'a Snapshot,
    family: &str,
    mut each: impl FnMut(&[Cow<'a, str>], &SeriesReading<'a>),
) -> bool {
    let Some(f) = snapshot.family(family) else {
        return false;
    };
    for series in f.series() {
        each(&series.label_values(), &series);
    }
    true
}

/// The sum of every series of `family`, `None` if it is not registered.
fn total(snapshot: &Snapshot, family: &str) -> Option<f64> {
    let mut sum = 0.0;
    each(snapshot, family, |_, s| sum += s.value()).then_some(sum)
}

/// The value of a family without labels (its first series).
fn single(snapshot: &Snapshot, family: &str) -> Option<f64> {
    snapshot.family(family)?.series().next().map(|s| s.value())
}

impl Sample {
    /// Reads `snapshot` (taken by the caller, scrape hooks run) at `at`. `routes` maps each
    /// configured route id to its upstream's name (`None`: it answers by itself), so that an
    /// upstream's requests are its routes'. A route gets an entry once a series names it:
    /// the work of a tick follows the series, not the route table (a route that has served
    /// nothing has none, and reads as zeros).
    pub(crate) fn read(
        snapshot: &Snapshot,
        at: Instant,
        routes: &HashMap<String, Option<String>>,
    ) -> Sample {
        let mut by_route: HashMap<String, RouteSample> = HashMap::new();
        // The entry of a configured route; `None` for a series of a route no longer
        // configured (a reload removed it).
        fn entry<'a>(
            by_route: &'a mut HashMap<String, RouteSample>,
            routes: &HashMap<String, Option<String>>,
            id: &str,
        ) -> Option<&'a mut RouteSample> {
            if !by_route.contains_key(id) {
                if !routes.contains_key(id) {
                    return None;
                }
                by_route.insert(id.to_owned(), RouteSample::default());
            }
            by_route.get_mut(id)
        }
        let mut gateway = Traffic::default();
        each(snapshot, "tailguard_requests", |labels, s| {
            let (Some(route), Some(status)) = (labels.first(), labels.get(2)) else {
                return;
            };
            let n = s.value();
            gateway.requests += n;
            // `2xx` → 1; `error` (no response) is in no class.
            let class = status
                .as_bytes()
                .first()
                .map(|b| b.wrapping_sub(b'1'))
                .filter(|c| *c < 5)
                .map(usize::from);
            if let Some(c) = class {
                gateway.classes[c] += n;
            }
            if let Some(r) = entry(&mut by_route, routes, route) {
                r.traffic.requests += n;
                if let Some(c) = class {
                    r.traffic.classes[c] += n;
                }
            }
        });
        let mut bounds = Vec::new();
        if let Some(f) = snapshot.family("tailguard_request_duration_seconds") {
            bounds = f.bounds().to_vec();
            for s in f.series() {
                gateway.latency.add(&s);
                if let Some(r) = s
                    .label_values()
                    .first()
                    .and_then(|id| entry(&mut by_route, routes, id))
                {
                    r.traffic.latency.add(&s);
                }
            }
        }
        each(snapshot, "tailguard_rate_limited", |labels, s| {
            if let Some(r) = labels
                .get(1)
                .and_then(|id| entry(&mut by_route, routes, id))
            {
                r.rate_limited += s.value();
            }
        });
        let mut shed = 0.0;
        each(snapshot, "tailguard_overload_shed", |labels, s| {
            shed += s.value();
            if let Some(r) = labels
                .first()
                .and_then(|id| entry(&mut by_route, routes, id))
            {
                r.shed += s.value();
            }
        });
        each(snapshot, "tailguard_upstream_retries", |labels, s| {
            if let Some(r) = labels
                .first()
                .and_then(|id| entry(&mut by_route, routes, id))
            {
                r.retries += s.value();
            }
        });

        let mut upstreams: HashMap<String, UpstreamSample> = HashMap::new();
        for (id, r) in &by_route {
            let Some(Some(upstream)) = routes.get(id) else {
                continue;
            };
            let u = upstreams.entry(upstream.clone()).or_default();
            u.traffic.requests += r.traffic.requests;
            for (total, n) in u.traffic.classes.iter_mut().zip(r.traffic.classes) {
                *total += n;
            }
            u.retries += r.retries;
        }
        let mut endpoints: HashMap<(String, String), EndpointSample> = HashMap::new();
        let mut upstream_bounds = Vec::new();
        if let Some(f) = snapshot.family("tailguard_upstream_duration_seconds") {
            upstream_bounds = f.bounds().to_vec();
            for s in f.series() {
                let labels = s.label_values();
                let (Some(u), Some(e)) = (labels.first(), labels.get(1)) else {
                    continue;
                };
                endpoints
                    .entry((u.to_string(), e.to_string()))
                    .or_default()
                    .latency
                    .add(&s);
            }
        }
        each(snapshot, "tailguard_balancer_picks", |labels, s| {
            if let (Some(u), Some(e)) = (labels.first(), labels.get(1)) {
                endpoints
                    .entry((u.to_string(), e.to_string()))
                    .or_default()
                    .picks += s.value();
            }
        });
        for ((u, _), e) in &endpoints {
            if let Some(up) = upstreams.get_mut(u) {
                up.traffic.latency.add_latency(&e.latency);
            }
        }
        each(snapshot, "tailguard_upstream_limited", |labels, s| {
            if let Some(u) = labels.first().and_then(|u| upstreams.get_mut(u.as_ref())) {
                u.limited += s.value();
            }
        });

        let totals = Totals {
            shed,
            spans_exported: total(snapshot, "tailguard_trace_spans_exported"),
            spans_dropped: total(snapshot, "tailguard_trace_spans_dropped"),
            export_errors: total(snapshot, "tailguard_trace_export_errors"),
            log_written: total(snapshot, "tailguard_access_log_lines_written"),
            log_dropped: total(snapshot, "tailguard_access_log_dropped_lines"),
            log_write_errors: total(snapshot, "tailguard_access_log_write_errors"),
        };
        Sample {
            at,
            gateway,
            routes: by_route,
            upstreams,
            endpoints,
            totals,
            gauges: gauges(snapshot),
            bounds,
            upstream_bounds,
        }
    }
}

fn gauges(snapshot: &Snapshot) -> Gauges {
    let mut hot_routes = Vec::new();
    each(snapshot, "tailguard_overload_hot", |labels, s| {
        if s.value() > 0.0
            && let Some(group) = labels.first()
        {
            hot_routes.push(group.to_string());
        }
    });
    let mut limits: HashMap<String, LimitGauges> = HashMap::new();
    let mut limit = |family: &str, set: fn(&mut LimitGauges, f64)| {
        each(snapshot, family, |labels, s| {
            if let Some(u) = labels.first() {
                set(limits.entry(u.to_string()).or_default(), s.value());
            }
        });
    };
    limit("tailguard_upstream_limit", |l, v| l.limit = v);
    limit("tailguard_upstream_inflight", |l, v| l.in_flight = v);
    limit("tailguard_upstream_min_rtt_seconds", |l, v| {
        l.min_rtt = (v > 0.0).then_some(v);
    });
    limit("tailguard_upstream_overloaded", |l, v| {
        l.overloaded = v > 0.0
    });
    let mut breakers: HashMap<(String, String), (f64, f64)> = HashMap::new();
    each(snapshot, "tailguard_breaker_state", |labels, s| {
        if let (Some(u), Some(r)) = (labels.first(), labels.get(1)) {
            breakers
                .entry((u.to_string(), r.to_string()))
                .or_default()
                .0 = s.value();
        }
    });
    each(snapshot, "tailguard_breaker_reject_ratio", |labels, s| {
        if let (Some(u), Some(r)) = (labels.first(), labels.get(1)) {
            breakers
                .entry((u.to_string(), r.to_string()))
                .or_default()
                .1 = s.value();
        }
    });
    Gauges {
        connections_open: single(snapshot, "tailguard_downstream_connections_active")
            .unwrap_or(0.0),
        connections_parked: single(snapshot, "tailguard_downstream_connections_parked")
            .unwrap_or(0.0),
        in_flight: single(snapshot, "tailguard_requests_in_flight").unwrap_or(0.0),
        last_reload_ok: single(snapshot, "tailguard_config_last_reload_successful")
            .is_none_or(|v| v > 0.0),
        cpu: single(snapshot, "tailguard_overload_cpu_usage_ratio"),
        hot_routes,
        limits,
        breakers,
        trace_queue: single(snapshot, "tailguard_trace_queue_spans"),
        etcd: single(snapshot, "tailguard_config_etcd_revision").map(|revision| EtcdGauges {
            revision,
            cached: single(snapshot, "tailguard_config_etcd_cached").is_some_and(|v| v > 0.0),
            connected: single(snapshot, "tailguard_config_etcd_connected").is_some_and(|v| v > 0.0),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_inside_the_bucket() {
        let bounds = [0.1, 0.2, 0.4];
        let l = Latency {
            buckets: vec![0, 10, 0, 0],
            sum: 1.5,
        };
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
        assert!(close(l.quantile(&bounds, 0.5), 0.15));
        let q99 = l.quantile(&bounds, 0.99).unwrap();
        assert!((q99 - 0.199).abs() < 1e-9, "{q99}");
        let slow = Latency {
            buckets: vec![90, 0, 0, 10],
            sum: 0.0,
        };
        assert_eq!(
            slow.quantile(&bounds, 0.99),
            Some(0.4),
            "+Inf: the last bound"
        );
        assert!(close(slow.quantile(&bounds, 0.5), 0.1 * 50.0 / 90.0));
        assert_eq!(Latency::default().quantile(&bounds, 0.5), None);
        let older = Latency {
            buckets: vec![40, 0, 0, 10],
            sum: 0.0,
        };
        assert_eq!(slow.since(Some(&older)).buckets, [50, 0, 0, 0]);
    }
}

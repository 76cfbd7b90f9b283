//! Exposes the overload layers through tailguard-metrics, mirrored at scrape time.
//!
//! The controllers already keep what the metrics show (in-flight, L, C, CPU, shed counts,
//! breaker state, picks) in their own atomics, so the request path records nothing twice:
//! a scrape hook, on the exporter's thread, copies the values into metric handles.
//! Components are watched through `Weak` references, so a breaker or balancer dropped by
//! a config reload simply stops being updated. The balancer family is registered by the
//! first [`OverloadMetrics::watch_balancer`]: a gateway that counts picks itself (for any
//! balancer) registers the same name and never watches one.

use std::sync::{Arc, Mutex, OnceLock, Weak};

use tailguard_metrics::{Family, FloatCounter, FloatGauge, Gauge, MetricsError, Registry};

use crate::balance::P2c;
use crate::breaker::Breaker;
use crate::class::Class;
use crate::sampler::CpuGauge;
use crate::shedder::Shedder;
use crate::{Clock, MonotonicClock};

/// Something with per-endpoint pick counts (a [`P2c`] of any endpoint type).
trait PickCounts: Send + Sync {
    fn picks(&self, i: usize) -> u64;
}

impl<E: Send + Sync> PickCounts for P2c<E> {
    fn picks(&self, i: usize) -> u64 {
        P2c::picks(self, i)
    }
}

#[derive(Default)]
struct Watched {
    shedders: Vec<Shedder>,
    cpu: Vec<Weak<CpuGauge>>,
    breakers: Vec<(String, String, Weak<Breaker>)>,
    balancers: Vec<(String, Vec<String>, Weak<dyn PickCounts>)>,
}

struct Families {
    cpu: FloatGauge,
    cpu_errors: FloatCounter,
    cores: FloatGauge,
    inflight: Family<Gauge>,
    limit: Family<FloatGauge>,
    capacity: Family<FloatGauge>,
    hot: Family<Gauge>,
    admitted: Family<FloatCounter>,
    shed: Family<FloatCounter>,
    upstream_limit: Family<FloatGauge>,
    upstream_inflight: Family<Gauge>,
    upstream_limited: Family<FloatCounter>,
    upstream_min_rtt: Family<FloatGauge>,
    upstream_hot: Family<Gauge>,
    breaker_state: Family<Gauge>,
    breaker_ratio: Family<FloatGauge>,
    breaker_rejected: Family<FloatCounter>,
    /// Registered on the first `watch_balancer`.
    picks: Arc<OnceLock<Family<FloatCounter>>>,
}

/// The overload metrics of one registry. Cheap to clone.
#[derive(Clone)]
pub struct OverloadMetrics {
    watched: Arc<Mutex<Watched>>,
    registry: Registry,
    picks: Arc<OnceLock<Family<FloatCounter>>>,
}

impl std::fmt::Debug for OverloadMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OverloadMetrics")
    }
}

impl OverloadMetrics {
    /// Registers the families and the scrape hook.
    pub fn register(registry: &Registry) -> Result<Self, MetricsError> {
        let group = &["group"];
        let f = Families {
            cpu: registry
                .float_gauge(
                    "tailguard_overload_cpu_usage_ratio",
                    "Smoothed CPU usage of this process's budget (1 = all allowed cores).",
                    &[],
                )?
                .get_or_create(&[])?,
            cpu_errors: registry
                .float_counter(
                    "tailguard_overload_cpu_read_errors",
                    "Failed CPU readings (the previous value was kept).",
                    &[],
                )?
                .get_or_create(&[])?,
            cores: registry
                .float_gauge(
                    "tailguard_overload_cores",
                    "Cores this process may use: min(cpuset, quota, affinity).",
                    &[],
                )?
                .get_or_create(&[])?,
            inflight: registry.gauge(
                "tailguard_overload_inflight",
                "Requests in flight per route group.",
                group,
            )?,
            limit: registry.float_gauge(
                "tailguard_overload_limit",
                "Admission limit L per route group (normal class).",
                group,
            )?,
            capacity: registry.float_gauge(
                "tailguard_overload_capacity",
                "Estimated capacity C = maxPass x minRt per route group.",
                group,
            )?,
            hot: registry.gauge(
                "tailguard_overload_hot",
                "1 while the route group sheds above its limit.",
                group,
            )?,
            admitted: registry.float_counter(
                "tailguard_overload_admitted",
                "Requests admitted per route group.",
                group,
            )?,
            shed: registry.float_counter(
                "tailguard_overload_shed",
                "Requests shed per route group and priority class.",
                &["group", "class"],
            )?,
            upstream_limit: registry.float_gauge(
                "tailguard_upstream_limit",
                "Concurrency limit per upstream admissions see now (normal class).",
                &["upstream"],
            )?,
            upstream_inflight: registry.gauge(
                "tailguard_upstream_inflight",
                "Requests in flight per upstream, as its concurrency limit counts them.",
                &["upstream"],
            )?,
            upstream_limited: registry.float_counter(
                "tailguard_upstream_limited",
                "Requests rejected by the upstream's concurrency limit, per priority class.",
                &["upstream", "class"],
            )?,
            upstream_min_rtt: registry.float_gauge(
                "tailguard_upstream_min_rtt_seconds",
                "The upstream's no-queue response time, as its concurrency limit measured it.",
                &["upstream"],
            )?,
            upstream_hot: registry.gauge(
                "tailguard_upstream_overloaded",
                "1 while the upstream's concurrency limit sees an overload and enforces L.",
                &["upstream"],
            )?,
            breaker_state: registry.gauge(
                "tailguard_breaker_state",
                "Adaptive breaker state: 0 closed, 1 throttling, 2 open (at the rejection cap).",
                &["upstream", "route"],
            )?,
            breaker_ratio: registry.float_gauge(
                "tailguard_breaker_reject_ratio",
                "Probability that the breaker rejects a request now.",
                &["upstream", "route"],
            )?,
            breaker_rejected: registry.float_counter(
                "tailguard_breaker_rejected",
                "Requests rejected by the adaptive breaker.",
                &["upstream", "route"],
            )?,
            picks: Arc::new(OnceLock::new()),
        };
        let picks = Arc::clone(&f.picks);
        let watched = Arc::new(Mutex::new(Watched::default()));
        let hook_watched = Arc::downgrade(&watched);
        registry.on_scrape(move || {
            if let Some(w) = hook_watched.upgrade() {
                let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
                mirror(&f, &mut w);
            }
        });
        Ok(Self {
            watched,
            registry: registry.clone(),
            picks,
        })
    }

    fn with(&self, f: impl FnOnce(&mut Watched)) {
        f(&mut self.watched.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Shows a shedder's groups (and, if given, its sampler's CPU gauge).
    pub fn watch_shedder(&self, shedder: &Shedder, cpu: Option<&Arc<CpuGauge>>) {
        self.with(|w| {
            w.shedders.push(shedder.clone());
            if let Some(cpu) = cpu {
                w.cpu.push(Arc::downgrade(cpu));
            }
        });
    }

    /// Shows the breaker of (`upstream`, `route`) while it lives.
    pub fn watch_breaker(&self, upstream: &str, route: &str, breaker: &Arc<Breaker>) {
        self.with(|w| {
            w.breakers
                .push((upstream.into(), route.into(), Arc::downgrade(breaker)));
        });
    }

    /// Shows a balancer's picks per endpoint (`names` in endpoint order) while it lives, as
    /// `tailguard_balancer_picks_total{upstream, endpoint}` (registered by the first call;
    /// an error if the registry already has that name).
    pub fn watch_balancer<E: Send + Sync + 'static>(
        &self,
        upstream: &str,
        names: Vec<String>,
        p2c: &Arc<P2c<E>>,
    ) -> Result<(), MetricsError> {
        if self.picks.get().is_none() {
            let family = self.registry.float_counter(
                "tailguard_balancer_picks",
                "Endpoint picks by the p2c-EWMA balancer.",
                &["upstream", "endpoint"],
            )?;
            // Two racing first calls: the loser's registration already failed above.
            let _ = self.picks.set(family);
        }
        let weak: Weak<dyn PickCounts> = Arc::downgrade(p2c) as Weak<dyn PickCounts>;
        self.with(|w| w.balancers.push((upstream.into(), names, weak)));
        Ok(())
    }
}

/// Copies every watched value into its series. Runs on the exporter thread.
fn mirror(f: &Families, w: &mut Watched) {
    let now = MonotonicClock.now();
    w.cpu.retain(|g| g.strong_count() > 0);
    for g in w.cpu.iter().filter_map(Weak::upgrade) {
        f.cpu_errors.set(g.errors() as f64);
    }
    for shedder in &w.shedders {
        f.cpu.set(f64::from(shedder.cpu()) / 1000.0);
        f.cores.set(shedder.cores());
        for g in shedder.groups() {
            let s = g.snapshot(now);
            let name = [s.name.as_str()];
            if let Ok(h) = f.inflight.get_or_create(&name) {
                h.set(s.inflight);
            }
            if let Ok(h) = f.limit.get_or_create(&name) {
                h.set(if s.limit.is_finite() { s.limit } else { 0.0 });
            }
            if let Ok(h) = f.capacity.get_or_create(&name) {
                h.set(s.capacity);
            }
            if let Ok(h) = f.hot.get_or_create(&name) {
                h.set(i64::from(s.hot));
            }
            if let Ok(h) = f.admitted.get_or_create(&name) {
                h.set(s.admitted as f64);
            }
            for class in Class::ALL {
                if let Ok(h) = f.shed.get_or_create(&[s.name.as_str(), class.as_str()]) {
                    h.set(s.shed[class.index()] as f64);
                }
            }
        }
    }
    for shedder in &w.shedders {
        for l in shedder.upstream_limits() {
            let s = l.snapshot();
            let name = [l.name()];
            if let Ok(h) = f.upstream_limit.get_or_create(&name) {
                h.set(s.limit);
            }
            if let Ok(h) = f.upstream_inflight.get_or_create(&name) {
                h.set(s.inflight);
            }
            if let Ok(h) = f.upstream_min_rtt.get_or_create(&name) {
                h.set(s.min_rtt.map_or(0.0, |d| d.as_secs_f64()));
            }
            if let Ok(h) = f.upstream_hot.get_or_create(&name) {
                h.set(i64::from(s.overloaded));
            }
            for class in Class::ALL {
                if let Ok(h) = f
                    .upstream_limited
                    .get_or_create(&[l.name(), class.as_str()])
                {
                    h.set(s.rejected[class.index()] as f64);
                }
            }
        }
    }
    w.breakers.retain(|(_, _, b)| b.strong_count() > 0);
    for (upstream, route, b) in &w.breakers {
        let Some(b) = b.upgrade() else { continue };
        let labels = [upstream.as_str(), route.as_str()];
        if let Ok(h) = f.breaker_state.get_or_create(&labels) {
            h.set(b.state() as i64);
        }
        if let Ok(h) = f.breaker_ratio.get_or_create(&labels) {
            h.set(b.reject_ratio(now));
        }
        if let Ok(h) = f.breaker_rejected.get_or_create(&labels) {
            h.set(b.rejected() as f64);
        }
    }
    w.balancers.retain(|(_, _, p)| p.strong_count() > 0);
    let Some(picks) = f.picks.get() else { return };
    for (upstream, names, p) in &w.balancers {
        let Some(p) = p.upgrade() else { continue };
        for (i, name) in names.iter().enumerate() {
            if let Ok(h) = picks.get_or_create(&[upstream.as_str(), name.as_str()]) {
                h.set(p.picks(i) as f64);
            }
        }
    }
}

//! Overload protection in the gateway (tailguard-overload): the shedder decides admission
//! right after the request head is parsed, the adaptive breaker of each (upstream, route)
//! gates dispatch, and p2c over peak-EWMA latency is a [`Balance`].
//!
//! Built with each config snapshot; the shedder (its route groups keep their windows by
//! route id) and its CPU sampler thread outlive reloads, breakers are carried over by
//! (upstream, route). With `mode = "off"` every piece is absent and each call is a branch
//! on an `Option` that is `None`.
//!
//! Layer-1 rejections never reach a breaker: a shed request is refused before routing
//! completes, so it is never dispatched, and the breaker counts only dispatched requests.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Response, header::CONNECTION};
use tailguard_metrics::Registry;
use tailguard_overload::{
    Breaker, Class, Clock, Controller, CpuReader, MonotonicClock, OverloadConfig, OverloadMetrics,
    OverloadMode, OwnedBreakerPermit, OwnedPermit, P2c, P2cConfig, SamplerHandle, Shedder,
    failure_status,
};

use crate::balance::{Balance, Outcome};
use crate::error::Error;
use crate::route::Router;

/// What a route needs on the request path, by route index.
#[derive(Debug)]
struct RouteGuard {
    group: Arc<Controller>,
    class: Class,
    breaker: Option<Arc<Breaker>>,
}

/// The overload state of one snapshot.
#[derive(Debug, Default)]
pub struct Overload {
    mode: OverloadMode,
    shedder: Option<Shedder>,
    sampler: Option<Arc<SamplerHandle>>,
    /// Registered once per registry, carried over by reloads.
    metrics: Option<OverloadMetrics>,
    /// By route index (the router's precedence order); empty when off.
    routes: Vec<RouteGuard>,
}

impl Overload {
    /// Builds the snapshot's overload state, keeping the previous snapshot's shedder,
    /// sampler thread and breakers. `upstream_of(route)` names a route's upstream.
    pub fn build(
        config: &OverloadConfig,
        router: &Router,
        upstream_names: &[Arc<str>],
        previous: Option<&Overload>,
        registry: &Registry,
    ) -> Overload {
        let Some(shedder_config) = config.shedder_config() else {
            return Overload::default();
        };
        let reuse = previous.filter(|p| p.mode == config.mode && p.shedder.is_some());
        let shedder = match reuse.and_then(|p| p.shedder.clone()) {
            Some(s) => s,
            None => Shedder::new(shedder_config)
                .expect("OverloadConfig::validate checked the shedder config"),
        };
        let sampler = match reuse.and_then(|p| p.sampler.clone()) {
            Some(s) => Some(s),
            None => match SamplerHandle::spawn(
                shedder.clone(),
                {
                    let reader = CpuReader::system();
                    // Which CPU the trigger sees (own cgroup, or the allowed cores' busy
                    // time in /proc/stat in the root cgroup): the first thing to check
                    // when the shedder acts on a CPU reading that looks wrong.
                    tracing::info!("overload: CPU from {:?}", reader.kind());
                    reader
                },
                MonotonicClock,
                config.smoothing(),
                Duration::from_millis(250),
            ) {
                Ok(h) => Some(Arc::new(h)),
                Err(e) => {
                    // Without the sampler the CPU trigger never fires; the in-flight trigger
                    // and cap still protect.
                    tracing::error!("overload: cannot start the CPU sampler thread: {e}");
                    None
                }
            },
        };
        let (metrics, new_metrics) = match previous.and_then(|p| p.metrics.clone()) {
            Some(m) => (Some(m), false),
            None => match OverloadMetrics::register(registry) {
                Ok(m) => (Some(m), true),
                Err(e) => {
                    tracing::error!("overload: metrics not registered: {e}");
                    (None, false)
                }
            },
        };
        if let Some(m) = &metrics
            && (new_metrics || reuse.is_none())
        {
            m.watch_shedder(&shedder, sampler.as_ref().map(|s| s.gauge()));
        }
        let breaker_config = config.breaker_config();
        let routes = router
            .routes()
            .iter()
            .map(|r| {
                let upstream = &*upstream_names[r.upstream];
                let name = format!("{upstream}/{}", r.id);
                let breaker = breaker_config.as_ref().map(|bc| {
                    previous
                        .and_then(|p| p.breaker_named(&name))
                        .unwrap_or_else(|| {
                            let b = Arc::new(
                                Breaker::new(&name, bc.clone())
                                    .expect("the default breaker configs are valid"),
                            );
                            if let Some(m) = &metrics {
                                m.watch_breaker(upstream, &r.id, &b);
                            }
                            b
                        })
                });
                RouteGuard {
                    group: shedder.group(&r.id),
                    class: config.class_of(&r.id),
                    breaker,
                }
            })
            .collect();
        Overload {
            mode: config.mode,
            shedder: Some(shedder),
            sampler,
            metrics,
            routes,
        }
    }

    fn breaker_named(&self, name: &str) -> Option<Arc<Breaker>> {
        self.routes
            .iter()
            .filter_map(|r| r.breaker.as_ref())
            .find(|b| b.name() == name)
            .cloned()
    }

    /// The shedder (for metrics), when on.
    pub fn shedder(&self) -> Option<&Shedder> {
        self.shedder.as_ref()
    }

    /// Layer 1: admits or refuses a request for route `route` (None: no route matched; it
    /// is admitted and will get its 404 without costing anything).
    pub fn admit(&self, route: Option<usize>) -> Result<Admitted, Refused> {
        let Some(guard) = route.and_then(|r| self.routes.get(r)) else {
            return Ok(Admitted::default());
        };
        match guard.group.admit_owned(MonotonicClock.now(), guard.class) {
            Ok(permit) => Ok(Admitted {
                permit: Some(permit),
                served: false,
            }),
            Err(r) => Err(Refused { severe: r.severe }),
        }
    }

    /// Layer 2: the breaker of `route` lets the request be dispatched, or refuses it.
    pub fn dispatch(&self, route: usize) -> Result<Dispatched, Error> {
        let Some(breaker) = self.routes.get(route).and_then(|r| r.breaker.as_ref()) else {
            return Ok(Dispatched(None));
        };
        match breaker.allow(MonotonicClock.now()) {
            Ok(p) => Ok(Dispatched(Some(p.into_owned(breaker)))),
            Err(_) => Err(Error::Overloaded),
        }
    }
}

/// An admitted request: held until its response finishes. Dropped without
/// [`served`](Self::served), the request counts as not served (no RT sample).
#[derive(Debug, Default)]
pub struct Admitted {
    permit: Option<OwnedPermit>,
    served: bool,
}

impl Admitted {
    /// The upstream answered: the request counts as served, its RT ends when this drops.
    pub fn served(&mut self) {
        self.served = true;
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Some(p) = self.permit.take() {
            let outcome = if self.served {
                tailguard_overload::Outcome::Served
            } else {
                tailguard_overload::Outcome::Failed
            };
            p.complete(MonotonicClock.now(), outcome);
        }
    }
}

/// A request the shedder refused: 503 + `Retry-After`, body never read.
#[derive(Debug, Clone, Copy)]
pub struct Refused {
    severe: bool,
}

impl Refused {
    /// Adds `Connection: close` under severe overload (in-flight above twice the limit), so
    /// a client hammering one keep-alive connection has to reconnect.
    pub fn respond<B>(self, mut resp: Response<B>) -> Response<B> {
        if self.severe {
            resp.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

/// A dispatched request's breaker permit; dropped without an outcome it is forgotten.
#[derive(Debug)]
pub struct Dispatched(Option<OwnedBreakerPermit>);

impl Dispatched {
    /// Tells the breaker how the exchange ended: connect errors, timeouts, broken
    /// exchanges and 429/502/503/504 are failures; a downstream abort is forgotten.
    pub fn finish(self, outcome: Outcome) {
        let Some(p) = self.0 else { return };
        let now = MonotonicClock.now();
        match outcome {
            Outcome::Status(s) if failure_status(s) => p.failure(now),
            Outcome::Status(_) => p.success(now),
            Outcome::ConnectFailed | Outcome::Timeout | Outcome::Broken => p.failure(now),
            Outcome::Aborted => drop(p),
        }
    }
}

/// p2c over peak-EWMA latency × (in-flight + 1) with a success-rate health gate, as a
/// [`Balance`] (`balance = "p2c_ewma"`).
#[derive(Debug)]
pub struct P2cEwma {
    p2c: P2c<()>,
}

impl P2cEwma {
    /// Over `n` endpoints.
    pub fn new(n: usize) -> P2cEwma {
        P2cEwma {
            p2c: P2c::new(vec![(); n], P2cConfig::default()),
        }
    }
}

impl Balance for P2cEwma {
    fn pick(&self) -> usize {
        self.p2c.pick_index(MonotonicClock.now()).unwrap_or(0)
    }

    fn complete(&self, endpoint: usize, outcome: Outcome, latency: Duration) {
        if endpoint >= self.p2c.endpoints().len() {
            return;
        }
        let now = MonotonicClock.now();
        match outcome {
            Outcome::Status(s) => self.p2c.complete_index(endpoint, now, latency, s < 500),
            Outcome::ConnectFailed | Outcome::Timeout | Outcome::Broken => {
                self.p2c.complete_index(endpoint, now, latency, false)
            }
            Outcome::Aborted => self.p2c.release_index(endpoint),
        }
    }
}

/// `--overload off|adaptive|gozero`.
pub fn parse_mode(s: &str) -> Result<OverloadMode, String> {
    OverloadMode::parse(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p2c_balance_prefers_the_faster_endpoint() {
        let b = P2cEwma::new(2);
        // Both start at the default estimate: a tie goes to endpoint 0, which is slow.
        assert_eq!(b.pick(), 0);
        b.complete(0, Outcome::Status(200), Duration::from_millis(200));
        assert_eq!(b.pick(), 1);
        b.complete(1, Outcome::Status(200), Duration::from_millis(1));
        let to_fast = (0..20)
            .filter(|_| {
                let i = b.pick();
                b.complete(i, Outcome::Aborted, Duration::ZERO);
                i == 1
            })
            .count();
        // (A starved endpoint is forced once a second: at most one pick goes to 0 unless
        // this test stalls for seconds.)
        assert!(to_fast >= 19, "{to_fast}");
    }
}

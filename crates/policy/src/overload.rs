//! Overload protection in the gateway (tailguard-overload): the shedder decides admission
//! right after the request head is parsed, and the adaptive breaker of each (upstream, route)
//! gates dispatch (p2c over peak-EWMA latency, the library's other upstream-side part, is a
//! balancer: [`P2cEwma`](tailguard_upstream::balance::P2cEwma)).
//!
//! Built with each config snapshot; the shedder (its route groups keep their windows by
//! route id) and its CPU sampler thread outlive reloads, breakers are carried over by
//! (upstream, route). With `mode = "off"` every piece is absent and each call is a branch
//! on an `Option` that is `None`.
//!
//! Layer-1 rejections never reach a breaker: a shed request is refused before routing
//! completes, so it is never dispatched, and the breaker counts only dispatched requests.
//!
//! The retry budget of each upstream is the exception to "absent when off": retrying a
//! connect failure on another endpoint is plain proxying, and the budget is what keeps it
//! from multiplying an overload, so it exists in every mode (see [`Overload::may_retry`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderValue, Method, Response, header::CONNECTION};
use tailguard_http::error::Error;
use tailguard_metrics::Registry;
use tailguard_overload::{
    Breaker, Class, Clock, Controller, CpuReader, MonotonicClock, OverloadConfig, OverloadMetrics,
    OverloadMode, OwnedBreakerPermit, OwnedLimitPermit, OwnedPermit, RetryBudget, SamplerHandle,
    Shedder, UpstreamLimit, failure_status,
};
use tailguard_upstream::balance::Outcome;
use tailguard_upstream::shard::PerThread;

use crate::route::Router;

/// Retries may add this share of an upstream's requests (SRE book: 10 %)...
const RETRY_RATIO: f64 = 0.1;
/// ...plus this many per second, so a quiet upstream can still retry a connect failure
/// (research §9.4: a minimum of 3-10 per second).
const RETRY_FLOOR_PER_SEC: u64 = 3;
/// The budget's window (`RetryBudget` keeps 10 x 1 s).
const RETRY_WINDOW: Duration = Duration::from_secs(10);

/// The retry budget of one upstream. Requests are counted per serving thread (no line
/// written by two threads on the request path); the totals reach the library's
/// [`RetryBudget`] only when a retry is considered, which is rare (a connect failure).
#[derive(Debug)]
struct Retries {
    requests: PerThread<AtomicU64>,
    /// Requests already handed to the budget, and when (only touched by `may_retry`).
    synced: Mutex<(u64, Duration)>,
    budget: RetryBudget,
}

impl Retries {
    fn new(now: Duration) -> Retries {
        Retries {
            requests: PerThread::new(|_| AtomicU64::new(0)),
            synced: Mutex::new((0, now)),
            budget: RetryBudget::new(RETRY_RATIO, RETRY_FLOOR_PER_SEC),
        }
    }

    fn count(&self) {
        self.requests.get().fetch_add(1, Ordering::Relaxed);
    }

    /// Retries taken and allowed in the budget's window as of `now`, counting the requests
    /// not yet handed to it as if they were (the status page; never the request path).
    fn room(&self, now: Duration) -> RetryRoom {
        let total: u64 = self
            .requests
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum();
        let seen = self.synced.lock().unwrap_or_else(|e| e.into_inner()).0;
        let (used, requests) = self.budget.usage(now);
        RetryRoom {
            used,
            allowed: self
                .budget
                .allowed(requests + total.saturating_sub(seen))
                .floor() as u64,
        }
    }

    /// Hands the requests counted since the last call to the budget, then takes a retry.
    fn withdraw(&self, now: Duration) -> bool {
        let total: u64 = self
            .requests
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum();
        {
            let mut synced = self.synced.lock().unwrap_or_else(|e| e.into_inner());
            let (seen, at) = *synced;
            let new = total.saturating_sub(seen);
            // The budget files them under `now`; of a span longer than its window only the
            // last window's share (at an even rate) may count.
            let span = now.saturating_sub(at);
            let recent = if span > RETRY_WINDOW {
                (new as f64 * RETRY_WINDOW.as_secs_f64() / span.as_secs_f64()) as u64
            } else {
                new
            };
            self.budget.deposit_many(now, recent);
            *synced = (total.max(seen), now);
        }
        self.budget.try_withdraw(now)
    }
}

/// An upstream's retry budget as the status page shows it: retries taken over the last 10 s
/// and how many the budget allows over that window (10 % of its requests plus 3 per second).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryRoom {
    /// Retries taken in the window.
    pub used: u64,
    /// Retries the window allows.
    pub allowed: u64,
}

/// GET, HEAD, OPTIONS, PUT and DELETE: sending one twice has the effect of sending it once
/// (RFC 9110 §9.2.2; TRACE too, but a gateway has no business retrying it).
#[inline]
pub fn idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE
    )
}

/// What a route needs on the request path, by route index.
#[derive(Debug)]
struct RouteGuard {
    /// The concurrency limit of the route's upstream (shared by every route to it).
    limit: Option<Arc<UpstreamLimit>>,
    group: Arc<Controller>,
    class: Class,
    breaker: Option<Arc<Breaker>>,
}

/// The overload state of one snapshot.
#[derive(Debug, Default)]
pub struct Overload {
    mode: OverloadMode,
    /// Whether the sampler reads the CPU (`cpu_trigger`): a reload that changes it needs a
    /// new sampler, and a shedder that never saw the other readings.
    cpu_trigger: bool,
    shedder: Option<Shedder>,
    sampler: Option<Arc<SamplerHandle>>,
    /// Registered once per registry, carried over by reloads.
    metrics: Option<OverloadMetrics>,
    /// By route index (the router's precedence order); empty when off.
    routes: Vec<RouteGuard>,
    /// Retry budgets by upstream index, in every mode; carried over reloads by name.
    retries: Vec<(Arc<str>, Arc<Retries>)>,
}

impl Overload {
    /// Builds the snapshot's overload state, keeping the previous snapshot's shedder,
    /// sampler thread, breakers and upstream limits. `upstream_names[i]` and
    /// `endpoint_counts[i]` describe upstream `i`, which routes refer to by index.
    pub fn build(
        config: &OverloadConfig,
        router: &Router,
        upstream_names: &[Arc<str>],
        endpoint_counts: &[usize],
        previous: Option<&Overload>,
        registry: &Registry,
    ) -> Overload {
        let now = MonotonicClock.now();
        let retries = upstream_names
            .iter()
            .map(|name| {
                let kept = previous.and_then(|p| {
                    p.retries
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, r)| Arc::clone(r))
                });
                (
                    Arc::clone(name),
                    kept.unwrap_or_else(|| Arc::new(Retries::new(now))),
                )
            })
            .collect();
        let Some(shedder_config) = config.shedder_config() else {
            return Overload {
                retries,
                ..Overload::default()
            };
        };
        let reuse = previous.filter(|p| {
            p.mode == config.mode && p.cpu_trigger == config.cpu_trigger && p.shedder.is_some()
        });
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
                    let reader = if config.cpu_trigger {
                        CpuReader::system()
                    } else {
                        CpuReader::off()
                    };
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
        let limit_config = config.limit_config();
        let limits: Vec<Option<Arc<UpstreamLimit>>> = upstream_names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let cfg = limit_config.as_ref()?;
                match shedder.upstream_limit(name, cfg) {
                    Ok(l) => {
                        // A probe lets about one request per endpoint through.
                        l.set_probe_concurrency(endpoint_counts.get(i).copied().unwrap_or(1));
                        Some(l)
                    }
                    Err(e) => {
                        tracing::error!("overload: no concurrency limit for upstream {name}: {e}");
                        None
                    }
                }
            })
            .collect();
        let breaker_config = config.breaker_config();
        // The previous snapshot's breakers by name, found once each (a search per route was
        // quadratic in the table's size).
        let kept: HashMap<&str, &Arc<Breaker>> = previous
            .iter()
            .flat_map(|p| p.routes.iter().filter_map(|r| r.breaker.as_ref()))
            .map(|b| (b.name(), b))
            .collect();
        let routes = router
            .routes()
            .iter()
            .map(|r| {
                // A route that answers by itself has no upstream, so no breaker or limit.
                let upstream = upstream_names.get(r.upstream);
                let breaker = breaker_config.as_ref().zip(upstream).map(|(bc, upstream)| {
                    let name = format!("{upstream}/{}", r.id);
                    kept.get(name.as_str())
                        .map(|b| Arc::clone(b))
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
                    limit: limits.get(r.upstream).cloned().flatten(),
                    group: shedder.group(&r.id),
                    class: config.class_of(&r.id),
                    breaker,
                }
            })
            .collect();
        Overload {
            mode: config.mode,
            cpu_trigger: config.cpu_trigger,
            shedder: Some(shedder),
            sampler,
            metrics,
            routes,
            retries,
        }
    }

    /// The retry budget of upstream `upstream` (its index in the snapshot), for the status
    /// page: reads the per-thread counts and takes the budget's lock for a copy, which a
    /// serving thread takes only when it considers a retry.
    pub fn retry_budget(&self, upstream: usize) -> Option<RetryRoom> {
        let (_, r) = self.retries.get(upstream)?;
        Some(r.room(MonotonicClock.now()))
    }

    /// The shedder (for metrics), when on.
    #[inline]
    pub fn shedder(&self) -> Option<&Shedder> {
        self.shedder.as_ref()
    }

    /// Counts a request dispatched to upstream `upstream` (its index in the snapshot) in
    /// the upstream's retry budget: call once per original request, not for a retry. Cost:
    /// one relaxed add on this serving thread's own cache line.
    #[inline]
    pub fn count_request(&self, upstream: usize) {
        if let Some((_, r)) = self.retries.get(upstream) {
            r.count();
        }
    }

    /// Whether a request to upstream `upstream` that failed to CONNECT may be retried once
    /// on another endpoint: its method is idempotent (GET, HEAD, OPTIONS, PUT, DELETE), it
    /// has no body, and the upstream's retry budget (10 % of its requests over 10 s plus 3
    /// per second) has room; a `true` takes one retry from the budget. Only for connect
    /// failures: the request never reached an upstream, so nothing was processed twice.
    pub fn may_retry(&self, upstream: usize, method: &Method, has_body: bool) -> bool {
        self.may_retry_at(MonotonicClock.now(), upstream, method, has_body)
    }

    fn may_retry_at(
        &self,
        now: Duration,
        upstream: usize,
        method: &Method,
        has_body: bool,
    ) -> bool {
        if has_body || !idempotent(method) {
            return false;
        }
        self.retries
            .get(upstream)
            .is_some_and(|(_, r)| r.withdraw(now))
    }

    /// Layer 1: admits or refuses a request for route `route` (None: no route matched; it
    /// is admitted and will get its 404 without costing anything).
    pub fn admit(&self, route: Option<usize>) -> Result<Admitted, Refused> {
        let Some(guard) = route.and_then(|r| self.routes.get(r)) else {
            return Ok(Admitted::default());
        };
        let now = MonotonicClock.now();
        // The upstream's limit first: it is the cheaper check, and a request it refuses
        // never counts in the route group. One the group refuses after it drops its limit
        // permit unrecorded: it was never sent.
        let limit = match &guard.limit {
            Some(l) => match l.acquire_owned(now, guard.class) {
                Ok(p) => Some(p),
                Err(r) => {
                    guard.group.upstream_limited(now);
                    return Err(Refused { severe: r.severe });
                }
            },
            None => None,
        };
        match guard.group.admit_owned(now, guard.class) {
            Ok(permit) => Ok(Admitted {
                permit: Some(permit),
                limit,
                served: false,
            }),
            Err(r) => Err(Refused { severe: r.severe }),
        }
    }

    /// Layer 2: the breaker of `route` lets the request be dispatched, or refuses it.
    #[inline]
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
    /// In flight at the upstream until this drops; its response time is recorded when the
    /// response head arrives (a long body download is not the upstream's latency).
    limit: Option<OwnedLimitPermit>,
    served: bool,
}

impl Admitted {
    /// The upstream answered: the request counts as served, its RT ends when this drops;
    /// the upstream limit's response time ends now.
    pub fn served(&mut self) {
        self.served = true;
        if let Some(l) = &mut self.limit {
            l.record(MonotonicClock.now());
        }
    }

    /// The upstream did not answer in time: no pass for the route group, but the time it
    /// took is the upstream's response time as far as its limit can tell.
    pub fn timed_out(&mut self) {
        if let Some(l) = &mut self.limit {
            l.record(MonotonicClock.now());
        }
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
    #[inline]
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

#[cfg(test)]
mod tests {
    use super::*;

    fn off(names: &[&str], previous: Option<&Overload>) -> Overload {
        let names: Vec<Arc<str>> = names.iter().map(|&n| Arc::from(n)).collect();
        Overload::build(
            &OverloadConfig::default(),
            &Router::default(),
            &names,
            &vec![1; names.len()],
            previous,
            &Registry::new(),
        )
    }

    fn granted(o: &Overload, now: Duration, upstream: usize) -> usize {
        (0..1000)
            .filter(|_| o.may_retry_at(now, upstream, &Method::GET, false))
            .count()
    }

    #[test]
    fn only_idempotent_requests_without_a_body_are_retried() {
        let o = off(&["u"], None);
        let now = MonotonicClock.now();
        for m in [
            Method::GET,
            Method::HEAD,
            Method::OPTIONS,
            Method::PUT,
            Method::DELETE,
        ] {
            assert!(o.may_retry_at(now, 0, &m, false), "{m}");
            assert!(!o.may_retry_at(now, 0, &m, true), "{m} with a body");
        }
        for m in [Method::POST, Method::PATCH, Method::CONNECT, Method::TRACE] {
            assert!(!o.may_retry_at(now, 0, &m, false), "{m}");
        }
        assert!(!o.may_retry(1, &Method::GET, false), "no such upstream");
    }

    #[test]
    fn retries_are_ten_percent_of_requests_plus_three_per_second() {
        let o = off(&["a", "b"], None);
        let now = MonotonicClock.now();
        for _ in 0..500 {
            o.count_request(0);
        }
        // 10 % of 500 + 3/s x 10 s; refused ones take nothing.
        assert_eq!(granted(&o, now, 0), 50 + 30);
        assert_eq!(granted(&o, now, 1), 30, "each upstream has its own budget");
        assert_eq!(
            o.retries[0].1.room(now),
            RetryRoom {
                used: 80,
                allowed: 80
            }
        );
        // Requests counted later (on any thread) reach the budget at the next decision.
        std::thread::scope(|s| {
            s.spawn(|| (0..100).for_each(|_| o.count_request(0)));
        });
        assert_eq!(granted(&o, now, 0), 10);
    }

    #[test]
    fn requests_counted_long_ago_only_count_for_the_last_window() {
        let o = off(&["a"], None);
        let start = o.retries[0].1.synced.lock().unwrap().1;
        for _ in 0..1000 {
            o.count_request(0);
        }
        // 1000 requests over 100 s: the last 10 s held ~100 of them.
        assert_eq!(granted(&o, start + Duration::from_secs(100), 0), 10 + 30);
    }

    #[test]
    fn a_reload_keeps_each_upstreams_budget_by_name() {
        let first = off(&["a", "b"], None);
        let now = MonotonicClock.now();
        assert_eq!(granted(&first, now, 0), 30);
        let second = off(&["c", "a"], Some(&first));
        assert_eq!(granted(&second, now, 1), 0, "`a` kept its spent budget");
        assert_eq!(granted(&second, now, 0), 30, "`c` is new");
    }

    #[test]
    fn a_reload_that_changes_the_cpu_trigger_starts_a_new_sampler() {
        let adaptive = |cpu_trigger: bool, previous: Option<&Overload>| {
            let config = OverloadConfig {
                mode: OverloadMode::Adaptive,
                cpu_trigger,
                ..OverloadConfig::default()
            };
            Overload::build(
                &config,
                &Router::default(),
                &[],
                &[],
                previous,
                &Registry::new(),
            )
        };
        let sampler = |o: &Overload| Arc::clone(o.sampler.as_ref().expect("a sampler thread"));
        let on = adaptive(true, None);
        let same = adaptive(true, Some(&on));
        assert!(Arc::ptr_eq(&sampler(&on), &sampler(&same)), "kept");
        let off = adaptive(false, Some(&same));
        assert!(!Arc::ptr_eq(&sampler(&same), &sampler(&off)), "a new one");
        assert!(!off.cpu_trigger);
        assert!(Arc::ptr_eq(
            &sampler(&off),
            &sampler(&adaptive(false, Some(&off)))
        ));
    }
}

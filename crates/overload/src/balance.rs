//! Layer 2 balancing: power of two choices over peak-EWMA latency × (in-flight + 1), with a
//! success-rate health gate (research §9.4, go-zero's `p2c` and tower's `PeakEwma`).
//!
//! Generic over the endpoint type `E`, so the gateway's `Balance` trait can wrap it. Costs:
//! a pick reads two endpoints' atomics and increments one in-flight counter; a completion
//! updates that endpoint's EWMAs under its own small mutex (only requests that used the same
//! endpoint meet there). Why not tower's `PeakEwma`: it is a `Discover`-driven service
//! wrapper tied to tower's balancer and tokio's clock; this needs the injected clock, the
//! success gate and go-zero's forced pick of a starved endpoint.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::as_nanos;

/// Tuning of [`P2c`].
#[derive(Debug, Clone, PartialEq)]
pub struct P2cConfig {
    /// EWMA decay time constant (go-zero and Finagle: 10 s).
    pub decay: Duration,
    /// Latency assumed for an endpoint with no sample yet.
    pub default_rtt: Duration,
    /// A failure counts as at least this latency, so fast failures never look attractive
    /// (brpc; Envoy #20907). Use the upstream timeout.
    pub failure_rtt: Duration,
    /// Healthy iff the success EWMA (1000 = all good) is above this (go-zero: 500).
    pub healthy_above: f64,
    /// Random pairs tried to find two healthy endpoints (go-zero: 3).
    pub pick_attempts: u32,
    /// Pick an endpoint that lost every comparison for this long anyway (go-zero: 1 s), so
    /// its estimate gets refreshed.
    pub force_pick: Duration,
    /// Exponent on the latency term (1.0: tower's cost; 0.5: go-zero's `sqrt`).
    pub rtt_exponent: f64,
}

impl Default for P2cConfig {
    fn default() -> Self {
        Self {
            decay: Duration::from_secs(10),
            default_rtt: Duration::from_millis(30),
            failure_rtt: Duration::from_secs(1),
            healthy_above: 500.0,
            pick_attempts: 3,
            force_pick: Duration::from_secs(1),
            rtt_exponent: 1.0,
        }
    }
}

#[derive(Debug)]
struct Ewma {
    stamp: Option<Duration>,
    lag_ns: f64,
    success: f64,
}

#[derive(Debug)]
#[repr(align(128))]
struct EndpointLoad {
    inflight: AtomicI64,
    /// f64 bits of the latency estimate (ns), copied out of `ewma` for readers.
    lag_ns: AtomicU64,
    /// f64 bits of the success EWMA.
    success: AtomicU64,
    last_pick: AtomicU64,
    picks: AtomicU64,
    ewma: Mutex<Ewma>,
}

/// A set of endpoints balanced by P2C over peak EWMA.
#[derive(Debug)]
pub struct P2c<E> {
    cfg: P2cConfig,
    endpoints: Vec<E>,
    loads: Vec<EndpointLoad>,
}

impl<E> P2c<E> {
    /// Balances over `endpoints` (fixed for this instance: build a new one on config change).
    pub fn new(endpoints: Vec<E>, cfg: P2cConfig) -> Self {
        let loads = endpoints
            .iter()
            .map(|_| EndpointLoad {
                inflight: AtomicI64::new(0),
                lag_ns: AtomicU64::new((as_nanos(cfg.default_rtt) as f64).to_bits()),
                success: AtomicU64::new(1000f64.to_bits()),
                last_pick: AtomicU64::new(0),
                picks: AtomicU64::new(0),
                ewma: Mutex::new(Ewma {
                    stamp: None,
                    lag_ns: as_nanos(cfg.default_rtt) as f64,
                    success: 1000.0,
                }),
            })
            .collect();
        Self {
            cfg,
            endpoints,
            loads,
        }
    }

    /// The endpoints, in index order.
    pub fn endpoints(&self) -> &[E] {
        &self.endpoints
    }

    /// Cost of endpoint `i`: `lag^exponent · (in-flight + 1)`.
    pub fn load(&self, i: usize) -> f64 {
        let l = &self.loads[i];
        let lag = f64::from_bits(l.lag_ns.load(Ordering::Relaxed)).max(1.0);
        let lag = if self.cfg.rtt_exponent == 1.0 {
            lag
        } else {
            lag.powf(self.cfg.rtt_exponent)
        };
        lag * (l.inflight.load(Ordering::Relaxed).max(0) + 1) as f64
    }

    /// Success EWMA of endpoint `i` above the health threshold.
    pub fn healthy(&self, i: usize) -> bool {
        f64::from_bits(self.loads[i].success.load(Ordering::Relaxed)) > self.cfg.healthy_above
    }

    /// Picks an endpoint with a thread-local RNG; `None` only when there are no endpoints.
    pub fn pick(&self, now: Duration) -> Option<Pick<'_, E>> {
        self.pick_with(now, |n| fastrand::usize(..n))
    }

    /// Picks with an injected RNG: `rand(n)` returns a uniform index in `0..n`.
    pub fn pick_with(
        &self,
        now: Duration,
        rand: impl FnMut(usize) -> usize,
    ) -> Option<Pick<'_, E>> {
        let index = self.pick_index_with(now, rand)?;
        Some(Pick {
            p2c: self,
            index,
            start: now,
            done: false,
        })
    }

    /// Index-based picking for callers that keep their own per-request state (the gateway's
    /// `Balance` trait): counts the endpoint in flight; end it with exactly one of
    /// [`complete_index`](Self::complete_index) or [`release_index`](Self::release_index).
    pub fn pick_index(&self, now: Duration) -> Option<usize> {
        self.pick_index_with(now, |n| fastrand::usize(..n))
    }

    /// Ends an index pick with its latency and result.
    pub fn complete_index(&self, index: usize, now: Duration, latency: Duration, ok: bool) {
        self.loads[index].inflight.fetch_sub(1, Ordering::Relaxed);
        self.observe(index, now, latency, ok);
    }

    /// Ends an index pick without a sample (the request was cancelled).
    pub fn release_index(&self, index: usize) {
        self.loads[index].inflight.fetch_sub(1, Ordering::Relaxed);
    }

    /// [`pick_index`](Self::pick_index) among the endpoints `available(i)` allows (the
    /// gateway's health checks): `None` when it allows none. A candidate that is not
    /// available is replaced by the next available one after it, so each pick still
    /// compares two endpoints when two are available; `available` is asked about each
    /// candidate once on the usual path.
    pub fn pick_index_where(
        &self,
        now: Duration,
        available: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        self.pick_index_where_with(now, |n| fastrand::usize(..n), available)
    }

    fn pick_index_with(&self, now: Duration, rand: impl FnMut(usize) -> usize) -> Option<usize> {
        self.pick_index_where_with(now, rand, |_| true)
    }

    fn pick_index_where_with(
        &self,
        now: Duration,
        mut rand: impl FnMut(usize) -> usize,
        available: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let n = self.endpoints.len();
        let chosen = match n {
            0 => return None,
            1 => {
                if !available(0) {
                    return None;
                }
                0
            }
            2 => match (available(0), available(1)) {
                (true, true) => self.choose(now, 0, 1),
                (true, false) => 0,
                (false, true) => 1,
                (false, false) => return None,
            },
            _ => {
                let (mut a, mut b) = (0, 1);
                let (mut a_up, mut b_up) = (false, false);
                for _ in 0..self.cfg.pick_attempts.max(1) {
                    a = rand(n);
                    b = rand(n - 1);
                    if b >= a {
                        b += 1;
                    }
                    a_up = available(a);
                    b_up = available(b);
                    if a_up && b_up && self.healthy(a) && self.healthy(b) {
                        break;
                    }
                }
                // The next available endpoint after `from`, other than `not`.
                let next = |from: usize, not: Option<usize>| {
                    (1..n)
                        .map(|k| (from + k) % n)
                        .find(|&i| Some(i) != not && available(i))
                };
                let a = if a_up { a } else { next(a, None)? };
                match if b_up && b != a {
                    Some(b)
                } else {
                    next(b, Some(a))
                } {
                    Some(b) => self.choose(now, a, b),
                    None => a,
                }
            }
        };
        let l = &self.loads[chosen];
        l.inflight.fetch_add(1, Ordering::Relaxed);
        l.picks.fetch_add(1, Ordering::Relaxed);
        Some(chosen)
    }

    fn choose(&self, now: Duration, a: usize, b: usize) -> usize {
        let now_ns = as_nanos(now).max(1);
        // Health first, then load; `lo` wins unless `hi` starved for `force_pick`.
        let key = |i: usize| (!self.healthy(i), self.load(i));
        let (lo, hi) = if key(a) <= key(b) { (a, b) } else { (b, a) };
        let hi_pick = &self.loads[hi].last_pick;
        let last = hi_pick.load(Ordering::Relaxed);
        if last != 0
            && now_ns.saturating_sub(last) > as_nanos(self.cfg.force_pick)
            && hi_pick
                .compare_exchange(last, now_ns, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return hi;
        }
        self.loads[lo].last_pick.store(now_ns, Ordering::Relaxed);
        if last == 0 {
            // Start the starvation clock of an endpoint never picked.
            let _ = hi_pick.compare_exchange(0, now_ns, Ordering::Relaxed, Ordering::Relaxed);
        }
        lo
    }

    /// Picks of endpoint `i` so far (metrics).
    pub fn picks(&self, i: usize) -> u64 {
        self.loads[i].picks.load(Ordering::Relaxed)
    }

    /// In-flight requests on endpoint `i`.
    pub fn inflight(&self, i: usize) -> i64 {
        self.loads[i].inflight.load(Ordering::Relaxed)
    }

    /// Latency estimate of endpoint `i`.
    pub fn rtt_estimate(&self, i: usize) -> Duration {
        Duration::from_nanos(f64::from_bits(self.loads[i].lag_ns.load(Ordering::Relaxed)) as u64)
    }

    fn observe(&self, i: usize, now: Duration, rtt: Duration, ok: bool) {
        let l = &self.loads[i];
        let rtt = if ok {
            rtt
        } else {
            rtt.max(self.cfg.failure_rtt)
        };
        let rtt_ns = as_nanos(rtt) as f64;
        let mut e = l.ewma.lock().unwrap_or_else(|p| p.into_inner());
        let w = match e.stamp {
            Some(t) => {
                (-(now.saturating_sub(t).as_secs_f64()) / self.cfg.decay.as_secs_f64()).exp()
            }
            None => 0.0,
        };
        e.stamp = Some(now.max(e.stamp.unwrap_or_default()));
        // Peak: a slower sample takes over at once; faster ones decay in.
        e.lag_ns = if rtt_ns > e.lag_ns {
            rtt_ns
        } else {
            e.lag_ns * w + rtt_ns * (1.0 - w)
        };
        // As in go-zero, the first sample replaces the initial 1000 outright (w = 0).
        let target = if ok { 1000.0 } else { 0.0 };
        e.success = e.success * w + target * (1.0 - w);
        l.lag_ns.store(e.lag_ns.to_bits(), Ordering::Relaxed);
        l.success.store(e.success.to_bits(), Ordering::Relaxed);
    }
}

/// A picked endpoint. Finish with [`finish`](Self::finish); dropping it only releases the
/// in-flight slot (a cancelled request says nothing about the endpoint).
#[derive(Debug)]
#[must_use = "dropping the pick releases it without a sample"]
pub struct Pick<'a, E> {
    p2c: &'a P2c<E>,
    index: usize,
    start: Duration,
    done: bool,
}

impl<'a, E> Pick<'a, E> {
    /// Index of the picked endpoint.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The picked endpoint.
    pub fn endpoint(&self) -> &'a E {
        &self.p2c.endpoints[self.index]
    }

    /// Records the result at `now`: latency `now − pick time`, success or failure.
    pub fn finish(mut self, now: Duration, ok: bool) {
        self.done = true;
        self.p2c
            .complete_index(self.index, now, now.saturating_sub(self.start), ok);
    }
}

impl<E> Drop for Pick<'_, E> {
    fn drop(&mut self) {
        if !self.done {
            self.p2c.release_index(self.index);
        }
    }
}

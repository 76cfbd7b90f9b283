//! Layer 2, upstream protection: go-zero's adaptive (Google SRE) breaker with research §9.4's
//! changes, one per (upstream, route).
//!
//! `P(reject) = ((total − protection) − w·accepts) / (total + 1)` over a 10 s window of
//! 40 buckets, `w` falling from `k` = 1.5 to `min_k` = 1.1 as buckets keep failing, scaled by
//! `(40 − working buckets)/40` for a fast recovery, with a forced probe once per second.
//! Changes from go-zero (in [`BreakerConfig::adaptive`]):
//! - a request is counted in the bucket of its **dispatch** (go-zero counts at completion,
//!   so a success can land in a window that no longer holds its request: go-zero #5011);
//!   while in flight it is left out of the ratio, so a burst of slow requests is not a
//!   burst of failures;
//! - the rejection probability is capped at 0.8 (Envoy `admission_control`);
//! - a probe is allowed once per second even before the first pass;
//! - only upstream trouble is a failure (connect errors, timeouts, 502/503/504/429, see
//!   [`failure_status`]); a cancelled request or a layer-1 rejection is forgotten, never a
//!   failure (go-zero's breaker counted its own shedder's 503s and did most of the rejecting).
//!
//! The window sits behind a small mutex per breaker: the critical section is a few adds
//! (plus a 40-bucket walk only while the ratio is positive), the lock is shared with no scrape
//! or reload (metrics read the atomics), and only requests to the same (upstream, route) meet
//! there.

use std::ops::Deref;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::Error;

/// Tuning of a [`Breaker`].
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    /// Total window.
    pub window: Duration,
    /// Buckets in the window.
    pub buckets: u32,
    /// Weight of accepts while healthy.
    pub k: f64,
    /// Weight of accepts after a whole window of failing buckets.
    pub min_k: f64,
    /// Requests in the window that are never rejected.
    pub protection: u64,
    /// Cap on the rejection probability (1.0 = none).
    pub max_reject: f64,
    /// While rejecting, let one request through after this long without a pass.
    pub force_pass: Duration,
    /// Count requests when dispatched (true) or when they complete (go-zero).
    pub count_at_dispatch: bool,
    /// Force a probe even before the first pass (go-zero waits for one).
    pub probe_without_pass: bool,
}

impl BreakerConfig {
    /// go-zero's breaker with research §9.4's changes.
    pub fn adaptive() -> Self {
        Self {
            window: Duration::from_secs(10),
            buckets: 40,
            k: 1.5,
            min_k: 1.1,
            protection: 5,
            max_reject: 0.8,
            force_pass: Duration::from_secs(1),
            count_at_dispatch: true,
            probe_without_pass: true,
        }
    }

    /// go-zero's `googleBreaker`, exactly (`core/breaker/googlebreaker.go`).
    pub fn gozero() -> Self {
        Self {
            max_reject: 1.0,
            count_at_dispatch: false,
            probe_without_pass: false,
            ..Self::adaptive()
        }
    }

    /// Checks ranges.
    pub fn validate(&self) -> Result<(), Error> {
        if self.buckets == 0 || self.window < Duration::from_millis(u64::from(self.buckets)) {
            return Err(Error::Config(
                "breaker window needs >= 1 ms per bucket".into(),
            ));
        }
        if !(self.min_k > 0.0 && self.k >= self.min_k) {
            return Err(Error::Config("breaker needs k >= min_k > 0".into()));
        }
        if !(0.0..=1.0).contains(&self.max_reject) {
            return Err(Error::Config("max_reject must be in [0, 1]".into()));
        }
        Ok(())
    }

    fn bucket(&self) -> Duration {
        self.window / self.buckets
    }
}

/// Is this upstream HTTP status a failure for the breaker? 502, 503, 504 and 429: the
/// upstream (or a proxy in front of it) could not serve; other statuses are answers.
pub fn failure_status(status: u16) -> bool {
    matches!(status, 429 | 502 | 503 | 504)
}

/// The breaker refused the request: answer 503 without dispatching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerOpen;

impl std::fmt::Display for BreakerOpen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("upstream breaker open")
    }
}

impl std::error::Error for BreakerOpen {}

/// Breaker state for metrics: closed (ratio 0), throttling (0 < ratio), open (ratio at cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Nothing is rejected.
    Closed = 0,
    /// Some requests are rejected.
    Throttling = 1,
    /// Rejecting at the cap; only probes get through.
    Open = 2,
}

#[derive(Debug, Default, Clone, Copy)]
struct Bucket {
    sum: u64,
    success: u64,
    failure: u64,
    drop: u64,
}

#[derive(Debug)]
struct Ring {
    buckets: Vec<Bucket>,
    /// Absolute index (time / bucket) of the current bucket.
    cur: u64,
    last_pass: Option<Duration>,
    /// Dispatched and not finished: counted in their bucket's `sum`, left out of `total`
    /// until they finish, so a burst of slow requests does not read as failures.
    pending: u64,
}

/// What the window says now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct History {
    /// Successes in the window.
    pub accepts: u64,
    /// Requests (dispatched or completed, per config) plus drops in the window.
    pub total: u64,
    /// Trailing buckets with failures and no success.
    pub failing_buckets: u64,
    /// Trailing buckets with successes and no failure.
    pub working_buckets: u64,
}

/// The adaptive breaker of one (upstream, route). Share it as `Arc<Breaker>`.
#[derive(Debug)]
pub struct Breaker {
    cfg: BreakerConfig,
    name: String,
    ring: Mutex<Ring>,
    state: AtomicU8,
    rejected: AtomicU64,
    ratio_milli: AtomicU64,
}

impl Breaker {
    /// A closed breaker named `name` (e.g. "upstream/route").
    pub fn new(name: &str, cfg: BreakerConfig) -> Result<Self, Error> {
        cfg.validate()?;
        Ok(Self {
            ring: Mutex::new(Ring {
                buckets: vec![Bucket::default(); cfg.buckets as usize],
                cur: 0,
                last_pass: None,
                pending: 0,
            }),
            cfg,
            name: name.to_owned(),
            state: AtomicU8::new(0),
            rejected: AtomicU64::new(0),
            ratio_milli: AtomicU64::new(0),
        })
    }

    /// The breaker's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Configuration.
    pub fn config(&self) -> &BreakerConfig {
        &self.cfg
    }

    /// Decides whether to dispatch at `now`, with a thread-local random coin.
    pub fn allow(&self, now: Duration) -> Result<BreakerPermit<'_>, BreakerOpen> {
        self.allow_with(now, fastrand::f64())
    }

    /// Decides with an explicit coin in [0, 1) (deterministic tests): reject iff coin < ratio.
    pub fn allow_with(&self, now: Duration, coin: f64) -> Result<BreakerPermit<'_>, BreakerOpen> {
        let mut ring = self.lock();
        self.roll(&mut ring, now);
        let h = history(&ring);
        let mut ratio = self.base_ratio(&h);
        if ratio > 0.0 {
            let probe_due = match ring.last_pass {
                Some(last) => now.saturating_sub(last) > self.cfg.force_pass,
                None => self.cfg.probe_without_pass,
            };
            if probe_due {
                ring.last_pass = Some(now);
                return Ok(self.dispatch(&mut ring, now));
            }
            ratio *= (f64::from(self.cfg.buckets) - h.working_buckets as f64)
                / f64::from(self.cfg.buckets);
            ratio = ratio.min(self.cfg.max_reject);
            self.publish(ratio);
            if coin < ratio {
                let idx = self.index(&ring);
                let b = &mut ring.buckets[idx];
                b.sum += 1;
                b.drop += 1;
                self.rejected.fetch_add(1, Ordering::Relaxed);
                return Err(BreakerOpen);
            }
            ring.last_pass = Some(now);
        } else {
            self.publish(0.0);
            if self.cfg.probe_without_pass {
                ring.last_pass = Some(now);
            }
        }
        Ok(self.dispatch(&mut ring, now))
    }

    fn dispatch(&self, ring: &mut Ring, _now: Duration) -> BreakerPermit<'_> {
        let at = ring.cur;
        if self.cfg.count_at_dispatch {
            let idx = self.index(ring);
            ring.buckets[idx].sum += 1;
            ring.pending += 1;
        }
        DispatchPermit {
            breaker: self,
            dispatched_at: at,
            done: false,
        }
    }

    /// `((total − protection) − w·accepts) / (total + 1)`, before recovery scaling and cap.
    fn base_ratio(&self, h: &History) -> f64 {
        let c = &self.cfg;
        let w =
            (c.k - (c.k - c.min_k) * h.failing_buckets as f64 / f64::from(c.buckets)).max(c.min_k);
        ((h.total as f64 - c.protection as f64) - w * h.accepts as f64) / (h.total as f64 + 1.0)
    }

    fn publish(&self, ratio: f64) {
        let state = if ratio <= 0.0 {
            BreakerState::Closed
        } else if ratio >= self.cfg.max_reject {
            BreakerState::Open
        } else {
            BreakerState::Throttling
        };
        self.state.store(state as u8, Ordering::Relaxed);
        self.ratio_milli
            .store((ratio.max(0.0) * 1000.0) as u64, Ordering::Relaxed);
    }

    /// The window's totals at `now` (rolls expired buckets first).
    pub fn history(&self, now: Duration) -> History {
        let mut ring = self.lock();
        self.roll(&mut ring, now);
        history(&ring)
    }

    /// Rejection probability a request would face at `now` (ignoring a due probe).
    pub fn reject_ratio(&self, now: Duration) -> f64 {
        let h = self.history(now);
        let ratio = self.base_ratio(&h);
        if ratio <= 0.0 {
            return 0.0;
        }
        (ratio * (f64::from(self.cfg.buckets) - h.working_buckets as f64)
            / f64::from(self.cfg.buckets))
        .min(self.cfg.max_reject)
    }

    /// State at the last decision.
    pub fn state(&self) -> BreakerState {
        match self.state.load(Ordering::Relaxed) {
            0 => BreakerState::Closed,
            1 => BreakerState::Throttling,
            _ => BreakerState::Open,
        }
    }

    /// Requests rejected so far.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    /// Records a success or failure directly (go-zero's `markSuccess`/`markFailure`; tests and
    /// callers that do not hold a permit).
    pub fn record(&self, now: Duration, success: bool) {
        let mut ring = self.lock();
        self.roll(&mut ring, now);
        let idx = self.index(&ring);
        let b = &mut ring.buckets[idx];
        if !self.cfg.count_at_dispatch {
            b.sum += 1;
        }
        if success {
            b.success += 1;
        } else {
            b.failure += 1;
        }
    }

    fn finish(&self, now: Duration, dispatched_at: u64, result: Option<bool>) {
        if self.cfg.count_at_dispatch {
            let mut ring = self.lock();
            ring.pending = ring.pending.saturating_sub(1);
        }
        match result {
            Some(success) => self.record(now, success),
            None => {
                // Forget: undo the dispatch count if its bucket is still in the window.
                if self.cfg.count_at_dispatch {
                    let mut ring = self.lock();
                    self.roll(&mut ring, now);
                    if ring.cur - dispatched_at < u64::from(self.cfg.buckets) {
                        let idx = (dispatched_at % u64::from(self.cfg.buckets)) as usize;
                        let b = &mut ring.buckets[idx];
                        b.sum = b.sum.saturating_sub(1);
                    }
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn index(&self, ring: &Ring) -> usize {
        (ring.cur % u64::from(self.cfg.buckets)) as usize
    }

    /// Moves the window to `now`, resetting the buckets that expired.
    fn roll(&self, ring: &mut Ring, now: Duration) {
        let idx = (now.as_nanos() / self.cfg.bucket().as_nanos()) as u64;
        if idx <= ring.cur {
            return;
        }
        let n = u64::from(self.cfg.buckets);
        let span = (idx - ring.cur).min(n);
        for i in 1..=span {
            let slot = ((idx - span + i) % n) as usize;
            ring.buckets[slot] = Bucket::default();
        }
        ring.cur = idx;
    }
}

fn history(ring: &Ring) -> History {
    let n = ring.buckets.len() as u64;
    // Requests still in flight have no outcome yet: not in `total` until they finish.
    let mut h = History {
        total: 0u64.wrapping_sub(ring.pending),
        ..History::default()
    };
    // Oldest to newest: the slot after the current one is the oldest still in the window.
    for i in 1..=n {
        let b = &ring.buckets[((ring.cur + i) % n) as usize];
        h.accepts += b.success;
        h.total = h.total.wrapping_add(b.sum);
        if b.failure > 0 {
            h.working_buckets = 0;
        } else if b.success > 0 {
            h.working_buckets += 1;
        }
        if b.success > 0 {
            h.failing_buckets = 0;
        } else if b.failure > 0 {
            h.failing_buckets += 1;
        }
    }
    // More pending than counted (their buckets expired): nothing in the window.
    if h.total > u64::MAX / 2 {
        h.total = 0;
    }
    h
}

/// A dispatched request. End it with [`success`](Self::success) or
/// [`failure`](Self::failure); dropping it forgets the request (client cancelled, or a
/// layer-1 rejection): neither a success nor a failure.
#[derive(Debug)]
#[must_use = "dropping the permit forgets the request"]
pub struct DispatchPermit<B: Deref<Target = Breaker>> {
    breaker: B,
    dispatched_at: u64,
    done: bool,
}

/// A [`DispatchPermit`] borrowing its breaker.
pub type BreakerPermit<'a> = DispatchPermit<&'a Breaker>;

/// A [`DispatchPermit`] holding its breaker by `Arc` (for `'static` futures).
pub type OwnedBreakerPermit = DispatchPermit<Arc<Breaker>>;

impl<B: Deref<Target = Breaker>> DispatchPermit<B> {
    /// The upstream answered.
    pub fn success(mut self, now: Duration) {
        self.done = true;
        self.breaker.finish(now, self.dispatched_at, Some(true));
    }

    /// The upstream failed (connect error, timeout, [`failure_status`]).
    pub fn failure(mut self, now: Duration) {
        self.done = true;
        self.breaker.finish(now, self.dispatched_at, Some(false));
    }

    /// Ends by status code: a failure iff [`failure_status`].
    pub fn status(self, now: Duration, status: u16) {
        if failure_status(status) {
            self.failure(now)
        } else {
            self.success(now)
        }
    }
}

impl DispatchPermit<&Breaker> {
    /// Turns this into a permit that owns its breaker (for `'static` futures).
    pub fn into_owned(mut self, breaker: &Arc<Breaker>) -> OwnedBreakerPermit {
        debug_assert!(std::ptr::eq(self.breaker, &**breaker));
        self.done = true;
        DispatchPermit {
            breaker: Arc::clone(breaker),
            dispatched_at: self.dispatched_at,
            done: false,
        }
    }
}

impl<B: Deref<Target = Breaker>> Drop for DispatchPermit<B> {
    fn drop(&mut self) {
        if !self.done {
            // No clock here: forgetting only needs the bucket index, which cannot have
            // expired earlier than "now"; use the dispatch bucket's own time.
            let at = self.breaker.cfg.bucket() * (self.dispatched_at as u32);
            self.breaker.finish(at, self.dispatched_at, None);
        }
    }
}

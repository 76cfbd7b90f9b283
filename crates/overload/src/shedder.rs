//! Layer 1, self-protection: the adaptive shedder (go-zero's, corrected per research §9.2).
//!
//! A [`Controller`] guards one route group. The request path calls [`Controller::admit`],
//! which reads a few atomics and, when admitted, increments the in-flight count and returns
//! a RAII [`Permit`]; finishing the permit (or dropping it) decrements it and, for a request
//! served fully, adds a pass and its response time to the current bucket accumulator.
//! Everything else (rolling the 50 x 100 ms buckets, `maxPass`, `minRt`, capacity `C`, the
//! CPU factor, limit `L`, the triggers) runs in [`Controller::tick`], called by the sampler
//! thread once per bucket; its results reach the request path as atomics.
//!
//! Hand-written, not a crate: the research found no adaptive limiter mature enough, and this
//! is the product (HELPERS.md). The in-flight count is one atomic shared by serving threads,
//! which design.md §2 rule 3 normally forbids: the instantaneous gate needs the exact global
//! count, and summing per-thread shards on every admission reads N lines instead of writing
//! one; the criterion bench `shedder/admit_complete` shows the cost (tens of ns).
//!
//! Two modes:
//! - [`Mode::Adaptive`]: hot on CPU >= threshold with a queue for a whole bucket (once
//!   shedding, the CPU alone), 1 s cool-off after a drop, or
//!   in-flight above `8·C + cores` for ten ticks (no CPU needed); gate on the
//!   *instantaneous* in-flight count against `L·m(class)`; RT in microseconds, `minRt` over
//!   30 s of buckets with >= 5 samples; `L = C·f(u) + cores + allowance` (the allowance
//!   grows while the gate sheds with the CPU under the threshold); the gate's last slot (the
//!   admission past `L`) opens only `minRt / (2·cores)` after the last completion, so the
//!   request it queues waits at most half a service. Above the cap `10·C + cores` a
//!   request is rejected even while cold if the backlog got there faster than 2.5x the
//!   capacity could build it (an onset, seen in the first milliseconds, before any tick or
//!   CPU sample), and always above twice the cap; a burst of a sub-capacity load climbs more
//!   slowly and is admitted.
//! - [`Mode::GoZero`]: go-zero's `adaptiveShedder` formulas exactly, for A/B runs: RT in
//!   ceil-milliseconds, `minRt` rounded over the 5 s window, the `avgFlying` EWMA updated on
//!   completions, drop iff `avgFlying > L && flying > L`, cool-off from the last request that
//!   saw CPU >= threshold; high-priority routes use threshold `(θ + 1000) / 2`.

use std::collections::VecDeque;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::Error;
use crate::class::{Class, Rejected};
use crate::clock::as_nanos;
use crate::limit::{LimitConfig, UpstreamLimit};

/// Which formulas the controller uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The corrected algorithm (research §9.2).
    Adaptive,
    /// go-zero's formulas, reproduced exactly for A/B comparison.
    GoZero,
}

/// How a request admitted by a [`Permit`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Served fully (any upstream status): counts as a pass with its response time.
    Served,
    /// Failed locally (timeout, locally generated 5xx): no pass, no RT sample (go-zero `Fail`).
    Failed,
    /// The client went away: no pass, no RT sample.
    Cancelled,
}

/// Tuning of a [`Controller`]; see [`ShedderConfig::adaptive`] and [`ShedderConfig::gozero`].
#[derive(Debug, Clone, PartialEq)]
pub struct ShedderConfig {
    /// Formulas to use.
    pub mode: Mode,
    /// CPU threshold in millicpu (900 = 90 % of the allowed cores).
    pub threshold: u32,
    /// How long after the last overloaded moment shedding continues, if something was shed.
    pub cool_off: Duration,
    /// Bucket width of the rolling windows.
    pub bucket: Duration,
    /// Buckets in the pass window (the current one is never counted).
    pub buckets: usize,
    /// Window of the `minRt` estimate (adaptive; go-zero uses the pass window).
    pub min_rt_window: Duration,
    /// Samples a bucket needs before its mean RT can be the minimum (adaptive).
    pub min_rt_samples: u64,
    /// CPU-independent trigger level `hard_trigger·C + cores` (0 disables): if in-flight
    /// is above it for `hard_trigger_dwell` ticks, the controller turns hot as if the CPU
    /// were.
    pub hard_trigger: f64,
    /// Concurrency cap `hard_cap·C + cores` (0 disables), checked on the request path even
    /// while cold: it bounds the backlog within the first milliseconds of an onset, before
    /// any tick or CPU sample can notice it. It rejects when in-flight rose from `C + cores`
    /// to it in less than `(hard_cap − 1)·minRt / 2.5` (arrivals above 2.5x the capacity),
    /// once an episode at the cap has begun, and always above twice the cap.
    pub hard_cap: f64,
    /// Rejections at the cap for this long turn the controller hot at once (in-flight
    /// pinned at the cap is an overload, not a burst).
    pub hard_cap_dwell: Duration,
    /// Consecutive ticks above the trigger level before the controller turns hot.
    pub hard_trigger_dwell: u32,
    /// Limit multipliers for [`Class::Low`], [`Class::Normal`], [`Class::High`].
    pub multipliers: [f64; 3],
}

impl ShedderConfig {
    /// The corrected algorithm's defaults (research §9.2).
    pub fn adaptive() -> Self {
        Self {
            mode: Mode::Adaptive,
            threshold: 900,
            cool_off: Duration::from_secs(1),
            bucket: Duration::from_millis(100),
            buckets: 50,
            // 30 s: a minimum over a longer window resists the drift of "min RT" measured
            // on queued requests (Envoy #11579, Uber Cinnamon).
            min_rt_window: Duration::from_secs(30),
            min_rt_samples: 5,
            // 8: in the model, 4 gave 1.6 % false rejects at 0.8x load, 8 gave 0.18 %.
            hard_trigger: 8.0,
            // 3 ticks (300 ms): a Poisson burst at 0.8x load drains within tens of ms, an
            // overload keeps in-flight at the cap.
            hard_trigger_dwell: 10,
            // 10: at 16 the onset backlog (~30 requests on 2 cores) put the onset P99 at
            // 85 ms. A 0.8x load reaches it in bursts (a ~0.05 % reject rate when the cap
            // applied to any rise); only a rise faster than 2.5x the capacity is capped.
            hard_cap: 10.0,
            hard_cap_dwell: Duration::from_millis(25),
            multipliers: [0.5, 1.0, 1.5],
        }
    }

    /// go-zero's defaults (`core/load/adaptiveshedder.go`).
    pub fn gozero() -> Self {
        Self {
            mode: Mode::GoZero,
            min_rt_window: Duration::from_secs(5),
            min_rt_samples: 1,
            hard_trigger: 0.0,
            hard_trigger_dwell: 0,
            hard_cap: 0.0,
            hard_cap_dwell: Duration::ZERO,
            multipliers: [1.0, 1.0, 1.0],
            ..Self::adaptive()
        }
    }

    /// Checks ranges; the controller relies on them.
    pub fn validate(&self) -> Result<(), Error> {
        if !(1..1000).contains(&self.threshold) {
            return Err(Error::Config(format!(
                "threshold must be in 1..1000 millicpu, got {}",
                self.threshold
            )));
        }
        if self.bucket.is_zero() || self.buckets < 2 {
            return Err(Error::Config(
                "need at least 2 buckets of non-zero width".into(),
            ));
        }
        if self
            .multipliers
            .iter()
            .any(|m| !(m.is_finite() && *m > 0.0))
        {
            return Err(Error::Config("class multipliers must be positive".into()));
        }
        let non_negative = |x: f64| x.is_finite() && x >= 0.0;
        if !(non_negative(self.hard_trigger) && non_negative(self.hard_cap)) {
            return Err(Error::Config(
                "hard_trigger and hard_cap must be >= 0".into(),
            ));
        }
        Ok(())
    }

    fn window(&self) -> Duration {
        self.bucket * (self.buckets as u32 - 1)
    }
}

/// Keeps a hot atomic on its own cache line (128 B: adjacent-line prefetch pairs lines).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

impl<T> Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The in-flight count and, on the same cache line (the admission writes it anyway), the
/// last moment an admission found no queue: how fast a backlog grew.
#[derive(Debug, Default)]
struct Flight {
    n: AtomicI64,
    /// Nanoseconds of the last admission that found in-flight at or under `Gate::calm`.
    calm_at: AtomicU64,
    /// Nanoseconds of the end of the last completed request (0: none yet).
    done_at: AtomicU64,
    /// Nanoseconds of the last request an upstream's concurrency limit refused (0: none).
    upstream_limited_at: AtomicU64,
}

/// Passes and RT of the current bucket, written by completions, drained by `tick`.
#[derive(Debug, Default)]
struct Acc {
    pass: AtomicU64,
    rt_sum: AtomicU64,
    rt_n: AtomicU64,
    /// Completions of any outcome (for the admitted total: done + in flight).
    done: AtomicU64,
}

/// What the request path reads; written by `tick` (and by rejections: `dropped`).
#[derive(Debug, Default)]
struct Gate {
    overloaded: AtomicBool,
    overloaded_high: AtomicBool,
    forced: AtomicBool,
    /// Something was shed since the last overloaded moment, per lane: 0 for everything,
    /// 1 for go-zero mode's high-priority routes (go-zero gives them their own shedder).
    dropped: [AtomicBool; 2],
    /// Nanoseconds of the last overloaded moment per lane; 0 = never.
    last_overload: [AtomicU64; 2],
    limit: AtomicF64,
    limit_high: AtomicF64,
    /// In-flight count above which requests are rejected even while cold (infinite: off).
    cap: AtomicF64,
    /// The trigger level `K·C + cores`.
    level: AtomicF64,
    /// In-flight at or under this is "no backlog" (`C + cores`, L when the CPU factor is 1;
    /// −inf: not tracked).
    calm: AtomicF64,
    /// Nanoseconds in which a backlog from `calm` to the cap means arrivals of more than
    /// 2.5 times the capacity (`(hard_cap − 1)·minRt / 2.5`): only such a fast rise is
    /// capped at once.
    rise: AtomicU64,
    /// Nanoseconds of the first cap rejection of the current episode; 0 = none.
    capped_since: AtomicU64,
    /// The last slot of the gate (the one past `L`) is only given to a request arriving at
    /// least this many nanoseconds after the last completion (`minRt / (2·cores)`); 0 = off.
    slot_age: AtomicU64,
}

/// An f64 in an AtomicU64 (bits), relaxed: readers need a recent value, not an ordering.
#[derive(Debug, Default)]
struct AtomicF64(AtomicU64);

impl AtomicF64 {
    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
    fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }
}

/// Rejections per class (written only on the reject path). Admissions are not counted
/// separately: admitted = completions + in flight, so the admit path writes one line.
#[derive(Debug, Default)]
struct Counters {
    shed: [AtomicU64; 4],
}

/// A point-in-time view of a controller, for metrics and tests.
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerSnapshot {
    /// Route group name.
    pub name: String,
    /// Requests in flight now.
    pub inflight: i64,
    /// Capacity `C` (go-zero mode: `maxFlight`).
    pub capacity: f64,
    /// Limit `L` for [`Class::Normal`].
    pub limit: f64,
    /// Max passes per bucket over the window.
    pub max_pass: f64,
    /// Minimum bucket-mean RT (µs; go-zero mode: ms).
    pub min_rt: f64,
    /// Smoothed CPU at the last tick (millicpu).
    pub cpu: u32,
    /// Shedding would reject above the limit right now.
    pub hot: bool,
    /// Admitted so far.
    pub admitted: u64,
    /// Served fully so far.
    pub served: u64,
    /// Shed so far, by [`Class::index`].
    pub shed: [u64; 4],
}

#[derive(Debug, Clone, Copy)]
struct Record {
    end: Duration,
    pass: f64,
    rt_sum: f64,
    rt_n: u64,
}

/// Background-only state, locked only by `tick` (never on the request path).
#[derive(Debug, Default)]
struct Window {
    started: Option<Duration>,
    records: VecDeque<Record>,
    dwell: u32,
    served_total: u64,
    done_total: u64,
    max_pass: f64,
    min_rt: f64,
    capacity: f64,
    cpu: u32,
    /// Queue allowance added to `L` (adaptive): grows while the gate sheds and the CPU is
    /// under the threshold, halves while the CPU is saturated.
    allowance: f64,
    /// Shed total at the last tick.
    shed_seen: u64,
    /// The last tick with the CPU at or above the threshold.
    cpu_hot_at: Option<Duration>,
}

/// The adaptive shedder of one route group. Share it as `Arc<Controller>`.
#[derive(Debug)]
pub struct Controller {
    cfg: ShedderConfig,
    name: String,
    flight: Padded<Flight>,
    acc: Padded<Acc>,
    gate: Padded<Gate>,
    avg_flying: Padded<AtomicF64>,
    cores: AtomicF64,
    counters: Padded<Counters>,
    window: Mutex<Window>,
}

impl Controller {
    /// A controller for route group `name`. Until the first tick it admits everything.
    pub fn new(name: &str, cfg: ShedderConfig) -> Result<Self, Error> {
        cfg.validate()?;
        let ctl = Self {
            cfg,
            name: name.to_owned(),
            flight: Padded::default(),
            acc: Padded::default(),
            gate: Padded::default(),
            avg_flying: Padded::default(),
            cores: AtomicF64::default(),
            counters: Padded::default(),
            window: Mutex::new(Window::default()),
        };
        ctl.cores.set(1.0);
        ctl.gate.limit.set(f64::INFINITY);
        ctl.gate.limit_high.set(f64::INFINITY);
        ctl.gate.cap.set(f64::INFINITY);
        ctl.gate.level.set(f64::INFINITY);
        ctl.gate.calm.set(f64::NEG_INFINITY);
        Ok(ctl)
    }

    /// The configuration.
    pub fn config(&self) -> &ShedderConfig {
        &self.cfg
    }

    /// Route group name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sets the allowed cores `N` (the limit's floor in adaptive mode).
    pub fn set_cores(&self, cores: f64) {
        if cores.is_finite() && cores > 0.0 {
            self.cores.set(cores);
        }
    }

    /// A request of this group was refused by its upstream's concurrency limit at `now`
    /// (one relaxed store, on the refusal path only): the group counts as queued for the
    /// CPU trigger, as it would if in-flight had stayed over `C + cores`.
    pub fn upstream_limited(&self, now: Duration) {
        self.flight
            .upstream_limited_at
            .store(as_nanos(now).max(1), Ordering::Relaxed);
    }

    /// Requests in flight now.
    pub fn inflight(&self) -> i64 {
        self.flight.n.load(Ordering::Relaxed)
    }

    /// Admission decision at `now`. Cost: a handful of relaxed loads, plus one atomic add
    /// when admitted; a rejection writes only its counter (and the `dropped` flag once).
    #[inline]
    pub fn admit(&self, now: Duration, class: Class) -> Result<Permit<'_>, Rejected> {
        let flying = self.flight.n.load(Ordering::Relaxed) as f64;
        if let Some(severe) = self.should_drop(now, class, flying) {
            return Err(self.reject(class, severe));
        }
        if flying <= self.gate.calm.get() {
            self.flight.calm_at.store(as_nanos(now), Ordering::Relaxed);
        }
        self.flight.n.fetch_add(1, Ordering::Relaxed);
        Ok(Permit {
            ctl: self,
            start: now,
            done: false,
        })
    }

    /// Like [`admit`](Self::admit), with a permit that owns an `Arc` (for futures).
    pub fn admit_owned(
        self: &Arc<Self>,
        now: Duration,
        class: Class,
    ) -> Result<OwnedPermit, Rejected> {
        let permit = self.admit(now, class)?;
        let start = permit.start;
        std::mem::forget(permit);
        Ok(OwnedPermit {
            ctl: Arc::clone(self),
            start,
            done: false,
        })
    }

    /// go-zero's `shouldDrop`: `Some(severe)` to reject. Does not mark the drop.
    #[inline]
    fn should_drop(&self, now: Duration, class: Class, flying: f64) -> Option<bool> {
        if class == Class::Critical {
            return None;
        }
        let g = &self.gate;
        let hot = match self.cfg.mode {
            Mode::Adaptive => {
                let m = self.cfg.multipliers[class.index().min(2)];
                let cap = g.cap.get() * m;
                if flying > cap && self.at_cap(now, flying > 2.0 * cap) {
                    self.capped(now);
                    return Some(true);
                }
                if flying <= g.level.get() && g.capped_since.load(Ordering::Relaxed) != 0 {
                    g.capped_since.store(0, Ordering::Relaxed);
                }
                g.overloaded.load(Ordering::Relaxed)
                    || g.forced.load(Ordering::Relaxed)
                    || self.still_hot(now, 0)
            }
            Mode::GoZero => {
                let lane = usize::from(class == Class::High);
                let overloaded = if lane == 1 {
                    &g.overloaded_high
                } else {
                    &g.overloaded
                };
                if overloaded.load(Ordering::Relaxed) {
                    // go-zero's systemOverloaded(): every request that sees it hot moves
                    // overloadTime to now.
                    g.last_overload[lane].store(as_nanos(now).max(1), Ordering::Relaxed);
                    true
                } else {
                    self.still_hot(now, lane)
                }
            }
        };
        if !hot {
            return None;
        }
        let limit = self.limit_for(class);
        let over = match self.cfg.mode {
            // The gate's last slot (the admission that takes in-flight past L) queues a
            // request behind the ones being served. Given right after a completion it waits
            // almost a whole service time (at 10x on one core: admitted P50 two service
            // times, P99 11.7 ms); given only once the running requests are half done
            // (`slot_age`), it waits at most half of one, and at heavy overload an arrival
            // almost surely comes in that half, so the upstream is not left idle.
            Mode::Adaptive => flying > limit || (flying + 1.0 > limit && self.slot_early(now)),
            Mode::GoZero => self.avg_flying.get() > limit && flying > limit,
        };
        over.then_some(flying > 2.0 * limit)
    }

    /// Whether the gate's last slot is still closed at `now`: the last completion was less
    /// than `slot_age` ago.
    #[inline]
    fn slot_early(&self, now: Duration) -> bool {
        let age = self.gate.slot_age.load(Ordering::Relaxed);
        age != 0 && as_nanos(now).saturating_sub(self.flight.done_at.load(Ordering::Relaxed)) < age
    }

    /// Whether a request above the cap is rejected: when the backlog rose there faster than
    /// 2.5 times the capacity could have built it (an onset), once an episode at the cap has
    /// begun, or at twice the cap. A burst of a sub-capacity load climbs to the cap far more
    /// slowly (in the simulation at 0.8x on 2 cores, a rise to the cap within the ~14 ms
    /// window needs ~20 arrivals where ~6 are expected), and is let through.
    #[cold]
    fn at_cap(&self, now: Duration, double: bool) -> bool {
        let g = &self.gate;
        let now_ns = as_nanos(now);
        let last = g.last_overload[0].load(Ordering::Relaxed);
        double
            || g.capped_since.load(Ordering::Relaxed) != 0
            || now_ns.saturating_sub(self.flight.calm_at.load(Ordering::Relaxed))
                < g.rise.load(Ordering::Relaxed)
            // Back at the cap within the pass window (5 s) of an overload: the overload
            // again, not a burst (a neighbour taking the CPU the sampler cannot see makes
            // the group cool off and climb back every second or so).
            || (last != 0 && now_ns.saturating_sub(last) < as_nanos(self.cfg.window()))
    }

    /// A rejection at the cap: pinned there for `hard_cap_dwell`, the controller turns hot.
    #[cold]
    fn capped(&self, now: Duration) {
        let g = &self.gate;
        let now_ns = as_nanos(now).max(1);
        let since = g.capped_since.load(Ordering::Relaxed);
        if since == 0 {
            let _ =
                g.capped_since
                    .compare_exchange(0, now_ns, Ordering::Relaxed, Ordering::Relaxed);
        } else if now_ns.saturating_sub(since) >= as_nanos(self.cfg.hard_cap_dwell)
            && !g.forced.load(Ordering::Relaxed)
        {
            g.forced.store(true, Ordering::Relaxed);
            g.last_overload[0].store(now_ns, Ordering::Relaxed);
            g.dropped[0].store(true, Ordering::Relaxed);
        }
    }

    /// go-zero's `stillHot`: something was shed, and the last overloaded moment is recent.
    #[inline]
    fn still_hot(&self, now: Duration, lane: usize) -> bool {
        let g = &self.gate;
        if !g.dropped[lane].load(Ordering::Relaxed) {
            return false;
        }
        let last = g.last_overload[lane].load(Ordering::Relaxed);
        if last == 0 {
            return false;
        }
        if as_nanos(now).saturating_sub(last) < as_nanos(self.cfg.cool_off) {
            return true;
        }
        g.dropped[lane].store(false, Ordering::Relaxed);
        false
    }

    #[inline]
    fn limit_for(&self, class: Class) -> f64 {
        match self.cfg.mode {
            Mode::GoZero if class == Class::High => self.gate.limit_high.get(),
            Mode::GoZero => self.gate.limit.get(),
            Mode::Adaptive => {
                let m = self.cfg.multipliers[class.index().min(2)];
                self.gate.limit.get() * m
            }
        }
    }

    #[cold]
    fn reject(&self, class: Class, severe: bool) -> Rejected {
        let lane = usize::from(self.cfg.mode == Mode::GoZero && class == Class::High);
        let dropped = &self.gate.dropped[lane];
        if !dropped.load(Ordering::Relaxed) {
            dropped.store(true, Ordering::Relaxed);
        }
        self.counters.shed[class.index()].fetch_add(1, Ordering::Relaxed);
        Rejected { class, severe }
    }

    /// Records the end of an admitted request that started at `start` (called by the
    /// permits).
    fn complete(&self, outcome: Outcome, start: Duration, rt: Duration) {
        let flying = self.flight.n.fetch_sub(1, Ordering::Relaxed) - 1;
        if self.cfg.mode == Mode::Adaptive && rt > Duration::ZERO {
            self.flight
                .done_at
                .store(as_nanos(start + rt), Ordering::Relaxed);
        }
        if self.cfg.mode == Mode::GoZero {
            // go-zero: avgFlying = 0.9·avgFlying + 0.1·flying, on every completion.
            let _ =
                self.avg_flying
                    .0
                    .0
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                        Some((f64::from_bits(bits) * 0.9 + flying as f64 * 0.1).to_bits())
                    });
        }
        if outcome == Outcome::Served {
            let rt = match self.cfg.mode {
                // go-zero: int64(math.Ceil(rt in ms)).
                Mode::GoZero => rt.as_nanos().div_ceil(1_000_000) as u64,
                Mode::Adaptive => rt.as_micros() as u64,
            };
            self.acc.pass.fetch_add(1, Ordering::Relaxed);
            self.acc.rt_sum.fetch_add(rt, Ordering::Relaxed);
            self.acc.rt_n.fetch_add(1, Ordering::Relaxed);
        }
        self.acc.done.fetch_add(1, Ordering::Relaxed);
    }

    /// The decision loop, run off the request path once per bucket (and whenever the CPU
    /// value changes): rolls the window, recomputes `C` and `L`, and sets the triggers.
    pub fn tick(&self, now: Duration, cpu: u32) {
        let cfg = &self.cfg;
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let started = *w.started.get_or_insert(now);
        let elapsed = now.saturating_sub(started);
        if elapsed >= cfg.bucket {
            let n = (elapsed.as_nanos() / cfg.bucket.as_nanos()) as u32;
            let pass = self.acc.pass.swap(0, Ordering::Relaxed) as f64;
            let rt_sum = self.acc.rt_sum.swap(0, Ordering::Relaxed) as f64;
            let rt_n = self.acc.rt_n.swap(0, Ordering::Relaxed);
            w.served_total += pass as u64;
            w.done_total += self.acc.done.swap(0, Ordering::Relaxed);
            let next = started + cfg.bucket * n;
            match cfg.mode {
                Mode::GoZero => {
                    // go-zero's window is in time slots: the data belongs to the first slot,
                    // the slots skipped since are empty.
                    for i in 0..n {
                        let first = i == 0;
                        // Slots older than the window would expire at once: skip building them.
                        if !first && i + (cfg.buckets as u32) < n {
                            continue;
                        }
                        w.records.push_back(Record {
                            end: started + cfg.bucket * (i + 1),
                            pass: if first { pass } else { 0.0 },
                            rt_sum: if first { rt_sum } else { 0.0 },
                            rt_n: if first { rt_n } else { 0 },
                        });
                    }
                }
                Mode::Adaptive => {
                    // A late tick (a starved thread) must not inflate maxPass: normalise the
                    // passes to one nominal bucket.
                    let scale = cfg.bucket.as_secs_f64() / elapsed.as_secs_f64();
                    w.records.push_back(Record {
                        end: next,
                        pass: pass * scale,
                        rt_sum,
                        rt_n,
                    });
                }
            }
            w.started = Some(next);
            let keep = cfg.window().max(cfg.min_rt_window);
            while w.records.front().is_some_and(|r| r.end + keep <= next) {
                w.records.pop_front();
            }
            self.recompute(&mut w, next);
        } else if w.records.is_empty() && w.capacity == 0.0 {
            self.recompute(&mut w, started);
        }

        // CPU and the triggers.
        w.cpu = cpu;
        let cores = self.cores.get();
        // Adaptive: the CPU alone is not enough to turn hot; the group must also have
        // queued for the last bucket (no admission found in-flight at or under `C + cores`).
        // At 0.8x load the smoothed CPU touches the threshold now and then (a 600 s
        // simulation read 0.904 once), while in-flight still drains every few ms. A group
        // already shedding stays hot on the CPU alone (its gate keeps in-flight under
        // `C + cores`, so it never looks queued).
        // An upstream's concurrency limit refusing requests of this group in the last
        // bucket is a backlog too: it keeps in-flight under `C + cores`, so without this a
        // group whose upstream shares its cores (the CPU signal sees the upstream's work)
        // would never turn hot and its half-service gate would never act.
        let limited_at = self.flight.upstream_limited_at.load(Ordering::Relaxed);
        let queued = cfg.mode == Mode::GoZero
            || as_nanos(now).saturating_sub(self.flight.calm_at.load(Ordering::Relaxed))
                >= as_nanos(cfg.bucket)
            || (limited_at > 0 && as_nanos(now).saturating_sub(limited_at) < as_nanos(cfg.bucket))
            || (self.gate.dropped[0].load(Ordering::Relaxed)
                && (self.gate.overloaded.load(Ordering::Relaxed)
                    || self.gate.forced.load(Ordering::Relaxed)
                    || self.still_hot(now, 0)));
        let overloaded = cpu >= cfg.threshold && queued;
        let high_threshold = (cfg.threshold + 1000) / 2;
        self.gate.overloaded.store(overloaded, Ordering::Relaxed);
        self.gate
            .overloaded_high
            .store(cpu >= high_threshold, Ordering::Relaxed);
        let factor = |threshold: u32| {
            ((1000.0 - f64::from(cpu)) / (1000.0 - f64::from(threshold))).clamp(0.1, 1.0)
        };
        match cfg.mode {
            Mode::GoZero => {
                self.gate.limit.set(w.capacity * factor(cfg.threshold));
                self.gate
                    .limit_high
                    .set(w.capacity * factor(high_threshold));
            }
            Mode::Adaptive => {
                // + cores, not max(·, cores): a gate at about the core count leaves cores
                // idle between random arrivals (at 1.5x, in-flight <= 3 on 2 cores carries
                // ~84 % of capacity, <= 5 carries ~94 %), which drops the CPU under the
                // threshold and opens the gate again: the oscillation of the first version.
                // The allowance: shedding while the CPU is under the threshold means the gate
                // leaves cores idle (near capacity, in-flight <= 4 on 2 cores carries ~76 %
                // of a 0.95x load): widen it by a quarter core per tick. A saturated
                // CPU (>= 97 %) halves it, so at 3x-10x the gate is back to C·f + cores
                // within a few ticks. Only within a cool-off of a CPU reading at the
                // threshold: at an onset the CPU lags behind the in-flight triggers, and
                // there the backlog is real.
                let shed_total: u64 = self
                    .counters
                    .shed
                    .iter()
                    .map(|c| c.load(Ordering::Relaxed))
                    .sum();
                let shed_now = shed_total > w.shed_seen;
                w.shed_seen = shed_total;
                if cpu >= cfg.threshold {
                    w.cpu_hot_at = Some(now);
                }
                let gate_cooled_cpu = w
                    .cpu_hot_at
                    .is_some_and(|t| now.saturating_sub(t) < cfg.cool_off);
                if cpu >= 970 {
                    w.allowance *= 0.5;
                } else if cpu < cfg.threshold {
                    if shed_now && gate_cooled_cpu {
                        w.allowance = (w.allowance + 0.25 * cores)
                            .min(cfg.hard_trigger.max(1.0) * w.capacity);
                    } else if !shed_now {
                        w.allowance *= 0.9;
                    }
                }
                let limit = w.capacity * factor(cfg.threshold) + cores + w.allowance;
                self.gate.limit.set(limit);
                self.gate.limit_high.set(limit);
                let level = if cfg.hard_trigger > 0.0 {
                    cfg.hard_trigger * w.capacity + cores
                } else {
                    f64::INFINITY
                };
                self.gate.cap.set(if cfg.hard_cap > 0.0 {
                    cfg.hard_cap * w.capacity + cores
                } else {
                    f64::INFINITY
                });
                self.gate.level.set(level);
                self.gate.calm.set(w.capacity + cores);
                // From `C + N` to the cap `K·C + N` is (K − 1)·C requests; at 2.5 times the
                // capacity rate (C / minRt) they arrive in (K − 1)·minRt / 2.5. At 2 a 0.8x
                // burst on 2 cores (20 arrivals in 18 ms, 8 expected) passed for one in the
                // simulation's 10 min; at 3 the 3x onset rose too slowly (P99 68 ms).
                let rise_us = (cfg.hard_cap - 1.0).max(0.0) * w.min_rt / 2.5;
                self.gate.slot_age.store(
                    (w.min_rt / (2.0 * cores.max(1.0)) * 1000.0) as u64,
                    Ordering::Relaxed,
                );
                self.gate
                    .rise
                    .store((rise_us * 1000.0) as u64, Ordering::Relaxed);
                let above = self.flight.n.load(Ordering::Relaxed) as f64 > level;
                if above {
                    w.dwell += 1;
                } else {
                    w.dwell = 0;
                    self.gate.capped_since.store(0, Ordering::Relaxed);
                }
                // Forced by the dwell, or by the cap (on the request path) until in-flight is
                // back under the level.
                let was_forced = self.gate.forced.load(Ordering::Relaxed);
                let forced = w.dwell >= cfg.hard_trigger_dwell.max(1) || (was_forced && above);
                self.gate.forced.store(forced, Ordering::Relaxed);
                if overloaded || forced {
                    self.gate.last_overload[0].store(as_nanos(now).max(1), Ordering::Relaxed);
                    // A forced episode counts as a drop for the cool-off, so shedding does not
                    // stop the instant in-flight dips under the trigger.
                    if forced {
                        self.gate.dropped[0].store(true, Ordering::Relaxed);
                    }
                } else {
                    // Expire the cool-off here too, so an idle group does not stay hot.
                    self.still_hot(now, 0);
                }
            }
        }
    }

    fn recompute(&self, w: &mut Window, current_start: Duration) {
        let cfg = &self.cfg;
        let pass_from = current_start.saturating_sub(cfg.window());
        let max_pass = w
            .records
            .iter()
            .filter(|r| r.end > pass_from)
            .map(|r| r.pass)
            .fold(1.0f64, f64::max);
        let (min_rt, capacity) = match cfg.mode {
            Mode::GoZero => {
                // minRt in ms, each bucket mean rounded half away from zero (math.Round);
                // default 1000 ms when no bucket has samples.
                let min_rt = w
                    .records
                    .iter()
                    .filter(|r| r.end > pass_from && r.rt_n > 0)
                    .map(|r| (r.rt_sum / r.rt_n as f64).round())
                    .fold(1000.0f64, f64::min);
                let window_scale = (1.0 / cfg.bucket.as_secs_f64()) / 1000.0;
                (min_rt, (max_pass * min_rt * window_scale).max(1.0))
            }
            Mode::Adaptive => {
                let rt_from = current_start.saturating_sub(cfg.min_rt_window);
                let min_rt = w
                    .records
                    .iter()
                    .filter(|r| r.end > rt_from && r.rt_n >= cfg.min_rt_samples.max(1))
                    .map(|r| r.rt_sum / r.rt_n as f64)
                    .fold(1_000_000.0f64, f64::min);
                let per_sec = 1.0 / cfg.bucket.as_secs_f64();
                (min_rt, max_pass * per_sec * min_rt / 1e6)
            }
        };
        w.max_pass = max_pass;
        w.min_rt = min_rt;
        w.capacity = capacity;
    }

    /// A consistent-enough view for metrics and tests.
    pub fn snapshot(&self, now: Duration) -> ControllerSnapshot {
        let (max_pass, min_rt, capacity, cpu, served, done) = {
            let w = self.window.lock().unwrap_or_else(|e| e.into_inner());
            (
                w.max_pass,
                w.min_rt,
                w.capacity,
                w.cpu,
                w.served_total + self.acc.pass.load(Ordering::Relaxed),
                w.done_total + self.acc.done.load(Ordering::Relaxed),
            )
        };
        let g = &self.gate;
        let hot = g.overloaded.load(Ordering::Relaxed)
            || g.forced.load(Ordering::Relaxed)
            || (g.dropped[0].load(Ordering::Relaxed) && {
                let last = g.last_overload[0].load(Ordering::Relaxed);
                last != 0 && as_nanos(now).saturating_sub(last) < as_nanos(self.cfg.cool_off)
            });
        ControllerSnapshot {
            name: self.name.clone(),
            inflight: self.inflight(),
            capacity,
            limit: g.limit.get(),
            max_pass,
            min_rt,
            cpu,
            hot,
            admitted: done + self.inflight().max(0) as u64,
            served,
            shed: std::array::from_fn(|i| self.counters.shed[i].load(Ordering::Relaxed)),
        }
    }
}

/// An admitted request. Finish it with [`complete`](Permit::complete); dropping it counts
/// as [`Outcome::Cancelled`] (the in-flight count can never leak or go negative).
#[derive(Debug)]
#[must_use = "dropping the permit ends the request immediately"]
pub struct Permit<'a> {
    ctl: &'a Controller,
    start: Duration,
    done: bool,
}

impl Permit<'_> {
    /// When the request was admitted.
    pub fn start(&self) -> Duration {
        self.start
    }

    /// Ends the request at `now`; the RT is `now − start`.
    pub fn complete(mut self, now: Duration, outcome: Outcome) {
        self.done = true;
        self.ctl
            .complete(outcome, self.start, now.saturating_sub(self.start));
    }

    /// Ends the request with an explicit response time (e.g. measured by the caller).
    pub fn complete_with_rt(mut self, outcome: Outcome, rt: Duration) {
        self.done = true;
        self.ctl.complete(outcome, self.start, rt);
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.ctl
                .complete(Outcome::Cancelled, self.start, Duration::ZERO);
        }
    }
}

/// An admitted request holding its controller by `Arc` (for `'static` futures).
#[derive(Debug)]
#[must_use = "dropping the permit ends the request immediately"]
pub struct OwnedPermit {
    ctl: Arc<Controller>,
    start: Duration,
    done: bool,
}

impl OwnedPermit {
    /// When the request was admitted.
    pub fn start(&self) -> Duration {
        self.start
    }

    /// Ends the request at `now`; the RT is `now − start`.
    pub fn complete(mut self, now: Duration, outcome: Outcome) {
        self.done = true;
        self.ctl
            .complete(outcome, self.start, now.saturating_sub(self.start));
    }
}

impl Drop for OwnedPermit {
    fn drop(&mut self) {
        if !self.done {
            self.ctl
                .complete(Outcome::Cancelled, self.start, Duration::ZERO);
        }
    }
}

/// The route groups of one process, sharing one CPU signal. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Shedder {
    inner: Arc<ShedderInner>,
}

#[derive(Debug)]
struct ShedderInner {
    cfg: ShedderConfig,
    groups: Mutex<Vec<Arc<Controller>>>,
    limits: Mutex<Vec<Arc<UpstreamLimit>>>,
    cores: AtomicF64,
    cpu: AtomicU32,
}

impl Shedder {
    /// An empty set of groups with one configuration.
    pub fn new(cfg: ShedderConfig) -> Result<Self, Error> {
        cfg.validate()?;
        let inner = ShedderInner {
            cfg,
            groups: Mutex::new(Vec::new()),
            limits: Mutex::new(Vec::new()),
            cores: AtomicF64::default(),
            cpu: AtomicU32::new(0),
        };
        inner.cores.set(1.0);
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ShedderConfig {
        &self.inner.cfg
    }

    /// The controller of route group `name`, created on first use (config load time; keep
    /// the `Arc`, never look it up per request).
    pub fn group(&self, name: &str) -> Arc<Controller> {
        let mut groups = self.inner.groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = groups.iter().find(|g| g.name == name) {
            return Arc::clone(g);
        }
        let g = Arc::new(
            Controller::new(name, self.inner.cfg.clone())
                .expect("the config was validated by Shedder::new"),
        );
        g.set_cores(self.inner.cores.get());
        groups.push(Arc::clone(&g));
        g
    }

    /// The concurrency limit of upstream `name`, created on first use with `cfg` and ticked
    /// with the groups (a reload keeps an upstream's limit by name; a changed `cfg` makes a
    /// new one). Keep the `Arc`; never look it up per request.
    pub fn upstream_limit(
        &self,
        name: &str,
        cfg: &LimitConfig,
    ) -> Result<Arc<UpstreamLimit>, Error> {
        let mut limits = self.inner.limits.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = limits
            .iter()
            .find(|l| l.name() == name && l.config() == cfg)
        {
            return Ok(Arc::clone(l));
        }
        let l = Arc::new(UpstreamLimit::new(name, cfg.clone())?);
        limits.retain(|old| old.name() != name);
        limits.push(Arc::clone(&l));
        Ok(l)
    }

    /// All upstream limits (for metrics).
    pub fn upstream_limits(&self) -> Vec<Arc<UpstreamLimit>> {
        self.inner
            .limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// All groups (for metrics).
    pub fn groups(&self) -> Vec<Arc<Controller>> {
        self.inner
            .groups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Bucket width: how often [`tick`](Self::tick) should run.
    pub fn bucket(&self) -> Duration {
        self.inner.cfg.bucket
    }

    /// Sets the allowed cores of every group.
    pub fn set_cores(&self, cores: f64) {
        self.inner.cores.set(cores);
        for g in self.groups() {
            g.set_cores(cores);
        }
    }

    /// Allowed cores `N`.
    pub fn cores(&self) -> f64 {
        self.inner.cores.get()
    }

    /// Latest CPU value given to `tick` (millicpu).
    pub fn cpu(&self) -> u32 {
        self.inner.cpu.load(Ordering::Relaxed)
    }

    /// Ticks every group.
    pub fn tick(&self, now: Duration, cpu: u32) {
        self.inner.cpu.store(cpu, Ordering::Relaxed);
        for g in self.groups() {
            g.tick(now, cpu);
        }
        for l in self.upstream_limits() {
            l.tick(now);
        }
    }
}

#[cfg(test)]
mod gozero_parity {
    //! go-zero's own `core/load/adaptiveshedder_test.go` values, ported sleep-free: each
    //! `time.Sleep(bucketDuration)` there is a `tick` at the next bucket boundary here.
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// go-zero's test shedder: 10 buckets; 100 ms wide so windowScale is the test's 0.01.
    fn shedder() -> Controller {
        let cfg = ShedderConfig {
            buckets: 10,
            ..ShedderConfig::gozero()
        };
        let c = Controller::new("t", cfg).unwrap();
        c.tick(ms(0), 0);
        c
    }

    fn add_rt(c: &Controller, rt_ms: u64) {
        c.acc.rt_sum.fetch_add(rt_ms, Ordering::Relaxed);
        c.acc.rt_n.fetch_add(1, Ordering::Relaxed);
    }

    /// passCounter (i+1)*100 and rtCounter i*10+1..=i*10+10 in bucket i, 10 buckets, the last
    /// one still current (no sleep after it).
    fn filled() -> Controller {
        let c = shedder();
        for i in 0..10u64 {
            if i > 0 {
                c.tick(ms(100 * i), 0);
            }
            c.acc.pass.fetch_add((i + 1) * 100, Ordering::Relaxed);
            for j in i * 10 + 1..=i * 10 + 10 {
                add_rt(&c, j);
            }
        }
        c
    }

    fn window(c: &Controller) -> (f64, f64, f64) {
        let w = c.window.lock().unwrap();
        (w.max_pass, w.min_rt, w.capacity)
    }

    #[test]
    fn max_pass_is_the_largest_completed_bucket() {
        let c = shedder();
        for i in 1..=10u64 {
            c.acc.pass.fetch_add(i * 100, Ordering::Relaxed);
            c.tick(ms(100 * i), 0);
        }
        assert_eq!(window(&c).0, 1000.0);
        // default max pass is 1
        let empty = shedder();
        empty.tick(ms(100), 0);
        assert_eq!(window(&empty).0, 1.0);
    }

    #[test]
    fn min_rt_is_the_smallest_rounded_bucket_mean() {
        let c = shedder();
        for i in 0..10u64 {
            if i > 0 {
                c.tick(ms(100 * i), 0);
            }
            for j in i * 10 + 1..=i * 10 + 10 {
                add_rt(&c, j);
            }
        }
        // bucket 0 has mean 5.5, rounded half away from zero (math.Round) to 6
        assert_eq!(window(&c).1, 6.0);
        let empty = shedder();
        empty.tick(ms(100), 0);
        assert_eq!(window(&empty).1, 1000.0, "defaultMinRt");
    }

    #[test]
    fn max_flight_is_54() {
        let c = filled();
        // maxPass 900 (the 1000 bucket is current) x minRt 6 x windowScale 0.01
        assert_eq!(window(&c).2, 54.0);
    }

    #[test]
    fn should_drop_truth_table() {
        let c = filled();
        // systemOverloadChecker = true while the CPU factor stays 1: cpu == threshold.
        c.tick(ms(900), 900);
        assert_eq!(c.gate.limit.get(), 54.0);
        let now = ms(950);
        let set = |avg: f64, flying: i64| {
            c.avg_flying.set(avg);
            c.flight.n.store(flying, Ordering::Relaxed);
        };
        // cpu >= threshold, avgFlying < limit
        set(50.0, 0);
        assert_eq!(c.should_drop(now, Class::Normal, c.inflight() as f64), None);
        // avgFlying > limit but flying < limit
        set(80.0, (54.0f64 * 1.0) as i64 - 5);
        assert_eq!(c.should_drop(now, Class::Normal, c.inflight() as f64), None);
        // both above
        set(80.0, 80);
        assert!(
            c.should_drop(now, Class::Normal, c.inflight() as f64)
                .is_some()
        );
        // cpu < threshold and nothing dropped: not hot (same bucket: the window is unchanged)
        c.tick(ms(960), 899);
        set(80.0, 80);
        assert_eq!(
            c.should_drop(ms(960), Class::Normal, c.inflight() as f64),
            None
        );
        // hot again: Allow returns an error
        c.tick(ms(970), 900);
        assert!(c.admit(ms(970), Class::Normal).is_err());
        c.flight.n.store(0, Ordering::Relaxed);
    }

    #[test]
    fn still_hot_needs_a_drop_and_a_recent_overload() {
        let c = filled();
        c.gate.dropped[0].store(true, Ordering::Relaxed);
        assert!(!c.still_hot(ms(5000), 0), "overloadTime 0: not hot");
        // overloadTime = now - 2 x coolOff
        c.gate.last_overload[0].store(as_nanos(ms(3000)), Ordering::Relaxed);
        assert!(!c.still_hot(ms(5000), 0));
        assert!(
            !c.gate.dropped[0].load(Ordering::Relaxed),
            "expiry clears it"
        );
        c.gate.dropped[0].store(true, Ordering::Relaxed);
        c.gate.last_overload[0].store(as_nanos(ms(5000)), Ordering::Relaxed);
        assert!(c.still_hot(ms(5000), 0));
    }

    #[test]
    fn avg_flying_lags_on_completions_only() {
        let c = shedder();
        let a = c.admit(ms(0), Class::Normal).unwrap();
        let b = c.admit(ms(0), Class::Normal).unwrap();
        assert_eq!(c.avg_flying.get(), 0.0, "admissions do not move avgFlying");
        a.complete(ms(3), Outcome::Served); // flying 1 -> avg 0.1
        b.complete(ms(3), Outcome::Failed); // flying 0 -> avg 0.09
        assert!((c.avg_flying.get() - 0.09).abs() < 1e-12);
        // RT is ceil(ms): 3 ms exactly stays 3; a failure records nothing
        assert_eq!(c.acc.rt_sum.load(Ordering::Relaxed), 3);
        assert_eq!(c.acc.pass.load(Ordering::Relaxed), 1);
        let p = c.admit(ms(0), Class::Normal).unwrap();
        p.complete(Duration::from_micros(3001), Outcome::Served);
        assert_eq!(
            c.acc.rt_sum.load(Ordering::Relaxed),
            3 + 4,
            "ceil(3.001) = 4"
        );
    }
}

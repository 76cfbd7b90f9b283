//! One route group's controller: its state, the request path (admit, complete, the
//! permits) and its snapshot; the decision loop that feeds the gate is in `tick.rs`.
//!
//! The in-flight count is one atomic shared by serving threads, which design.md §2 rule 3
//! normally forbids: the instantaneous gate needs the exact global count, and summing
//! per-thread shards on every admission reads N lines instead of writing one; the criterion
//! bench `shedder/admit_complete` shows the cost (tens of ns).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::config::{Mode, ShedderConfig};
use crate::Error;
use crate::class::{Class, Rejected};
use crate::clock::as_nanos;
use crate::padded::Padded;

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

/// The in-flight count and, on the same cache line (the admission writes it anyway), the
/// last moment an admission found no queue: how fast a backlog grew.
#[derive(Debug, Default)]
pub(super) struct Flight {
    pub(super) n: AtomicI64,
    /// Nanoseconds of the last admission that found in-flight at or under `Gate::calm`.
    pub(super) calm_at: AtomicU64,
    /// Nanoseconds of the end of the last completed request (0: none yet).
    pub(super) done_at: AtomicU64,
    /// Nanoseconds of the last request an upstream's concurrency limit refused (0: none).
    pub(super) upstream_limited_at: AtomicU64,
}

/// Passes and RT of the current bucket, written by completions, drained by `tick`.
#[derive(Debug, Default)]
pub(super) struct Acc {
    pub(super) pass: AtomicU64,
    pub(super) rt_sum: AtomicU64,
    pub(super) rt_n: AtomicU64,
    /// Completions of any outcome (for the admitted total: done + in flight).
    pub(super) done: AtomicU64,
}

/// What the request path reads; written by `tick` (and by rejections: `dropped`).
#[derive(Debug, Default)]
pub(super) struct Gate {
    pub(super) overloaded: AtomicBool,
    pub(super) overloaded_high: AtomicBool,
    pub(super) forced: AtomicBool,
    /// Something was shed since the last overloaded moment, per lane: 0 for everything,
    /// 1 for go-zero mode's high-priority routes (go-zero gives them their own shedder).
    pub(super) dropped: [AtomicBool; 2],
    /// Nanoseconds of the last overloaded moment per lane; 0 = never.
    pub(super) last_overload: [AtomicU64; 2],
    pub(super) limit: AtomicF64,
    pub(super) limit_high: AtomicF64,
    /// In-flight count above which requests are rejected even while cold (infinite: off).
    pub(super) cap: AtomicF64,
    /// The trigger level `K·C + cores`.
    pub(super) level: AtomicF64,
    /// In-flight at or under this is "no backlog" (`C + cores`, L when the CPU factor is 1;
    /// −inf: not tracked).
    pub(super) calm: AtomicF64,
    /// Nanoseconds in which a backlog from `calm` to the cap means arrivals of more than
    /// 2.5 times the capacity (`(hard_cap − 1)·minRt / 2.5`): only such a fast rise is
    /// capped at once.
    pub(super) rise: AtomicU64,
    /// Nanoseconds of the first cap rejection of the current episode; 0 = none.
    pub(super) capped_since: AtomicU64,
    /// The last slot of the gate (the one past `L`) is only given to a request arriving at
    /// least this many nanoseconds after the last completion (`minRt / (2·cores)`); 0 = off.
    pub(super) slot_age: AtomicU64,
}

/// An f64 in an AtomicU64 (bits), relaxed: readers need a recent value, not an ordering.
#[derive(Debug, Default)]
pub(super) struct AtomicF64(pub(super) AtomicU64);

impl AtomicF64 {
    pub(super) fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
    pub(super) fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }
}

/// Rejections per class (written only on the reject path). Admissions are not counted
/// separately: admitted = completions + in flight, so the admit path writes one line.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) shed: [AtomicU64; 4],
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
pub(super) struct Record {
    pub(super) end: Duration,
    pub(super) pass: f64,
    pub(super) rt_sum: f64,
    pub(super) rt_n: u64,
}

/// Background-only state, locked only by `tick` (never on the request path).
#[derive(Debug, Default)]
pub(super) struct Window {
    pub(super) started: Option<Duration>,
    pub(super) records: VecDeque<Record>,
    pub(super) dwell: u32,
    pub(super) served_total: u64,
    pub(super) done_total: u64,
    pub(super) max_pass: f64,
    pub(super) min_rt: f64,
    pub(super) capacity: f64,
    pub(super) cpu: u32,
    /// Queue allowance added to `L` (adaptive): grows while the gate sheds and the CPU is
    /// under the threshold, halves while the CPU is saturated.
    pub(super) allowance: f64,
    /// Shed total at the last tick.
    pub(super) shed_seen: u64,
    /// The last tick with the CPU at or above the threshold.
    pub(super) cpu_hot_at: Option<Duration>,
}

/// The adaptive shedder of one route group. Share it as `Arc<Controller>`.
#[derive(Debug)]
pub struct Controller {
    pub(super) cfg: ShedderConfig,
    pub(super) name: String,
    pub(super) flight: Padded<Flight>,
    pub(super) acc: Padded<Acc>,
    pub(super) gate: Padded<Gate>,
    pub(super) avg_flying: Padded<AtomicF64>,
    pub(super) cores: AtomicF64,
    pub(super) counters: Padded<Counters>,
    pub(super) window: Mutex<Window>,
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
        // No backlog: at or under the calm level and under this class's cap. An admission
        // let past its cap (a slow rise) found a queue; marking it calm would make the very
        // next one at the same instant look like a fast rise and be refused (found by
        // `props::controller_invariants`: one Low admitted, the next Low refused).
        let cap = self.gate.cap.get() * self.cfg.multipliers[class.index().min(2)];
        if flying <= self.gate.calm.get().min(cap) {
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
    pub(super) fn still_hot(&self, now: Duration, lane: usize) -> bool {
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

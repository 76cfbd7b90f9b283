//! A controller's decision loop, run off the request path by the sampler thread once per
//! bucket: rolls the window, recomputes `C` and `L`, and sets the triggers the gate reads.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::config::Mode;
use super::controller::{Controller, Record, Window};
use crate::clock::as_nanos;

impl Controller {
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
                // The bound holds against the capacity of now, not of when the allowance
                // grew: a capacity that falls (its busy buckets leaving the window) takes
                // the allowance down with it, or the gate stays wider than `9·C + cores`.
                w.allowance = w.allowance.min(cfg.hard_trigger.max(1.0) * w.capacity);
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
}

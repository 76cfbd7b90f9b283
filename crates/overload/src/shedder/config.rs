//! The tuning of a shedder's controllers: its two modes and their defaults.

use std::time::Duration;

use crate::Error;

/// Which formulas the controller uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The corrected algorithm (research §9.2).
    Adaptive,
    /// go-zero's formulas, reproduced exactly for A/B comparison.
    GoZero,
}

/// Tuning of a [`Controller`](crate::Controller); see [`ShedderConfig::adaptive`] and [`ShedderConfig::gozero`].
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
    /// Limit multipliers for [`Class::Low`](crate::Class::Low), [`Class::Normal`](crate::Class::Normal),
    /// [`Class::High`](crate::Class::High).
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

    pub(super) fn window(&self) -> Duration {
        self.bucket * (self.buckets as u32 - 1)
    }
}

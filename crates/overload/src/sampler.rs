//! Turns cumulative CPU readings into a smoothed utilisation, and drives the shedder from its
//! own OS thread.
//!
//! The thread is a plain `std::thread`, not a task: with go-zero's sampling goroutine and
//! GOMAXPROCS=1, the sampler starved for tens of seconds under load and the shedder never
//! fired (design.md §5). An OS thread is scheduled by the kernel like the serving threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::cpu::{CpuReader, CpuTotals};
use crate::shedder::Shedder;
use crate::{Clock, Error};

/// How raw samples are smoothed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Smoothing {
    /// `u = beta·u + (1 − beta)·raw` in floating point.
    Ewma {
        /// Weight of the previous value, in [0, 1).
        beta: f64,
    },
    /// go-zero's exact arithmetic: integer millicpu, `int64(prev·0.95 + cur·0.05)` (truncating).
    GoZero,
}

impl Smoothing {
    /// τ = 1 s at a 250 ms interval: `beta = exp(−0.25)` ≈ 0.78 (research §9.2; go-zero's 0.95
    /// is τ ≈ 5 s, 6.8 s to notice a step from 60 % to 100 %).
    pub fn adaptive() -> Self {
        Smoothing::Ewma {
            beta: (-0.25f64).exp(),
        }
    }
}

/// Pure CPU utilisation estimator: feed it readings, read millicpu (1000 = all allowed cores).
#[derive(Debug, Clone)]
pub struct CpuSampler {
    smoothing: Smoothing,
    last: Option<(Duration, CpuTotals)>,
    value: f64,
    errors: u64,
    cores: f64,
}

impl CpuSampler {
    /// A sampler starting at 0 (unknown load is treated as idle until the first delta).
    pub fn new(smoothing: Smoothing) -> Self {
        Self {
            smoothing,
            last: None,
            value: 0.0,
            errors: 0,
            cores: 1.0,
        }
    }

    /// Takes one reading at `now`. A failed read leaves the value unchanged and is counted:
    /// reading a failure as 0 would switch shedding off exactly when the system is in trouble.
    pub fn update(&mut self, now: Duration, reading: Result<CpuTotals, Error>) -> u32 {
        let cur = match reading {
            Ok(r) => r,
            Err(_) => {
                self.errors += 1;
                return self.millicpu();
            }
        };
        self.cores = cur.cores;
        if let Some((then, prev)) = self.last.replace((now, cur)) {
            let wall = now.saturating_sub(then).as_secs_f64();
            if wall > 0.0 && cur.cores > 0.0 {
                let used = cur.usage.saturating_sub(prev.usage).as_secs_f64();
                let mut raw = (used / (wall * cur.cores)).min(1.0);
                // A tick in which the quota ran out means the budget was exhausted, whatever
                // the usage arithmetic says (the quota period and our tick are not aligned).
                if let (Some(t0), Some(t1)) = (prev.throttled, cur.throttled)
                    && t1 > t0
                {
                    raw = 1.0;
                }
                let raw = raw * 1000.0;
                self.value = match self.smoothing {
                    Smoothing::Ewma { beta } => beta * self.value + (1.0 - beta) * raw,
                    // go-zero: cpu sample is an integer millicpu, the EWMA result is truncated.
                    Smoothing::GoZero => (self.value * 0.95 + raw.trunc() * 0.05).trunc(),
                };
            }
        }
        self.millicpu()
    }

    /// Smoothed utilisation in millicpu, capped at 1000.
    pub fn millicpu(&self) -> u32 {
        self.value.clamp(0.0, 1000.0) as u32
    }

    /// Failed reads so far.
    pub fn errors(&self) -> u64 {
        self.errors
    }

    /// Allowed cores from the last good reading.
    pub fn cores(&self) -> f64 {
        self.cores
    }
}

/// Shared view of the sampler's latest values (metrics read these).
#[derive(Debug, Default)]
pub struct CpuGauge {
    millicpu: AtomicU64,
    errors: AtomicU64,
    cores_milli: AtomicU64,
}

impl CpuGauge {
    /// Smoothed utilisation in millicpu.
    pub fn millicpu(&self) -> u32 {
        self.millicpu.load(Ordering::Relaxed) as u32
    }
    /// Failed reads so far.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
    /// Allowed cores.
    pub fn cores(&self) -> f64 {
        self.cores_milli.load(Ordering::Relaxed) as f64 / 1000.0
    }
}

/// Where the sampler thread gets readings (a trait so tests can inject a failing reader).
pub trait CpuSource: Send + 'static {
    /// One cumulative reading.
    fn read(&mut self) -> Result<CpuTotals, Error>;
}

impl CpuSource for CpuReader {
    fn read(&mut self) -> Result<CpuTotals, Error> {
        CpuReader::read(self)
    }
}

/// Runs the sampler on its own thread until dropped.
#[derive(Debug)]
pub struct SamplerHandle {
    stop: Arc<AtomicBool>,
    gauge: Arc<CpuGauge>,
    thread: Option<JoinHandle<()>>,
}

impl SamplerHandle {
    /// Starts the thread: reads CPU every `cpu_interval` (250 ms), ticks `shedder` every
    /// bucket (100 ms) so its windows roll on time even when the CPU is idle.
    pub fn spawn<S: CpuSource, C: Clock>(
        shedder: Shedder,
        mut source: S,
        clock: C,
        smoothing: Smoothing,
        cpu_interval: Duration,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let gauge = Arc::new(CpuGauge::default());
        let (stop2, gauge2) = (stop.clone(), gauge.clone());
        let tick = shedder.bucket();
        let thread = std::thread::Builder::new()
            .name("tailguard-overload".into())
            .spawn(move || {
                // Leaves the metrics shards to the threads that serve requests.
                tailguard_metrics::use_shared_shard();
                let mut sampler = CpuSampler::new(smoothing);
                let mut next_cpu = clock.now();
                let mut next_tick = clock.now() + tick;
                while !stop2.load(Ordering::Relaxed) {
                    let now = clock.now();
                    if now >= next_cpu {
                        let u = sampler.update(now, source.read());
                        gauge2.millicpu.store(u64::from(u), Ordering::Relaxed);
                        gauge2.errors.store(sampler.errors(), Ordering::Relaxed);
                        gauge2
                            .cores_milli
                            .store((sampler.cores() * 1000.0) as u64, Ordering::Relaxed);
                        shedder.set_cores(sampler.cores());
                        next_cpu += cpu_interval;
                        if next_cpu < now {
                            next_cpu = now + cpu_interval;
                        }
                    }
                    if now >= next_tick {
                        shedder.tick(now, sampler.millicpu());
                        next_tick += tick;
                        if next_tick < now {
                            next_tick = now + tick;
                        }
                    }
                    let wake = next_cpu.min(next_tick);
                    std::thread::park_timeout(wake.saturating_sub(clock.now()));
                }
            })?;
        Ok(Self {
            stop,
            gauge,
            thread: Some(thread),
        })
    }

    /// The latest smoothed values.
    pub fn gauge(&self) -> &Arc<CpuGauge> {
        &self.gauge
    }
}

impl Drop for SamplerHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

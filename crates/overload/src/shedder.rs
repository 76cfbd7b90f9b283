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
//! is the product (HELPERS.md). Laid out bottom-up: `config.rs` (the modes and their
//! defaults), `controller.rs` (a group's state, its request path and permits), `tick.rs`
//! (its decision loop), and here the set of groups that share one CPU signal.
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

mod config;
mod controller;
mod tick;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use config::{Mode, ShedderConfig};
use controller::AtomicF64;
pub use controller::{Controller, ControllerSnapshot, Outcome, OwnedPermit, Permit};

use crate::Error;
use crate::limit::{LimitConfig, UpstreamLimit};

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

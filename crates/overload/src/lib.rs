//! CPU-aware adaptive load shedding, adaptive breaker and p2c-EWMA balancing, as tower layers.
//!
//! Two layers of protection (design.md §5, research `shedding-anchors.md` §9):
//!
//! - **Layer 1, self-protection.** A [`Shedder`] holds one [`Controller`] per route group.
//!   A [`SamplerHandle`] thread reads this process's CPU budget every 250 ms through a
//!   [`CpuReader`] (own cgroup v2/v1, else `/proc/self/stat`), smooths it with a
//!   [`CpuSampler`], and calls [`Shedder::tick`] every 100 ms bucket. The request path only
//!   calls [`Controller::admit`] (a few atomic loads) and finishes the returned [`Permit`].
//! - **Layer 2, upstream protection.** An [`UpstreamLimit`] per upstream (a concurrency
//!   limit learned from response times alone, for an upstream whose load the CPU signal
//!   cannot see), a [`Breaker`] per (upstream, route), [`P2c`] balancing over peak-EWMA
//!   latency, and a [`RetryBudget`].
//!
//! [`ShedderLayer`] and [`BreakerLayer`] wrap any tower `Service` over `http` requests, so an
//! axum or hyper service gets the same protection without the gateway. All logic runs on an
//! injected [`Clock`]; `std::time::Instant` is banned in this crate by its `clippy.toml`.
//!
//! # Example
//!
//! A route group that served 50 requests per 100 ms bucket at 10 ms each has capacity
//! `C = 50 · 10/s · 0.010 s = 5` requests in flight. At 95 % CPU on one core the limit is
//! `L = C · (1 − 0.95)/(1 − 0.90) + 1 = 3.5`, so a fifth normal request is shed while a
//! critical one still gets in:
//!
//! ```
//! use std::time::Duration;
//! use tailguard_overload::{Class, Controller, Outcome, ShedderConfig};
//!
//! let ms = Duration::from_millis;
//! let ctl = Controller::new("api", ShedderConfig::adaptive()).unwrap();
//! ctl.tick(ms(0), 500);
//! for _ in 0..50 {
//!     let permit = ctl.admit(ms(0), Class::Normal).unwrap();
//!     permit.complete(ms(10), Outcome::Served);
//! }
//! ctl.tick(ms(100), 950); // closes the bucket; CPU is now hot
//! let s = ctl.snapshot(ms(100));
//! println!("C={} L={} hot={}", s.capacity, s.limit, s.hot);
//! assert_eq!(format!("C={} L={} hot={}", s.capacity, s.limit, s.hot), "C=5 L=3.5 hot=true");
//!
//! let held: Vec<_> = (0..4).map(|_| ctl.admit(ms(100), Class::Normal).unwrap()).collect();
//! assert!(ctl.admit(ms(100), Class::Normal).is_err()); // 4 in flight > 3.5
//! assert!(ctl.admit(ms(100), Class::Critical).is_ok()); // critical bypasses
//! drop(held);
//! ```

// The README's example compiles (it serves forever, so it is not run).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod balance;
mod breaker;
mod class;
mod clock;
mod config;
pub mod cpu;
mod error;
mod layer;
mod limit;
mod metrics;
mod padded;
mod retry;
mod sampler;
mod shedder;

pub use balance::{P2c, P2cConfig, Pick};
pub use breaker::{
    Breaker, BreakerConfig, BreakerOpen, BreakerPermit, BreakerState, DispatchPermit, History,
    OwnedBreakerPermit, failure_status,
};
pub use class::{Class, Rejected};
pub use clock::{Clock, FakeClock, MonotonicClock};
pub use config::{OverloadConfig, OverloadMode};
pub use cpu::{CpuReader, CpuSourceKind, CpuTotals};
pub use error::Error;
pub use layer::{
    BreakerFuture, BreakerLayer, BreakerService, NoopBreaker, NoopShedder, Overloaded, Shed,
    ShedFuture, ShedderLayer, ShedderService, Trip, overloaded_response,
};
pub use limit::{LimitConfig, LimitPermit, LimitSnapshot, OwnedLimitPermit, UpstreamLimit};
pub use metrics::OverloadMetrics;
pub use retry::RetryBudget;
pub use sampler::{CpuGauge, CpuSampler, CpuSource, SamplerHandle, Smoothing};
pub use shedder::{
    Controller, ControllerSnapshot, Mode, Outcome, OwnedPermit, Permit, Shedder, ShedderConfig,
};

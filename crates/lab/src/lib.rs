//! The lab: an open-loop, constant-rate load generator, a latency recorder, a scraper and the
//! scenarios that rerun each field report's experiment. Shares no code with the gateway.
//!
//! How the parts fit:
//! - [`schedule::Schedule`] fixes every request's intended send time before the run.
//! - [`load::run`] sends on that schedule over keep-alive connections and records each
//!   latency from its intended time into a [`latency::Latency`] (HdrHistogram, microseconds),
//!   while [`scrape`] fetches a metrics endpoint on the same clock. A stepped load
//!   ([`schedule::Phase`]) and several streams on one clock ([`load::run_streams`]) are the
//!   same machinery.
//! - [`timeline::Timeline`] counts every second (and every phase) of a run: offered, goodput,
//!   503s, errors, admitted latency, and gauges the scraper read from the gateway.
//! - [`report::Report`] holds the result: printed in wrk2's layout, saved as JSON, as `.hgrm`
//!   ([`hgrm`]) and as an SVG percentile plot ([`plot`]).
//! - [`upstream`] is the built-in target; [`scenario`] and [`runner`] start the upstream and
//!   the gateway as separate processes and run a field report's conditions side by side.
//!
//! ```
//! use tailguard_lab::latency::Latency;
//!
//! let mut latency = Latency::new();
//! for us in 1..=1000 {
//!     latency.record_us(us); // 1 us .. 1 ms
//! }
//! let mut table = String::new();
//! tailguard_lab::report::render_distribution(&mut table, &latency);
//! assert_eq!(
//!     table.lines().collect::<Vec<_>>(),
//!     [
//!         "  50.000%  500.00us",
//!         "  75.000%  750.00us",
//!         "  90.000%  900.00us",
//!         "  99.000%  990.00us",
//!         "  99.900%    1.00ms",
//!         "  99.990%    1.00ms",
//!         "  99.999%    1.00ms",
//!         " 100.000%    1.00ms",
//!     ]
//! );
//! ```

pub mod cli;
pub mod clock;
mod conditions;
mod context;
mod error;
mod health;
pub mod hgrm;
pub mod latency;
pub mod load;
pub mod pinning;
mod plan;
pub mod plot;
pub mod procs;
pub mod report;
mod results;
pub mod runner;
pub mod scenario;
pub mod schedule;
pub mod scrape;
mod tables;
mod target;
mod targets;
pub mod timeline;
mod timer;
pub mod upstream;

pub use error::LabError;

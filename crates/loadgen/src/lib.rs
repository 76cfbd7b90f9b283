//! The load generator: an open-loop, constant-rate load with each latency timed from its
//! intended send time, a scraper on the same clock, and the report of a run. Shares no code
//! with the gateway.
//!
//! Why a crate of its own: it is the instrument, and `tailguard-lab` is the experiments run
//! with it (scenario files, the built-in upstream, the gateway and nginx as child processes,
//! the comparison tables). The instrument needs none of that: given a URL and a rate it
//! returns a [`report::Report`], so the lab depends on it and never the other way. The
//! report, its timeline and their renderings (wrk2's table, JSON, `.hgrm`, SVG) live here
//! because [`load::run`] returns them: the readout belongs to the instrument. Like the lab,
//! it depends on no gateway crate: what measures shares no code with what it measures.
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
//! - [`slowest`] keeps each run's 32 slowest requests (`Report::slowest`): each one's
//!   intended time in the window, latency, status or error, connection, and where it fell
//!   relative to the scrapes (during one, or how long after the last one ended), so a P100
//!   can be traced to a moment of the run.
//!
//! ```
//! use tailguard_loadgen::latency::Latency;
//!
//! let mut latency = Latency::new();
//! for us in 1..=1000 {
//!     latency.record_us(us); // 1 us .. 1 ms
//! }
//! let mut table = String::new();
//! tailguard_loadgen::report::render_distribution(&mut table, &latency);
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

pub mod clock;
mod error;
pub mod hgrm;
pub mod keys;
pub mod latency;
pub mod load;
pub mod pinning;
pub mod plot;
pub mod report;
pub mod schedule;
pub mod scrape;
pub mod scraper_process;
pub mod slowest;
mod target;
pub mod timeline;
mod timer;

pub use error::LoadError;

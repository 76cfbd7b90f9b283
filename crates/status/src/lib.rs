//! The gateway's status page: `GET /status` (one HTML page, embedded in the binary, that
//! polls its data every second and draws its own charts) and `GET /status.json` (the same
//! data for scripts, `docs/status.md`), served by the metrics exporter on its own thread.
//!
//! # How the pieces fit
//!
//! - A [`StatusPage`] is a [`tailguard_metrics::Page`]: the binary hands it to the
//!   exporter, which asks it first for every request and calls its tick every second, on
//!   the exporter's thread. No serving thread runs any of it or writes anything for it.
//! - Each tick reads the registry the gateway records into ([`Registry::snapshot`], the
//!   scrape's own path: the same per-thread shards, the same scrape hooks) into a sample of
//!   totals per route, upstream and endpoint (`sample.rs`), kept over a 10 s window and as
//!   chart points every 5 s for 15 minutes (`window.rs`).
//! - A request for the JSON builds the [`Status`] document (`build.rs`, at most once per
//!   tick) from the window, the gateway's current snapshot (what is configured, each
//!   endpoint's health report from the checker's state, pools, balancers, retry budgets)
//!   and its reloads, and lists the states that must stand out as [`model::Alert`]s.
//! - `[status]` decides who may read it (`access.rs`): anyone on the metrics listener, a
//!   bearer token, or htpasswd users (bcrypt).
//!
//! [`Registry::snapshot`]: tailguard_metrics::Registry::snapshot

mod access;
mod build;
pub mod model;
mod page;
mod sample;
mod window;

pub use build::Info;
pub use model::Status;
pub use page::{JSON_PATH, PAGE_PATH, StatusPage};

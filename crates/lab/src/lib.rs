//! The lab: the scenarios that rerun each field report's experiment, with the gateway, its
//! upstreams and nginx as separate processes and the load generator of `tailguard-loadgen`
//! driving them. Shares no code with the gateway.
//!
//! How the parts fit:
//! - [`scenario::Scenario`] is one experiment as data (`lab/scenarios/<name>/scenario.toml`):
//!   the load, the cores each process gets, the upstream, and the gateway's flags per
//!   condition.
//! - [`upstream`] is the built-in target; [`procs`] starts it, the gateway, nginx and a
//!   scenario's collector (Jaeger v2, for traced conditions) as child processes, each stopped
//!   whatever the way out.
//! - [`runner::run`] runs a scenario: each condition's load through
//!   `tailguard_loadgen::load::run_streams`, then one comparison table with P100, an overlaid
//!   SVG plot and `summary.md`.
//! - [`routes`] is `tailguard lab routes`: the route table's size against CPU per request,
//!   memory, start and reload, tailguard beside nginx (its own runner over
//!   `lab/scenarios/routes/routes.toml`).
//! - [`cli`] holds the binary's `load`, `lab` and `upstream` subcommands.
//!
//! ```
//! use std::path::Path;
//! use std::time::Duration;
//!
//! use tailguard_lab::scenario::Scenario;
//!
//! let scenario = Scenario::parse(
//!     r#"
//! name = "scrape"
//! description = "what a scrape does to the tail"
//! [load]
//! rate = 1000
//! duration = "30s"
//! connections = 16
//! [[condition]]
//! name = "direct"
//! target = "upstream"
//! [[condition]]
//! name = "through the gateway"
//! target = "gateway"
//! "#,
//!     Path::new("scrape/scenario.toml"),
//! )?;
//! assert_eq!(scenario.load.duration, Duration::from_secs(30));
//! let conditions: Vec<&str> = scenario.conditions.iter().map(|c| c.name.as_str()).collect();
//! assert_eq!(conditions, ["direct", "through the gateway"]);
//! # Ok::<(), tailguard_lab::LabError>(())
//! ```

pub mod cli;
mod collector;
mod conditions;
mod context;
mod error;
pub mod h2_attack;
mod health;
mod plan;
pub mod procs;
mod results;
pub mod routes;
pub mod runner;
pub mod scenario;
mod slowest;
mod tables;
mod targets;
pub mod upstream;

pub use error::LabError;

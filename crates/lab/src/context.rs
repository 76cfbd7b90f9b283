//! What every condition of a scenario run shares: the run's options, the scenario, the
//! upstreams started once for the whole run, the cores each process gets and the flags the
//! gateway build knows; and a condition's name as a file name.

use std::path::PathBuf;
use std::time::Duration;

use crate::scenario::Scenario;

/// How to run a scenario.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Scenario name or path.
    pub scenario: String,
    /// Directory of scenarios.
    pub scenarios_dir: PathBuf,
    /// Short CI run.
    pub quick: bool,
    /// Output directory.
    pub out: PathBuf,
    /// The `tailguard` executable (`run` and `upstream` subcommands).
    pub exe: PathBuf,
    /// Nice value for every process of the run.
    pub nice: Option<i32>,
    /// Overrides the scenario's measured duration.
    pub duration: Option<Duration>,
}

/// A condition's name as a file name: ASCII letters and digits in lower case, every run of
/// other characters one `-`.
pub(crate) fn slug(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let mut out = String::new();
    for part in s.split('-').filter(|p| !p.is_empty()) {
        if !out.is_empty() {
            out.push('-');
        }
        out.push_str(part);
    }
    out
}

/// What every condition of one run shares.
pub(crate) struct Ctx<'a> {
    pub(crate) opts: &'a RunOptions,
    pub(crate) scenario: &'a Scenario,
    pub(crate) upstream_addr: String,
    /// The second upstream, when the scenario has one.
    pub(crate) upstream_b_addr: Option<String>,
    /// The generated config with both upstreams, when the scenario has two.
    pub(crate) gateway_config: Option<PathBuf>,
    pub(crate) gateway_cpus: Vec<usize>,
    pub(crate) load_cpus: Vec<usize>,
    /// Flags `tailguard run --help` lists; `None` when help could not be read.
    pub(crate) gateway_flags: Option<Vec<String>>,
    /// The collector's endpoints, when the scenario has a `[collector]`.
    pub(crate) collector: Option<crate::collector::Endpoints>,
}

//! Scenario files: the data of one field-report experiment (load, pinning, upstream, gateway
//! flags per condition), parsed from TOML with clear errors on bad fields.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::LabError;

/// One scenario, as written in `lab/scenarios/<name>/scenario.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name (the directory name).
    pub name: String,
    /// What the scenario reproduces and which field report it answers.
    pub description: String,
    /// The load every condition gets (unless a condition overrides the rate).
    pub load: LoadSpec,
    /// Overrides of `load` under `--quick`.
    #[serde(default)]
    pub quick: QuickSpec,
    /// Cores to pin each process to, when the machine has them.
    #[serde(default)]
    pub pin: PinSpec,
    /// The built-in upstream every target proxies to.
    #[serde(default)]
    pub upstream: UpstreamSpec,
    /// Flags passed to `tailguard run` in every gateway condition.
    #[serde(default)]
    pub gateway: GatewaySpec,
    /// Measure the capacity first and express condition rates as multiples of it.
    pub capacity: Option<CapacitySpec>,
    /// The conditions, run in order and printed side by side.
    #[serde(rename = "condition")]
    pub conditions: Vec<Condition>,
}

/// The load of every condition.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadSpec {
    /// Requests per second.
    pub rate: f64,
    /// Measured duration, e.g. `60s`.
    #[serde(deserialize_with = "de_duration")]
    pub duration: Duration,
    /// Warmup at the same rate before measuring.
    #[serde(default, deserialize_with = "de_duration")]
    pub warmup: Duration,
    /// Keep-alive connections.
    pub connections: usize,
    /// Generator threads.
    #[serde(default = "one")]
    pub threads: usize,
    /// Request path on the target.
    #[serde(default = "slash")]
    pub path: String,
    /// Poisson arrivals instead of a constant interval.
    #[serde(default)]
    pub poisson: bool,
    /// One run per seed; their histograms are merged per condition.
    #[serde(default = "one_seed")]
    pub seeds: Vec<u64>,
    /// Run seed by seed, each condition once per seed (A B A B ...), instead of condition by
    /// condition, so that a drift over the run (another process, thermal) falls on every
    /// condition alike.
    #[serde(default)]
    pub interleave: bool,
    /// Per-request timeout.
    #[serde(default = "ten_s", deserialize_with = "de_duration")]
    pub timeout: Duration,
}

/// What `--quick` changes.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuickSpec {
    /// Rate under `--quick`.
    pub rate: Option<f64>,
    /// Duration under `--quick`.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub duration: Option<Duration>,
    /// Warmup under `--quick`.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub warmup: Option<Duration>,
    /// Scrape interval under `--quick`.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub scrape_every: Option<Duration>,
    /// Capacity probe duration under `--quick`.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub capacity_duration: Option<Duration>,
    /// Replace `--synthetic-series` values above this with it (a million series take a
    /// while to build on a CI machine).
    pub max_series: Option<u64>,
}

/// Core lists per process; empty means not pinned.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinSpec {
    /// Cores of the gateway (or nginx).
    #[serde(default)]
    pub gateway: Vec<usize>,
    /// Cores of the upstream.
    #[serde(default)]
    pub upstream: Vec<usize>,
    /// Cores of the load generator (this process's load threads).
    #[serde(default)]
    pub load: Vec<usize>,
}

/// The upstream's flags.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSpec {
    /// Arguments after `tailguard upstream --listen ...`.
    #[serde(default)]
    pub args: Vec<String>,
}

/// Flags for every gateway condition.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewaySpec {
    /// Arguments after `tailguard run --listen ... --upstream ... --metrics-listen ...`.
    #[serde(default)]
    pub args: Vec<String>,
}

/// How the capacity is measured before the conditions run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapacitySpec {
    /// Rate offered while probing (well above the capacity).
    pub probe_rate: f64,
    /// Probe duration.
    #[serde(deserialize_with = "de_duration")]
    pub duration: Duration,
    /// Gateway flags while probing.
    #[serde(default)]
    pub gateway: Vec<String>,
    /// Connections while probing: few, so the excess waits in the generator's queue instead
    /// of timing out in the target (timeouts would make the target waste work and read low).
    #[serde(default = "probe_connections")]
    pub connections: usize,
}

fn probe_connections() -> usize {
    8
}

/// What a condition's load is sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetKind {
    /// `tailguard run` in front of the upstream.
    #[default]
    Gateway,
    /// The upstream directly (the generator's own floor).
    Upstream,
    /// nginx as a reverse proxy in front of the upstream.
    Nginx,
}

/// One column of the field report's table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// Row label.
    pub name: String,
    /// Where the load goes.
    #[serde(default)]
    pub target: TargetKind,
    /// Extra gateway flags of this condition (`{out}` is replaced by the output directory).
    #[serde(default)]
    pub gateway: Vec<String>,
    /// Scrape the gateway's exporter this often during the run.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub scrape_every: Option<Duration>,
    /// Rate as a multiple of the measured capacity (needs `[capacity]`).
    pub rate_factor: Option<f64>,
    /// Absolute rate for this condition.
    pub rate: Option<f64>,
    /// Also measure the maximum rate with wrk (closed loop), when wrk is installed.
    #[serde(default)]
    pub max_rate: bool,
}

fn one() -> usize {
    1
}
fn one_seed() -> Vec<u64> {
    vec![1]
}
fn slash() -> String {
    "/".to_string()
}
fn ten_s() -> Duration {
    Duration::from_secs(10)
}

fn de_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    crate::clock::parse_duration(&s).map_err(serde::de::Error::custom)
}

fn de_opt_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = String::deserialize(d)?;
    crate::clock::parse_duration(&s)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

impl Scenario {
    /// Parses and validates a scenario; `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, LabError> {
        let err = |why: String| LabError::Scenario {
            path: path.display().to_string(),
            why,
        };
        let s: Scenario = toml::from_str(text).map_err(|e| err(e.to_string()))?;
        if !(s.load.rate > 0.0 && s.load.rate.is_finite()) {
            return Err(err("load.rate must be a positive number".into()));
        }
        if s.load.connections == 0 {
            return Err(err("load.connections must be at least 1".into()));
        }
        if s.load.duration.is_zero() {
            return Err(err("load.duration must be above 0".into()));
        }
        if s.load.seeds.is_empty() {
            return Err(err("load.seeds must list at least one seed".into()));
        }
        if s.conditions.is_empty() {
            return Err(err("at least one [[condition]] is needed".into()));
        }
        for c in &s.conditions {
            if c.rate_factor.is_some() && s.capacity.is_none() {
                return Err(err(format!(
                    "condition `{}` has rate_factor but the scenario has no [capacity] section",
                    c.name
                )));
            }
            if c.rate_factor.is_some() && c.rate.is_some() {
                return Err(err(format!(
                    "condition `{}` sets both rate and rate_factor; keep one",
                    c.name
                )));
            }
            if let Some(r) = c.rate.or(c.rate_factor)
                && !(r > 0.0 && r.is_finite())
            {
                return Err(err(format!(
                    "condition `{}`: the rate must be positive",
                    c.name
                )));
            }
        }
        Ok(s)
    }

    /// Reads `dir/<name>/scenario.toml`, or `name` itself when it is a file.
    pub fn load(name: &str, dir: &Path) -> Result<(Self, PathBuf), LabError> {
        let direct = PathBuf::from(name);
        let path = if direct.is_file() {
            direct
        } else {
            dir.join(name).join("scenario.toml")
        };
        let text = std::fs::read_to_string(&path).map_err(|e| LabError::Scenario {
            path: path.display().to_string(),
            why: format!("cannot read it: {e} (scenarios live in {})", dir.display()),
        })?;
        Ok((Self::parse(&text, &path)?, path))
    }

    /// Applies the `[quick]` overrides.
    pub fn make_quick(&mut self) {
        let q = self.quick.clone();
        if let Some(r) = q.rate {
            self.load.rate = r;
        }
        if let Some(d) = q.duration {
            self.load.duration = d;
        }
        if let Some(w) = q.warmup {
            self.load.warmup = w;
        }
        self.load.seeds.truncate(1);
        if let (Some(cap), Some(d)) = (&mut self.capacity, q.capacity_duration) {
            cap.duration = d;
        }
        for c in &mut self.conditions {
            if let (Some(every), Some(_)) = (q.scrape_every, c.scrape_every) {
                c.scrape_every = Some(every);
            }
            if let Some(max) = q.max_series {
                cap_series(&mut c.gateway, max);
            }
            if c.rate.is_some()
                && let Some(r) = q.rate
            {
                c.rate = Some(c.rate.unwrap_or(r).min(r));
            }
        }
    }
}

fn cap_series(args: &mut [String], max: u64) {
    for i in 1..args.len() {
        if args[i - 1] == "--synthetic-series"
            && let Ok(n) = args[i].parse::<u64>()
            && n > max
        {
            args[i] = max.to_string();
        }
    }
}

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
    /// The built-in upstream every target proxies to (upstream `a` when there is a second).
    #[serde(default)]
    pub upstream: UpstreamSpec,
    /// A second built-in upstream (`b`): the gateway then gets a config with upstreams `a`
    /// and `b` and routes `/a` and `/b` to them, and the load comes as `[[load.streams]]`.
    pub upstream_b: Option<UpstreamSpec>,
    /// Flags passed to `tailguard run` in every gateway condition.
    #[serde(default)]
    pub gateway: GatewaySpec,
    /// Measure the capacity first and express condition rates as multiples of it.
    pub capacity: Option<CapacitySpec>,
    /// Read the gateway's metrics every second into each condition's timeline.
    pub timeline: Option<TimelineSpec>,
    /// A real OpenTelemetry collector (Jaeger v2) started once for the run, for conditions
    /// whose gateway exports traces (`{otlp_http}`, `{otlp_grpc}` in their `config`).
    pub collector: Option<CollectorSpec>,
    /// The conditions, run in order and printed side by side.
    #[serde(rename = "condition")]
    pub conditions: Vec<Condition>,
}

/// The collector of a run: Jaeger v2 with its all-in-one defaults (memory storage, OTLP
/// over gRPC and HTTP) on free ports.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectorSpec {
    /// The `jaeger` executable (default: `$HOME/go/bin/jaeger`, where
    /// `scripts/install-tools` builds it, else `jaeger` on `PATH`).
    pub command: Option<PathBuf>,
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
    /// Several loads at once, each on its own path with its own rate (e.g. one per
    /// upstream); empty: one load on `path`.
    #[serde(default)]
    pub streams: Vec<StreamSpec>,
}

/// One of several concurrent loads of a condition.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSpec {
    /// Name in tables and file columns (e.g. `a`).
    pub name: String,
    /// Request path (`/a` reaches upstream `a` when the scenario has `[upstream_b]`).
    pub path: String,
    /// Keep-alive connections of this stream (default: `load.connections`).
    pub connections: Option<usize>,
    /// Rate of the capacity probe of this stream (default: `capacity.probe_rate`).
    pub probe_rate: Option<f64>,
    /// Rate when a condition does not name this stream (default: 0, not sent).
    pub rate: Option<f64>,
    /// Rate as a multiple of this stream's own measured capacity, when a condition does not
    /// name this stream.
    pub rate_factor: Option<f64>,
}

/// The rate of one stream in one condition: exactly one of `rate`, `rate_factor`, `phases`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamRate {
    /// Requests per second (0: the stream is not sent).
    pub rate: Option<f64>,
    /// Multiple of the stream's measured capacity.
    pub rate_factor: Option<f64>,
    /// A stepped load.
    #[serde(default)]
    pub phases: Vec<PhaseSpec>,
}

/// One step of a stepped load: `rate` or `rate_factor` for `duration`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseSpec {
    /// Requests per second.
    pub rate: Option<f64>,
    /// Multiple of the measured capacity.
    pub rate_factor: Option<f64>,
    /// How long this step lasts.
    #[serde(deserialize_with = "de_duration")]
    pub duration: Duration,
}

/// Which gateway metrics each condition's timeline reads, and how often.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimelineSpec {
    /// Interval between readings (default 1 s: one per second of the timeline).
    #[serde(default = "one_s", deserialize_with = "de_duration")]
    pub every: Duration,
    /// Metric names (default: [`tailguard_loadgen::timeline::DEFAULT_GAUGES`]).
    #[serde(default = "default_gauges")]
    pub metrics: Vec<String>,
}

fn one_s() -> Duration {
    Duration::from_secs(1)
}

fn default_gauges() -> Vec<String> {
    tailguard_loadgen::timeline::DEFAULT_GAUGES
        .iter()
        .map(ToString::to_string)
        .collect()
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
    /// Whether the scraper asks for gzip as Prometheus does (default `true`); `false` fetches
    /// the whole uncompressed text (123 MB at 1M series), as `curl` would.
    #[serde(default = "yes")]
    pub scrape_gzip: bool,
    /// Capacity probe duration under `--quick`.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub capacity_duration: Option<Duration>,
    /// Replace `--synthetic-series` values above this with it (a million series take a
    /// while to build on a CI machine).
    pub max_series: Option<u64>,
    /// Only these conditions (by name) under `--quick` (default: all): a scenario whose every
    /// condition is also covered by another's quick run keeps CI's `lab all --quick` short.
    #[serde(default)]
    pub conditions: Vec<String>,
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
    /// Cores of the second upstream (default: those of the first).
    pub upstream_b: Option<Vec<usize>>,
    /// Cores of the load generator (this process's load threads).
    #[serde(default)]
    pub load: Vec<usize>,
    /// Cores of the collector (default: those of the upstream).
    pub collector: Option<Vec<usize>>,
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
    /// Probe this command (as a condition's `command`) instead of the gateway.
    #[serde(default)]
    pub command: Vec<String>,
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
    /// Any server given as a command (the condition's `command`), e.g. an axum app built
    /// beside the gateway: it serves the load itself, no upstream behind it.
    Command,
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
    /// Whether the scraper asks for gzip as Prometheus does (default `true`); `false` fetches
    /// the whole uncompressed text (123 MB at 1M series), as `curl` would.
    #[serde(default = "yes")]
    pub scrape_gzip: bool,
    /// Rate as a multiple of the measured capacity (needs `[capacity]`).
    pub rate_factor: Option<f64>,
    /// Absolute rate for this condition.
    pub rate: Option<f64>,
    /// A stepped load instead of one rate: each phase's `rate` or `rate_factor` for its
    /// `duration`; the measured window is their sum.
    #[serde(default)]
    pub phases: Vec<PhaseSpec>,
    /// With `[[load.streams]]`: each stream's rate, by stream name (a stream not named
    /// here gets its own default rate, or is not sent).
    #[serde(default)]
    pub streams: std::collections::BTreeMap<String, StreamRate>,
    /// Also measure the maximum rate with wrk (closed loop), when wrk is installed.
    #[serde(default)]
    pub max_rate: bool,
    /// With `target = "command"`: the program and its arguments, `{listen}` replaced by the
    /// address it must serve on, `{metrics}` by a second free address, `{out}` by the
    /// output directory, `{exe_dir}` by the directory of the running `tailguard` binary
    /// (`target/release` or `target/debug`: a workspace binary built beside it). It is pinned like the gateway and ready when it answers on
    /// `{listen}`; its CPU per request (utime + stime over the measured window) is printed.
    #[serde(default)]
    pub command: Vec<String>,
    /// With `target = "command"`: the URL its metrics are scraped at (same placeholders),
    /// e.g. `http://{listen}/metrics`.
    pub metrics_url: Option<String>,
    /// TOML added to the gateway config the lab writes for this condition (one upstream
    /// `demo`, the built-in one, behind route `demo` on `/`), e.g. a `[tracing]` table.
    /// `{otlp_http}` and `{otlp_grpc}` become the collector's OTLP endpoints,
    /// `{collector_down}` an endpoint where nothing listens, `{out}` the output directory.
    pub config: Option<String>,
}

fn one() -> usize {
    1
}
fn yes() -> bool {
    true
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
    tailguard_loadgen::clock::parse_duration(&s).map_err(serde::de::Error::custom)
}

fn de_opt_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = String::deserialize(d)?;
    tailguard_loadgen::clock::parse_duration(&s)
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
        let mut names: Vec<&str> = s.load.streams.iter().map(|st| st.name.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) || names.iter().any(|n| n.is_empty()) {
            return Err(err("every [[load.streams]] needs a name of its own".into()));
        }
        for st in &s.load.streams {
            if !st.path.starts_with('/') {
                return Err(err(format!("stream `{}`: path must start with /", st.name)));
            }
            if st.connections == Some(0) {
                return Err(err(format!(
                    "stream `{}`: connections must be at least 1",
                    st.name
                )));
            }
            check_rate(st.rate, st.rate_factor, s.capacity.is_some())
                .map_err(|why| err(format!("stream `{}`: {why}", st.name)))?;
        }
        for c in &s.conditions {
            if (c.target == TargetKind::Command) == c.command.is_empty() {
                return Err(err(format!(
                    "condition `{}`: `command` goes with `target = \"command\"`, and that target needs one",
                    c.name
                )));
            }
            if c.metrics_url.is_some() && c.target != TargetKind::Command {
                return Err(err(format!(
                    "condition `{}`: `metrics_url` is for `target = \"command\"` only",
                    c.name
                )));
            }
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
            if !c.phases.is_empty() && (c.rate.is_some() || c.rate_factor.is_some()) {
                return Err(err(format!(
                    "condition `{}` sets phases and a rate; the phases give the rate",
                    c.name
                )));
            }
            s.check_phases(&c.phases, &format!("condition `{}`", c.name))
                .map_err(err)?;
            s.check_streams(c).map_err(err)?;
        }
        if let Some(missing) = s
            .quick
            .conditions
            .iter()
            .find(|n| !s.conditions.iter().any(|c| &c.name == *n))
        {
            return Err(err(format!(
                "quick.conditions names `{missing}`, which is no condition's name"
            )));
        }
        if let Some(t) = &s.timeline
            && t.every.is_zero()
        {
            return Err(err("timeline.every must be above 0".into()));
        }
        for c in &s.conditions {
            let Some(config) = &c.config else { continue };
            if s.upstream_b.is_some() {
                return Err(err(format!(
                    "condition `{}`: `config` is for scenarios with one upstream",
                    c.name
                )));
            }
            let wants_collector = ["{otlp_http}", "{otlp_grpc}"]
                .iter()
                .any(|p| config.contains(p));
            if wants_collector && s.collector.is_none() {
                return Err(err(format!(
                    "condition `{}` names the collector's endpoint but the scenario has no [collector] section",
                    c.name
                )));
            }
        }
        if s.upstream_b.is_some() && s.load.streams.is_empty() {
            return Err(err(
                "[upstream_b] needs [[load.streams]] with paths under /a and /b (the gateway routes /a to the first upstream and /b to the second)".into(),
            ));
        }
        Ok(s)
    }

    fn check_phases(&self, phases: &[PhaseSpec], what: &str) -> Result<(), String> {
        for (i, p) in phases.iter().enumerate() {
            check_rate(p.rate, p.rate_factor, self.capacity.is_some())
                .map_err(|why| format!("{what}, phase {}: {why}", i + 1))?;
            if p.rate.is_none() && p.rate_factor.is_none() {
                return Err(format!(
                    "{what}, phase {}: needs rate or rate_factor",
                    i + 1
                ));
            }
            if p.duration.is_zero() {
                return Err(format!("{what}, phase {}: duration must be above 0", i + 1));
            }
        }
        Ok(())
    }

    fn check_streams(&self, c: &Condition) -> Result<(), String> {
        let what = format!("condition `{}`", c.name);
        if self.load.streams.is_empty() {
            if !c.streams.is_empty() {
                return Err(format!(
                    "{what} gives stream rates but the scenario has no [[load.streams]]"
                ));
            }
            return Ok(());
        }
        if c.rate.is_some() || c.rate_factor.is_some() || !c.phases.is_empty() {
            return Err(format!(
                "{what}: with [[load.streams]], give each stream's rate under [condition.streams.NAME]"
            ));
        }
        if c.target == TargetKind::Nginx {
            return Err(format!("{what}: nginx conditions take one stream"));
        }
        for (name, r) in &c.streams {
            if !self.load.streams.iter().any(|st| &st.name == name) {
                return Err(format!(
                    "{what}: no stream named `{name}` in [[load.streams]]"
                ));
            }
            let what = format!("{what}, stream `{name}`");
            check_rate(r.rate, r.rate_factor, self.capacity.is_some())
                .map_err(|why| format!("{what}: {why}"))?;
            let given = usize::from(r.rate.is_some())
                + usize::from(r.rate_factor.is_some())
                + usize::from(!r.phases.is_empty());
            if given != 1 {
                return Err(format!(
                    "{what}: give exactly one of rate, rate_factor and phases"
                ));
            }
            self.check_phases(&r.phases, &what)?;
        }
        let sends = self.load.streams.iter().any(|st| {
            let r = self.stream_rate(c, st);
            r.rate.or(r.rate_factor).is_some_and(|v| v > 0.0)
                || r.phases
                    .iter()
                    .any(|p| p.rate.or(p.rate_factor).is_some_and(|v| v > 0.0))
        });
        if !sends {
            return Err(format!("{what}: every stream's rate is 0"));
        }
        Ok(())
    }

    /// The rate of stream `st` in condition `c`: the condition's own, else the stream's
    /// default (none: rate 0, not sent).
    pub fn stream_rate(&self, c: &Condition, st: &StreamSpec) -> StreamRate {
        c.streams.get(&st.name).cloned().unwrap_or(StreamRate {
            rate: st.rate,
            rate_factor: st.rate_factor,
            phases: Vec::new(),
        })
    }

    /// Scales every stepped load to last `total` (only when longer with `shrink_only`), each
    /// phase in proportion: `--quick` keeps a step's shape in seconds.
    pub fn fit_phases(&mut self, total: Duration, shrink_only: bool) {
        let fit = |phases: &mut Vec<PhaseSpec>| {
            let sum: Duration = phases.iter().map(|p| p.duration).sum();
            if sum.is_zero() || (shrink_only && sum <= total) {
                return;
            }
            let k = total.as_secs_f64() / sum.as_secs_f64();
            for p in phases.iter_mut() {
                // Whole milliseconds, so the steps land on readable times.
                p.duration =
                    Duration::from_millis((p.duration.as_secs_f64() * k * 1e3).round() as u64)
                        .max(Duration::from_millis(1));
            }
        };
        for c in &mut self.conditions {
            fit(&mut c.phases);
            for r in c.streams.values_mut() {
                fit(&mut r.phases);
            }
        }
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
        if !q.conditions.is_empty() {
            self.conditions.retain(|c| q.conditions.contains(&c.name));
        }
        if let Some(d) = q.duration {
            self.fit_phases(d, true);
        }
        if let (Some(cap), Some(d)) = (&mut self.capacity, q.capacity_duration) {
            cap.duration = d;
        }
        for c in &mut self.conditions {
            if let (Some(every), Some(_)) = (q.scrape_every, c.scrape_every) {
                c.scrape_every = Some(every);
            }
            if let Some(max) = q.max_series {
                cap_series(&mut c.gateway, max);
                cap_series(&mut c.command, max);
            }
            if c.rate.is_some()
                && let Some(r) = q.rate
            {
                c.rate = Some(c.rate.unwrap_or(r).min(r));
            }
        }
    }
}

/// A rate or a factor, not both, and neither negative.
fn check_rate(rate: Option<f64>, factor: Option<f64>, has_capacity: bool) -> Result<(), String> {
    if rate.is_some() && factor.is_some() {
        return Err("sets both rate and rate_factor; keep one".into());
    }
    if factor.is_some() && !has_capacity {
        return Err("has rate_factor but the scenario has no [capacity] section".into());
    }
    if let Some(r) = rate.or(factor)
        && !(r >= 0.0 && r.is_finite())
    {
        return Err("the rate must be 0 or more".into());
    }
    Ok(())
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

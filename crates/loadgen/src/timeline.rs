//! The per-second timeline of a run: offered load, goodput, rejections, errors and admitted
//! latency for every second and every phase of a stepped load, with the gateway's gauges read
//! alongside; written as CSV, JSON, a Markdown table and the step timings.
//!
//! What falls in which second:
//! - `offered` and the admitted latency: by the request's **intended** send time (the same
//!   clock as every latency of the lab, so a second's P99 is that of the requests due in it);
//! - `ok` (goodput: responses below 400), `rejected` (503), `failed` (other statuses of 400
//!   and up) and `errors` (timeouts, broken connections): by the time they **happened**, so a
//!   second's goodput is what the target delivered in it and a rejection is placed when the
//!   gateway answered it;
//! - gauges: the value read by the scrape made during that second (one per second).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::latency::Latency;
use crate::schedule::Phase;

/// One second of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Second {
    /// Requests whose intended send time fell in this second.
    pub offered: u64,
    /// Responses below 400 that arrived in this second.
    pub ok: u64,
    /// 503 responses that arrived in this second.
    pub rejected: u64,
    /// Other responses of 400 and up that arrived in this second.
    pub failed: u64,
    /// Requests that failed without a response (timeout, connection) in this second.
    pub errors: u64,
    /// Latency of the responses below 400 whose intended time fell in this second
    /// (2 significant digits).
    pub admitted: Latency,
}

impl Default for Second {
    fn default() -> Self {
        Self {
            offered: 0,
            ok: 0,
            rejected: 0,
            failed: 0,
            errors: 0,
            admitted: Latency::coarse(),
        }
    }
}

impl Second {
    fn add(&mut self, other: &Second) {
        self.offered += other.offered;
        self.ok += other.ok;
        self.rejected += other.rejected;
        self.failed += other.failed;
        self.errors += other.errors;
        self.admitted.add(&other.admitted);
    }
}

/// One phase of a run (the whole run when the load is not stepped), counted as [`Second`]s
/// are, plus when its first and last rejections came.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseStats {
    /// Offered rate, requests per second.
    pub rate: f64,
    /// Start, seconds from the start of the measured window.
    pub start_s: f64,
    /// End, seconds from the start of the measured window (the last phase ends with the
    /// window; answers that come later still count in it).
    pub end_s: f64,
    /// Requests due in this phase.
    pub offered: u64,
    /// Responses below 400 that arrived in this phase.
    pub ok: u64,
    /// 503s that arrived in this phase.
    pub rejected: u64,
    /// Other responses of 400 and up that arrived in this phase.
    pub failed: u64,
    /// Requests that failed without a response in this phase.
    pub errors: u64,
    /// Latency of the responses below 400 of the requests due in this phase.
    pub admitted: Latency,
    /// When the first 503 of this phase arrived, seconds from the start of the window.
    pub first_reject_s: Option<f64>,
    /// When the last 503 of this phase arrived, seconds from the start of the window.
    pub last_reject_s: Option<f64>,
}

impl PhaseStats {
    /// Adds `other`'s counts, latencies and rejection times (not its rate or bounds).
    fn add_counts(&mut self, other: &PhaseStats) {
        self.offered += other.offered;
        self.ok += other.ok;
        self.rejected += other.rejected;
        self.failed += other.failed;
        self.errors += other.errors;
        self.admitted.add(&other.admitted);
        self.first_reject_s = min_opt(self.first_reject_s, other.first_reject_s);
        self.last_reject_s = max_opt(self.last_reject_s, other.last_reject_s);
    }
}

/// A run's seconds, phases and gateway gauges.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// One entry per second from the start of the measured window, through the drain after
    /// it (answers to the last requests).
    pub seconds: Vec<Second>,
    /// The phases of a stepped load, or one phase for the whole run.
    pub phases: Vec<PhaseStats>,
    /// Gateway metrics read once a second: column (e.g. `upstream_limit[a]`) to the value per
    /// second (`None`: no reading in that second). Counters are turned into their increase
    /// per second (`upstream_limited_per_s[a]`).
    pub gauges: BTreeMap<String, Vec<Option<f64>>>,
}

/// One reading of the gateway's metrics, for [`Timeline::set_gauges`].
#[derive(Debug, Clone, PartialEq)]
pub struct GaugeReading {
    /// When, seconds from the start of the measured window (negative during warmup).
    pub at_s: f64,
    /// Column name and value, as [`crate::scrape::read_samples`] returns them.
    pub values: Vec<(String, f64)>,
}

/// A step of a stepped load and how the target answered it.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// When the step came, seconds from the start of the measured window.
    pub at_s: f64,
    /// Rate before and after, requests per second.
    pub from_rate: f64,
    /// Rate after the step.
    pub to_rate: f64,
    /// Seconds from the step to the first 503 after it.
    pub first_reject_after_s: Option<f64>,
    /// Seconds from the step to the last 503 of the phase it starts.
    pub last_reject_after_s: Option<f64>,
    /// 503s in the phase the step starts.
    pub rejected: u64,
    /// Length of the phase the step starts, seconds.
    pub phase_s: f64,
}

const NS: f64 = 1e9;

/// Rounds to `decimals` places: few enough significant digits that JSON gives the same
/// number back (serde_json reads up to 15 digits exactly), and no false precision.
fn round(v: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (v * scale).round() / scale
}

impl Timeline {
    /// An empty timeline for a measured window of `duration_s` seconds with these phases
    /// (empty: one phase of `rate` for the whole window).
    pub fn new(phases: &[Phase], rate: f64, duration_s: f64) -> Self {
        let one = [Phase {
            rate,
            duration: std::time::Duration::from_secs_f64(duration_s),
        }];
        let phases = if phases.is_empty() { &one[..] } else { phases };
        let mut at = 0.0;
        let mut out = Vec::new();
        for (i, p) in phases.iter().enumerate() {
            let end = if i + 1 == phases.len() {
                duration_s
            } else {
                round(at + p.duration.as_secs_f64(), 9)
            };
            out.push(PhaseStats {
                rate: round(p.rate, 3),
                start_s: at,
                end_s: end,
                offered: 0,
                ok: 0,
                rejected: 0,
                failed: 0,
                errors: 0,
                admitted: Latency::new(),
                first_reject_s: None,
                last_reject_s: None,
            });
            at = end;
        }
        Self {
            seconds: Vec::new(),
            phases: out,
            gauges: BTreeMap::new(),
        }
    }

    fn second(&mut self, at_ns: u64) -> &mut Second {
        let i = (at_ns / 1_000_000_000) as usize;
        if self.seconds.len() <= i {
            self.seconds.resize_with(i + 1, Second::default);
        }
        &mut self.seconds[i]
    }

    fn phase(&mut self, at_ns: u64) -> Option<&mut PhaseStats> {
        let at = at_ns as f64 / NS;
        let i = self
            .phases
            .iter()
            .rposition(|p| p.start_s <= at)
            .unwrap_or(0);
        self.phases.get_mut(i)
    }

    /// A request due `at_ns` after the start of the window was sent (or queued to be).
    pub(crate) fn offered(&mut self, at_ns: u64) {
        self.second(at_ns).offered += 1;
        if let Some(p) = self.phase(at_ns) {
            p.offered += 1;
        }
    }

    /// A response with `status` arrived at `done_ns` for the request due at `intended_ns`
    /// (both from the start of the window).
    pub(crate) fn response(&mut self, intended_ns: u64, done_ns: u64, status: u16) {
        let latency_ns = done_ns.saturating_sub(intended_ns);
        if status < 400 {
            self.second(intended_ns).admitted.record_ns(latency_ns);
            if let Some(p) = self.phase(intended_ns) {
                p.admitted.record_ns(latency_ns);
            }
        }
        let s = self.second(done_ns);
        match status {
            0..400 => s.ok += 1,
            503 => s.rejected += 1,
            _ => s.failed += 1,
        }
        // Microseconds: plenty for "how long after the step", and exact through JSON.
        let at = (done_ns / 1000) as f64 / 1e6;
        if let Some(p) = self.phase(done_ns) {
            match status {
                0..400 => p.ok += 1,
                503 => {
                    p.rejected += 1;
                    p.first_reject_s = Some(p.first_reject_s.map_or(at, |f| f.min(at)));
                    p.last_reject_s = Some(p.last_reject_s.map_or(at, |l| l.max(at)));
                }
                _ => p.failed += 1,
            }
        }
    }

    /// A request failed without a response at `at_ns` from the start of the window.
    pub(crate) fn error(&mut self, at_ns: u64) {
        self.second(at_ns).errors += 1;
        if let Some(p) = self.phase(at_ns) {
            p.errors += 1;
        }
    }

    /// Adds another generator thread's timeline of the same load.
    pub fn add(&mut self, other: &Timeline) {
        self.merge(other, false);
    }

    /// Adds another stream's timeline of the same run: counts add, and so do the phases'
    /// rates. Phases with the same boundaries are added one to one; when the two streams step
    /// at different times, both become one phase for the whole window (each stream's own
    /// timeline keeps its steps).
    pub fn add_stream(&mut self, other: &Timeline) {
        self.merge(other, true);
    }

    fn merge(&mut self, other: &Timeline, sum_rates: bool) {
        let same = self.phases.len() == other.phases.len()
            && self
                .phases
                .iter()
                .zip(&other.phases)
                .all(|(a, b)| a.start_s == b.start_s && a.end_s == b.end_s);
        if !same && !other.phases.is_empty() {
            self.collapse();
            let mut other = other.clone();
            other.collapse();
            return self.merge(&other, sum_rates);
        }
        if self.seconds.len() < other.seconds.len() {
            self.seconds
                .resize_with(other.seconds.len(), Second::default);
        }
        for (a, b) in self.seconds.iter_mut().zip(&other.seconds) {
            a.add(b);
        }
        for (a, b) in self.phases.iter_mut().zip(&other.phases) {
            if sum_rates {
                a.rate = round(a.rate + b.rate, 3);
            }
            a.add_counts(b);
        }
        for (k, v) in &other.gauges {
            self.gauges.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }

    /// Makes the phases one, for the whole window: its rate the mean over the window.
    fn collapse(&mut self) {
        if self.phases.len() < 2 {
            return;
        }
        let end = self.phases.last().map_or(0.0, |p| p.end_s);
        let mut one = self.phases[0].clone();
        one.rate = 0.0;
        for p in &self.phases {
            one.rate += p.rate * (p.end_s - p.start_s) / end.max(1e-9);
        }
        one.rate = round(one.rate, 3);
        for p in &self.phases[1..] {
            one.add_counts(p);
        }
        one.end_s = end;
        self.phases = vec![one];
    }

    /// Files the gateway's metric readings under the second each was made in; counters
    /// (`*_total`) become their increase per second since the previous reading.
    pub fn set_gauges(&mut self, readings: &[GaugeReading]) {
        let mut previous: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
        for r in readings {
            for (name, value) in &r.values {
                let (column, value) = match name.split_once('[').map_or(
                    name.strip_suffix("_total").map(|b| (b, "")),
                    |(base, rest)| base.strip_suffix("_total").map(|b| (b, rest)),
                ) {
                    Some((base, rest)) => {
                        let rate = previous
                            .insert(name, (r.at_s, *value))
                            .filter(|(t, _)| r.at_s > *t)
                            .map(|(t, v)| round((value - v) / (r.at_s - t), 3));
                        let column = if rest.is_empty() {
                            format!("{base}_per_s")
                        } else {
                            format!("{base}_per_s[{rest}")
                        };
                        (column, rate)
                    }
                    None => (name.clone(), Some(round(*value, 6))),
                };
                if r.at_s < 0.0 {
                    continue;
                }
                let i = r.at_s as usize;
                let cells = self.gauges.entry(column).or_default();
                if cells.len() <= i {
                    cells.resize(i + 1, None);
                }
                if value.is_some() {
                    cells[i] = value;
                }
            }
        }
    }

    /// Every step between phases, with when the rejections came.
    pub fn steps(&self) -> Vec<Step> {
        self.phases
            .windows(2)
            .map(|w| {
                let (before, after) = (&w[0], &w[1]);
                Step {
                    at_s: after.start_s,
                    from_rate: before.rate,
                    to_rate: after.rate,
                    first_reject_after_s: after.first_reject_s.map(|t| t - after.start_s),
                    last_reject_after_s: after.last_reject_s.map(|t| t - after.start_s),
                    rejected: after.rejected,
                    phase_s: after.end_s - after.start_s,
                }
            })
            .collect()
    }

    /// Gauge columns of one metric (`upstream_limit`), in name order.
    pub fn gauge_columns(&self, metric: &str) -> Vec<&str> {
        self.gauges
            .keys()
            .filter(|k| *k == metric || k.strip_prefix(metric).is_some_and(|r| r.starts_with('[')))
            .map(String::as_str)
            .collect()
    }
}

fn min_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn max_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// The metrics the lab reads from the gateway every second when a scenario has a
/// `[timeline]` section without its own list: each upstream's concurrency limit (issue 14),
/// its in-flight count, whether it is enforcing, and its rejections, and the shedder's.
pub const DEFAULT_GAUGES: [&str; 5] = [
    "tailguard_upstream_limit",
    "tailguard_upstream_inflight",
    "tailguard_upstream_overloaded",
    "tailguard_upstream_limited_total",
    "tailguard_overload_shed_total",
];

/// The two gauge columns every timeline shows, present or not (empty when the gateway does
/// not export them).
const ALWAYS: [&str; 2] = ["upstream_limit", "upstream_inflight"];

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// A gauge in the Markdown table: whole numbers as such, others to one decimal.
fn short(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn cell(v: Option<f64>) -> String {
    match v {
        None => String::new(),
        Some(v) if v.fract() == 0.0 && v.abs() < 1e15 => format!("{v:.0}"),
        Some(v) => format!("{v:.3}"),
    }
}

/// The gauge columns of a timeline: every one read except counters that never moved (a
/// class nothing was rejected in), plus `upstream_limit` and `upstream_inflight` themselves
/// when no column of theirs was (so they show, empty); the limit and in-flight first.
fn columns(total: &Timeline) -> Vec<String> {
    let mut cols: Vec<String> = total
        .gauges
        .iter()
        .filter(|(k, v)| !k.contains("_per_s") || v.iter().flatten().any(|x| *x != 0.0))
        .map(|(k, _)| k.clone())
        .collect();
    for a in ALWAYS {
        if total.gauge_columns(a).is_empty() {
            cols.push(a.to_string());
        }
    }
    let rank = |c: &str| {
        [
            "upstream_limit",
            "upstream_inflight",
            "upstream_overloaded",
            "upstream_limited",
        ]
        .iter()
        .position(|m| c == *m || c.starts_with(&format!("{m}[")) || c.starts_with(&format!("{m}_")))
        .unwrap_or(4)
    };
    cols.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)));
    cols
}

fn gauge(total: &Timeline, column: &str, second: usize) -> Option<f64> {
    total
        .gauges
        .get(column)
        .and_then(|v| v.get(second).copied().flatten())
}

/// The timeline as CSV, one row per second: the totals, then per stream (when there are
/// several) the same counts prefixed with the stream's name, then the gauges.
pub fn csv(total: &Timeline, streams: &[(String, &Timeline)]) -> String {
    let mut o = String::from(
        "t_s,offered,goodput,rejected_503,failed_4xx_5xx,errors,admitted_p50_ms,admitted_p99_ms,admitted_p100_ms",
    );
    let per_stream = streams.len() > 1;
    if per_stream {
        for (name, _) in streams {
            for c in [
                "offered",
                "goodput",
                "rejected_503",
                "errors",
                "admitted_p50_ms",
                "admitted_p99_ms",
            ] {
                let _ = write!(o, ",{name}.{c}");
            }
        }
    }
    let cols = columns(total);
    for c in &cols {
        let _ = write!(o, ",{c}");
    }
    o.push('\n');
    let latency = |s: Option<&Second>, p: f64| -> String {
        match s {
            Some(s) if s.admitted.count() > 0 => format!("{:.3}", ms(s.admitted.percentile_us(p))),
            _ => String::new(),
        }
    };
    for (i, s) in total.seconds.iter().enumerate() {
        let _ = write!(
            o,
            "{i},{},{},{},{},{},{},{},{}",
            s.offered,
            s.ok,
            s.rejected,
            s.failed,
            s.errors,
            latency(Some(s), 50.0),
            latency(Some(s), 99.0),
            latency(Some(s), 100.0)
        );
        if per_stream {
            for (_, t) in streams {
                let st = t.seconds.get(i);
                let n = |f: fn(&Second) -> u64| st.map_or(0, f);
                let _ = write!(
                    o,
                    ",{},{},{},{},{},{}",
                    n(|s| s.offered),
                    n(|s| s.ok),
                    n(|s| s.rejected),
                    n(|s| s.errors),
                    latency(st, 50.0),
                    latency(st, 99.0)
                );
            }
        }
        for c in &cols {
            let _ = write!(o, ",{}", cell(gauge(total, c, i)));
        }
        o.push('\n');
    }
    o
}

/// The timeline as JSON for readers: one object per second (milliseconds, gauges by
/// column), the phases, and the steps.
pub fn json(total: &Timeline, streams: &[(String, &Timeline)]) -> serde_json::Value {
    let p = |s: &Second, q: f64| (s.admitted.count() > 0).then(|| ms(s.admitted.percentile_us(q)));
    let second = |s: &Second| {
        serde_json::json!({
            "offered": s.offered,
            "goodput": s.ok,
            "rejected_503": s.rejected,
            "failed_4xx_5xx": s.failed,
            "errors": s.errors,
            "admitted_p50_ms": p(s, 50.0),
            "admitted_p99_ms": p(s, 99.0),
            "admitted_p100_ms": p(s, 100.0),
        })
    };
    let rows: Vec<serde_json::Value> = total
        .seconds
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut row = second(s);
            row["t_s"] = i.into();
            let gauges: serde_json::Map<String, serde_json::Value> = columns(total)
                .into_iter()
                .map(|c| {
                    let v = gauge(total, &c, i);
                    (c, v.into())
                })
                .collect();
            row["gauges"] = gauges.into();
            if streams.len() > 1 {
                let per: serde_json::Map<String, serde_json::Value> = streams
                    .iter()
                    .map(|(name, t)| {
                        (
                            name.clone(),
                            t.seconds.get(i).map_or(serde_json::Value::Null, second),
                        )
                    })
                    .collect();
                row["streams"] = per.into();
            }
            row
        })
        .collect();
    let phases: Vec<serde_json::Value> = total
        .phases
        .iter()
        .map(|ph| {
            serde_json::json!({
                "rate": ph.rate,
                "start_s": ph.start_s,
                "end_s": ph.end_s,
                "offered": ph.offered,
                "goodput": ph.ok,
                "rejected_503": ph.rejected,
                "failed_4xx_5xx": ph.failed,
                "errors": ph.errors,
                "admitted_p50_ms": ms(ph.admitted.percentile_us(50.0)),
                "admitted_p99_ms": ms(ph.admitted.percentile_us(99.0)),
                "admitted_p100_ms": ms(ph.admitted.max_us()),
                "first_reject_s": ph.first_reject_s,
                "last_reject_s": ph.last_reject_s,
            })
        })
        .collect();
    let steps: Vec<serde_json::Value> = total
        .steps()
        .iter()
        .map(|s| {
            serde_json::json!({
                "at_s": s.at_s,
                "from_rate": s.from_rate,
                "to_rate": s.to_rate,
                "first_reject_after_s": s.first_reject_after_s,
                "last_reject_after_s": s.last_reject_after_s,
                "rejected": s.rejected,
            })
        })
        .collect();
    serde_json::json!({ "seconds": rows, "phases": phases, "steps": steps })
}

/// One line per step: when the first rejection came after a step up, and when the last one
/// came after a step down (the recovery).
pub fn step_lines(total: &Timeline) -> Vec<String> {
    total
        .steps()
        .iter()
        .map(|s| {
            let head = format!(
                "step {} at {:.1} s ({:.0} -> {:.0} req/s)",
                if s.to_rate > s.from_rate { "up" } else { "down" },
                s.at_s,
                s.from_rate,
                s.to_rate
            );
            if s.to_rate > s.from_rate {
                match s.first_reject_after_s {
                    Some(t) => format!(
                        "{head}: first rejection {} after the step, {} rejected in the {:.1} s after it",
                        secs(t),
                        s.rejected,
                        s.phase_s
                    ),
                    None => format!("{head}: no rejection in the {:.1} s after it", s.phase_s),
                }
            } else {
                match s.last_reject_after_s {
                    // Still rejecting at the end of the phase (its last second, or its last
                    // tenth when shorter than 10 s): it never recovered.
                    Some(t) if t > s.phase_s - (s.phase_s * 0.1).min(1.0) => format!(
                        "{head}: not recovered, still rejecting {} after the step ({} rejected, the phase lasted {:.1} s)",
                        secs(t),
                        s.rejected,
                        s.phase_s
                    ),
                    Some(t) => format!(
                        "{head}: recovery {} (the last rejection after the step; {} rejected after it)",
                        secs(t),
                        s.rejected
                    ),
                    None => format!("{head}: recovery 0 s (no rejection after the step)"),
                }
            }
        })
        .collect()
}

fn secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else {
        format!("{s:.2} s")
    }
}

/// The phases as a Markdown table (goodput per second of phase, 503s, errors, admitted
/// percentiles by intended time).
pub fn phase_table(total: &Timeline) -> String {
    let mut o = String::from(
        "| phase | rate | offered | goodput/s | 503 | errors | admitted P50 | P99 | P100 |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for ph in &total.phases {
        let len = (ph.end_s - ph.start_s).max(1e-9);
        let _ = writeln!(
            o,
            "| {:.1}-{:.1} s | {:.0} | {} | {:.0} | {} | {} | {:.2} ms | {:.2} ms | {:.2} ms |",
            ph.start_s,
            ph.end_s,
            ph.rate,
            ph.offered,
            ph.ok as f64 / len,
            ph.rejected,
            ph.errors + ph.failed,
            ms(ph.admitted.percentile_us(50.0)),
            ms(ph.admitted.percentile_us(99.0)),
            ms(ph.admitted.max_us())
        );
    }
    o
}

/// The seconds as a Markdown table: counts, admitted P50/P99, and the limit and in-flight
/// gauges of each upstream (`-` when the gateway does not export them).
pub fn second_table(total: &Timeline) -> String {
    let limits = total.gauge_columns("upstream_limit");
    let inflight = total.gauge_columns("upstream_inflight");
    let mut o = String::from(
        "| t (s) | offered | goodput | 503 | errors | admitted P50 | P99 | limit | in flight |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let show = |cols: &[&str], i: usize| -> String {
        let parts: Vec<String> = cols
            .iter()
            .filter_map(|c| {
                gauge(total, c, i).map(|v| {
                    let label = c
                        .split_once('[')
                        .map_or("", |(_, l)| l.trim_end_matches(']'));
                    if label.is_empty() || cols.len() == 1 {
                        short(v)
                    } else {
                        format!("{label} {}", short(v))
                    }
                })
            })
            .collect();
        if parts.is_empty() {
            "-".into()
        } else {
            parts.join(", ")
        }
    };
    for (i, s) in total.seconds.iter().enumerate() {
        let lat = |p: f64| {
            if s.admitted.count() > 0 {
                format!("{:.2}", ms(s.admitted.percentile_us(p)))
            } else {
                "-".into()
            }
        };
        let _ = writeln!(
            o,
            "| {i} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.offered,
            s.ok,
            s.rejected,
            s.errors + s.failed,
            lat(50.0),
            lat(99.0),
            show(&limits, i),
            show(&inflight, i)
        );
    }
    o
}

/// Stroke colours of the timeline plot: one meaning each, across panels.
const GOODPUT: &str = "#2ca02c";
const REJECTED: &str = "#d62728";
const OFFERED: &str = "#7f7f7f";
const ERRORS: &str = "#ff7f0e";
/// Colours of the streams' (or upstreams') own lines, in order.
const STREAM_COLORS: [&str; 4] = ["#1f77b4", "#9467bd", "#8c564b", "#17becf"];

/// Per-second values as a step line: each second's value held from its start to its end,
/// a gap (NaN) where a second has none.
fn steps(values: impl Iterator<Item = Option<f64>>) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    for (i, v) in values.enumerate() {
        let t = i as f64;
        match v {
            Some(v) => {
                out.push((t, v));
                out.push((t + 1.0, v));
            }
            None => out.push((t, f64::NAN)),
        }
    }
    out
}

/// The timeline's plot: request rates (offered, goodput and 503s per stream), the gateway's
/// limit and in-flight per upstream, and the admitted P50/P99 per stream, against time,
/// with the phase boundaries marked.
pub fn plot(title: &str, total: &Timeline, streams: &[(String, &Timeline)]) -> String {
    use crate::plot::{Line, Panel};
    let of = |t: &Timeline, f: &dyn Fn(&Second) -> Option<f64>| steps(t.seconds.iter().map(f));
    let p = |q: f64| {
        move |s: &Second| (s.admitted.count() > 0).then(|| ms(s.admitted.percentile_us(q)))
    };
    let named: Vec<(String, &Timeline)> = if streams.len() > 1 {
        streams.iter().map(|(n, t)| (format!("{n} "), *t)).collect()
    } else {
        vec![(String::new(), total)]
    };
    let mut rates = vec![Line {
        label: "offered".into(),
        points: of(total, &|s| Some(s.offered as f64)),
        dashed: true,
        color: Some(OFFERED),
    }];
    let mut latency = Vec::new();
    for (i, (prefix, t)) in named.iter().enumerate() {
        let several = named.len() > 1;
        let color = STREAM_COLORS[i % STREAM_COLORS.len()];
        rates.push(Line {
            label: format!("{prefix}goodput (<400)"),
            points: of(t, &|s| Some(s.ok as f64)),
            dashed: false,
            color: Some(if several { color } else { GOODPUT }),
        });
        rates.push(Line {
            label: format!("{prefix}rejected (503)"),
            points: of(t, &|s| Some(s.rejected as f64)),
            dashed: several,
            color: Some(if several { color } else { REJECTED }),
        });
        latency.push(Line {
            label: format!("{prefix}admitted P99"),
            points: of(t, &p(99.0)),
            dashed: false,
            color: Some(color),
        });
        latency.push(Line {
            label: format!("{prefix}admitted P50"),
            points: of(t, &p(50.0)),
            dashed: true,
            color: Some(color),
        });
    }
    if total.seconds.iter().any(|s| s.errors + s.failed > 0) {
        rates.push(Line {
            label: "timeouts and errors".into(),
            points: of(total, &|s| Some((s.errors + s.failed) as f64)),
            dashed: false,
            color: Some(ERRORS),
        });
    }
    let mut gauges = Vec::new();
    for (metric, name, dashed) in [
        ("upstream_limit", "limit", false),
        ("upstream_inflight", "in flight", true),
    ] {
        for (i, col) in total.gauge_columns(metric).into_iter().enumerate() {
            let label = col
                .split_once('[')
                .map_or("", |(_, l)| l.trim_end_matches(']'));
            gauges.push(Line {
                label: format!("{name} {label}").trim_end().to_string(),
                points: steps(total.gauges[col].iter().copied()),
                dashed,
                color: Some(STREAM_COLORS[i % STREAM_COLORS.len()]),
            });
        }
    }
    let panels = [
        Panel {
            y_label: "requests per second".into(),
            lines: rates,
            note: None,
        },
        Panel {
            y_label: "upstream concurrency".into(),
            note: gauges
                .is_empty()
                .then(|| "no tailguard_upstream_limit in this gateway's metrics".to_string()),
            lines: gauges,
        },
        Panel {
            y_label: "admitted latency (ms)".into(),
            lines: latency,
            note: None,
        },
    ];
    let marks: Vec<f64> = total.phases.iter().skip(1).map(|p| p.start_s).collect();
    let x_max = total.seconds.len().max(1) as f64;
    crate::plot::render_panels(title, &panels, &marks, x_max)
}

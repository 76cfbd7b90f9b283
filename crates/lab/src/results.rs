//! A scenario's results: each condition's row (its runs merged over seeds and streams), the
//! first seed's timelines and the files they are written to, and each run's percentiles.

use std::path::{Path, PathBuf};

use tailguard_loadgen::report::Report;
use tailguard_loadgen::slowest::keep_slowest;
use tailguard_loadgen::timeline::Timeline;

use crate::LabError;
use crate::health::Health;

/// One row of the comparison table.
#[derive(Debug, Clone)]
pub struct Row {
    /// Condition name.
    pub name: String,
    /// Requested rate (the mean over the window of a stepped load, summed over streams).
    pub rate: f64,
    /// The requested rate as the table shows it: `270`, `135 / 2700 / 135 (10+20+15 s)`,
    /// `a 2700 + b 195`.
    pub schedule: String,
    /// Merged report over the seeds (and streams), or why the condition was skipped.
    pub result: Result<Report, String>,
    /// wrk's closed-loop maximum, when measured.
    pub max_rate: Option<f64>,
    /// Health probes during the runs (overload scenarios only).
    pub health: Option<Health>,
    /// Each stream's report merged over the seeds (scenarios with `[[load.streams]]`).
    pub streams: Vec<(String, Report)>,
    /// The first seed's timeline.
    pub timeline: Option<Timelines>,
}

/// One run's timelines: the total, each stream's, and the files they were written to.
#[derive(Debug, Clone)]
pub struct Timelines {
    /// Every stream added up, with the gateway's gauges.
    pub total: Timeline,
    /// Each stream's own (empty names for a scenario without streams).
    pub streams: Vec<(String, Timeline)>,
    /// File stem: `<stem>.timeline.csv`, `.json` and `.svg`.
    pub files: String,
}

/// Several streams' reports of one run as one: counts and distributions added, rates summed.
pub(crate) fn combine(parts: &[Report]) -> Report {
    let mut total = parts[0].clone();
    for p in &parts[1..] {
        total.latency.add(&p.latency);
        total.latency_ok.add(&p.latency_ok);
        total.generator_lag.add(&p.generator_lag);
        total.latency_from_release.add(&p.latency_from_release);
        total.latency_during_scrape.add(&p.latency_during_scrape);
        for (k, v) in &p.status {
            *total.status.entry(*k).or_default() += v;
        }
        for (k, v) in &p.errors {
            *total.errors.entry(k.clone()).or_default() += v;
        }
        total.requested_rate += p.requested_rate;
        total.achieved_rate += p.achieved_rate;
        total.connections += p.connections;
        total.threads += p.threads;
        total.sent += p.sent;
        total.completed += p.completed;
        total.bytes_read += p.bytes_read;
        total.queued += p.queued;
        total.max_queue = total.max_queue.max(p.max_queue);
        total.scrapes.extend(p.scrapes.iter().cloned());
        keep_slowest(&mut total.slowest, &p.slowest);
        total.timeline.add_stream(&p.timeline);
    }
    total
}

/// Writes `<stem>.timeline.csv`, `.json` and `.svg`.
pub(crate) fn write_timeline(
    stem: &Path,
    title: &str,
    total: &Timeline,
    streams: &[(String, &Timeline)],
) -> Result<(), LabError> {
    let per_stream: Vec<(String, &Timeline)> = if streams.len() > 1 {
        streams.to_vec()
    } else {
        Vec::new()
    };
    let with = |ext: &str| {
        let mut p = stem.as_os_str().to_owned();
        p.push(ext);
        PathBuf::from(p)
    };
    std::fs::write(
        with(".timeline.csv"),
        tailguard_loadgen::timeline::csv(total, &per_stream),
    )?;
    std::fs::write(
        with(".timeline.json"),
        tailguard_loadgen::timeline::json(total, &per_stream).to_string(),
    )?;
    std::fs::write(
        with(".timeline.svg"),
        tailguard_loadgen::timeline::plot(title, total, &per_stream),
    )?;
    Ok(())
}

/// One run's percentiles, in ms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct SeedLine {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
    pub(crate) p100: f64,
}

impl SeedLine {
    pub(crate) fn of(r: &Report) -> SeedLine {
        let ms = |p: f64| r.latency.percentile_us(p) as f64 / 1000.0;
        SeedLine {
            p50: ms(50.0),
            p99: ms(99.0),
            p999: ms(99.9),
            p100: r.latency.max_us() as f64 / 1000.0,
        }
    }
}

pub(crate) fn merge(mut a: Report, b: &Report) -> Report {
    a.latency.add(&b.latency);
    a.latency_ok.add(&b.latency_ok);
    a.generator_lag.add(&b.generator_lag);
    a.latency_from_release.add(&b.latency_from_release);
    a.latency_during_scrape.add(&b.latency_during_scrape);
    for (k, v) in &b.status {
        *a.status.entry(*k).or_default() += v;
    }
    for (k, v) in &b.errors {
        *a.errors.entry(k.clone()).or_default() += v;
    }
    a.achieved_rate = (a.achieved_rate * a.duration_s + b.achieved_rate * b.duration_s)
        / (a.duration_s + b.duration_s);
    a.duration_s += b.duration_s;
    a.sent += b.sent;
    a.completed += b.completed;
    a.bytes_read += b.bytes_read;
    a.queued += b.queued;
    a.max_queue = a.max_queue.max(b.max_queue);
    a.scrapes.extend(b.scrapes.iter().cloned());
    // Each request keeps its own run's intended time and placement.
    keep_slowest(&mut a.slowest, &b.slowest);
    a
}

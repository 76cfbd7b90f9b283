//! The tables a scenario run prints and writes to `summary.md`: the comparison with P100,
//! each stream's goodput and admitted latency, the percentiles per seed with their paired
//! ratios, the step timings and the timeline section; and the line about the machine.

use std::fmt::Write as _;

use tailguard_loadgen::latency::Latency;
use tailguard_loadgen::report::Report;
use tailguard_loadgen::timeline::Timeline;

use crate::results::{Row, SeedLine};
use crate::scenario::Scenario;

/// The step lines of a run: of the total with one stream, else of each stepped stream.
pub(crate) fn step_lines(total: &Timeline, streams: &[(String, &Timeline)]) -> Vec<String> {
    if streams.len() <= 1 {
        return tailguard_loadgen::timeline::step_lines(total);
    }
    streams
        .iter()
        .flat_map(|(name, t)| {
            tailguard_loadgen::timeline::step_lines(t)
                .into_iter()
                .map(move |l| format!("stream {name}: {l}"))
        })
        .collect()
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Every condition's percentiles per seed, their median over seeds, and (from the second
/// condition on) the median over seeds of the ratio to the first condition's run with the
/// same seed: the paired comparison, which the spread between seeds does not blur.
pub(crate) fn per_seed_table(lines: &[(String, Vec<(u64, SeedLine)>)]) -> String {
    let mut out = String::from(
        "Per seed (P50 / P99 / P99.9 / P100, ms), the median over seeds, and the median of the per-seed ratios to the first condition (same seed):\n\n| condition | seed | P50 | P99 | P99.9 | P100 |\n|---|---|---|---|---|---|\n",
    );
    let base: std::collections::HashMap<u64, SeedLine> = lines
        .first()
        .map(|(_, l)| l.iter().copied().collect())
        .unwrap_or_default();
    // One table row: the four percentiles that `value` gives for each field of a line.
    let mut row = |name: &str, label: &str, value: &dyn Fn(fn(&SeedLine) -> f64) -> f64| {
        let _ = writeln!(
            out,
            "| {name} | {label} | {:.2} | {:.2} | {:.2} | {:.2} |",
            value(|l| l.p50),
            value(|l| l.p99),
            value(|l| l.p999),
            value(|l| l.p100)
        );
    };
    for (i, (name, seeds)) in lines.iter().enumerate() {
        for (seed, l) in seeds {
            row(name, &seed.to_string(), &|f| f(l));
        }
        if seeds.is_empty() {
            continue;
        }
        row(name, "**median**", &|f| {
            median(seeds.iter().map(|(_, l)| f(l)).collect())
        });
        if i > 0 {
            row(name, "**ratio to first**", &|f| {
                median(
                    seeds
                        .iter()
                        .filter_map(|(seed, l)| base.get(seed).map(|b| f(l) / f(b)))
                        .collect(),
                )
            });
        }
    }
    out
}

/// Each round's ratios to the first condition's run with the same seed (P99, P99.9, P100:
/// the tail a scrape could move) and their medians over the rounds: issue 26's readout.
pub(crate) fn ratio_table(lines: &[(String, Vec<(u64, SeedLine)>)]) -> String {
    let mut out = String::from(
        "Per round (seed), each condition / the first condition's run of the same round, and the median over rounds:\n\n| condition | round | P99 | P99.9 | P100 |\n|---|---|---|---|---|\n",
    );
    let base: std::collections::HashMap<u64, SeedLine> = lines
        .first()
        .map(|(_, l)| l.iter().copied().collect())
        .unwrap_or_default();
    for (name, seeds) in lines.iter().skip(1) {
        let ratios: Vec<[f64; 3]> = seeds
            .iter()
            .filter_map(|(seed, l)| {
                let b = base.get(seed)?;
                let r = [l.p99 / b.p99, l.p999 / b.p999, l.p100 / b.p100];
                let _ = writeln!(
                    out,
                    "| {name} | {seed} | {:.2} | {:.2} | {:.2} |",
                    r[0], r[1], r[2]
                );
                Some(r)
            })
            .collect();
        if ratios.is_empty() {
            continue;
        }
        let m = |i: usize| median(ratios.iter().map(|r| r[i]).collect());
        let _ = writeln!(
            out,
            "| {name} | **median of {}** | **{:.2}** | **{:.2}** | **{:.2}** |",
            ratios.len(),
            m(0),
            m(1),
            m(2)
        );
    }
    out
}

/// One line about this machine for benchmark summaries.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown cpu".into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!("{cpu}, {cores} cores, load average {}", load.join(" "))
}

pub(crate) fn render_table(scenario: &Scenario, rows: &[Row]) -> String {
    let shed = scenario.capacity.is_some();
    let mut o = String::new();
    let _ = writeln!(
        o,
        "tailguard lab {}: latency from the intended send time (constant rate, HdrHistogram)",
        scenario.name
    );
    let _ = writeln!(
        o,
        "| condition | rate | achieved | P50 | P99 | P99.9 | P99.99 | P100 | non-2xx | errors | {} |",
        if shed {
            "goodput / admitted P99"
        } else {
            "notes"
        }
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        match &row.result {
            Err(why) => {
                let _ = writeln!(
                    o,
                    "| {} | {} | - | - | - | - | - | - | - | - | skipped: {} |",
                    row.name, row.schedule, why
                );
            }
            Ok(r) => {
                let p = |q: f64| format_ms(r.latency.percentile_us(q));
                let non2xx: u64 = r
                    .status
                    .iter()
                    .filter(|(c, _)| !(200..300).contains(*c))
                    .map(|(_, n)| n)
                    .sum();
                let mut notes = Vec::new();
                if shed {
                    notes.push(format!(
                        "{:.0} req/s ok, admitted P99 {}",
                        r.ok_count() as f64 / r.duration_s,
                        format_ms(r.latency_ok.percentile_us(99.0))
                    ));
                }
                if !r.scrapes.is_empty() {
                    let mut d = Latency::new();
                    for s in &r.scrapes {
                        d.record_us((s.duration_ms * 1000.0) as u64);
                    }
                    let bytes = r.scrapes.iter().map(|s| s.bytes).max().unwrap_or(0);
                    notes.push(format!(
                        "{} scrapes, longest {}, {} B; overlapping requests P99 {} P100 {}",
                        r.scrapes.len(),
                        format_ms(d.max_us()),
                        bytes,
                        format_ms(r.latency_during_scrape.percentile_us(99.0)),
                        format_ms(r.latency_during_scrape.max_us())
                    ));
                }
                if let Some(m) = row.max_rate {
                    notes.push(format!("wrk max {m:.0} req/s"));
                }
                if let Some(t) = &row.timeline {
                    notes.extend(limit_notes(&t.total));
                }
                if let Some(h) = row.health {
                    notes.push(format!(
                        "health {}/{} answered, slowest {}",
                        h.ok,
                        h.sent,
                        format_ms(h.max_us)
                    ));
                }
                if r.queued > 0 {
                    notes.push(format!("{} waited for a connection", r.queued));
                }
                let _ = writeln!(
                    o,
                    "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    row.name,
                    row.schedule,
                    r.achieved_rate,
                    p(50.0),
                    p(99.0),
                    p(99.9),
                    p(99.99),
                    p(100.0),
                    non2xx,
                    r.error_count(),
                    notes.join("; ")
                );
            }
        }
    }
    o
}

/// `limit a 12 (8-16)`: the median of each upstream's limit over the run's seconds, with its
/// range; nothing when the gateway does not export the limit.
fn limit_notes(t: &Timeline) -> Vec<String> {
    t.gauge_columns("upstream_limit")
        .into_iter()
        .filter_map(|col| {
            let mut v: Vec<f64> = t.gauges[col].iter().flatten().copied().collect();
            if v.is_empty() {
                return None;
            }
            v.sort_by(f64::total_cmp);
            let label = col
                .split_once('[')
                .map_or("", |(_, l)| l.trim_end_matches(']'));
            Some(format!(
                "limit {label} {:.0} ({:.0}-{:.0})",
                median(v.clone()),
                v[0],
                v[v.len() - 1]
            ))
        })
        .collect()
}

/// Each stream of each condition: goodput, 503s, errors and the admitted percentiles.
pub(crate) fn stream_table(rows: &[Row]) -> String {
    let mut o = String::from(
        "Per stream (goodput: responses below 400 per second of the window; admitted: their latency from the intended send time):\n\n| condition | stream | rate | goodput | 503 | errors | admitted P50 | P99 | P100 |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        for (name, r) in &row.streams {
            let _ = writeln!(
                o,
                "| {} | {} | {:.0} | {:.0} | {} | {} | {} | {} | {} |",
                row.name,
                name,
                r.requested_rate,
                r.ok_count() as f64 / r.duration_s.max(1e-9),
                r.status.get(&503).copied().unwrap_or(0),
                r.error_count()
                    + r.status
                        .iter()
                        .filter(|(c, _)| **c >= 400 && **c != 503)
                        .map(|(_, n)| n)
                        .sum::<u64>(),
                format_ms(r.latency_ok.percentile_us(50.0)),
                format_ms(r.latency_ok.percentile_us(99.0)),
                format_ms(r.latency_ok.max_us())
            );
        }
    }
    o
}

/// For each stream, its admitted P99 and 503s in every condition that sends it at the rate it
/// had where it ran alone (the first such condition), against that baseline: issue 14's
/// "B's P99 within 10 % of B alone, and no rejection of B".
pub(crate) fn stream_notes(rows: &[Row]) -> Vec<String> {
    let mut notes = Vec::new();
    let names: Vec<String> = {
        let mut n: Vec<String> = rows
            .iter()
            .flat_map(|r| r.streams.iter().map(|(n, _)| n.clone()))
            .collect();
        n.sort();
        n.dedup();
        n
    };
    for name in names {
        let Some((base_row, base)) = rows.iter().find_map(|row| {
            (row.streams.len() == 1)
                .then(|| ran(row, &name).map(|r| (row, r)))
                .flatten()
        }) else {
            continue;
        };
        let base_p99 = base.latency_ok.percentile_us(99.0) as f64;
        for row in rows {
            if std::ptr::eq(row, base_row) || row.streams.len() < 2 {
                continue;
            }
            let Some(r) = ran(row, &name) else { continue };
            if (r.requested_rate - base.requested_rate).abs() > base.requested_rate * 0.01 {
                continue;
            }
            let p99 = r.latency_ok.percentile_us(99.0) as f64;
            let change = (p99 / base_p99.max(1.0) - 1.0) * 100.0;
            let rejected = r.status.get(&503).copied().unwrap_or(0);
            notes.push(format!(
                "stream {name} in `{}`: admitted P99 {} vs {} alone (`{}`), {change:+.1} % ({}); {} 503s{}",
                row.name,
                format_ms(p99 as u64),
                format_ms(base_p99 as u64),
                base_row.name,
                if change.abs() <= 10.0 {
                    "within 10 %"
                } else {
                    "NOT within 10 %"
                },
                rejected,
                if rejected == 0 {
                    ", none rejected"
                } else {
                    ""
                }
            ));
        }
    }
    notes
}

/// The report of stream `name` in `row`, if it was sent there.
fn ran<'r>(row: &'r Row, name: &str) -> Option<&'r Report> {
    row.streams.iter().find(|(n, _)| n == name).map(|(_, r)| r)
}

/// The timelines: where each condition's files are, and for every stepped condition its
/// step timings, its phases and its seconds.
pub(crate) fn timeline_section(rows: &[Row]) -> String {
    let mut o = String::from(
        "Timelines (first seed; per second: offered and admitted latency by intended send time, goodput, 503s and errors by when they happened, gauges read from the gateway each second):\n\n",
    );
    for row in rows {
        if let Some(t) = &row.timeline {
            let _ = writeln!(
                o,
                "- {}: `{f}.timeline.csv`, `{f}.timeline.json`, `{f}.timeline.svg`",
                row.name,
                f = t.files
            );
        }
    }
    for row in rows {
        let Some(t) = &row.timeline else { continue };
        if t.total.phases.len() < 2 && t.streams.iter().all(|(_, s)| s.phases.len() < 2) {
            continue;
        }
        let named: Vec<(String, &Timeline)> =
            t.streams.iter().map(|(n, s)| (n.clone(), s)).collect();
        let _ = writeln!(o, "\n### {}\n", row.name);
        for line in step_lines(&t.total, &named) {
            let _ = writeln!(o, "- {line}");
        }
        if t.streams.len() > 1 {
            for (name, st) in t.streams.iter().filter(|(_, st)| st.phases.len() > 1) {
                let _ = writeln!(
                    o,
                    "\nStream {name}:\n\n{}",
                    tailguard_loadgen::timeline::phase_table(st)
                );
            }
        } else {
            let _ = writeln!(
                o,
                "\n{}",
                tailguard_loadgen::timeline::phase_table(&t.total)
            );
        }
        let _ = writeln!(o, "{}", tailguard_loadgen::timeline::second_table(&t.total));
    }
    o
}

fn format_ms(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1000.0)
}

#[cfg(test)]
mod tests {

    #[test]
    fn per_seed_table_pairs_each_seed_with_the_first_conditions_same_seed() {
        let line = |p99: f64| super::SeedLine {
            p50: 0.1,
            p99,
            p999: 2.0 * p99,
            p100: 4.0 * p99,
        };
        // Seeds differ by 2x between them; the second condition is 10 % slower on each.
        let lines = vec![
            (
                "base".to_string(),
                vec![(1, line(1.0)), (2, line(2.0)), (3, line(1.5))],
            ),
            (
                "scraped".to_string(),
                vec![(2, line(2.2)), (1, line(1.1)), (3, line(1.65))],
            ),
        ];
        let table = super::per_seed_table(&lines);
        assert!(
            table.contains("| base | **median** | 0.10 | 1.50 | 3.00 | 6.00 |"),
            "{table}"
        );
        assert!(
            table.contains("| scraped | **median** | 0.10 | 1.65 | 3.30 | 6.60 |"),
            "{table}"
        );
        assert!(
            table.contains("| scraped | **ratio to first** | 1.00 | 1.10 | 1.10 | 1.10 |"),
            "{table}"
        );
        assert!(!table.contains("| base | **ratio"), "{table}");
        let ratios = super::ratio_table(&lines);
        assert!(
            ratios.contains("| scraped | 2 | 1.10 | 1.10 | 1.10 |"),
            "{ratios}"
        );
        assert!(
            ratios.contains("| scraped | **median of 3** | **1.10** | **1.10** | **1.10** |"),
            "{ratios}"
        );
        assert!(!ratios.contains("| base |"), "{ratios}");
        assert_eq!(super::median(vec![3.0, 1.0, 2.0, 10.0]), 2.5);
    }
}

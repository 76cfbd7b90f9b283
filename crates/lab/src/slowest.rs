//! Where each run's slowest requests fell relative to the scrapes: one line per run, and per
//! condition how many fell during a scrape or how soon after one, beside a control.
//!
//! A scraped run is placed against its own scrapes. An unscraped run has none, so it is
//! placed against the scrapes it would have had: the scraper's planned schedule
//! ([`planned_starts_ns`]: half an interval into the run, then one every interval) with the
//! median scrape duration of its paired scraped run (same round; the nearest scraped
//! condition after it in the scenario, else the nearest before). Host noise that ignores the
//! scrapes lands in each bucket in proportion to the bucket's share of the window, in both
//! kinds of run; an after-effect of the scrapes shows as a scraped run's excess in the
//! buckets right after a scrape.

use std::fmt::Write as _;
use std::time::Duration;

use tailguard_loadgen::report::Report;
use tailguard_loadgen::scrape::planned_starts_ns;
use tailguard_loadgen::slowest::{KEPT, Placement, ScrapeSpan, SlowRequest, place};

use crate::tables::median;

/// What one run leaves for this readout.
#[derive(Debug, Clone)]
pub(crate) struct SlowRun {
    /// The condition's index in the scenario.
    pub(crate) condition: usize,
    pub(crate) name: String,
    pub(crate) seed: u64,
    /// The condition's scrape interval, when it scrapes.
    pub(crate) every: Option<Duration>,
    pub(crate) warmup: Duration,
    pub(crate) duration: Duration,
    pub(crate) scrapes: Vec<ScrapeSpan>,
    pub(crate) slowest: Vec<SlowRequest>,
}

impl SlowRun {
    pub(crate) fn of(
        condition: usize,
        name: &str,
        seed: u64,
        every: Option<Duration>,
        r: &Report,
    ) -> SlowRun {
        SlowRun {
            condition,
            name: name.to_string(),
            seed,
            every,
            warmup: Duration::from_secs_f64(r.warmup_s.max(0.0)),
            duration: Duration::from_secs_f64(r.duration_s.max(0.0)),
            scrapes: r.scrapes.iter().map(|s| s.span()).collect(),
            slowest: r.slowest.clone(),
        }
    }

    fn scraped(&self) -> bool {
        self.every.is_some() && !self.scrapes.is_empty()
    }
}

/// The buckets, in table order: during a scrape, then by the time since the last scrape
/// ended, then none ended yet.
const BUCKETS: [&str; 5] = [
    "during a scrape",
    "0-250 ms after",
    "250 ms-1 s after",
    "later",
    "before the first",
];

fn bucket(p: Placement) -> usize {
    const MS: u64 = 1_000_000;
    match (p.overlaps_scrape, p.since_scrape_end_ns) {
        (true, _) => 0,
        (false, Some(ns)) if ns < 250 * MS => 1,
        (false, Some(ns)) if ns < 1_000 * MS => 2,
        (false, Some(_)) => 3,
        (false, None) => 4,
    }
}

/// One run's slowest requests placed against the scrapes it is read against.
struct Placed<'a> {
    run: &'a SlowRun,
    /// The scraped condition whose planned scrapes an unscraped run is read against.
    paired: Option<&'a str>,
    spans: Vec<ScrapeSpan>,
}

impl Placed<'_> {
    fn placements(&self) -> impl Iterator<Item = (&SlowRequest, Placement)> {
        self.run
            .slowest
            .iter()
            .map(|r| (r, place(r.intended_ns, r.latency_ns, &self.spans)))
    }

    /// How the window's time splits into the buckets: 10 000 evenly spaced instants, each
    /// placed as a request of no duration.
    fn window_shares(&self) -> [u64; 5] {
        const INSTANTS: u64 = 10_000;
        let mut counts = [0; 5];
        let step = self.run.duration.as_nanos() as u64 / INSTANTS;
        for i in 0..INSTANTS {
            counts[bucket(place(i * step + step / 2, 0, &self.spans))] += 1;
        }
        counts
    }
}

/// Each run with the scrapes it is read against; unscraped runs without a paired scraped run
/// are left out.
fn placed(runs: &[SlowRun]) -> Vec<Placed<'_>> {
    runs.iter()
        .filter_map(|run| {
            if run.scraped() {
                return Some(Placed {
                    run,
                    paired: None,
                    spans: run.scrapes.clone(),
                });
            }
            let same_round = || runs.iter().filter(|p| p.seed == run.seed && p.scraped());
            let pair = same_round()
                .filter(|p| p.condition > run.condition)
                .min_by_key(|p| p.condition)
                .or_else(|| {
                    same_round()
                        .filter(|p| p.condition < run.condition)
                        .max_by_key(|p| p.condition)
                })?;
            let every = pair.every?;
            let scrape_ns = median(
                pair.scrapes
                    .iter()
                    .map(|s| (s.end_ns - s.start_ns) as f64)
                    .collect(),
            ) as i64;
            let spans = planned_starts_ns(every, run.warmup, run.duration)
                .into_iter()
                .map(|start_ns| ScrapeSpan {
                    start_ns,
                    end_ns: start_ns + scrape_ns,
                })
                .collect();
            Some(Placed {
                run,
                paired: Some(&pair.name),
                spans,
            })
        })
        .collect()
}

/// `5.12ms@+1.420s`, `3.10ms@during`, `2.90ms@before-first`: a slow request's latency and
/// its time since the last scrape ended.
fn at(r: &SlowRequest, p: Placement) -> String {
    let latency = r.latency_ns as f64 / 1e6;
    match (p.overlaps_scrape, p.since_scrape_end_ns) {
        (true, _) => format!("{latency:.2}ms@during"),
        (false, Some(ns)) => format!("{latency:.2}ms@+{:.3}s", ns as f64 / 1e9),
        (false, None) => format!("{latency:.2}ms@before-first"),
    }
}

/// The readout, when a run had scrapes: each run's top 5 as `latency@time since the last
/// scrape ended`, then the bucket table over each run's slowest requests.
pub(crate) fn section(runs: &[SlowRun]) -> Option<String> {
    if !runs.iter().any(SlowRun::scraped) {
        return None;
    }
    let placed = placed(runs);
    let mut o = String::from(
        "Each run's 5 slowest requests, latency@time from the end of the last scrape to the intended send (unscraped runs: against the planned scrapes of the paired scraped run):\n\n",
    );
    for p in &placed {
        let top: Vec<String> = p.placements().take(5).map(|(r, at_)| at(r, at_)).collect();
        let _ = writeln!(
            o,
            "- `{}` seed {}: {}{}",
            p.run.name,
            p.run.seed,
            top.join(", "),
            p.paired
                .map(|name| format!(" (planned scrapes of `{name}`)"))
                .unwrap_or_default()
        );
    }
    let _ = write!(
        o,
        "\nWhere the runs' {KEPT} slowest requests fell, per condition: requests (their share), [the share of the window's time in that bucket, what noise that ignores the scrapes would give]; unscraped runs against the planned scrapes of the paired scraped run:\n\n| condition | against | runs | requests | {} |\n|---|---|---|---|{}\n",
        BUCKETS.join(" | "),
        "---|".repeat(BUCKETS.len())
    );
    let mut conditions: Vec<usize> = placed.iter().map(|p| p.run.condition).collect();
    conditions.sort_unstable();
    conditions.dedup();
    for c in conditions {
        let runs: Vec<&Placed> = placed.iter().filter(|p| p.run.condition == c).collect();
        let (mut requests, mut window) = ([0u64; 5], [0u64; 5]);
        for p in &runs {
            for (_, at_) in p.placements() {
                requests[bucket(at_)] += 1;
            }
            for (w, n) in window.iter_mut().zip(p.window_shares()) {
                *w += n;
            }
        }
        let mut against: Vec<String> = runs
            .iter()
            .map(|p| match p.paired {
                None => "own scrapes".to_string(),
                Some(name) => format!("planned, as `{name}`"),
            })
            .collect();
        against.dedup();
        let total: u64 = requests.iter().sum();
        let window_total: u64 = window.iter().sum();
        let share = |n: u64, of: u64| n as f64 * 100.0 / of.max(1) as f64;
        let cells: Vec<String> = requests
            .iter()
            .zip(window)
            .map(|(&n, w)| {
                format!(
                    "{n} ({:.0} %) [{:.0} %]",
                    share(n, total),
                    share(w, window_total)
                )
            })
            .collect();
        let _ = writeln!(
            o,
            "| {} | {} | {} | {total} | {} |",
            runs[0].run.name,
            against.join(", "),
            runs.len(),
            cells.join(" | ")
        );
    }
    Some(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn slow(latency_ms: u64, intended_ms: u64) -> SlowRequest {
        SlowRequest {
            intended_ns: intended_ms * MS,
            latency_ns: latency_ms * MS,
            status: 200,
            error: None,
            connection: 0,
            since_scrape_end_ns: None,
            overlaps_scrape: false,
        }
    }

    fn run(
        condition: usize,
        seed: u64,
        scrapes: &[(i64, i64)],
        slowest: Vec<SlowRequest>,
    ) -> SlowRun {
        SlowRun {
            condition,
            name: format!("c{condition}"),
            seed,
            every: (!scrapes.is_empty()).then_some(Duration::from_secs(5)),
            warmup: Duration::from_secs(5),
            duration: Duration::from_secs(20),
            scrapes: scrapes
                .iter()
                .map(|&(start, end)| ScrapeSpan {
                    start_ns: start * MS as i64,
                    end_ns: end * MS as i64,
                })
                .collect(),
            slowest,
        }
    }

    #[test]
    fn buckets_split_at_250_ms_and_1_s_after_a_scrape_ended() {
        let p = |overlaps_scrape, since_ms: Option<u64>| Placement {
            overlaps_scrape,
            since_scrape_end_ns: since_ms.map(|ms| ms * MS),
        };
        assert_eq!(bucket(p(true, Some(10))), 0);
        assert_eq!(bucket(p(true, None)), 0);
        assert_eq!(bucket(p(false, Some(0))), 1);
        assert_eq!(bucket(p(false, Some(249))), 1);
        assert_eq!(bucket(p(false, Some(250))), 2);
        assert_eq!(bucket(p(false, Some(999))), 2);
        assert_eq!(bucket(p(false, Some(1_000))), 3);
        assert_eq!(bucket(p(false, None)), 4);
    }

    #[test]
    fn without_a_scraped_run_there_is_no_readout() {
        assert_eq!(section(&[run(0, 1, &[], vec![slow(5, 100)])]), None);
    }

    /// Round 1 of a scenario `unscraped, scraped`: the scraped run's scrapes at -2.5, 2.5,
    /// 7.5 and 12.5 s of its window (5 s warmup, every 5 s) last 100 ms (the median; one
    /// 400 ms); the unscraped run is read against the planned starts (-2.5 to 17.5 s), 100 ms
    /// each.
    #[test]
    fn an_unscraped_run_is_read_against_the_planned_scrapes_of_its_pair() {
        let scrapes = [
            (-2_500, -2_400),
            (2_500, 2_600),
            (7_500, 7_900),
            (12_500, 12_600),
        ];
        let runs = [
            run(
                0,
                1,
                &[],
                vec![
                    slow(9, 2_550),  // during the planned 2.5 s scrape
                    slow(8, 7_700),  // 7.5 s + 100 ms: ended 100 ms before
                    slow(7, 100),    // 2.5 s after the warmup's planned scrape
                    slow(6, 10_000), // 2.4 s after
                ],
            ),
            run(
                1,
                1,
                &scrapes,
                vec![
                    slow(11, 7_700), // during the 400 ms scrape
                    slow(10, 8_000), // 100 ms after it ended
                    slow(4, 2_900),  // 300 ms after the 2.5 s one ended
                ],
            ),
            // Another round's unscraped run with no scraped run in its round: left out.
            run(0, 2, &[], vec![slow(50, 1_000)]),
        ];
        let placed = placed(&runs);
        assert_eq!(placed.len(), 2);
        assert_eq!(placed[0].paired, Some("c1"));
        assert_eq!(
            placed[0].spans,
            [-2_500, 2_500, 7_500, 12_500, 17_500].map(|ms: i64| ScrapeSpan {
                start_ns: ms * MS as i64,
                end_ns: (ms + 100) * MS as i64
            })
        );
        let text = section(&runs).unwrap();
        assert!(
            text.contains(
                "- `c0` seed 1: 9.00ms@during, 8.00ms@+0.100s, 7.00ms@+2.500s, 6.00ms@+2.400s (planned scrapes of `c1`)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("- `c1` seed 1: 11.00ms@during, 10.00ms@+0.100s, 4.00ms@+0.300s\n"),
            "{text}"
        );
        assert!(!text.contains("seed 2"), "{text}");
        // c0: 1 during, 1 within 250 ms, 2 later; the window is 2 % planned scrapes (4 of
        // 100 ms in 20 s), 5 % each 250 ms after, 15 % each 250 ms-1 s after, 78 % later.
        assert!(
            text.contains(
                "| c0 | planned, as `c1` | 1 | 4 | 1 (25 %) [2 %] | 1 (25 %) [5 %] | 0 (0 %) [15 %] | 2 (50 %) [78 %] | 0 (0 %) [0 %] |"
            ),
            "{text}"
        );
        // c1's own scrapes: 600 ms of its 20 s window (3 %), 3 x 250 ms after (4 %).
        assert!(
            text.contains(
                "| c1 | own scrapes | 1 | 3 | 1 (33 %) [3 %] | 1 (33 %) [4 %] | 1 (33 %) ["
            ),
            "{text}"
        );
    }

    #[test]
    fn the_pair_is_the_nearest_scraped_condition_after_else_before() {
        let s = [(2_500, 2_600)];
        let runs = [
            run(0, 1, &[], vec![]),
            run(1, 1, &s, vec![]),
            run(2, 1, &[], vec![]),
            run(3, 1, &s, vec![]),
            run(4, 1, &[], vec![]),
        ];
        let pairs: Vec<Option<&str>> = placed(&runs).iter().map(|p| p.paired).collect();
        assert_eq!(pairs, [Some("c1"), None, Some("c3"), None, Some("c3")]);
    }
}

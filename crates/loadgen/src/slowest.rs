//! A run's slowest requests: each generator thread keeps its [`KEPT`] slowest, the run keeps
//! the [`KEPT`] slowest of all, and each is placed against the scrapes (during one, or how
//! long after the last one ended), so a report says *when* its tail happened.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

/// How many slowest requests a run keeps. 32 of a 2000 req/s minute (120 000 requests) is
/// everything above P99.97: the requests that set P99.99 and P100, few enough that a report
/// stays small and a thread's list is a scan of one cache-friendly array.
pub const KEPT: usize = 32;

/// One of a run's slowest requests, with where it fell relative to the run's scrapes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlowRequest {
    /// Intended send time, nanoseconds from the start of the measured window (the same origin
    /// as a scrape's `start_s`).
    pub intended_ns: u64,
    /// Nanoseconds from the intended send time to the response's last byte (to the failure,
    /// for a failed request): the latency the histogram recorded.
    pub latency_ns: u64,
    /// HTTP status, 0 when the request failed before a response.
    pub status: u16,
    /// Why it failed (`timeout`, `closed`, `connect`, ...), when it did.
    pub error: Option<String>,
    /// The connection it was sent on, 0 to the stream's connections - 1 (a reconnect keeps
    /// the number).
    pub connection: usize,
    /// Nanoseconds from the end of the last scrape that had ended by the intended send time
    /// to that time; `None` when the run had no scrapes or none had ended yet.
    pub since_scrape_end_ns: Option<u64>,
    /// Whether the request's lifetime `[intended, intended + latency]` intersected a scrape's
    /// `[start, end]`: the rule by which a response counts in `latency_during_scrape`
    /// (`false` in a run without scrapes).
    pub overlaps_scrape: bool,
}

/// A scrape's lifetime, nanoseconds from the start of the measured window (negative during
/// the warmup).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScrapeSpan {
    /// When the scrape's request was sent.
    pub start_ns: i64,
    /// When its body's last byte arrived (or it failed).
    pub end_ns: i64,
}

/// Where one request fell relative to the scrapes: the two placement fields of
/// [`SlowRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Placement {
    /// See [`SlowRequest::since_scrape_end_ns`].
    pub since_scrape_end_ns: Option<u64>,
    /// See [`SlowRequest::overlaps_scrape`].
    pub overlaps_scrape: bool,
}

/// Places a request intended at `intended_ns` (from the measured window's start) that took
/// `latency_ns` against `scrapes` (in any order). A scrape that ended exactly at the intended
/// time counts as ended (0 ns before) and as overlapping, as `ScrapeClock::overlaps` counts
/// it.
pub fn place(intended_ns: u64, latency_ns: u64, scrapes: &[ScrapeSpan]) -> Placement {
    let begin = i128::from(intended_ns);
    let done = begin + i128::from(latency_ns);
    let mut placement = Placement::default();
    for s in scrapes {
        let (start, end) = (i128::from(s.start_ns), i128::from(s.end_ns));
        placement.overlaps_scrape |= start <= done && end >= begin;
        if end <= begin {
            let since = u64::try_from(begin - end).unwrap_or(u64::MAX);
            placement.since_scrape_end_ns = Some(
                placement
                    .since_scrape_end_ns
                    .map_or(since, |seen| seen.min(since)),
            );
        }
    }
    placement
}

/// How a kept request ended: plain data, so keeping one allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Outcome {
    Status(u16),
    Error(&'static str),
}

/// A request as a generator thread keeps it. Ordered by latency first (the field order), so
/// the heap's least element is the K-th slowest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Kept {
    pub(crate) latency_ns: u64,
    /// From the measured window's start.
    pub(crate) intended_ns: u64,
    pub(crate) connection: usize,
    pub(crate) outcome: Outcome,
}

/// A thread's [`KEPT`] slowest requests so far: a min-heap whose top is the K-th slowest, so
/// a request that is not among them costs one compare; one that is costs `log K` moves. The
/// heap's room is reserved up front: keeping never allocates.
#[derive(Debug)]
pub(crate) struct Slowest {
    heap: BinaryHeap<Reverse<Kept>>,
}

impl Default for Slowest {
    fn default() -> Self {
        Self {
            heap: BinaryHeap::with_capacity(KEPT),
        }
    }
}

impl Slowest {
    /// Keeps `request` if it is slower than the K-th slowest so far.
    pub(crate) fn offer(&mut self, request: Kept) {
        if self.heap.len() < KEPT {
            self.heap.push(Reverse(request));
        } else if let Some(mut least) = self.heap.peek_mut()
            && request > least.0
        {
            *least = Reverse(request);
        }
    }

    /// Adds another thread's list: the result keeps the slowest of both.
    pub(crate) fn add(&mut self, other: Slowest) {
        for Reverse(request) in other.heap {
            self.offer(request);
        }
    }

    /// The kept requests, slowest first (ties: the earlier intended first), each placed
    /// against `scrapes`.
    pub(crate) fn report(self, scrapes: &[ScrapeSpan]) -> Vec<SlowRequest> {
        let mut kept: Vec<Kept> = self.heap.into_iter().map(|Reverse(k)| k).collect();
        kept.sort_by(|a, b| {
            b.latency_ns
                .cmp(&a.latency_ns)
                .then(a.intended_ns.cmp(&b.intended_ns))
        });
        kept.into_iter()
            .map(|k| {
                let at = place(k.intended_ns, k.latency_ns, scrapes);
                let (status, error) = match k.outcome {
                    Outcome::Status(code) => (code, None),
                    Outcome::Error(kind) => (0, Some(kind.to_string())),
                };
                SlowRequest {
                    intended_ns: k.intended_ns,
                    latency_ns: k.latency_ns,
                    status,
                    error,
                    connection: k.connection,
                    since_scrape_end_ns: at.since_scrape_end_ns,
                    overlaps_scrape: at.overlaps_scrape,
                }
            })
            .collect()
    }
}

/// Adds `other` into `into` and keeps the [`KEPT`] slowest, slowest first: for reports merged
/// over streams (one clock) or runs (each request keeps its own run's times and placement).
pub fn keep_slowest(into: &mut Vec<SlowRequest>, other: &[SlowRequest]) {
    into.extend(other.iter().cloned());
    into.sort_by(|a, b| {
        b.latency_ns
            .cmp(&a.latency_ns)
            .then(a.intended_ns.cmp(&b.intended_ns))
    });
    into.truncate(KEPT);
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn span(start_ms: i64, end_ms: i64) -> ScrapeSpan {
        ScrapeSpan {
            start_ns: start_ms * MS as i64,
            end_ns: end_ms * MS as i64,
        }
    }

    #[test]
    fn without_scrapes_a_request_is_nowhere_near_one() {
        assert_eq!(place(5_000 * MS, 10 * MS, &[]), Placement::default());
    }

    #[test]
    fn a_request_before_the_first_scrape_has_no_scrape_end_behind_it() {
        let scrapes = [span(2_500, 2_600), span(7_500, 7_600)];
        assert_eq!(
            place(1_000 * MS, 5 * MS, &scrapes),
            Placement {
                since_scrape_end_ns: None,
                overlaps_scrape: false
            }
        );
        // One that runs into the first scrape overlaps it, still with none ended before.
        assert_eq!(
            place(2_400 * MS, 150 * MS, &scrapes),
            Placement {
                since_scrape_end_ns: None,
                overlaps_scrape: true
            }
        );
    }

    #[test]
    fn a_request_after_scrapes_counts_from_the_last_one_that_ended() {
        // Out of order on purpose: the nearest end wins, not the last in the list.
        let scrapes = [span(7_500, 7_600), span(2_500, 2_600), span(12_500, 12_700)];
        assert_eq!(
            place(9_020 * MS, 3 * MS, &scrapes),
            Placement {
                since_scrape_end_ns: Some(1_420 * MS),
                overlaps_scrape: false
            }
        );
        // A scrape during the warmup (negative start) is a scrape like any other.
        assert_eq!(
            place(100 * MS, MS, &[span(-2_500, -2_400)]).since_scrape_end_ns,
            Some(2_500 * MS)
        );
    }

    #[test]
    fn a_request_spanning_a_scrapes_end_overlaps_it_and_counts_from_the_previous_end() {
        let scrapes = [span(2_500, 2_600), span(7_500, 7_600)];
        // Intended during the second scrape, done after it ended.
        assert_eq!(
            place(7_590 * MS, 20 * MS, &scrapes),
            Placement {
                since_scrape_end_ns: Some(4_990 * MS),
                overlaps_scrape: true
            }
        );
        // Intended exactly as the scrape ended: ended 0 ns before, and overlapping (the
        // generator's clock counts `last_end >= intended`).
        assert_eq!(
            place(7_600 * MS, MS, &scrapes),
            Placement {
                since_scrape_end_ns: Some(0),
                overlaps_scrape: true
            }
        );
        // One nanosecond later it no longer overlaps.
        assert_eq!(
            place(7_600 * MS + 1, MS, &scrapes),
            Placement {
                since_scrape_end_ns: Some(1),
                overlaps_scrape: false
            }
        );
        // Done exactly as a scrape started: overlapping too.
        assert!(place(7_400 * MS, 100 * MS, &scrapes).overlaps_scrape);
        assert!(!place(7_400 * MS, 100 * MS - 1, &scrapes).overlaps_scrape);
    }

    fn kept(latency_ms: u64, intended_ms: u64) -> Kept {
        Kept {
            latency_ns: latency_ms * MS,
            intended_ns: intended_ms * MS,
            connection: 0,
            outcome: Outcome::Status(200),
        }
    }

    #[test]
    fn a_thread_keeps_its_k_slowest_and_threads_merge_into_the_runs_k_slowest() {
        let (mut a, mut b) = (Slowest::default(), Slowest::default());
        // Thread a: latencies 1..=100 ms; thread b: timeouts of 0, 3, ..., 117 ms: they interleave.
        for i in 1..=100 {
            a.offer(kept(i, i));
        }
        for i in 0..40 {
            b.offer(Kept {
                outcome: Outcome::Error("timeout"),
                ..kept(i * 3, 1_000 + i)
            });
        }
        assert_eq!(a.heap.capacity(), KEPT, "keeping never grows the heap");
        a.add(b);
        let report = a.report(&[span(500, 600)]);
        assert_eq!(report.len(), KEPT);
        let latencies: Vec<u64> = report.iter().map(|r| r.latency_ns / MS).collect();
        // The 32 slowest of {1..=100} and {0, 3, ..., 117}: 117 down to 100, then both lists.
        let mut expected: Vec<u64> = (1..=100).chain((0..40).map(|i| i * 3)).collect();
        expected.sort_by(|x, y| y.cmp(x));
        expected.truncate(KEPT);
        assert_eq!(latencies, expected);
        assert_eq!(report[0].error.as_deref(), Some("timeout"));
        assert_eq!(report[0].status, 0);
        // Thread a's request intended at 100 ms, 100 ms long: before the scrape, not in it.
        let hundred = report
            .iter()
            .find(|r| r.status == 200 && r.latency_ns == 100 * MS)
            .expect("100 ms is among the slowest");
        assert_eq!(
            (hundred.since_scrape_end_ns, hundred.overlaps_scrape),
            (None, false)
        );
    }

    #[test]
    fn merged_lists_keep_the_k_slowest_slowest_first() {
        let mut into = Slowest::default();
        for i in 0..20 {
            into.offer(kept(i, i));
        }
        let mut into = into.report(&[]);
        let mut other = Slowest::default();
        for i in 10..30 {
            other.offer(kept(i, 100 + i));
        }
        keep_slowest(&mut into, &other.report(&[]));
        assert_eq!(into.len(), KEPT);
        assert_eq!(into[0].latency_ns, 29 * MS);
        // Equal latencies: the earlier intended first.
        assert_eq!(
            (into[10].latency_ns, into[10].intended_ns),
            (19 * MS, 19 * MS)
        );
        assert_eq!(into[11].intended_ns, 119 * MS);
        assert!(into.windows(2).all(|w| w[0].latency_ns >= w[1].latency_ns));
    }
}

//! The report of one load run: what was asked, what was achieved, the latency distributions
//! (all requests and those that overlapped a scrape), statuses, errors, scrapes and the
//! slowest requests; printed in wrk2's layout and saved as JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::latency::{Latency, WRK2_PERCENTILES, format_us};
use crate::slowest::{ScrapeSpan, SlowRequest};

/// One scrape of a metrics endpoint made during the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scrape {
    /// Start, seconds from the start of the measured run (negative during warmup).
    pub start_s: f64,
    /// Time to the last byte of the body, milliseconds.
    pub duration_ms: f64,
    /// Body bytes received (as sent on the wire: compressed if the exporter compressed).
    pub bytes: u64,
    /// HTTP status, 0 when the scrape failed before a response.
    pub status: u16,
    /// Why it failed, when it did.
    pub error: Option<String>,
}

impl Scrape {
    /// The scrape's lifetime in nanoseconds from the start of the measured window, as the
    /// slowest requests are placed against it.
    pub fn span(&self) -> ScrapeSpan {
        let start_ns = (self.start_s * 1e9).round() as i64;
        ScrapeSpan {
            start_ns,
            end_ns: start_ns + (self.duration_ms * 1e6).round() as i64,
        }
    }
}

/// Everything one run of the generator measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Target URL.
    pub url: String,
    /// HTTP method.
    pub method: String,
    /// Requested rate, requests per second.
    pub requested_rate: f64,
    /// Poisson arrivals instead of a constant interval.
    pub poisson: bool,
    /// Seed of the Poisson schedule.
    pub seed: u64,
    /// Measured duration (after warmup), seconds.
    pub duration_s: f64,
    /// Warmup before measuring, seconds.
    pub warmup_s: f64,
    /// Connections kept open.
    pub connections: usize,
    /// Generator threads.
    pub threads: usize,
    /// Requests whose intended time fell in the measured window.
    pub sent: u64,
    /// Responses received for them (any status).
    pub completed: u64,
    /// Responses completed inside the measured window, per second.
    pub achieved_rate: f64,
    /// Response body bytes read.
    pub bytes_read: u64,
    /// Requests whose intended time came while every connection was busy (queued in the
    /// generator, still timed from their intended time).
    pub queued: u64,
    /// Largest number of requests waiting for a connection at once.
    pub max_queue: u64,
    /// Responses by status code.
    pub status: BTreeMap<u16, u64>,
    /// Failed requests by kind (`connect`, `io`, `timeout`, ...).
    pub errors: BTreeMap<String, u64>,
    /// Latency of every completed request, from its intended send time.
    pub latency: Latency,
    /// Latency of the responses with a status below 400 (the admitted ones when shedding).
    pub latency_ok: Latency,
    /// How late each request was picked up by a connection, from its intended time: the
    /// generator's own timer and scheduling lateness, plus the wait for a free connection.
    pub generator_lag: Latency,
    /// Latency measured from when the dispatcher released each request (found it due), not
    /// from its intended time: what `oha -q --latency-correction` reports. The difference to
    /// `latency` is the generator's own timer lateness; kept for comparing with such tools.
    pub latency_from_release: Latency,
    /// Latency of the requests whose lifetime overlapped a scrape.
    pub latency_during_scrape: Latency,
    /// Scrapes made during the run.
    pub scrapes: Vec<Scrape>,
    /// The run's slowest requests (at most [`KEPT`](crate::slowest::KEPT)), slowest first, each with its intended
    /// time and where it fell relative to the scrapes: when the tail happened. Only requests
    /// intended inside the measured window, as in `latency`; failed ones too, timed to their
    /// failure. Absent from reports written before it existed.
    #[serde(default)]
    pub slowest: Vec<SlowRequest>,
    /// Every second and phase of the measured window (absent from reports written before
    /// the lab had timelines).
    #[serde(default)]
    pub timeline: crate::timeline::Timeline,
    /// Answers per key and wall-clock window, when the run rotated a header over many keys
    /// (`--keys`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<crate::keys::KeyCounts>,
}

impl Report {
    /// Percentile in milliseconds of all requests.
    pub fn percentile_ms(&self, p: f64) -> f64 {
        self.latency.percentile_us(p) as f64 / 1000.0
    }

    /// Requests that got no response.
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Responses with a 2xx/3xx status.
    pub fn ok_count(&self) -> u64 {
        self.status
            .iter()
            .filter(|(code, _)| **code < 400)
            .map(|(_, n)| n)
            .sum()
    }

    /// JSON text of the report.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report always serializes")
    }

    /// Reads a report back from its JSON text.
    pub fn from_json(text: &str) -> Result<Self, crate::LoadError> {
        serde_json::from_str(text).map_err(|e| crate::LoadError::Report(e.to_string()))
    }

    /// The report in wrk2's layout (latency distribution, detailed spectrum, totals), followed
    /// by statuses, errors, queueing and scrapes.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "Running {} test @ {}", secs(self.duration_s), self.url);
        let _ = writeln!(
            o,
            "  {} threads and {} connections, {} {} req/s{}",
            self.threads,
            self.connections,
            if self.poisson {
                "poisson"
            } else {
                "constant rate"
            },
            self.requested_rate,
            if self.warmup_s > 0.0 {
                format!(", warmup {}", secs(self.warmup_s))
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            o,
            "  Latency Distribution (HdrHistogram - Recorded Latency)"
        );
        render_distribution(&mut o, &self.latency);
        let _ = writeln!(o);
        let _ = writeln!(o, "  Detailed Percentile spectrum:");
        o.push_str(&crate::hgrm::render(&self.latency));
        let _ = writeln!(
            o,
            "----------------------------------------------------------"
        );
        let _ = writeln!(
            o,
            "  {} requests in {}, {} read",
            self.completed,
            secs(self.duration_s),
            bytes(self.bytes_read)
        );
        let _ = writeln!(
            o,
            "Requests/sec: {:>9.2} (requested {:.2}, {:.1}%)",
            self.achieved_rate,
            self.requested_rate,
            if self.requested_rate > 0.0 {
                self.achieved_rate / self.requested_rate * 100.0
            } else {
                0.0
            }
        );
        let statuses: Vec<String> = self
            .status
            .iter()
            .map(|(c, n)| format!("{c}: {n}"))
            .collect();
        let _ = writeln!(o, "Status codes: {}", none_if_empty(&statuses.join(", ")));
        let errors: Vec<String> = self
            .errors
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let _ = writeln!(o, "Errors: {}", none_if_empty(&errors.join(", ")));
        let _ = writeln!(
            o,
            "Waited for a free connection: {} requests (max {} queued), timed from their intended send time",
            self.queued, self.max_queue
        );
        let _ = writeln!(
            o,
            "Generator lag (picked up by a connection - intended): P50 {}, P99 {}, max {}",
            format_us(self.generator_lag.percentile_us(50.0) as f64),
            format_us(self.generator_lag.percentile_us(99.0) as f64),
            format_us(self.generator_lag.max_us() as f64)
        );
        if self.latency.saturated() > 0 {
            let _ = writeln!(
                o,
                "Latencies above 60 s (recorded as 60 s): {}",
                self.latency.saturated()
            );
        }
        if !self.scrapes.is_empty() {
            let mut durations = Latency::new();
            let mut failed = 0;
            let mut total_bytes = 0;
            for s in &self.scrapes {
                durations.record_us((s.duration_ms * 1000.0) as u64);
                total_bytes += s.bytes;
                if s.error.is_some() || !(200..300).contains(&s.status) {
                    failed += 1;
                }
            }
            let _ = writeln!(
                o,
                "Scrapes: {} ({} failed), duration P50 {} max {}, {} per scrape",
                self.scrapes.len(),
                failed,
                format_us(durations.percentile_us(50.0) as f64),
                format_us(durations.max_us() as f64),
                bytes(total_bytes / self.scrapes.len() as u64)
            );
            for s in &self.scrapes {
                let _ = writeln!(
                    o,
                    "  scrape at {:>8.3}s: {:>9.3} ms, {:>10} bytes, status {}{}",
                    s.start_s,
                    s.duration_ms,
                    s.bytes,
                    s.status,
                    s.error
                        .as_deref()
                        .map(|e| format!(", error: {e}"))
                        .unwrap_or_default()
                );
            }
            let _ = writeln!(
                o,
                "  Requests that overlapped a scrape: {} of {}",
                self.latency_during_scrape.count(),
                self.latency.count()
            );
            render_distribution(&mut o, &self.latency_during_scrape);
        }
        if !self.slowest.is_empty() {
            let shown = self.slowest.len().min(5);
            let _ = writeln!(
                o,
                "Slowest requests ({shown} of the {} kept; time of the intended send in the measured window):",
                self.slowest.len()
            );
            for r in &self.slowest[..shown] {
                let _ = writeln!(o, "  {}", slow_line(r, !self.scrapes.is_empty()));
            }
        }
        if let Some(keys) = &self.keys {
            o.push_str(&keys.render());
        }
        o
    }
}

/// `5.12 ms at 23.417 s, connection 3, status 200 (1.42 s after a scrape ended)`.
fn slow_line(r: &SlowRequest, had_scrapes: bool) -> String {
    let outcome = match &r.error {
        Some(kind) => kind.clone(),
        None => format!("status {}", r.status),
    };
    let placement = if !had_scrapes {
        String::new()
    } else if r.overlaps_scrape {
        " (during a scrape)".to_string()
    } else {
        match r.since_scrape_end_ns {
            Some(ns) => format!(" ({} after a scrape ended)", gap(ns)),
            None => " (before the first scrape ended)".to_string(),
        }
    };
    format!(
        "{:.2} ms at {:.3} s, connection {}, {outcome}{placement}",
        r.latency_ns as f64 / 1e6,
        r.intended_ns as f64 / 1e9,
        r.connection
    )
}

/// A time since a scrape: `420 ms` under a second, else `1.42 s`.
pub fn gap(ns: u64) -> String {
    if ns < 1_000_000_000 {
        format!("{:.0} ms", ns as f64 / 1e6)
    } else {
        format!("{:.2} s", ns as f64 / 1e9)
    }
}

/// Appends wrk2's eight-line block: ` 50.000%    1.23ms`.
pub fn render_distribution(o: &mut String, latency: &Latency) {
    for p in WRK2_PERCENTILES {
        let _ = writeln!(
            o,
            " {:>7.3}% {:>9}",
            p,
            format_us(latency.percentile_us(p) as f64)
        );
    }
}

fn secs(s: f64) -> String {
    if (s - s.round()).abs() < 1e-9 {
        format!("{}s", s.round())
    } else {
        format!("{s:.2}s")
    }
}

fn bytes(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2}GB", b as f64 / (1u64 << 30) as f64)
    } else if b >= 1 << 20 {
        format!("{:.2}MB", b as f64 / (1u64 << 20) as f64)
    } else if b >= 1 << 10 {
        format!("{:.2}KB", b as f64 / 1024.0)
    } else {
        format!("{b}B")
    }
}

fn none_if_empty(s: &str) -> &str {
    if s.is_empty() { "none" } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_request_says_where_it_fell_relative_to_the_scrapes() {
        let r = SlowRequest {
            intended_ns: 23_417_000_000,
            latency_ns: 5_120_000,
            status: 200,
            error: None,
            connection: 3,
            since_scrape_end_ns: Some(1_420_000_000),
            overlaps_scrape: false,
        };
        assert_eq!(
            slow_line(&r, true),
            "5.12 ms at 23.417 s, connection 3, status 200 (1.42 s after a scrape ended)"
        );
        assert_eq!(
            slow_line(&r, false),
            "5.12 ms at 23.417 s, connection 3, status 200"
        );
        let during = SlowRequest {
            overlaps_scrape: true,
            ..r.clone()
        };
        assert!(slow_line(&during, true).ends_with(" (during a scrape)"));
        let early = SlowRequest {
            since_scrape_end_ns: None,
            status: 0,
            error: Some("timeout".into()),
            ..r.clone()
        };
        assert_eq!(
            slow_line(&early, true),
            "5.12 ms at 23.417 s, connection 3, timeout (before the first scrape ended)"
        );
        assert_eq!(gap(180_400_000), "180 ms");
    }

    #[test]
    fn a_scrape_spans_its_start_and_duration_in_window_nanoseconds() {
        let s = Scrape {
            start_s: -0.25,
            duration_ms: 1.5,
            bytes: 0,
            status: 200,
            error: None,
        };
        assert_eq!(
            s.span(),
            ScrapeSpan {
                start_ns: -250_000_000,
                end_ns: -248_500_000
            }
        );
    }
}

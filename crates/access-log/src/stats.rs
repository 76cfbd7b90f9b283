//! The log's own counters: what was written, dropped and failed, readable as [`Stats`] at
//! any time and exported through `tailguard-metrics` when a registry is given.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tailguard_metrics::{Counter, Family, FloatGauge, Registry};

use crate::error::Error;

/// Counters shared by the writer and, for drops only, the serving threads.
///
/// The serving threads touch `dropped` alone, and only when a line is dropped, so a
/// healthy log writes no shared cache line from the request path. `dropped` sits on its
/// own cache line so the writer's updates never bounce it; its exported twin is a
/// per-thread-sharded counter.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    dropped: Padded,
    lines_written: AtomicU64,
    bytes_written: AtomicU64,
    write_errors: AtomicU64,
    flushes: AtomicU64,
    reopens: AtomicU64,
    lost_lines: AtomicU64,
    lag_us: AtomicU64,
    exported: Option<LogMetrics>,
}

/// An atomic alone on a 128-byte line (two 64-byte lines: adjacent-line prefetch).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded(AtomicU64);

impl Counters {
    pub(crate) fn new(exported: Option<LogMetrics>) -> Self {
        Self {
            exported,
            ..Self::default()
        }
    }

    pub(crate) fn dropped(&self, lines: u64) {
        self.dropped.0.fetch_add(lines, Relaxed);
        if let Some(m) = &self.exported {
            m.dropped_lines.add(lines);
        }
    }

    pub(crate) fn dropped_total(&self) -> u64 {
        self.dropped.0.load(Relaxed)
    }

    pub(crate) fn written(&self, lines: u64, bytes: u64, lag: Duration) {
        self.lines_written.fetch_add(lines, Relaxed);
        self.bytes_written.fetch_add(bytes, Relaxed);
        self.flushes.fetch_add(1, Relaxed);
        self.lag_us
            .store(u64::try_from(lag.as_micros()).unwrap_or(u64::MAX), Relaxed);
        if let Some(m) = &self.exported {
            m.lines_written.add(lines);
            m.bytes_written.add(bytes);
            m.flushes.inc();
            m.writer_lag.set(lag.as_secs_f64());
        }
    }

    /// Bytes of a "dropped N lines" note: bytes, but not request lines.
    pub(crate) fn note_written(&self, bytes: u64) {
        self.bytes_written.fetch_add(bytes, Relaxed);
        if let Some(m) = &self.exported {
            m.bytes_written.add(bytes);
        }
    }

    pub(crate) fn write_error(&self) {
        self.write_errors.fetch_add(1, Relaxed);
        if let Some(m) = &self.exported {
            m.write_errors.inc();
        }
    }

    pub(crate) fn reopened(&self) {
        self.reopens.fetch_add(1, Relaxed);
        if let Some(m) = &self.exported {
            m.reopens.inc();
        }
    }

    pub(crate) fn lost(&self, lines: u64) {
        self.lost_lines.fetch_add(lines, Relaxed);
        if let Some(m) = &self.exported {
            m.lost_lines.add(lines);
        }
    }

    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            lines_written: self.lines_written.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
            dropped_lines: self.dropped.0.load(Relaxed),
            write_errors: self.write_errors.load(Relaxed),
            flushes: self.flushes.load(Relaxed),
            reopens: self.reopens.load(Relaxed),
            lost_lines: self.lost_lines.load(Relaxed),
            writer_lag: Duration::from_micros(self.lag_us.load(Relaxed)),
        }
    }
}

/// A snapshot of an access log's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Request lines the writer has handed to the operating system (the "dropped N
    /// lines" records are not counted).
    pub lines_written: u64,
    /// Bytes handed to the operating system.
    pub bytes_written: u64,
    /// Lines dropped because no buffer was free (`on_full = "drop"`) or the log was
    /// already shut down.
    pub dropped_lines: u64,
    /// Failed `write`/`fsync`/reopen calls.
    pub write_errors: u64,
    /// Buffers written (full ones and idle ones collected on the flush interval).
    pub flushes: u64,
    /// Successful reopens of the file.
    pub reopens: u64,
    /// Lines still failing to write when the log shut down.
    pub lost_lines: u64,
    /// How long the last written buffer waited between leaving its thread and its write.
    pub writer_lag: Duration,
}

/// The access-log metric families of one registry, labelled by log name. Register once;
/// take one [`LogMetrics`] per log with [`Metrics::log`].
///
/// | name | type | meaning |
/// |---|---|---|
/// | `tailguard_access_log_lines_written_total` | counter | request lines written |
/// | `tailguard_access_log_bytes_written_total` | counter | bytes written |
/// | `tailguard_access_log_dropped_lines_total` | counter | lines dropped (pool empty, or after shutdown) |
/// | `tailguard_access_log_write_errors_total` | counter | failed write, fsync or reopen calls |
/// | `tailguard_access_log_flushes_total` | counter | buffers written |
/// | `tailguard_access_log_reopens_total` | counter | reopens of the file |
/// | `tailguard_access_log_lost_lines_total` | counter | lines still failing at shutdown |
/// | `tailguard_access_log_writer_lag_seconds` | gauge | wait of the last buffer before its write |
#[derive(Debug, Clone)]
pub struct Metrics {
    lines_written: Family<Counter>,
    bytes_written: Family<Counter>,
    dropped_lines: Family<Counter>,
    write_errors: Family<Counter>,
    flushes: Family<Counter>,
    reopens: Family<Counter>,
    lost_lines: Family<Counter>,
    writer_lag: Family<FloatGauge>,
}

/// One log's metric handles (label `log`), resolved once when the log starts.
#[derive(Debug, Clone)]
pub struct LogMetrics {
    lines_written: Counter,
    bytes_written: Counter,
    dropped_lines: Counter,
    write_errors: Counter,
    flushes: Counter,
    reopens: Counter,
    lost_lines: Counter,
    writer_lag: FloatGauge,
}

impl Metrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, Error> {
        let c = |name: &str, help: &str| registry.counter(name, help, &["log"]);
        Ok(Self {
            lines_written: c(
                "tailguard_access_log_lines_written",
                "Access log request lines written.",
            )?,
            bytes_written: c(
                "tailguard_access_log_bytes_written",
                "Access log bytes written.",
            )?,
            dropped_lines: c(
                "tailguard_access_log_dropped_lines",
                "Access log lines dropped because every buffer was full or queued.",
            )?,
            write_errors: c(
                "tailguard_access_log_write_errors",
                "Failed access log write, fsync or reopen calls.",
            )?,
            flushes: c(
                "tailguard_access_log_flushes",
                "Access log buffers written.",
            )?,
            reopens: c("tailguard_access_log_reopens", "Access log file reopens.")?,
            lost_lines: c(
                "tailguard_access_log_lost_lines",
                "Access log lines that could not be written before shutdown.",
            )?,
            writer_lag: registry.float_gauge(
                "tailguard_access_log_writer_lag_seconds",
                "How long the last written access log buffer waited for the writer.",
                &["log"],
            )?,
        })
    }

    /// The handles for the log named `log` (a listener or route name, or a path).
    pub fn log(&self, log: &str) -> Result<LogMetrics, Error> {
        let l = &[log];
        Ok(LogMetrics {
            lines_written: self.lines_written.get_or_create(l)?,
            bytes_written: self.bytes_written.get_or_create(l)?,
            dropped_lines: self.dropped_lines.get_or_create(l)?,
            write_errors: self.write_errors.get_or_create(l)?,
            flushes: self.flushes.get_or_create(l)?,
            reopens: self.reopens.get_or_create(l)?,
            lost_lines: self.lost_lines.get_or_create(l)?,
            writer_lag: self.writer_lag.get_or_create(l)?,
        })
    }
}

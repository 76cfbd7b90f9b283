//! The log's own counters: what was written, dropped and failed, readable at any time.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Counters shared by the writer and, for drops only, the serving threads.
///
/// The serving threads touch `dropped` alone, and only when a line is dropped, so a
/// healthy log writes no shared cache line from the request path. `dropped` sits on its
/// own cache line so the writer's updates never bounce it.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) dropped: Padded,
    pub(crate) lines_written: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) write_errors: AtomicU64,
    pub(crate) flushes: AtomicU64,
    pub(crate) reopens: AtomicU64,
    pub(crate) lost_lines: AtomicU64,
    pub(crate) lag_us: AtomicU64,
}

/// An atomic alone on a 128-byte line (two 64-byte lines: adjacent-line prefetch).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded(pub(crate) AtomicU64);

impl Counters {
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

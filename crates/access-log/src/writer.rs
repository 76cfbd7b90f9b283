//! The writer thread: writes full buffers, collects idle ones every flush interval,
//! reopens the file on request, reports errors without flooding, and drains everything at
//! shutdown.
//!
//! It runs on its own OS thread (not tokio's blocking pool) so a disk that stalls for
//! seconds stalls only this thread: serving threads keep appending into the pool's other
//! buffers, and drop (counted) or block only when all of them are queued here.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering::{self, Relaxed};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime};

use crate::buffer::{Buf, Msg, Shared, lock};

/// Where the writer writes.
#[derive(Debug)]
pub(crate) enum Sink {
    File { path: PathBuf, file: File },
    Stdout,
}

/// Sets this thread's nice value (on Linux, PRIO_PROCESS with a thread id is per thread).
pub(crate) fn lower_priority(nice: i32) {
    if nice == 0 {
        return;
    }
    let tid = rustix::thread::gettid();
    if let Err(err) = rustix::process::setpriority_process(Some(tid), nice) {
        tracing::warn!(%err, nice, "access log writer: could not set its nice value");
    }
}

/// Opens `path` for append, creating it with mode 0640 (owner writes, group reads: log
/// shippers usually run in the group; the world never reads access logs).
pub(crate) fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .open(path)
}

impl Sink {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        match self {
            Self::File { file, .. } => file.write(data),
            Self::Stdout => {
                let mut out = io::stdout().lock();
                let n = out.write(data)?;
                out.flush()?;
                Ok(n)
            }
        }
    }

    fn sync(&mut self) -> io::Result<()> {
        match self {
            Self::File { file, .. } => match file.sync_all() {
                // Pipes, FIFOs and devices such as /dev/full cannot be synced; that is
                // not a write error.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
                other => other,
            },
            Self::Stdout => io::stdout().flush(),
        }
    }
}

pub(crate) struct WriterThread {
    shared: Arc<Shared>,
    sink: Sink,
    interval: Duration,
    /// Buffers waiting to be written, oldest first. Bounded by the pool size.
    backlog: VecDeque<Buf>,
    /// The front of the backlog failed to write; retry on the next tick only.
    failing: bool,
    dropped_reported: u64,
    errors_unreported: u64,
    last_report: Option<Instant>,
}

impl WriterThread {
    pub(crate) fn new(shared: Arc<Shared>, sink: Sink, interval: Duration) -> Self {
        Self {
            shared,
            sink,
            interval,
            backlog: VecDeque::new(),
            failing: false,
            dropped_reported: 0,
            errors_unreported: 0,
            last_report: None,
        }
    }

    pub(crate) fn run(mut self, rx: &Receiver<Msg>) {
        let mut next_tick = Instant::now() + self.interval;
        loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(Msg::Full(buf)) => {
                    self.backlog.push_back(buf);
                    if !self.failing {
                        self.write_backlog();
                    }
                }
                Ok(Msg::Wake) => self.shared.wake_pending.store(false, Ordering::Release),
                Ok(Msg::Flush(ack)) => {
                    self.collect(false);
                    self.drain_channel(rx);
                    self.write_backlog();
                    self.note_dropped();
                    self.sync();
                    // The caller may have given up waiting; nothing to do then.
                    let _ = ack.send(());
                }
                Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {}
            }
            if self.shared.reopen.swap(false, Ordering::AcqRel) {
                self.reopen();
            }
            let now = Instant::now();
            if now >= next_tick {
                self.collect(false);
                self.write_backlog();
                self.note_dropped();
                self.report_errors(now);
                next_tick = now + self.interval;
            }
        }
        self.shutdown(rx);
    }

    /// Takes every thread's open buffer. At shutdown (`last`) the slots are retired while
    /// the registry is locked, so no thread can register a new one unseen.
    fn collect(&mut self, last: bool) {
        let mut slots = lock(&self.shared.slots);
        let now = Instant::now();
        for slot in slots.iter() {
            // The only lock the writer shares with a serving thread, held for a pointer copy.
            let taken = lock(&slot.buf).take();
            if last {
                slot.retired.store(true, Relaxed);
            }
            if let Some(mut buf) = taken {
                buf.sealed = now;
                self.backlog.push_back(buf);
            }
        }
        if !last {
            // A slot only the registry still holds belongs to a thread that has exited.
            // Its thread may have appended after the `take` above and then exited: what
            // it left is taken now, or those lines would go with the slot.
            let backlog = &mut self.backlog;
            slots.retain(|s| {
                if Arc::strong_count(s) > 1 {
                    return true;
                }
                // Pairs with the Release decrement of the exiting thread's `Arc` drop: its
                // last append is visible below.
                std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
                if let Some(mut buf) = lock(&s.buf).take() {
                    buf.sealed = now;
                    backlog.push_back(buf);
                }
                false
            });
        }
    }

    fn drain_channel(&mut self, rx: &Receiver<Msg>) {
        while let Ok(msg) = rx.try_recv() {
            match msg {
                Msg::Full(buf) => self.backlog.push_back(buf),
                Msg::Wake => self.shared.wake_pending.store(false, Ordering::Release),
                Msg::Flush(ack) => {
                    // Answered after this flush's writes, which cover it.
                    let _ = ack.send(());
                }
                Msg::Stop => {}
            }
        }
    }

    /// Writes the backlog in order; on an error keeps the failed buffer (and the rest)
    /// for the next tick.
    fn write_backlog(&mut self) {
        while let Some(buf) = self.backlog.front_mut() {
            let lag = buf.sealed.elapsed();
            match write_buf(&mut self.sink, buf) {
                Ok(()) => {
                    self.shared
                        .counters
                        .written(buf.lines, buf.data.len() as u64, lag);
                    let buf = self.backlog.pop_front().expect("front_mut returned Some");
                    self.shared.pool.give(buf.data);
                }
                Err(e) => {
                    self.failing = true;
                    self.error("write", &e);
                    return;
                }
            }
        }
        self.failing = false;
    }

    /// Writes one "dropped N lines" record once the backlog is written.
    fn note_dropped(&mut self) {
        if self.failing || !self.backlog.is_empty() {
            return;
        }
        let dropped = self.shared.counters.dropped_total();
        if dropped <= self.dropped_reported {
            return;
        }
        let line = self
            .shared
            .format
            .dropped_record(dropped - self.dropped_reported, SystemTime::now());
        let mut buf = Buf {
            data: line,
            lines: 0,
            written: 0,
            sealed: Instant::now(),
        };
        match write_buf(&mut self.sink, &mut buf) {
            Ok(()) => {
                self.dropped_reported = dropped;
                self.shared.counters.note_written(buf.data.len() as u64);
            }
            // A partly written note is left as is; the next one counts from the old mark.
            Err(e) => self.error("write", &e),
        }
    }

    fn reopen(&mut self) {
        let Sink::File { path, file } = &mut self.sink else {
            return;
        };
        match open(path) {
            Ok(new) => {
                // Dropping the old file closes it; the kernel has every byte written.
                *file = new;
                self.shared.counters.reopened();
                // A buffer that failed halfway must not continue mid-line in the new file:
                // skip to its next line boundary and count the cut line as lost.
                if let Some(buf) = self
                    .backlog
                    .front_mut()
                    .filter(|b| b.written > 0 && b.data[b.written - 1] != b'\n')
                {
                    let rest = &buf.data[buf.written..];
                    let skip = rest
                        .iter()
                        .position(|&b| b == b'\n')
                        .map_or(rest.len(), |p| p + 1);
                    buf.written += skip;
                    buf.lines = buf.lines.saturating_sub(1);
                    self.shared.counters.lost(1);
                }
                tracing::info!(path = %path.display(), "access log reopened");
            }
            Err(e) => self.error("reopen", &e),
        }
        if self.failing {
            self.write_backlog();
        }
    }

    fn sync(&mut self) {
        if let Err(e) = self.sink.sync() {
            self.error("fsync", &e);
        }
    }

    fn error(&mut self, op: &'static str, e: &io::Error) {
        self.shared.counters.write_error();
        self.errors_unreported += 1;
        let due = self
            .last_report
            .is_none_or(|t| t.elapsed() >= self.interval);
        if due {
            tracing::warn!(
                op,
                error = %e,
                errors = self.errors_unreported,
                "access log write failed; keeping the lines and retrying every flush interval"
            );
            self.errors_unreported = 0;
            self.last_report = Some(Instant::now());
        }
    }

    fn report_errors(&mut self, now: Instant) {
        if self.errors_unreported > 0 && self.last_report.is_none_or(|t| now - t >= self.interval) {
            tracing::warn!(
                errors = self.errors_unreported,
                "access log write errors since the last report"
            );
            self.errors_unreported = 0;
            self.last_report = Some(now);
        }
    }

    /// Graceful end: take every thread's buffer, everything queued, write it all, fsync.
    fn shutdown(mut self, rx: &Receiver<Msg>) {
        // `closed` is already set (by the handle, before `Stop`), so once each slot has
        // been locked here no serving thread can add to it.
        self.collect(true);
        self.drain_channel(rx);
        self.write_backlog();
        if self.failing {
            // One more try, then give up: shutdown must end. What is left is counted.
            self.write_backlog();
            let lost: u64 = self.backlog.iter().map(|b| b.lines).sum();
            self.shared.counters.lost(lost);
            if lost > 0 {
                tracing::error!(
                    lost,
                    "access log lines could not be written before shutdown"
                );
            }
        }
        self.note_dropped();
        self.sync();
        self.report_errors(Instant::now() + self.interval);
    }
}

fn write_buf(sink: &mut Sink, buf: &mut Buf) -> io::Result<()> {
    while buf.written < buf.data.len() {
        match sink.write(&buf.data[buf.written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf.written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

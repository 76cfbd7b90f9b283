//! Access log lines formatted into per-thread buffers and written by a writer thread.
//!
//! The request path never touches the disk. A serving thread formats its [`Record`] into
//! its own buffer (64 KiB by default) under a lock nobody else wants; a full buffer goes
//! over a bounded channel to one writer thread, which `write`s it whole, collects
//! partly filled buffers every flush interval, reopens the file when asked (logrotate's
//! `SIGUSR1`), and at shutdown drains every thread's buffer and fsyncs. Buffers come from
//! a pool allocated up front, so memory is bounded; when the disk falls behind and the
//! pool is empty, a line is dropped and counted ([`OnFull::Drop`], the default) or the
//! thread waits ([`OnFull::Block`]).
//!
//! - [`AccessLog`]: the cheap, cloneable handle the serving code calls [`AccessLog::log`]
//!   on. [`AccessLog::off`] is a no-op implementation, not a branch.
//! - [`Writer`]: the control handle: [`Writer::reopener`], [`Writer::flush`],
//!   [`Writer::stats`], [`Writer::shutdown`].
//! - [`Format`]: nginx `combined`, JSON lines, or a template of nginx variables.
//! - [`AccessLogLayer`]: a tower layer logging each request of any hyper/axum service when
//!   its response body ends.
//!
//! ```
//! use std::time::{Duration, UNIX_EPOCH};
//! use tailguard_access_log::{AccessLog, Config, Record};
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("access.log");
//! let (log, writer) = AccessLog::start(&Config::to(path.to_str().unwrap()))?;
//! log.log(&Record {
//!     time: UNIX_EPOCH + Duration::from_secs(1_795_295_993),
//!     remote_addr: Some([192, 0, 2, 7].into()),
//!     method: b"GET",
//!     target: b"/api/users?id=7",
//!     status: 200,
//!     body_bytes_sent: 512,
//!     user_agent: Some(b"curl/8.5 \"quoted\"\n"),
//!     ..Record::default()
//! });
//! let stats = writer.shutdown();
//! assert_eq!(stats.lines_written, 1);
//! assert_eq!(
//!     std::fs::read_to_string(&path)?,
//!     "192.0.2.7 - - [21/Nov/2026:21:19:53 +0000] \"GET /api/users?id=7 HTTP/1.1\" 200 512 \
//!      \"-\" \"curl/8.5 \\x22quoted\\x22\\x0A\"\n"
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// The README's example compiles (it serves forever, so it is not run).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod buffer;
mod config;
mod error;
mod escape;
mod format;
mod layer;
mod record;
mod stats;
mod time;
mod writer;

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use config::{
    Config, DEFAULT_BUFFER_SIZE, DEFAULT_BUFFERS, DEFAULT_FLUSH_MS, DEFAULT_WRITER_NICE,
    FormatName, OnFull, Output,
};
pub use error::Error;
pub use format::{COMBINED, Format, VARIABLES, hex_into, ip_text};
pub use layer::{AccessLogFuture, AccessLogLayer, AccessLogService, LoggedBody, RemoteAddrOf};
pub use record::{Record, UpstreamTry};
pub use stats::{LogMetrics, Metrics, Stats};

use buffer::{Msg, Shared};
use writer::{Sink, WriterThread};

/// The handle serving code logs through. Cloning it is an `Arc` clone.
#[derive(Clone)]
pub struct AccessLog {
    inner: Arc<dyn Append>,
    /// Whether records are kept, so [`AccessLog::log_with`] can skip building one.
    on: bool,
}

impl fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessLog").finish_non_exhaustive()
    }
}

/// What an access log does with a record: buffer it, or nothing.
trait Append: Send + Sync {
    fn append(&self, record: &Record<'_>);
}

/// The disabled log: a no-op implementation, so serving code never asks "is logging on?".
struct Off;

impl Append for Off {
    fn append(&self, _record: &Record<'_>) {}
}

struct Buffered {
    shared: Arc<Shared>,
}

impl Append for Buffered {
    #[inline]
    fn append(&self, record: &Record<'_>) {
        self.shared.append(record);
    }
}

impl AccessLog {
    /// Validates `config`, opens the output and starts the writer thread.
    ///
    /// With [`Output::Off`] no thread starts and the log is [`AccessLog::off`].
    pub fn start(config: &Config) -> Result<(Self, Writer), Error> {
        Self::start_with_metrics(config, None)
    }

    /// Like [`AccessLog::start`], also counting into `metrics` (see [`Metrics`]).
    pub fn start_with_metrics(
        config: &Config,
        metrics: Option<LogMetrics>,
    ) -> Result<(Self, Writer), Error> {
        let format = config.validate()?;
        let sink = match &config.path {
            Output::Off => return Ok((Self::off(), Writer { inner: None })),
            Output::Stdout => Sink::Stdout,
            Output::File(path) => Sink::File {
                path: path.clone(),
                file: writer::open(path).map_err(|source| Error::Open {
                    path: path.clone(),
                    source,
                })?,
            },
        };
        // Room for every buffer plus control messages: a full buffer is never refused.
        let (tx, rx) = mpsc::sync_channel(config.buffers + 8);
        let shared = Arc::new(Shared::new(
            format,
            config.buffer_size,
            config.buffers,
            config.on_full,
            tx,
            stats::Counters::new(metrics),
        ));
        let thread = WriterThread::new(Arc::clone(&shared), sink, config.flush_interval());
        let nice = config.writer_nice;
        let handle = std::thread::Builder::new()
            .name("tailguard-log-writer".into())
            .spawn(move || {
                // Leaves the metrics shards to the threads that serve requests.
                tailguard_metrics::use_shared_shard();
                writer::lower_priority(nice);
                thread.run(&rx);
            })
            .map_err(Error::Spawn)?;
        let log = Self {
            inner: Arc::new(Buffered {
                shared: Arc::clone(&shared),
            }),
            on: true,
        };
        Ok((
            log,
            Writer {
                inner: Some(Running {
                    shared,
                    thread: handle,
                }),
            },
        ))
    }

    /// A log that discards every record and costs one indirect call.
    pub fn off() -> Self {
        Self {
            inner: Arc::new(Off),
            on: false,
        }
    }

    /// Formats `record` into this thread's buffer. Never blocks on the disk (unless the
    /// log was configured with [`OnFull::Block`]), never fails, never panics.
    #[inline]
    pub fn log(&self, record: &Record<'_>) {
        self.inner.append(record);
    }

    /// Like [`AccessLog::log`], building the record only when the log keeps records, so a
    /// server with logging off does not even read the clock for it.
    #[inline]
    pub fn log_with<'a>(&self, make: impl FnOnce() -> Record<'a>) {
        if self.on {
            self.inner.append(&make());
        }
    }

    /// Whether this is [`AccessLog::off`].
    pub fn is_off(&self) -> bool {
        !self.on
    }
}

/// The control handle of a running log; dropping it shuts the log down like
/// [`Writer::shutdown`].
#[derive(Debug)]
pub struct Writer {
    inner: Option<Running>,
}

#[derive(Debug)]
struct Running {
    shared: Arc<Shared>,
    thread: JoinHandle<()>,
}

/// Asks the writer to reopen the log file (for logrotate's `postrotate` `SIGUSR1`).
///
/// Cheap, never blocks, safe to call from a signal-handling task. The writer reopens
/// between two buffers, and buffers hold whole lines, so no line is split across files.
#[derive(Clone, Debug)]
pub struct Reopener {
    shared: Option<Arc<Shared>>,
}

impl Reopener {
    /// Requests a reopen; the writer does it within moments.
    pub fn reopen(&self) {
        if let Some(shared) = &self.shared {
            shared.reopen.store(true, Ordering::Release);
            shared.wake();
        }
    }
}

impl Writer {
    /// A handle that requests reopens.
    pub fn reopener(&self) -> Reopener {
        Reopener {
            shared: self.inner.as_ref().map(|r| Arc::clone(&r.shared)),
        }
    }

    /// Collects every thread's buffer and writes everything logged before this call, then
    /// returns. Blocks the caller (not the serving threads) while the disk works.
    pub fn flush(&self) {
        if let Some(r) = &self.inner {
            let (tx, rx) = mpsc::sync_channel(1);
            if r.shared.send(Msg::Flush(tx)) {
                // An error means the writer exited; there is nothing left to wait for.
                let _ = rx.recv();
            }
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        self.inner
            .as_ref()
            .map(|r| r.shared.counters.snapshot())
            .unwrap_or_default()
    }

    /// Stops the log: later records are dropped (counted), every thread's buffer and the
    /// queue are written, the file is fsynced, the writer thread exits. Call it after the
    /// server has answered its last request: then lines written == requests answered.
    pub fn shutdown(mut self) -> Stats {
        self.stop(None)
    }

    /// Like [`Writer::shutdown`], but gives up waiting after `deadline`: a log on a disk
    /// that stopped answering (a hung NFS mount, a FIFO nobody reads) must not keep the
    /// process from exiting. The writer thread is then left to finish or die with the
    /// process; the lines it still holds are reported through tracing.
    pub fn shutdown_within(mut self, deadline: Duration) -> Stats {
        self.stop(Some(deadline))
    }

    fn stop(&mut self, deadline: Option<Duration>) -> Stats {
        let Some(r) = self.inner.take() else {
            return Stats::default();
        };
        r.shared.closed.store(true, Ordering::Release);
        r.shared.pool.wake_all();
        r.shared.send(Msg::Stop);
        if let Some(deadline) = deadline {
            let start = Instant::now();
            // Shutdown only: a short poll keeps this free of another channel.
            while !r.thread.is_finished() {
                if start.elapsed() >= deadline {
                    tracing::error!(
                        waited_ms = u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
                        "the access log writer is still writing (stalled disk?); \
                         not waiting longer, buffered lines may be lost"
                    );
                    return r.shared.counters.snapshot();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if r.thread.join().is_err() {
            tracing::error!("the access log writer thread panicked");
        }
        r.shared.counters.snapshot()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop(None);
    }
}

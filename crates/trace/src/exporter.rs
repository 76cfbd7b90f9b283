//! The exporter thread: its own OS thread and current-thread runtime, serving no traffic.
//! It takes full buffers from the queue when a batch's worth waits there, collects idle
//! threads' buffers every interval, batches by size and interval, and exports with bounded
//! retries; on shutdown it exports what is left within a deadline. A batch closes at
//! `batch_max_spans` spans or before the span that would take its request past
//! `batch_max_bytes`, whichever comes first: a collector refuses a request over its size
//! limit (4 MiB for the Collector's gRPC receiver) whole, and does not say which spans it
//! would have taken.
//!
//! While an export waits (a slow or dead collector), the queue is not read: the pool runs
//! out and serving threads drop new spans (`queue_full`) instead of memory growing. A batch
//! whose retries run out is dropped (`export_failed`). Memory is therefore the pool:
//! `queue_max_spans` spans of at most `MAX_SPAN_BYTES`, encoded as recorded. A batch is
//! the recorder's own buffers, lent to its export request and back in the pool once it is
//! sent (or dropped); no span is copied into a batch, and a batch holds at most half of
//! the pool, so that serving threads have buffers while one is being sent.

use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use crate::config::ExportConfig;
use crate::encode::{Encoder, spans_within};
use crate::error::Error;
use crate::export::{Failure, Parts, Transport};
use crate::metrics::{DropReason, TraceMetrics};
use crate::recorder::{Receiver, SpanBuf, Tracer, recorder};

enum Control {
    /// Export everything recorded so far, then answer.
    Flush(oneshot::Sender<()>),
}

/// The running exporter. Dropping it (or [`Exporter::shutdown`]) stops the thread after a
/// last export.
pub struct Exporter {
    tracer: Tracer,
    control: mpsc::UnboundedSender<Control>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter").finish_non_exhaustive()
    }
}

impl Exporter {
    /// Starts the exporter thread. Fails on a bad endpoint, header or TLS file; a collector
    /// that is down is not an error (exports are retried, then dropped and counted).
    pub fn start(config: ExportConfig, metrics: TraceMetrics) -> Result<Exporter, Error> {
        let (tracer, receiver) = recorder(
            config.buffer_spans,
            config.queue_max_spans,
            config.batch_max_spans,
            metrics,
        );
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Spawn)?;
        // The transport is built here so a bad endpoint or TLS file fails the start; gRPC's
        // lazy channel needs the runtime entered.
        let transport = {
            let _guard = runtime.enter();
            Transport::new(&config)?
        };
        let thread = std::thread::Builder::new()
            .name("trace-exporter".to_owned())
            .spawn(move || {
                // Encoding, gzip and the collector's socket never take a serving thread's
                // core from it: the exporter runs only when the core is otherwise idle.
                // A core saturated by serving threads then starves the exporter, its
                // queue fills and spans are dropped and counted, never the requests slowed.
                tailguard_metrics::set_thread_priority(
                    tailguard_metrics::Priority::Idle,
                    "trace exporter",
                );
                let encoder = Encoder::new(&config.resource);
                let run = Run {
                    batch_span_bytes: span_bytes_within(&encoder, config.batch_max_bytes),
                    encoder,
                    config,
                    transport,
                    receiver,
                    queued: Vec::new(),
                    batches: std::collections::VecDeque::new(),
                    pending_spans: 0,
                };
                runtime.block_on(run.main(control_rx, stop_rx));
            })
            .map_err(Error::Spawn)?;
        Ok(Exporter {
            tracer,
            control: control_tx,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The handle serving threads record with.
    pub fn tracer(&self) -> Tracer {
        self.tracer.clone()
    }

    /// Exports every span recorded so far (each thread's open buffer included) and waits
    /// for the export to end (accepted, or dropped after its retries).
    pub async fn flush(&self) {
        self.flusher().flush().await;
    }

    /// A handle that asks for a flush, to hold without holding the exporter.
    pub fn flusher(&self) -> Flusher {
        Flusher {
            control: self.control.clone(),
        }
    }

    /// Stops recording, exports what is left (within the shutdown timeout) and joins the
    /// thread.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Asks a running exporter to flush ([`Exporter::flusher`]).
#[derive(Clone)]
pub struct Flusher {
    control: mpsc::UnboundedSender<Control>,
}

impl std::fmt::Debug for Flusher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flusher").finish_non_exhaustive()
    }
}

impl Flusher {
    /// [`Exporter::flush`].
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.control.send(Control::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

struct Run {
    config: ExportConfig,
    transport: Transport,
    receiver: Receiver,
    /// Buffers taken from the queue, on their way into `batches` (kept for its capacity).
    queued: Vec<SpanBuf>,
    encoder: Encoder,
    /// Spans taken from the queue and not yet exported, in batches of at most
    /// [`Run::batch_max`] (oldest first; only the last is still filling).
    batches: std::collections::VecDeque<Batch>,
    /// Spans in `batches`.
    pending_spans: usize,
    /// A batch's spans' bytes, at most: `batch_max_bytes` less the request's header.
    batch_span_bytes: usize,
}

/// The bytes of spans a request of at most `max_bytes` holds beside its header.
fn span_bytes_within(encoder: &Encoder, max_bytes: usize) -> usize {
    // The header's length grows (by a byte of a varint) with the spans' length, so the
    // header of the largest request is the largest header.
    max_bytes.saturating_sub(encoder.header_len(max_bytes))
}

/// The spans of one export request: slices of the recorder's buffers, lent
/// ([`Shared::lend`](crate::recorder::Shared::lend)), sent one after another behind the
/// request's header. Copying each buffer into a batch of its own cost the exporter its
/// `memmove` and page faults, 0.8 % of a 100 %-traced gateway's core against 0.3 % more in
/// its TCP sends when lent (PGO, every span exported: `lab/syscalls.sh PROFILE=1
/// TRACE_SINK=1`). And it gave each buffer back at once, so the pool filled again behind a
/// stalled export: twice the memory bound.
#[derive(Default)]
struct Batch {
    parts: Vec<Bytes>,
    bytes: usize,
    spans: usize,
    /// Takes no more spans: it reached `batch_max_spans`, or the next span would have
    /// taken it past `batch_max_bytes`.
    closed: bool,
}

impl Run {
    fn metrics(&self) -> &TraceMetrics {
        &self.receiver.shared.metrics
    }

    async fn main(
        mut self,
        mut control: mpsc::UnboundedReceiver<Control>,
        mut stop: oneshot::Receiver<()>,
    ) {
        // The first collect one interval after the start, not at once: nothing has been
        // recorded yet, and taking a thread's open buffer while it records is what can put
        // its spans out of order (see `collect_all`).
        let interval = self.config.batch_interval;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.receiver.ready() => {
                    self.take_queued();
                    // A full batch goes at once: the queue's bound counts one batch held
                    // by the exporter, not two.
                    while self.batches.front().is_some_and(|b| b.closed) {
                        self.export_one().await;
                    }
                }
                _ = tick.tick() => {
                    self.collect_all();
                    self.export_all().await;
                }
                Some(Control::Flush(done)) = control.recv() => {
                    self.collect_all();
                    self.export_all().await;
                    let _ = done.send(());
                }
                _ = &mut stop => break,
            }
        }
        self.receiver.shared.closed.store(true, Ordering::Relaxed);
        self.collect_all();
        let deadline = self.config.shutdown_timeout;
        if tokio::time::timeout(deadline, self.export_all())
            .await
            .is_err()
        {
            let n = self.pending_spans as u64;
            self.dropped(DropReason::Shutdown, n);
            self.batches.clear();
            self.pending_spans = 0;
        }
    }

    /// Every queued buffer and every thread's open buffer into `batches`. A thread's spans
    /// otherwise reach the collector in the order it recorded them, but not across this:
    /// a thread that queues a full buffer between the two steps has that buffer's spans
    /// sent after those of its open buffer, taken here. OTLP gives the order of spans no
    /// meaning.
    fn collect_all(&mut self) {
        self.take_queued();
        for buf in self.receiver.shared.collect() {
            self.take(buf);
        }
    }

    /// Every queued buffer's spans into `batches`, oldest first.
    fn take_queued(&mut self) {
        let mut queued = std::mem::take(&mut self.queued);
        self.receiver.take_queued(&mut queued);
        for buf in queued.drain(..) {
            self.take(buf);
        }
        self.queued = queued;
    }

    /// Spans in a batch, at most: `batch_max_spans`, and half the pool, whose buffers the
    /// batch holds until it is sent.
    fn batch_max(&self) -> usize {
        let half_pool = self.receiver.shared.capacity_spans / 2;
        self.config.batch_max_spans.min(half_pool).max(1)
    }

    /// A buffer's spans into `batches` (a new batch when the last is closed), lent: the
    /// buffer goes back to the pool once the batches holding its spans are sent.
    fn take(&mut self, buf: SpanBuf) {
        let mut left = buf.len();
        if left == 0 {
            self.receiver.shared.give(buf);
            return;
        }
        let max_spans = self.batch_max();
        let max_bytes = self.batch_span_bytes;
        let mut rest = self.receiver.shared.lend(buf);
        // `rest` holds `left` whole spans; checking both keeps this loop finite whatever.
        while left > 0 && !rest.is_empty() {
            let batch = match self.batches.back_mut() {
                Some(open) if !open.closed => open,
                _ => {
                    self.batches.push_back(Batch::default());
                    self.batches
                        .back_mut()
                        .expect("a batch was pushed just above")
                }
            };
            let room_spans = max_spans - batch.spans;
            let room_bytes = max_bytes.saturating_sub(batch.bytes);
            let (mut taken, mut cut) = if left <= room_spans && rest.len() <= room_bytes {
                // The whole rest fits: no need to walk its spans.
                (left, rest.len())
            } else {
                spans_within(&rest, room_spans.min(left), room_bytes)
            };
            if taken == 0 && batch.spans == 0 {
                // A span larger than the byte bound on its own still goes, alone.
                (taken, cut) = spans_within(&rest, 1, usize::MAX);
            }
            if taken > 0 {
                let part = rest.split_to(cut);
                batch.bytes += part.len();
                batch.parts.push(part);
                batch.spans += taken;
                self.pending_spans += taken;
                left -= taken;
            }
            // Spans left over mean this batch had no room for the next one.
            batch.closed = left > 0 || batch.spans >= max_spans;
        }
    }

    async fn export_all(&mut self) {
        while !self.batches.is_empty() {
            self.export_one().await;
        }
    }

    /// Exports the oldest batch, retrying as the config says.
    async fn export_one(&mut self) {
        let Some(batch) = self.batches.pop_front() else {
            return;
        };
        self.pending_spans -= batch.spans;
        if batch.spans == 0 {
            return;
        }
        let mut parts = std::collections::VecDeque::with_capacity(batch.parts.len() + 1);
        parts.push_back(self.encoder.header(batch.bytes));
        parts.extend(batch.parts);
        let request = self.transport.body(Parts::new(parts));
        let count = batch.spans as u64;
        let retry = self.config.retry;
        let mut backoff = retry.initial_backoff;
        for attempt in 0..=retry.max_retries {
            let outcome =
                tokio::time::timeout(self.config.timeout, self.transport.send(&request)).await;
            let failure = match outcome {
                Ok(Ok(rejected)) => {
                    let rejected = rejected.min(count);
                    self.metrics().exported.add(count - rejected);
                    self.dropped(DropReason::ExportFailed, rejected);
                    self.queue_done(count - rejected);
                    return;
                }
                Ok(Err(f)) => f,
                Err(_) => Failure::Retryable {
                    after: None,
                    reason: "timed out".to_owned(),
                },
            };
            self.metrics().export_errors.inc();
            match failure {
                Failure::Retryable { after, reason } if attempt < retry.max_retries => {
                    let wait = after
                        .unwrap_or_else(|| jitter(backoff))
                        .min(retry.max_backoff);
                    tracing::debug!(%reason, ?wait, "OTLP export failed; retrying");
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(retry.max_backoff);
                }
                Failure::Retryable { reason, .. } | Failure::Permanent(reason) => {
                    tracing::warn!(%reason, spans = count, "OTLP export failed; spans dropped");
                    break;
                }
            }
        }
        self.dropped(DropReason::ExportFailed, count);
    }

    fn dropped(&self, reason: DropReason, n: u64) {
        if n > 0 {
            self.metrics().dropped(reason, n);
            self.queue_done(n);
        }
    }

    fn queue_done(&self, n: u64) {
        self.metrics().queue_out(n);
    }
}

/// `backoff` scaled by a random factor in [0.5, 1.0): retries from many gateways spread.
fn jitter(backoff: Duration) -> Duration {
    backoff.mul_f64(0.5 + fastrand::f64() / 2.0)
}

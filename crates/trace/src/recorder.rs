//! The recorder: spans written into the calling thread's buffer, full buffers
//! handed to the exporter through a bounded queue, every buffer from a pool allocated up
//! front, so memory is bounded whatever the collector does.
//!
//! Each thread that records owns a [`Slot`]: its open buffer behind a `Mutex` that only two
//! parties ever lock, the owning thread (to write a request's spans in) and the exporter
//! thread (to take the buffer, a pointer copy, once per batch interval when the thread has
//! gone idle). The lock is uncontended on the request path (design rule 1 allows a lock another
//! thread takes for a pointer copy); it is what lets the exporter collect the spans of a
//! thread that stopped serving. The pool's lock is taken once per buffer of spans
//! (`buffer_spans`), not per span.
//!
//! Full buffers wait in a queue, and the exporter is woken only once a batch's worth of
//! spans waits there (or half the pool, if that is less), not for each buffer: it only
//! copies them into a batch that is not sent before it is full, and each wake-up is a
//! context switch on the serving core. At 15,000 traced requests a second this took the
//! exporter's switches from 978 to 675 in 5 s (`lab/thread-faults.sh`; the rest are its
//! export round trips), with no difference in CPU that sampling could resolve. The batch
//! interval's tick takes what waits in any case.
//!
//! Queue full (every buffer is full or waiting for the exporter) drops the span and counts
//! it (`reason="queue_full"`); nothing here ever waits.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use bytes::Bytes;
use tokio::sync::Notify;

use crate::context::SpanContext;
use crate::encode::{MAX_SPAN_BYTES, SpanWriter, Tally};
use crate::id::SpanId;
use crate::metrics::{DropReason, TraceMetrics};
use crate::span::{Span, SpanKind};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the data consistent (a push, a take), so a panic
    // elsewhere must not stop tracing.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Hands finished spans to the exporter. Cheap to clone; [`Tracer::noop`] records nothing.
#[derive(Clone, Default)]
pub struct Tracer {
    shared: Option<Arc<Shared>>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("enabled", &self.shared.is_some())
            .finish()
    }
}

/// One thread's open buffer.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    pub(crate) buf: Mutex<SpanBuf>,
}

pub(crate) struct Shared {
    /// Tells this recorder's slots apart from another's in a thread's list.
    id: u64,
    pool: Mutex<Vec<SpanBuf>>,
    /// Full buffers for the exporter.
    queue: Mutex<Queue>,
    /// Wakes the exporter: `wake_spans` spans are queued.
    ready: Notify,
    wake_spans: usize,
    /// Every thread's slot, for the exporter's idle collection.
    pub(crate) slots: Mutex<Vec<Arc<Slot>>>,
    buffer_spans: usize,
    /// Spans the pool holds in all.
    pub(crate) capacity_spans: usize,
    pub(crate) metrics: TraceMetrics,
    pub(crate) closed: AtomicBool,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A thread's slot in one recorder: the recorder's id, the recorder (to prune entries of
/// recorders that have gone), the slot.
type ThreadSlot = (u64, Weak<Shared>, Arc<Slot>);

thread_local! {
    /// This thread's slot of each recorder it has recorded into.
    static SLOTS: RefCell<Vec<ThreadSlot>> = const { RefCell::new(Vec::new()) };
}

/// Full buffers, oldest first, waiting for the exporter. Never more than the pool's
/// buffers, so pushing never fails for want of room.
#[derive(Debug, Default)]
struct Queue {
    bufs: Vec<SpanBuf>,
    /// Spans in `bufs`.
    spans: usize,
    /// The exporter has gone: nothing more is queued.
    exporter_gone: bool,
}

/// The exporter's end: buffers arrive here, and go back to the pool when read.
pub(crate) struct Receiver {
    pub(crate) shared: Arc<Shared>,
}

impl Receiver {
    /// Waits until the serving threads have queued a batch's worth of spans (or half the
    /// pool); returns at once if they did since the last call.
    pub(crate) async fn ready(&self) {
        self.shared.ready.notified().await;
    }

    /// Moves every queued buffer, oldest first, to the end of `into`.
    pub(crate) fn take_queued(&self, into: &mut Vec<SpanBuf>) {
        let mut queue = lock(&self.shared.queue);
        queue.spans = 0;
        into.append(&mut queue.bufs);
    }
}

impl Drop for Receiver {
    /// Buffers queued after the exporter's last look, and any queued from now on, are
    /// dropped and counted (`shutdown`).
    fn drop(&mut self) {
        let left = {
            let mut queue = lock(&self.shared.queue);
            queue.exporter_gone = true;
            queue.spans = 0;
            std::mem::take(&mut queue.bufs)
        };
        for buf in left {
            self.shared.dropped_at_shutdown(buf);
        }
    }
}

/// Creates a recorder whose buffers hold `buffer_spans` spans each and whose pool holds
/// `queue_spans` spans in all (at least two buffers); the exporter is woken when
/// `batch_spans` of them are queued (or half the pool, if that is less).
pub(crate) fn recorder(
    buffer_spans: usize,
    queue_spans: usize,
    batch_spans: usize,
    metrics: TraceMetrics,
) -> (Tracer, Receiver) {
    let buffer_spans = buffer_spans.max(1);
    let buffers = queue_spans.div_ceil(buffer_spans).max(2);
    let pool = (0..buffers)
        .map(|_| SpanBuf::with_capacity(buffer_spans))
        .collect();
    let wake_spans = batch_spans.min(buffers * buffer_spans / 2).max(1);
    let shared = Arc::new(Shared {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        pool: Mutex::new(pool),
        queue: Mutex::new(Queue {
            bufs: Vec::with_capacity(buffers),
            ..Queue::default()
        }),
        ready: Notify::new(),
        wake_spans,
        slots: Mutex::new(Vec::new()),
        buffer_spans,
        capacity_spans: buffers * buffer_spans,
        metrics,
        closed: AtomicBool::new(false),
    });
    let tracer = Tracer {
        shared: Some(Arc::clone(&shared)),
    };
    (tracer, Receiver { shared })
}

impl Tracer {
    /// A tracer that records nothing: tracing off.
    pub fn noop() -> Tracer {
        Tracer { shared: None }
    }

    /// Whether spans go anywhere.
    pub fn is_enabled(&self) -> bool {
        self.shared.is_some()
    }

    /// The metrics, when enabled.
    pub fn metrics(&self) -> Option<&TraceMetrics> {
        self.shared.as_ref().map(|s| &s.metrics)
    }

    /// Writes `span` into this thread's buffer (as a [`SpanWriter`] would have). Never
    /// waits; drops and counts the span when every buffer is full or queued.
    pub fn record(&self, span: &Span) {
        self.record_with(|spans| spans.push(span));
    }

    /// Records spans written in place in this thread's buffer: `build` gets a [`Recording`]
    /// whose [`Recording::start`] hands out a [`SpanWriter`] for each new span. One lock and
    /// one look-up of the thread's buffer serve all of them, and no span is built apart and
    /// then copied or encoded (a fixed-size `Span` built on the stack and recorded with
    /// [`Tracer::record`] costs both). Never waits; what finds no room is dropped and
    /// counted. `None` when tracing is off (`build` is not called).
    pub fn record_with<R>(&self, build: impl FnOnce(&mut Recording<'_>) -> R) -> Option<R> {
        let shared = self.shared.as_ref()?;
        let out = shared.with_slot(|slot| {
            let mut recording = Recording {
                shared,
                buf: lock(&slot.buf),
            };
            build(&mut recording)
        });
        Some(out)
    }
}

/// This thread's buffer, locked while spans are built in it ([`Tracer::record_with`]).
pub struct Recording<'a> {
    shared: &'a Shared,
    buf: MutexGuard<'a, SpanBuf>,
}

impl std::fmt::Debug for Recording<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recording")
            .field("spans", &self.buf.len())
            .finish()
    }
}

impl Recording<'_> {
    /// A new span of `kind` with the ids of `ctx`, child of `parent` (or a root), written
    /// into the thread's buffer as the caller sets it and ended when the writer is dropped;
    /// `None` (the span dropped and counted) when the recorder is shut down or every buffer
    /// is full or queued.
    pub fn start(
        &mut self,
        kind: SpanKind,
        ctx: &SpanContext,
        parent: Option<SpanId>,
    ) -> Option<SpanWriter<'_>> {
        if !self.room() {
            return None;
        }
        let buf = &mut *self.buf;
        let window = &mut buf.bytes[buf.tally.bytes..];
        Some(SpanWriter::start(window, &mut buf.tally, kind, ctx, parent))
    }

    /// Records a span built elsewhere; `false` when it was dropped (and counted).
    pub fn push(&mut self, span: &Span) -> bool {
        let parent = Some(span.parent_span_id);
        match self.start(span.kind, &span.context(true), parent) {
            Some(mut writer) => {
                writer.replay(span);
                true
            }
            None => false,
        }
    }

    /// Whether the buffer has room for one more span: a full one is queued for the exporter
    /// and a fresh one taken from the pool. Counts the span it has no room for.
    fn room(&mut self) -> bool {
        let shared = self.shared;
        if shared.closed.load(Ordering::Relaxed) {
            shared.metrics.dropped(DropReason::Shutdown, 1);
            return false;
        }
        if self.buf.len() >= shared.buffer_spans || !self.buf.has_window() {
            // Full, or taken by the exporter: a fresh buffer from the pool.
            let Some(fresh) = lock(&shared.pool).pop() else {
                shared.metrics.dropped(DropReason::QueueFull, 1);
                return false;
            };
            let full = std::mem::replace(&mut *self.buf, fresh);
            if !full.is_empty() {
                shared.send(full);
            } else if full.capacity() > 0 {
                shared.give(full);
            }
        }
        true
    }
}

impl Drop for Recording<'_> {
    fn drop(&mut self) {
        // The next request's spans go here: their lines fetched while it is served.
        crate::prefetch::for_writing(self.buf.next_window());
    }
}

/// The bytes after a request's spans warmed for the next request's
/// ([`crate::prefetch`]): a request's server and client span take ~530 in the gateway.
const WARM_BYTES: usize = 640;

/// A buffer of recorded spans, encoded: `ScopeSpans.spans` fields one after another, as
/// [`SpanWriter`] writes them, which the exporter copies into its batches as they are. Its
/// bytes are allocated (zeroed, by the kernel, as they are first touched) when the pool is
/// made,
/// `buffer_spans` windows of [`MAX_SPAN_BYTES`], and never grow; a span is written over
/// what the buffer held before, so recording one zeroes nothing.
#[derive(Debug, Default)]
pub(crate) struct SpanBuf {
    bytes: Vec<u8>,
    /// `bytes[..tally.bytes]` are the spans.
    tally: Tally,
}

impl SpanBuf {
    fn with_capacity(spans: usize) -> SpanBuf {
        SpanBuf {
            bytes: vec![0; spans.saturating_mul(MAX_SPAN_BYTES)],
            tally: Tally::default(),
        }
    }

    /// The spans recorded, encoded.
    pub(crate) fn encoded(&self) -> &[u8] {
        &self.bytes[..self.tally.bytes]
    }

    pub(crate) fn len(&self) -> usize {
        self.tally.spans
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.tally.spans == 0
    }

    fn capacity(&self) -> usize {
        self.bytes.len()
    }

    /// Where the next spans will be written: the bytes after the last span, as many as
    /// [`WARM_BYTES`] (none when the buffer was taken by the exporter). Once the buffer
    /// holds `buffer_spans` the next spans go to a fresh one and these lines are warmed for
    /// nothing: once a buffer.
    fn next_window(&self) -> &[u8] {
        let rest = self.bytes.get(self.tally.bytes..).unwrap_or_default();
        &rest[..rest.len().min(WARM_BYTES)]
    }

    /// Whether one more span's window fits (a buffer taken by the exporter has no bytes at
    /// all).
    fn has_window(&self) -> bool {
        self.bytes.len() - self.tally.bytes >= MAX_SPAN_BYTES
    }

    /// Forgets the spans, keeping the bytes.
    fn clear(&mut self) {
        self.tally = Tally::default();
    }

    /// The spans, decoded (for tests).
    #[cfg(test)]
    pub(crate) fn decode(&self) -> Vec<opentelemetry_proto::tonic::trace::v1::Span> {
        use prost::Message as _;
        opentelemetry_proto::tonic::trace::v1::ScopeSpans::decode(self.encoded())
            .expect("a buffer holds ScopeSpans.spans fields")
            .spans
    }
}

/// A buffer lent out by [`Shared::lend`].
struct Lent {
    buf: SpanBuf,
    shared: Arc<Shared>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        self.buf.encoded()
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.shared.give(std::mem::take(&mut self.buf));
    }
}

impl Shared {
    /// Runs `f` on this thread's slot, registered on first use.
    fn with_slot<R>(self: &Arc<Self>, f: impl FnOnce(&Slot) -> R) -> R {
        SLOTS.with(|slots| {
            let mut slots = slots.borrow_mut();
            if let Some((_, _, slot)) = slots.iter().find(|(id, _, _)| *id == self.id) {
                return f(slot);
            }
            // A recorder that has gone away leaves its entries behind; prune them here,
            // on the cold path.
            slots.retain(|(_, shared, _)| shared.strong_count() > 0);
            let slot = Arc::new(Slot::default());
            lock(&self.slots).push(Arc::clone(&slot));
            let out = f(&slot);
            slots.push((self.id, Arc::downgrade(self), slot));
            out
        })
    }

    /// Queues a full buffer for the exporter, and wakes it if a batch's worth is queued.
    pub(crate) fn send(&self, buf: SpanBuf) {
        // Counted into the queue gauge before the exporter can count it out. The gauge
        // counts a thread's spans when their buffer is handed off, not each request's as
        // they are recorded: an atomic add per request was a tenth of the recording's time
        // (`perf annotate`; its locked instruction waits for the span's stores).
        self.metrics.queue_in(buf.len());
        let mut queue = lock(&self.queue);
        if queue.exporter_gone {
            drop(queue);
            self.dropped_at_shutdown(buf);
            return;
        }
        queue.spans += buf.len();
        queue.bufs.push(buf);
        let wake = queue.spans >= self.wake_spans;
        drop(queue);
        if wake {
            self.ready.notify_one();
        }
    }

    /// A buffer the exporter will never read: its spans counted as dropped, the buffer back
    /// to the pool.
    fn dropped_at_shutdown(&self, buf: SpanBuf) {
        let n = buf.len() as u64;
        self.metrics.dropped(DropReason::Shutdown, n);
        self.metrics.queue_out(n);
        self.give(buf);
    }

    /// Lends a buffer the exporter has taken to the export requests that send its spans:
    /// `Bytes` of its spans, each slice of it a reference, and the buffer back in the pool
    /// when the last of them is dropped. The spans are sent as recorded, never copied into
    /// a batch of their own.
    pub(crate) fn lend(self: &Arc<Self>, buf: SpanBuf) -> Bytes {
        Bytes::from_owner(Lent {
            buf,
            shared: Arc::clone(self),
        })
    }

    /// Returns a read buffer to the pool.
    pub(crate) fn give(&self, mut buf: SpanBuf) {
        buf.clear();
        lock(&self.pool).push(buf);
    }

    /// Takes every thread's open buffer that holds spans (the idle collection), and forgets
    /// the slots of threads that have exited.
    pub(crate) fn collect(&self) -> Vec<SpanBuf> {
        let mut out = Vec::new();
        let mut slots = lock(&self.slots);
        for slot in slots.iter() {
            let mut buf = lock(&slot.buf);
            if !buf.is_empty() {
                self.metrics.queue_in(buf.len());
                out.push(std::mem::take(&mut *buf));
            }
        }
        // Only this list holds the slot of a thread that has exited. Its buffer (taken
        // above if it held spans) goes back to the pool.
        slots.retain(|slot| {
            let alive = Arc::strong_count(slot) > 1;
            if !alive {
                let buf = std::mem::take(&mut *lock(&slot.buf));
                if buf.capacity() > 0 {
                    self.give(buf);
                }
            }
            alive
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::SpanContext;
    use crate::id::SpanId;
    use crate::span::SpanKind;
    use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;

    fn span() -> Span {
        crate::span::root_server_span()
    }

    /// The buffers queued for the exporter, oldest first.
    fn queued(rx: &Receiver) -> Vec<SpanBuf> {
        let mut out = Vec::new();
        rx.take_queued(&mut out);
        out
    }

    /// Whether the exporter would wake now (its wait polled once).
    fn woken(rx: &Receiver) -> bool {
        let ready = std::pin::pin!(rx.ready());
        ready
            .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
            .is_ready()
    }

    #[test]
    fn full_buffers_are_queued_and_a_full_queue_drops_and_counts() {
        let metrics = TraceMetrics::unregistered();
        // Two buffers of two spans: the third span queues the first buffer, the fifth finds
        // no buffer left.
        let (tracer, rx) = recorder(2, 4, 512, metrics.clone());
        for _ in 0..4 {
            tracer.record(&span());
        }
        let first = queued(&rx).pop().expect("the first full buffer");
        assert_eq!(first.len(), 2);
        tracer.record(&span());
        assert_eq!(metrics.dropped_total(DropReason::QueueFull), 1);
        // The exporter gives the buffer back: recording goes on.
        rx.shared.give(first);
        tracer.record(&span());
        assert_eq!(metrics.dropped_total(DropReason::QueueFull), 1);
        let second: Vec<usize> = queued(&rx).iter().map(SpanBuf::len).collect();
        assert_eq!(second, [2], "the second buffer");
    }

    #[test]
    fn idle_buffers_are_collected_and_exited_threads_forgotten() {
        let (tracer, rx) = recorder(8, 16, 512, TraceMetrics::unregistered());
        tracer.record(&span());
        let t = tracer.clone();
        std::thread::spawn(move || t.record(&span()))
            .join()
            .expect("the thread records");
        let collected = rx.shared.collect();
        assert_eq!(collected.iter().map(SpanBuf::len).sum::<usize>(), 2);
        assert_eq!(
            lock(&rx.shared.slots).len(),
            1,
            "the exited thread's slot is gone"
        );
        for buf in collected {
            rx.shared.give(buf);
        }
        tracer.record(&span());
        assert_eq!(
            rx.shared.collect().iter().map(SpanBuf::len).sum::<usize>(),
            1
        );
    }

    #[test]
    fn spans_built_in_place_are_recorded_as_filled_in_across_a_full_buffer() {
        let metrics = TraceMetrics::unregistered();
        // Two buffers of two spans: three spans in one recording fill the first buffer and
        // queue it, the third opens the second; a second recording of two finds no room
        // for its second span.
        let (tracer, rx) = recorder(2, 4, 512, metrics.clone());
        let ctx = SpanContext::random();
        let got = tracer.record_with(|spans| {
            for i in 0..3 {
                let mut s = spans
                    .start(SpanKind::Client, &ctx, Some(ctx.span_id))
                    .expect("room");
                s.int("n", i);
            }
            "built"
        });
        assert_eq!(got, Some("built"));
        assert_eq!(metrics.queued(), 2, "the full buffer; the open one not yet");
        let queued = queued(&rx).pop().expect("the first buffer, full");
        let spans = queued.decode();
        let n: Vec<_> = spans
            .iter()
            .map(|s| s.attributes[0].value.clone().and_then(|v| v.value))
            .collect();
        assert_eq!(n, [Some(Any::IntValue(0)), Some(Any::IntValue(1))]);
        assert_eq!(spans[0].parent_span_id, ctx.span_id.0);
        let dropped = tracer.record_with(|spans| {
            assert!(spans.start(SpanKind::Server, &ctx, None).is_some());
            spans.start(SpanKind::Server, &ctx, None).is_none()
        });
        assert_eq!(dropped, Some(true), "no buffer left for the fifth span");
        assert_eq!(metrics.dropped_total(DropReason::QueueFull), 1);
        assert_eq!(metrics.queued(), 2);
        rx.shared.collect();
        assert_eq!(metrics.queued(), 4, "the open buffer, collected");
        assert_eq!(Tracer::noop().record_with(|_| ()), None);
    }

    #[test]
    fn a_reused_buffer_holds_only_its_new_span() {
        // One buffer of one span, so the second span reuses the first one's buffer.
        let (tracer, rx) = recorder(1, 1, 512, TraceMetrics::unregistered());
        let ctx = SpanContext::random();
        tracer.record_with(|spans| {
            let mut s = spans
                .start(SpanKind::Server, &ctx, Some(SpanId::random()))
                .expect("room");
            s.set_name_parts(&[b"GET", b"/a/long/route"]);
            s.bytes("url.path", b"/a/long/path");
            s.int("n", 1);
            s.status = crate::span::Status::Error;
        });
        let first = rx.shared.collect().pop().expect("the first span's buffer");
        assert_eq!(first.decode()[0].name, "GET /a/long/route");
        rx.shared.give(first);
        let other = SpanContext::random();
        tracer.record_with(|spans| {
            let mut s = spans.start(SpanKind::Client, &other, None).expect("room");
            s.bytes("server.address", b"10.0.0.1");
        });
        let second = queued(&rx).pop().or_else(|| rx.shared.collect().pop());
        let second = second.expect("the second span's buffer");
        let spans = second.decode();
        assert_eq!(spans.len(), 1);
        let s = &spans[0];
        assert_eq!(s.trace_id, other.trace_id.0);
        assert_eq!(s.kind, 3, "client");
        assert_eq!(s.status.as_ref().map(|st| st.code), Some(0));
        assert!(s.parent_span_id.is_empty());
        assert_eq!(s.name, "");
        let attrs: Vec<_> = s
            .attributes
            .iter()
            .map(|a| (a.key.as_str(), a.value.clone().and_then(|v| v.value)))
            .collect();
        assert_eq!(
            attrs,
            [("server.address", Some(Any::StringValue("10.0.0.1".into())))]
        );
        assert_eq!(s.dropped_attributes_count, 0);
    }

    #[test]
    fn a_span_built_elsewhere_is_recorded_as_it_was_built() {
        let (tracer, rx) = recorder(4, 8, 512, TraceMetrics::unregistered());
        let mut built = span();
        built.set_name("GET");
        built.start_unix_nanos = 10;
        built.end_unix_nanos = 20;
        built.int("http.response.status_code", 503);
        built.status = crate::span::Status::Error;
        tracer.record(&built);
        let got = rx.shared.collect().pop().expect("the buffer").decode();
        assert_eq!(got[0].span_id, built.span_id.0);
        assert_eq!(got[0].name, "GET");
        assert_eq!(
            (got[0].start_time_unix_nano, got[0].end_time_unix_nano),
            (10, 20)
        );
        assert_eq!(got[0].status.as_ref().map(|st| st.code), Some(2));
        assert_eq!(
            got[0].attributes[0].value.clone().and_then(|v| v.value),
            Some(Any::IntValue(503))
        );
    }

    #[test]
    fn a_writer_never_ended_leaves_no_span_behind() {
        let (tracer, rx) = recorder(4, 8, 512, TraceMetrics::unregistered());
        let ctx = SpanContext::random();
        tracer.record_with(|spans| {
            let mut forgotten = spans.start(SpanKind::Server, &ctx, None).expect("room");
            forgotten.int("n", 1);
            std::mem::forget(forgotten);
            let mut ended = spans.start(SpanKind::Server, &ctx, None).expect("room");
            ended.int("n", 2);
        });
        let buf = rx.shared.collect().pop().expect("the buffer");
        assert_eq!(buf.len(), 1);
        let got = buf.decode();
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].attributes[0].value.clone().and_then(|v| v.value),
            Some(Any::IntValue(2))
        );
    }

    /// Records spans one at a time until the exporter would wake; the spans queued then.
    fn queued_at_first_wake(tracer: &Tracer, rx: &Receiver) -> usize {
        for _ in 0..64 {
            tracer.record(&span());
            if woken(rx) {
                return queued(rx).iter().map(SpanBuf::len).sum();
            }
        }
        panic!("64 spans recorded and the exporter never woken");
    }

    #[test]
    fn the_exporter_is_woken_once_a_batch_is_queued_not_for_each_buffer() {
        // Buffers of two spans, a pool of 16 spans, batches of 6: not woken by the first two
        // full buffers, woken by the third.
        let (tracer, rx) = recorder(2, 16, 6, TraceMetrics::unregistered());
        assert_eq!(queued_at_first_wake(&tracer, &rx), 6, "a batch");
        assert!(!woken(&rx), "one wake-up per batch");
        // Batches larger than half the pool: woken at half the pool.
        let (tracer, rx) = recorder(2, 16, 512, TraceMetrics::unregistered());
        assert_eq!(queued_at_first_wake(&tracer, &rx), 8, "half the pool");
    }

    #[test]
    fn buffers_the_exporter_never_reads_are_dropped_and_counted() {
        let metrics = TraceMetrics::unregistered();
        let (tracer, rx) = recorder(2, 16, 512, metrics.clone());
        for _ in 0..3 {
            tracer.record(&span());
        }
        // One buffer of two queued, one span in the open buffer: the exporter goes.
        drop(rx);
        assert_eq!(metrics.dropped_total(DropReason::Shutdown), 2);
        for _ in 0..2 {
            tracer.record(&span());
        }
        assert_eq!(
            metrics.dropped_total(DropReason::Shutdown),
            4,
            "the open buffer, full, finds the queue closed"
        );
        assert_eq!(
            metrics.queued(),
            0,
            "nothing waits; the new open buffer is not handed off"
        );
    }

    #[test]
    fn a_lent_buffer_is_back_in_the_pool_when_its_last_slice_is_dropped() {
        // Two buffers of one span: each span fills one.
        let (tracer, rx) = recorder(1, 2, 512, TraceMetrics::unregistered());
        tracer.record(&span());
        tracer.record(&span());
        let full = queued(&rx).pop().expect("the first buffer, full");
        let expected = full.encoded().to_vec();
        let lent = rx.shared.lend(full);
        let header = lent.slice(..1);
        let body = lent.slice(1..);
        drop(lent);
        assert_eq!([&header[..], &body[..]].concat(), expected);
        // The pool is empty while the slices are held: a third span has no buffer.
        let pooled = || lock(&rx.shared.pool).len();
        assert_eq!(pooled(), 0);
        drop(header);
        assert_eq!(pooled(), 0, "one slice is still held");
        drop(body);
        assert_eq!(pooled(), 1);
        let back = lock(&rx.shared.pool).pop().expect("the buffer");
        assert!(
            back.is_empty() && back.capacity() > 0,
            "emptied, its bytes kept"
        );
    }

    #[test]
    fn noop_records_nothing() {
        let t = Tracer::noop();
        assert!(!t.is_enabled());
        t.record(&span());
    }
}

//! The recorder: finished spans copied into the calling thread's buffer, full buffers
//! handed to the exporter through a bounded queue, every buffer from a pool allocated up
//! front, so memory is bounded whatever the collector does.
//!
//! Each thread that records owns a [`Slot`]: its open buffer behind a `Mutex` that only two
//! parties ever lock, the owning thread (to copy one span in) and the exporter thread (to
//! take the buffer, a pointer copy, once per batch interval when the thread has gone
//! idle). The lock is uncontended on the request path (design rule 1 allows a lock another
//! thread takes for a pointer copy); it is what lets the exporter collect the spans of a
//! thread that stopped serving. The pool's lock is taken once per buffer of spans
//! (`buffer_spans`), not per span.
//!
//! Queue full (every buffer is full or waiting for the exporter) drops the span and counts
//! it (`reason="queue_full"`); nothing here ever waits.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio::sync::mpsc;

use crate::metrics::{DropReason, TraceMetrics};
use crate::span::Span;

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
    pub(crate) buf: Mutex<Vec<Span>>,
}

pub(crate) struct Shared {
    /// Tells this recorder's slots apart from another's in a thread's list.
    id: u64,
    pool: Mutex<Vec<Vec<Span>>>,
    queue: mpsc::UnboundedSender<Vec<Span>>,
    /// Every thread's slot, for the exporter's idle collection.
    pub(crate) slots: Mutex<Vec<Arc<Slot>>>,
    buffer_spans: usize,
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

/// The exporter's end: buffers arrive here, and go back to the pool when read.
pub(crate) struct Receiver {
    pub(crate) shared: Arc<Shared>,
    pub(crate) queue: mpsc::UnboundedReceiver<Vec<Span>>,
}

/// Creates a recorder whose buffers hold `buffer_spans` spans each and whose pool holds
/// `queue_spans` spans in all (at least two buffers).
pub(crate) fn recorder(
    buffer_spans: usize,
    queue_spans: usize,
    metrics: TraceMetrics,
) -> (Tracer, Receiver) {
    let buffer_spans = buffer_spans.max(1);
    let buffers = queue_spans.div_ceil(buffer_spans).max(2);
    let pool = (0..buffers)
        .map(|_| Vec::with_capacity(buffer_spans))
        .collect();
    // Unbounded in type only: every message is a buffer of the pool, so at most `buffers`
    // are ever queued, and a send never fails for want of room.
    let (tx, rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        pool: Mutex::new(pool),
        queue: tx,
        slots: Mutex::new(Vec::new()),
        buffer_spans,
        metrics,
        closed: AtomicBool::new(false),
    });
    let tracer = Tracer {
        shared: Some(Arc::clone(&shared)),
    };
    (tracer, Receiver { shared, queue: rx })
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

    /// Copies `span` into this thread's buffer. Never waits; drops and counts the span when
    /// every buffer is full or queued.
    pub fn record(&self, span: &Span) {
        let Some(shared) = &self.shared else { return };
        if shared.closed.load(Ordering::Relaxed) {
            shared.metrics.dropped(DropReason::Shutdown, 1);
            return;
        }
        let recorded = shared.with_slot(|slot| {
            let mut buf = lock(&slot.buf);
            if buf.len() >= shared.buffer_spans || buf.capacity() == 0 {
                // Full, or taken by the exporter: a fresh buffer from the pool.
                let Some(fresh) = lock(&shared.pool).pop() else {
                    return false;
                };
                let full = std::mem::replace(&mut *buf, fresh);
                drop(buf);
                if !full.is_empty() {
                    shared.send(full);
                } else if full.capacity() > 0 {
                    shared.give(full);
                }
                buf = lock(&slot.buf);
            }
            buf.push(span.clone());
            true
        });
        if !recorded {
            shared.metrics.dropped(DropReason::QueueFull, 1);
            return;
        }
        shared.metrics.queue.inc();
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

    pub(crate) fn send(&self, buf: Vec<Span>) {
        if let Err(mpsc::error::SendError(buf)) = self.queue.send(buf) {
            // The exporter has stopped.
            let n = buf.len() as u64;
            self.metrics.dropped(DropReason::Shutdown, n);
            self.metrics
                .queue
                .add(-i64::try_from(n).unwrap_or(i64::MAX));
            self.give(buf);
        }
    }

    /// Returns a read buffer to the pool.
    pub(crate) fn give(&self, mut buf: Vec<Span>) {
        buf.clear();
        lock(&self.pool).push(buf);
    }

    /// Takes every thread's open buffer that holds spans (the idle collection), and forgets
    /// the slots of threads that have exited.
    pub(crate) fn collect(&self) -> Vec<Vec<Span>> {
        let mut out = Vec::new();
        let mut slots = lock(&self.slots);
        for slot in slots.iter() {
            let mut buf = lock(&slot.buf);
            if !buf.is_empty() {
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
    use crate::id::{SpanId, TraceId};
    use crate::span::SpanKind;

    fn span() -> Span {
        let ctx = SpanContext {
            trace_id: TraceId::random(),
            span_id: SpanId::random(),
            sampled: true,
        };
        Span::new(SpanKind::Server, &ctx, None)
    }

    #[test]
    fn full_buffers_are_queued_and_a_full_queue_drops_and_counts() {
        let metrics = TraceMetrics::unregistered();
        // Two buffers of two spans: the third span queues the first buffer, the fifth finds
        // no buffer left.
        let (tracer, mut rx) = recorder(2, 4, metrics.clone());
        for _ in 0..4 {
            tracer.record(&span());
        }
        let queued = rx.queue.try_recv().expect("the first full buffer");
        assert_eq!(queued.len(), 2);
        tracer.record(&span());
        assert_eq!(metrics.dropped_total(DropReason::QueueFull), 1);
        // The exporter gives the buffer back: recording goes on.
        rx.shared.give(queued);
        tracer.record(&span());
        assert_eq!(metrics.dropped_total(DropReason::QueueFull), 1);
        assert_eq!(rx.queue.try_recv().expect("the second buffer").len(), 2);
    }

    #[test]
    fn idle_buffers_are_collected_and_exited_threads_forgotten() {
        let (tracer, rx) = recorder(8, 16, TraceMetrics::unregistered());
        tracer.record(&span());
        let t = tracer.clone();
        std::thread::spawn(move || t.record(&span()))
            .join()
            .expect("the thread records");
        let collected = rx.shared.collect();
        assert_eq!(collected.iter().map(Vec::len).sum::<usize>(), 2);
        assert_eq!(
            lock(&rx.shared.slots).len(),
            1,
            "the exited thread's slot is gone"
        );
        for buf in collected {
            rx.shared.give(buf);
        }
        tracer.record(&span());
        assert_eq!(rx.shared.collect().iter().map(Vec::len).sum::<usize>(), 1);
    }

    #[test]
    fn noop_records_nothing() {
        let t = Tracer::noop();
        assert!(!t.is_enabled());
        t.record(&span());
    }
}

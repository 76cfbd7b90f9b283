//! Per-thread buffers, the bounded pool they come from, and the append path that a
//! serving thread runs for every line.
//!
//! Hand-written because this is the product: the request path formats into its own
//! thread's buffer and touches nothing shared except, once per ~buffer of lines, the pool.
//!
//! Each thread that logs owns a [`Slot`]: its current buffer behind a `Mutex` that only
//! two parties ever lock, the owning thread (for one `memcpy` of a formatted line) and the
//! writer thread (to take the buffer: a pointer copy) once per flush interval and at
//! shutdown. The lock is therefore uncontended on the request path, and it is what lets
//! the writer collect an idle buffer or drain every buffer at shutdown without racing the
//! thread that fills it, whatever runtime (tokio multi-thread included) owns the thread.
//! Formatting happens before the lock, into a per-thread scratch buffer, so the lock is
//! held for the copy only.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use crate::config::OnFull;
use crate::format::Format;
use crate::record::Record;
use crate::stats::Counters;
use crate::time::TimeCache;

/// Locks, ignoring poison: every critical section here leaves the data consistent (a
/// `take`, a `push`, an `extend`), so a panic elsewhere must not stop logging.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A buffer of whole lines.
#[derive(Debug)]
pub(crate) struct Buf {
    pub(crate) data: Vec<u8>,
    /// Lines in `data`.
    pub(crate) lines: u64,
    /// Bytes of `data` already written (a write can be partial and fail halfway).
    pub(crate) written: usize,
    /// When the buffer left its thread, for the writer-lag gauge.
    pub(crate) sealed: Instant,
}

impl Buf {
    fn new(data: Vec<u8>) -> Self {
        Self {
            data,
            lines: 0,
            written: 0,
            sealed: Instant::now(),
        }
    }
}

/// Messages to the writer thread.
#[derive(Debug)]
pub(crate) enum Msg {
    /// A full buffer from a serving thread.
    Full(Buf),
    /// Look at the flags (reopen).
    Wake,
    /// Collect and write every buffer now, then answer.
    Flush(SyncSender<()>),
    /// Drain everything, fsync, exit.
    Stop,
}

/// One thread's open buffer.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    pub(crate) buf: Mutex<Option<Buf>>,
    /// Set by the writer at shutdown, so the thread-local entry can be pruned.
    pub(crate) retired: AtomicBool,
}

/// The bounded pool: every buffer that exists is allocated here, up front, so the request
/// path never allocates one and memory is `buffer_size * buffers` however slow the disk.
#[derive(Debug)]
pub(crate) struct Pool {
    free: Mutex<Vec<Vec<u8>>>,
    freed: Condvar,
    buffer_size: usize,
}

impl Pool {
    fn new(buffers: usize, buffer_size: usize) -> Self {
        let free = (0..buffers)
            .map(|_| Vec::with_capacity(buffer_size))
            .collect();
        Self {
            free: Mutex::new(free),
            freed: Condvar::new(),
            buffer_size,
        }
    }

    fn try_take(&self) -> Option<Vec<u8>> {
        lock(&self.free).pop()
    }

    /// Returns a written buffer. A buffer that grew for an oversized line is replaced by
    /// one of the configured size, so the pool's memory stays bounded.
    pub(crate) fn give(&self, mut data: Vec<u8>) {
        data.clear();
        if data.capacity() > 2 * self.buffer_size {
            data = Vec::with_capacity(self.buffer_size);
        }
        lock(&self.free).push(data);
        self.freed.notify_one();
    }

    /// Waits until a buffer is free or the log is closed (`on_full = "block"`).
    fn wait(&self, closed: &AtomicBool) {
        let mut free = lock(&self.free);
        while free.is_empty() && !closed.load(Ordering::Acquire) {
            free = self
                .freed
                .wait(free)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Wakes every blocked appender (at shutdown).
    pub(crate) fn wake_all(&self) {
        let _free = lock(&self.free);
        self.freed.notify_all();
    }
}

/// State shared by the serving threads, the writer and the control handle.
#[derive(Debug)]
pub(crate) struct Shared {
    id: u64,
    pub(crate) format: Format,
    buffer_size: usize,
    on_full: OnFull,
    /// Every thread's slot, for the writer's idle collection and the final drain.
    /// Serving threads lock it once, when they log for the first time.
    pub(crate) slots: Mutex<Vec<Arc<Slot>>>,
    pub(crate) pool: Pool,
    tx: SyncSender<Msg>,
    pub(crate) closed: AtomicBool,
    pub(crate) reopen: AtomicBool,
    /// At most one `Wake` sits in the channel, so wakes can never crowd out buffers.
    pub(crate) wake_pending: AtomicBool,
    pub(crate) counters: Counters,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// This thread's view of one log: its slot, and the scratch space it formats into.
struct Local {
    id: u64,
    slot: Arc<Slot>,
    scratch: Vec<u8>,
    times: TimeCache,
}

thread_local! {
    // A few entries at most (one per log the thread writes to): a linear scan beats a map.
    static LOCALS: RefCell<Vec<Local>> = const { RefCell::new(Vec::new()) };
}

impl Shared {
    pub(crate) fn new(
        format: Format,
        buffer_size: usize,
        buffers: usize,
        on_full: OnFull,
        tx: SyncSender<Msg>,
        counters: Counters,
    ) -> Self {
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            format,
            buffer_size,
            on_full,
            slots: Mutex::new(Vec::new()),
            pool: Pool::new(buffers, buffer_size),
            tx,
            closed: AtomicBool::new(false),
            reopen: AtomicBool::new(false),
            wake_pending: AtomicBool::new(false),
            counters,
        }
    }

    /// The request path: format `record` on this thread and append it to this thread's
    /// buffer.
    pub(crate) fn append(&self, record: &Record<'_>) {
        let done = LOCALS
            .try_with(|cell| {
                // A reentrant call (a log from inside formatting) cannot happen today;
                // if it ever does, drop and count rather than panic.
                let Ok(mut locals) = cell.try_borrow_mut() else {
                    return false;
                };
                let i = match locals.iter().position(|l| l.id == self.id) {
                    Some(i) => i,
                    None => self.register(&mut locals),
                };
                let local = &mut locals[i];
                local.scratch.clear();
                self.format
                    .write_cached(record, &mut local.scratch, &mut local.times);
                self.push(&local.slot, &local.scratch);
                true
            })
            // Only during thread teardown is the thread-local gone.
            .unwrap_or(false);
        if !done {
            self.count_dropped(1);
        }
    }

    #[cold]
    fn register(&self, locals: &mut Vec<Local>) -> usize {
        // Forget logs that have shut down, so a thread that outlives many logs (tests,
        // reloads) does not keep their slots.
        locals.retain(|l| !l.slot.retired.load(Ordering::Relaxed));
        let slot = Arc::new(Slot::default());
        lock(&self.slots).push(Arc::clone(&slot));
        locals.push(Local {
            id: self.id,
            slot,
            scratch: Vec::with_capacity(512),
            times: TimeCache::default(),
        });
        locals.len() - 1
    }

    fn push(&self, slot: &Slot, line: &[u8]) {
        loop {
            let mut open = lock(&slot.buf);
            // Checked under the slot lock: the writer sets `closed` before it takes each
            // slot's buffer at shutdown, so a line either lands in a buffer the writer
            // will take, or sees `closed` and is counted. Nothing slips between.
            if self.closed.load(Ordering::Acquire) {
                drop(open);
                self.count_dropped(1);
                return;
            }
            if let Some(buf) = open.as_mut() {
                // An oversized line goes into an empty buffer anyway (it grows once).
                if buf.data.len() + line.len() <= self.buffer_size || buf.data.is_empty() {
                    buf.data.extend_from_slice(line);
                    buf.lines += 1;
                    return;
                }
                let full = open.take().expect("matched Some just above");
                // Sent under the slot lock, so the final drain sees every sent buffer.
                self.seal(full);
            }
            if let Some(data) = self.pool.try_take() {
                let mut buf = Buf::new(data);
                buf.data.extend_from_slice(line);
                buf.lines = 1;
                *open = Some(buf);
                return;
            }
            drop(open);
            match self.on_full {
                OnFull::Drop => {
                    self.count_dropped(1);
                    return;
                }
                OnFull::Block => self.pool.wait(&self.closed),
            }
        }
    }

    fn seal(&self, mut buf: Buf) {
        buf.sealed = Instant::now();
        if let Err(
            TrySendError::Full(Msg::Full(buf)) | TrySendError::Disconnected(Msg::Full(buf)),
        ) = self.tx.try_send(Msg::Full(buf))
        {
            // The channel holds more messages than there are buffers, so it is never full
            // of buffers; it is disconnected only if the writer thread died.
            self.count_dropped(buf.lines);
            self.pool.give(buf.data);
        }
    }

    pub(crate) fn count_dropped(&self, lines: u64) {
        self.counters.dropped(lines);
    }

    /// Sends a `Wake` unless one is already queued.
    pub(crate) fn wake(&self) {
        if !self.wake_pending.swap(true, Ordering::AcqRel) && self.tx.try_send(Msg::Wake).is_err() {
            self.wake_pending.store(false, Ordering::Release);
        }
    }

    pub(crate) fn send(&self, msg: Msg) -> bool {
        self.tx.send(msg).is_ok()
    }
}

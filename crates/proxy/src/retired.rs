//! Snapshots a reload replaced, kept until no connection holds them and then freed on a
//! thread of their own, never on a serving thread.
//!
//! A downstream connection keeps the snapshot it started with (`conn::ConnCtx`), so the
//! last reference to a replaced snapshot used to be dropped by whichever serving thread
//! closed the last connection from before the reload. Freeing a snapshot is freeing its
//! whole route table: ~0.2 s of one core for 100,000 routes (a `perf` profile of a start
//! and reload of `tailguard lab routes`' table), a stall of every connection on that
//! thread. Here the gateway keeps one more reference to each replaced snapshot, so a
//! connection's drop is only a decrement, and a reaper thread at nice 19 frees each
//! one once that reference is the last (nice, not `SCHED_IDLE`: memory freed late behind a
//! host's batch jobs would be memory held). The thread runs only while something waits to be
//! freed.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tailguard_metrics::{Priority, set_thread_priority};

use crate::snapshot::Snapshot;

/// How often the reaper looks: a replaced snapshot outlives its last connection by at
/// most this.
const REAP_EVERY: Duration = Duration::from_secs(1);

/// The replaced snapshots that connections may still hold.
#[derive(Debug, Default)]
pub(crate) struct Retired {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    snapshots: Vec<Arc<Snapshot>>,
    /// Whether a reaper thread runs (it stops when nothing is left to free).
    reaping: bool,
}

impl Retired {
    /// Keeps `old` until no connection holds it; starts the reaper if none runs.
    pub(crate) fn keep(&self, old: Arc<Snapshot>) {
        let mut inner = lock(&self.inner);
        inner.snapshots.push(old);
        if inner.reaping {
            return;
        }
        let shared = Arc::clone(&self.inner);
        let started = std::thread::Builder::new()
            .name("tailguard-reaper".into())
            .spawn(move || reap(&shared));
        match started {
            Ok(_) => inner.reaping = true,
            // Nothing is lost: the snapshots stay listed, and the next reload tries again.
            Err(e) => tracing::warn!("cannot start the snapshot reaper thread: {e}"),
        }
    }

    /// How many replaced snapshots are not freed yet.
    pub(crate) fn len(&self) -> usize {
        lock(&self.inner).snapshots.len()
    }
}

/// The reaper: every [`REAP_EVERY`], frees the snapshots only it still holds; returns
/// once none is left.
fn reap(inner: &Mutex<Inner>) {
    set_thread_priority(Priority::Nice(19), "snapshot reaper");
    loop {
        std::thread::sleep(REAP_EVERY);
        let (unused, stop) = {
            let mut inner = lock(inner);
            // A count of one is the list's own reference: no connection can take it again,
            // since every other path to a snapshot goes through the gateway's current one.
            let (unused, held): (Vec<_>, Vec<_>) = std::mem::take(&mut inner.snapshots)
                .into_iter()
                .partition(|s| Arc::strong_count(s) == 1);
            inner.snapshots = held;
            // Stopping is decided under the lock, so a snapshot kept after it starts a
            // reaper of its own.
            let stop = inner.snapshots.is_empty();
            inner.reaping = !stop;
            (unused, stop)
        };
        // Freed here, outside the lock, at this thread's priority.
        drop(unused);
        if stop {
            return;
        }
    }
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

//! Which shard the calling thread writes: a per-thread index handed out round-robin.
//!
//! Every series keeps one cell per shard and a thread only ever adds into the cells of its
//! own shard, so two serving threads never write the same cache line (design.md §2 rule 3),
//! and a counter's add is a plain load and store, not an atomic read-modify-write. Threads
//! beyond the shard count share one extra region, where adds are atomic: exact, only slower.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // `const` init and a `Copy` type: the access compiles to a plain TLS load, no lazy
    // registration, no destructor.
    static THREAD_INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The index of threads that record into the shared region ([`use_shared_shard`]): above
/// every shard mask.
const SHARED_INDEX: usize = usize::MAX >> 1;

/// Makes the calling thread record into the region shared by threads without a shard of
/// their own, instead of taking a shard at its first record. Call it at the start of
/// threads that record rarely (a control loop, a sampler, an exporter), so that the shards
/// go to the threads that serve traffic: a shard's only writer adds with a plain load and
/// store, a thread in the shared region with an atomic add.
pub fn use_shared_shard() {
    THREAD_INDEX.with(|slot| slot.set(SHARED_INDEX));
}

/// The calling thread's index: assigned on first use, consecutive across threads, so a
/// runtime's workers started together land on distinct shards.
#[inline]
pub(crate) fn thread_index() -> usize {
    THREAD_INDEX.with(|slot| {
        let index = slot.get();
        if index != usize::MAX {
            index
        } else {
            let index = NEXT_THREAD.fetch_add(1, Ordering::Relaxed) & (usize::MAX >> 1);
            slot.set(index);
            index
        }
    })
}

/// Shards per series by default: the machine's parallelism rounded up to a power of two (so
/// the shard is a mask, not a division), at most 64.
pub(crate) fn default_shards() -> usize {
    static SHARDS: OnceLock<usize> = OnceLock::new();
    *SHARDS.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, 64)
            .next_power_of_two()
    })
}

/// Rounds a requested shard count to what the storage supports.
pub(crate) fn normalize_shards(requested: usize) -> usize {
    requested.clamp(1, 64).next_power_of_two()
}

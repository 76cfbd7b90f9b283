//! Per-thread slots: each serving thread gets its own cache-line-padded copy of a value, so
//! request-path state is never written by two threads (design.md §2, rule 3).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Number of slots; threads beyond this share slots round-robin (correct, just shared).
pub const SHARDS: usize = 64;

static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SHARD: usize = NEXT_THREAD.fetch_add(1, Ordering::Relaxed) % SHARDS;
}

/// This thread's slot index, assigned on first use.
#[inline]
pub fn index() -> usize {
    SHARD.with(|s| *s)
}

/// A value padded to its own pair of cache lines (128 bytes: adjacent-line prefetch on
/// x86 pulls lines in pairs).
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Padded<T>(pub T);

/// One padded `T` per thread slot.
#[derive(Debug)]
pub struct PerThread<T> {
    slots: Box<[Padded<T>]>,
}

impl<T> PerThread<T> {
    /// Builds every slot with `init(slot_index)`.
    pub fn new(mut init: impl FnMut(usize) -> T) -> PerThread<T> {
        PerThread {
            slots: (0..SHARDS).map(|i| Padded(init(i))).collect(),
        }
    }

    /// The calling thread's slot.
    pub fn get(&self) -> &T {
        &self.slots[index()].0
    }

    /// Every slot, for summing.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|p| &p.0)
    }
}

impl<T> PerThread<Mutex<Vec<T>>> {
    /// Empties every thread's list and drops what it held (outside each slot's lock): a
    /// pool whose endpoint left the config closes its connections this way.
    pub fn clear_all(&self) {
        for slot in self.iter() {
            // A panic while holding a slot cannot leave the Vec half-changed.
            let held = std::mem::take(&mut *slot.lock().unwrap_or_else(|p| p.into_inner()));
            drop(held);
        }
    }
}

//! The state of local rate limits: GCRA over one atomic per bucket, and a fixed-size,
//! set-associative table of buckets by key, allocated at config load.
//!
//! **GCRA** (the generic cell rate algorithm, ATM's policer; a token bucket stated as one
//! number): a bucket is its *theoretical arrival time* (TAT), the instant at which it would
//! be full again. A request at `now` is admitted if `max(TAT, now) + interval` is at most
//! `burst * interval` ahead of `now`, and then that becomes the new TAT, written with one
//! compare-exchange. So `burst` requests pass at once and then one per `interval`, however
//! many threads ask: the limit is exact across serving threads (10/s on two threads admits
//! 10/s, not 20), with no lock. A refusal only reads the word. A TAT at or before `now` is a
//! full bucket, so a bucket never touched (0) needs no initialisation.
//!
//! **The key table** holds a bucket per key (a client address, a header value) in a fixed
//! number of slots, a power of two of sets of [`WAYS`] slots each: a slot is a 64-bit key
//! fingerprint and a TAT, the 8 fingerprints of a set on one cache line and their TATs on
//! the next (one 128-byte, aligned pair). A key hashes to one set; a key already there is
//! found by comparing 8 words, and then its TAT is updated in place: no lock, no allocation,
//! no growth. A new key takes a slot whose bucket is full again (its key idle for at least
//! `burst * interval`: forgetting it loses nothing, the time-based eviction), else the slot
//! with the oldest TAT (the least recently charged key, an approximate LRU), which counts as
//! an eviction. Memory is `16 bytes * capacity` for ever, whatever the traffic: a flood of
//! distinct client addresses evicts, it cannot grow the table.
//!
//! Exactness caveats, all bounded and all rare at a sensible `max_keys`:
//! - an evicted live key starts again with a full burst: while keys are evicted (the
//!   `evictions` metric counts them) a limit can admit more than it says. Size `max_keys`
//!   above the number of clients active within a burst's refill time;
//! - two threads inserting keys into one set at once may race for one slot; the loser looks
//!   again (and finds its key if the winner inserted the same one); after three lost races
//!   it charges the set's oldest bucket without claiming it (stricter, never looser);
//! - a thread that found its key just as another thread evicted it charges the new key's
//!   bucket once (its own request is judged on that bucket);
//! - two keys with the same 64-bit fingerprint in one set share a bucket (about one pair in
//!   2^40 at the largest table).
//!
//! Written by hand because this is the product itself: `governor`'s keyed limiter (the
//! usual crate) keeps its keys in a `DashMap`, which takes a shard lock on every check and
//! grows with every distinct key until someone calls `retain_recent`; neither fits the
//! request path's rules (design.md §2) or a flood of spoofed keys.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};

/// Slots per set: 8 fingerprints fill one 64-byte cache line.
pub const WAYS: usize = 8;

pub use tailguard_config::rate_limit::MAX_KEYS;

/// The rate and burst of one limit, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    /// Time between two requests at the sustained rate.
    interval: u64,
    /// How far ahead of now a TAT may run: `burst * interval`.
    tolerance: u64,
}

impl Gcra {
    /// `rate` requests per `period_ns`, `burst` at once (both at least 1).
    pub fn new(rate: u64, period_ns: u64, burst: u64) -> Gcra {
        let interval = (period_ns / rate.max(1)).max(1);
        Gcra {
            interval,
            tolerance: interval.saturating_mul(burst.max(1)),
        }
    }

    /// Charges one request at `now` (nanoseconds on the limits' clock) to the bucket `tat`:
    /// `Ok` if admitted, else `Err(ns)` until a request would be.
    #[inline]
    pub fn acquire(&self, tat: &AtomicU64, now: u64) -> Result<(), u64> {
        let mut current = tat.load(Ordering::Relaxed);
        loop {
            let next = current.max(now).saturating_add(self.interval);
            let ahead = next - now;
            if ahead > self.tolerance {
                return Err(ahead - self.tolerance);
            }
            // Relaxed: the word is the whole state; no other memory is published with it.
            match tat.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(actual) => current = actual,
            }
        }
    }

    /// Time between two requests at the sustained rate, in nanoseconds.
    pub fn interval(&self) -> u64 {
        self.interval
    }
}

/// One set: the fingerprints on one cache line, their buckets on the next.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Set {
    /// Key fingerprints; 0 is a slot never used.
    keys: [AtomicU64; WAYS],
    /// Each slot's TAT.
    tats: [AtomicU64; WAYS],
}

/// A key's bucket, as [`KeyTable::bucket`] found or made it.
#[derive(Debug)]
pub struct Bucket<'a> {
    /// The TAT to charge.
    pub tat: &'a AtomicU64,
    /// A live key was evicted to make room for this one.
    pub evicted: bool,
}

/// Buckets by key in a fixed number of slots; see the module doc.
#[derive(Debug)]
pub struct KeyTable {
    sets: Box<[Set]>,
    mask: usize,
    /// SipHash-1-3 with keys drawn once per table: a client choosing header values cannot
    /// aim its keys at one set to evict another client's bucket.
    hasher: RandomState,
}

impl KeyTable {
    /// A table for at least `max_keys` keys (rounded up to a power of two of sets).
    pub fn new(max_keys: u64) -> KeyTable {
        let max_keys = usize::try_from(max_keys.clamp(1, MAX_KEYS)).unwrap_or(usize::MAX);
        let sets = max_keys.div_ceil(WAYS).next_power_of_two();
        KeyTable {
            sets: (0..sets).map(|_| Set::default()).collect(),
            mask: sets - 1,
            hasher: RandomState::new(),
        }
    }

    /// Keys the table holds at most.
    pub fn capacity(&self) -> usize {
        self.sets.len() * WAYS
    }

    /// Bytes the table occupies on the heap (all of it allocated at construction).
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of_val::<[Set]>(&self.sets)
    }

    /// The hash [`KeyTable::bucket`] takes for `key`. Hashing the key is inherent to a
    /// keyed limit (design.md §2 rule 2 is about finding metrics, which this is not): ~20 ns
    /// for an address, measured in `crates/proxy/benches/rate_limit.rs`.
    #[inline]
    pub fn hash(&self, key: impl Hash) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The bucket of the key hashed to `hash`, claiming a slot for a new key; `now` decides
    /// which buckets are full again (free to take).
    pub fn bucket(&self, hash: u64, now: u64) -> Bucket<'_> {
        let set = &self.sets[hash as usize & self.mask];
        // Never 0, which marks a slot never used.
        let fingerprint = hash | 1;
        let mut oldest = 0;
        for _ in 0..3 {
            if let Some(i) = set
                .keys
                .iter()
                .position(|k| k.load(Ordering::Relaxed) == fingerprint)
            {
                return Bucket {
                    tat: &set.tats[i],
                    evicted: false,
                };
            }
            // A miss: the first slot never used or whose bucket is full again, else the
            // oldest (smallest TAT).
            let mut free = None;
            let mut oldest_tat = u64::MAX;
            for i in 0..WAYS {
                let tat = set.tats[i].load(Ordering::Relaxed);
                if tat <= now {
                    free = Some(i);
                    break;
                }
                if tat < oldest_tat {
                    (oldest, oldest_tat) = (i, tat);
                }
            }
            let (slot, evicting) = match free {
                Some(i) => (i, false),
                None => (oldest, true),
            };
            let old_key = set.keys[slot].load(Ordering::Relaxed);
            if set.keys[slot]
                .compare_exchange(old_key, fingerprint, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                if evicting {
                    // The new key starts with a full bucket, not with the evicted one's debt.
                    set.tats[slot].store(0, Ordering::Relaxed);
                }
                // A free slot's TAT is already at or before now: a full bucket as it is.
                return Bucket {
                    tat: &set.tats[slot],
                    evicted: evicting,
                };
            }
            // Another thread took the slot first: look again (it may have been this key).
        }
        Bucket {
            tat: &set.tats[oldest],
            evicted: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn gcra_admits_the_burst_then_the_rate() {
        // 10 per second, burst 5.
        let g = Gcra::new(10, SECOND, 5);
        let tat = AtomicU64::new(0);
        let now = 7 * SECOND;
        for _ in 0..5 {
            assert_eq!(g.acquire(&tat, now), Ok(()));
        }
        // The sixth waits one interval (100 ms).
        assert_eq!(g.acquire(&tat, now), Err(SECOND / 10));
        // A refusal charges nothing: 100 ms later exactly one more passes.
        assert_eq!(g.acquire(&tat, now + SECOND / 10), Ok(()));
        assert!(g.acquire(&tat, now + SECOND / 10).is_err());
        // After a full refill time the whole burst is back, and no more.
        let later = now + 2 * SECOND;
        for _ in 0..5 {
            assert_eq!(g.acquire(&tat, later), Ok(()));
        }
        assert!(g.acquire(&tat, later).is_err());
    }

    #[test]
    fn a_key_bucket_refills_with_time() {
        let g = Gcra::new(2, SECOND, 2);
        let table = KeyTable::new(64);
        let key = table.hash("client-a");
        let now = SECOND;
        for _ in 0..2 {
            assert!(g.acquire(table.bucket(key, now).tat, now).is_ok());
        }
        assert_eq!(
            g.acquire(table.bucket(key, now).tat, now),
            Err(SECOND / 2),
            "the same slot is found again, empty"
        );
        let refilled = now + SECOND / 2;
        assert!(g.acquire(table.bucket(key, refilled).tat, refilled).is_ok());
        // Another key has its own bucket.
        let other = table.hash("client-b");
        assert!(g.acquire(table.bucket(other, now).tat, now).is_ok());
    }

    #[test]
    fn a_full_set_evicts_its_oldest_key_and_says_so() {
        let g = Gcra::new(1, SECOND, 1);
        // One set: 8 slots.
        let table = KeyTable::new(8);
        assert_eq!(table.capacity(), WAYS);
        let now = 10 * SECOND;
        // Eight keys charged at increasing times: every bucket is empty (live) at `now`.
        for k in 0..WAYS as u64 {
            let t = now + k;
            let b = table.bucket(table.hash(k), t);
            assert!(!b.evicted);
            assert!(g.acquire(b.tat, t).is_ok());
        }
        let t = now + 100;
        let ninth = table.bucket(table.hash(100u64), t);
        assert!(ninth.evicted, "all slots live: one is evicted");
        assert!(g.acquire(ninth.tat, t).is_ok(), "the new key starts full");
        // Key 0 (the oldest) was the one evicted: it comes back with a full bucket (the
        // caveat the module doc names), taking another live slot.
        let back = table.bucket(table.hash(0u64), t);
        assert!(back.evicted);
        assert!(g.acquire(back.tat, t).is_ok());
        // Key 7 (the newest) kept its slot and its empty bucket.
        let kept = table.bucket(table.hash(7u64), t);
        assert!(!kept.evicted);
        assert!(g.acquire(kept.tat, t).is_err());
    }

    #[test]
    fn idle_keys_are_reused_without_eviction() {
        let g = Gcra::new(1, SECOND, 1);
        let table = KeyTable::new(8);
        let now = SECOND;
        for k in 0..WAYS as u64 {
            let b = table.bucket(table.hash(k), now);
            assert!(g.acquire(b.tat, now).is_ok());
        }
        // One second later every bucket is full again: new keys take those slots freely.
        let later = now + 2 * SECOND;
        for k in 100..100 + WAYS as u64 {
            let b = table.bucket(table.hash(k), later);
            assert!(!b.evicted);
            assert!(g.acquire(b.tat, later).is_ok());
        }
    }

    #[test]
    fn memory_is_bounded_by_max_keys_whatever_the_keys() {
        let table = KeyTable::new(1000);
        // 1000 keys round up to 128 sets of 8.
        assert_eq!(table.capacity(), 1024);
        assert_eq!(table.heap_bytes(), 1024 * 16);
        let g = Gcra::new(1, SECOND, 1);
        let mut evicted = 0;
        for k in 0..100_000u64 {
            let b = table.bucket(table.hash(k), SECOND);
            evicted += usize::from(b.evicted);
            let _ = g.acquire(b.tat, SECOND);
        }
        assert_eq!(table.heap_bytes(), 1024 * 16);
        assert!(evicted >= 100_000 - 1024, "evicted {evicted}");
    }

    #[test]
    fn two_threads_on_one_bucket_admit_the_limit_exactly() {
        let g = Gcra::new(1000, SECOND, 100);
        let tat = AtomicU64::new(0);
        let now = SECOND;
        let admitted: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|_| s.spawn(|| (0..10_000).filter(|_| g.acquire(&tat, now).is_ok()).count()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(admitted, 100);
    }
}

//! The state of `scope = "global"` limits on one gateway: per key, the fleet's counts as last
//! seen in Redis and what this gateway admitted since, the admission decision made from them
//! alone (no request waits on Redis), and what the sync thread ([`super::sync`]) takes out
//! and puts back.
//!
//! **The algorithm: a sliding window counter per key** (two fixed windows of `per`, the
//! previous one weighted by the share of it still inside the sliding window, as Cloudflare's
//! and nginx-style counters do). Windows are numbered by wall-clock time (`unix_ms / per`),
//! so every gateway of a fleet counts into the same Redis key `…:{window}:{key id}`. A
//! request at `elapsed` into window `w` is admitted while
//!
//! ```text
//! estimate = prev · (per − elapsed) / per + cur  <  rate
//! prev = fleet[w−1] + unsent[w−1]      cur = fleet[w] + unsent[w]
//! ```
//!
//! where `fleet` is the fleet's total as the last sync returned it (this gateway's sent
//! counts included) and `unsent` what this gateway admitted since it last sent. Every
//! `sync_ms` the sync thread adds `unsent` to Redis and reads the totals back in one script
//! call per batch of keys; Redis's keys expire two windows after they start.
//!
//! **While Redis does not answer** ([`Fleet::fail`]) the decision changes by
//! `on_redis_error`: `local_share` counts this gateway's own admissions (`own`) against
//! `rate / fleet size` (the size last seen through the heartbeat), `allow` admits, `deny`
//! refuses. Counts admitted meanwhile stay `unsent` and reach Redis at the first sync that
//! works again, so the fleet's totals catch up.
//!
//! **The state** is a table of shards, each a `Mutex<HashMap>` of the keys hashed to it
//! (SipHash with keys drawn per table, like the local table, so a client cannot aim keys at
//! one shard). A check holds its shard's lock for a few dozen nanoseconds; the other takers
//! are the other serving thread on the same shard and the sync thread, which holds it only
//! to copy or store a few counters per key, never across I/O. Memory is bounded by
//! `max_keys`: a full shard first forgets keys of windows that ended, then evicts one.
//! The key's id in Redis is the first 64 bits of its SHA-1, computed once when the key
//! enters the table, identical on every gateway.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tailguard_config::OnRedisError;
use tailguard_metrics::Counter;

/// Shards per table: a power of two; enough that two serving threads rarely meet on one.
const SHARDS: usize = 64;

/// Entries looked at for one that is not waiting to be sent, before a full shard evicts
/// whichever it finds.
const EVICT_LOOK: usize = 16;

/// How this gateway's global limits decide, as the sync thread last found Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Redis answers: count against the fleet's totals.
    Fleet,
    /// Redis does not answer: `on_redis_error` decides.
    Fallback(OnRedisError),
}

/// What every global limit of the process shares: the mode, the fleet size last seen, and
/// the tables the sync thread trades counts for.
#[derive(Debug)]
pub struct Fleet {
    /// 0: Redis answers; 1 + `on_redis_error` as a number: falling back.
    mode: AtomicU8,
    /// `on_redis_error` (as [`on_error_code`]), applied at the next failure.
    on_error: AtomicU8,
    /// Gateways whose heartbeat Redis last held (at least 1).
    size: AtomicU64,
    tables: Mutex<Vec<Weak<GlobalTable>>>,
}

impl Default for Fleet {
    fn default() -> Fleet {
        Fleet {
            mode: AtomicU8::new(0),
            on_error: AtomicU8::new(on_error_code(OnRedisError::LocalShare)),
            size: AtomicU64::new(1),
            tables: Mutex::new(Vec::new()),
        }
    }
}

fn on_error_code(e: OnRedisError) -> u8 {
    match e {
        OnRedisError::LocalShare => 0,
        OnRedisError::Allow => 1,
        OnRedisError::Deny => 2,
    }
}

fn on_error_from(code: u8) -> OnRedisError {
    match code {
        1 => OnRedisError::Allow,
        2 => OnRedisError::Deny,
        _ => OnRedisError::LocalShare,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a shard leaves counters, never a broken invariant.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Fleet {
    /// The mode a check decides in.
    #[inline]
    pub fn mode(&self) -> Mode {
        match self.mode.load(Ordering::Relaxed) {
            0 => Mode::Fleet,
            code => Mode::Fallback(on_error_from(code - 1)),
        }
    }

    /// Sets what a failure falls back to (`[redis] on_redis_error`, on start and reload).
    pub fn set_on_error(&self, on_error: OnRedisError) {
        self.on_error
            .store(on_error_code(on_error), Ordering::Relaxed);
        if self.mode.load(Ordering::Relaxed) != 0 {
            self.mode
                .store(1 + on_error_code(on_error), Ordering::Relaxed);
        }
    }

    /// A sync worked: count against the fleet again; `size` gateways are alive.
    pub fn succeed(&self, size: u64) {
        self.size.store(size.max(1), Ordering::Relaxed);
        self.mode.store(0, Ordering::Relaxed);
    }

    /// A sync failed: fall back. Returns whether this is the start of a fallback.
    pub fn fail(&self) -> bool {
        let code = 1 + self.on_error.load(Ordering::Relaxed);
        self.mode.swap(code, Ordering::Relaxed) == 0
    }

    /// Whether global limits are falling back.
    pub fn is_fallback(&self) -> bool {
        self.mode.load(Ordering::Relaxed) != 0
    }

    /// The fleet size last seen (at least 1).
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    /// Registers a table with the sync thread (it holds it weakly: a table no snapshot
    /// uses any more is dropped, and forgotten at the next sync).
    fn register(&self, table: &Arc<GlobalTable>) {
        let mut tables = lock(&self.tables);
        tables.retain(|t| t.strong_count() > 0);
        tables.push(Arc::downgrade(table));
    }

    /// The tables in use.
    pub fn tables(&self) -> Vec<Arc<GlobalTable>> {
        let mut tables = lock(&self.tables);
        tables.retain(|t| t.strong_count() > 0);
        tables.iter().filter_map(Weak::upgrade).collect()
    }
}

/// A hasher for keys that are already SipHash outputs: passes the `u64` through.
#[derive(Debug, Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; fold anything else in rather than drop it.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// One key's counts. Index 0 is window `window`, index 1 the window before it.
#[derive(Debug, Clone, Default)]
struct Entry {
    /// The key's id in Redis (the first 64 bits of its SHA-1).
    stable: u64,
    window: u64,
    /// The fleet's totals as the last sync returned them.
    fleet: [u64; 2],
    /// Admitted here (what `local_share` counts).
    own: [u64; 2],
    /// Admitted here and not yet added to Redis.
    unsent: [u64; 2],
    /// Listed in its shard's `dirty`: the next sync sends and refreshes it.
    dirty: bool,
}

impl Entry {
    /// Moves the counts to window `w` (never back).
    fn roll(&mut self, w: u64) {
        if w <= self.window {
            return;
        }
        if w == self.window + 1 {
            self.fleet = [0, self.fleet[0]];
            self.own = [0, self.own[0]];
            self.unsent = [0, self.unsent[0]];
        } else {
            self.fleet = [0, 0];
            self.own = [0, 0];
            self.unsent = [0, 0];
        }
        self.window = w;
    }
}

#[derive(Debug, Default)]
struct Shard {
    entries: HashMap<u64, Entry, BuildHasherDefault<IdHasher>>,
    /// Keys with requests since the last sync, in arrival order.
    dirty: Vec<u64>,
    /// The window in which this shard last dropped ended keys.
    pruned: u64,
}

/// A key's counts as the sync thread took them: what it sends, and where the answer goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    shard: usize,
    hash: u64,
    /// The key's id in Redis.
    pub stable: u64,
    /// The window the counts are for.
    pub window: u64,
    /// Added to the window's count and to the previous window's.
    pub sent: [u64; 2],
}

/// The decision of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Admitted.
    Admit,
    /// Refused; a request would be admitted in about this many milliseconds.
    Refuse(u64),
}

/// One global limit's keys on this gateway; see the module doc.
#[derive(Debug)]
pub struct GlobalTable {
    /// `tailguard:rl:{route|listener}:{owner}:`, before `{window}:{key id}`.
    prefix: Box<str>,
    limit: u64,
    window_ms: u64,
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    shard_cap: usize,
    fleet: Arc<Fleet>,
    evictions: AtomicU64,
    /// The shard the next sync's refresh of quiet keys starts at.
    cursor: std::sync::atomic::AtomicUsize,
    /// `tailguard_rate_limit_evictions_total` of the limit.
    evicted: Option<Counter>,
}

impl GlobalTable {
    /// A table for `rate` requests per `window_ms`, at most `max_keys` keys, named in Redis
    /// by `scope` and `owner`, registered with `fleet`'s sync.
    pub fn new(
        scope: &str,
        owner: &str,
        rate: u64,
        window_ms: u64,
        max_keys: u64,
        fleet: &Arc<Fleet>,
    ) -> Arc<GlobalTable> {
        GlobalTable::counted(scope, owner, rate, window_ms, max_keys, fleet, None)
    }

    /// [`GlobalTable::new`], counting evictions into `evicted`.
    pub fn counted(
        scope: &str,
        owner: &str,
        rate: u64,
        window_ms: u64,
        max_keys: u64,
        fleet: &Arc<Fleet>,
        evicted: Option<Counter>,
    ) -> Arc<GlobalTable> {
        let max_keys = usize::try_from(max_keys.max(1)).unwrap_or(usize::MAX);
        let table = Arc::new(GlobalTable {
            prefix: format!("tailguard:rl:{scope}:{owner}:").into_boxed_str(),
            limit: rate.max(1),
            window_ms: window_ms.max(1),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            shard_cap: max_keys.div_ceil(SHARDS).max(1),
            fleet: Arc::clone(fleet),
            evictions: AtomicU64::new(0),
            cursor: std::sync::atomic::AtomicUsize::new(0),
            evicted,
        });
        fleet.register(&table);
        table
    }

    /// Charges a request for `key` at `now_ms` (Unix milliseconds).
    pub fn check(&self, key: &[u8], now_ms: u64) -> Decision {
        let hash = self.hasher.hash_one(key);
        let index = hash as usize & (SHARDS - 1);
        let window = now_ms / self.window_ms;
        let mode = self.fleet.mode();
        let size = self.fleet.size();
        let mut shard = lock(&self.shards[index]);
        let shard = &mut *shard;
        if !shard.entries.contains_key(&hash) {
            self.make_room(shard, window);
            shard.entries.insert(
                hash,
                Entry {
                    stable: stable_id(key),
                    window,
                    ..Entry::default()
                },
            );
        }
        let entry = shard
            .entries
            .get_mut(&hash)
            .expect("inserted above if it was missing");
        entry.roll(window);
        if !entry.dirty {
            entry.dirty = true;
            shard.dirty.push(hash);
        }
        // A request whose start is older than a window another thread already moved the
        // key to counts in that newer window.
        let elapsed = if entry.window == window {
            now_ms % self.window_ms
        } else {
            0
        };
        let (prev, cur, limit) = match mode {
            Mode::Fleet => (
                entry.fleet[1] + entry.unsent[1],
                entry.fleet[0] + entry.unsent[0],
                self.limit,
            ),
            Mode::Fallback(OnRedisError::LocalShare) => {
                (entry.own[1], entry.own[0], (self.limit / size).max(1))
            }
            Mode::Fallback(OnRedisError::Allow) => (0, 0, u64::MAX),
            Mode::Fallback(OnRedisError::Deny) => return Decision::Refuse(1000),
        };
        let w = u128::from(self.window_ms);
        let estimate = u128::from(prev) * (w - u128::from(elapsed)) + u128::from(cur) * w;
        if estimate < u128::from(limit) * w {
            entry.own[0] += 1;
            entry.unsent[0] += 1;
            Decision::Admit
        } else {
            Decision::Refuse(wait_ms(prev, cur, limit, elapsed, self.window_ms))
        }
    }

    /// Makes room for one more key in a full shard: drops keys whose windows ended (once a
    /// window per shard), else evicts one not waiting to be sent if one is near the front.
    fn make_room(&self, shard: &mut Shard, window: u64) {
        if shard.entries.len() < self.shard_cap {
            return;
        }
        if shard.pruned < window {
            shard.pruned = window;
            shard
                .entries
                .retain(|_, e| e.dirty || e.window + 1 >= window);
            if shard.entries.len() < self.shard_cap {
                return;
            }
        }
        let victim = shard
            .entries
            .iter()
            .take(EVICT_LOOK)
            .find(|(_, e)| !e.dirty)
            .or_else(|| shard.entries.iter().next())
            .map(|(h, _)| *h);
        if let Some(h) = victim {
            shard.entries.remove(&h);
            self.evictions.fetch_add(1, Ordering::Relaxed);
            if let Some(c) = &self.evicted {
                c.inc();
            }
        }
    }

    /// Keys evicted from a full table so far (each lost its counts here).
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// The Redis key of key id `stable` in `window`.
    pub fn redis_key(&self, stable: u64, window: u64) -> String {
        format!("{}{window}:{stable:016x}", self.prefix)
    }

    /// How long Redis keeps a window's count: the window, the next one (where it is the
    /// previous window), and a second of slack for clocks.
    pub fn ttl_ms(&self) -> u64 {
        2 * self.window_ms + 1000
    }

    /// Takes every key with requests since the last sync into `out` (what each sends), then
    /// up to `*refresh` keys without requests that are live in `window` or the one before
    /// (their totals only read), lowering `*refresh` by as many: a gateway that sees a key
    /// rarely would otherwise judge its next request on the totals of its last one, however
    /// old (the overshoot that left 1,000 keys of 6 a minute admitting 6-8). The refresh
    /// starts where the last one stopped, so every live key is read in turn when there are
    /// more than the budget.
    pub fn take_dirty(&self, out: &mut Vec<Pending>, window: u64, refresh: &mut usize) {
        let start = self.cursor.load(Ordering::Relaxed);
        let mut next_cursor = None;
        for k in 0..SHARDS {
            let index = (start + k) % SHARDS;
            let mut shard = lock(&self.shards[index]);
            let shard = &mut *shard;
            // Quiet live keys first: those with requests are on the dirty list, taken next.
            if *refresh == 0 {
                next_cursor.get_or_insert(index);
            } else {
                for (&hash, e) in shard.entries.iter_mut() {
                    if e.dirty || e.window + 1 < window {
                        continue;
                    }
                    if *refresh == 0 {
                        next_cursor.get_or_insert(index);
                        break;
                    }
                    *refresh -= 1;
                    e.roll(window);
                    out.push(Pending {
                        shard: index,
                        hash,
                        stable: e.stable,
                        window: e.window,
                        sent: e.unsent,
                    });
                }
            }
            for hash in shard.dirty.drain(..) {
                if let Some(e) = shard.entries.get_mut(&hash) {
                    e.dirty = false;
                    out.push(Pending {
                        shard: index,
                        hash,
                        stable: e.stable,
                        window: e.window,
                        sent: e.unsent,
                    });
                }
            }
        }
        self.cursor
            .store(next_cursor.unwrap_or(start), Ordering::Relaxed);
    }

    /// Stores what Redis answered for `p`: the totals of its window and the one before.
    pub fn apply(&self, p: &Pending, totals: [u64; 2]) {
        let mut shard = lock(&self.shards[p.shard]);
        let Some(e) = shard.entries.get_mut(&p.hash) else {
            return;
        };
        // `max`: a Redis that restarted empty (or lost a key) must not hand back a count
        // below what this gateway already knew of the window.
        if e.window == p.window {
            e.fleet = [e.fleet[0].max(totals[0]), e.fleet[1].max(totals[1])];
            e.unsent[0] = e.unsent[0].saturating_sub(p.sent[0]);
            e.unsent[1] = e.unsent[1].saturating_sub(p.sent[1]);
        } else if e.window == p.window + 1 {
            // The key moved on meanwhile: the sent window is its previous one now.
            e.fleet[1] = e.fleet[1].max(totals[0]);
            e.unsent[1] = e.unsent[1].saturating_sub(p.sent[0]);
        }
    }

    /// Puts `p` back on the list after a failed sync, so its counts are sent next time.
    pub fn retry(&self, p: &Pending) {
        let mut shard = lock(&self.shards[p.shard]);
        let shard = &mut *shard;
        if let Some(e) = shard.entries.get_mut(&p.hash)
            && !e.dirty
        {
            e.dirty = true;
            shard.dirty.push(p.hash);
        }
    }

    /// The window number at `now_ms`.
    pub fn window_at(&self, now_ms: u64) -> u64 {
        now_ms / self.window_ms
    }

    /// The limit per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }
}

/// The key's id in Redis: the first 64 bits of its SHA-1, the same on every gateway (a
/// keyed hash would differ per process; a client cannot find a second key with a given
/// 64-bit SHA-1 prefix to share another's count).
fn stable_id(key: &[u8]) -> u64 {
    let digest = sha1_smol::Sha1::from(key).digest().bytes();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// Milliseconds until `prev · (w − e) / w + cur` drops below `limit` (at least 1).
fn wait_ms(prev: u64, cur: u64, limit: u64, elapsed: u64, window_ms: u64) -> u64 {
    let w = window_ms as f64;
    let (prev, cur, limit, elapsed) = (prev as f64, cur as f64, limit as f64, elapsed as f64);
    let wait = if cur >= limit {
        // Not before the window ends; then `cur` becomes the previous window and has to
        // decay to below the limit.
        (w - elapsed) + w * (1.0 - limit / cur.max(1.0))
    } else if prev > 0.0 {
        // The previous window's share has to fall by `prev + cur - limit` (plus one).
        let needed = w * (1.0 - (limit - cur) / prev);
        (needed - elapsed).max(0.0) + 1.0
    } else {
        1.0
    };
    (wait.ceil() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: u64 = 60_000;

    fn table(rate: u64, window_ms: u64, fleet: &Arc<Fleet>) -> Arc<GlobalTable> {
        GlobalTable::new("route", "r", rate, window_ms, 1000, fleet)
    }

    fn admitted(t: &GlobalTable, key: &[u8], n: usize, now_ms: u64) -> usize {
        (0..n)
            .filter(|_| t.check(key, now_ms) == Decision::Admit)
            .count()
    }

    /// Sends every dirty key to a fake Redis (`store`), as the sync thread does.
    fn sync(t: &GlobalTable, store: &mut HashMap<String, u64>) {
        let mut out = Vec::new();
        t.take_dirty(&mut out, 0, &mut 0);
        for p in &out {
            let cur = t.redis_key(p.stable, p.window);
            let prev = t.redis_key(p.stable, p.window.wrapping_sub(1));
            *store.entry(cur.clone()).or_default() += p.sent[0];
            *store.entry(prev.clone()).or_default() += p.sent[1];
            t.apply(p, [store[&cur], store[&prev]]);
        }
    }

    #[test]
    fn one_gateway_admits_the_rate_per_window_without_redis_answering_yet() {
        let fleet = Arc::default();
        let t = table(600, MINUTE, &fleet);
        let start = 1000 * MINUTE;
        assert_eq!(admitted(&t, b"k", 1000, start), 600);
        assert!(matches!(t.check(b"k", start), Decision::Refuse(_)));
        assert_eq!(admitted(&t, b"other", 10, start), 10, "keys count apart");
    }

    #[test]
    fn gateways_sharing_a_store_admit_the_rate_together() {
        let fleet_a = Arc::default();
        let fleet_b = Arc::default();
        let a = table(100, MINUTE, &fleet_a);
        let b = table(100, MINUTE, &fleet_b);
        let mut store = HashMap::new();
        let start = 500 * MINUTE;
        let mut total = 0;
        // Ten requests at each gateway between syncs.
        for step in 0..50 {
            let now = start + step * 100;
            total += admitted(&a, b"k", 10, now);
            total += admitted(&b, b"k", 10, now);
            sync(&a, &mut store);
            sync(&b, &mut store);
        }
        // Each sync interval can overshoot by what the other gateway admitted in it.
        assert!((100..=110).contains(&total), "admitted {total}");
        assert_eq!(store[&a.redis_key(stable_id(b"k"), 500)], total as u64);
    }

    #[test]
    fn the_previous_window_weighs_by_what_is_left_of_it() {
        let fleet = Arc::default();
        let t = table(100, MINUTE, &fleet);
        let start = 700 * MINUTE;
        assert_eq!(admitted(&t, b"k", 100, start), 100);
        // A quarter into the next window, 75 of the previous 100 still count.
        let q = start + MINUTE + MINUTE / 4;
        assert_eq!(admitted(&t, b"k", 100, q), 25);
        match t.check(b"k", q) {
            Decision::Refuse(ms) => assert!(ms > 0 && ms <= MINUTE, "{ms}"),
            Decision::Admit => panic!("admitted past the limit"),
        }
        // Two windows on, nothing of the old counts is left.
        assert_eq!(admitted(&t, b"k", 200, start + 3 * MINUTE), 100);
    }

    #[test]
    fn a_restarted_gateway_learns_the_fleet_count_at_its_first_sync() {
        let mut store = HashMap::new();
        let start = 900 * MINUTE;
        let a = table(100, MINUTE, &Arc::default());
        assert_eq!(admitted(&a, b"k", 80, start), 80);
        sync(&a, &mut store);
        // A new process: nothing local, but the first sync brings the fleet's 80 back.
        let fresh = table(100, MINUTE, &Arc::default());
        assert_eq!(admitted(&fresh, b"k", 1, start + 10), 1);
        sync(&fresh, &mut store);
        assert_eq!(admitted(&fresh, b"k", 100, start + 20), 19);
    }

    #[test]
    fn a_fallback_admits_the_share_then_the_counts_reach_redis() {
        let fleet: Arc<Fleet> = Arc::default();
        let t = table(90, MINUTE, &fleet);
        let mut store = HashMap::new();
        let start = 300 * MINUTE;
        fleet.succeed(3);
        assert!(fleet.fail(), "the first failure starts the fallback");
        assert!(!fleet.fail(), "and only the first");
        assert_eq!(admitted(&t, b"k", 100, start), 30, "90 / 3 gateways");
        fleet.succeed(3);
        sync(&t, &mut store);
        assert_eq!(store[&t.redis_key(stable_id(b"k"), 300)], 30);
        assert_eq!(admitted(&t, b"k", 100, start + 1), 60);
        fleet.set_on_error(OnRedisError::Deny);
        fleet.fail();
        assert_eq!(t.check(b"k2", start), Decision::Refuse(1000));
        fleet.set_on_error(OnRedisError::Allow);
        assert_eq!(admitted(&t, b"k2", 500, start), 500);
    }

    #[test]
    fn quiet_keys_are_refreshed_so_a_rare_request_sees_the_fleet() {
        let mut store = HashMap::new();
        let start = 400 * MINUTE;
        let a = table(6, MINUTE, &Arc::default());
        let b = table(6, MINUTE, &Arc::default());
        // b saw the key once, early; a then uses up the limit.
        assert_eq!(admitted(&b, b"k", 1, start), 1);
        sync(&b, &mut store);
        // a had never synced the key: its empty view admits all 6 (the overshoot of a
        // gateway new to a key).
        assert_eq!(admitted(&a, b"k", 10, start + 1000), 6);
        sync(&a, &mut store);
        // A sync of b with a refresh budget reads the key although b had no request.
        let mut out = Vec::new();
        let mut budget = 10;
        b.take_dirty(&mut out, 400, &mut budget);
        assert_eq!((out.len(), budget), (1, 9));
        for p in &out {
            let cur = b.redis_key(p.stable, p.window);
            let prev = b.redis_key(p.stable, p.window - 1);
            b.apply(p, [store[&cur], store.get(&prev).copied().unwrap_or(0)]);
        }
        assert_eq!(
            admitted(&b, b"k", 3, start + 2000),
            0,
            "b knows the key is used up"
        );
        // Keys of ended windows are not read; an exhausted budget reads nothing.
        let (mut out, mut none) = (Vec::new(), 0);
        b.take_dirty(&mut out, 400, &mut none);
        assert_eq!(out.len(), 1, "only the key b just charged");
        let mut out = Vec::new();
        b.take_dirty(&mut out, 402, &mut 10);
        assert!(out.is_empty());
    }

    #[test]
    fn a_failed_sync_sends_the_counts_next_time() {
        let t = table(100, MINUTE, &Arc::default());
        let mut store = HashMap::new();
        let start = 200 * MINUTE;
        admitted(&t, b"k", 7, start);
        let mut out = Vec::new();
        t.take_dirty(&mut out, 0, &mut 0);
        for p in &out {
            t.retry(p);
        }
        sync(&t, &mut store);
        assert_eq!(store[&t.redis_key(stable_id(b"k"), 200)], 7);
    }

    #[test]
    fn memory_is_bounded_by_max_keys() {
        let t = GlobalTable::new("route", "r", 10, MINUTE, 640, &Arc::default());
        for k in 0..100_000u32 {
            t.check(&k.to_be_bytes(), 100 * MINUTE);
        }
        let held: usize = t.shards.iter().map(|s| lock(s).entries.len()).sum();
        assert!(held <= 640, "{held}");
        assert!(t.evictions() >= 100_000 - 640);
    }
}

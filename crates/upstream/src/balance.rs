//! Choosing an endpoint: the `Balance` trait and weighted round robin.
//!
//! The trait is the seam for other algorithms ([`P2cEwma`]: p2c over peak-EWMA latency,
//! from tailguard-overload): `pick` runs once per dispatch, `complete` once when that exchange ends,
//! with its latency and outcome. Both run on the request path, so implementations follow
//! design.md §2: no locks, no allocation, no cache line shared between serving threads.
//! `pick` never returns an endpoint that is down (active checks, passive ejection: see
//! `health.rs`); asking whether a candidate is up costs one relaxed atomic load.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tailguard_overload::{Clock as _, MonotonicClock, P2c, P2cConfig};

use crate::health::Up;
pub use crate::outcome::Outcome;
use crate::shard::{PerThread, SHARDS};

/// Picks one endpoint of an upstream per request.
pub trait Balance: Send + Sync + fmt::Debug {
    /// The endpoint (index into the upstream's endpoints) for the next request, among those
    /// `up` says are up; `None` when none is.
    fn pick(&self, up: Up<'_>) -> Option<usize>;

    /// Called exactly once for every `pick` whose request was dispatched, when the exchange
    /// ends (response head received or failure). `latency` runs from dispatch to then.
    fn complete(&self, endpoint: usize, outcome: Outcome, latency: Duration) {
        let _ = (endpoint, outcome, latency);
    }

    /// Requests the balancer counts in flight at `endpoint`, if it counts them (p2c-EWMA
    /// does; round robin keeps no per-endpoint state a serving thread would have to write).
    /// Off the request path: the status page reads it.
    fn in_flight(&self, endpoint: usize) -> Option<i64> {
        let _ = endpoint;
        None
    }

    /// The balancer's latency estimate of `endpoint` (p2c-EWMA's peak EWMA), if it keeps one.
    fn latency_estimate(&self, endpoint: usize) -> Option<Duration> {
        let _ = endpoint;
        None
    }
}

/// Smooth weighted round robin (nginx's algorithm), precomputed into a schedule at config
/// load, with one cursor per serving thread.
///
/// Why a schedule: nginx's smooth WRR mutates every endpoint's current weight on each pick,
/// which would need a lock or a CAS loop over shared state. Replaying the same sequence from
/// a per-thread cursor gives each thread nginx's interleaving (no bursts to one endpoint)
/// and writes only the thread's own cache line.
pub struct RoundRobin {
    schedule: Box<[u32]>,
    cursors: PerThread<AtomicUsize>,
}

impl fmt::Debug for RoundRobin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoundRobin")
            .field("schedule_len", &self.schedule.len())
            .finish()
    }
}

impl RoundRobin {
    /// A balancer over endpoints with these weights (each >= 1; config validation ensures
    /// it, and a 0 is treated as 1).
    pub fn new(weights: &[u32]) -> RoundRobin {
        let weights: Vec<u64> = weights.iter().map(|&w| u64::from(w.max(1))).collect();
        let divisor = weights.iter().copied().fold(0, gcd).max(1);
        let weights: Vec<i64> = weights
            .iter()
            .map(|w| i64::try_from(w / divisor).unwrap_or(i64::MAX))
            .collect();
        let total: i64 = weights.iter().sum();
        let mut current = vec![0i64; weights.len()];
        let mut schedule = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
        for _ in 0..total {
            let mut best = 0;
            for (i, w) in weights.iter().enumerate() {
                current[i] += w;
                if current[i] > current[best] {
                    best = i;
                }
            }
            current[best] -= total;
            schedule.push(u32::try_from(best).unwrap_or(0));
        }
        if schedule.is_empty() {
            schedule.push(0);
        }
        // Each thread starts at a different offset so that N threads do not all send their
        // first request to the same endpoint.
        let len = schedule.len();
        let cursors = PerThread::new(|shard| AtomicUsize::new(shard * len / SHARDS));
        RoundRobin {
            schedule: schedule.into_boxed_slice(),
            cursors,
        }
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl RoundRobin {
    /// The next entry of the schedule whose endpoint `up(i)` says is up.
    ///
    /// A down endpoint's entries are stepped over, and the cursor moves past them: over one
    /// turn of the schedule every up endpoint still gets exactly its entries, so the
    /// remaining endpoints share its traffic in proportion to their weights (not the
    /// endpoint after it in the schedule taking it all).
    fn pick_where(&self, up: impl Fn(usize) -> bool) -> Option<usize> {
        let cursor = self.cursors.get();
        // Relaxed load + store, not fetch_add: the cursor is this thread's own; a rare race
        // (two threads on one shard) costs a repeated pick, never a wrong index.
        let n = cursor.load(Ordering::Relaxed);
        let len = self.schedule.len();
        for step in 0..len {
            let i = self.schedule[n.wrapping_add(step) % len] as usize;
            if up(i) {
                cursor.store(n.wrapping_add(step + 1), Ordering::Relaxed);
                return Some(i);
            }
        }
        cursor.store(n.wrapping_add(1), Ordering::Relaxed);
        None
    }
}

impl Balance for RoundRobin {
    fn pick(&self, up: Up<'_>) -> Option<usize> {
        self.pick_where(|i| up.is_up(i))
    }
}

/// p2c over peak-EWMA latency × (in-flight + 1) with a success-rate health gate, as a
/// [`Balance`] (`balance = "p2c_ewma"`).
#[derive(Debug)]
pub struct P2cEwma {
    p2c: P2c<()>,
}

impl P2cEwma {
    /// Over `n` endpoints.
    pub fn new(n: usize) -> P2cEwma {
        P2cEwma {
            p2c: P2c::new(vec![(); n], P2cConfig::default()),
        }
    }
}

impl Balance for P2cEwma {
    fn pick(&self, up: Up<'_>) -> Option<usize> {
        self.p2c
            .pick_index_where(MonotonicClock.now(), |i| up.is_up(i))
    }

    fn complete(&self, endpoint: usize, outcome: Outcome, latency: Duration) {
        if endpoint >= self.p2c.endpoints().len() {
            return;
        }
        let now = MonotonicClock.now();
        match outcome {
            Outcome::Status(s) => self.p2c.complete_index(endpoint, now, latency, s < 500),
            Outcome::ConnectFailed | Outcome::Timeout | Outcome::Broken => {
                self.p2c.complete_index(endpoint, now, latency, false)
            }
            Outcome::Aborted => self.p2c.release_index(endpoint),
        }
    }

    fn in_flight(&self, endpoint: usize) -> Option<i64> {
        (endpoint < self.p2c.endpoints().len()).then(|| self.p2c.inflight(endpoint))
    }

    fn latency_estimate(&self, endpoint: usize) -> Option<Duration> {
        (endpoint < self.p2c.endpoints().len()).then(|| self.p2c.rtt_estimate(endpoint))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_schedule_is_smooth_and_proportional() {
        let rr = RoundRobin::new(&[5, 1, 1]);
        // nginx's documented sequence for weights 5,1,1: a a b a c a a
        assert_eq!(&*rr.schedule, &[0, 0, 1, 0, 2, 0, 0]);
        let mut counts = [0; 3];
        for _ in 0..700 {
            counts[rr.pick_where(|_| true).unwrap()] += 1;
        }
        assert_eq!(counts, [500, 100, 100]);
    }

    #[test]
    fn down_endpoints_are_skipped_and_the_rest_keep_their_proportions() {
        let rr = RoundRobin::new(&[5, 2, 1]);
        let mut counts = [0; 3];
        for _ in 0..300 {
            counts[rr.pick_where(|i| i != 0).unwrap()] += 1;
        }
        assert_eq!(counts, [0, 200, 100]);
        assert_eq!(rr.pick_where(|_| false), None);
        // Back up: the plain schedule again.
        let mut counts = [0; 3];
        for _ in 0..800 {
            counts[rr.pick_where(|_| true).unwrap()] += 1;
        }
        assert_eq!(counts, [500, 200, 100]);
    }

    #[test]
    fn weights_reduced_by_gcd() {
        let rr = RoundRobin::new(&[200, 400]);
        assert_eq!(&*rr.schedule, &[1, 0, 1]);
    }

    #[test]
    fn p2c_balance_prefers_the_faster_endpoint() {
        let b = P2cEwma::new(2);
        let endpoints = crate::health::test_states(2);
        let up = Up::new(&endpoints);
        // Both start at the default estimate: a tie goes to endpoint 0, which is slow.
        assert_eq!(b.pick(up), Some(0));
        b.complete(0, Outcome::Status(200), Duration::from_millis(200));
        assert_eq!(b.pick(up), Some(1));
        b.complete(1, Outcome::Status(200), Duration::from_millis(1));
        let to_fast = (0..20)
            .filter(|_| {
                let i = b.pick(up).unwrap();
                b.complete(i, Outcome::Aborted, Duration::ZERO);
                i == 1
            })
            .count();
        // (A starved endpoint is forced once a second: at most one pick goes to 0 unless
        // this test stalls for seconds.)
        assert!(to_fast >= 19, "{to_fast}");
        assert_eq!(b.in_flight(0), Some(0));
        assert!(b.latency_estimate(0) > b.latency_estimate(1));
        assert_eq!(
            (b.in_flight(2), RoundRobin::new(&[1]).in_flight(0)),
            (None, None)
        );
    }
}

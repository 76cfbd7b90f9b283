//! Client addresses held off after one of their connections was closed for abuse
//! (`limits.abuse_holdoff_ms`).
//!
//! HTTP/2 closes a connection with `GOAWAY(ENHANCE_YOUR_CALM)` when its client resets
//! streams faster than they are served (rapid reset, CVE-2023-44487) or provokes too many
//! resets of its own. Such a client reconnects at once: measured here (issue 45), 15,029
//! connections in 10 s, each a TCP accept, a TLS or HTTP/2 setup and another round of
//! resets, on the serving core. Held off, its connections are closed at the accept, before
//! any of that, until the hold-off ends: one map lookup and a close each.
//!
//! Sharded like [`crate::clients`]; an accept reads one atomic when no address is held.
//! Bounded: at most [`MAX_PER_SHARD`] addresses a shard; a full shard first drops the
//! hold-offs that ended, and past that holds no new address (memory wins over the bound).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

const SHARDS: usize = 16;
/// 4,096 addresses a shard, 65,536 in all (~3 MB at most).
const MAX_PER_SHARD: usize = 4096;

/// The addresses held off, each until when.
#[derive(Debug)]
pub(crate) struct Holdoffs {
    shards: [Mutex<HashMap<IpAddr, Instant>>; SHARDS],
    hasher: RandomState,
    /// Entries in all shards, ended ones not yet dropped included.
    entries: AtomicUsize,
}

impl Default for Holdoffs {
    fn default() -> Self {
        Holdoffs {
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
            hasher: RandomState::new(),
            entries: AtomicUsize::new(0),
        }
    }
}

impl Holdoffs {
    fn shard(&self, ip: &IpAddr) -> MutexGuard<'_, HashMap<IpAddr, Instant>> {
        let h = self.hasher.hash_one(ip);
        self.shards[(h as usize) % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds `ip` off until `until` (or later, if it already was).
    pub(crate) fn hold(&self, ip: IpAddr, until: Instant) {
        let mut shard = self.shard(&ip);
        if let Some(held) = shard.get_mut(&ip) {
            *held = (*held).max(until);
            return;
        }
        if shard.len() >= MAX_PER_SHARD {
            let before = shard.len();
            shard.retain(|_, held| *held > Instant::now());
            self.entries
                .fetch_sub(before - shard.len(), Ordering::Relaxed);
            if shard.len() >= MAX_PER_SHARD {
                return;
            }
        }
        shard.insert(ip, until);
        self.entries.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether a connection from `ip` accepted at `now` is to be closed at once. An ended
    /// hold-off is dropped here.
    pub(crate) fn is_held(&self, ip: IpAddr, now: Instant) -> bool {
        if self.entries.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let mut shard = self.shard(&ip);
        match shard.get(&ip) {
            Some(&until) if until > now => true,
            Some(_) => {
                shard.remove(&ip);
                self.entries.fetch_sub(1, Ordering::Relaxed);
                false
            }
            None => false,
        }
    }

    /// Addresses with an entry (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{Holdoffs, MAX_PER_SHARD, SHARDS};

    /// An address is held until its time, alone, and forgotten after; a later hold-off
    /// extends an earlier one, never shortens it.
    #[test]
    fn an_address_is_held_until_its_time_and_forgotten_after() {
        let h = Holdoffs::default();
        let (a, b) = (
            "10.0.0.1".parse().expect("ip"),
            "10.0.0.2".parse().expect("ip"),
        );
        let now = Instant::now();
        assert!(!h.is_held(a, now), "nobody is held at first");
        h.hold(a, now + Duration::from_secs(2));
        h.hold(a, now + Duration::from_secs(1));
        assert!(
            h.is_held(a, now + Duration::from_millis(1500)),
            "not shortened"
        );
        assert!(!h.is_held(b, now), "another address is not held");
        assert!(!h.is_held(a, now + Duration::from_secs(2)), "ended");
        assert_eq!(h.len(), 0, "an ended hold-off is dropped when it is read");
    }

    /// The map is bounded: a full shard drops its ended hold-offs to make room, and holds
    /// no new address while every entry is live.
    #[test]
    fn the_map_is_bounded() {
        let h = Holdoffs::default();
        let now = Instant::now();
        let far = now + Duration::from_secs(3600);
        let total = (SHARDS * MAX_PER_SHARD + 1000) as u32;
        for i in 0..total {
            h.hold(std::net::Ipv4Addr::from(0x0a00_0000 + i).into(), far);
        }
        assert!(h.len() <= SHARDS * MAX_PER_SHARD, "{} entries", h.len());
        let held = (0..total)
            .filter(|&i| h.is_held(std::net::Ipv4Addr::from(0x0a00_0000 + i).into(), now))
            .count();
        assert_eq!(held, h.len(), "every entry kept is a live hold-off");
        // Ended ones make room: hold everyone briefly, then a new address after they end.
        let h = Holdoffs::default();
        for i in 0..total {
            h.hold(std::net::Ipv4Addr::from(0x0a00_0000 + i).into(), now);
        }
        let late: std::net::IpAddr = "192.0.2.1".parse().expect("ip");
        h.hold(late, far);
        assert!(h.is_held(late, now + Duration::from_secs(1)));
    }
}

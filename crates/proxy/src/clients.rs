//! In-flight requests per client address (`limits.client_requests`), across all of the
//! address's connections and serving threads.
//!
//! A connection finds its address's counter once, when it is accepted (or served again
//! after parking): a lock on one of [`SHARDS`] small maps, off the request path. A request
//! then pays one atomic add on that counter and one subtract when it finishes; no lock, no
//! allocation. An address has an entry only while it has open connections, so the maps
//! hold at most one entry per open connection (`limits.connections` per listener).
//! The table also keeps the addresses held off after abuse ([`crate::holdoff`]), which a
//! connection reaches through its counter.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Instant;

use crate::holdoff::Holdoffs;

/// 16 shards: accepts on two serving threads rarely meet on one lock, and an entry's
/// removal (its address's last connection closing) locks one shard only.
const SHARDS: usize = 16;

type Shard = Mutex<HashMap<IpAddr, Weak<Client>>>;

/// Every client address with an open connection, and its in-flight requests.
#[derive(Debug)]
pub(crate) struct Clients {
    shards: [Shard; SHARDS],
    hasher: RandomState,
    /// Addresses whose connections are closed at the accept for now.
    holdoffs: Holdoffs,
}

impl Default for Clients {
    fn default() -> Self {
        Clients {
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
            hasher: RandomState::new(),
            holdoffs: Holdoffs::default(),
        }
    }
}

impl Clients {
    fn shard(&self, ip: &IpAddr) -> &Shard {
        let h = self.hasher.hash_one(ip);
        &self.shards[(h as usize) % SHARDS]
    }

    /// The counter of `ip`, shared by all of its connections (made by its first).
    pub(crate) fn client(self: &Arc<Self>, ip: IpAddr) -> Arc<Client> {
        let mut shard = self
            .shard(&ip)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(client) = shard.get(&ip).and_then(Weak::upgrade) {
            return client;
        }
        let client = Arc::new(Client {
            // Its own cache line: the counter is written by every request of the address,
            // from whichever serving thread holds its connections.
            in_flight: CachePadded(AtomicU32::new(0)),
            ip,
            clients: Arc::clone(self),
        });
        shard.insert(ip, Arc::downgrade(&client));
        client
    }

    /// Whether a connection from `ip` accepted at `now` is to be closed at once
    /// (`limits.abuse_holdoff_ms`).
    pub(crate) fn is_held(&self, ip: IpAddr, now: Instant) -> bool {
        self.holdoffs.is_held(ip, now)
    }

    /// How many addresses have an entry (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }
}

#[derive(Debug)]
#[repr(align(64))]
struct CachePadded<T>(T);

/// One client address: its in-flight requests.
#[derive(Debug)]
pub(crate) struct Client {
    in_flight: CachePadded<AtomicU32>,
    ip: IpAddr,
    clients: Arc<Clients>,
}

impl Client {
    /// Counts a request in, unless the address already has `limit` in flight (`0`: no
    /// limit); the guard counts it out when dropped.
    #[inline]
    pub(crate) fn enter(self: &Arc<Self>, limit: u32) -> Option<ClientGuard> {
        let before = self.in_flight.0.fetch_add(1, Ordering::Relaxed);
        if limit != 0 && before >= limit {
            self.in_flight.0.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(ClientGuard(Arc::clone(self)))
    }

    /// Holds this address off until `until`: its next connections are closed at the accept.
    pub(crate) fn hold_off(&self, until: Instant) {
        self.clients.holdoffs.hold(self.ip, until);
    }
}

impl Drop for Client {
    /// The address's last connection closed: its entry goes, unless a new connection from
    /// it made a new one meanwhile.
    fn drop(&mut self) {
        let mut shard = self
            .clients
            .shard(&self.ip)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if shard.get(&self.ip).is_some_and(|w| w.strong_count() == 0) {
            shard.remove(&self.ip);
        }
    }
}

/// One request counted in its client's in-flight requests until dropped.
#[derive(Debug)]
pub(crate) struct ClientGuard(Arc<Client>);

impl Drop for ClientGuard {
    #[inline]
    fn drop(&mut self) {
        self.0.in_flight.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::Clients;

    /// The limit counts requests of one address across its connections, each address on
    /// its own, and an address's entry goes with its last connection.
    #[test]
    fn an_address_is_limited_across_its_connections_and_forgotten_after_them() {
        let clients = Arc::new(Clients::default());
        let a = "10.0.0.1".parse().expect("ip");
        let b = "10.0.0.2".parse().expect("ip");
        let (a1, a2, b1) = (clients.client(a), clients.client(a), clients.client(b));
        assert!(Arc::ptr_eq(&a1, &a2));
        let first = a1.enter(2).expect("first");
        let _second = a2.enter(2).expect("second");
        assert!(a1.enter(2).is_none(), "a third in flight is refused");
        let _other = b1.enter(2).expect("another address has its own count");
        drop(first);
        let _third = a2.enter(2).expect("room again once one finished");
        assert!(a1.enter(0).is_some(), "0: no limit");
        assert_eq!(clients.len(), 2);
        drop((a1, a2, _third, _second));
        assert_eq!(clients.len(), 1, "a's entry went with its last connection");
    }
}

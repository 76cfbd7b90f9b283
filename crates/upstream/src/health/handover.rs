//! Health states across snapshots: which state an endpoint of a new snapshot takes over
//! from the previous one, and which of the old states retire after the swap.

use std::net::SocketAddr;
use std::sync::Arc;

use super::EndpointHealth;
use crate::upstream::Upstream;

/// The state of endpoint `addr` of `upstream` for a new snapshot: the one it has in
/// `previous` (the previous snapshot's upstreams) when it has one there and the upstream is
/// still health-checked (an upstream that lost its `[upstreams.health]` table starts clean:
/// nothing would ever bring a down endpoint back).
pub fn carry<B>(
    previous: Option<&[Upstream<B>]>,
    upstream: &str,
    addr: SocketAddr,
    checked: bool,
) -> Option<Arc<EndpointHealth>> {
    if !checked {
        return None;
    }
    previous?
        .iter()
        .filter(|u| &*u.name == upstream)
        .flat_map(|u| u.endpoints.iter())
        .find(|e| e.addr == addr)
        .map(|e| Arc::clone(&e.health))
}

/// After a swap: states of `old` that `new` did not take over are retired, and the gauge of
/// an endpoint that left the config reads 0.
pub fn retire_missing<B>(old: &[Upstream<B>], new: &[Upstream<B>]) {
    let new_states = || new.iter().flat_map(|u| u.endpoints.iter());
    for u in old {
        for e in &u.endpoints {
            if new_states().any(|n| Arc::ptr_eq(&n.health, &e.health)) {
                continue;
            }
            e.health.retire();
            let still_listed = new
                .iter()
                .any(|n| n.name == u.name && n.endpoints.iter().any(|ne| ne.addr == e.addr));
            if !still_listed {
                e.health.clear_gauge();
            }
        }
    }
}

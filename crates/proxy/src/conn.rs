//! A downstream connection as the data path sees it: what its requests share (the snapshot
//! it started with, the client's forwarding fields, its listener's access log, rate
//! limit and allow/deny), and how a request holds its snapshot until its response finishes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arc_swap::ArcSwap;
use tailguard_http::headers;

use crate::snapshot::Snapshot;

/// Per downstream connection: the snapshot it started with, so a request touches only this
/// connection's reference count, not one shared by every serving thread.
#[derive(Debug)]
pub(crate) struct ConnCtx {
    /// The gateway's current snapshot, for when `snapshot` is retired.
    pub(crate) current: Arc<ArcSwap<Snapshot>>,
    pub(crate) snapshot: Arc<Snapshot>,
    pub(crate) remote: SocketAddr,
    /// What the forwarding fields say of the client, made once per connection.
    pub(crate) client: headers::Client,
    pub(crate) tls: bool,
    /// The listener's access log (a handle per connection, not per request).
    pub(crate) access_log: tailguard_access_log::AccessLog,
    /// The listener's rate limit, if it has one.
    pub(crate) rate_limit: Option<Arc<tailguard_policy::rate_limit::Limiter>>,
    /// The listener's `allow` / `deny`, if it has them.
    pub(crate) access: Option<Arc<tailguard_policy::access::AccessList>>,
    /// The listener's compression, for routes without their own.
    pub(crate) compress: Option<Arc<tailguard_policy::compress::Compress>>,
    /// The in-flight requests of the client's address, all its connections together.
    pub(crate) in_flight: Arc<crate::clients::Client>,
}

/// How a request holds its snapshot until its response finishes.
#[derive(Debug)]
pub(crate) enum Held {
    /// Through its connection (the common case).
    Conn(Arc<ConnCtx>),
    /// Its connection's snapshot was retired by a reload: the current one, held directly
    /// (the connection too, for its access log).
    Fresh(Arc<Snapshot>, Arc<ConnCtx>),
}

impl Held {
    /// The snapshot the request is served with.
    pub(crate) fn snapshot(&self) -> &Snapshot {
        match self {
            Held::Conn(c) => &c.snapshot,
            Held::Fresh(s, _) => s,
        }
    }

    /// The access log of the request's listener.
    pub(crate) fn access_log(&self) -> &tailguard_access_log::AccessLog {
        match self {
            Held::Conn(c) | Held::Fresh(_, c) => &c.access_log,
        }
    }
}

/// How a request on `conn` holds its snapshot: through the connection, unless a reload
/// retired the connection's snapshot (then the current one).
pub(crate) fn hold(conn: &Arc<ConnCtx>) -> Held {
    if conn.snapshot.retired.load(Ordering::Acquire) {
        Held::Fresh(conn.current.load_full(), Arc::clone(conn))
    } else {
        Held::Conn(Arc::clone(conn))
    }
}

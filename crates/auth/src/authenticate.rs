//! The interface every authenticator type implements ([`Authenticate`]) and the view of a
//! request it is handed ([`AuthRequest`]).

use std::net::{IpAddr, SocketAddr};

use http::{HeaderMap, HeaderName, Method, Uri};

use crate::outcome::Verdict;
use crate::source::Source;

/// What an authenticator may read of a request: its head and where it came from. Borrowed
/// from the request for the length of [`Authenticate::check`]; a check that goes on
/// elsewhere ([`Verdict::Pending`]) copies what it needs.
#[derive(Debug, Clone, Copy)]
pub struct AuthRequest<'a> {
    /// The method.
    pub method: &'a Method,
    /// The target as received (path and query).
    pub uri: &'a Uri,
    /// The head's fields, with the client's copies of every header an authenticator of the
    /// route sets already removed.
    pub headers: &'a HeaderMap,
    /// The downstream connection's peer.
    pub peer: SocketAddr,
    /// The client's address: the peer, or behind `trusted_proxies` the address its
    /// `X-Forwarded-For` names (what `allow` / `deny` are checked against; forward auth's
    /// `X-Forwarded-For`).
    pub client: IpAddr,
    /// Whether the request came over TLS (forward auth's `X-Forwarded-Proto`).
    pub tls: bool,
    /// The route's id (part of a cache key that must never cross routes).
    pub route: &'a str,
}

/// One configured authenticator (`[[auth]]`). Built once per config; shared by every
/// serving thread (so `Send + Sync`), asked once per request of a route that names it.
///
/// The contract:
/// - [`check`](Authenticate::check) runs on a serving thread. It may read memory, hash a
///   key, verify a signature cheap enough to be measured in microseconds, or look in a
///   cache; it never blocks (no file I/O, no lock a reload or a refresh holds for longer
///   than a pointer copy, no network). Anything slower returns [`Verdict::Pending`] with a
///   future whose work runs elsewhere (a bounded pool of threads for a password hash, a
///   pooled connection for an auth service), so a flood aimed at one route never slows
///   another.
/// - Key material that changes (a keys file, a JWKS) is reloaded off the request path (a
///   background thread or task) and swapped in; `check` reads the current version.
/// - The credential is never logged, traced or put in an error or a refusal's body.
/// - Every outcome maps to one [`crate::AuthResult`].
pub trait Authenticate: Send + Sync + std::fmt::Debug {
    /// Checks one request.
    fn check(&self, req: &AuthRequest<'_>) -> Verdict;

    /// Headers this authenticator sets on an accepted request (claims, an auth service's
    /// answer): removed from every request of a route that names it before any
    /// authenticator runs, so a client can never send them itself.
    fn sets_headers(&self) -> &[HeaderName] {
        &[]
    }

    /// Where it reads credentials: a query parameter among them is taken out of the target
    /// the access log writes ([`crate::Gate::redact`]).
    fn sources(&self) -> &[Source] {
        &[]
    }

    /// A config reload kept this authenticator (its own config did not change): what it
    /// remembered under the old config is to be forgotten (forward auth's cache keys carry
    /// the revision).
    fn revise(&self) {}
}

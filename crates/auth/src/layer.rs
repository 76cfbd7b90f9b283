//! Tower middleware: [`AuthLayer`] puts a route's [`Gate`] in front of any tower service
//! over `http` requests (an axum router or route, a hyper service), so a Rust service
//! verifies the same JWTs, API keys, basic-auth users and auth-service answers as the
//! gateway, with the same code.
//!
//! Per request, as the gateway's data path does: the client's copies of the headers the
//! gate's authenticators set are removed, [`Gate::decide`] asks them in order (a slow check
//! awaited, its work off the runtime's threads), and then:
//! - accepted: the request is changed as the authenticator says (claims set as headers, the
//!   credential removed unless `forward_token` / `forward_key`), an [`Authenticated`]
//!   extension names the consumer and the authenticator, and the inner service is called;
//! - refused: the authenticator's answer (`401` with `WWW-Authenticate`, `403`, `503` with
//!   `Retry-After`, an auth service's own answer); a gRPC call (`content-type:
//!   application/grpc...`) gets it trailers-only with `grpc-status` 16, 7 or 14
//!   ([`Refusal::into_grpc`]). The inner service never sees the request, its body unread.
//!
//! The gate lives behind an `Arc` the layer's clones share: axum clones a route's service
//! per request, and the gate's key sets, caches and counters must not be copied with it.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Extensions, Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use crate::authenticate::AuthRequest;
use crate::gate::{Decision, Gate};
use crate::outcome::Refusal;

/// Who an accepted request is, put in its extensions for the inner service (an axum
/// handler reads it with `Extension<Authenticated>`).
#[derive(Debug, Clone)]
pub struct Authenticated {
    /// The consumer: an API key's, a token's `sub` (or `consumer_claim`), a basic-auth user.
    pub consumer: Option<Arc<str>>,
    /// The authenticator that accepted.
    pub auth: Arc<str>,
}

/// Reads the downstream peer's address from a request's extensions (where the server put
/// it: axum's `ConnectInfo<SocketAddr>`, a hyper service's own type).
pub type PeerFn = fn(&Extensions) -> Option<SocketAddr>;

/// The default [`PeerFn`]: a `SocketAddr` extension, if the server inserted one.
fn peer_extension(ext: &Extensions) -> Option<SocketAddr> {
    ext.get::<SocketAddr>().copied()
}

/// Authenticates every request with a [`Gate`] before the wrapped service sees it.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    gate: Arc<Gate>,
    route: Arc<str>,
    peer: PeerFn,
    tls: bool,
}

impl AuthLayer {
    /// A layer that checks requests with `gate` as route `route` (the name a forward-auth
    /// cache key carries, and the `route` label the gate's counters were made with).
    pub fn new(gate: Arc<Gate>, route: impl Into<Arc<str>>) -> AuthLayer {
        AuthLayer {
            gate,
            route: route.into(),
            peer: peer_extension,
            tls: false,
        }
    }

    /// Where the peer's address is found (default: a `SocketAddr` extension; without one,
    /// `0.0.0.0:0`). It is forward auth's `X-Forwarded-For`.
    pub fn peer(mut self, peer: PeerFn) -> AuthLayer {
        self.peer = peer;
        self
    }

    /// Whether the service is served over TLS (forward auth's `X-Forwarded-Proto`).
    pub fn tls(mut self, tls: bool) -> AuthLayer {
        self.tls = tls;
        self
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> AuthService<S> {
        AuthService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`AuthLayer`] makes.
#[derive(Debug, Clone)]
pub struct AuthService<S> {
    inner: S,
    layer: AuthLayer,
}

/// The response future of [`AuthService`]. Boxed: it holds the request while the gate
/// decides, and the gate's future borrows the request's head.
pub type AuthFuture<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for AuthService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<Bytes>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = AuthFuture<Response<ResBody>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The clone that was polled ready serves this request; a fresh clone stays behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            layer.gate.remove_client_copies(&mut parts.headers);
            let peer = (layer.peer)(&parts.extensions)
                .unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
            let decision = layer
                .gate
                .decide(AuthRequest {
                    method: &parts.method,
                    uri: &parts.uri,
                    headers: &parts.headers,
                    peer,
                    client: peer.ip(),
                    tls: layer.tls,
                    route: &layer.route,
                })
                .await;
            match decision {
                Decision::Accepted { accepted, auth } => {
                    accepted.apply(&mut parts.uri, &mut parts.headers);
                    parts.extensions.insert(Authenticated {
                        consumer: accepted.consumer,
                        auth,
                    });
                    inner.call(Request::from_parts(parts, body)).await
                }
                Decision::Refused { refusal, .. } => {
                    let grpc = parts
                        .headers
                        .get(http::header::CONTENT_TYPE)
                        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
                    Ok(respond(if grpc { refusal.into_grpc() } else { refusal }))
                }
            }
        })
    }
}

/// A refusal as a response.
fn respond<B: From<Bytes>>(refusal: Refusal) -> Response<B> {
    let mut resp = Response::new(B::from(refusal.body));
    *resp.status_mut() = refusal.status;
    *resp.headers_mut() = refusal.headers;
    resp
}

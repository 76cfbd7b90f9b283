//! The example's axum app: every request in the access log (router level), the admin routes
//! also in a JSON audit log of their own (route level).
//!
//! Shared by `examples/axum.rs` (which serves it) and the crate's integration tests (which
//! drive it through real sockets), so the tests exercise exactly what the example shows.

use std::net::{IpAddr, SocketAddr};

use axum::Router;
use axum::extract::{ConnectInfo, Path};
use axum::routing::{get, post};
use tailguard_access_log::{AccessLog, AccessLogLayer};

/// `$remote_addr`: the peer axum saw, when served with
/// `into_make_service_with_connect_info::<SocketAddr>()`.
pub(crate) fn remote_addr(extensions: &http::Extensions) -> Option<IpAddr> {
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip())
}

/// The app: `access` gets every request (the 404 fallback included), `audit` the admin
/// routes only.
pub(crate) fn app(access: AccessLog, audit: AccessLog) -> Router {
    Router::new()
        .route("/", get(|| async { "hello, world\n" }))
        .route(
            "/users/{id}",
            get(|Path(id): Path<u64>| async move { format!("user {id}\n") }),
        )
        .route(
            "/admin/reload",
            post(|| async { "reloaded\n" })
                .layer(AccessLogLayer::new(audit).remote_addr(remote_addr)),
        )
        .layer(AccessLogLayer::new(access).remote_addr(remote_addr))
}

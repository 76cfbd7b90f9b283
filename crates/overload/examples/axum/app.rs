//! The example's axum app: the API routes shed under overload (one route-group controller,
//! applied to them all by `route_layer`), a checkout route marked critical (counted, never
//! shed), and `/healthz` outside the shedder.
//!
//! Shared by `examples/axum.rs` (which serves it) and the crate's integration tests (which
//! drive it through real sockets, on a fake clock and an injected CPU reading), so the
//! tests exercise exactly what the example shows.

use std::sync::Arc;

use axum::Router;
use axum::extract::Path;
use axum::routing::{get, post};
use tailguard_overload::{Class, Clock, Controller, ShedderLayer};

/// The app. `api` is the route group's controller: the `Arc` is what every clone of every
/// route's service shares (axum clones a route's service per request; state kept in the
/// clone would be lost). `clock` is the shedder's clock: `MonotonicClock` in the example, a
/// `FakeClock` in the tests.
pub(crate) fn app<C>(api: Arc<Controller>, clock: C) -> Router
where
    C: Clock + Clone + Send + Sync + 'static,
{
    let shed = ShedderLayer::new(api).clock(clock);
    Router::new()
        .route("/", get(|| async { "hello, world\n" }))
        .route(
            "/users/{id}",
            get(|Path(id): Path<u64>| async move { format!("user {id}\n") }),
        )
        // Router level: every route above is admitted by the API group's controller; a
        // shed request gets 503 with Retry-After before its handler (or its body) is read.
        .route_layer(shed.clone())
        // Route level: the checkout is critical: never shed, still counted in flight.
        .route(
            "/checkout",
            post(|| async { "order placed\n" }).layer(shed.class(Class::Critical)),
        )
        // Added after the layers: not admitted at all (health checks are never shed).
        .route("/healthz", get(|| async { "ok\n" }))
}

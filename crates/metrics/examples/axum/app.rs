//! The example's axum app: request metrics for the whole router by matched path, a
//! route-level layer for the admin routes, and a business counter resolved once at start.
//!
//! Shared by `examples/axum.rs` (which serves it) and the crate's integration tests (which
//! drive it through real sockets), so the tests exercise exactly what the example shows.

use std::sync::Arc;

use axum::extract::{MatchedPath, Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use tailguard_metrics::{Counter, MetricsError, Registry, RequestMetrics};

/// The route label of a request: axum's matched path (`/users/{id}`, not `/users/7`), so a
/// route is one series whatever its parameters. `None` (no route matched, axum's 404
/// fallback) is recorded as `route="unmatched"`.
pub(crate) fn matched_path(extensions: &http::Extensions) -> Option<&str> {
    extensions.get::<MatchedPath>().map(MatchedPath::as_str)
}

/// What the handlers share: handles resolved once, here, never per request.
#[derive(Clone)]
struct AppState {
    lookups: Counter,
}

/// The app: every route recorded as `app_*{route=<matched path>}`; the admin routes also as
/// `admin_*{route="reload"}` by a layer of their own.
pub(crate) fn app(registry: &Registry) -> Result<Router, MetricsError> {
    // Router level: one layer, each request under its matched path.
    let requests = Arc::new(RequestMetrics::register(registry, "app")?);
    // Route level: a family of its own, the label fixed by the route.
    let admin = RequestMetrics::register(registry, "admin")?;
    let lookups = registry
        .counter("user_lookups", "Users looked up.", &[])?
        .get_or_create(&[])?;

    Ok(Router::new()
        .route("/", get(|| async { "hello, world\n" }))
        .route("/users/{id}", get(user))
        .route(
            "/admin/reload",
            post(|| async { "reloaded\n" }).layer(admin.route("reload")?.layer()),
        )
        .with_state(AppState { lookups })
        // Applied to every route above (and to the 404 fallback) after routing, where the
        // request carries its `MatchedPath`.
        .layer(requests.layer(matched_path)))
}

async fn user(State(state): State<AppState>, Path(id): Path<u64>) -> Json<serde_json::Value> {
    state.lookups.inc();
    Json(serde_json::json!({ "id": id, "name": format!("user {id}") }))
}

//! The example's axum app: `/orders` lets in a user's JWT or a partner's API key, `/admin`
//! only a JWT with an `admin` claim (a valid token without it gets `403`), `/healthz` is
//! open. Each guarded route is an [`AuthLayer`] over a [`Gate`] of the same authenticators
//! the gateway builds from `[[auth]]` (here made in code).
//!
//! Shared by `examples/axum.rs` (which serves it) and the crate's integration tests (which
//! drive it through real sockets), so the tests exercise exactly what the example shows.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::ConnectInfo;
use axum::http::HeaderMap;
use axum::routing::get;
use axum::{Extension, Router};
use base64::Engine as _;
use tailguard_auth::{
    Alg, ApiKey, ApiKeySettings, AuthLayer, AuthMetrics, Authenticate, Authenticated, ClaimRules,
    Consumer, Gate, Jwt, JwtSettings, KeyHash,
};

/// The issuer and audience the example's tokens carry.
pub(crate) const ISSUER: &str = "https://idp.example/";
/// See [`ISSUER`].
pub(crate) const AUDIENCE: &str = "orders-api";

/// The two routes' gates.
pub(crate) struct Gates {
    /// `/orders`: `auth = ["users", "partners"]`.
    pub(crate) orders: Arc<Gate>,
    /// `/admin`: `auth = "admins"`.
    pub(crate) admin: Arc<Gate>,
}

/// A JWT authenticator over the HS256 `secret`; `required`: claims a token must carry.
fn jwt(name: &str, secret: &[u8], required: &[&str], metrics: &AuthMetrics) -> Result<Jwt, String> {
    Jwt::build(
        JwtSettings {
            name: name.into(),
            jwks: None,
            jwks_ca: None,
            secret: Some(secret.to_vec()),
            algorithms: vec![Alg::HS256],
            rules: ClaimRules {
                issuer: Some(ISSUER.into()),
                audiences: vec![AUDIENCE.into()],
                leeway_s: 60,
                required: required.iter().map(|s| (*s).to_owned()).collect(),
            },
            from: vec![], // `Authorization: Bearer`
            claims_to_headers: vec![
                (
                    "sub".into(),
                    "x-user-id".parse().map_err(|_| "header name")?,
                ),
                (
                    "scope".into(),
                    "x-scopes".parse().map_err(|_| "header name")?,
                ),
            ],
            forward_token: false,
            consumer_claim: "sub".into(),
        },
        metrics.key_set(name).map_err(|e| e.to_string())?,
    )
}

/// The gates: JWTs signed with `secret` (at least 32 bytes), and the API key
/// `partner_key` of the consumer `acme`, counted in `metrics`.
pub(crate) fn gates(
    secret: &[u8],
    partner_key: &[u8],
    metrics: &AuthMetrics,
) -> Result<Gates, String> {
    let users: Arc<dyn Authenticate> = Arc::new(jwt("users", secret, &[], metrics)?);
    let admins: Arc<dyn Authenticate> = Arc::new(jwt("admins", secret, &["admin"], metrics)?);
    let partners: Arc<dyn Authenticate> = Arc::new(ApiKey::build(ApiKeySettings {
        name: "partners".into(),
        from: vec![], // `x-api-key`
        consumers: vec![Consumer {
            name: Arc::from("acme"),
            keys: vec![KeyHash::of(partner_key)],
        }],
        keys_file: None,
        forward_key: false,
    })?);
    let member = |route: &str, name: &str, auth: &Arc<dyn Authenticate>| {
        let counters = metrics.handles(route, name).map_err(|e| e.to_string())?;
        Ok::<_, String>((Arc::from(name), Arc::clone(auth), counters))
    };
    Ok(Gates {
        orders: Arc::new(Gate::new([
            member("orders", "users", &users)?,
            member("orders", "partners", &partners)?,
        ])),
        admin: Arc::new(Gate::new([member("admin", "admins", &admins)?])),
    })
}

/// The peer's address, where `into_make_service_with_connect_info` put it.
fn peer(ext: &axum::http::Extensions) -> Option<SocketAddr> {
    ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0)
}

/// What the handler saw: the consumer, the authenticator, and the headers the gate set or
/// removed (the credential never reaches it).
async fn whoami(Extension(who): Extension<Authenticated>, headers: HeaderMap) -> String {
    let h = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    format!(
        "consumer={} auth={} x-user-id={} x-scopes={} authorization={} x-api-key={}\n",
        who.consumer.as_deref().unwrap_or("-"),
        who.auth,
        h("x-user-id"),
        h("x-scopes"),
        h("authorization"),
        h("x-api-key"),
    )
}

/// The app.
pub(crate) fn app(gates: &Gates) -> Router {
    Router::new()
        .route(
            "/orders",
            get(whoami).layer(AuthLayer::new(Arc::clone(&gates.orders), "orders").peer(peer)),
        )
        .route(
            "/admin",
            get(whoami).layer(AuthLayer::new(Arc::clone(&gates.admin), "admin").peer(peer)),
        )
        .route("/healthz", get(|| async { "ok\n" }))
}

/// An HS256 token of `claims` signed with `secret` (what an identity provider would issue).
pub(crate) fn token(secret: &[u8], claims: &serde_json::Value) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let input = format!(
        "{}.{}",
        b64.encode(br#"{"alg":"HS256","typ":"JWT"}"#),
        b64.encode(claims.to_string())
    );
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let sig = ring::hmac::sign(&key, input.as_bytes());
    format!("{input}.{}", b64.encode(sig.as_ref()))
}

//! tailguard-auth in an axum 0.8 app: the gateway's JWT and API-key checks as a tower
//! layer, on two routes, with the consumer and the token's claims handed to the handler.
//!
//! ```text
//! cargo run -p tailguard-auth --example axum [APP_ADDR]
//! curl -i http://<app>/orders                                  # 401, WWW-Authenticate: Bearer
//! curl -i -H 'authorization: Bearer <user token>' http://<app>/orders
//! curl -i -H 'x-api-key: <partner key>' http://<app>/orders
//! curl -i -H 'authorization: Bearer <user token>' http://<app>/admin   # 403: no admin claim
//! curl -i -H 'authorization: Bearer <admin token>' http://<app>/admin
//! ```
//!
//! The app listens on `127.0.0.1:0` (a free port) unless told otherwise and prints where,
//! with a random HS256 secret, a random partner key, and a user's and an admin's token
//! valid for an hour (what an identity provider would issue). Ctrl-C stops it.

#[path = "axum/app.rs"]
mod app;

use std::error::Error;
use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use ring::rand::SecureRandom as _;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let app_addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".into());

    let rng = ring::rand::SystemRandom::new();
    let mut secret = [0u8; 32];
    let mut key = [0u8; 24];
    rng.fill(&mut secret).map_err(|_| "no random bytes")?;
    rng.fill(&mut key).map_err(|_| "no random bytes")?;
    let partner_key = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key);

    // `tailguard_auth_requests_total{route,auth,result}` lands here; serve it with
    // tailguard-metrics' exporter if the app has one.
    let registry = tailguard_metrics::Registry::new();
    let metrics = tailguard_auth::AuthMetrics::register(&registry)?;
    let gates = app::gates(&secret, partner_key.as_bytes(), &metrics)?;

    let exp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() + 3600;
    let claims = |sub: &str, admin: bool| {
        let mut c = serde_json::json!({
            "iss": app::ISSUER, "aud": app::AUDIENCE, "sub": sub, "exp": exp, "scope": "orders:read",
        });
        if admin {
            c["admin"] = serde_json::Value::Bool(true);
        }
        c
    };
    println!(
        "user token:  {}",
        app::token(&secret, &claims("alice", false))
    );
    println!(
        "admin token: {}",
        app::token(&secret, &claims("root", true))
    );
    println!("partner key: {partner_key}");

    let listener = tokio::net::TcpListener::bind(&app_addr).await?;
    println!("app listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app::app(&gates).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}

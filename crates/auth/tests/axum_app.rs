//! The axum example's app (`examples/axum/app.rs`, the same file) on 127.0.0.1:0, driven
//! with real requests: the layer accepts a token and a key, answers `401` with its
//! challenge and `403` for a missing claim, a gRPC call trailers-only, hands the consumer
//! and the claims to the handler, and never lets a client's own copies through.

#[path = "../examples/axum/app.rs"]
mod app;

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tailguard_auth::{AuthMetrics, AuthResult};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-example";
const PARTNER_KEY: &[u8] = b"acme-partner-key";

async fn serve(metrics: &AuthMetrics) -> SocketAddr {
    let gates = app::gates(SECRET, PARTNER_KEY, metrics).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = app::app(&gates);
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap()
    });
    addr
}

/// One request on a connection of its own (`extra`: header lines); the whole response,
/// its head lower-cased.
async fn get(addr: SocketAddr, path: &str, extra: &[&str]) -> (String, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n");
    for h in extra {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("a response within 10 s")
        .unwrap();
    let text = String::from_utf8(out).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (head.to_ascii_lowercase(), body.to_owned())
}

fn claims(sub: &str, extra: &[(&str, serde_json::Value)]) -> serde_json::Value {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut c = serde_json::json!({
        "iss": app::ISSUER, "aud": app::AUDIENCE, "sub": sub, "exp": now + 600,
        "scope": ["orders:read", "orders:write"],
    });
    for (k, v) in extra {
        c[*k] = v.clone();
    }
    c
}

fn bearer(claims: &serde_json::Value) -> String {
    format!("authorization: Bearer {}", app::token(SECRET, claims))
}

#[tokio::test]
async fn the_layer_lets_a_token_or_a_key_through_with_the_consumer_and_claims_and_without_the_credential()
 {
    let metrics = AuthMetrics::register(&tailguard_metrics::Registry::new()).unwrap();
    let addr = serve(&metrics).await;

    let (head, body) = get(addr, "/orders", &[&bearer(&claims("alice", &[]))]).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert_eq!(
        body,
        "consumer=alice auth=users x-user-id=alice x-scopes=orders:read orders:write \
         authorization=- x-api-key=-\n"
    );

    // A client's own copies of the headers the gate sets are removed, also when another
    // authenticator (one that sets none of them) accepts.
    let (head, body) = get(
        addr,
        "/orders",
        &[
            "x-api-key: acme-partner-key",
            "x-user-id: root",
            "x-scopes: admin",
        ],
    )
    .await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert_eq!(
        body,
        "consumer=acme auth=partners x-user-id=- x-scopes=- authorization=- x-api-key=-\n"
    );

    // Open route: no layer, no check.
    let (head, body) = get(addr, "/healthz", &[]).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert_eq!(body, "ok\n");

    let orders = |auth| metrics.handles("orders", auth).unwrap();
    assert_eq!(orders("users").get(AuthResult::Ok), 1);
    assert_eq!(orders("partners").get(AuthResult::Ok), 1);
}

#[tokio::test]
async fn the_layer_answers_401_with_its_challenge_and_403_for_a_missing_claim() {
    let metrics = AuthMetrics::register(&tailguard_metrics::Registry::new()).unwrap();
    let addr = serve(&metrics).await;

    // Nothing presented: the first authenticator's challenge (RFC 6750 §3: no error code).
    let (head, _) = get(addr, "/orders", &[]).await;
    assert!(head.starts_with("http/1.1 401"), "{head}");
    assert!(
        head.contains("\r\nwww-authenticate: bearer realm=\"users\"\r\n"),
        "{head}"
    );

    // A token signed with another secret, an expired one, one for another audience.
    let forged = {
        let t = app::token(b"another-secret-another-secret-xx", &claims("alice", &[]));
        format!("authorization: Bearer {t}")
    };
    let expired = bearer(&claims("alice", &[("exp", serde_json::json!(1_000_000))]));
    let elsewhere = bearer(&claims("alice", &[("aud", serde_json::json!("billing"))]));
    for token in [&forged, &expired, &elsewhere] {
        let (head, body) = get(addr, "/orders", &[token]).await;
        assert!(head.starts_with("http/1.1 401"), "{head}");
        assert!(
            head.contains("www-authenticate: bearer realm=\"users\", error=\"invalid_token\""),
            "{head}"
        );
        assert!(!body.contains("consumer="), "the handler never ran: {body}");
    }
    // A wrong key: the token's refusal is not presented, the key's is.
    let (head, _) = get(addr, "/orders", &["x-api-key: guessed"]).await;
    assert!(head.starts_with("http/1.1 401"), "{head}");
    assert!(head.contains("www-authenticate: apikey"), "{head}");

    // A valid token without the `admin` claim: 403, insufficient_scope (RFC 6750 §3.1).
    let (head, _) = get(addr, "/admin", &[&bearer(&claims("alice", &[]))]).await;
    assert!(head.starts_with("http/1.1 403"), "{head}");
    assert!(head.contains("error=\"insufficient_scope\""), "{head}");
    let admin = bearer(&claims("root", &[("admin", serde_json::json!(true))]));
    let (head, body) = get(addr, "/admin", &[&admin]).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(body.starts_with("consumer=root auth=admins "), "{body}");

    let orders = |auth| metrics.handles("orders", auth).unwrap();
    assert_eq!(orders("users").get(AuthResult::Missing), 1);
    assert_eq!(orders("users").get(AuthResult::InvalidSignature), 1);
    assert_eq!(orders("users").get(AuthResult::Expired), 1);
    assert_eq!(orders("users").get(AuthResult::WrongAudience), 1);
    assert_eq!(orders("partners").get(AuthResult::Invalid), 1);
    let admin = metrics.handles("admin", "admins").unwrap();
    assert_eq!(admin.get(AuthResult::MissingClaim), 1);
    assert_eq!(admin.get(AuthResult::Ok), 1);
}

#[tokio::test]
async fn a_refused_grpc_call_is_answered_trailers_only_with_its_grpc_status() {
    let metrics = AuthMetrics::register(&tailguard_metrics::Registry::new()).unwrap();
    let addr = serve(&metrics).await;
    let grpc = "content-type: application/grpc+proto";

    let (head, body) = get(addr, "/orders", &[grpc]).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("\r\ngrpc-status: 16\r\n"), "{head}");
    assert!(
        head.contains("\r\ngrpc-message: unauthorized\r\n"),
        "{head}"
    );
    assert!(
        head.contains("\r\ncontent-type: application/grpc\r\n"),
        "{head}"
    );
    assert!(head.contains("\r\nwww-authenticate: bearer"), "{head}");
    assert_eq!(body, "", "trailers-only: no message");

    let (head, _) = get(addr, "/admin", &[grpc, &bearer(&claims("alice", &[]))]).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("\r\ngrpc-status: 7\r\n"), "{head}");
}

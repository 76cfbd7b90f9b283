//! `type = "jwt"` on its own: a cold ES384 token (~0.6 ms to verify) is checked on the
//! authenticator's pool, not the calling thread, then remembered like any other; ES256 is
//! checked where it is asked. Keys made by ring, the key set read from a real file.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderMap, HeaderValue, Method, Uri};
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair as _};
use tailguard_auth::{
    AuthMetrics, AuthRequest, Authenticate, ClaimRules, Jwt, JwtSettings, Location, Outcome,
    Refresh, Verdict,
};

/// An EC key, its JWK (`kid`) and a signer of `alg` tokens.
struct Ec {
    key: EcdsaKeyPair,
    kid: &'static str,
    alg: &'static str,
    crv: &'static str,
}

impl Ec {
    fn new(
        alg: &'static signature::EcdsaSigningAlgorithm,
        name: &'static str,
        crv: &'static str,
        kid: &'static str,
    ) -> Ec {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        let key = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
        Ec {
            key,
            kid,
            alg: name,
            crv,
        }
    }

    fn jwk(&self) -> serde_json::Value {
        // The uncompressed point: 0x04, x, y.
        let point = &self.key.public_key().as_ref()[1..];
        let (x, y) = point.split_at(point.len() / 2);
        serde_json::json!({
            "kty": "EC", "crv": self.crv, "kid": self.kid,
            "x": URL_SAFE_NO_PAD.encode(x), "y": URL_SAFE_NO_PAD.encode(y),
        })
    }

    fn token(&self, sub: &str) -> String {
        let exp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 600;
        let header = serde_json::json!({"alg": self.alg, "kid": self.kid});
        let claims = serde_json::json!({"sub": sub, "exp": exp});
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let sig = self
            .key
            .sign(&SystemRandom::new(), input.as_bytes())
            .unwrap();
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref()))
    }
}

/// The outcome of `token` (awaited when it is pending) and whether it was pending.
async fn check(jwt: &Jwt, token: &str) -> (Outcome, bool) {
    let mut headers = HeaderMap::new();
    headers.insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    let uri = Uri::from_static("/orders");
    let req = AuthRequest {
        method: &Method::GET,
        uri: &uri,
        headers: &headers,
        peer: "127.0.0.1:5000".parse().unwrap(),
        client: "127.0.0.1".parse().unwrap(),
        tls: false,
        route: "orders",
    };
    match jwt.check(&req) {
        Verdict::Ready(o) => (o, false),
        Verdict::Pending(p) => (p.await, true),
    }
}

fn consumer(o: &Outcome) -> Option<&str> {
    match o {
        Outcome::Accepted(a) => a.consumer.as_deref(),
        Outcome::Refused(r) => panic!("refused: {:?}", r.result),
    }
}

// A current-thread runtime: the thread that asks is the one that awaits, as a serving
// thread does, so the token cache (per thread) sees what the pool verified.
#[tokio::test(flavor = "current_thread")]
async fn a_cold_es384_token_is_verified_on_the_pool_and_es256_where_it_is_asked() {
    let p384 = Ec::new(
        &signature::ECDSA_P384_SHA384_FIXED_SIGNING,
        "ES384",
        "P-384",
        "p384",
    );
    let p256 = Ec::new(
        &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
        "ES256",
        "P-256",
        "p256",
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jwks.json");
    let jwks = serde_json::json!({"keys": [p384.jwk(), p256.jwk()]});
    std::fs::write(&path, jwks.to_string()).unwrap();
    let metrics = AuthMetrics::register(&tailguard_metrics::Registry::new()).unwrap();
    let jwt = Jwt::build(
        JwtSettings {
            name: "idp".into(),
            jwks: Some((
                Location::File(path),
                Refresh {
                    refresh: Duration::from_secs(300),
                    min_refresh: Duration::from_secs(60),
                    refetch_min: Duration::from_secs(30),
                    timeout: Duration::from_secs(5),
                },
            )),
            jwks_ca: None,
            secret: None,
            algorithms: vec![], // every one the keys allow: ES384 among them
            rules: ClaimRules::default(),
            from: vec![],
            claims_to_headers: vec![],
            forward_token: false,
            consumer_claim: "sub".into(),
        },
        metrics.key_set("idp").unwrap(),
    )
    .unwrap();

    let slow = p384.token("alice");
    let (outcome, pending) = check(&jwt, &slow).await;
    assert!(pending, "a cold ES384 token is checked elsewhere");
    assert_eq!(consumer(&outcome), Some("alice"));
    assert_eq!(jwt.pooled_checks(), 1);
    // Remembered on this thread: the second time is a lookup, here and now.
    let (outcome, pending) = check(&jwt, &slow).await;
    assert!(!pending);
    assert_eq!(consumer(&outcome), Some("alice"));
    assert_eq!(jwt.pooled_checks(), 1);

    // A forged ES384 token goes to the pool too, and is refused there.
    let mut forged = p384.token("mallory");
    forged.truncate(forged.len() - 4);
    forged.push_str("AAAA");
    let (outcome, pending) = check(&jwt, &forged).await;
    assert!(pending);
    assert!(
        matches!(&outcome, Outcome::Refused(r) if r.status == 401),
        "{outcome:?}"
    );
    assert_eq!(jwt.pooled_checks(), 2);

    // ES256 (~60 µs) is verified where it is asked.
    let (outcome, pending) = check(&jwt, &p256.token("bob")).await;
    assert!(!pending, "ES256 is checked on the calling thread");
    assert_eq!(consumer(&outcome), Some("bob"));
    assert_eq!(jwt.pooled_checks(), 2);
}

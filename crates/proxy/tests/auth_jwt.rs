//! `type = "jwt"` through the real gateway, against a real key server on 127.0.0.1:0: every
//! algorithm (keys made by the `openssl` CLI, tokens signed with ring), each refusal of
//! RFC 8725 (the JWT Best Current Practices), the claims, where a token comes from, the
//! headers set from claims (and a client's own copies of them dropped), RFC 6750's answers,
//! what a request gets before the first key set, a rotated key fetched again for an unknown
//! `kid`, and the last good key set kept when the key server fails.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::Request;
use ring::signature::{self, KeyPair as _};
use serde_json::{Value, json};
use tailguard_test_support::Upstream;

use crate::auth::get;
use crate::support::{self, config_errors_in, metrics_text, within};
use tailguard_test_support::credentials::openssl_pkcs8;

/// The private keys, made once by `openssl genpkey` (PKCS#8 DER).
struct Keys {
    rsa: Vec<u8>,
    rsa2: Vec<u8>,
    p256: Vec<u8>,
    p384: Vec<u8>,
    ed25519: Vec<u8>,
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        Keys {
            rsa: openssl_pkcs8(
                d,
                "rsa",
                &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
            ),
            rsa2: openssl_pkcs8(
                d,
                "rsa2",
                &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
            ),
            p256: openssl_pkcs8(
                d,
                "p256",
                &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
            ),
            p384: openssl_pkcs8(
                d,
                "p384",
                &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"],
            ),
            ed25519: openssl_pkcs8(d, "ed", &["-algorithm", "ed25519"]),
        }
    })
}

const SECRET: &[u8] = b"a shared secret of at least thirty-two bytes!";

/// Signs tokens with one key.
enum Signer {
    Rsa(signature::RsaKeyPair),
    Ec(signature::EcdsaKeyPair, &'static str),
    Ed(signature::Ed25519KeyPair),
    Hmac,
}

fn b64(b: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(b)
}

impl Signer {
    fn rsa(der: &[u8]) -> Signer {
        Signer::Rsa(signature::RsaKeyPair::from_pkcs8(der).expect("RSA PKCS#8"))
    }
    fn ec(der: &[u8], crv: &'static str) -> Signer {
        let alg = if crv == "P-256" {
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING
        } else {
            &signature::ECDSA_P384_SHA384_FIXED_SIGNING
        };
        let rng = ring::rand::SystemRandom::new();
        Signer::Ec(
            signature::EcdsaKeyPair::from_pkcs8(alg, der, &rng).expect("EC PKCS#8"),
            crv,
        )
    }
    fn ed(der: &[u8]) -> Signer {
        Signer::Ed(signature::Ed25519KeyPair::from_pkcs8_maybe_unchecked(der).expect("Ed25519"))
    }

    /// The public JWK, with `kid`.
    fn jwk(&self, kid: &str) -> Value {
        match self {
            Signer::Rsa(k) => {
                let c = signature::RsaPublicKeyComponents::<Vec<u8>>::from(k.public());
                json!({"kty": "RSA", "kid": kid, "use": "sig", "n": b64(&c.n), "e": b64(&c.e)})
            }
            Signer::Ec(k, crv) => {
                let p = k.public_key().as_ref();
                let size = (p.len() - 1) / 2;
                json!({"kty": "EC", "kid": kid, "crv": crv,
                       "x": b64(&p[1..1 + size]), "y": b64(&p[1 + size..])})
            }
            Signer::Ed(k) => {
                json!({"kty": "OKP", "kid": kid, "crv": "Ed25519", "x": b64(k.public_key().as_ref())})
            }
            Signer::Hmac => json!({}),
        }
    }

    /// A token with `header` (its `alg` set by the caller) and `claims`.
    fn sign(&self, header: Value, claims: Value) -> String {
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let alg = header["alg"].as_str().expect("alg");
        let rng = ring::rand::SystemRandom::new();
        let sig = match self {
            Signer::Rsa(k) => {
                let enc: &dyn signature::RsaEncoding = match alg {
                    "RS256" => &signature::RSA_PKCS1_SHA256,
                    "RS384" => &signature::RSA_PKCS1_SHA384,
                    "RS512" => &signature::RSA_PKCS1_SHA512,
                    "PS256" => &signature::RSA_PSS_SHA256,
                    "PS384" => &signature::RSA_PSS_SHA384,
                    _ => &signature::RSA_PSS_SHA512,
                };
                let mut sig = vec![0; k.public().modulus_len()];
                k.sign(enc, &rng, input.as_bytes(), &mut sig).expect("sign");
                sig
            }
            Signer::Ec(k, _) => k
                .sign(&rng, input.as_bytes())
                .expect("sign")
                .as_ref()
                .to_vec(),
            Signer::Ed(k) => k.sign(input.as_bytes()).as_ref().to_vec(),
            Signer::Hmac => {
                let a = match alg {
                    "HS256" => ring::hmac::HMAC_SHA256,
                    "HS384" => ring::hmac::HMAC_SHA384,
                    _ => ring::hmac::HMAC_SHA512,
                };
                ring::hmac::sign(&ring::hmac::Key::new(a, SECRET), input.as_bytes())
                    .as_ref()
                    .to_vec()
            }
        };
        format!("{input}.{}", b64(&sig))
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// Claims valid for an hour, for `sub`.
fn claims(sub: &str) -> Value {
    json!({"sub": sub, "iss": "https://idp.test/", "aud": "orders-api", "exp": now() + 3600})
}

/// A key server: answers every request with its current status and body, counting them.
struct KeyServer {
    addr: SocketAddr,
    state: Arc<Mutex<(u16, String)>>,
    hits: Arc<AtomicUsize>,
}

impl KeyServer {
    async fn start(body: String) -> KeyServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new((200, body)));
        let hits = Arc::new(AtomicUsize::new(0));
        let (s, h) = (Arc::clone(&state), Arc::clone(&hits));
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            while let Ok((mut sock, _)) = listener.accept().await {
                let (s, h) = (Arc::clone(&s), Arc::clone(&h));
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    h.fetch_add(1, Ordering::SeqCst);
                    let (status, body) = s.lock().expect("state").clone();
                    let head = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = sock.write_all(head.as_bytes()).await;
                    let _ = sock.write_all(body.as_bytes()).await;
                });
            }
        });
        KeyServer { addr, state, hits }
    }

    fn set(&self, status: u16, body: String) {
        *self.state.lock().expect("state") = (status, body);
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

fn jwks(keys: &[Value]) -> String {
    json!({ "keys": keys }).to_string()
}

async fn with_token(url: &str, token: &str) -> (u16, http::HeaderMap, String) {
    get(url, &[("authorization", &format!("Bearer {token}"))]).await
}

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

/// Polls `f` until true, 15 s at most.
async fn eventually(mut f: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// A gateway in `dir` with one upstream `up`, then `rest`.
fn start(
    dir: &std::path::Path,
    upstream: SocketAddr,
    rest: &str,
) -> (tailguard_proxy::Server, String) {
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{upstream}\" }}]\n\n{rest}"
    );
    let config = tailguard_proxy::Config::parse(&text, "gw.toml", dir)
        .unwrap_or_else(|e| panic!("invalid test config:\n{e}"));
    support::start(config)
}

/// Every asymmetric signer with its `alg`s and `kid`.
fn signers() -> Vec<(Signer, &'static str, Vec<&'static str>)> {
    let k = keys();
    vec![
        (
            Signer::rsa(&k.rsa),
            "rsa",
            vec!["RS256", "RS384", "RS512", "PS256", "PS384", "PS512"],
        ),
        (Signer::ec(&k.p256, "P-256"), "p256", vec!["ES256"]),
        (Signer::ec(&k.p384, "P-384"), "p384", vec!["ES384"]),
        (Signer::ed(&k.ed25519), "ed", vec!["EdDSA"]),
    ]
}

#[tokio::test]
async fn every_algorithm_verifies_and_the_upstream_gets_claims_not_the_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("secret"), SECRET).expect("secret");
    let all = signers();
    let server = KeyServer::start(jwks(
        &all.iter().map(|(s, kid, _)| s.jwk(kid)).collect::<Vec<_>>(),
    ))
    .await;
    let upstream = Upstream::start().await;
    let (gw, url) = start(
        dir.path(),
        upstream.addr,
        &format!(
            "[[auth]]\nname = \"idp\"\ntype = \"jwt\"\njwks = \"http://{}/jwks.json\"\n\
             issuer = \"https://idp.test/\"\naudiences = [\"orders-api\"]\n\
             claims_to_headers = {{ sub = \"x-user-id\", scope = \"x-scopes\" }}\n\n\
             [[auth]]\nname = \"shared\"\ntype = \"jwt\"\nsecret_file = \"secret\"\n\
             claims_to_headers = {{ sub = \"x-user-id\" }}\n\n\
             [[routes]]\nid = \"orders\"\nupstream = \"up\"\nauth = [\"idp\", \"shared\"]\n",
            server.addr
        ),
    );
    // The key set is fetched in the background: a first token waits for it.
    let first = all[0]
        .0
        .sign(json!({"alg": "RS256", "kid": "rsa"}), claims("first"));
    assert!(eventually(async || with_token(&format!("{url}/x"), &first).await.0 == 200).await);
    let mut tried = 0;
    for (signer, kid, algs) in &all {
        for alg in algs {
            let mut c = claims(&format!("user-{alg}"));
            c["scope"] = json!(["orders:read", "orders:write"]);
            let token = signer.sign(json!({"alg": alg, "kid": kid, "typ": "JWT"}), c);
            let (status, _, echoed) = with_token(&format!("{url}/echo"), &token).await;
            assert_eq!(status, 200, "{alg}: {echoed}");
            assert!(
                echoed.contains(&format!("x-user-id: user-{alg}\n")),
                "{alg}: {echoed}"
            );
            assert!(
                echoed.contains("x-scopes: orders:read orders:write\n"),
                "{echoed}"
            );
            assert!(
                !echoed.contains("authorization"),
                "the token is not forwarded: {echoed}"
            );
            tried += 1;
        }
    }
    for alg in ["HS256", "HS384", "HS512"] {
        let token = Signer::Hmac.sign(json!({"alg": alg}), claims("hmac-user"));
        let (status, _, echoed) = with_token(&format!("{url}/echo"), &token).await;
        assert_eq!(status, 200, "{alg}: {echoed}");
        assert!(echoed.contains("x-user-id: hmac-user\n"), "{echoed}");
        tried += 1;
    }
    assert_eq!(tried, 12);
    let text = metrics_text(&gw);
    for line in [
        "tailguard_auth_requests_total{route=\"orders\",auth=\"idp\",result=\"ok\"} 10",
        "tailguard_auth_requests_total{route=\"orders\",auth=\"shared\",result=\"ok\"} 3",
        "tailguard_auth_jwks_keys{auth=\"idp\"} 4",
        "tailguard_auth_jwks_refresh_failures_total{auth=\"idp\"} 0",
    ] {
        assert!(has_line(&text, line), "no `{line}` in:\n{text}");
    }
    gw.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn the_refusals_of_rfc_8725_each_answer_401_and_count_as_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rsa = Signer::rsa(&keys().rsa);
    let ec = Signer::ec(&keys().p256, "P-256");
    std::fs::write(
        dir.path().join("jwks.json"),
        jwks(&[rsa.jwk("rsa"), ec.jwk("p256")]),
    )
    .expect("jwks");
    let upstream = Upstream::start().await;
    let (gw, url) = start(
        dir.path(),
        upstream.addr,
        "[[auth]]\nname = \"idp\"\ntype = \"jwt\"\njwks = \"jwks.json\"\n\
         algorithms = [\"RS256\", \"PS256\"]\n\n\
         [[routes]]\nid = \"orders\"\nupstream = \"up\"\nauth = \"idp\"\n",
    );
    let url = format!("{url}/x");
    let good = rsa.sign(json!({"alg": "RS256", "kid": "rsa"}), claims("alice"));
    assert_eq!(with_token(&url, &good).await.0, 200);

    let c = b64(claims("mallory").to_string().as_bytes());
    let mut refused = Vec::new();
    // `none` in any spelling, unsigned or with a signature.
    for none in ["none", "None", "NONE", "nOnE"] {
        let h = b64(json!({"alg": none, "kid": "rsa"}).to_string().as_bytes());
        refused.push((format!("alg {none}, unsigned"), format!("{h}.{c}.")));
        refused.push((
            format!("alg {none}, signed"),
            format!("{h}.{c}.{}", b64(b"x")),
        ));
    }
    // HS256 "signed" with the RSA public key (its modulus, and its JWK's text) as secret.
    let Signer::Rsa(pair) = &rsa else {
        unreachable!()
    };
    let n = signature::RsaPublicKeyComponents::<Vec<u8>>::from(pair.public()).n;
    for secret in [n, rsa.jwk("rsa").to_string().into_bytes()] {
        let h = b64(json!({"alg": "HS256", "kid": "rsa"}).to_string().as_bytes());
        let input = format!("{h}.{c}");
        let tag = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret),
            input.as_bytes(),
        );
        refused.push((
            "HS256 with the RSA public key".into(),
            format!("{input}.{}", b64(tag.as_ref())),
        ));
    }
    // A key of our set, but an algorithm not pinned (ES256 is in the set, not in `algorithms`).
    refused.push((
        "ES256 not pinned".into(),
        ec.sign(json!({"alg": "ES256", "kid": "p256"}), claims("mallory")),
    ));
    // `jku`, `x5u`, an embedded `jwk`: never trusted, even on a token our key signed.
    for (param, value) in [
        ("jku", json!("https://evil.test/jwks.json")),
        ("x5u", json!("https://evil.test/cert.pem")),
        ("jwk", rsa.jwk("rsa")),
    ] {
        let mut header = json!({"alg": "RS256", "kid": "rsa"});
        header[param] = value;
        refused.push((
            format!("header {param}"),
            rsa.sign(header, claims("mallory")),
        ));
    }
    // An unknown `crit` extension.
    refused.push((
        "crit".into(),
        rsa.sign(
            json!({"alg": "RS256", "kid": "rsa", "crit": ["exp-ext"], "exp-ext": 1}),
            claims("mallory"),
        ),
    ));
    for (what, token) in &refused {
        let (status, head, body) = with_token(&url, token).await;
        assert_eq!(status, 401, "{what}: {body}");
        assert_eq!(
            head["www-authenticate"], "Bearer realm=\"idp\", error=\"invalid_token\"",
            "{what}"
        );
        assert!(!body.contains(token.as_str()), "the token is never echoed");
    }
    assert_eq!(
        upstream.requests(),
        1,
        "only the good token reached the upstream"
    );
    let text = metrics_text(&gw);
    let line = format!(
        "tailguard_auth_requests_total{{route=\"orders\",auth=\"idp\",result=\"refused\"}} {}",
        refused.len()
    );
    assert!(has_line(&text, &line), "no `{line}` in:\n{text}");
    gw.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn claims_are_checked_and_answered_as_rfc_6750_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ec = Signer::ec(&keys().p256, "P-256");
    std::fs::write(dir.path().join("jwks.json"), jwks(&[ec.jwk("k1")])).expect("jwks");
    let upstream = Upstream::start().await;
    let (gw, url) = start(
        dir.path(),
        upstream.addr,
        "[[auth]]\nname = \"idp\"\ntype = \"jwt\"\njwks = \"jwks.json\"\n\
         issuer = \"https://idp.test/\"\naudiences = [\"orders-api\", \"billing-api\"]\n\
         required_claims = [\"tenant\"]\n\n\
         [[routes]]\nid = \"orders\"\nupstream = \"up\"\nauth = \"idp\"\n",
    );
    let url = format!("{url}/x");
    let sign = |edit: &dyn Fn(&mut Value)| {
        let mut c = claims("alice");
        c["tenant"] = json!("acme");
        edit(&mut c);
        ec.sign(json!({"alg": "ES256", "kid": "k1"}), c)
    };
    let t = now();
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("valid", sign(&|_| {}), 200, "ok"),
        (
            "aud in an array",
            sign(&|c| c["aud"] = json!(["x", "billing-api"])),
            200,
            "ok",
        ),
        (
            "exp 30 s ago, within the leeway",
            sign(&|c| c["exp"] = json!(t - 30)),
            200,
            "ok",
        ),
        (
            "exp 120 s ago",
            sign(&|c| c["exp"] = json!(t - 120)),
            401,
            "expired",
        ),
        (
            "nbf in 120 s",
            sign(&|c| c["nbf"] = json!(t + 120)),
            401,
            "not_yet_valid",
        ),
        (
            "exp as a string",
            sign(&|c| c["exp"] = json!((t + 3600).to_string())),
            401,
            "invalid",
        ),
        (
            "another issuer",
            sign(&|c| c["iss"] = json!("https://evil.test/")),
            401,
            "wrong_issuer",
        ),
        (
            "another audience",
            sign(&|c| c["aud"] = json!("other-api")),
            401,
            "wrong_audience",
        ),
        (
            "no aud",
            sign(&|c| {
                c.as_object_mut().unwrap().remove("aud");
            }),
            401,
            "wrong_audience",
        ),
        (
            "no tenant",
            sign(&|c| {
                c.as_object_mut().unwrap().remove("tenant");
            }),
            403,
            "missing_claim",
        ),
        (
            "a bad signature",
            {
                let good = sign(&|_| {});
                let (rest, _) = good.rsplit_once('.').unwrap();
                format!("{rest}.{}", b64(&[7u8; 64]))
            },
            401,
            "invalid_signature",
        ),
        ("not a JWT", "abc.def".into(), 401, "invalid"),
    ];
    for (what, token, status, _) in &cases {
        let (got, head, _) = with_token(&url, token).await;
        assert_eq!(got, *status, "{what}");
        let challenge = head
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap().to_owned());
        match status {
            200 => assert_eq!(challenge, None),
            403 => assert_eq!(
                challenge.as_deref(),
                Some("Bearer realm=\"idp\", error=\"insufficient_scope\"")
            ),
            _ => assert_eq!(
                challenge.as_deref(),
                Some("Bearer realm=\"idp\", error=\"invalid_token\""),
                "{what}"
            ),
        }
    }
    // No token: the challenge without an error (RFC 6750 §3.1); a Basic header is no token.
    for headers in [vec![], vec![("authorization", "Basic YTpi")]] {
        let (status, head, _) = get(&url, &headers).await;
        assert_eq!(status, 401);
        assert_eq!(head["www-authenticate"], "Bearer realm=\"idp\"");
    }
    let text = metrics_text(&gw);
    for result in [
        "expired",
        "not_yet_valid",
        "wrong_issuer",
        "missing_claim",
        "invalid_signature",
    ] {
        let line = format!(
            "tailguard_auth_requests_total{{route=\"orders\",auth=\"idp\",result=\"{result}\"}} 1"
        );
        assert!(has_line(&text, &line), "no `{line}` in:\n{text}");
    }
    gw.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn tokens_from_the_query_or_a_cookie_and_headers_a_client_cannot_spoof() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let ed = Signer::ed(&keys().ed25519);
    std::fs::write(dir.path().join("jwks.json"), jwks(&[ed.jwk("ed")])).expect("jwks");
    let upstream = Upstream::start().await;
    let (gw, url) = start(
        dir.path(),
        upstream.addr,
        &format!(
            "[access_log]\npath = \"{}\"\ntemplate = \"$request_uri $status $consumer $auth_result\"\n\n\
             [[auth]]\nname = \"idp\"\ntype = \"jwt\"\njwks = \"jwks.json\"\n\
             from = [\"header:authorization\", \"query:access_token\", \"cookie:session\"]\n\
             claims_to_headers = {{ sub = \"x-user-id\", tenant = \"x-tenant\" }}\n\n\
             [[auth]]\nname = \"keys\"\ntype = \"api_key\"\n\
             consumers = [{{ name = \"batch\", keys = [\"sha256:{}\"] }}]\n\n\
             [[routes]]\nid = \"orders\"\nupstream = \"up\"\nauth = [\"idp\", \"keys\"]\n",
            log.display(),
            hex_sha256(b"batch-key")
        ),
    );
    let mut c = claims("alice");
    c["tenant"] = json!("acme");
    let token = ed.sign(json!({"alg": "EdDSA", "kid": "ed"}), c);
    // From the query: the upstream's target and the log lose it.
    let (status, _, echoed) = get(&format!("{url}/echo?a=1&access_token={token}"), &[]).await;
    assert_eq!(status, 200, "{echoed}");
    assert!(echoed.starts_with("GET /echo?a=1 "), "{echoed}");
    // From a cookie: the other cookies stay.
    let cookie = format!("theme=dark; session={token}");
    let (status, _, echoed) = get(&format!("{url}/echo"), &[("cookie", &cookie)]).await;
    assert_eq!(status, 200, "{echoed}");
    assert!(echoed.contains("cookie: theme=dark\n"), "{echoed}");
    assert!(!echoed.contains(&token), "{echoed}");
    // Spoofing: the client's own x-user-id and x-tenant never reach the upstream, whether
    // the token sets them, another authenticator let the request in, or nothing did.
    let spoof = [
        ("x-user-id", "admin"),
        ("x-tenant", "root"),
        ("X-User-Id", "admin2"),
    ];
    let mut headers = spoof.to_vec();
    let bearer = format!("Bearer {token}");
    headers.push(("authorization", &bearer));
    let (status, _, echoed) = get(&format!("{url}/echo"), &headers).await;
    assert_eq!(status, 200);
    assert!(
        echoed.contains("x-user-id: alice\n") && echoed.contains("x-tenant: acme\n"),
        "{echoed}"
    );
    assert!(
        !echoed.contains("admin") && !echoed.contains("root"),
        "{echoed}"
    );
    let mut headers = spoof.to_vec();
    headers.push(("x-api-key", "batch-key"));
    let (status, _, echoed) = get(&format!("{url}/echo"), &headers).await;
    assert_eq!(status, 200);
    assert!(
        !echoed.contains("x-user-id") && !echoed.contains("x-tenant"),
        "{echoed}"
    );
    assert!(gw.shutdown(Duration::from_secs(5)).await);
    let logged = std::fs::read_to_string(&log).expect("the access log");
    assert!(
        !logged.contains(&token),
        "the token is never logged:\n{logged}"
    );
    let mut lines: Vec<&str> = logged.lines().collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "/echo 200 alice ok",
            "/echo 200 alice ok",
            "/echo 200 batch ok",
            "/echo?a=1 200 alice ok"
        ]
    );
}

fn hex_sha256(b: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, b);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn before_the_first_key_set_a_token_gets_503_at_once_and_no_token_401() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A key server that holds every request for ten minutes.
    let hanging = Upstream::start().await;
    let upstream = Upstream::start().await;
    let (gw, url) = start(
        dir.path(),
        upstream.addr,
        &format!(
            "[[auth]]\nname = \"idp\"\ntype = \"jwt\"\njwks = \"http://{}/delay/600000\"\n\n\
             [[routes]]\nid = \"orders\"\nupstream = \"up\"\nauth = \"idp\"\n",
            hanging.addr
        ),
    );
    let rsa = Signer::rsa(&keys().rsa);
    let token = rsa.sign(json!({"alg": "RS256", "kid": "rsa"}), claims("alice"));
    // Answered within the test's 30 s bound while the fetch hangs for 10 minutes (its own
    // timeout is 5 s): the request never waits on the key server.
    let (status, head, _) = with_token(&format!("{url}/x"), &token).await;
    assert_eq!(status, 503);
    assert_eq!(head["retry-after"], "1");
    let (status, _, _) = get(&format!("{url}/x"), &[]).await;
    assert_eq!(status, 401);
    assert_eq!(upstream.requests(), 0);
    let text = metrics_text(&gw);
    let line = "tailguard_auth_requests_total{route=\"orders\",auth=\"idp\",result=\"keys_unavailable\"} 1";
    assert!(has_line(&text, line), "no `{line}` in:\n{text}");
    assert!(
        has_line(
            &text,
            "tailguard_auth_jwks_last_success_timestamp_seconds{auth=\"idp\"} 0"
        ),
        "{text}"
    );
    gw.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn an_unknown_kid_fetches_the_keys_again_once_and_a_failing_key_server_keeps_the_last_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    let old = Signer::rsa(&keys().rsa);
    let new = Signer::rsa(&keys().rsa2);
    let server = KeyServer::start(jwks(&[old.jwk("2026-01")])).await;
    let upstream = Upstream::start().await;
    let (gw, url) = start(
        dir.path(),
        upstream.addr,
        &format!(
            "[[auth]]\nname = \"idp\"\ntype = \"jwt\"\njwks = \"http://{}/jwks\"\n\
             refresh_s = 3600\nrefetch_min_s = 3600\n\n\
             [[routes]]\nid = \"orders\"\nupstream = \"up\"\nauth = \"idp\"\n",
            server.addr
        ),
    );
    let url = format!("{url}/x");
    let old_token = old.sign(json!({"alg": "RS256", "kid": "2026-01"}), claims("alice"));
    assert!(eventually(async || with_token(&url, &old_token).await.0 == 200).await);
    assert_eq!(server.hits(), 1);

    // The key server rotates: a token with the new `kid` is refused until the set is
    // fetched again, which that refusal asked for.
    server.set(200, jwks(&[old.jwk("2026-01"), new.jwk("2026-02")]));
    let new_token = new.sign(json!({"alg": "RS256", "kid": "2026-02"}), claims("bob"));
    let (status, head, _) = with_token(&url, &new_token).await;
    assert_eq!(status, 401);
    assert_eq!(
        head["www-authenticate"],
        "Bearer realm=\"idp\", error=\"invalid_token\""
    );
    assert!(eventually(async || with_token(&url, &new_token).await.0 == 200).await);
    assert_eq!(server.hits(), 2);
    // Made-up `kid`s: refused, and no further fetch within `refetch_min_s`.
    for i in 0..20 {
        let t = new.sign(
            json!({"alg": "RS256", "kid": format!("bogus-{i}")}),
            claims("eve"),
        );
        assert_eq!(with_token(&url, &t).await.0, 401);
    }
    assert_eq!(server.hits(), 2);
    assert_eq!(with_token(&url, &old_token).await.0, 200);
    // The first new token's refusal and the 20 made-up ones, and any new-token try that
    // came before the refetch finished.
    let text = metrics_text(&gw);
    let prefix =
        "tailguard_auth_requests_total{route=\"orders\",auth=\"idp\",result=\"unknown_key\"} ";
    let count: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no `{prefix}` in:\n{text}"));
    assert!(count >= 21, "{count}");
    gw.shutdown(Duration::from_secs(5)).await;

    // A key server that fails after its first answer: refreshed every second, failing, the
    // first set stays in force and the failures are counted.
    let server = KeyServer::start(jwks(&[old.jwk("2026-01")])).await;
    let (gw, url) = start(
        dir.path(),
        upstream.addr,
        &format!(
            "[[auth]]\nname = \"idp\"\ntype = \"jwt\"\njwks = \"http://{}/jwks\"\n\
             refresh_s = 1\nmin_refresh_s = 1\n\n\
             [[routes]]\nid = \"orders\"\nupstream = \"up\"\nauth = \"idp\"\n",
            server.addr
        ),
    );
    let url = format!("{url}/x");
    assert!(eventually(async || with_token(&url, &old_token).await.0 == 200).await);
    server.set(500, "down".into());
    assert!(
        eventually(async || {
            metrics_text(&gw).lines().any(|l| {
                l.starts_with("tailguard_auth_jwks_refresh_failures_total{auth=\"idp\"} ")
                    && !l.ends_with(" 0")
            })
        })
        .await
    );
    let fresh = old.sign(json!({"alg": "RS256", "kid": "2026-01"}), claims("carol"));
    assert_eq!(
        with_token(&url, &fresh).await.0,
        200,
        "the last good set is kept"
    );
    gw.shutdown(Duration::from_secs(5)).await;
}

#[test]
fn jwt_config_errors_name_the_line_and_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("short"), b"too short").expect("secret");
    std::fs::write(dir.path().join("bad.json"), b"{\"keys\": []}").expect("jwks");
    let errors = config_errors_in(
        dir.path(),
        r#"[[listeners]]
address = "127.0.0.1:0"

[[auth]]
name = "a"
type = "jwt"
jwks = "bad.json"
algorithms = ["RS256", "HS256", "none"]
from = ["body:token"]
claims_to_headers = { sub = "host" }

[[auth]]
name = "b"
type = "jwt"
secret_file = "short"
keys_file = "x"

[[auth]]
name = "c"
type = "jwt"
"#,
    );
    let bad = dir.path().join("bad.json");
    let short = dir.path().join("short");
    assert_eq!(
        errors,
        [
            format!("gw.toml:7:8: auth[0].jwks: {}: no usable signature key (RSA, EC P-256/P-384, OKP Ed25519)", bad.display()),
            "gw.toml:8:24: auth[0].algorithms: `HS256` needs `secret_file` (a key set's keys are never HMAC secrets)".to_owned(),
            "gw.toml:8:33: auth[0].algorithms: `none` is not an algorithm; expected one of RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA, HS256, HS384, HS512".to_owned(),
            "gw.toml:9:9: auth[0].from: `body:` is not a source here; expected `header:NAME` or `query:NAME` or `cookie:NAME`".to_owned(),
            "gw.toml:10:29: auth[0].claims_to_headers.sub: `host` is not a header a claim may set".to_owned(),
            "gw.toml:16:1: auth[1]: unknown field `keys_file`, expected one of `name`, `type`, `jwks`, `jwks_ca`, `secret_file`, `issuer`, `audiences`, `algorithms`, `leeway_s`, `required_claims`, `from`, `claims_to_headers`, `forward_token`, `consumer_claim`, `refresh_s`, `min_refresh_s`, `refetch_min_s`, `timeout_ms`".to_owned(),
            "gw.toml:19:8: auth[2]: a `jwt` authenticator needs `jwks` or `secret_file`".to_owned(),
        ],
        "{errors:#?}\n{}",
        short.display()
    );
}

#[tokio::test]
async fn forward_token_true_passes_the_token_to_the_upstream_from_the_header_and_the_query() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("secret"), SECRET).expect("secret");
    let upstream = Upstream::start().await;
    let (gw, url) = start(
        dir.path(),
        upstream.addr,
        "[[auth]]\nname = \"kept\"\ntype = \"jwt\"\nsecret_file = \"secret\"\n\
         from = [\"header:authorization\", \"query:access_token\"]\n\
         forward_token = true\nclaims_to_headers = { sub = \"x-user-id\" }\n\n\
         [[auth]]\nname = \"taken\"\ntype = \"jwt\"\nsecret_file = \"secret\"\n\
         from = [\"header:authorization\", \"query:access_token\"]\n\n\
         [[routes]]\nid = \"kept\"\nupstream = \"up\"\npath = { prefix = \"/echo/kept\" }\nauth = \"kept\"\n\n\
         [[routes]]\nid = \"taken\"\nupstream = \"up\"\npath = { prefix = \"/echo/taken\" }\nauth = \"taken\"\n",
    );
    let token = Signer::Hmac.sign(json!({"alg": "HS256"}), claims("alice"));

    // In the header: passed as the client sent it, claims set beside it.
    let (status, _, echoed) = with_token(&format!("{url}/echo/kept"), &token).await;
    assert_eq!(status, 200, "{echoed}");
    assert!(
        echoed.contains(&format!("authorization: Bearer {token}\n")),
        "{echoed}"
    );
    assert!(echoed.contains("x-user-id: alice\n"), "{echoed}");
    // In the query: the target keeps it.
    let (status, _, echoed) = get(&format!("{url}/echo/kept?a=1&access_token={token}"), &[]).await;
    assert_eq!(status, 200, "{echoed}");
    assert!(
        echoed.contains(&format!("access_token={token}")),
        "{echoed}"
    );

    // The default (`forward_token = false`) takes it out of both.
    let (status, _, echoed) = with_token(&format!("{url}/echo/taken"), &token).await;
    assert_eq!(status, 200, "{echoed}");
    assert!(!echoed.contains("authorization"), "{echoed}");
    let (status, _, echoed) = get(&format!("{url}/echo/taken?a=1&access_token={token}"), &[]).await;
    assert_eq!(status, 200, "{echoed}");
    assert!(!echoed.contains(&token), "{echoed}");
    assert!(!echoed.contains("access_token"), "{echoed}");
    gw.shutdown(Duration::from_secs(5)).await;
}

/// A gRPC call (`content-type: application/grpc`) over h2c to `url`, with `headers`: its
/// HTTP status, head and body.
async fn grpc_call(url: &str, headers: &[(&str, &str)]) -> (u16, http::HeaderMap, Vec<u8>) {
    use http_body_util::BodyExt as _;
    let mut req = Request::post(format!("{url}/test.Echo/Unary"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = http_body_util::Full::new(tailguard_test_support::grpc::frame(
        &tailguard_test_support::grpc::Msg::new("hi", 1),
    ))
    .map_err(|never| match never {})
    .boxed();
    let resp =
        within(tailguard_test_support::h2c_client().request(req.body(body).expect("request")))
            .await
            .expect("an answer");
    let (parts, body) = resp.into_parts();
    let body = within(body.collect()).await.expect("body").to_bytes();
    (parts.status.as_u16(), parts.headers, body.to_vec())
}

#[tokio::test]
async fn a_refused_grpc_call_is_answered_trailers_only_with_unauthenticated_or_permission_denied() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("secret"), SECRET).expect("secret");
    let grpc = tailguard_test_support::grpc::GrpcUpstream::start().await;
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"grpc\"\nprotocol = \"h2c\"\n\
         endpoints = [{{ address = \"{}\" }}]\n\n\
         [[auth]]\nname = \"idp\"\ntype = \"jwt\"\nsecret_file = \"secret\"\n\
         required_claims = [\"tenant\"]\n\n\
         [[routes]]\nid = \"grpc\"\nupstream = \"grpc\"\nauth = \"idp\"\n",
        grpc.addr
    );
    let config = tailguard_proxy::Config::parse(&text, "gw.toml", dir.path())
        .unwrap_or_else(|e| panic!("invalid test config:\n{e}"));
    let (gw, url) = support::start(config);
    let bearer = |c: Value| format!("Bearer {}", Signer::Hmac.sign(json!({"alg": "HS256"}), c));

    // No token: UNAUTHENTICATED (16), in one HEADERS frame: HTTP 200, no message.
    let (status, head, body) = grpc_call(&url, &[]).await;
    assert_eq!(status, 200, "{head:?}");
    assert_eq!(head["grpc-status"], "16", "{head:?}");
    assert_eq!(head["grpc-message"], "Unauthorized", "{head:?}");
    assert_eq!(head["content-type"], "application/grpc", "{head:?}");
    assert!(
        head["www-authenticate"]
            .to_str()
            .is_ok_and(|v| v.starts_with("Bearer")),
        "{head:?}"
    );
    assert!(body.is_empty(), "trailers-only: {body:?}");
    // A token without the required claim: PERMISSION_DENIED (7).
    let (status, head, body) = grpc_call(&url, &[("authorization", &bearer(claims("a")))]).await;
    assert_eq!(status, 200, "{head:?}");
    assert_eq!(head["grpc-status"], "7", "{head:?}");
    assert!(body.is_empty(), "{body:?}");
    assert_eq!(grpc.calls(), 0, "refused calls never reach the upstream");
    // A good one goes through.
    let mut ok = claims("a");
    ok["tenant"] = json!("acme");
    let (status, _, body) = grpc_call(&url, &[("authorization", &bearer(ok))]).await;
    assert_eq!(status, 200);
    assert!(!body.is_empty(), "the upstream's answer");
    assert_eq!(grpc.calls(), 1);

    let text = metrics_text(&gw);
    for line in [
        "tailguard_grpc_requests_total{route=\"grpc\",grpc_status=\"16\"} 1",
        "tailguard_grpc_requests_total{route=\"grpc\",grpc_status=\"7\"} 1",
    ] {
        assert!(has_line(&text, line), "no `{line}` in:\n{text}");
    }
    gw.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_key_set_over_https_is_fetched_trusting_jwks_ca() {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let dir = tempfile::tempdir().expect("tempdir");
    let ec = Signer::ec(&keys().p256, "P-256");
    let body = jwks(&[ec.jwk("k1")]);
    let ca = tailguard_test_support::TestCa::new("key server CA");
    ca.write(&dir.path().join("idp-ca.pem"));
    let tls =
        tokio_rustls::TlsAcceptor::from(Arc::new(ca.issue(&["localhost"]).server_config(None)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&hits);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (tls, body, counted) = (tls.clone(), body.clone(), Arc::clone(&counted));
            tokio::spawn(async move {
                let Ok(stream) = tls.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |_req| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let resp = http::Response::builder()
                        .header("content-type", "application/json")
                        .body(http_body_util::Full::new(bytes::Bytes::from(body.clone())))
                        .expect("response");
                    async move { Ok::<_, std::convert::Infallible>(resp) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let upstream = Upstream::start().await;
    let (gw, url) = start(
        dir.path(),
        upstream.addr,
        &format!(
            "[[auth]]\nname = \"idp\"\ntype = \"jwt\"\n\
             jwks = \"https://localhost:{port}/jwks.json\"\njwks_ca = \"idp-ca.pem\"\n\n\
             [[routes]]\nid = \"orders\"\nupstream = \"up\"\nauth = \"idp\"\n"
        ),
    );
    let token = ec.sign(json!({"alg": "ES256", "kid": "k1"}), claims("alice"));
    assert!(eventually(async || with_token(&format!("{url}/x"), &token).await.0 == 200).await);
    assert!(hits.load(Ordering::SeqCst) >= 1);
    let text = metrics_text(&gw);
    for line in [
        "tailguard_auth_jwks_keys{auth=\"idp\"} 1",
        "tailguard_auth_jwks_refresh_failures_total{auth=\"idp\"} 0",
    ] {
        assert!(has_line(&text, line), "no `{line}` in:\n{text}");
    }
    gw.shutdown(Duration::from_secs(5)).await;

    // `jwks_ca` belongs to an https:// key set; a file that holds no certificate is named.
    std::fs::write(dir.path().join("empty.pem"), "").expect("write");
    for (jwks, ca, error) in [
        (
            "http://localhost:1/jwks.json",
            "idp-ca.pem",
            "only with an https:// `jwks`",
        ),
        (
            "https://localhost:1/jwks.json",
            "empty.pem",
            "holds no certificate",
        ),
    ] {
        let errors = config_errors_in(
            dir.path(),
            &format!(
                "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
                 [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"127.0.0.1:1\" }}]\n\n\
                 [[auth]]\nname = \"idp\"\ntype = \"jwt\"\njwks = \"{jwks}\"\njwks_ca = \"{ca}\"\n\n\
                 [[routes]]\nid = \"r\"\nupstream = \"up\"\nauth = \"idp\"\n"
            ),
        );
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("gw.toml:12:11: auth[0].jwks_ca: ") && e.contains(error)),
            "{errors:#?}"
        );
    }
}

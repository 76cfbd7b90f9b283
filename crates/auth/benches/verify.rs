//! The cold verification of one token per algorithm (`jws::verify`: parse, the header's
//! checks, the signature, the claims' JSON), what a serving thread pays for a token it has
//! not seen; against `baseline/unknown_kid`: a token of the same size parsed and refused
//! before any signature math (what everything but the signature costs).
//!
//! Keys are made by the `openssl` CLI (as the tests make them), tokens signed with ring.

use std::hint::black_box;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use criterion::{Criterion, criterion_group, criterion_main};
use ring::signature::{self, KeyPair as _};
use serde_json::json;
use tailguard_auth::jwk::{Alg, Key, KeySet};
use tailguard_auth::jws;
use tailguard_test_support::credentials::openssl_pkcs8;

fn b64(b: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(b)
}

const SECRET: &[u8] = b"a shared secret of at least thirty-two bytes!";

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let rng = ring::rand::SystemRandom::new();
    let rsa = signature::RsaKeyPair::from_pkcs8(&openssl_pkcs8(
        d,
        "rsa",
        &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
    ))
    .expect("rsa");
    let p256 = signature::EcdsaKeyPair::from_pkcs8(
        &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
        &openssl_pkcs8(
            d,
            "p256",
            &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
        ),
        &rng,
    )
    .expect("p256");
    let p384 = signature::EcdsaKeyPair::from_pkcs8(
        &signature::ECDSA_P384_SHA384_FIXED_SIGNING,
        &openssl_pkcs8(
            d,
            "p384",
            &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"],
        ),
        &rng,
    )
    .expect("p384");
    let ed = signature::Ed25519KeyPair::from_pkcs8_maybe_unchecked(&openssl_pkcs8(
        d,
        "ed",
        &["-algorithm", "ed25519"],
    ))
    .expect("ed25519");

    let rsa_pub = signature::RsaPublicKeyComponents::<Vec<u8>>::from(rsa.public());
    let point = |p: &[u8]| {
        let size = (p.len() - 1) / 2;
        (b64(&p[1..1 + size]), b64(&p[1 + size..]))
    };
    let (x256, y256) = point(p256.public_key().as_ref());
    let (x384, y384) = point(p384.public_key().as_ref());
    let doc = json!({"keys": [
        {"kty": "RSA", "kid": "rsa", "n": b64(&rsa_pub.n), "e": b64(&rsa_pub.e)},
        {"kty": "EC", "kid": "p256", "crv": "P-256", "x": x256, "y": y256},
        {"kty": "EC", "kid": "p384", "crv": "P-384", "x": x384, "y": y384},
        {"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": b64(ed.public_key().as_ref())},
    ]});
    let keys = KeySet::parse_jwks(doc.to_string().as_bytes()).expect("jwks");
    let secret = Key::hmac(SECRET.to_vec());
    let claims = b64(
        json!({"sub": "alice", "iss": "https://idp.test/", "aud": "orders-api",
        "exp": 4_000_000_000u64, "scope": "orders:read orders:write"})
        .to_string()
        .as_bytes(),
    );
    let sign = |alg: &str, kid: &str| -> String {
        let input = format!(
            "{}.{claims}",
            b64(json!({"alg": alg, "kid": kid, "typ": "JWT"})
                .to_string()
                .as_bytes())
        );
        let m = input.as_bytes();
        let sig = match alg {
            "RS256" | "RS384" | "RS512" | "PS256" | "PS384" | "PS512" => {
                let enc: &dyn signature::RsaEncoding = match alg {
                    "RS256" => &signature::RSA_PKCS1_SHA256,
                    "RS384" => &signature::RSA_PKCS1_SHA384,
                    "RS512" => &signature::RSA_PKCS1_SHA512,
                    "PS256" => &signature::RSA_PSS_SHA256,
                    "PS384" => &signature::RSA_PSS_SHA384,
                    _ => &signature::RSA_PSS_SHA512,
                };
                let mut s = vec![0; rsa.public().modulus_len()];
                rsa.sign(enc, &rng, m, &mut s).expect("sign");
                s
            }
            "ES256" => p256.sign(&rng, m).expect("sign").as_ref().to_vec(),
            "ES384" => p384.sign(&rng, m).expect("sign").as_ref().to_vec(),
            "EdDSA" => ed.sign(m).as_ref().to_vec(),
            other => {
                let a = match other {
                    "HS256" => ring::hmac::HMAC_SHA256,
                    "HS384" => ring::hmac::HMAC_SHA384,
                    _ => ring::hmac::HMAC_SHA512,
                };
                ring::hmac::sign(&ring::hmac::Key::new(a, SECRET), m)
                    .as_ref()
                    .to_vec()
            }
        };
        format!("{input}.{}", b64(&sig))
    };
    let mut group = c.benchmark_group("jwt/verify_cold");
    for alg in Alg::ALL {
        let kid = match alg {
            Alg::ES256 => "p256",
            Alg::ES384 => "p384",
            Alg::EdDSA => "ed",
            _ => "rsa",
        };
        let token = sign(alg.name(), kid);
        assert!(
            jws::verify(token.as_bytes(), &[alg], Some(&keys), Some(&secret)).is_ok(),
            "{alg:?}"
        );
        group.bench_function(alg.name(), |b| {
            b.iter(|| {
                jws::verify(
                    black_box(token.as_bytes()),
                    &[alg],
                    Some(&keys),
                    Some(&secret),
                )
            })
        });
    }
    // The baseline: the same token's parse and header checks, refused before the signature.
    let unknown = sign("RS256", "not-in-the-set");
    group.bench_function("baseline/unknown_kid", |b| {
        b.iter(|| {
            jws::verify(
                black_box(unknown.as_bytes()),
                &[Alg::RS256],
                Some(&keys),
                None,
            )
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! JSON Web Keys (RFC 7517) as the verifier uses them: a key set parsed from a JWKS
//! document, each key bound to the algorithm family of its own `kty` (RFC 8725 §3.1: an
//! RSA public key is never used as an HMAC secret), and the signature checks themselves,
//! done by `ring` (no cryptography here is hand-written: this module only picks the
//! primitive a key and an algorithm allow).

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, UnparsedPublicKey};

/// A JWS algorithm the gateway verifies (RFC 7518 §3.1, RFC 8037 for EdDSA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Alg {
    /// HMAC SHA-256, with `secret_file`.
    HS256,
    /// HMAC SHA-384.
    HS384,
    /// HMAC SHA-512.
    HS512,
    /// RSASSA-PKCS1-v1_5 SHA-256.
    RS256,
    /// RSASSA-PKCS1-v1_5 SHA-384.
    RS384,
    /// RSASSA-PKCS1-v1_5 SHA-512.
    RS512,
    /// RSASSA-PSS SHA-256.
    PS256,
    /// RSASSA-PSS SHA-384.
    PS384,
    /// RSASSA-PSS SHA-512.
    PS512,
    /// ECDSA P-256 SHA-256.
    ES256,
    /// ECDSA P-384 SHA-384.
    ES384,
    /// Ed25519.
    EdDSA,
}

impl Alg {
    /// Every algorithm, in the order `algorithms` lists them by default.
    pub const ALL: [Alg; 12] = [
        Alg::RS256,
        Alg::RS384,
        Alg::RS512,
        Alg::PS256,
        Alg::PS384,
        Alg::PS512,
        Alg::ES256,
        Alg::ES384,
        Alg::EdDSA,
        Alg::HS256,
        Alg::HS384,
        Alg::HS512,
    ];

    /// The `alg` name, exactly (a JWS `alg` is case-sensitive: `rs256` is no algorithm).
    pub fn parse(name: &str) -> Option<Alg> {
        Alg::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The `alg` name.
    pub fn name(self) -> &'static str {
        match self {
            Alg::HS256 => "HS256",
            Alg::HS384 => "HS384",
            Alg::HS512 => "HS512",
            Alg::RS256 => "RS256",
            Alg::RS384 => "RS384",
            Alg::RS512 => "RS512",
            Alg::PS256 => "PS256",
            Alg::PS384 => "PS384",
            Alg::PS512 => "PS512",
            Alg::ES256 => "ES256",
            Alg::ES384 => "ES384",
            Alg::EdDSA => "EdDSA",
        }
    }

    /// Whether it is an HMAC (a shared secret, never a key of a key set).
    pub fn is_hmac(self) -> bool {
        matches!(self, Alg::HS256 | Alg::HS384 | Alg::HS512)
    }

    /// Whether a cold check is slow enough to go to a pool off the serving thread: ES384,
    /// ~580 µs with ring where every other algorithm takes 1-60 µs
    /// (`benches/verify.rs`, docs/benchmarks/2026-12-02-auth-verify/), more than a hand-off
    /// to another thread costs.
    pub fn is_slow(self) -> bool {
        matches!(self, Alg::ES384)
    }
}

/// The public part of one key, by family.
#[derive(Clone)]
enum Material {
    /// `kty = "RSA"`: modulus and exponent, big-endian.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// `kty = "EC"`, `crv = "P-256"`: the uncompressed point.
    P256(Vec<u8>),
    /// `kty = "EC"`, `crv = "P-384"`.
    P384(Vec<u8>),
    /// `kty = "OKP"`, `crv = "Ed25519"`.
    Ed25519(Vec<u8>),
    /// A shared secret (`secret_file`), for HS256/384/512 only.
    Hmac(Vec<u8>),
}

/// One verification key: its material, its `kid`, and the `alg` it declares (if any).
#[derive(Clone)]
pub struct Key {
    kid: Option<String>,
    alg: Option<Alg>,
    material: Material,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the material (a secret is a credential).
        f.debug_struct("Key")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .finish_non_exhaustive()
    }
}

impl Key {
    /// A shared secret for HS256/384/512 (`secret_file`, its bytes as they are).
    pub fn hmac(secret: Vec<u8>) -> Key {
        Key {
            kid: None,
            alg: None,
            material: Material::Hmac(secret),
        }
    }

    /// Whether this key may verify `alg`: only an algorithm of its own family (RFC 8725
    /// §3.1), and only the one it declares, if it declares one.
    pub fn allows(&self, alg: Alg) -> bool {
        if self.alg.is_some_and(|a| a != alg) {
            return false;
        }
        matches!(
            (&self.material, alg),
            (
                Material::Rsa { .. },
                Alg::RS256 | Alg::RS384 | Alg::RS512 | Alg::PS256 | Alg::PS384 | Alg::PS512,
            ) | (Material::P256(_), Alg::ES256)
                | (Material::P384(_), Alg::ES384)
                | (Material::Ed25519(_), Alg::EdDSA)
                | (Material::Hmac(_), Alg::HS256 | Alg::HS384 | Alg::HS512)
        )
    }

    /// Verifies `signature` over `input` with `alg`; false when the key does not allow the
    /// algorithm.
    pub fn verify(&self, alg: Alg, input: &[u8], sig: &[u8]) -> bool {
        if !self.allows(alg) {
            return false;
        }
        match &self.material {
            Material::Rsa { n, e } => {
                let params: &signature::RsaParameters = match alg {
                    Alg::RS256 => &signature::RSA_PKCS1_2048_8192_SHA256,
                    Alg::RS384 => &signature::RSA_PKCS1_2048_8192_SHA384,
                    Alg::RS512 => &signature::RSA_PKCS1_2048_8192_SHA512,
                    Alg::PS256 => &signature::RSA_PSS_2048_8192_SHA256,
                    Alg::PS384 => &signature::RSA_PSS_2048_8192_SHA384,
                    _ => &signature::RSA_PSS_2048_8192_SHA512,
                };
                signature::RsaPublicKeyComponents { n, e }
                    .verify(params, input, sig)
                    .is_ok()
            }
            Material::P256(point) => {
                UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(input, sig)
                    .is_ok()
            }
            Material::P384(point) => {
                UnparsedPublicKey::new(&signature::ECDSA_P384_SHA384_FIXED, point)
                    .verify(input, sig)
                    .is_ok()
            }
            Material::Ed25519(key) => UnparsedPublicKey::new(&signature::ED25519, key)
                .verify(input, sig)
                .is_ok(),
            Material::Hmac(secret) => {
                let algorithm = match alg {
                    Alg::HS256 => ring::hmac::HMAC_SHA256,
                    Alg::HS384 => ring::hmac::HMAC_SHA384,
                    _ => ring::hmac::HMAC_SHA512,
                };
                // `ring::hmac::verify` compares in constant time.
                ring::hmac::verify(&ring::hmac::Key::new(algorithm, secret), input, sig).is_ok()
            }
        }
    }
}

/// A key set: the keys of a JWKS document (and a secret), found by `kid`.
#[derive(Debug, Default)]
pub struct KeySet {
    by_kid: HashMap<String, Vec<Arc<Key>>>,
    without_kid: Vec<Arc<Key>>,
    len: usize,
}

impl KeySet {
    /// Parses a JWKS document (`{"keys": [...]}`). Keys of a type or curve the gateway does
    /// not verify, keys with `use` other than `sig`, and symmetric (`oct`) keys are skipped
    /// (a key server publishes public keys; a secret comes from `secret_file`); a document
    /// with no usable key is an error, so a broken key server never empties a working set.
    pub fn parse_jwks(text: &[u8]) -> Result<KeySet, String> {
        let doc: serde_json::Value =
            serde_json::from_slice(text).map_err(|e| format!("not JSON: {e}"))?;
        let keys = doc
            .get("keys")
            .and_then(|k| k.as_array())
            .ok_or("no `keys` array")?;
        let mut set = KeySet::default();
        for k in keys {
            if let Some(key) = parse_jwk(k) {
                set.insert(key);
            }
        }
        if set.len == 0 {
            return Err("no usable signature key (RSA, EC P-256/P-384, OKP Ed25519)".into());
        }
        Ok(set)
    }

    /// Adds a key.
    pub fn insert(&mut self, key: Key) {
        let key = Arc::new(key);
        match &key.kid {
            Some(kid) => self.by_kid.entry(kid.clone()).or_default().push(key),
            None => self.without_kid.push(key),
        }
        self.len += 1;
    }

    /// The keys a token with `kid` (or none) may be verified with: those with that `kid`;
    /// for a token without one, every key (a set of one key is common).
    pub fn candidates<'a>(&'a self, kid: Option<&str>) -> Box<dyn Iterator<Item = &'a Key> + 'a> {
        match kid {
            Some(kid) => Box::new(
                self.by_kid
                    .get(kid)
                    .into_iter()
                    .flatten()
                    .chain(&self.without_kid)
                    .map(|k| &**k),
            ),
            None => Box::new(
                self.by_kid
                    .values()
                    .flatten()
                    .chain(&self.without_kid)
                    .map(|k| &**k),
            ),
        }
    }

    /// Whether a key has this `kid`.
    pub fn has_kid(&self, kid: &str) -> bool {
        self.by_kid.contains_key(kid)
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

fn b64(v: &serde_json::Value, field: &str) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(v.get(field)?.as_str()?).ok()
}

fn parse_jwk(k: &serde_json::Value) -> Option<Key> {
    if k.get("use")
        .and_then(|u| u.as_str())
        .is_some_and(|u| u != "sig")
    {
        return None;
    }
    let kid = k.get("kid").and_then(|v| v.as_str()).map(str::to_owned);
    let alg = match k.get("alg").and_then(|v| v.as_str()) {
        Some(name) => Some(Alg::parse(name)?),
        None => None,
    };
    let crv = k.get("crv").and_then(|v| v.as_str());
    let material = match (k.get("kty")?.as_str()?, crv) {
        ("RSA", _) => Material::Rsa {
            n: b64(k, "n")?,
            e: b64(k, "e")?,
        },
        ("EC", Some(crv @ ("P-256" | "P-384"))) => {
            let (x, y) = (b64(k, "x")?, b64(k, "y")?);
            let size = if crv == "P-256" { 32 } else { 48 };
            if x.len() != size || y.len() != size {
                return None;
            }
            let mut point = Vec::with_capacity(1 + 2 * size);
            point.push(4);
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            if crv == "P-256" {
                Material::P256(point)
            } else {
                Material::P384(point)
            }
        }
        ("OKP", Some("Ed25519")) => Material::Ed25519(b64(k, "x")?),
        _ => return None,
    };
    let key = Key { kid, alg, material };
    // A key that declares an algorithm of another family is a mistake: skipped.
    if let Some(a) = alg
        && !key.allows(a)
    {
        return None;
    }
    Some(key)
}

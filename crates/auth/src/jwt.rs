//! `type = "jwt"`: a bearer token (RFC 7519, signed as a JWS) verified against a key set
//! kept fresh off the request path ([`crate::jwks`]) or a shared secret, its claims checked,
//! remembered per serving thread until its `exp` ([`crate::cache`]), answered per RFC 6750.
//!
//! The cost on a serving thread: a cache hit is a hash and a compare; a cold token costs
//! its signature check (ring; `benches/verify.rs` measures each algorithm), done here
//! because it is tens of microseconds, cheaper than handing it to another thread.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use http::{HeaderName, HeaderValue, StatusCode};

use crate::authenticate::{AuthRequest, Authenticate};
use crate::cache::{self, Remembered};
use crate::jwk::{Alg, Key};
use crate::jwks::{KeyMetrics, KeySource, Location, Refresh};
use crate::jws::{self, ClaimRules, Failure};
use crate::outcome::{Accepted, Outcome, Refusal, Verdict};
use crate::result::AuthResult;
use crate::source::Source;

/// What a [`Jwt`] is built from.
#[derive(Debug, Clone)]
pub struct JwtSettings {
    /// The authenticator's name (its challenge's realm).
    pub name: String,
    /// The key set and how it is kept fresh (none: HS* with `secret` only).
    pub jwks: Option<(Location, Refresh)>,
    /// A shared secret for HS256/384/512 (`secret_file`'s bytes).
    pub secret: Option<Vec<u8>>,
    /// Algorithms accepted (empty: every one the keys allow).
    pub algorithms: Vec<Alg>,
    /// What the claims must say.
    pub rules: ClaimRules,
    /// Where the token is (empty: `Authorization: Bearer`).
    pub from: Vec<Source>,
    /// Claims copied into request headers (claim, header).
    pub claims_to_headers: Vec<(String, HeaderName)>,
    /// Whether the upstream sees the token (default no).
    pub forward_token: bool,
    /// The claim that names the consumer (default `sub`).
    pub consumer_claim: String,
}

/// A JWT authenticator.
#[derive(Debug)]
pub struct Jwt {
    id: u64,
    keys: Option<Arc<KeySource>>,
    secret: Option<Key>,
    pinned: Vec<Alg>,
    rules: ClaimRules,
    from: Vec<Source>,
    claims_to_headers: Vec<(String, HeaderName)>,
    sets: Vec<HeaderName>,
    forward_token: bool,
    consumer_claim: String,
    /// `Bearer realm="..."`: no token presented.
    challenge: HeaderValue,
    /// `..., error="invalid_token"`.
    invalid: HeaderValue,
    /// `..., error="insufficient_scope"` (a required claim missing, `403`).
    insufficient: HeaderValue,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Jwt {
    /// Builds it; a key file is read now, a key URL fetched from now on by the key fetcher
    /// (`metrics`: its key set's metrics).
    pub fn build(s: JwtSettings, metrics: KeyMetrics) -> Result<Jwt, String> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        if s.jwks.is_none() && s.secret.is_none() {
            return Err("needs `jwks` or `secret_file`".into());
        }
        let keys = match s.jwks {
            Some((location, refresh)) => {
                Some(KeySource::start(&s.name, location, refresh, metrics)?)
            }
            None => None,
        };
        let pinned: Vec<Alg> = if s.algorithms.is_empty() {
            Alg::ALL
                .into_iter()
                .filter(|a| {
                    if a.is_hmac() {
                        s.secret.is_some()
                    } else {
                        keys.is_some()
                    }
                })
                .collect()
        } else {
            s.algorithms
        };
        let realm = s.name.replace(['"', '\\'], "");
        let value = |extra: &str| {
            HeaderValue::from_str(&format!("Bearer realm=\"{realm}\"{extra}"))
                .unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
        };
        let from = if s.from.is_empty() {
            vec![Source::Header(http::header::AUTHORIZATION)]
        } else {
            s.from
        };
        Ok(Jwt {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            keys,
            secret: s.secret.map(Key::hmac),
            pinned,
            rules: s.rules,
            from,
            sets: s.claims_to_headers.iter().map(|(_, h)| h.clone()).collect(),
            claims_to_headers: s.claims_to_headers,
            forward_token: s.forward_token,
            consumer_claim: s.consumer_claim,
            challenge: value(""),
            invalid: value(", error=\"invalid_token\""),
            insufficient: value(", error=\"insufficient_scope\""),
        })
    }

    fn refuse(&self, result: AuthResult) -> Verdict {
        let refusal = match result {
            AuthResult::Missing => Refusal::unauthorized(result, self.challenge.clone()),
            AuthResult::MissingClaim => {
                let mut r = Refusal::text(result, StatusCode::FORBIDDEN);
                r.headers
                    .insert(http::header::WWW_AUTHENTICATE, self.insufficient.clone());
                r
            }
            AuthResult::KeysUnavailable => {
                let mut r = Refusal::text(result, StatusCode::SERVICE_UNAVAILABLE);
                r.headers
                    .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
                r
            }
            _ => Refusal::unauthorized(result, self.invalid.clone()),
        };
        Verdict::Ready(Outcome::Refused(refusal))
    }

    fn accepted(&self, source: &Source, r: &Remembered) -> Verdict {
        Verdict::Ready(Outcome::Accepted(Accepted {
            consumer: r.consumer.clone(),
            headers: r.headers.clone(),
            strip: (!self.forward_token).then(|| source.clone()),
        }))
    }

    /// The consumer and the headers a verified token's claims give.
    fn remember(&self, claims: &serde_json::Map<String, serde_json::Value>) -> Remembered {
        let consumer = claims
            .get(&self.consumer_claim)
            .and_then(claim_text)
            .map(|s| Arc::from(s.as_str()));
        let headers = self
            .claims_to_headers
            .iter()
            .filter_map(|(claim, header)| {
                let text = claims.get(claim).and_then(claim_text)?;
                // A claim that is no valid field value (a line break) is not sent.
                Some((header.clone(), HeaderValue::from_str(&text).ok()?))
            })
            .collect();
        Remembered { consumer, headers }
    }
}

/// A claim as a header's text: a string as it is, a number or a boolean as JSON writes it,
/// an array of those joined by spaces (`scope`-like lists); objects are not sent.
fn claim_text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::Bool(b) => Some(b.to_string()),
        serde_json::Value::Array(items) => {
            let parts: Option<Vec<String>> = items
                .iter()
                .map(|i| match i {
                    serde_json::Value::Array(_) | serde_json::Value::Object(_) => None,
                    other => claim_text(other),
                })
                .collect();
            parts.map(|p| p.join(" "))
        }
        _ => None,
    }
}

impl Authenticate for Jwt {
    fn check(&self, req: &AuthRequest<'_>) -> Verdict {
        let found = self
            .from
            .iter()
            .find_map(|s| s.find(req.uri, req.headers).map(|c| (s, c)));
        let Some((source, token)) = found else {
            return self.refuse(AuthResult::Missing);
        };
        let token = token.as_bytes();
        let now = unix_now();
        let current = self.keys.as_ref().map(|k| k.current());
        let generation = current.as_ref().map_or(0, |c| c.generation);
        if let Some(r) = cache::get(self.id, generation, token, now) {
            return self.accepted(source, &r);
        }
        let keys = current.as_ref().and_then(|c| c.keys.as_ref());
        let verified = match jws::verify(token, &self.pinned, keys, self.secret.as_ref()) {
            Ok(v) => v,
            Err(Failure::UnknownKey) => {
                // No set yet: the fetcher is at it already (and retrying on its backoff).
                if self.keys.is_some() && keys.is_none() {
                    return self.refuse(AuthResult::KeysUnavailable);
                }
                if let Some(k) = &self.keys {
                    k.ask_refetch();
                }
                return self.refuse(AuthResult::UnknownKey);
            }
            Err(f) => return self.refuse(f.result()),
        };
        let until = match self.rules.check(&verified.claims, now) {
            Ok(until) => until,
            Err(result) => return self.refuse(result),
        };
        let remembered = Arc::new(self.remember(&verified.claims));
        // Only a token with `exp` is remembered: one without would stay valid for as long
        // as the cache keeps it.
        if let Some(until) = until {
            cache::put(self.id, generation, token, until, Arc::clone(&remembered));
        }
        self.accepted(source, &remembered)
    }

    fn sets_headers(&self) -> &[HeaderName] {
        &self.sets
    }

    fn sources(&self) -> &[Source] {
        &self.from
    }
}

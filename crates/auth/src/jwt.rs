//! `type = "jwt"`: a bearer token (RFC 7519, signed as a JWS) verified against a key set
//! kept fresh off the request path ([`crate::jwks`]) or a shared secret, its claims checked,
//! remembered per serving thread until its `exp` ([`crate::cache`]), answered per RFC 6750.
//!
//! The cost on a serving thread: a cache hit is a hash and a compare; a cold token costs
//! its signature check (ring; `benches/verify.rs` measures each algorithm), done here
//! because it is tens of microseconds, cheaper than handing it to another thread. The
//! exception is ES384 (~0.6 ms, [`Alg::is_slow`]): when the pinned algorithms allow it, the
//! authenticator has a one-thread [`HashPool`] (nice 19, a bounded queue; full: `503`,
//! `busy`) and a cold ES384 token is verified there, the serving thread awaiting the answer
//! ([`Verdict::Pending`]), so a flood of such tokens takes no serving thread's CPU.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::hash_pool::HashPool;
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
    /// A PEM file of CA certificates trusted for an `https://` key set URL besides the
    /// system's roots (`jwks_ca`).
    pub jwks_ca: Option<std::path::PathBuf>,
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
    inner: Arc<Inner>,
}

/// Queued cold checks of slow algorithms per authenticator: beyond them a request gets
/// `503` at once (a flood never queues without bound).
const SLOW_QUEUE: usize = 64;

/// The authenticator's state, shared with the checks that finish later (a slow algorithm's
/// verification on the pool).
#[derive(Debug)]
struct Inner {
    id: u64,
    /// The pool for [`Alg::is_slow`] algorithms, if any is pinned.
    pool: Option<HashPool>,
    /// Checks sent to the pool.
    pooled: AtomicU64,
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
            Some((location, refresh)) => Some(KeySource::start(
                &s.name,
                location,
                refresh,
                s.jwks_ca.as_deref(),
                metrics,
            )?),
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
        let pool = if pinned.iter().any(|a| a.is_slow()) {
            Some(
                HashPool::start(&format!("jwt-{}", s.name), 1, SLOW_QUEUE)
                    .map_err(|e| format!("cannot start the verification thread: {e}"))?,
            )
        } else {
            None
        };
        let inner = Inner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            pool,
            pooled: AtomicU64::new(0),
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
        };
        Ok(Jwt {
            inner: Arc::new(inner),
        })
    }

    /// Cold checks sent to the pool so far (slow algorithms only).
    pub fn pooled_checks(&self) -> u64 {
        self.inner.pooled.load(Ordering::Relaxed)
    }
}

impl Inner {
    fn refuse(&self, result: AuthResult) -> Verdict {
        Verdict::Ready(Outcome::Refused(self.refusal(result)))
    }

    fn refusal(&self, result: AuthResult) -> Refusal {
        match result {
            AuthResult::Missing => Refusal::unauthorized(result, self.challenge.clone()),
            AuthResult::MissingClaim => {
                let mut r = Refusal::text(result, StatusCode::FORBIDDEN);
                r.headers
                    .insert(http::header::WWW_AUTHENTICATE, self.insufficient.clone());
                r
            }
            AuthResult::KeysUnavailable | AuthResult::Busy => {
                let mut r = Refusal::text(result, StatusCode::SERVICE_UNAVAILABLE);
                r.headers
                    .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
                r
            }
            _ => Refusal::unauthorized(result, self.invalid.clone()),
        }
    }

    fn accepted(&self, source: &Source, r: &Remembered) -> Verdict {
        Verdict::Ready(self.accept(source, r))
    }

    fn accept(&self, source: &Source, r: &Remembered) -> Outcome {
        Outcome::Accepted(Accepted {
            consumer: r.consumer.clone(),
            headers: r.headers.clone(),
            strip: (!self.forward_token).then(|| source.clone()),
        })
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

impl Inner {
    fn check(self: &Arc<Self>, req: &AuthRequest<'_>) -> Verdict {
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
        let has_set = current.as_ref().is_some_and(|c| c.keys.is_some());
        if let Some(pool) = &self.pool
            && has_set
            && jws::header_alg(token).is_some_and(Alg::is_slow)
        {
            // Owned copies for the pool's thread: the token, the pins, the key set.
            let current = current.map(arc_swap::Guard::into_inner);
            let (owned, pinned) = (token.to_vec(), self.pinned.clone());
            let verifying = pool.try_run(move || {
                let keys = current.as_ref().and_then(|c| c.keys.as_ref());
                jws::verify(&owned, &pinned, keys, None)
            });
            let Ok(answer) = verifying else {
                return self.refuse(AuthResult::Busy);
            };
            self.pooled.fetch_add(1, Ordering::Relaxed);
            let (this, source, token) = (Arc::clone(self), source.clone(), token.to_vec());
            return Verdict::Pending(Box::pin(async move {
                // The pool dropped the job only if it is shutting down: nothing verified.
                let verified = answer.await.unwrap_or(Err(Failure::BadSignature));
                this.settle(verified, has_set, &source, &token, generation, now)
            }));
        }
        let keys = current.as_ref().and_then(|c| c.keys.as_ref());
        let verified = jws::verify(token, &self.pinned, keys, self.secret.as_ref());
        Verdict::Ready(self.settle(verified, has_set, source, token, generation, now))
    }

    /// A verification's outcome: the claims checked and the token remembered, or the
    /// refusal. Runs on the serving thread (the cache is per thread).
    fn settle(
        &self,
        verified: Result<jws::Verified, Failure>,
        has_set: bool,
        source: &Source,
        token: &[u8],
        generation: u64,
        now: u64,
    ) -> Outcome {
        let verified = match verified {
            Ok(v) => v,
            Err(Failure::UnknownKey) => {
                // No set yet: the fetcher is at it already (and retrying on its backoff).
                if self.keys.is_some() && !has_set {
                    return Outcome::Refused(self.refusal(AuthResult::KeysUnavailable));
                }
                if let Some(k) = &self.keys {
                    k.ask_refetch();
                }
                return Outcome::Refused(self.refusal(AuthResult::UnknownKey));
            }
            Err(f) => return Outcome::Refused(self.refusal(f.result())),
        };
        let until = match self.rules.check(&verified.claims, now) {
            Ok(until) => until,
            Err(result) => return Outcome::Refused(self.refusal(result)),
        };
        let remembered = Arc::new(self.remember(&verified.claims));
        // Only a token with `exp` is remembered: one without would stay valid for as long
        // as the cache keeps it.
        if let Some(until) = until {
            cache::put(self.id, generation, token, until, Arc::clone(&remembered));
        }
        self.accept(source, &remembered)
    }
}

impl Authenticate for Jwt {
    fn check(&self, req: &AuthRequest<'_>) -> Verdict {
        self.inner.check(req)
    }

    fn sets_headers(&self) -> &[HeaderName] {
        &self.inner.sets
    }

    fn sources(&self) -> &[Source] {
        &self.inner.from
    }
}

//! `type = "basic"`: HTTP Basic authentication (RFC 7617) against an htpasswd file, re-read
//! when it changes.
//!
//! A bcrypt check costs milliseconds and an apr1 one ~0.2 ms, so neither runs on a serving
//! thread: it goes to the authenticator's [`HashPool`] (a thread or two at nice 19 behind a
//! bounded queue; a full queue answers `503` with `Retry-After: 1`, result `busy`: the
//! gateway's own capacity is spent, not the client's allowance, and a `429` would tell a
//! legitimate user to slow down for an attacker's flood). A success is remembered on the
//! serving thread that awaited it, for `remember_s`, keyed by a SHA-256 of the credentials
//! with a random salt of the authenticator's (never the password, nor a hash that could be
//! looked up in a table of common passwords), so a client that sends the same credentials
//! again pays a hash-table lookup. A new version of the file forgets every success of the
//! old one at once. A `{SHA}` hash (one SHA-1) is checked where it is asked.
//!
//! A user the file does not name is refused at once, without a hash: as Apache does; the
//! time of the answer tells that the user is unknown (the user list is not treated as a
//! secret; the passwords are).

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use base64::Engine as _;
use http::header::{AUTHORIZATION, RETRY_AFTER};
use http::{HeaderName, HeaderValue, StatusCode};

use crate::authenticate::{AuthRequest, Authenticate};
use crate::hash_pool::HashPool;
use crate::htpasswd::Users;
use crate::outcome::{Accepted, Outcome, Refusal, Verdict};
use crate::result::AuthResult;
use crate::source::Source;

/// What a [`Basic`] is built from.
#[derive(Debug, Clone)]
pub struct BasicSettings {
    /// The authenticator's name (the default realm, the pool threads' name).
    pub name: String,
    /// The htpasswd file, read now and again when it changes.
    pub htpasswd: PathBuf,
    /// The realm of the challenge (`WWW-Authenticate: Basic realm="..."`).
    pub realm: String,
    /// How long a success is remembered on a serving thread; zero: never.
    pub remember: Duration,
    /// The pool's threads.
    pub workers: usize,
    /// The pool's queue: checks waiting beyond it are refused with `503`.
    pub queue: usize,
    /// Whether the upstream sees the `Authorization` header (default: removed).
    pub forward_credentials: bool,
}

/// A basic-auth authenticator.
#[derive(Debug)]
pub struct Basic {
    users: Arc<ArcSwap<Users>>,
    pool: Arc<HashPool>,
    challenge: HeaderValue,
    remember: Duration,
    /// Makes the remembered keys this authenticator's own, and useless to anyone who reads
    /// the process's memory without it.
    salt: [u8; 16],
    strip: Option<Source>,
    /// Checks sent to the pool (for tests and the lab: a remembered success sends none).
    pooled: AtomicU64,
}

/// Successes remembered per serving thread, across authenticators (their salts keep them
/// apart): at most this many; a full table first drops what expired, then everything (a
/// burst of distinct users costs a few hashes again, never memory).
const REMEMBERED: usize = 4096;

/// A remembered success.
#[derive(Debug, Clone)]
struct Remembered {
    user: Arc<str>,
    until: Instant,
    generation: u64,
}

thread_local! {
    /// This serving thread's remembered successes, by [`Basic::key`].
    static REMEMBER: RefCell<HashMap<[u8; 32], Remembered>> = RefCell::new(HashMap::new());
}

impl Basic {
    /// Builds it: reads the file now (on the config load's thread) and watches it, and
    /// starts its pool.
    pub fn build(settings: BasicSettings) -> Result<Basic, String> {
        let users = read_htpasswd(&settings.htpasswd)?;
        let users = Arc::new(ArcSwap::from_pointee(users));
        crate::watch::watch(settings.htpasswd.clone(), &users, |text| {
            Users::parse(text).map_err(|e| format!("line {}: {}", e.line, e.message))
        });
        let pool = HashPool::start(
            &format!("tailguard-basic-{}", settings.name),
            settings.workers,
            settings.queue,
        )
        .map_err(|e| format!("cannot start the hash pool: {e}"))?;
        let realm: String = settings
            .realm
            .chars()
            .filter(|c| *c != '"' && *c != '\\' && !c.is_control())
            .collect();
        let challenge =
            HeaderValue::from_str(&format!("Basic realm=\"{realm}\", charset=\"UTF-8\""))
                .unwrap_or_else(|_| HeaderValue::from_static("Basic"));
        let mut salt = [0u8; 16];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut salt)
            .map_err(|_| "no random bytes for the remembered credentials' salt".to_owned())?;
        Ok(Basic {
            users,
            pool: Arc::new(pool),
            challenge,
            remember: settings.remember,
            salt,
            strip: (!settings.forward_credentials).then_some(Source::Header(AUTHORIZATION)),
            pooled: AtomicU64::new(0),
        })
    }

    /// How many users the current version of the file has.
    pub fn user_count(&self) -> usize {
        self.users.load().len()
    }

    /// The pool its slow checks run on.
    pub fn pool(&self) -> &HashPool {
        &self.pool
    }

    /// Checks sent to the pool so far.
    pub fn pooled_checks(&self) -> u64 {
        self.pooled.load(Ordering::Relaxed)
    }

    /// The remembered success's key of `user:password`: SHA-256 of the salt and both.
    fn key(&self, user: &[u8], password: &[u8]) -> [u8; 32] {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(&self.salt);
        ctx.update(&(user.len() as u64).to_le_bytes());
        ctx.update(user);
        ctx.update(password);
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        out
    }

    fn unauthorized(&self, result: AuthResult) -> Outcome {
        Outcome::Refused(Refusal::unauthorized(result, self.challenge.clone()))
    }

    fn accepted(strip: &Option<Source>, user: Arc<str>) -> Outcome {
        Outcome::Accepted(Accepted {
            consumer: Some(user),
            headers: Vec::new(),
            strip: strip.clone(),
        })
    }
}

/// Reads and parses an htpasswd file, its errors naming the file and the line.
pub fn read_htpasswd(path: &std::path::Path) -> Result<Users, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read htpasswd file {}: {e}", path.display()))?;
    Users::parse(&text).map_err(|e| format!("{}:{}: {}", path.display(), e.line, e.message))
}

/// `Basic <base64(user:password)>` (scheme case-insensitive) as the user and password.
fn credentials(value: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest.trim_ascii())
        .ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    Some((decoded[..colon].to_vec(), decoded[colon + 1..].to_vec()))
}

impl Authenticate for Basic {
    fn check(&self, req: &AuthRequest<'_>) -> Verdict {
        let Some(value) = req.headers.get(AUTHORIZATION) else {
            return Verdict::Ready(self.unauthorized(AuthResult::Missing));
        };
        let Some((user, password)) = credentials(value.as_bytes()) else {
            // Another scheme (a bearer token meant for another authenticator of the route)
            // is no basic credential at all.
            let result = if value.as_bytes().len() >= 6
                && value.as_bytes()[..6].eq_ignore_ascii_case(b"basic ")
            {
                AuthResult::Invalid
            } else {
                AuthResult::Missing
            };
            return Verdict::Ready(self.unauthorized(result));
        };
        let users = self.users.load();
        let Some((name, hash)) = users.find(&user) else {
            return Verdict::Ready(self.unauthorized(AuthResult::Invalid));
        };
        let generation = users.generation();
        let key = self.key(&user, &password);
        let now = Instant::now();
        let remembered = REMEMBER.with(|r| {
            r.borrow()
                .get(&key)
                .filter(|e| e.generation == generation && now < e.until)
                .map(|e| Arc::clone(&e.user))
        });
        if let Some(user) = remembered {
            return Verdict::Ready(Basic::accepted(&self.strip, user));
        }
        if !hash.is_slow() {
            return Verdict::Ready(if hash.verify(&password) {
                remember(key, name, generation, self.remember);
                Basic::accepted(&self.strip, Arc::clone(name))
            } else {
                self.unauthorized(AuthResult::Invalid)
            });
        }
        let check_hash = Arc::clone(hash);
        let answer = match self.pool.try_run(move || check_hash.verify(&password)) {
            Ok(answer) => answer,
            Err(_) => return Verdict::Ready(busy()),
        };
        self.pooled.fetch_add(1, Ordering::Relaxed);
        let name = Arc::clone(name);
        let strip = self.strip.clone();
        let challenge = self.challenge.clone();
        let ttl = self.remember;
        Verdict::Pending(Box::pin(async move {
            match answer.await {
                Ok(true) => {
                    // Polled on the serving thread that asked: its own table.
                    remember(key, &name, generation, ttl);
                    Basic::accepted(&strip, name)
                }
                Ok(false) => {
                    Outcome::Refused(Refusal::unauthorized(AuthResult::Invalid, challenge))
                }
                // The pool went away (a reload replaced the authenticator mid-check).
                Err(_) => busy(),
            }
        }))
    }

    fn sources(&self) -> &[Source] {
        &[]
    }

    fn sets_headers(&self) -> &[HeaderName] {
        &[]
    }
}

/// Remembers a success on this thread.
fn remember(key: [u8; 32], user: &Arc<str>, generation: u64, ttl: Duration) {
    if ttl.is_zero() {
        return;
    }
    let now = Instant::now();
    REMEMBER.with(|r| {
        let mut r = r.borrow_mut();
        if r.len() >= REMEMBERED {
            r.retain(|_, e| now < e.until);
            if r.len() >= REMEMBERED {
                r.clear();
            }
        }
        r.insert(
            key,
            Remembered {
                user: Arc::clone(user),
                until: now + ttl,
                generation,
            },
        );
    });
}

/// The answer when the pool's queue is full: `503`, `Retry-After: 1`.
fn busy() -> Outcome {
    let mut refusal = Refusal::text(AuthResult::Busy, StatusCode::SERVICE_UNAVAILABLE);
    refusal
        .headers
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    Outcome::Refused(refusal)
}

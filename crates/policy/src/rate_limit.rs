//! Local rate limits (`rate_limit = { rate, burst, key }` on a route or a listener): the
//! limits built at load from their config ([`tailguard_config::rate_limit`] has it and its
//! checks), the one check a request makes, and the `429 Too Many Requests` it gets when
//! refused.
//!
//! A listener's limit is checked before routing (everything it serves), a route's right
//! after routing; both before admission, so a limited request costs a few atomic loads and
//! a small answer, never reaches an upstream and never counts against a breaker. The state
//! is shared by every serving thread (GCRA on one atomic per key, [`table`]): a limit is
//! exact however many threads serve, and a route or listener without a limit pays one
//! `Option` test. That shared state breaks design.md §2 rule 3 (a cache line other serving
//! threads write) for limited routes only, by necessity (a per-thread bucket admits
//! `threads x rate`); `crates/proxy/benches/rate_limit.rs` measures it (no LTO, on this
//! 2-core VM): a check by client address costs ~56 ns on one thread and ~61 ns with a second thread on
//! its own key (~26 ns of it the key's SipHash), ~115 ns when two threads hammer one key;
//! a one-bucket limit ~20 ns, ~38 ns contended; a `Mutex<HashMap>` of buckets 56 / 75 ns. The limits of routes (by id) and listeners (by address) whose
//! `rate_limit` a reload leaves unchanged keep their state, so a reload is no way around a
//! limit; a changed or new one starts with full buckets.
//!
//! The refusal carries `Retry-After` and the fields of the IETF draft
//! `draft-ietf-httpapi-ratelimit-headers-11` (May 2026): `RateLimit-Policy: "route";q=100;w=1`
//! (with `tailguard-burst=200`, a vendor parameter as the draft advises) and
//! `RateLimit: "route";r=0;t=3` (`t`: seconds until a request is admitted again, as in
//! `Retry-After`). Admitted responses carry neither: formatting a field into every response
//! would cost every request of a limited route.

pub mod global;
pub mod sync;
pub mod table;

use std::net::IpAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime};

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName, HeaderValue};
use tailguard_metrics::{Counter, Family, MetricsError, Registry};

use global::{Decision, Fleet, GlobalTable};
use table::{Gcra, KeyTable};
use tailguard_http::error::Error;
use tailguard_upstream::shard::Padded;

pub use tailguard_config::rate_limit::{DEFAULT_MAX_KEYS, KeyRule, Per, RateLimitConfig, Scope};

/// The buckets of one limit.
#[derive(Debug)]
enum Buckets {
    /// `key = "route"` / `"listener"`: one TAT, on cache lines of its own.
    One(Padded<AtomicU64>),
    /// Per client address or header value.
    Keyed(KeyTable),
    /// `scope = "global"`: counted for the fleet through Redis ([`global`]).
    Global(Arc<GlobalTable>),
}

/// One built limit: its rate, its buckets, its response fields and metric handles.
#[derive(Debug)]
pub struct Limiter {
    config: RateLimitConfig,
    /// Route id or listener address: what a reload matches it on.
    owner: Arc<str>,
    scope: Scope,
    gcra: Gcra,
    key: KeyRule,
    buckets: Buckets,
    /// The limits' clock starts here (the same instant for every limit of the process).
    epoch: Instant,
    policy: HeaderValue,
    limited: Counter,
    evictions: Counter,
}

/// The start of the limits' clock: TATs are nanoseconds since it.
fn epoch() -> Instant {
    clock().0
}

/// The limits' clock's start, and the Unix time in milliseconds it was read at (global
/// limits number their windows by wall-clock time, from a request's own start instant
/// without a second clock read).
fn clock() -> (Instant, u64) {
    static CLOCK: OnceLock<(Instant, u64)> = OnceLock::new();
    *CLOCK.get_or_init(|| (Instant::now(), sync::unix_ms(SystemTime::now())))
}

/// A refused request: what its `429` says.
#[derive(Debug)]
pub struct Limited {
    scope: Scope,
    /// Seconds until a request would be admitted (at least 1).
    retry_after: u64,
    policy: HeaderValue,
}

impl Limiter {
    /// Builds the limit `config` (validated) of route or listener `owner`, counting into
    /// `metrics`.
    pub fn build(
        config: &RateLimitConfig,
        scope: Scope,
        owner: &str,
        metrics: &RateLimitMetrics,
    ) -> Result<Limiter, Error> {
        let key = KeyRule::parse(config.key.get_ref(), scope)
            .map_err(|e| Error::Internal(format!("rate limit of `{owner}`: {e}")))?;
        let rate = *config.rate.get_ref();
        let per = *config.per.get_ref();
        let burst = config.burst();
        let gcra = Gcra::new(rate, per.seconds() * 1_000_000_000, burst);
        let (limited, evictions) = metrics.handles(scope, owner)?;
        let buckets = match key {
            _ if config.is_global() => Buckets::Global(GlobalTable::counted(
                scope.as_str(),
                owner,
                rate,
                per.seconds() * 1000,
                *config.max_keys.get_ref(),
                metrics.fleet(),
                Some(evictions.clone()),
            )),
            KeyRule::All => Buckets::One(Padded(AtomicU64::new(0))),
            _ => Buckets::Keyed(KeyTable::new(*config.max_keys.get_ref())),
        };
        let policy = if config.is_global() {
            format!("\"{}\";q={rate};w={}", scope.as_str(), per.seconds())
        } else {
            format!(
                "\"{}\";q={rate};w={};tailguard-burst={burst}",
                scope.as_str(),
                per.seconds()
            )
        };
        Ok(Limiter {
            config: config.clone(),
            owner: Arc::from(owner),
            scope,
            gcra,
            key,
            buckets,
            epoch: epoch(),
            policy: HeaderValue::from_str(&policy).expect("the policy is ASCII digits and names"),
            limited,
            evictions,
        })
    }

    /// The limit of `owner` from `previous` if its config is `config`, else a new one.
    fn build_or_keep(
        config: &RateLimitConfig,
        scope: Scope,
        owner: &str,
        previous: impl Iterator<Item = Arc<Limiter>>,
        metrics: &RateLimitMetrics,
    ) -> Result<Arc<Limiter>, Error> {
        for old in previous {
            if &*old.owner == owner && old.config == *config {
                return Ok(old);
            }
        }
        Ok(Arc::new(Limiter::build(config, scope, owner, metrics)?))
    }

    /// Charges a request that arrived at `now` from `client` with `headers`: `Err` if the
    /// limit refuses it (counted in the metrics).
    #[inline]
    pub fn check(&self, now: Instant, client: IpAddr, headers: &HeaderMap) -> Result<(), Limited> {
        self.check_as(now, client, headers, None)
    }

    /// Whether the limit's buckets are per consumer (`key = "consumer"`): checked after
    /// the route's authentication, which names the consumer; other limits before it, so a
    /// flood of bad credentials is limited before it costs a check.
    pub fn by_consumer(&self) -> bool {
        self.key == KeyRule::Consumer
    }

    /// [`Limiter::check`] of a request its route's `auth` let through as `consumer`.
    #[inline]
    pub fn check_as(
        &self,
        now: Instant,
        client: IpAddr,
        headers: &HeaderMap,
        consumer: Option<&str>,
    ) -> Result<(), Limited> {
        // `now` is the request's own start: no second clock read.
        let now =
            u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        let tat = match (&self.buckets, &self.key) {
            (Buckets::Global(table), key) => {
                return self.global(table, key, now, client, headers, consumer);
            }
            (Buckets::One(tat), _) => &tat.0,
            (Buckets::Keyed(table), KeyRule::Header(name)) => {
                let Some(value) = headers.get(name) else {
                    return Ok(());
                };
                self.keyed(table, table.hash(value.as_bytes()), now)
            }
            (Buckets::Keyed(table), KeyRule::Consumer) => {
                let Some(name) = consumer else {
                    return Ok(());
                };
                self.keyed(table, table.hash(name.as_bytes()), now)
            }
            (Buckets::Keyed(table), _) => self.keyed(table, table.hash(client.to_canonical()), now),
        };
        match self.gcra.acquire(tat, now) {
            Ok(()) => Ok(()),
            Err(wait_ns) => {
                self.limited.inc();
                Err(Limited {
                    scope: self.scope,
                    retry_after: wait_ns.div_ceil(1_000_000_000).max(1),
                    policy: self.policy.clone(),
                })
            }
        }
    }

    /// A global limit's check: the key's bytes (absent header: not limited), then the
    /// table's decision from local state alone.
    fn global(
        &self,
        table: &GlobalTable,
        key: &KeyRule,
        since_epoch_ns: u64,
        client: IpAddr,
        headers: &HeaderMap,
        consumer: Option<&str>,
    ) -> Result<(), Limited> {
        let now_ms = clock().1 + since_epoch_ns / 1_000_000;
        let decision = match key {
            KeyRule::Header(name) => {
                let Some(value) = headers.get(name) else {
                    return Ok(());
                };
                table.check(value.as_bytes(), now_ms)
            }
            KeyRule::ClientIp => match client.to_canonical() {
                IpAddr::V4(v4) => table.check(&v4.octets(), now_ms),
                IpAddr::V6(v6) => table.check(&v6.octets(), now_ms),
            },
            KeyRule::All => table.check(b"", now_ms),
            KeyRule::Consumer => {
                let Some(name) = consumer else {
                    return Ok(());
                };
                table.check(name.as_bytes(), now_ms)
            }
        };
        match decision {
            Decision::Admit => Ok(()),
            Decision::Refuse(wait_ms) => {
                self.limited.inc();
                Err(Limited {
                    scope: self.scope,
                    retry_after: wait_ms.div_ceil(1000).max(1),
                    policy: self.policy.clone(),
                })
            }
        }
    }

    fn keyed<'a>(&self, table: &'a KeyTable, hash: u64, now: u64) -> &'a AtomicU64 {
        let bucket = table.bucket(hash, now);
        if bucket.evicted {
            self.evictions.inc();
        }
        bucket.tat
    }

    /// The key table's size in bytes (0 for a one-bucket limit).
    pub fn heap_bytes(&self) -> usize {
        match &self.buckets {
            Buckets::One(_) | Buckets::Global(_) => 0,
            Buckets::Keyed(t) => t.heap_bytes(),
        }
    }
}

impl Limited {
    /// The error a refusal is answered with (`429`, counted, logged, in the access log like
    /// any error: the proxy's `respond::rate_limited`).
    pub fn error(&self) -> Error {
        Error::RateLimited {
            scope: self.scope.as_str(),
            retry_after: self.retry_after,
        }
    }

    /// Adds `Retry-After`, `RateLimit` and `RateLimit-Policy` to the refusal's head.
    pub fn add_fields(self, headers: &mut HeaderMap) {
        let secs = self.retry_after;
        let mut digits = itoa::Buffer::new();
        let secs_text = digits.format(secs);
        if let Ok(v) = HeaderValue::from_str(secs_text) {
            headers.insert(RETRY_AFTER, v);
        }
        let state = format!("\"{}\";r=0;t={secs_text}", self.scope.as_str());
        if let Ok(v) = HeaderValue::from_str(&state) {
            headers.insert(RATELIMIT, v);
        }
        headers.insert(RATELIMIT_POLICY, self.policy);
    }
}

/// The rate-limit metric families (registered once per process with the gateway's:
/// `GatewayMetrics::rate_limit`).
#[derive(Debug)]
pub struct RateLimitMetrics {
    limited: Family<Counter>,
    evictions: Family<Counter>,
    /// The process's global limits: what the Redis sync trades counts for.
    fleet: Arc<Fleet>,
}

impl RateLimitMetrics {
    /// Registers the families on `registry`.
    pub fn register(registry: &Registry) -> Result<RateLimitMetrics, MetricsError> {
        Ok(RateLimitMetrics {
            limited: registry.counter(
                "tailguard_rate_limited",
                "Requests refused with 429 by a rate limit, by the listener or route whose \
                 limit refused them (the other label empty).",
                &["listener", "route"],
            )?,
            evictions: registry.counter(
                "tailguard_rate_limit_evictions",
                "Live keys a rate limit's key table evicted to make room for a new key (each \
                 restarts with a full burst): above 0, `max_keys` is too small.",
                &["listener", "route"],
            )?,
            fleet: Arc::default(),
        })
    }

    /// The process's global limits (their mode, fleet size and tables), which the Redis
    /// sync ([`sync::RedisSync`]) serves.
    pub fn fleet(&self) -> &Arc<Fleet> {
        &self.fleet
    }

    /// The handles of the limit of route or listener `owner` (at build, never per request).
    fn handles(&self, scope: Scope, owner: &str) -> Result<(Counter, Counter), Error> {
        let labels = match scope {
            Scope::Route => ["", owner],
            Scope::Listener => [owner, ""],
        };
        let internal = |e: MetricsError| Error::Internal(format!("metrics: {e}"));
        Ok((
            self.limited.get_or_create(&labels).map_err(internal)?,
            self.evictions.get_or_create(&labels).map_err(internal)?,
        ))
    }
}

/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11 §4).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-11 §3).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// The route limits of one snapshot, by router index.
#[derive(Debug, Default)]
pub struct RateLimits {
    routes: Vec<Option<Arc<Limiter>>>,
}

impl RateLimits {
    /// Builds the limit of every route that has one (`routes`: each route's id and config,
    /// in router order), keeping the unchanged ones of `previous`.
    pub fn build<'a>(
        routes: impl Iterator<Item = (&'a str, Option<&'a RateLimitConfig>)>,
        previous: Option<&RateLimits>,
        metrics: &RateLimitMetrics,
    ) -> Result<RateLimits, Error> {
        let kept = || {
            previous
                .into_iter()
                .flat_map(|p| p.routes.iter().flatten().cloned())
        };
        let routes = routes
            .map(|(id, config)| {
                config
                    .map(|c| Limiter::build_or_keep(c, Scope::Route, id, kept(), metrics))
                    .transpose()
            })
            .collect::<Result<_, _>>()?;
        Ok(RateLimits { routes })
    }

    /// The limit of the route at router index `route`, if it has one.
    #[inline]
    pub fn route(&self, route: usize) -> Option<&Limiter> {
        self.routes.get(route)?.as_deref()
    }
}

/// The limit of each listener of `configs` (`None` where a listener has none), keeping
/// the one `previous(i)` returns for listener `i` when its address and config are the same.
pub fn listener_limits(
    configs: &[tailguard_config::ListenerConfig],
    previous: impl Fn(usize) -> Option<Arc<Limiter>>,
    metrics: &RateLimitMetrics,
) -> Result<Vec<Option<Arc<Limiter>>>, Error> {
    configs
        .iter()
        .enumerate()
        .map(|(i, l)| {
            l.rate_limit
                .as_ref()
                .map(|c| {
                    Limiter::build_or_keep(
                        c,
                        Scope::Listener,
                        l.address.get_ref(),
                        previous(i).into_iter(),
                        metrics,
                    )
                })
                .transpose()
        })
        .collect()
}

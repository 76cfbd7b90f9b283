//! `rate_limit = { rate, per, burst, key, max_keys, scope }` of a route or a listener: the
//! config, the key rule parsed from it, and its checks.

use std::ops::Range;

use http::HeaderName;
use serde::Deserialize;
use toml::Spanned;

/// Largest `max_keys`: 2^24 keys, 256 MiB of table.
pub const MAX_KEYS: u64 = 1 << 24;

/// `max_keys` when the config says nothing: 100,000 clients (128Ki slots, 2 MiB).
pub const DEFAULT_MAX_KEYS: u64 = 100_000;

/// Largest `rate`: one request per nanosecond.
const MAX_RATE: u64 = 1_000_000_000;

/// Largest `burst`: keeps `burst * interval` (an hour's interval at most) within 64 bits.
const MAX_BURST: u64 = 1_000_000;

/// The period `rate` counts over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Per {
    /// Requests per second.
    #[default]
    Second,
    /// Requests per minute.
    Minute,
    /// Requests per hour.
    Hour,
}

impl Per {
    /// The period in seconds (the draft's `w`).
    pub fn seconds(self) -> u64 {
        match self {
            Per::Second => 1,
            Per::Minute => 60,
            Per::Hour => 3600,
        }
    }
}

fn default_per() -> Spanned<Per> {
    Spanned::new(0..0, Per::Second)
}

fn default_key() -> Spanned<String> {
    Spanned::new(0..0, "client_ip".to_owned())
}

fn default_max_keys() -> Spanned<u64> {
    Spanned::new(0..0, DEFAULT_MAX_KEYS)
}

/// Who a limit counts for: this gateway alone, or the whole fleet through `[redis]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reach {
    /// This gateway's own limit, exact across its threads (GCRA).
    #[default]
    Local,
    /// One limit for every gateway sharing `[redis]`: counted in windows of `per`, traded
    /// with Redis every `sync_ms` off the serving threads.
    Global,
}

fn default_reach() -> Spanned<Reach> {
    Spanned::new(0..0, Reach::Local)
}

/// `rate_limit = { .. }` of a route or a listener.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Sustained requests per `per`, at least 1.
    pub rate: Spanned<u64>,
    /// `second` (default), `minute` or `hour`.
    #[serde(default = "default_per")]
    pub per: Spanned<Per>,
    /// Requests admitted at once after a quiet period; default `rate`.
    #[serde(default)]
    pub burst: Option<Spanned<u64>>,
    /// What a bucket is per: `client_ip` (default), `header:NAME`, `consumer` (on a route
    /// with `auth`), or one bucket for all (`route` on a route, `listener` on a listener).
    #[serde(default = "default_key")]
    pub key: Spanned<String>,
    /// Keys tracked at once (rounded up to a power of two of sets of 8), default 100,000.
    #[serde(default = "default_max_keys")]
    pub max_keys: Spanned<u64>,
    /// `local` (default) or `global` (shared by the fleet through `[redis]`).
    #[serde(default = "default_reach")]
    pub scope: Spanned<Reach>,
}

/// Where a limit is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// On a route: checked after routing.
    Route,
    /// On a listener: checked before routing.
    Listener,
}

impl Scope {
    /// The name of the one-bucket key here, and of the policy in the response fields.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Route => "route",
            Scope::Listener => "listener",
        }
    }
}

/// What a limit's buckets are per.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRule {
    /// The downstream peer's address (IPv4-mapped IPv6 counts as IPv4).
    ClientIp,
    /// The first value of this request header; a request without it is not limited by
    /// this limit (as nginx skips an empty key).
    Header(HeaderName),
    /// One bucket for everything the route or listener serves.
    All,
    /// The consumer a route's `auth` named (a request without one, which only an open
    /// route lets through, is not limited by this limit). Routes only: a listener's limit
    /// is checked before authentication.
    Consumer,
}

impl KeyRule {
    /// Parses `key` as written in a limit at `scope`.
    pub fn parse(key: &str, scope: Scope) -> Result<KeyRule, String> {
        if key == "client_ip" {
            return Ok(KeyRule::ClientIp);
        }
        if key == scope.as_str() {
            return Ok(KeyRule::All);
        }
        if key == "consumer" {
            return match scope {
                Scope::Route => Ok(KeyRule::Consumer),
                Scope::Listener => Err("`consumer` is a route's key: a listener's limit is \
                                        checked before authentication"
                    .into()),
            };
        }
        if let Some(name) = key.strip_prefix("header:") {
            if name.is_empty() {
                return Err("`header:` needs a header name, like `header:X-Api-Key`".into());
            }
            return HeaderName::from_bytes(name.as_bytes())
                .map(KeyRule::Header)
                .map_err(|_| format!("`{name}` is not a header name"));
        }
        Err(format!(
            "`{key}` is not a key; expected `client_ip`, `header:NAME`{}",
            match scope {
                Scope::Route => ", `route` or `consumer`",
                Scope::Listener => " or `listener`",
            }
        ))
    }
}

impl RateLimitConfig {
    /// The problems of this limit at `scope`, each with its span, the field's name after
    /// the limit's own (`rate`, `key`, ...) and a message; `redis`: whether the config has a
    /// `[redis]` section (which `scope = "global"` needs).
    pub fn check(
        &self,
        scope: Scope,
        redis: bool,
    ) -> Vec<(Option<Range<usize>>, &'static str, String)> {
        let mut out = Vec::new();
        if self.is_global() {
            if !redis {
                out.push((
                    Some(self.scope.span()),
                    "scope",
                    "`global` needs a top-level `[redis]` section".to_owned(),
                ));
            }
            if let Some(burst) = &self.burst {
                out.push((
                    Some(burst.span()),
                    "burst",
                    "a global limit counts `rate` per `per` window (sliding); it has no `burst`"
                        .to_owned(),
                ));
            }
        }
        let rate = *self.rate.get_ref();
        if !(1..=MAX_RATE).contains(&rate) {
            out.push((
                Some(self.rate.span()),
                "rate",
                format!("{rate} is outside 1..={MAX_RATE}"),
            ));
        }
        if let Some(burst) = &self.burst
            && !(1..=MAX_BURST).contains(burst.get_ref())
        {
            out.push((
                Some(burst.span()),
                "burst",
                format!("{} is outside 1..={MAX_BURST}", burst.get_ref()),
            ));
        }
        if self.burst.is_none() && rate > MAX_BURST && !self.is_global() {
            out.push((
                Some(self.rate.span()),
                "burst",
                format!("the default burst (the rate) is above {MAX_BURST}; set `burst`"),
            ));
        }
        if let Err(message) = KeyRule::parse(self.key.get_ref(), scope) {
            out.push((Some(self.key.span()), "key", message));
        }
        let max_keys = *self.max_keys.get_ref();
        if !(1..=MAX_KEYS).contains(&max_keys) {
            out.push((
                Some(self.max_keys.span()),
                "max_keys",
                format!("{max_keys} is outside 1..={}", MAX_KEYS),
            ));
        }
        out
    }

    /// Whether the fleet shares this limit (`scope = "global"`).
    pub fn is_global(&self) -> bool {
        *self.scope.get_ref() == Reach::Global
    }

    /// Requests admitted at once after a quiet period: `burst`, else `rate`.
    pub fn burst(&self) -> u64 {
        self.burst
            .as_ref()
            .map_or(*self.rate.get_ref(), |b| *b.get_ref())
    }
}

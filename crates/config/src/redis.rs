//! `[redis]`: the Redis a fleet of gateways shares its `scope = "global"` rate limits
//! through (address, TLS, ACL user, timeouts, the sync interval, what to do while it does not
//! answer), and its checks.

use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

/// `sync_ms` when the config says nothing: a gateway trades counts with Redis ten times a
/// second (the overshoot bound in docs/config.md grows with it).
pub const DEFAULT_SYNC_MS: u64 = 100;

/// `timeout_ms` when the config says nothing: a sync that takes longer counts as Redis not
/// answering (the gateway falls back until one succeeds).
pub const DEFAULT_TIMEOUT_MS: u64 = 1000;

/// What a gateway does with its global limits while Redis does not answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnRedisError {
    /// Each gateway admits its share: the limit divided by the fleet size it last saw.
    #[default]
    LocalShare,
    /// Global limits admit everything until Redis answers again.
    Allow,
    /// Global limits refuse everything until Redis answers again.
    Deny,
}

impl OnRedisError {
    /// The name as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            OnRedisError::LocalShare => "local_share",
            OnRedisError::Allow => "allow",
            OnRedisError::Deny => "deny",
        }
    }
}

/// `[redis] tls = { ca, cert, key }`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisTls {
    /// PEM CA file Redis's certificate is checked against (none: the system's roots).
    #[serde(default)]
    pub ca: Option<Spanned<String>>,
    /// PEM client certificate chain (Redis's `tls-auth-clients`).
    #[serde(default)]
    pub cert: Option<Spanned<String>>,
    /// PEM key of `cert`.
    #[serde(default)]
    pub key: Option<Spanned<String>>,
}

/// `[redis]` as written.
///
/// ```toml
/// [redis]
/// url = "rediss://10.0.0.5:6380"      # or redis://
/// tls = { ca = "redis-ca.pem" }       # only with rediss://
/// username = "tailguard"              # an ACL user
/// password_file = "redis.password"
/// timeout_ms = 1000
/// sync_ms = 100
/// on_redis_error = "local_share"      # or "allow", "deny"
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://HOST:PORT[/DB]` or `rediss://HOST:PORT[/DB]` (TLS).
    pub url: Spanned<String>,
    /// TLS files (with `rediss://`).
    #[serde(default)]
    pub tls: Option<Spanned<RedisTls>>,
    /// The ACL user (`AUTH username password`); none: the default user.
    #[serde(default)]
    pub username: Option<Spanned<String>>,
    /// A file holding the password (one line), relative to the config file.
    #[serde(default)]
    pub password_file: Option<Spanned<String>>,
    /// A connect or a sync that takes longer fails (default 1000 ms).
    #[serde(default)]
    pub timeout_ms: Option<Spanned<u64>>,
    /// How often each gateway trades its counts for the fleet's (default 100 ms).
    #[serde(default)]
    pub sync_ms: Option<Spanned<u64>>,
    /// `local_share` (default), `allow` or `deny`.
    #[serde(default)]
    pub on_redis_error: Option<Spanned<OnRedisError>>,
    /// The config file's directory, which the paths are relative to.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// A problem: its span, the field after `redis.`, the message.
pub type Problem = (Option<Range<usize>>, String, String);

impl RedisConfig {
    /// Resolves the files against `base_dir`, the config file's directory.
    pub(crate) fn locate(&mut self, base_dir: &Path) {
        self.base_dir = base_dir.to_owned();
    }

    /// `path` as written, resolved against the config file's directory.
    pub fn resolve(&self, path: &str) -> PathBuf {
        self.base_dir.join(path)
    }

    /// How often counts are traded.
    pub fn sync_ms(&self) -> u64 {
        self.sync_ms
            .as_ref()
            .map_or(DEFAULT_SYNC_MS, |s| *s.get_ref())
    }

    /// A connect's or a sync's limit.
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms
            .as_ref()
            .map_or(DEFAULT_TIMEOUT_MS, |s| *s.get_ref())
    }

    /// What global limits do while Redis does not answer.
    pub fn on_redis_error(&self) -> OnRedisError {
        self.on_redis_error
            .as_ref()
            .map_or(OnRedisError::default(), |s| *s.get_ref())
    }

    /// Whether the URL asks for TLS (`rediss://`).
    pub fn is_tls(&self) -> bool {
        self.url.get_ref().starts_with("rediss://")
    }

    /// Every problem of the section.
    pub fn check(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        let url = self.url.get_ref();
        let rest = url
            .strip_prefix("redis://")
            .or_else(|| url.strip_prefix("rediss://"));
        match rest {
            None => out.push((
                Some(self.url.span()),
                "url".to_owned(),
                format!("`{url}` is not a redis:// or rediss:// URL"),
            )),
            Some(rest) => {
                let authority = rest.split('/').next().unwrap_or("");
                if authority.contains('@') {
                    out.push((
                        Some(self.url.span()),
                        "url".to_owned(),
                        "keep credentials out of the URL: use `username` and `password_file`"
                            .to_owned(),
                    ));
                } else if authority.is_empty() {
                    out.push((
                        Some(self.url.span()),
                        "url".to_owned(),
                        format!("`{url}` names no host"),
                    ));
                }
            }
        }
        if let Some(tls) = &self.tls {
            if !self.is_tls() {
                out.push((
                    Some(tls.span()),
                    "tls".to_owned(),
                    "`tls` needs a rediss:// URL".to_owned(),
                ));
            }
            let t = tls.get_ref();
            if t.cert.is_some() != t.key.is_some() {
                out.push((
                    Some(tls.span()),
                    "tls".to_owned(),
                    "`cert` and `key` go together".to_owned(),
                ));
            }
            for (name, file) in [("ca", &t.ca), ("cert", &t.cert), ("key", &t.key)] {
                if let Some(f) = file {
                    self.check_file(f, &format!("tls.{name}"), &mut out);
                }
            }
        }
        if let Some(p) = &self.password_file {
            self.check_file(p, "password_file", &mut out);
        }
        if let Some(u) = &self.username
            && (u.get_ref().is_empty() || u.get_ref().contains(char::is_whitespace))
        {
            out.push((
                Some(u.span()),
                "username".to_owned(),
                "a user name is one word".to_owned(),
            ));
        }
        if self.username.is_some() && self.password_file.is_none() {
            out.push((
                self.username.as_ref().map(Spanned::span),
                "username".to_owned(),
                "an ACL user needs `password_file`".to_owned(),
            ));
        }
        if let Some(t) = &self.timeout_ms
            && !(1..=60_000).contains(t.get_ref())
        {
            out.push((
                Some(t.span()),
                "timeout_ms".to_owned(),
                format!("{} is outside 1..=60000", t.get_ref()),
            ));
        }
        if let Some(s) = &self.sync_ms
            && !(10..=60_000).contains(s.get_ref())
        {
            out.push((
                Some(s.span()),
                "sync_ms".to_owned(),
                format!("{} is outside 10..=60000", s.get_ref()),
            ));
        }
        out
    }

    fn check_file(&self, file: &Spanned<String>, field: &str, out: &mut Vec<Problem>) {
        let path = self.resolve(file.get_ref());
        if let Err(e) = std::fs::metadata(&path) {
            out.push((
                Some(file.span()),
                field.to_owned(),
                format!("cannot read {}: {e}", path.display()),
            ));
        }
    }
}

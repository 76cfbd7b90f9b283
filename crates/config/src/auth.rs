//! `[[auth]]`: named authenticators as written (`name`, `type` and the type's own keys),
//! parsed by their `type` so a key of another type is refused at its position, and their
//! checks; a route's `auth = "name"` or `["a", "b"]`.

use std::fmt;
use std::ops::Range;
use std::path::Path;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use tailguard_auth::{KeyHash, Source};
use toml::Spanned;
use toml::de::{DeValue, ValueDeserializer};

/// The `type`s this build knows, as the error for an unknown one lists them.
pub const TYPES: &[&str] = &["api_key", "basic", "forward", "jwt"];

/// One `[[auth]]` element.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthConfig {
    /// Unique name, what routes refer to (the `auth` label of the metrics).
    pub name: Spanned<String>,
    /// The type and its keys.
    pub kind: AuthKind,
}

/// An authenticator's type and its own keys.
#[derive(Debug, Clone, PartialEq)]
pub enum AuthKind {
    /// `type = "api_key"`.
    ApiKey(ApiKeyConfig),
    /// `type = "basic"`.
    Basic(BasicConfig),
    /// `type = "forward"`.
    Forward(ForwardConfig),
    /// `type = "jwt"` (boxed: its config is the largest).
    Jwt(Box<JwtConfig>),
}

impl AuthKind {
    /// The `type` as written.
    pub fn type_name(&self) -> &'static str {
        match self {
            AuthKind::ApiKey(_) => "api_key",
            AuthKind::Basic(_) => "basic",
            AuthKind::Forward(_) => "forward",
            AuthKind::Jwt(_) => "jwt",
        }
    }
}

/// `type = "api_key"`: keys from a header or the query, checked against stored hashes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// The element's `name` (read by [`parse`]).
    #[serde(rename = "name")]
    _name: Spanned<String>,
    /// The element's `type` (read by [`parse`]).
    #[serde(rename = "type")]
    _type: Spanned<String>,
    /// Where the key is: `header:NAME` or `query:NAME`, one or a list tried in order;
    /// default `header:x-api-key`.
    #[serde(default)]
    pub from: Option<Spanned<StringList>>,
    /// Consumers and their keys' hashes: `[{ name = "acme", keys = ["sha256:HEX"] }]`.
    #[serde(default)]
    pub consumers: Vec<ConsumerConfig>,
    /// A file of `NAME sha256:HEX` lines, re-read when it changes (relative to the config).
    #[serde(default)]
    pub keys_file: Option<Spanned<String>>,
    /// Whether the upstream sees the key; default `false` (removed).
    #[serde(default)]
    pub forward_key: bool,
}

/// `type = "basic"`: HTTP Basic against an htpasswd file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicConfig {
    /// The element's `name` (read by [`parse`]).
    #[serde(rename = "name")]
    _name: Spanned<String>,
    /// The element's `type` (read by [`parse`]).
    #[serde(rename = "type")]
    _type: Spanned<String>,
    /// The htpasswd file (relative to the config), re-read when it changes.
    pub htpasswd: Spanned<String>,
    /// The realm of the challenge; default the authenticator's name.
    #[serde(default)]
    pub realm: Option<Spanned<String>>,
    /// How long a success is remembered per serving thread, seconds (0: never); default 60.
    #[serde(default = "default_remember_s")]
    pub remember_s: Spanned<u64>,
    /// Threads checking password hashes, 1..=4; default 1.
    #[serde(default = "default_workers")]
    pub workers: Spanned<usize>,
    /// Checks that may wait for a thread, 1..=4096; beyond it `503`. Default 32.
    #[serde(default = "default_queue")]
    pub queue: Spanned<usize>,
    /// Whether the upstream sees the `Authorization` header; default `false` (removed).
    #[serde(default)]
    pub forward_credentials: bool,
}

fn default_remember_s() -> Spanned<u64> {
    // A minute: a browser or a script sends the same credentials with every request; a
    // password changed in the file still stops working at once (a new file forgets).
    Spanned::new(0..0, 60)
}

fn default_workers() -> Spanned<usize> {
    // One: a bcrypt check is single-threaded CPU work; more threads take more of the cores
    // the serving threads use, for a flood's sake.
    Spanned::new(0..0, 1)
}

fn default_queue() -> Spanned<usize> {
    // 32 checks: ~0.1 s of waiting at bcrypt cost 5 on one thread; a longer queue only
    // makes a legitimate user wait behind a flood instead of being told to retry.
    Spanned::new(0..0, 32)
}

impl BasicConfig {
    /// `htpasswd` resolved against the config's directory.
    pub fn htpasswd(&self, base_dir: &Path) -> std::path::PathBuf {
        base_dir.join(self.htpasswd.get_ref())
    }

    fn check(&self, base_dir: &Path, out: &mut Vec<Problem>) {
        if let Err(m) = tailguard_auth::basic::read_htpasswd(&self.htpasswd(base_dir)) {
            out.push((Some(self.htpasswd.span()), ".htpasswd".into(), m));
        }
        if *self.remember_s.get_ref() > 3600 {
            out.push((
                Some(self.remember_s.span()),
                ".remember_s".into(),
                "at most 3600 (an hour)".into(),
            ));
        }
        if !(1..=4).contains(self.workers.get_ref()) {
            out.push((Some(self.workers.span()), ".workers".into(), "1..=4".into()));
        }
        if !(1..=4096).contains(self.queue.get_ref()) {
            out.push((Some(self.queue.span()), ".queue".into(), "1..=4096".into()));
        }
        if let Some(realm) = &self.realm
            && (realm.get_ref().contains(['"', '\\'])
                || realm.get_ref().chars().any(char::is_control))
        {
            out.push((
                Some(realm.span()),
                ".realm".into(),
                "no `\"`, `\\` or control characters (it is quoted in `WWW-Authenticate`)".into(),
            ));
        }
    }
}

/// `type = "forward"`: an auth service decides.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardConfig {
    /// The element's `name` (read by [`parse`]).
    #[serde(rename = "name")]
    _name: Spanned<String>,
    /// The element's `type` (read by [`parse`]).
    #[serde(rename = "type")]
    _type: Spanned<String>,
    /// The auth service, `http://host:port/path` or `https://...`.
    pub url: Spanned<String>,
    /// A PEM file of CA certificates trusted for an `https://` `url` besides the system's
    /// (relative to the config).
    #[serde(default)]
    pub ca: Option<Spanned<String>>,
    /// Client headers passed to it.
    #[serde(default)]
    pub request_headers: Vec<Spanned<String>>,
    /// Headers of its `2xx` answer set on the request sent upstream.
    #[serde(default)]
    pub upstream_headers: Vec<Spanned<String>>,
    /// How long it may take, milliseconds; default 1000.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: Spanned<u64>,
    /// `{ key_headers = ["authorization"], ttl_s = 30 }`: remember answers.
    #[serde(default)]
    pub cache: Option<Spanned<ForwardCacheConfig>>,
}

/// `cache` of a forward authenticator.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardCacheConfig {
    /// The request headers whose values make the key (with the route).
    pub key_headers: Vec<Spanned<String>>,
    /// Seconds an answer is remembered, 1..=3600.
    pub ttl_s: Spanned<u64>,
}

fn default_timeout_ms() -> Spanned<u64> {
    // A second: an auth service answers in milliseconds; a client should not wait long
    // for the `503` of one that does not.
    Spanned::new(0..0, 1000)
}

/// Header names as written, each checked; the valid ones.
fn header_names(list: &[Spanned<String>]) -> Vec<http::HeaderName> {
    list.iter()
        .filter_map(|h| http::HeaderName::from_bytes(h.get_ref().as_bytes()).ok())
        .collect()
}

impl ForwardConfig {
    /// The settings of the runtime's [`tailguard_auth::Forward`] (after [`AuthConfig::check`]).
    pub fn settings(&self, base_dir: &Path) -> Result<tailguard_auth::ForwardSettings, String> {
        Ok(tailguard_auth::ForwardSettings {
            url: self
                .url
                .get_ref()
                .parse()
                .map_err(|_| "not a URL".to_owned())?,
            ca: self.ca.as_ref().map(|c| base_dir.join(c.get_ref())),
            request_headers: header_names(&self.request_headers),
            upstream_headers: header_names(&self.upstream_headers),
            timeout: std::time::Duration::from_millis(*self.timeout_ms.get_ref()),
            cache: self.cache.as_ref().map(|c| {
                (
                    header_names(&c.get_ref().key_headers),
                    std::time::Duration::from_secs(*c.get_ref().ttl_s.get_ref()),
                )
            }),
        })
    }

    fn check(&self, base_dir: &Path, out: &mut Vec<Problem>) {
        match self.settings(base_dir) {
            Err(m) => out.push((Some(self.url.span()), ".url".into(), m)),
            Ok(settings) => {
                if let Err(m) = tailguard_auth::forward::check_url(&settings) {
                    out.push((Some(self.url.span()), ".url".into(), m));
                }
                if let (Some(ca), Err(m)) = (&self.ca, tailguard_auth::forward::check_ca(&settings))
                {
                    out.push((Some(ca.span()), ".ca".into(), m));
                }
            }
        }
        for (field, list) in [
            ("request_headers", &self.request_headers),
            ("upstream_headers", &self.upstream_headers),
        ] {
            for (j, h) in list.iter().enumerate() {
                if http::HeaderName::from_bytes(h.get_ref().as_bytes()).is_err() {
                    out.push((
                        Some(h.span()),
                        format!(".{field}[{j}]"),
                        format!("`{}` is not a header name", h.get_ref()),
                    ));
                }
            }
        }
        for (j, h) in self.upstream_headers.iter().enumerate() {
            let lower = h.get_ref().to_ascii_lowercase();
            if tailguard_auth::forward::RESERVED.contains(&lower.as_str()) {
                out.push((
                    Some(h.span()),
                    format!(".upstream_headers[{j}]"),
                    format!("`{lower}` is the gateway's own to write"),
                ));
            }
        }
        if !(1..=60_000).contains(self.timeout_ms.get_ref()) {
            out.push((
                Some(self.timeout_ms.span()),
                ".timeout_ms".into(),
                "1..=60000".into(),
            ));
        }
        if let Some(c) = &self.cache {
            let c2 = c.get_ref();
            if c2.key_headers.is_empty() {
                out.push((
                    Some(c.span()),
                    ".cache.key_headers".into(),
                    "name at least one header (`[\"authorization\"]`): without one, every \
                     client of a route would share one answer"
                        .into(),
                ));
            }
            for (j, h) in c2.key_headers.iter().enumerate() {
                if http::HeaderName::from_bytes(h.get_ref().as_bytes()).is_err() {
                    out.push((
                        Some(h.span()),
                        format!(".cache.key_headers[{j}]"),
                        format!("`{}` is not a header name", h.get_ref()),
                    ));
                }
            }
            if !(1..=3600).contains(c2.ttl_s.get_ref()) {
                out.push((
                    Some(c2.ttl_s.span()),
                    ".cache.ttl_s".into(),
                    "1..=3600".into(),
                ));
            }
        }
    }
}

/// One consumer of an API-key authenticator.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerConfig {
    /// The name (`$consumer`).
    pub name: Spanned<String>,
    /// Its keys' hashes, `sha256:HEX` (`printf %s KEY | sha256sum`).
    pub keys: Vec<Spanned<String>>,
}

/// One string or a list of them (`auth = "users"` or `auth = ["users", "partners"]`). A
/// lone string takes the span of the field around it.
#[derive(Debug, Clone, PartialEq)]
pub struct StringList(pub Vec<Spanned<String>>);

impl<'de> Deserialize<'de> for StringList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<StringList, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StringList;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<StringList, E> {
                Ok(StringList(vec![Spanned::new(0..0, s.to_owned())]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StringList, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<Spanned<String>>()? {
                    out.push(s);
                }
                Ok(StringList(out))
            }
        }
        d.deserialize_any(V)
    }
}

impl StringList {
    /// Each string with its span (the list's own for a lone string).
    pub fn items(list: &Spanned<StringList>) -> impl Iterator<Item = (Range<usize>, &str)> {
        let outer = list.span();
        list.get_ref().0.iter().map(move |s| {
            let span = if s.span() == (0..0) {
                outer.clone()
            } else {
                s.span()
            };
            (span, s.get_ref().as_str())
        })
    }
}

/// A problem: its span, the field after `auth[i].`, the message.
pub type Problem = (Option<Range<usize>>, String, String);

/// Deserializes one `[[auth]]` element by its `type`.
pub(crate) fn parse(value: &Spanned<DeValue<'_>>) -> Result<AuthConfig, Problem> {
    let de_problem = |e: toml::de::Error| -> Problem {
        (
            e.span().or(Some(value.span())),
            String::new(),
            e.message().trim_end().replace('\n', " "),
        )
    };
    let table = value.get_ref();
    if !table.is_table() {
        return Err((
            Some(value.span()),
            String::new(),
            "expected a table (`[[auth]]`)".into(),
        ));
    }
    let name = match table.get("name") {
        Some(n) => match n.get_ref().as_str() {
            Some(s) => Spanned::new(n.span(), s.to_owned()),
            None => return Err((Some(n.span()), ".name".into(), "expected a string".into())),
        },
        None => {
            return Err((
                Some(value.span()),
                ".name".into(),
                "missing field `name`".into(),
            ));
        }
    };
    let Some(kind) = table.get("type") else {
        return Err((
            Some(value.span()),
            ".type".into(),
            format!("missing field `type`, one of {}", list(TYPES)),
        ));
    };
    let kind = match kind.get_ref().as_str() {
        Some("api_key") => AuthKind::ApiKey(
            ApiKeyConfig::deserialize(ValueDeserializer::from(value.clone()))
                .map_err(de_problem)?,
        ),
        Some("basic") => AuthKind::Basic(
            BasicConfig::deserialize(ValueDeserializer::from(value.clone())).map_err(de_problem)?,
        ),
        Some("forward") => AuthKind::Forward(
            ForwardConfig::deserialize(ValueDeserializer::from(value.clone()))
                .map_err(de_problem)?,
        ),
        Some("jwt") => AuthKind::Jwt(Box::new(
            JwtConfig::deserialize(ValueDeserializer::from(value.clone())).map_err(de_problem)?,
        )),
        Some(other) => {
            return Err((
                Some(kind.span()),
                ".type".into(),
                format!("unknown type `{other}`, expected one of {}", list(TYPES)),
            ));
        }
        None => {
            return Err((
                Some(kind.span()),
                ".type".into(),
                "expected a string".into(),
            ));
        }
    };
    Ok(AuthConfig { name, kind })
}

fn list(items: &[&str]) -> String {
    let quoted: Vec<String> = items.iter().map(|t| format!("`{t}`")).collect();
    quoted.join(", ")
}

/// The sources an API key may come from.
pub const API_KEY_SOURCES: &[&str] = &["header", "query"];

impl ApiKeyConfig {
    /// `from` parsed (empty: the default).
    pub fn sources(&self) -> Vec<Source> {
        self.from
            .as_ref()
            .map(|f| {
                StringList::items(f)
                    .filter_map(|(_, s)| Source::parse(s, API_KEY_SOURCES).ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `keys_file` resolved against the config's directory.
    pub fn keys_file(&self, base_dir: &Path) -> Option<std::path::PathBuf> {
        self.keys_file.as_ref().map(|f| base_dir.join(f.get_ref()))
    }

    /// The inline consumers parsed (their hashes checked by [`AuthConfig::check`]).
    pub fn consumers(&self) -> Vec<tailguard_auth::Consumer> {
        self.consumers
            .iter()
            .map(|c| tailguard_auth::Consumer {
                name: std::sync::Arc::from(c.name.get_ref().as_str()),
                keys: c
                    .keys
                    .iter()
                    .filter_map(|k| KeyHash::parse(k.get_ref()).ok())
                    .collect(),
            })
            .collect()
    }
}

impl AuthConfig {
    /// This element's problems (`base_dir` resolves files, which are read to be checked).
    pub fn check(&self, base_dir: &Path) -> Vec<Problem> {
        let mut out = Vec::new();
        let name = self.name.get_ref();
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            out.push((
                Some(self.name.span()),
                ".name".into(),
                format!("`{name}` is not a name (letters, digits, `-`, `_`, `.`)"),
            ));
        }
        match &self.kind {
            AuthKind::ApiKey(k) => k.check(base_dir, &mut out),
            AuthKind::Basic(b) => b.check(base_dir, &mut out),
            AuthKind::Forward(f) => f.check(base_dir, &mut out),
            AuthKind::Jwt(j) => j.check(base_dir, &mut out),
        }
        out
    }
}

impl ApiKeyConfig {
    fn check(&self, base_dir: &Path, out: &mut Vec<Problem>) {
        if let Some(from) = &self.from {
            if from.get_ref().0.is_empty() {
                out.push((Some(from.span()), ".from".into(), "lists no source".into()));
            }
            for (span, s) in StringList::items(from) {
                if let Err(m) = Source::parse(s, API_KEY_SOURCES) {
                    out.push((Some(span), ".from".into(), m));
                }
            }
        }
        let mut seen = std::collections::HashMap::new();
        let mut names = std::collections::HashSet::new();
        for (j, c) in self.consumers.iter().enumerate() {
            if !names.insert(c.name.get_ref().as_str()) {
                out.push((
                    Some(c.name.span()),
                    format!(".consumers[{j}].name"),
                    format!("duplicate consumer `{}`", c.name.get_ref()),
                ));
            }
            if c.name.get_ref().is_empty() || c.name.get_ref().contains(char::is_whitespace) {
                out.push((
                    Some(c.name.span()),
                    format!(".consumers[{j}].name"),
                    "a consumer's name is one word".into(),
                ));
            }
            for (k, key) in c.keys.iter().enumerate() {
                match KeyHash::parse(key.get_ref()) {
                    Ok(h) => {
                        if let Some(other) = seen.insert(h, c.name.get_ref().clone()) {
                            out.push((
                                Some(key.span()),
                                format!(".consumers[{j}].keys[{k}]"),
                                format!("the same key as one of `{other}`'s"),
                            ));
                        }
                    }
                    Err(m) => out.push((Some(key.span()), format!(".consumers[{j}].keys[{k}]"), m)),
                }
            }
        }
        if let Some(f) = &self.keys_file
            && let Some(path) = self.keys_file(base_dir)
            && let Err(m) = tailguard_auth::api_key::read_keys_file(&path)
        {
            out.push((Some(f.span()), ".keys_file".into(), m));
        }
        if self.consumers.is_empty() && self.keys_file.is_none() {
            out.push((
                None,
                String::new(),
                "an `api_key` authenticator needs `consumers` or `keys_file`".into(),
            ));
        }
    }
}

fn default_leeway() -> u64 {
    // 60 s: the default, and what most identity providers' SDKs allow.
    60
}
fn default_refresh() -> u64 {
    // 5 minutes: a rotated key is picked up within 5 minutes even without an unknown `kid`.
    300
}
fn default_min_refresh() -> u64 {
    60
}
fn default_refetch_min() -> u64 {
    // 30 s: a flood of tokens with made-up `kid`s costs the key server 2 fetches a minute.
    30
}
fn default_timeout() -> u64 {
    5_000
}
fn default_consumer_claim() -> String {
    "sub".to_owned()
}

/// `type = "jwt"`: bearer tokens verified against a key set or a shared secret.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    #[serde(rename = "name")]
    _name: Spanned<String>,
    #[serde(rename = "type")]
    _type: Spanned<String>,
    /// The key set: an `http(s)://` URL (fetched and refreshed in the background) or a file
    /// path (relative to the config; re-read when it changes).
    #[serde(default)]
    pub jwks: Option<Spanned<String>>,
    /// A PEM file of CA certificates trusted for an `https://` `jwks` besides the system's
    /// roots (relative to the config).
    #[serde(default)]
    pub jwks_ca: Option<Spanned<String>>,
    /// A file whose bytes, as they are, are the HS256/384/512 secret.
    #[serde(default)]
    pub secret_file: Option<Spanned<String>>,
    /// `iss` must equal this.
    #[serde(default)]
    pub issuer: Option<String>,
    /// `aud` must contain one of these.
    #[serde(default)]
    pub audiences: Option<Spanned<StringList>>,
    /// Algorithms accepted; default every one the keys allow.
    #[serde(default)]
    pub algorithms: Option<Spanned<StringList>>,
    /// Clock skew allowed on `exp` and `nbf`, seconds (default 60).
    #[serde(default = "default_leeway")]
    pub leeway_s: u64,
    /// Claims a token must carry (`403` without one).
    #[serde(default)]
    pub required_claims: Vec<String>,
    /// Where the token is: `header:NAME`, `query:NAME`, `cookie:NAME`; default
    /// `header:authorization` (the `Bearer` scheme).
    #[serde(default)]
    pub from: Option<Spanned<StringList>>,
    /// Claims copied to request headers: `{ sub = "x-user-id" }`.
    #[serde(default)]
    pub claims_to_headers: Option<Spanned<std::collections::BTreeMap<String, Spanned<String>>>>,
    /// Whether the upstream sees the token (default `false`).
    #[serde(default)]
    pub forward_token: bool,
    /// The claim naming the consumer (default `sub`).
    #[serde(default = "default_consumer_claim")]
    pub consumer_claim: String,
    /// Seconds between fetches of a URL key set without `Cache-Control: max-age`.
    #[serde(default = "default_refresh")]
    pub refresh_s: u64,
    /// The shortest period a `max-age` may set, seconds.
    #[serde(default = "default_min_refresh")]
    pub min_refresh_s: u64,
    /// The shortest time between fetches asked for by unknown `kid`s, seconds.
    #[serde(default = "default_refetch_min")]
    pub refetch_min_s: u64,
    /// A fetch's time limit, milliseconds.
    #[serde(default = "default_timeout")]
    pub timeout_ms: u64,
}

/// The sources a token may come from.
pub const JWT_SOURCES: &[&str] = &["header", "query", "cookie"];

/// Headers `claims_to_headers` may not set: the request's framing, routing and the token.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "te",
    "upgrade",
    "authorization",
    "cookie",
];

impl JwtConfig {
    /// `jwks` resolved: a URL, or a file against the config's directory.
    pub fn jwks_location(&self, base_dir: &Path) -> Option<tailguard_auth::Location> {
        let j = self.jwks.as_ref()?.get_ref();
        if j.starts_with("http://") || j.starts_with("https://") {
            j.parse().ok().map(tailguard_auth::Location::Url)
        } else {
            Some(tailguard_auth::Location::File(base_dir.join(j)))
        }
    }

    /// `jwks_ca` resolved against the config's directory.
    pub fn jwks_ca(&self, base_dir: &Path) -> Option<std::path::PathBuf> {
        self.jwks_ca.as_ref().map(|c| base_dir.join(c.get_ref()))
    }

    /// The refresh settings.
    pub fn refresh(&self) -> tailguard_auth::Refresh {
        use std::time::Duration;
        tailguard_auth::Refresh {
            refresh: Duration::from_secs(self.refresh_s),
            min_refresh: Duration::from_secs(self.min_refresh_s),
            refetch_min: Duration::from_secs(self.refetch_min_s),
            timeout: Duration::from_millis(self.timeout_ms),
        }
    }

    /// `secret_file` resolved.
    pub fn secret_path(&self, base_dir: &Path) -> Option<std::path::PathBuf> {
        self.secret_file
            .as_ref()
            .map(|f| base_dir.join(f.get_ref()))
    }

    /// `algorithms` parsed (empty: the default).
    pub fn algorithms(&self) -> Vec<tailguard_auth::Alg> {
        self.algorithms
            .as_ref()
            .map(|a| {
                StringList::items(a)
                    .filter_map(|(_, n)| tailguard_auth::Alg::parse(n))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `from` parsed (empty: the default).
    pub fn sources(&self) -> Vec<Source> {
        self.from
            .as_ref()
            .map(|f| {
                StringList::items(f)
                    .filter_map(|(_, s)| Source::parse(s, JWT_SOURCES).ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The claim rules.
    pub fn rules(&self) -> tailguard_auth::ClaimRules {
        tailguard_auth::ClaimRules {
            issuer: self.issuer.clone(),
            audiences: self
                .audiences
                .as_ref()
                .map(|a| StringList::items(a).map(|(_, s)| s.to_owned()).collect())
                .unwrap_or_default(),
            leeway_s: self.leeway_s,
            required: self.required_claims.clone(),
        }
    }

    /// `claims_to_headers` parsed.
    pub fn claims_to_headers(&self) -> Vec<(String, http::HeaderName)> {
        self.claims_to_headers
            .as_ref()
            .map(|m| {
                m.get_ref()
                    .iter()
                    .filter_map(|(claim, h)| {
                        http::HeaderName::from_bytes(h.get_ref().as_bytes())
                            .ok()
                            .map(|h| (claim.clone(), h))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn check(&self, base_dir: &Path, out: &mut Vec<Problem>) {
        if self.jwks.is_none() && self.secret_file.is_none() {
            out.push((
                None,
                String::new(),
                "a `jwt` authenticator needs `jwks` or `secret_file`".into(),
            ));
        }
        if let Some(j) = &self.jwks {
            match self.jwks_location(base_dir) {
                Some(tailguard_auth::Location::File(path)) => {
                    let parsed = std::fs::read(&path)
                        .map_err(|e| format!("cannot read {}: {e}", path.display()))
                        .and_then(|t| {
                            tailguard_auth::KeySet::parse_jwks(&t)
                                .map_err(|e| format!("{}: {e}", path.display()))
                        });
                    if let Err(m) = parsed {
                        out.push((Some(j.span()), ".jwks".into(), m));
                    }
                }
                Some(tailguard_auth::Location::Url(u)) if u.host().is_some() => {}
                _ => out.push((
                    Some(j.span()),
                    ".jwks".into(),
                    format!("`{}` is not a URL", j.get_ref()),
                )),
            }
        }
        if let (Some(ca), Some(path)) = (&self.jwks_ca, self.jwks_ca(base_dir)) {
            let https = self
                .jwks
                .as_ref()
                .is_some_and(|j| j.get_ref().starts_with("https://"));
            let checked = if https {
                tailguard_auth::connect::read_ca(&path).map(|_| ())
            } else {
                Err("only with an https:// `jwks`".to_owned())
            };
            if let Err(m) = checked {
                out.push((Some(ca.span()), ".jwks_ca".into(), m));
            }
        }
        if let Some(f) = &self.secret_file
            && let Some(path) = self.secret_path(base_dir)
        {
            match std::fs::read(&path) {
                // RFC 7518 §3.2: a key at least as long as the hash (32 bytes for HS256).
                Ok(bytes) if bytes.len() < 32 => out.push((
                    Some(f.span()),
                    ".secret_file".into(),
                    format!(
                        "{} holds {} bytes; an HMAC secret needs at least 32",
                        path.display(),
                        bytes.len()
                    ),
                )),
                Ok(_) => {}
                Err(e) => out.push((
                    Some(f.span()),
                    ".secret_file".into(),
                    format!("cannot read {}: {e}", path.display()),
                )),
            }
        }
        if let Some(a) = &self.algorithms {
            if a.get_ref().0.is_empty() {
                out.push((
                    Some(a.span()),
                    ".algorithms".into(),
                    "lists no algorithm".into(),
                ));
            }
            for (span, name) in StringList::items(a) {
                match tailguard_auth::Alg::parse(name) {
                    None => out.push((
                        Some(span),
                        ".algorithms".into(),
                        format!(
                            "`{name}` is not an algorithm; expected one of RS256, RS384, RS512, \
                             PS256, PS384, PS512, ES256, ES384, EdDSA, HS256, HS384, HS512"
                        ),
                    )),
                    Some(alg) if alg.is_hmac() && self.secret_file.is_none() => out.push((
                        Some(span),
                        ".algorithms".into(),
                        format!(
                            "`{name}` needs `secret_file` (a key set's keys are never HMAC secrets)"
                        ),
                    )),
                    Some(alg) if !alg.is_hmac() && self.jwks.is_none() => out.push((
                        Some(span),
                        ".algorithms".into(),
                        format!("`{name}` needs `jwks`"),
                    )),
                    Some(_) => {}
                }
            }
        }
        if let Some(from) = &self.from {
            if from.get_ref().0.is_empty() {
                out.push((Some(from.span()), ".from".into(), "lists no source".into()));
            }
            for (span, s) in StringList::items(from) {
                if let Err(m) = Source::parse(s, JWT_SOURCES) {
                    out.push((Some(span), ".from".into(), m));
                }
            }
        }
        if let Some(m) = &self.claims_to_headers {
            for (claim, h) in m.get_ref() {
                let name = h.get_ref().to_ascii_lowercase();
                if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                    out.push((
                        Some(h.span()),
                        format!(".claims_to_headers.{claim}"),
                        format!("`{}` is not a header name", h.get_ref()),
                    ));
                } else if RESERVED_HEADERS.contains(&name.as_str()) {
                    out.push((
                        Some(h.span()),
                        format!(".claims_to_headers.{claim}"),
                        format!("`{}` is not a header a claim may set", h.get_ref()),
                    ));
                }
            }
        }
        for (field, v, lo, hi) in [
            ("leeway_s", self.leeway_s, 0, 3_600),
            ("refresh_s", self.refresh_s, 1, 86_400),
            ("min_refresh_s", self.min_refresh_s, 1, 86_400),
            ("refetch_min_s", self.refetch_min_s, 1, 86_400),
            ("timeout_ms", self.timeout_ms, 1, 60_000),
        ] {
            if !(lo..=hi).contains(&v) {
                out.push((
                    None,
                    format!(".{field}"),
                    format!("{v} is outside {lo}..={hi}"),
                ));
            }
        }
    }
}

//! Reading a config: the TOML parsed with spans, each section and each array element
//! deserialized on its own (so that one mistake does not hide the next), then every check
//! run over what did deserialize; every problem found is returned, in file order.

use std::collections::HashSet;
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;
use toml::de::{DeTable, DeValue, ValueDeserializer};

use crate::access_log;
use crate::cidr::Cidr;
use crate::diagnostic::{Diags, line_col};
use crate::dns::DnsConfig;
use crate::error::Error;
use crate::file::{Config, ListenOrigin};
use crate::limits::{Limits, Timeouts};
use crate::listener::ListenerConfig;
use crate::trace::TracingConfig;
use crate::validate::{self, FileIndexes};

/// The config compiled into the binary: what `tailguard run` serves with no `--config`.
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

/// The name the embedded default config goes by in error messages.
pub const DEFAULT_CONFIG_NAME: &str = "<embedded default config>";

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        let base = path.parent().map(Path::to_owned).unwrap_or_default();
        Config::parse(&text, &path.display().to_string(), &base)
    }

    /// The embedded default config.
    pub fn embedded_default() -> Config {
        Config::parse(DEFAULT_CONFIG, DEFAULT_CONFIG_NAME, Path::new("."))
            .expect("the embedded default config is checked by a test")
    }

    /// Parses and validates config text. `name` is used in messages; relative certificate
    /// paths are resolved against `base_dir`. On failure every error found is returned.
    pub fn parse(text: &str, name: &str, base_dir: &Path) -> Result<Config, Error> {
        Config::parse_with_env(text, name, base_dir, &|var| std::env::var(var).ok())
    }

    /// [`Config::parse`] with the environment variables (`OTEL_*`, read by `[tracing]`)
    /// looked up by `env` instead of the process's environment.
    pub fn parse_with_env(
        text: &str,
        name: &str,
        base_dir: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, Error> {
        let mut diags = Diags::new(name, text);
        let (root, syntax_errors) = DeTable::parse_recoverable(text);
        for err in &syntax_errors {
            diags.de_error("(syntax)", err);
        }
        if !syntax_errors.is_empty() {
            return Err(Error::Config(diags.finish()));
        }
        let root = root.into_inner();

        let mut listeners = Vec::new();
        let mut upstreams = Vec::new();
        let mut routes = Vec::new();
        let mut auth = Vec::new();
        let mut timeouts = Timeouts::default();
        let mut limits = Limits::default();
        let mut access_log = tailguard_access_log::Config::default();
        let mut metrics = tailguard_metrics::MetricsConfig::default();
        let mut status = crate::status::StatusConfig::default();
        let mut overload = tailguard_overload::OverloadConfig::default();
        let mut trusted_proxies = Vec::new();
        let mut dns = DnsConfig::default();
        let mut tracing_file = TracingConfig::default();
        let mut redis: Option<crate::redis::RedisConfig> = None;
        let mut listeners_span = None;
        let mut declared_upstreams = HashSet::new();
        let mut idx = FileIndexes::default();

        // Owned: each section and element is deserialized from the parsed value itself, not
        // a copy of it (at 100,000 routes the copies were a fifth of a reload's time).
        for (key, value) in root {
            let key_name: &str = key.get_ref();
            match key_name {
                "listeners" => {
                    listeners_span = Some(value.span());
                    (idx.listeners, listeners) = array_of(&mut diags, "listeners", value);
                }
                "upstreams" => {
                    // Names of upstreams that failed to deserialize still count as declared,
                    // so a route naming one is not reported a second time.
                    if let Some(items) = value.get_ref().as_array() {
                        for item in items.iter() {
                            if let Some(name) = item
                                .get_ref()
                                .get("name")
                                .and_then(|n| n.get_ref().as_str())
                            {
                                declared_upstreams.insert(name.to_owned());
                            }
                        }
                    }
                    (idx.upstreams, upstreams) = array_of(&mut diags, "upstreams", value);
                }
                "routes" => (idx.routes, routes) = array_of(&mut diags, "routes", value),
                "auth" => {
                    (idx.auth, auth) = auth_of(&mut diags, &value, &mut idx.declared_auth);
                }
                "timeouts" => {
                    if let Some(t) = one_of(&mut diags, "timeouts", value) {
                        timeouts = t;
                    }
                }
                "limits" => {
                    if let Some(l) = one_of(&mut diags, "limits", value) {
                        limits = l;
                    }
                }
                "access_log" => {
                    if let Some(a) = one_of(&mut diags, "access_log", value) {
                        access_log = a;
                    }
                }
                "metrics" => {
                    if let Some(m) = one_of(&mut diags, "metrics", value) {
                        metrics = m;
                    }
                }
                "status" => {
                    if let Some(s) = one_of(&mut diags, "status", value) {
                        status = s;
                    }
                }
                "overload" => {
                    if let Some(o) = one_of(&mut diags, "overload", value) {
                        overload = o;
                    }
                }
                "trusted_proxies" => trusted_proxies = cidrs(&mut diags, "trusted_proxies", &value),
                "dns" => {
                    if let Some(d) = one_of(&mut diags, "dns", value) {
                        dns = d;
                    }
                }
                "tracing" => {
                    if let Some(t) = one_of(&mut diags, "tracing", value) {
                        tracing_file = t;
                    }
                }
                "redis" => {
                    idx.redis = true;
                    redis = one_of(&mut diags, "redis", value);
                    if let Some(r) = &mut redis {
                        r.locate(base_dir);
                    }
                }
                other => diags.push(
                    Some(key.span()),
                    other,
                    "unknown section, expected one of `listeners`, `upstreams`, `routes`, \
                     `timeouts`, `limits`, `access_log`, `metrics`, `status`, \
                     `overload`, `trusted_proxies`, `dns`, `tracing`, `redis`, `auth`",
                ),
            }
        }

        dns.locate(base_dir);
        status.locate(base_dir);
        if let Err((span, field, message)) = status.access() {
            diags.push(span, field, message);
        }
        let tracing = match tracing_file.resolve(base_dir, env) {
            Ok(t) => t,
            Err(problems) => {
                for (span, field, message) in problems {
                    match span {
                        Some(span) => diags.push(Some(span), field, message),
                        None => diags.push_outside(crate::diagnostic::environment(&field, message)),
                    }
                }
                None
            }
        };
        let listen_origins = listeners
            .iter()
            .map(|l: &ListenerConfig| {
                ListenOrigin::File(Some(line_col(text, l.address.span().start)))
            })
            .collect();
        let config = Config {
            listen_origins,
            source: name.to_owned(),
            base_dir: base_dir.to_owned(),
            listeners,
            upstreams,
            routes,
            auth,
            timeouts,
            limits,
            access_log,
            metrics,
            status,
            overload,
            trusted_proxies,
            dns,
            tracing_file,
            tracing,
            redis,
        };
        for (field, message) in config.metrics.check() {
            diags.push(None, field, message);
        }
        for (field, message) in access_log::check(&config.access_log, &config.listeners) {
            diags.push(None, field, message);
        }
        validate::validate(
            &config,
            &mut diags,
            listeners_span,
            &declared_upstreams,
            &idx,
        );
        if diags.is_empty() {
            Ok(config)
        } else {
            Err(Error::Config(diags.finish()))
        }
    }
}

/// `[[auth]]`: each element deserialized by its `type`; every name written counts as
/// declared (an element with another mistake too), so a route naming it is not reported
/// again.
fn auth_of(
    d: &mut Diags<'_>,
    value: &Spanned<DeValue<'_>>,
    declared: &mut HashSet<String>,
) -> (Vec<usize>, Vec<crate::auth::AuthConfig>) {
    let Some(items) = value.get_ref().as_array() else {
        d.push(Some(value.span()), "auth", "expected an array (`[[auth]]`)");
        return (Vec::new(), Vec::new());
    };
    let mut indexes = Vec::new();
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        if let Some(name) = item
            .get_ref()
            .get("name")
            .and_then(|n| n.get_ref().as_str())
        {
            declared.insert(name.to_owned());
        }
        match crate::auth::parse(item) {
            Ok(a) => {
                indexes.push(i);
                out.push(a);
            }
            Err((span, field, message)) => d.push(span, format!("auth[{i}]{field}"), message),
        }
    }
    (indexes, out)
}

/// A list of networks (`["10.0.0.0/8", "::1"]`), each error at its element.
fn cidrs(diags: &mut Diags<'_>, field: &str, value: &Spanned<DeValue<'_>>) -> Vec<Cidr> {
    let Some(items) = value.get_ref().as_array() else {
        diags.push(
            Some(value.span()),
            field,
            "expected a list of CIDRs, like [\"10.0.0.0/8\", \"::1\"]",
        );
        return Vec::new();
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let parsed = match item.get_ref().as_str() {
            Some(text) => text.parse(),
            None => Err("expected a string, like \"10.0.0.0/8\"".to_string()),
        };
        match parsed {
            Ok(cidr) => out.push(cidr),
            Err(message) => diags.push(Some(item.span()), format!("{field}[{i}]"), message),
        }
    }
    out
}

fn one_of<T: for<'de> Deserialize<'de>>(
    d: &mut Diags<'_>,
    field: &str,
    value: Spanned<DeValue<'_>>,
) -> Option<T> {
    let whole = value.span();
    match T::deserialize(ValueDeserializer::from(value)) {
        Ok(v) => Some(v),
        Err(e) => {
            let span = e.span().or(Some(whole));
            d.push(span, field, e.message().trim_end().replace('\n', " "));
            None
        }
    }
}

/// Deserializes each element on its own; returns the good ones with their index in the
/// file, so later messages name the element the user wrote (`routes[3]`), not its position
/// among the ones that parsed.
fn array_of<T: for<'de> Deserialize<'de>>(
    d: &mut Diags<'_>,
    field: &str,
    value: Spanned<DeValue<'_>>,
) -> (Vec<usize>, Vec<T>) {
    let span = value.span();
    let DeValue::Array(items) = value.into_inner() else {
        d.push(
            Some(span),
            field,
            format!("expected an array (`[[{field}]]`)"),
        );
        return (Vec::new(), Vec::new());
    };
    // Sized once: a route's config is over a kilobyte, and growing a vector of 100,000 of
    // them by doubling copied each one about twice.
    let mut indexes = Vec::with_capacity(items.len());
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        if let Some(v) = one_of(d, &format!("{field}[{i}]"), item) {
            indexes.push(i);
            out.push(v);
        }
    }
    (indexes, out)
}

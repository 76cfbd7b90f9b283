//! `[tracing]`: where spans are exported (OTLP endpoint, protocol, headers, TLS), how
//! requests are sampled (a ratio of new traces, `slow_ms` for the tail rule), the
//! exporter's bounds; the OpenTelemetry environment variables applied where the file
//! sets nothing; and a route's own `tracing = false` or `tracing = { sample_ratio = .. }`.
//!
//! The file wins: an `OTEL_*` variable only fills a key the file leaves out.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use toml::Spanned;

/// `[tracing]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// The collector's base URL, e.g. `http://127.0.0.1:4318` (HTTP) or
    /// `http://127.0.0.1:4317` (gRPC). None (and no `OTEL_EXPORTER_OTLP_*ENDPOINT`): off.
    #[serde(default)]
    pub endpoint: Option<Spanned<String>>,
    /// `"http/protobuf"` (default) or `"grpc"`.
    #[serde(default)]
    pub protocol: Option<Spanned<String>>,
    /// `"none"` (default, as in the OTLP exporter spec) or `"gzip"`.
    #[serde(default)]
    pub compression: Option<Spanned<String>>,
    /// The share of new traces sampled, 0.0 to 1.0 (default 1.0); a request with a caller
    /// follows the caller's `sampled` flag.
    #[serde(default)]
    pub sample_ratio: Option<Spanned<f64>>,
    /// Requests at least this slow are exported even when not sampled (0: off, the
    /// default). Failed requests always are.
    #[serde(default)]
    pub slow_ms: Option<Spanned<u64>>,
    /// Spans per export request (default 2048, or the queue's bound if that is less; the
    /// exporter sends at most half the queue in one).
    #[serde(default)]
    pub batch_max_spans: Option<Spanned<usize>>,
    /// An export request's bytes, at most (default 4 MiB, the OpenTelemetry Collector's
    /// limit on a gRPC message): a batch closes before the span that would pass it.
    #[serde(default)]
    pub batch_max_bytes: Option<Spanned<usize>>,
    /// The longest a recorded span waits before export (default 1000 ms).
    #[serde(default)]
    pub batch_interval_ms: Option<Spanned<u64>>,
    /// Spans recorded and not yet exported, at most (default 8192): the memory bound.
    #[serde(default)]
    pub queue_max_spans: Option<Spanned<usize>>,
    /// Extra headers on every export (a vendor's token).
    #[serde(default)]
    pub headers: Option<Spanned<BTreeMap<String, String>>>,
    /// `service.name` (default `tailguard`).
    #[serde(default)]
    pub service_name: Option<Spanned<String>>,
    /// One export attempt's limit (default 10000 ms).
    #[serde(default)]
    pub timeout_ms: Option<Spanned<u64>>,
    /// TLS to the collector (an `https://` endpoint).
    #[serde(default)]
    pub tls: Option<Spanned<TracingTls>>,
}

/// `[tracing] tls = { ca, cert, key }`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingTls {
    /// PEM CA file the collector's certificate is checked against (none: system roots).
    #[serde(default)]
    pub ca: Option<Spanned<String>>,
    /// PEM client certificate chain.
    #[serde(default)]
    pub cert: Option<Spanned<String>>,
    /// PEM key of `cert`.
    #[serde(default)]
    pub key: Option<Spanned<String>>,
}

/// OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// `http/protobuf`.
    HttpProtobuf,
    /// `grpc`.
    Grpc,
}

/// Tracing as it runs: the file's keys, then the environment's, then the defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Tracing {
    /// The collector's base URL.
    pub endpoint: String,
    /// The full URL for HTTP exports when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` gave it.
    pub traces_url: Option<String>,
    /// Transport.
    pub protocol: OtlpProtocol,
    /// gzip each export.
    pub gzip: bool,
    /// Follow the caller's `sampled` flag (false only with `OTEL_TRACES_SAMPLER` =
    /// `always_on`, `always_off` or `traceidratio`).
    pub parent_based: bool,
    /// The share of new traces sampled.
    pub sample_ratio: f64,
    /// Tail rule: requests at least this slow are exported (0: off).
    pub slow_ms: u64,
    /// Spans per export.
    pub batch_max_spans: usize,
    /// Bytes per export, at most; none: the exporter's default (4 MiB).
    pub batch_max_bytes: Option<usize>,
    /// Export interval.
    pub batch_interval_ms: u64,
    /// Queue bound.
    pub queue_max_spans: usize,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// `service.name`.
    pub service_name: String,
    /// Export attempt timeout.
    pub timeout_ms: u64,
    /// TLS files, resolved against the config file's directory.
    pub tls_ca: Option<PathBuf>,
    /// See [`Tracing::tls_ca`].
    pub tls_cert: Option<PathBuf>,
    /// See [`Tracing::tls_ca`].
    pub tls_key: Option<PathBuf>,
}

/// A problem: its span in the file (none: from the environment), field, message.
pub type Problem = (Option<Range<usize>>, String, String);

// 2048, not the SDK's 512 (the OpenTelemetry Collector's batch processor sends 8192): the
// exporter shares the serving threads' cores, and a quarter as many export requests cost it
// a third to a half less (fewer wake-ups, preemptions and sends). At 15,000 req/s, every span
// exported, the tracer's share of a PGO gateway's core went from 3.42-4.53 % to 2.94-3.07 %
// in two sets of rounds (docs/benchmarks/2026-11-27-trace, eleventh pass). 4096 was no
// cheaper in 24 rounds (2.57 % against 2.64 %, thirteenth pass) and, being half the default
// queue, leaves the serving threads half the room while a batch is out. A request is ~0.55 MB
// (~530 bytes a request's two spans); `batch_max_bytes` (4 MiB, the Collector's default gRPC
// limit) closes a batch of larger spans early. With a queue set below it, a batch is the
// queue.
const DEFAULT_BATCH_MAX_SPANS: usize = 2048;
// A span takes up to 1 KiB, and a request's header a few hundred bytes: below this a
// request would hold hardly a span.
const MIN_BATCH_MAX_BYTES: usize = 4096;
// 1 s, not the SDK's 5 s: a gateway's operator looks for a request's trace right after
// sending it, and at high rates batches fill long before the interval anyway.
const DEFAULT_BATCH_INTERVAL_MS: u64 = 1000;
// 8192 spans of at most 1 KiB: ~8 MB at most, ~0.27 s of spans at 15 000 req/s with 100 %
// sampling (two spans a request), enough to ride out a collector's hiccup.
const DEFAULT_QUEUE_MAX_SPANS: usize = 8192;
const DEFAULT_TIMEOUT_MS: u64 = 10_000;

impl TracingConfig {
    /// Resolves the file's keys with the environment (`env` looks a variable up; the
    /// gateway passes `std::env::var`), checks every value, and returns `None` when no
    /// endpoint is set anywhere (tracing off).
    pub fn resolve(
        &self,
        base_dir: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Tracing>, Vec<Problem>> {
        let mut problems: Vec<Problem> = Vec::new();
        let mut bad = |span: Option<Range<usize>>, field: &str, message: String| {
            problems.push((span, field.to_owned(), message));
        };
        let env = |name: &str| {
            env(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };

        // Endpoint: the file, else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (a full URL for
        // HTTP), else OTEL_EXPORTER_OTLP_ENDPOINT (a base URL).
        let mut traces_url = None;
        let endpoint = match &self.endpoint {
            Some(e) => {
                check_url(e.get_ref())
                    .map_err(|m| bad(Some(e.span()), "tracing.endpoint", m))
                    .ok();
                Some(e.get_ref().trim_end_matches('/').to_owned())
            }
            None => match (
                env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
                env("OTEL_EXPORTER_OTLP_ENDPOINT"),
            ) {
                (Some(full), _) => {
                    if let Err(m) = check_url(&full) {
                        bad(None, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", m);
                    }
                    traces_url = Some(full.clone());
                    Some(full.trim_end_matches('/').to_owned())
                }
                (None, Some(base)) => {
                    if let Err(m) = check_url(&base) {
                        bad(None, "OTEL_EXPORTER_OTLP_ENDPOINT", m);
                    }
                    Some(base.trim_end_matches('/').to_owned())
                }
                (None, None) => None,
            },
        };

        let protocol = match &self.protocol {
            Some(p) => parse_protocol(p.get_ref())
                .map_err(|m| bad(Some(p.span()), "tracing.protocol", m))
                .ok(),
            None => match env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
            {
                Some(p) => parse_protocol(&p)
                    .map_err(|m| bad(None, "OTEL_EXPORTER_OTLP_PROTOCOL", m))
                    .ok(),
                None => Some(OtlpProtocol::HttpProtobuf),
            },
        };

        let gzip = match &self.compression {
            Some(c) => parse_compression(c.get_ref())
                .map_err(|m| bad(Some(c.span()), "tracing.compression", m))
                .unwrap_or(false),
            None => match env("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION")
                .or_else(|| env("OTEL_EXPORTER_OTLP_COMPRESSION"))
            {
                Some(c) => parse_compression(&c)
                    .map_err(|m| bad(None, "OTEL_EXPORTER_OTLP_COMPRESSION", m))
                    .unwrap_or(false),
                None => false,
            },
        };

        // Sampling: the file's ratio (always parent-based), else OTEL_TRACES_SAMPLER(_ARG).
        let (parent_based, sample_ratio) = match &self.sample_ratio {
            Some(r) => {
                let ratio = *r.get_ref();
                if !(0.0..=1.0).contains(&ratio) {
                    bad(
                        Some(r.span()),
                        "tracing.sample_ratio",
                        format!("{ratio} is not between 0.0 and 1.0"),
                    );
                }
                (true, ratio)
            }
            None => {
                match sampler_from_env(env("OTEL_TRACES_SAMPLER"), env("OTEL_TRACES_SAMPLER_ARG")) {
                    Ok(s) => s,
                    Err((field, m)) => {
                        bad(None, field, m);
                        (true, 1.0)
                    }
                }
            }
        };

        let mut positive = |v: &Option<Spanned<u64>>, field: &str, default: u64| match v {
            Some(v) if *v.get_ref() == 0 => {
                bad(Some(v.span()), field, "must be at least 1".to_owned());
                default
            }
            Some(v) => *v.get_ref(),
            None => default,
        };
        let batch_interval_ms = positive(
            &self.batch_interval_ms,
            "tracing.batch_interval_ms",
            DEFAULT_BATCH_INTERVAL_MS,
        );
        let timeout_ms = positive(&self.timeout_ms, "tracing.timeout_ms", DEFAULT_TIMEOUT_MS);
        let batch_set = self.batch_max_spans.as_ref().map(|b| {
            if *b.get_ref() == 0 {
                bad(
                    Some(b.span()),
                    "tracing.batch_max_spans",
                    "must be at least 1".to_owned(),
                );
            }
            *b.get_ref()
        });
        let queue_max_spans = self
            .queue_max_spans
            .as_ref()
            .map_or(DEFAULT_QUEUE_MAX_SPANS, |q| {
                // Refused here, not only below a set batch: with the batch defaulting to the
                // queue, a queue of 0 would otherwise pass as "drop every span".
                if *q.get_ref() == 0 {
                    bad(
                        Some(q.span()),
                        "tracing.queue_max_spans",
                        "must be at least 1".to_owned(),
                    );
                } else if let Some(batch) = batch_set.filter(|batch| q.get_ref() < batch) {
                    bad(
                        Some(q.span()),
                        "tracing.queue_max_spans",
                        format!("{} is below batch_max_spans ({batch})", q.get_ref()),
                    );
                }
                *q.get_ref()
            });
        let batch_max_spans =
            batch_set.unwrap_or_else(|| DEFAULT_BATCH_MAX_SPANS.min(queue_max_spans.max(1)));
        let batch_max_bytes = self.batch_max_bytes.as_ref().map(|b| {
            if *b.get_ref() < MIN_BATCH_MAX_BYTES {
                bad(
                    Some(b.span()),
                    "tracing.batch_max_bytes",
                    format!(
                        "{} is below {MIN_BATCH_MAX_BYTES} (a span takes up to 1 KiB)",
                        b.get_ref()
                    ),
                );
            }
            *b.get_ref()
        });

        let headers = match &self.headers {
            Some(h) => {
                let mut out = Vec::new();
                for (name, value) in h.get_ref() {
                    if http::HeaderName::from_bytes(name.as_bytes()).is_err()
                        || http::HeaderValue::from_str(value).is_err()
                    {
                        bad(
                            Some(h.span()),
                            &format!("tracing.headers.{name}"),
                            "not a valid HTTP header".to_owned(),
                        );
                    }
                    out.push((name.clone(), value.clone()));
                }
                out
            }
            None => match env("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
                .or_else(|| env("OTEL_EXPORTER_OTLP_HEADERS"))
            {
                Some(list) => match parse_env_headers(&list) {
                    Ok(h) => h,
                    Err(m) => {
                        bad(None, "OTEL_EXPORTER_OTLP_HEADERS", m);
                        Vec::new()
                    }
                },
                None => Vec::new(),
            },
        };

        let service_name = match &self.service_name {
            Some(s) if s.get_ref().trim().is_empty() => {
                bad(
                    Some(s.span()),
                    "tracing.service_name",
                    "must not be empty".to_owned(),
                );
                String::new()
            }
            Some(s) => s.get_ref().clone(),
            None => env("OTEL_SERVICE_NAME").unwrap_or_else(|| "tailguard".to_owned()),
        };

        let (mut tls_ca, mut tls_cert, mut tls_key) = (None, None, None);
        if let Some(tls) = &self.tls {
            let t = tls.get_ref();
            for (field, value, out) in [
                ("ca", &t.ca, &mut tls_ca),
                ("cert", &t.cert, &mut tls_cert),
                ("key", &t.key, &mut tls_key),
            ] {
                if let Some(v) = value {
                    let path = base_dir.join(v.get_ref());
                    if !path.is_file() {
                        bad(
                            Some(v.span()),
                            &format!("tracing.tls.{field}"),
                            format!("cannot read `{}`", path.display()),
                        );
                    }
                    *out = Some(path);
                }
            }
            if t.cert.is_some() != t.key.is_some() {
                bad(
                    Some(tls.span()),
                    "tracing.tls",
                    "`cert` and `key` go together".to_owned(),
                );
            }
            if let Some(e) = &self.endpoint
                && !e.get_ref().starts_with("https://")
            {
                bad(
                    Some(tls.span()),
                    "tracing.tls",
                    "the endpoint is not https://".to_owned(),
                );
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let (Some(endpoint), Some(protocol)) = (endpoint, protocol) else {
            return Ok(None);
        };
        Ok(Some(Tracing {
            endpoint,
            traces_url,
            protocol,
            gzip,
            parent_based,
            sample_ratio,
            slow_ms: self.slow_ms.as_ref().map_or(0, |s| *s.get_ref()),
            batch_max_spans,
            batch_max_bytes,
            batch_interval_ms,
            queue_max_spans,
            headers,
            service_name,
            timeout_ms,
            tls_ca,
            tls_cert,
            tls_key,
        }))
    }
}

fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("`{url}` is not an http:// or https:// URL"))?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(format!("`{url}` has no host"));
    }
    url.parse::<http::Uri>()
        .map(|_| ())
        .map_err(|e| format!("`{url}`: {e}"))
}

fn parse_protocol(p: &str) -> Result<OtlpProtocol, String> {
    match p {
        "http/protobuf" => Ok(OtlpProtocol::HttpProtobuf),
        "grpc" => Ok(OtlpProtocol::Grpc),
        other => Err(format!(
            "`{other}` is not one of \"http/protobuf\", \"grpc\""
        )),
    }
}

/// Whether `c` asks for gzip.
fn parse_compression(c: &str) -> Result<bool, String> {
    match c {
        "none" => Ok(false),
        "gzip" => Ok(true),
        other => Err(format!("`{other}` is not one of \"none\", \"gzip\"")),
    }
}

/// `OTEL_TRACES_SAMPLER` and its argument, as the OpenTelemetry spec defines them.
fn sampler_from_env(
    sampler: Option<String>,
    arg: Option<String>,
) -> Result<(bool, f64), (&'static str, String)> {
    let ratio = || match &arg {
        None => Ok(1.0),
        Some(a) => match a.parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
            _ => Err((
                "OTEL_TRACES_SAMPLER_ARG",
                format!("`{a}` is not a ratio between 0.0 and 1.0"),
            )),
        },
    };
    match sampler.as_deref() {
        None | Some("parentbased_always_on") => Ok((true, 1.0)),
        Some("always_on") => Ok((false, 1.0)),
        Some("always_off") => Ok((false, 0.0)),
        Some("parentbased_always_off") => Ok((true, 0.0)),
        Some("traceidratio") => Ok((false, ratio()?)),
        Some("parentbased_traceidratio") => Ok((true, ratio()?)),
        Some(other) => Err((
            "OTEL_TRACES_SAMPLER",
            format!(
                "`{other}` is not one of always_on, always_off, traceidratio, \
                 parentbased_always_on, parentbased_always_off, parentbased_traceidratio"
            ),
        )),
    }
}

/// `key1=value1,key2=value2`, values percent-decoded (the spec's W3C Baggage format).
fn parse_env_headers(list: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for pair in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("`{pair}` is not key=value"))?;
        let v =
            percent_decode(v.trim()).ok_or_else(|| format!("`{pair}`: bad percent-encoding"))?;
        let k = k.trim().to_owned();
        if http::HeaderName::from_bytes(k.as_bytes()).is_err()
            || http::HeaderValue::from_str(&v).is_err()
        {
            return Err(format!("`{pair}` is not a valid HTTP header"));
        }
        out.push((k, v));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A route's `tracing`: `false` (no span, no `traceparent` written), `true` (the
/// default), or `{ sample_ratio = .. }` (this route's own ratio for new traces).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RouteTracing {
    /// `tracing = false`.
    Off,
    /// `tracing = true`, or a table without `sample_ratio`.
    Default,
    /// `tracing = { sample_ratio = r }`.
    Ratio(f64),
}

impl<'de> Deserialize<'de> for RouteTracing {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RouteTracing, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RouteTracing;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`false`, `true` or a table like `{ sample_ratio = 0.1 }`")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<RouteTracing, E> {
                Ok(if v {
                    RouteTracing::Default
                } else {
                    RouteTracing::Off
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RouteTracing, A::Error> {
                let mut out = RouteTracing::Default;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "sample_ratio" => {
                            let r: f64 = map.next_value()?;
                            if !(0.0..=1.0).contains(&r) {
                                return Err(de::Error::custom(format!(
                                    "sample_ratio {r} is not between 0.0 and 1.0"
                                )));
                            }
                            out = RouteTracing::Ratio(r);
                        }
                        other => {
                            return Err(de::Error::unknown_field(other, &["sample_ratio"]));
                        }
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> TracingConfig {
        toml::from_str(text).expect("valid [tracing]")
    }

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn no_endpoint_anywhere_is_off() {
        let t = TracingConfig::default().resolve(Path::new("."), &env(&[]));
        assert_eq!(t, Ok(None));
    }

    #[test]
    fn the_file_wins_over_the_environment() {
        let c = parse(
            r#"
endpoint = "http://127.0.0.1:4318"
sample_ratio = 0.25
service_name = "edge"
"#,
        );
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_SERVICE_NAME", "other"),
            ("OTEL_TRACES_SAMPLER", "always_off"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=abc%20def"),
        ];
        let t = c
            .resolve(Path::new("."), &env(&vars))
            .expect("valid")
            .expect("on");
        assert_eq!(t.endpoint, "http://127.0.0.1:4318");
        assert_eq!(t.protocol, OtlpProtocol::Grpc, "the file has no protocol");
        assert_eq!(t.service_name, "edge");
        assert_eq!((t.parent_based, t.sample_ratio), (true, 0.25));
        assert_eq!(t.headers, [("api-key".to_owned(), "abc def".to_owned())]);
    }

    #[test]
    fn the_environment_alone_turns_tracing_on() {
        let vars = [
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://c:4318/custom/traces",
            ),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.1"),
        ];
        let t = TracingConfig::default()
            .resolve(Path::new("."), &env(&vars))
            .expect("valid")
            .expect("on");
        assert_eq!(t.traces_url.as_deref(), Some("http://c:4318/custom/traces"));
        assert_eq!((t.parent_based, t.sample_ratio), (true, 0.1));
        let bad = TracingConfig::default().resolve(
            Path::new("."),
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c"),
                ("OTEL_TRACES_SAMPLER", "sometimes"),
            ]),
        );
        let Err(problems) = bad else {
            panic!("an unknown sampler")
        };
        assert_eq!(problems[0].1, "OTEL_TRACES_SAMPLER");
        assert!(problems[0].0.is_none());
    }

    #[test]
    fn compression_is_off_unless_the_file_or_the_environment_asks_for_gzip() {
        let on = |text: &str, vars: &[(&str, &str)]| {
            parse(text)
                .resolve(Path::new("."), &env(vars))
                .map(|t| t.expect("on").gzip)
        };
        let endpoint = "endpoint = \"http://127.0.0.1:4318\"\n";
        assert_eq!(on(endpoint, &[]), Ok(false), "the OTLP spec's default");
        assert_eq!(
            on(endpoint, &[("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")]),
            Ok(true)
        );
        assert_eq!(
            on(
                endpoint,
                &[
                    ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
                    ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "none")
                ]
            ),
            Ok(false),
            "the signal's own variable first"
        );
        let file = format!("{endpoint}compression = \"none\"\n");
        assert_eq!(
            on(&file, &[("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")]),
            Ok(false),
            "the file wins"
        );
        let Err(problems) = on(&format!("{endpoint}compression = \"zstd\"\n"), &[]) else {
            panic!("an unknown compression")
        };
        assert_eq!(problems[0].1, "tracing.compression");
        assert!(problems[0].0.is_some(), "with its position");
    }

    #[test]
    fn route_tracing_forms() {
        #[derive(Deserialize)]
        struct R {
            tracing: RouteTracing,
        }
        let r = |t: &str| toml::from_str::<R>(t).map(|r| r.tracing);
        assert_eq!(r("tracing = false").ok(), Some(RouteTracing::Off));
        assert_eq!(r("tracing = true").ok(), Some(RouteTracing::Default));
        assert_eq!(
            r("tracing = { sample_ratio = 0.5 }").ok(),
            Some(RouteTracing::Ratio(0.5))
        );
        assert!(r("tracing = { sample_ratio = 2.0 }").is_err());
        assert!(r("tracing = { ratio = 0.5 }").is_err());
        assert!(r("tracing = 3").is_err());
    }
}

#[cfg(test)]
mod file_tests {
    use std::path::Path;

    use crate::{Config, Error};

    const BASE: &str = r#"
[[listeners]]
address = "127.0.0.1:8080"

[[upstreams]]
name = "api"
endpoints = [{ address = "127.0.0.1:9000" }]
"#;

    fn errors(text: &str, env: &[(&str, &str)]) -> Vec<String> {
        let lookup = |k: &str| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        };
        match Config::parse_with_env(text, "gw.toml", Path::new("."), &lookup) {
            Err(Error::Config(d)) => d.iter().map(ToString::to_string).collect(),
            Ok(_) => Vec::new(),
            Err(e) => vec![e.to_string()],
        }
    }

    #[test]
    fn each_error_is_reported_with_its_position() {
        let text = format!(
            r#"{BASE}
[[routes]]
id = "api"
upstream = "api"
tracing = {{ sample_ratio = 1.5 }}

[tracing]
endpoint = "ftp://collector"
protocol = "thrift"
sample_ratio = -0.1
batch_interval_ms = 0
"#
        );
        assert_eq!(
            errors(&text, &[("OTEL_TRACES_SAMPLER", "nonsense")]),
            [
                "gw.toml:12:11: routes[0]: sample_ratio 1.5 is not between 0.0 and 1.0",
                "gw.toml:15:12: tracing.endpoint: `ftp://collector` is not an http:// or https:// URL",
                "gw.toml:16:12: tracing.protocol: `thrift` is not one of \"http/protobuf\", \"grpc\"",
                "gw.toml:17:16: tracing.sample_ratio: -0.1 is not between 0.0 and 1.0",
                "gw.toml:18:21: tracing.batch_interval_ms: must be at least 1",
            ]
        );
    }

    #[test]
    fn environment_errors_name_the_variable() {
        assert_eq!(
            errors(
                BASE,
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                    ("OTEL_TRACES_SAMPLER", "sometimes")
                ]
            ),
            [
                "environment: OTEL_TRACES_SAMPLER: `sometimes` is not one of always_on, always_off, \
              traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio"
            ]
        );
    }

    #[test]
    fn a_valid_section_resolves() {
        let text = format!(
            "{BASE}\n[tracing]\nendpoint = \"http://127.0.0.1:4317\"\nprotocol = \"grpc\"\n\
             slow_ms = 250\nheaders = {{ x-token = \"t\" }}\n"
        );
        let lookup = |_: &str| None;
        let c = Config::parse_with_env(&text, "gw.toml", Path::new("."), &lookup).expect("valid");
        let t = c.tracing.expect("on");
        assert_eq!(t.slow_ms, 250);
        assert_eq!(t.headers, [("x-token".to_owned(), "t".to_owned())]);
        assert_eq!((t.batch_max_spans, t.queue_max_spans), (2048, 8192));
        assert_eq!(t.batch_max_bytes, None, "the exporter's default");
    }

    fn batch_and_queue(lines: &str) -> (usize, usize) {
        let text = format!("{BASE}\n[tracing]\nendpoint = \"http://127.0.0.1:4318\"\n{lines}");
        let lookup = |_: &str| None;
        let c = Config::parse_with_env(&text, "gw.toml", Path::new("."), &lookup).expect("valid");
        let t = c.tracing.expect("on");
        (t.batch_max_spans, t.queue_max_spans)
    }

    #[test]
    fn the_batch_defaults_to_a_smaller_queue_and_a_queue_below_a_set_batch_is_refused() {
        assert_eq!(batch_and_queue("queue_max_spans = 1024\n"), (1024, 1024));
        assert_eq!(
            batch_and_queue("queue_max_spans = 1024\nbatch_max_spans = 100\n"),
            (100, 1024)
        );
        let text = format!(
            "{BASE}\n[tracing]\nendpoint = \"http://127.0.0.1:4318\"\n\
             batch_max_spans = 4096\nqueue_max_spans = 1024\n"
        );
        assert_eq!(
            errors(&text, &[]),
            ["gw.toml:12:19: tracing.queue_max_spans: 1024 is below batch_max_spans (4096)"]
        );
        let text = format!(
            "{BASE}\n[tracing]\nendpoint = \"http://127.0.0.1:4318\"\nqueue_max_spans = 0\n"
        );
        assert_eq!(
            errors(&text, &[]),
            ["gw.toml:11:19: tracing.queue_max_spans: must be at least 1"]
        );
    }

    #[test]
    fn batch_max_bytes_is_taken_from_4096_up() {
        let text = format!(
            "{BASE}\n[tracing]\nendpoint = \"http://127.0.0.1:4318\"\nbatch_max_bytes = 1048576\n"
        );
        let lookup = |_: &str| None;
        let c = Config::parse_with_env(&text, "gw.toml", Path::new("."), &lookup).expect("valid");
        assert_eq!(c.tracing.expect("on").batch_max_bytes, Some(1 << 20));
        let text = format!(
            "{BASE}\n[tracing]\nendpoint = \"http://127.0.0.1:4318\"\nbatch_max_bytes = 4095\n"
        );
        assert_eq!(
            errors(&text, &[]),
            [
                "gw.toml:11:19: tracing.batch_max_bytes: 4095 is below 4096 (a span takes up to 1 KiB)"
            ]
        );
    }
}

//! A route's `timeouts = { connect_ms, request_ms, read_ms }` and
//! `retry = { attempts, on, backoff_ms, buffer_bytes }`: the config, the retry conditions
//! ([`Reason`]), and their checks.

use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use crate::limits::Timeouts;

/// The most tries a route may ask for: more would only multiply the load on a failing
/// upstream (the budget stops it anyway, but a config that asks for it is a mistake).
pub const MAX_ATTEMPTS: u32 = 10;
/// The longest `backoff_ms`: a retry is for a blip, and a client waits through it.
pub const MAX_BACKOFF_MS: u64 = 10_000;
/// The largest `retry.buffer_bytes` (1 MiB): a retry is for a blip, and a body much larger
/// than this is an upload whose resend the client is better placed to decide.
pub const MAX_BUFFER_BYTES: u64 = 1024 * 1024;

/// A route's `timeouts`: each one set overrides `[timeouts]` for the route (`0` disables it,
/// as there).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteTimeouts {
    /// TCP connect (and TLS handshake) to an endpoint.
    #[serde(default)]
    pub connect_ms: Option<u64>,
    /// From a try's dispatch to the upstream's response head.
    #[serde(default)]
    pub request_ms: Option<u64>,
    /// Between two reads of the upstream's response body.
    #[serde(default)]
    pub read_ms: Option<u64>,
}

/// A route's `retry`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Tries in all, the first included (1: none).
    #[serde(default = "default_attempts")]
    pub attempts: Spanned<u32>,
    /// Conditions that retry: `connect`, `502`, `503`, `504`, `timeout`.
    #[serde(default = "default_on")]
    pub on: Spanned<Vec<Spanned<String>>>,
    /// Backoff before the first retry, doubled for each next one (jittered).
    #[serde(default = "default_backoff_ms")]
    pub backoff_ms: Spanned<u64>,
    /// The largest request body kept while a try is in flight so that it can be sent again
    /// (the runtime's `replay`); a larger one is not retried.
    #[serde(default = "default_buffer_bytes")]
    pub buffer_bytes: Spanned<u64>,
}

fn default_attempts() -> Spanned<u32> {
    Spanned::new(0..0, 2)
}

fn default_on() -> Spanned<Vec<Spanned<String>>> {
    // A failed connect never reached the upstream: retrying it processes nothing twice.
    Spanned::new(0..0, vec![Spanned::new(0..0, "connect".to_owned())])
}

fn default_backoff_ms() -> Spanned<u64> {
    // 25 ms: Envoy's default base interval.
    Spanned::new(0..0, 25)
}

fn default_buffer_bytes() -> Spanned<u64> {
    // 64 KiB: Envoy's default per-request buffer for retries and nginx's
    // `client_body_buffer_size` on 64-bit (16 KiB) x 4: a JSON document or a form fits.
    Spanned::new(0..0, 64 * 1024)
}

/// Why a try was retried: the `on` condition it met, also the `reason` label of
/// `tailguard_upstream_retries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The connect (or TLS handshake) failed or timed out: nothing was sent.
    Connect,
    /// The upstream answered `502`.
    Status502,
    /// The upstream answered `503`.
    Status503,
    /// The upstream answered `504`.
    Status504,
    /// The try's `request_ms` passed before the response head.
    Timeout,
}

/// Every condition, in bit order.
pub const REASONS: [Reason; 5] = [
    Reason::Connect,
    Reason::Status502,
    Reason::Status503,
    Reason::Status504,
    Reason::Timeout,
];

impl Reason {
    /// The name as written in `on` and in the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Connect => "connect",
            Reason::Status502 => "502",
            Reason::Status503 => "503",
            Reason::Status504 => "504",
            Reason::Timeout => "timeout",
        }
    }

    /// The condition named `s` in `on`.
    pub fn parse(s: &str) -> Option<Reason> {
        REASONS.into_iter().find(|r| r.as_str() == s)
    }

    /// This condition's bit in a set of conditions (a `u8`).
    pub fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// The problems of a route's `retry` (with its `timeouts`, falling back to `global`), as
/// `(span, field, message)` with the field below the route (`retry.on[1]`).
pub fn check(
    retry: Option<&Spanned<RetryConfig>>,
    timeouts: Option<&Spanned<RouteTimeouts>>,
    global: &Timeouts,
) -> Vec<(Option<Range<usize>>, String, String)> {
    let mut out = Vec::new();
    let Some(retry) = retry.map(Spanned::get_ref) else {
        return out;
    };
    let span = |s: Range<usize>| (!s.is_empty()).then_some(s);
    let attempts = *retry.attempts.get_ref();
    if !(1..=MAX_ATTEMPTS).contains(&attempts) {
        out.push((
            span(retry.attempts.span()),
            "retry.attempts".to_owned(),
            format!("{attempts} is outside 1..={MAX_ATTEMPTS} (tries in all, the first included)"),
        ));
    }
    let backoff = *retry.backoff_ms.get_ref();
    if backoff > MAX_BACKOFF_MS {
        out.push((
            span(retry.backoff_ms.span()),
            "retry.backoff_ms".to_owned(),
            format!("{backoff} ms is above the {MAX_BACKOFF_MS} ms ceiling"),
        ));
    }
    let buffer = *retry.buffer_bytes.get_ref();
    if buffer > MAX_BUFFER_BYTES {
        out.push((
            span(retry.buffer_bytes.span()),
            "retry.buffer_bytes".to_owned(),
            format!(
                "{buffer} is above the {MAX_BUFFER_BYTES} ceiling (1 MiB: a larger body is an \
                 upload, not retried)"
            ),
        ));
    }
    if retry.on.get_ref().is_empty() {
        out.push((
            span(retry.on.span()),
            "retry.on".to_owned(),
            "names no condition; for no retries at all, set `attempts = 1`".to_owned(),
        ));
    }
    for (i, c) in retry.on.get_ref().iter().enumerate() {
        match Reason::parse(c.get_ref()) {
            Some(Reason::Timeout) => {
                let request_ms = timeouts
                    .and_then(|t| t.get_ref().request_ms)
                    .unwrap_or(global.request_ms);
                if request_ms == 0 {
                    out.push((
                        span(c.span()),
                        format!("retry.on[{i}]"),
                        "`timeout` needs a request timeout, and `request_ms` is 0 (disabled)"
                            .to_owned(),
                    ));
                }
            }
            Some(_) => {}
            None => out.push((
                span(c.span()),
                format!("retry.on[{i}]"),
                format!(
                    "`{}` is not a retry condition; expected one of `connect`, `502`, `503`, \
                     `504`, `timeout`",
                    c.get_ref()
                ),
            )),
        }
    }
    out
}

//! A route's timeouts and retry policy as built at config load: `timeouts = { connect_ms,
//! request_ms, read_ms }` and `retry = { attempts, on, backoff_ms, buffer_bytes }` from
//! their config ([`tailguard_config::retry`] has it and its checks), the conditions a try is
//! retried on, the backoff between tries, and the route's retry counters. The loops that
//! retry are the data path's (the proxy's `retry.rs`).

use std::sync::OnceLock;
use std::time::Duration;

use tailguard_metrics::{Counter, Family};
use toml::Spanned;

use tailguard_config::RouteConfig;
use tailguard_config::retry::REASONS;
use tailguard_http::error::Error;
use tailguard_http::replay::Unkept;

pub use tailguard_config::retry::Reason;

/// The backoff doubles from try to try up to this many times `backoff_ms`.
const MAX_BACKOFF_FACTOR: u32 = 8;

/// Why a try that met a retry condition was not retried: the `reason` label of
/// `tailguard_upstream_retries_skipped_total` (five values, a dense array per route).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// The method is not idempotent (`POST`, `PATCH`, `TRACE`, ...): never sent twice.
    Method,
    /// The body is larger than `retry.buffer_bytes` (declared, or grown past it).
    BodyTooLarge,
    /// The serving thread's budget for kept bodies had no room for it.
    BodyBudget,
    /// The client's body failed while it was being sent: nothing whole to send again.
    BodyFailed,
    /// The upstream's retry budget had no retry left.
    RetryBudget,
}

const SKIPS: [Skip; 5] = [
    Skip::Method,
    Skip::BodyTooLarge,
    Skip::BodyBudget,
    Skip::BodyFailed,
    Skip::RetryBudget,
];

impl Skip {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::Method => "method",
            Skip::BodyTooLarge => "body_too_large",
            Skip::BodyBudget => "body_budget",
            Skip::BodyFailed => "body_failed",
            Skip::RetryBudget => "retry_budget",
        }
    }
}

impl From<Unkept> for Skip {
    fn from(why: Unkept) -> Skip {
        match why {
            Unkept::TooLarge => Skip::BodyTooLarge,
            Unkept::Budget => Skip::BodyBudget,
            Unkept::Failed => Skip::BodyFailed,
        }
    }
}

/// A route's timeouts and retries as built at config load.
#[derive(Debug, Default)]
pub struct RoutePolicy {
    /// `timeouts.connect_ms` of the route (`None`: the global one).
    connect: Option<Option<Duration>>,
    /// `timeouts.request_ms` of the route.
    request: Option<Option<Duration>>,
    /// `timeouts.read_ms` of the route.
    read: Option<Option<Duration>>,
    /// `retry`, if the route has one.
    pub retry: Option<RetryPolicy>,
    /// `tailguard_upstream_retries_total` of the route, by reason.
    counters: RetryCounters,
    /// `stream_request`: forwarded before the body's first bytes arrive.
    pub stream_request: bool,
}

/// A route's `retry` as built at config load.
#[derive(Debug)]
pub struct RetryPolicy {
    /// Tries, the first included.
    pub attempts: u32,
    /// One bit per [`Reason`].
    on: u8,
    backoff: Duration,
    /// `buffer_bytes` (at most [`tailguard_config::retry::MAX_BUFFER_BYTES`], so it fits any
    /// `usize`).
    pub buffer_bytes: usize,
}

fn millis(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

impl RoutePolicy {
    /// Builds a route's policy from its validated config.
    pub fn build(config: &RouteConfig) -> RoutePolicy {
        let t = config
            .timeouts
            .as_ref()
            .map(|t| t.get_ref().clone())
            .unwrap_or_default();
        RoutePolicy {
            connect: t.connect_ms.map(millis),
            request: t.request_ms.map(millis),
            read: t.read_ms.map(millis),
            retry: config
                .retry
                .as_ref()
                .map(Spanned::get_ref)
                .map(|r| RetryPolicy {
                    attempts: *r.attempts.get_ref(),
                    on: r
                        .on
                        .get_ref()
                        .iter()
                        .filter_map(|c| Reason::parse(c.get_ref()))
                        .fold(0, |bits, r| bits | r.bit()),
                    backoff: Duration::from_millis(*r.backoff_ms.get_ref()),
                    buffer_bytes: usize::try_from(*r.buffer_bytes.get_ref()).unwrap_or(usize::MAX),
                }),
            counters: RetryCounters::default(),
            stream_request: config.stream_request,
        }
    }

    /// The route's connect timeout, else `global`.
    #[inline]
    pub fn connect_timeout(&self, global: Option<Duration>) -> Option<Duration> {
        self.connect.unwrap_or(global)
    }

    /// The route's request timeout (per try), else `global`.
    #[inline]
    pub fn request_timeout(&self, global: Option<Duration>) -> Option<Duration> {
        self.request.unwrap_or(global)
    }

    /// The route's response body read timeout, else `global`.
    #[inline]
    pub fn read_timeout(&self, global: Option<Duration>) -> Option<Duration> {
        self.read.unwrap_or(global)
    }

    /// Counts a retry of this route (a connect retry of a route without `retry` too) in
    /// `family` (`tailguard_upstream_retries_total`).
    pub fn count(&self, family: &Family<Counter>, route: &str, reason: Reason) {
        self.counters.inc(family, route, reason);
    }

    /// Counts a try of this route that met a retry condition and was not retried, in
    /// `family` (`tailguard_upstream_retries_skipped_total`).
    pub fn count_skipped(&self, family: &Family<Counter>, route: &str, skip: Skip) {
        let slot = &self.counters.skipped[skip as usize];
        inc_slot(slot, family, &[route, skip.as_str()]);
    }
}

impl RetryPolicy {
    /// Whether the route retries on `reason`.
    #[inline]
    pub fn retries_on(&self, reason: Reason) -> bool {
        self.on & reason.bit() != 0
    }

    /// Whether a try that sent its request may be retried (on a status or a timeout), so
    /// that a body has to be kept to be sent again.
    #[inline]
    pub fn retries_after_sending(&self) -> bool {
        self.on & !Reason::Connect.bit() != 0
    }

    /// The condition a failed try met, if the route retries on it.
    pub fn reason_of_error(&self, e: &Error) -> Option<Reason> {
        let reason = match e {
            Error::UpstreamConnect { .. }
            | Error::UpstreamTls { .. }
            | Error::UpstreamTimeout {
                phase: "connect", ..
            } => Reason::Connect,
            Error::UpstreamTimeout {
                phase: "request", ..
            } => Reason::Timeout,
            _ => return None,
        };
        self.retries_on(reason).then_some(reason)
    }

    /// The condition an answer met, if the route retries on it.
    pub fn reason_of_status(&self, status: u16) -> Option<Reason> {
        let reason = match status {
            502 => Reason::Status502,
            503 => Reason::Status503,
            504 => Reason::Status504,
            _ => return None,
        };
        self.retries_on(reason).then_some(reason)
    }

    /// The wait before retry number `retry` (1 for the first): `backoff_ms` doubled for
    /// each retry after the first (at most 8 times `backoff_ms`), then drawn uniformly from
    /// its upper half ("equal jitter": tries spread out, never bunched at zero). The draw is
    /// the serving thread's own generator: no lock, nothing shared.
    pub fn backoff(&self, retry: u32) -> Duration {
        let factor = 1u32 << retry.saturating_sub(1).min(MAX_BACKOFF_FACTOR.ilog2());
        let ceiling = self.backoff.saturating_mul(factor);
        let micros = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
        if micros == 0 {
            return Duration::ZERO;
        }
        Duration::from_micros(fastrand::u64(micros / 2..=micros))
    }
}

/// `tailguard_upstream_retries_total` of one route: a handle per reason, each created at
/// the route's first retry for that reason (a retry is the rare path; most routes never
/// make a series), then one relaxed add.
/// The same for `tailguard_upstream_retries_skipped_total`, by [`Skip`].
#[derive(Debug, Default)]
struct RetryCounters {
    table: [OnceLock<Counter>; REASONS.len()],
    skipped: [OnceLock<Counter>; SKIPS.len()],
}

impl RetryCounters {
    fn inc(&self, family: &Family<Counter>, route: &str, reason: Reason) {
        inc_slot(
            &self.table[reason as usize],
            family,
            &[route, reason.as_str()],
        );
    }
}

/// Adds one to the counter in `slot`, made from `family` with `labels` the first time.
fn inc_slot(slot: &OnceLock<Counter>, family: &Family<Counter>, labels: &[&str]) {
    let counter = match slot.get() {
        Some(c) => c,
        None => match family.get_or_create(labels) {
            Ok(c) => slot.get_or_init(|| c),
            Err(_) => return,
        },
    };
    counter.inc();
}

impl RoutePolicy {
    /// The route's connect override as the proxy's `retry::h2_stream` takes it.
    #[inline]
    pub fn h2_connect(&self) -> Option<Option<Duration>> {
        self.connect
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(backoff_ms: u64) -> RetryPolicy {
        RetryPolicy {
            attempts: 5,
            on: Reason::Connect.bit() | Reason::Status503.bit(),
            backoff: Duration::from_millis(backoff_ms),
            buffer_bytes: 64 * 1024,
        }
    }

    #[test]
    fn backoff_doubles_up_to_eight_times_within_its_upper_half() {
        let p = policy(100);
        for (retry, ceiling) in [(1, 100), (2, 200), (3, 400), (4, 800), (5, 800), (9, 800)] {
            for _ in 0..200 {
                let wait = p.backoff(retry);
                let ceiling = Duration::from_millis(ceiling);
                assert!(wait >= ceiling / 2 && wait <= ceiling, "{retry}: {wait:?}");
            }
        }
        assert_eq!(policy(0).backoff(3), Duration::ZERO);
    }

    #[test]
    fn only_the_listed_conditions_retry() {
        let p = policy(0);
        assert_eq!(p.reason_of_status(503), Some(Reason::Status503));
        assert_eq!(p.reason_of_status(502), None);
        assert_eq!(p.reason_of_status(200), None);
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
        let refused = Error::UpstreamConnect {
            addr,
            reason: String::new(),
        };
        assert_eq!(p.reason_of_error(&refused), Some(Reason::Connect));
        let connect_timeout = Error::UpstreamTimeout {
            addr,
            phase: "connect",
        };
        assert_eq!(p.reason_of_error(&connect_timeout), Some(Reason::Connect));
        let head_timeout = Error::UpstreamTimeout {
            addr,
            phase: "request",
        };
        assert_eq!(p.reason_of_error(&head_timeout), None, "not listed");
        let broken = Error::UpstreamBroken {
            addr,
            reason: String::new(),
        };
        assert_eq!(
            p.reason_of_error(&broken),
            None,
            "never: it may have been processed"
        );
    }
}

//! `tailguard_auth_requests_total{route,auth,result}`: the family, registered once, and a
//! route's handles, made when its config is loaded (one counter per result), so a request
//! counts with one relaxed add and no lookup.

use tailguard_metrics::{Counter, Family, Gauge, MetricsError, Registry};

use crate::result::AuthResult;

/// The auth metric families.
#[derive(Debug, Clone)]
pub struct AuthMetrics {
    requests: Family<Counter>,
    jwks_success: Family<Gauge>,
    jwks_failures: Family<Counter>,
    jwks_keys: Family<Gauge>,
}

impl AuthMetrics {
    /// Registers the families on `registry`.
    pub fn register(registry: &Registry) -> Result<AuthMetrics, MetricsError> {
        Ok(AuthMetrics {
            requests: registry.counter(
                "tailguard_auth_requests",
                "Requests of routes with `auth`, by route, the authenticator that decided \
                 (the one that accepted, or the one whose refusal was answered) and the \
                 result (one of a fixed set: ok, missing, invalid, invalid_signature, \
                 expired, not_yet_valid, wrong_issuer, wrong_audience, missing_claim, \
                 unknown_key, refused, auth_service_error, busy, keys_unavailable).",
                &["route", "auth", "result"],
            )?,
            jwks_success: registry.gauge(
                "tailguard_auth_jwks_last_success_timestamp_seconds",
                "Unix time a JWT authenticator's key set was last fetched or read; \
                 `time() - this` is its age (0: no set yet).",
                &["auth"],
            )?,
            jwks_failures: registry.counter(
                "tailguard_auth_jwks_refresh_failures",
                "Key set fetches or reads that failed (the last good set stayed in force).",
                &["auth"],
            )?,
            jwks_keys: registry.gauge(
                "tailguard_auth_jwks_keys",
                "Keys in a JWT authenticator's current key set.",
                &["auth"],
            )?,
        })
    }

    /// The counters of authenticator `auth` on route `route`, one per result.
    pub fn handles(&self, route: &str, auth: &str) -> Result<ResultCounters, MetricsError> {
        let mut out = Vec::with_capacity(AuthResult::ALL.len());
        for r in AuthResult::ALL {
            out.push(self.requests.get_or_create(&[route, auth, r.as_str()])?);
        }
        Ok(ResultCounters(out.into_boxed_slice()))
    }
}

impl AuthMetrics {
    /// The key set metrics of authenticator `auth`.
    pub fn key_set(&self, auth: &str) -> Result<crate::jwks::KeyMetrics, MetricsError> {
        Ok(crate::jwks::KeyMetrics {
            last_success: self.jwks_success.get_or_create(&[auth])?,
            failures: self.jwks_failures.get_or_create(&[auth])?,
            keys: self.jwks_keys.get_or_create(&[auth])?,
        })
    }
}

/// One counter per [`AuthResult`], indexed by it.
#[derive(Debug, Clone)]
pub struct ResultCounters(Box<[Counter]>);

impl ResultCounters {
    /// Counts one request that ended with `result`.
    #[inline]
    pub fn inc(&self, result: AuthResult) {
        if let Some(c) = self.0.get(result.index()) {
            c.inc();
        }
    }

    /// The count of `result` (tests and diagnostics).
    pub fn get(&self, result: AuthResult) -> u64 {
        self.0.get(result.index()).map_or(0, Counter::get)
    }
}

//! `tailguard_auth_requests_total{route,auth,result}`: the family, registered once, and a
//! route's handles, made when its config is loaded (one counter per result), so a request
//! counts with one relaxed add and no lookup.

use tailguard_metrics::{Counter, Family, MetricsError, Registry};

use crate::result::AuthResult;

/// The auth metric families.
#[derive(Debug, Clone)]
pub struct AuthMetrics {
    requests: Family<Counter>,
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
                 unknown_key, refused, auth_service_error, busy).",
                &["route", "auth", "result"],
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

//! Admission: the one place a request is let in or turned away, right after its head is
//! parsed and before routing, balancing or reading its body.

use crate::overload::{Admitted, Overload, Refused};

/// Held for as long as an admitted request is in flight (until its response finishes);
/// dropping it tells the admission controller the request left.
#[derive(Debug)]
pub struct AdmitGuard {
    admitted: Admitted,
}

impl AdmitGuard {
    /// The upstream answered: the request counts as served (a pass with its response time).
    #[inline]
    pub fn served(&mut self) {
        self.admitted.served();
    }

    /// The upstream did not answer within the request timeout: a response time for its
    /// concurrency limit, not a pass.
    #[inline]
    pub fn timed_out(&mut self) {
        self.admitted.timed_out();
    }
}

/// Seam: admission. The overload shedder decides here (in-flight against its limit, CPU
/// state), before any work is spent on the request; a refusal becomes `Error::Overloaded`
/// (503 with `Retry-After`, `Connection: close` when severe) without reading the body.
/// `/healthz` never reaches this. `route` is the request's matched route (its route group
/// and priority class decide), found once per request and then used for forwarding too.
/// `overload` is the snapshot's.
#[inline]
pub fn admit(overload: &Overload, route: Option<usize>) -> Result<AdmitGuard, Refused> {
    Ok(AdmitGuard {
        admitted: overload.admit(route)?,
    })
}

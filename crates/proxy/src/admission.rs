//! Admission: the one place a request is let in or turned away, right after its head is
//! parsed and before routing, balancing or reading its body.

use http::Request;

use crate::error::Error;
use crate::gateway::Snapshot;

/// Held for as long as an admitted request is in flight (until its response finishes);
/// dropping it tells the admission controller the request left.
#[derive(Debug)]
pub struct AdmitGuard {
    _private: (),
}

/// Seam: admission. The overload shedder decides here (in-flight against its limit, CPU
/// state), before any work is spent on the request; a refusal becomes `Error::Overloaded`
/// (503 with `Retry-After`) without reading the body. `/healthz` never reaches this.
/// Today every request is admitted.
pub fn admit<B>(snapshot: &Snapshot, request: &Request<B>) -> Result<AdmitGuard, Error> {
    let _ = (snapshot, request);
    Ok(AdmitGuard { _private: () })
}

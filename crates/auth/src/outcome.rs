//! What an authenticator decides about one request: let it through ([`Accepted`], with the
//! consumer and the changes to the request sent upstream) or answer it ([`Refusal`]), now
//! or later ([`Verdict`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, WWW_AUTHENTICATE};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};

use crate::result::AuthResult;
use crate::source::Source;

/// An authenticator's answer for one request.
#[derive(Debug)]
pub enum Outcome {
    /// The request may go on.
    Accepted(Accepted),
    /// The request is answered with this refusal (unless another authenticator of the
    /// route accepts it).
    Refused(Refusal),
}

/// A request let through.
#[derive(Debug, Default)]
pub struct Accepted {
    /// Who called (an API key's consumer, a token's `sub`, a basic-auth user): `$consumer`
    /// in the access log, a rate limit's `key = "consumer"`, the span's `enduser.id`.
    pub consumer: Option<Arc<str>>,
    /// Headers set on the request sent upstream (a token's claims, an auth service's
    /// answer). Their names must be among [`crate::Authenticate::sets_headers`], so the
    /// client's own copies were removed before any authenticator ran.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The credential removed from the request sent upstream (the upstream does not see
    /// the token or key unless the config says so).
    pub strip: Option<Source>,
}

impl Accepted {
    /// Applies the changes to the request about to be sent upstream.
    pub fn apply(&self, uri: &mut Uri, headers: &mut HeaderMap) {
        if let Some(source) = &self.strip {
            source.remove(uri, headers);
        }
        for (name, value) in &self.headers {
            headers.insert(name.clone(), value.clone());
        }
    }
}

/// A refused request's answer: status, head fields and a short body. Never names the
/// credential (a token is never written to a log, a trace or an error).
#[derive(Debug, Clone)]
pub struct Refusal {
    /// Why: the metric label and `$auth_result`.
    pub result: AuthResult,
    /// `401`, `403`, `503`, or an auth service's own status.
    pub status: StatusCode,
    /// `WWW-Authenticate`, `Content-Type`, an auth service's `Location`...
    pub headers: HeaderMap,
    /// The body (a line of text, or an auth service's own body).
    pub body: Bytes,
}

impl Refusal {
    /// A `401` with `WWW-Authenticate: challenge` and a one-line text body.
    pub fn unauthorized(result: AuthResult, challenge: HeaderValue) -> Refusal {
        let mut r = Refusal::text(result, StatusCode::UNAUTHORIZED);
        r.headers.insert(WWW_AUTHENTICATE, challenge);
        r
    }

    /// An answer with `status` and its reason as a one-line text body.
    pub fn text(result: AuthResult, status: StatusCode) -> Refusal {
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        let reason = status.canonical_reason().unwrap_or("refused");
        Refusal {
            result,
            status,
            headers,
            body: Bytes::from(format!("{reason}\n")),
        }
    }
}

impl Refusal {
    /// The gRPC status a gRPC client reads for this answer, as gRPC maps HTTP statuses
    /// (`doc/http-grpc-status-mapping.md`): `401` UNAUTHENTICATED (16), `403`
    /// PERMISSION_DENIED (7), `429` / `502` / `503` / `504` UNAVAILABLE (14), `400`
    /// INTERNAL (13), `404` UNIMPLEMENTED (12), anything else UNKNOWN (2).
    pub fn grpc_status(&self) -> u8 {
        match self.status.as_u16() {
            400 => 13,
            401 => 16,
            403 => 7,
            404 => 12,
            429 | 502 | 503 | 504 => 14,
            _ => 2,
        }
    }

    /// This refusal as a gRPC client expects it: trailers-only (HTTP `200`,
    /// `content-type: application/grpc`, `grpc-status`, `grpc-message` with the HTTP
    /// reason, no body). `WWW-Authenticate` and `Retry-After` stay (a client may read them);
    /// the body and its type go (a gRPC client would take them for a message).
    pub fn into_grpc(self) -> Refusal {
        let code = self.grpc_status();
        let mut headers = HeaderMap::new();
        for name in [WWW_AUTHENTICATE, http::header::RETRY_AFTER] {
            for v in self.headers.get_all(&name) {
                headers.append(name.clone(), v.clone());
            }
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(
            HeaderName::from_static("grpc-status"),
            HeaderValue::from(u16::from(code)),
        );
        // The reason phrase is ASCII without `%`: no percent-encoding needed.
        let message = self.status.canonical_reason().unwrap_or("refused");
        headers.insert(
            HeaderName::from_static("grpc-message"),
            HeaderValue::from_static(message),
        );
        Refusal {
            result: self.result,
            status: StatusCode::OK,
            headers,
            body: Bytes::new(),
        }
    }
}

/// A boxed future of an [`Outcome`]: a check that runs elsewhere (a pool, another service).
pub type PendingOutcome = Pin<Box<dyn Future<Output = Outcome> + Send + 'static>>;

/// An authenticator's answer: decided on the spot (a key lookup, a cached token, a
/// signature cheap enough to check here), or to be awaited (a bcrypt hash computed on a
/// pool, a call to an auth service). Only the slow path allocates.
pub enum Verdict {
    /// Decided now, on the calling thread.
    Ready(Outcome),
    /// Decided later: the future is `'static` (it owns copies of what it needs from the
    /// request) and `Send`, so its work can run on another thread.
    Pending(PendingOutcome),
}

impl std::fmt::Debug for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Ready(o) => f.debug_tuple("Ready").field(o).finish(),
            Verdict::Pending(_) => f.write_str("Pending(..)"),
        }
    }
}

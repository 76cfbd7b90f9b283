//! The answers the gateway makes itself: a plain-text local answer, an error's response
//! (its status from [`Error::status`], its one log line), a rate limit's `429`, a gRPC
//! call's trailers-only answer, and the answer of a request its route's `auth` refused.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};
use tailguard_http::error::Error;
use tailguard_http::grpc;
use tailguard_policy::admission::AdmitGuard;
use tailguard_policy::rate_limit::Limited;

use crate::conn::Held;
use crate::finish::Finish;
use crate::log_every::Cause;
use crate::record::RequestRecord;
use crate::response_body::ResponseBody;

/// A plain-text answer with `status` and `body`.
pub(crate) fn local_response(
    status: StatusCode,
    body: &'static str,
    finish: Option<Finish>,
) -> Response<ResponseBody> {
    let mut resp = Response::new(ResponseBody::local(
        Bytes::from_static(body.as_bytes()),
        finish,
    ));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// The `429` of a request a rate limit refused (through [`error_response`]: counted,
/// logged, in the access log like any error), with `Retry-After`, `RateLimit` and
/// `RateLimit-Policy`.
pub(crate) fn rate_limited(
    limited: Limited,
    record: Box<RequestRecord>,
    held: Held,
) -> Response<ResponseBody> {
    let mut resp = error_response(limited.error(), record, held, None);
    limited.add_fields(resp.headers_mut());
    resp
}

/// Turns an error into its response (status from [`Error::status`], the only mapping) and
/// writes the request's one structured log line saying who was at fault.
pub(crate) fn error_response(
    err: Error,
    mut record: Box<RequestRecord>,
    held: Held,
    admitted: Option<AdmitGuard>,
) -> Response<ResponseBody> {
    let status = err.status();
    {
        let snapshot = held.snapshot();
        let route = record.route.map(|r| &*snapshot.router.get(r).id);
        let upstream = record
            .endpoint
            .map(|(u, e)| snapshot.upstreams[u].endpoints[e].addr);
        snapshot.metrics.gateway.error(err.kind(), err.blame());
        let blame = err.blame().as_str();
        macro_rules! line {
            ($level:ident) => {
                tracing::$level!(
                    target: "tailguard::request",
                    status = status.as_u16(),
                    kind = err.kind(),
                    blame,
                    retryable = err.retryable(),
                    route,
                    upstream = ?upstream,
                    method = %record.method,
                    uri = %record.uri,
                    remote = %record.remote,
                    "{err}"
                )
            };
        }
        match (&err, err.blame()) {
            // A shed request is counted in the overload metrics; a line per rejection at
            // `warn` would cost the very requests shed to save CPU (go-zero's breaker paid two
            // log lines per rejection), so it is only there for debugging.
            // The same for a rate limit's refusals and a refused address's: a flood of them
            // is what they are for.
            (Error::Overloaded | Error::RateLimited { .. } | Error::AddressDenied { .. }, _) => {
                line!(debug)
            }
            // What a client can cause by the thousand (bodies that never come, bodies broken
            // off): one line per interval with the count (`crate::log_every`).
            (Error::DownstreamTimeout { .. } | Error::DownstreamBody(_), _) => {
                line!(debug);
                let cause = match &err {
                    Error::DownstreamTimeout { .. } => Cause::DownstreamTimeout,
                    _ => Cause::DownstreamBody,
                };
                if let Some(count) = crate::log_every::note(cause, std::time::Instant::now()) {
                    tracing::info!(
                        target: "tailguard::request",
                        status = status.as_u16(),
                        kind = err.kind(),
                        blame,
                        count,
                        last_remote = %record.remote,
                        "{count} requests in the last {} s: {err}",
                        crate::log_every::INTERVAL.as_secs()
                    );
                }
            }
            // A client's mistake is routine for the gateway; an upstream's or our own is not.
            (_, tailguard_http::error::Blame::Downstream) => line!(info),
            _ => line!(warn),
        }
    }
    record.error = Some(err.kind());
    if record.grpc {
        // A gRPC client reads `grpc-status`; the HTTP status of a gRPC answer is 200.
        let code = err.grpc_status();
        record.status = StatusCode::OK.as_u16();
        record.grpc_status = Some(code);
        let finish = Finish {
            record,
            held,
            upstream_conn: None,
            _admitted: admitted,
        };
        return trailers_only(code, err.grpc_message(), Some(finish));
    }
    record.status = status.as_u16();
    let mut resp = local_response(
        status,
        err.reason(),
        Some(Finish {
            record,
            held,
            upstream_conn: None,
            _admitted: admitted,
        }),
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        resp.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

/// An answer with `code` and `message`, in one head that ends the stream: HTTP 200,
/// `content-type: application/grpc`, `grpc-status`, `grpc-message`, no body.
pub(crate) fn trailers_only(
    code: u8,
    message: &'static str,
    finish: Option<Finish>,
) -> Response<ResponseBody> {
    let mut resp = Response::new(ResponseBody::empty(finish));
    *resp.status_mut() = StatusCode::OK;
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    grpc::put_status(headers, code, message);
    resp
}

/// The answer of a request its route's `auth` refused: the authenticator's own status,
/// fields and body. Counted in `tailguard_auth_requests_total` (by the gate) and in the
/// requests' metrics and access log like any answer; no log line of its own (a flood of
/// bad credentials is the metric's to show, not the log's).
pub(crate) fn auth_refused(
    refusal: tailguard_auth::Refusal,
    mut record: Box<RequestRecord>,
    held: Held,
) -> Response<ResponseBody> {
    record.error = Some("auth_refused");
    // A gRPC client reads `grpc-status` (16 unauthenticated, 7 permission denied, 14
    // unavailable), in a trailers-only answer, as for the gateway's own errors.
    let refusal = if record.grpc {
        record.grpc_status = Some(refusal.grpc_status());
        refusal.into_grpc()
    } else {
        refusal
    };
    record.status = refusal.status.as_u16();
    record.auth_result = Some(refusal.result);
    let finish = Finish {
        record,
        held,
        upstream_conn: None,
        _admitted: None,
    };
    let body = if refusal.body.is_empty() {
        // No DATA frame: a gRPC trailers-only answer is one HEADERS frame that ends the
        // stream.
        ResponseBody::empty(Some(finish))
    } else {
        ResponseBody::local(refusal.body, Some(finish))
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = refusal.status;
    *resp.headers_mut() = refusal.headers;
    resp
}

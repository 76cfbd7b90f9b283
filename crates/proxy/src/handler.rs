//! The gateway behind the HTTP/1.1 engine: the [`Handler`](http1_server::Handler) a
//! downstream HTTP/1.1 connection hands each parsed request to, which serves it through
//! the data path ([`crate::data_path::serve`]) and counts and logs the heads it refused.

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use tailguard_http::body::{IncomingBody, RequestBody};
use tailguard_http::error::Error;
use tailguard_http::recycle;
use tailguard_http1::server::{self as http1_server, H1Body};
use tailguard_http1::timer::LazyTimer;

use crate::conn::ConnCtx;
use crate::response_body::ResponseBody;

/// A downstream HTTP/1.1 connection's handler: the gateway behind the HTTP/1.1 engine.
#[derive(Debug)]
pub(crate) struct Http1Handler(pub(crate) Arc<ConnCtx>);

impl http1_server::Handler for Http1Handler {
    type Body = RequestBody;
    type ResponseBody = ResponseBody;

    fn new_request(&self, fields: usize) -> Box<Request<RequestBody>> {
        recycle::request(fields)
    }

    fn attach_body(&self, req: &mut Request<RequestBody>, body: H1Body) {
        *req.body_mut() = RequestBody::unlimited(IncomingBody::Http1(body));
    }

    async fn serve(
        &self,
        req: Box<Request<RequestBody>>,
        timer: &mut LazyTimer,
    ) -> Response<ResponseBody> {
        crate::data_path::serve(&self.0, req, timer)
            .await
            .unwrap_or_else(crate::data_path::Refused::answer)
    }

    fn refused(&self, err: tailguard_http1::RequestError) -> (StatusCode, &'static str) {
        let err = Error::from(err);
        let status = err.status();
        self.0
            .snapshot
            .metrics
            .gateway
            .error(err.kind(), err.blame());
        tracing::debug!(
            target: "tailguard::request",
            status = status.as_u16(),
            kind = err.kind(),
            blame = err.blame().as_str(),
            retryable = false,
            remote = %self.0.remote,
            "{err}"
        );
        // A flood of bad heads or slowloris connections (each a `408`) is one line per
        // interval with its count, the last one's details in it (`crate::log_every`).
        let cause = crate::log_every::Cause::RefusedHead;
        if let Some(count) = crate::log_every::note(cause, std::time::Instant::now()) {
            tracing::info!(
                target: "tailguard::request",
                status = status.as_u16(),
                kind = err.kind(),
                blame = err.blame().as_str(),
                retryable = false,
                remote = %self.0.remote,
                count,
                "{count} request heads refused in the last {} s, the last: {err}",
                crate::log_every::INTERVAL.as_secs()
            );
        }
        (status, err.reason())
    }
}

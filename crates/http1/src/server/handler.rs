//! The interface between the engine and the gateway above it: the [`Handler`] a connection
//! hands its requests to, the body it writes back, and the drain it watches.

use std::future::Future;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;

use super::body::H1Body;
use crate::client::RawFields;
use crate::error::RequestError;
use crate::timer::LazyTimer;

/// What the gateway does with the requests of a connection: the small interface between the
/// HTTP/1.1 engine and everything above it (routing, metrics, the access log).
pub trait Handler {
    /// The body type of the handler's requests (which carries an [`H1Body`]).
    type Body;
    /// The body type of its responses.
    type ResponseBody: OutgoingBody;

    /// An empty request (`GET /`, HTTP/1.1, no fields, an empty body) with room for at least
    /// `fields` fields: the engine fills it from the parsed head. A handler recycles these.
    fn new_request(&self, fields: usize) -> Box<Request<Self::Body>>;

    /// Makes `body` the request's body.
    fn attach_body(&self, req: &mut Request<Self::Body>, body: H1Body);

    /// Serves one request from its head to the response head. `timer` is the connection's,
    /// kept across its requests, for the handler's own request timeout.
    fn serve(
        &self,
        req: Box<Request<Self::Body>>,
        timer: &mut LazyTimer,
    ) -> impl Future<Output = Response<Self::ResponseBody>>;

    /// A head was refused before it reached [`Handler::serve`] (logged and counted there):
    /// the status and the short text the connection answers with before it closes.
    fn refused(&self, err: RequestError) -> (StatusCode, &'static str);
}

/// A response body the connection writes, which may carry the upstream's field lines as
/// they came ([`RawFields`]) instead of in its response's map.
pub trait OutgoingBody: Body<Data = Bytes> + Unpin {
    /// The upstream response's fields as it sent them, when they were kept as lines (then
    /// the response's map holds only what the gateway added).
    fn raw_fields(&self) -> Option<&RawFields> {
        None
    }
}

/// The server's drain, as a connection sees it.
pub trait Shutdown {
    /// Ready once the server drains; registers the task to be woken then.
    fn poll_draining(&mut self, cx: &mut Context<'_>) -> Poll<()>;
    /// Whether the server drains.
    fn is_draining(&self) -> bool;
}

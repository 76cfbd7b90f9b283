//! Per-thread free lists for the containers of finished requests (the request box with the
//! header map of its head), so that a request on a warm connection does not allocate them
//! anew. Response heads' maps are recycled the same way by `tailguard_http1::recycle`.
//!
//! A request head used to cost three allocations and three frees for its containers alone
//! (the box, a header map's index table and its entry vector) and its response head two
//! more. A container that served a request goes back to its serving thread's list when the
//! request no longer needs it (the head written upstream, the response head written
//! downstream); the next request takes it from there, already sized. Lists are short and
//! per thread (no lock, nothing shared), and a container grown unusually large is dropped
//! rather than kept.

use std::cell::RefCell;

use http::Request;

use crate::body::{IncomingBody, RequestBody};

/// How many of each container a serving thread keeps: enough for the requests in flight on
/// a busy thread; beyond it, containers are freed.
const KEEP: usize = 256;
use tailguard_http1::recycle::LARGEST_KEPT;

thread_local! {
    // The boxes themselves are what is recycled (a request moves as one pointer).
    #[allow(clippy::vec_box)]
    static REQUESTS: RefCell<Vec<Box<Request<RequestBody>>>> = const { RefCell::new(Vec::new()) };
}

/// An empty request (GET /, HTTP/1.1, no headers, no body) whose header map has room for at
/// least `fields` entries.
#[inline]
pub fn request(fields: usize) -> Box<Request<RequestBody>> {
    let mut req = REQUESTS
        .with_borrow_mut(Vec::pop)
        .unwrap_or_else(|| Box::new(Request::new(RequestBody::unlimited(IncomingBody::Empty))));
    req.headers_mut().reserve(fields);
    req
}

/// Takes back a request that is done with (its head was sent); what it still holds
/// (header values, extensions, body) is dropped now.
#[inline]
pub fn give_request(mut req: Box<Request<RequestBody>>) {
    if req.headers().capacity() > LARGEST_KEPT {
        return;
    }
    req.headers_mut().clear();
    req.extensions_mut().clear();
    *req.body_mut() = RequestBody::unlimited(IncomingBody::Empty);
    *req.method_mut() = http::Method::GET;
    *req.uri_mut() = http::Uri::default();
    *req.version_mut() = http::Version::HTTP_11;
    REQUESTS.with_borrow_mut(|kept| {
        if kept.len() < KEEP {
            kept.push(req);
        }
    });
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn a_request_given_back_comes_back_empty_with_its_room() {
        let mut req = request(8);
        req.headers_mut()
            .insert("x-a", HeaderValue::from_static("1"));
        *req.uri_mut() = http::Uri::from_static("/somewhere?q");
        *req.method_mut() = http::Method::POST;
        req.extensions_mut().insert(7u32);
        let room = req.headers().capacity();
        let at = std::ptr::from_ref(&*req) as usize;
        give_request(req);
        let again = request(4);
        assert_eq!(std::ptr::from_ref(&*again) as usize, at, "the same box");
        assert!(again.headers().is_empty());
        assert_eq!(again.headers().capacity(), room);
        assert_eq!(again.uri(), "/");
        assert_eq!(again.method(), http::Method::GET);
        assert!(again.extensions().get::<u32>().is_none());
    }
}

//! The client's response-head parser on any bytes: it never panics, frames bodies as
//! RFC 9112 §6.3 says, and gives the same answer however the bytes arrive.
#![no_main]

use bytes::BytesMut;
use http::StatusCode;
use libfuzzer_sys::fuzz_target;
use tailguard_http1::client::parse_response_head;
use tailguard_http1::framing::Framing;

fuzz_target!(|data: &[u8]| {
    let [flags, cut, rest @ ..] = data else {
        return;
    };
    let head_request = flags & 1 == 1;
    let mut buf = BytesMut::from(rest);
    let whole = parse_response_head(&mut buf, head_request);
    let consumed = rest.len() - buf.len();
    if let Ok(Some((status, framing, keep_alive))) = &whole {
        assert!(!status.is_informational() || *status == StatusCode::SWITCHING_PROTOCOLS);
        let bodiless = head_request
            || *status == StatusCode::NO_CONTENT
            || *status == StatusCode::NOT_MODIFIED
            || *status == StatusCode::SWITCHING_PROTOCOLS;
        if bodiless {
            assert!(
                matches!(framing, Framing::Done),
                "{status} with a body: {framing:?}"
            );
        }
        if *status == StatusCode::SWITCHING_PROTOCOLS || matches!(framing, Framing::UntilClose) {
            assert!(!keep_alive, "{status} {framing:?} kept alive");
        }
    }
    let cut = usize::from(*cut) * rest.len() / 256;
    let mut prefix = BytesMut::from(&rest[..cut]);
    match (parse_response_head(&mut prefix, head_request), &whole) {
        (Ok(None), _) | (Err(_), Err(_)) => {}
        (Ok(Some(p)), Ok(Some(w))) => {
            assert_eq!(p.0, w.0);
            assert_eq!(cut - prefix.len(), consumed);
        }
        // A prefix that ends inside interim 1xx heads skipped whole is still a prefix.
        (Ok(Some(_)), _) | (Err(_), Ok(_)) => {
            panic!("a prefix of {cut} bytes disagrees with the whole")
        }
    }
});

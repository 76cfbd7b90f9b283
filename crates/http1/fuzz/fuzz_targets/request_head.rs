//! The request-head parser on any bytes: it never panics, never keeps a framing field, and
//! gives the same answer however the bytes arrive.
#![no_main]

use bytes::BytesMut;
use http::{Method, Request};
use libfuzzer_sys::fuzz_target;
use tailguard_http1::RequestError;
use tailguard_http1::framing::Framing;
use tailguard_http1::request::{self, Parsed};

fn parse(bytes: &[u8], limit: usize) -> (Result<Option<Parsed<()>>, RequestError>, usize) {
    let mut buf = BytesMut::from(bytes);
    let parsed = request::parse(&mut buf, limit, |_| Box::new(Request::new(())));
    (parsed, bytes.len() - buf.len())
}

fuzz_target!(|data: &[u8]| {
    let [choice, cut, rest @ ..] = data else {
        return;
    };
    let limit = [48, 1024, 16 * 1024][usize::from(*choice) % 3];
    let (whole, consumed) = parse(rest, limit);
    match &whole {
        Ok(Some((req, meta, framing))) => {
            assert!(consumed <= limit, "a head over the limit was taken");
            assert!(rest[..consumed].ends_with(b"\n"));
            for framing_field in ["content-length", "transfer-encoding"] {
                assert!(
                    !req.headers().contains_key(framing_field),
                    "{framing_field} kept"
                );
            }
            assert!(req.headers().get_all("host").iter().count() <= 1);
            if let Some(host) = req.headers().get("host") {
                assert!(request::valid_host(host.as_bytes()), "{host:?}");
            }
            assert_ne!(req.method(), Method::CONNECT);
            let target = req.uri().to_string();
            assert!(
                target.starts_with('/')
                    || (target == "*" && req.method() == Method::OPTIONS)
                    || req.uri().scheme_str().is_some_and(
                        |s| s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https")
                    ),
                "target {target:?}"
            );
            match (meta.declared, framing) {
                (None | Some(0), Framing::Done) | (None, Framing::Chunked(_)) => {}
                (Some(n), Framing::Length(m)) if n == *m && n > 0 => {}
                other => panic!("declared and framing disagree: {other:?}"),
            }
        }
        Ok(None) => assert!(rest.len() <= limit, "more than the limit held as partial"),
        Err(_) => {}
    }
    // The same bytes cut short: no answer yet, or the same answer.
    let cut = usize::from(*cut) * rest.len() / 256;
    let (prefix, prefix_consumed) = parse(&rest[..cut], limit);
    match (&prefix, &whole) {
        (Ok(None), _) | (Err(_), Err(_)) => {}
        (Ok(Some(_)), Ok(Some(_))) => assert_eq!(prefix_consumed, consumed),
        (p, w) => panic!(
            "a prefix of {cut} bytes gave {:?}, the whole {:?}",
            p.as_ref().map(|o| o.is_some()),
            w.as_ref().map(|o| o.is_some())
        ),
    }
});

//! CORS on real sockets, case by case as the Fetch standard's CORS protocol lists them:
//! an allowed and a refused origin, a wildcard subdomain, credentials (never with `*`),
//! preflights allowed and refused (origin, method, header) and answered without the
//! upstream or a rate limit, an `OPTIONS` that is no preflight forwarded, an upstream's
//! own `Vary` merged and its own CORS fields replaced; over HTTP/1.1 and HTTP/2 (h2c), and
//! the config's errors with file:line:column.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderMap, Method, Request};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tailguard_test_support::{TestBody, Upstream, h2c_client, http1_client};

use crate::support::{self, empty, within};

const APP: &str = "https://app.example";

/// A route `api` with `cors` (credentials, the test's origins), a route `open` allowing
/// every origin without credentials, a route `put` matching `PUT` only, and a route `plain`
/// without CORS, all to `upstream`; `extra` goes in the `api` route.
fn gateway(upstream: SocketAddr, extra: &str) -> (tailguard_proxy::Server, String) {
    support::start(support::with_listener(&format!(
        r#"
[[upstreams]]
name = "up"
endpoints = [{{ address = "{upstream}" }}]

[[routes]]
id = "api"
upstream = "up"
path = {{ prefix = "/api" }}
cors = {{ origins = ["{APP}", "https://*.example.com"], methods = ["PUT", "DELETE"], headers = ["x-token", "content-type"], expose_headers = ["x-request-id"], credentials = true, max_age_s = 600 }}
{extra}

[[routes]]
id = "open"
upstream = "up"
path = {{ prefix = "/open" }}
cors = {{ origins = ["*"] }}

[[routes]]
id = "put"
upstream = "up"
path = {{ prefix = "/put-only" }}
method = "PUT"
cors = {{ origins = ["{APP}"], methods = ["PUT"] }}

[[routes]]
id = "plain"
upstream = "up"
"#
    )))
}

/// Sends `method url` with `fields`; the status, the response's fields and its body.
async fn send(
    client: &Client<HttpConnector, TestBody>,
    method: Method,
    url: &str,
    fields: &[(&str, &str)],
) -> (u16, HeaderMap, String) {
    let mut req = Request::builder().method(method).uri(url);
    for (n, v) in fields {
        req = req.header(*n, *v);
    }
    let resp = within(client.request(req.body(empty()).expect("request")))
        .await
        .expect("an answer");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, headers, support::text(resp).await)
}

fn values<'a>(headers: &'a HeaderMap, name: &str) -> Vec<&'a str> {
    headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().expect("ascii"))
        .collect()
}

/// No `Access-Control-*` field at all.
fn no_cors_fields(headers: &HeaderMap) -> bool {
    !headers
        .keys()
        .any(|k| k.as_str().starts_with("access-control-"))
}

fn clients() -> [(&'static str, Client<HttpConnector, TestBody>); 2] {
    [("HTTP/1.1", http1_client()), ("HTTP/2", h2c_client())]
}

#[tokio::test]
async fn an_allowed_origin_is_reflected_with_credentials_and_a_refused_one_never() {
    let upstream = Upstream::builder().body("data").start().await;
    let (_server, url) = gateway(upstream.addr, "");
    for (proto, client) in clients() {
        let (status, h, body) = send(
            &client,
            Method::GET,
            &format!("{url}/api/x"),
            &[("origin", APP)],
        )
        .await;
        assert_eq!((status, body.as_str()), (200, "data"), "{proto}");
        assert_eq!(values(&h, "access-control-allow-origin"), [APP], "{proto}");
        assert_eq!(
            values(&h, "access-control-allow-credentials"),
            ["true"],
            "{proto}"
        );
        assert_eq!(
            values(&h, "access-control-expose-headers"),
            ["x-request-id"],
            "{proto}"
        );
        assert_eq!(values(&h, "vary"), ["Origin"], "{proto}");

        // A wildcard subdomain, at any depth.
        for origin in ["https://a.example.com", "https://b.c.example.com"] {
            let (_, h, _) = send(
                &client,
                Method::GET,
                &format!("{url}/api/x"),
                &[("origin", origin)],
            )
            .await;
            assert_eq!(
                values(&h, "access-control-allow-origin"),
                [origin],
                "{proto}"
            );
        }

        // Refused: the apex of the wildcard, a look-alike, another scheme or port, `null`.
        // The request is still served (the browser keeps the answer from the page), but
        // nothing tells the browser it may read it.
        for origin in [
            "https://example.com",
            "https://evil-example.com",
            "https://a.example.com.evil.test",
            "http://app.example",
            "https://app.example:8443",
            "null",
        ] {
            let (status, h, _) = send(
                &client,
                Method::GET,
                &format!("{url}/api/x"),
                &[("origin", origin)],
            )
            .await;
            assert_eq!(status, 200, "{proto} {origin}");
            assert!(no_cors_fields(&h), "{proto} {origin}: {h:?}");
            assert_eq!(values(&h, "vary"), ["Origin"], "{proto} {origin}");
        }

        // No `Origin`: not a CORS request; only `Vary`, so no cache mixes the two.
        let (_, h, _) = send(&client, Method::GET, &format!("{url}/api/x"), &[]).await;
        assert!(no_cors_fields(&h), "{proto}: {h:?}");
        assert_eq!(values(&h, "vary"), ["Origin"], "{proto}");

        // A route without `cors` leaves the response alone.
        let (_, h, _) = send(
            &client,
            Method::GET,
            &format!("{url}/x"),
            &[("origin", APP)],
        )
        .await;
        assert!(
            no_cors_fields(&h) && h.get("vary").is_none(),
            "{proto}: {h:?}"
        );
    }
}

#[tokio::test]
async fn any_origin_without_credentials_is_answered_with_a_star() {
    let upstream = Upstream::start().await;
    let (_server, url) = gateway(upstream.addr, "");
    for (proto, client) in clients() {
        let (_, h, _) = send(
            &client,
            Method::GET,
            &format!("{url}/open"),
            &[("origin", "https://any.test")],
        )
        .await;
        assert_eq!(values(&h, "access-control-allow-origin"), ["*"], "{proto}");
        assert!(
            h.get("access-control-allow-credentials").is_none(),
            "{proto}"
        );
    }
}

#[tokio::test]
async fn a_preflight_is_answered_by_the_gateway_with_what_the_route_allows() {
    let upstream = Upstream::start().await;
    let (_server, url) = gateway(upstream.addr, "");
    for (proto, client) in clients() {
        let (status, h, body) = send(
            &client,
            Method::OPTIONS,
            &format!("{url}/api/items/1"),
            &[
                ("origin", "https://a.example.com"),
                ("access-control-request-method", "PUT"),
                ("access-control-request-headers", "content-type,x-token"),
            ],
        )
        .await;
        assert_eq!((status, body.as_str()), (204, ""), "{proto}");
        assert_eq!(
            values(&h, "access-control-allow-origin"),
            ["https://a.example.com"],
            "{proto}"
        );
        assert_eq!(
            values(&h, "access-control-allow-methods"),
            ["PUT, DELETE"],
            "{proto}"
        );
        assert_eq!(
            values(&h, "access-control-allow-headers"),
            ["x-token, content-type"],
            "{proto}"
        );
        assert_eq!(values(&h, "access-control-max-age"), ["600"], "{proto}");
        assert_eq!(
            values(&h, "access-control-allow-credentials"),
            ["true"],
            "{proto}"
        );
        assert_eq!(
            values(&h, "vary"),
            ["Origin, Access-Control-Request-Method, Access-Control-Request-Headers"],
            "{proto}"
        );
    }
    assert_eq!(
        upstream.requests(),
        0,
        "a preflight never reaches the upstream"
    );
}

#[tokio::test]
async fn a_preflight_asking_for_what_is_not_allowed_gets_no_cors_fields() {
    let upstream = Upstream::start().await;
    let (_server, url) = gateway(upstream.addr, "");
    let refused: [(&str, &str, &str, &str); 4] = [
        ("origin", "https://evil.test", "PUT", ""),
        ("method", APP, "PATCH", ""),
        ("lowercase method", APP, "put", ""),
        ("header", APP, "PUT", "x-token, x-admin"),
    ];
    for (proto, client) in clients() {
        for (what, origin, method, fields) in refused {
            let mut asked = vec![
                ("origin", origin),
                ("access-control-request-method", method),
            ];
            if !fields.is_empty() {
                asked.push(("access-control-request-headers", fields));
            }
            let (status, h, _) =
                send(&client, Method::OPTIONS, &format!("{url}/api/x"), &asked).await;
            assert_eq!(status, 204, "{proto}: refused {what}");
            assert!(no_cors_fields(&h), "{proto}: refused {what}: {h:?}");
            assert!(h.get("vary").is_some(), "{proto}: refused {what}");
        }
        // A safelisted method needs no listing.
        let (_, h, _) = send(
            &client,
            Method::OPTIONS,
            &format!("{url}/api/x"),
            &[
                ("origin", APP),
                ("access-control-request-method", "POST"),
                ("access-control-request-headers", "x-token"),
            ],
        )
        .await;
        assert_eq!(values(&h, "access-control-allow-origin"), [APP], "{proto}");
    }
    assert_eq!(
        upstream.requests(),
        0,
        "a refused preflight never reaches the upstream"
    );
}

#[tokio::test]
async fn an_options_that_is_no_preflight_goes_to_the_upstream() {
    let upstream = Upstream::start().await;
    let (_server, url) = gateway(upstream.addr, "rewrite = { prefix = \"/echo\" }");
    let mut sent = 0;
    for (proto, client) in clients() {
        // Without `Access-Control-Request-Method`, or without `Origin`: an ordinary OPTIONS.
        for fields in [
            &[("origin", APP)][..],
            &[("access-control-request-method", "PUT")][..],
        ] {
            let (status, h, body) =
                send(&client, Method::OPTIONS, &format!("{url}/api/x"), fields).await;
            sent += 1;
            assert_eq!(status, 200, "{proto}");
            assert!(body.starts_with("OPTIONS /echo/x "), "{proto}: {body}");
            assert!(h.get("access-control-allow-methods").is_none(), "{proto}");
        }
        // A preflight for a route without `cors` is the upstream's to answer too.
        let (status, _, body) = send(
            &client,
            Method::OPTIONS,
            &format!("{url}/echo"),
            &[("origin", APP), ("access-control-request-method", "PUT")],
        )
        .await;
        sent += 1;
        assert_eq!(status, 200, "{proto}");
        assert!(body.starts_with("OPTIONS /echo"), "{proto}: {body}");
    }
    assert_eq!(upstream.requests(), sent);
}

#[tokio::test]
async fn a_preflight_is_routed_as_the_request_it_announces() {
    let upstream = Upstream::start().await;
    let (_server, url) = gateway(upstream.addr, "");
    // The route `put` matches `PUT` only; its preflight (an OPTIONS) is routed as a PUT.
    let (status, h, _) = send(
        &http1_client(),
        Method::OPTIONS,
        &format!("{url}/put-only"),
        &[("origin", APP), ("access-control-request-method", "PUT")],
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(values(&h, "access-control-allow-origin"), [APP]);
    assert_eq!(values(&h, "access-control-allow-methods"), ["PUT"]);
    assert_eq!(upstream.requests(), 0);
}

#[tokio::test]
async fn preflights_spend_no_rate_limit_and_a_refusal_carries_cors_fields() {
    let upstream = Upstream::start().await;
    let (_server, url) = gateway(
        upstream.addr,
        "rate_limit = { rate = 1, per = \"hour\", burst = 1 }",
    );
    let client = http1_client();
    let preflight = [("origin", APP), ("access-control-request-method", "DELETE")];
    for _ in 0..3 {
        let (status, h, _) = send(
            &client,
            Method::OPTIONS,
            &format!("{url}/api/x"),
            &preflight,
        )
        .await;
        assert_eq!(status, 204);
        assert_eq!(values(&h, "access-control-allow-origin"), [APP]);
    }
    let (status, _, _) = send(
        &client,
        Method::DELETE,
        &format!("{url}/api/x"),
        &[("origin", APP)],
    )
    .await;
    assert_eq!(
        status, 200,
        "the preflights left the one request of the hour"
    );
    // The next is refused, and the page can read why.
    let (status, h, _) = send(
        &client,
        Method::DELETE,
        &format!("{url}/api/x"),
        &[("origin", APP)],
    )
    .await;
    assert_eq!(status, 429);
    assert_eq!(values(&h, "access-control-allow-origin"), [APP]);
    assert_eq!(values(&h, "vary"), ["Origin"]);
    assert_eq!(upstream.requests(), 1);
}

/// An HTTP/1.1 upstream that answers every request with its own `Vary` and CORS fields (an
/// upstream that reflects `*`, as one left over from before the gateway would).
async fn upstream_with_its_own_cors(vary: &'static str) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req| async move {
                    let resp = http::Response::builder()
                        .header("vary", vary)
                        .header("access-control-allow-origin", "*")
                        .header("access-control-allow-credentials", "true")
                        .header("x-request-id", "r-1")
                        .body(Full::new(Bytes::from_static(b"upstream")))
                        .expect("response");
                    Ok::<_, std::convert::Infallible>(resp)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn the_upstreams_vary_is_kept_beside_origin_and_its_cors_fields_replaced() {
    let addr = upstream_with_its_own_cors("Accept-Encoding").await;
    let (_server, url) = gateway(addr, "");
    for (proto, client) in clients() {
        let (_, h, body) = send(
            &client,
            Method::GET,
            &format!("{url}/api/x"),
            &[("origin", APP)],
        )
        .await;
        assert_eq!(body, "upstream", "{proto}");
        assert_eq!(
            values(&h, "access-control-allow-origin"),
            [APP],
            "{proto}: never `*`"
        );
        assert_eq!(
            values(&h, "access-control-allow-credentials"),
            ["true"],
            "{proto}"
        );
        assert_eq!(
            values(&h, "x-request-id"),
            ["r-1"],
            "{proto}: other fields pass"
        );
        let mut vary = values(&h, "vary");
        vary.sort_unstable();
        assert_eq!(vary, ["Accept-Encoding", "Origin"], "{proto}");

        // A refused origin: the upstream's `*` is not passed on either.
        let (_, h, _) = send(
            &client,
            Method::GET,
            &format!("{url}/api/x"),
            &[("origin", "https://evil.test")],
        )
        .await;
        assert!(no_cors_fields(&h), "{proto}: {h:?}");

        // Without `Origin` the upstream's answer passes as it came, `Vary: Origin` added.
        let (_, h, _) = send(&client, Method::GET, &format!("{url}/api/x"), &[]).await;
        assert_eq!(values(&h, "access-control-allow-origin"), ["*"], "{proto}");
        let mut vary = values(&h, "vary");
        vary.sort_unstable();
        assert_eq!(vary, ["Accept-Encoding", "Origin"], "{proto}");
    }
    // An upstream whose `Vary` already names `Origin` gets no second one.
    let addr = upstream_with_its_own_cors("origin, Accept-Encoding").await;
    let (_server, url) = gateway(addr, "");
    for (proto, client) in clients() {
        let (_, h, _) = send(
            &client,
            Method::GET,
            &format!("{url}/api/x"),
            &[("origin", APP)],
        )
        .await;
        assert_eq!(values(&h, "vary"), ["origin, Accept-Encoding"], "{proto}");
    }
}

#[test]
fn cors_config_errors_have_file_line_and_field() {
    let text = r#"[[listeners]]
address = "127.0.0.1:0"

[[upstreams]]
name = "up"
endpoints = [{ address = "127.0.0.1:1" }]

[[routes]]
id = "a"
upstream = "up"
cors = { origins = ["*"], credentials = true }

[[routes]]
id = "b"
upstream = "up"
cors = { origins = ["https://app.example/", "https://*.example.com"], methods = ["*"], headers = ["x y"], max_age_s = 90000 }
"#;
    assert_eq!(
        support::config_errors(text),
        [
            "gw.toml:11:21: routes[0].cors.origins[0]: `*` with `credentials = true` would let \
             every site read answers meant for a signed-in user; list the origins",
            "gw.toml:16:21: routes[1].cors.origins[0]: `https://app.example/` is not an origin: \
             an origin has no path, query, user or trailing `/`",
            "gw.toml:16:99: routes[1].cors.headers[0]: `x y` is not a header name",
            "gw.toml:16:119: routes[1].cors.max_age_s: 90000 is above 86400 (a day), where \
             browsers cap it",
        ]
    );
}

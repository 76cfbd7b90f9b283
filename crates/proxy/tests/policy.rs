//! Route policy on real sockets: path rewrites and header operations as the upstream
//! received them (HTTP/1.1 and h2c upstreams), response header operations, redirects and
//! static answers (no upstream), and their config errors with file:line:column.

use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use tailguard_test_support::{Upstream, h2c_client, http1_client};

use crate::support::{self, empty, within};

/// The upstream's echo of the request: its request line, then `name: value` lines.
fn header_values<'a>(echo: &'a str, name: &str) -> Vec<&'a str> {
    let prefix = format!("{name}: ");
    echo.lines()
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .collect()
}

fn response_values<'a>(resp: &'a Response<Incoming>, name: &str) -> Vec<&'a str> {
    resp.headers()
        .get_all(name)
        .iter()
        .map(|v| v.to_str().expect("ascii"))
        .collect()
}

async fn send(req: Request<tailguard_test_support::TestBody>) -> Response<Incoming> {
    within(http1_client().request(req))
        .await
        .expect("an answer")
}

const API_ROUTES: &str = r#"
[[routes]]
id = "api"
upstream = "up"
path = { prefix = "/api" }
rewrite = { prefix = "/echo" }
request_headers = { remove = ["x-debug"], set = [{ name = "x-tenant", value = "blue" }, { name = "X-Forwarded-Proto", value = "https" }], add = [{ name = "x-trace", value = "t-${host}-$route" }, { name = "x-client", value = "$remote_addr" }, { name = "x-id", value = "$request_id" }, { name = "x-price", value = "$$5" }] }

[[routes]]
id = "old"
upstream = "up"
path = { exact = "/old" }
rewrite = { path = "/echo/new" }

[[routes]]
id = "plain"
upstream = "up"
path = { prefix = "/echo" }
"#;

#[tokio::test]
async fn rewritten_paths_and_header_operations_reach_an_http1_upstream() {
    let upstream = Upstream::start().await;
    let (_server, url) = support::start(support::with_listener(&format!(
        "[[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{}\" }}]\n{API_ROUTES}",
        upstream.addr
    )));

    let resp = send(
        Request::get(format!("{url}/api/x?q=1&r=%2F"))
            .header("host", "Shop.Example:8080")
            .header("x-debug", "1")
            .header("x-tenant", "red")
            .header("x-tenant", "green")
            .header("x-trace", "from-client")
            .body(empty())
            .expect("request"),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let echo = support::text(resp).await;
    assert_eq!(
        echo.lines().next(),
        Some("GET /echo/x?q=1&r=%2F HTTP/1.1"),
        "{echo}"
    );
    assert!(header_values(&echo, "x-debug").is_empty(), "{echo}");
    assert_eq!(header_values(&echo, "x-tenant"), ["blue"], "{echo}");
    // Added after the client's own; `$host` is the client's host, lowercase, no port.
    assert_eq!(
        header_values(&echo, "x-trace"),
        ["from-client", "t-shop.example-api"],
        "{echo}"
    );
    assert_eq!(header_values(&echo, "x-client"), ["127.0.0.1"], "{echo}");
    assert_eq!(header_values(&echo, "x-price"), ["$5"], "{echo}");
    let id = header_values(&echo, "x-request-id");
    assert_eq!(id.len(), 1, "{echo}");
    assert_eq!(header_values(&echo, "x-id"), id, "{echo}");
    // The operations run after the gateway's own forwarding fields, so they win.
    assert_eq!(
        header_values(&echo, "x-forwarded-proto"),
        ["https"],
        "{echo}"
    );
    assert_eq!(
        header_values(&echo, "host"),
        ["Shop.Example:8080"],
        "{echo}"
    );

    // The prefix alone becomes the replacement alone; a query survives an exact rewrite.
    let echo = support::text(send(support::get(&format!("{url}/api"))).await).await;
    assert_eq!(echo.lines().next(), Some("GET /echo HTTP/1.1"), "{echo}");
    let echo = support::text(send(support::get(&format!("{url}/api/"))).await).await;
    assert_eq!(echo.lines().next(), Some("GET /echo/ HTTP/1.1"), "{echo}");
    let echo = support::text(send(support::get(&format!("{url}/old?k=v"))).await).await;
    assert_eq!(
        echo.lines().next(),
        Some("GET /echo/new?k=v HTTP/1.1"),
        "{echo}"
    );
    // `/apix` is not under the `/api` prefix (segment boundary): no route, no rewrite.
    let resp = send(support::get(&format!("{url}/apix"))).await;
    assert_eq!(resp.status(), 404);
    // A route without policy passes the path and headers untouched.
    let echo = support::text(
        send(
            Request::get(format!("{url}/echo/y"))
                .header("x-debug", "1")
                .body(empty())
                .expect("request"),
        )
        .await,
    )
    .await;
    assert_eq!(echo.lines().next(), Some("GET /echo/y HTTP/1.1"), "{echo}");
    assert_eq!(header_values(&echo, "x-debug"), ["1"], "{echo}");
    assert_eq!(upstream.requests(), 5);
}

#[tokio::test]
async fn an_h2c_upstream_gets_the_rewritten_path_and_headers_and_its_response_the_operations() {
    let upstream = Upstream::start().await;
    let (server, url) = support::start(support::with_listener(&format!(
        "[[upstreams]]\nname = \"up\"\nprotocol = \"h2c\"\n\
         endpoints = [{{ address = \"{}\" }}]\n\n\
         [[routes]]\nid = \"grpcish\"\nupstream = \"up\"\npath = {{ prefix = \"/v1/\" }}\n\
         rewrite = {{ prefix = \"/echo/\" }}\n\
         request_headers = {{ set = [{{ name = \"x-tenant\", value = \"blue\" }}], \
         add = [{{ name = \"x-host\", value = \"$host\" }}] }}\n\
         response_headers = {{ remove = [\"via\"], add = [{{ name = \"x-route\", value = \"$route\" }}, \
         {{ name = \"x-id\", value = \"$request_id\" }}] }}\n",
        upstream.addr
    )));
    let gw = server.local_addrs()[0];
    for client in [http1_client(), h2c_client()] {
        let resp = within(
            client.request(
                Request::get(format!("{url}/v1/a/b?c=d"))
                    .header("x-tenant", "red")
                    .body(empty())
                    .expect("request"),
            ),
        )
        .await
        .expect("an answer");
        assert_eq!(resp.status(), 200);
        assert!(resp.headers().get("via").is_none(), "{resp:?}");
        assert_eq!(response_values(&resp, "x-route"), ["grpcish"]);
        let id = response_values(&resp, "x-id")
            .first()
            .map(|s| s.to_string())
            .expect("x-id");
        let echo = support::text(resp).await;
        // HTTP/2 upstream: the authority stays in the target, the path is rewritten.
        assert_eq!(
            echo.lines().next(),
            Some(format!("GET http://{gw}/echo/a/b?c=d HTTP/2.0").as_str()),
            "{echo}"
        );
        assert_eq!(header_values(&echo, "x-tenant"), ["blue"], "{echo}");
        assert_eq!(header_values(&echo, "x-host"), ["127.0.0.1"], "{echo}");
        assert_eq!(
            header_values(&echo, "x-request-id"),
            [id.as_str()],
            "{echo}"
        );
    }
    assert_eq!(upstream.requests(), 2);
}

#[tokio::test]
async fn response_header_operations_set_remove_and_add_on_an_http1_upstreams_fields() {
    let upstream = Upstream::builder().body("hello").start().await;
    let (_server, url) = support::start(support::with_listener(&format!(
        r#"
[[upstreams]]
name = "builtin"
builtin = {{ body = "built-in" }}

[[upstreams]]
name = "up"
endpoints = [{{ address = "{}" }}]

[[routes]]
id = "typed"
upstream = "builtin"
path = {{ prefix = "/typed" }}
response_headers = {{ remove = ["via"], set = [{{ name = "content-type", value = "application/x-test" }}], add = [{{ name = "x-host", value = "$host" }}, {{ name = "x-route", value = "r=$route" }}] }}

[[routes]]
id = "added"
upstream = "up"
response_headers = {{ add = [{{ name = "x-served-by", value = "tailguard" }}, {{ name = "x-served-by", value = "$remote_addr" }}] }}
"#,
        upstream.addr
    )));
    for client in [http1_client(), h2c_client()] {
        // The builtin upstream writes `content-type: text/plain`: `set` replaces it.
        let resp = within(client.request(support::get(&format!("{url}/typed"))))
            .await
            .expect("an answer");
        assert_eq!(resp.status(), 200);
        assert_eq!(
            response_values(&resp, "content-type"),
            ["application/x-test"]
        );
        assert!(resp.headers().get("via").is_none(), "{resp:?}");
        assert_eq!(response_values(&resp, "x-host"), ["127.0.0.1"]);
        assert_eq!(response_values(&resp, "x-route"), ["r=typed"]);
        assert_eq!(support::text(resp).await, "built-in");

        // `add` alone: the upstream's own fields pass as they came, the body whole.
        let resp = within(client.request(support::get(&format!("{url}/other"))))
            .await
            .expect("an answer");
        assert_eq!(resp.status(), 200);
        assert_eq!(
            response_values(&resp, "x-served-by"),
            ["tailguard", "127.0.0.1"]
        );
        assert_eq!(response_values(&resp, "via").len(), 1, "{resp:?}");
        assert_eq!(support::text(resp).await, "hello");
    }
}

const LOCAL_ROUTES: &str = r#"
[[routes]]
id = "r301"
path = { exact = "/301" }
redirect = { status = 301, location = "https://example.com/moved" }

[[routes]]
id = "r302"
path = { exact = "/302" }
redirect = { location = "/elsewhere" }

[[routes]]
id = "r303"
path = { exact = "/303" }
redirect = { status = 303, location = "https://example.com/see" }

[[routes]]
id = "r307"
path = { exact = "/307" }
redirect = { status = 307, location = "https://example.com/temp" }

[[routes]]
id = "r308"
path = { exact = "/308" }
redirect = { status = 308, location = "https://example.com/perm" }

[[routes]]
id = "keep"
host = "old.example"
redirect = { status = 308, location = "https://new.example/", keep_path = true }
response_headers = { add = [{ name = "x-from", value = "$host" }] }

[[routes]]
id = "hello"
path = { exact = "/hello" }
respond = { status = 200, body = "{\"hello\":1}", content_type = "application/json" }
response_headers = { set = [{ name = "cache-control", value = "no-store" }], add = [{ name = "x-route", value = "$route" }] }

[[routes]]
id = "teapot"
path = { exact = "/teapot" }
respond = { status = 418, body = "short and stout\n" }

[[routes]]
id = "nothing"
path = { exact = "/nothing" }
respond = { status = 204 }

[[routes]]
id = "fallback"
priority = -1
upstream = "up"
"#;

#[tokio::test]
async fn redirects_and_static_answers_come_from_the_gateway_counted_and_logged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let upstream = Upstream::start().await;
    let (server, url) = support::start(support::with_listener(&format!(
        "[access_log]\npath = \"{}\"\ntemplate = \"$route $status $request_uri $upstream_addr\"\n\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{}\" }}]\n{LOCAL_ROUTES}",
        log.display(),
        upstream.addr
    )));

    for (path, status, location) in [
        ("/301", 301, "https://example.com/moved"),
        ("/302", 302, "/elsewhere"),
        ("/303", 303, "https://example.com/see"),
        ("/307", 307, "https://example.com/temp"),
        ("/308", 308, "https://example.com/perm"),
    ] {
        let resp = send(support::get(&format!("{url}{path}"))).await;
        assert_eq!(resp.status(), status, "{path}");
        assert_eq!(response_values(&resp, "location"), [location], "{path}");
        assert_eq!(response_values(&resp, "content-length"), ["0"], "{path}");
        assert_eq!(support::text(resp).await, "", "{path}");
    }
    // `keep_path`: the request's path and query after the location (its `/` not doubled).
    let resp = send(
        Request::post(format!("{url}/a/b?x=1&y"))
            .header("host", "old.example")
            .body(empty())
            .expect("request"),
    )
    .await;
    assert_eq!(resp.status(), 308);
    assert_eq!(
        response_values(&resp, "location"),
        ["https://new.example/a/b?x=1&y"]
    );
    assert_eq!(response_values(&resp, "x-from"), ["old.example"]);

    for client in [http1_client(), h2c_client()] {
        let resp = within(client.request(support::get(&format!("{url}/hello"))))
            .await
            .expect("an answer");
        assert_eq!(resp.status(), 200);
        assert_eq!(response_values(&resp, "content-type"), ["application/json"]);
        assert_eq!(response_values(&resp, "cache-control"), ["no-store"]);
        assert_eq!(response_values(&resp, "x-route"), ["hello"]);
        assert!(resp.headers().get("via").is_none(), "not proxied: {resp:?}");
        assert_eq!(support::text(resp).await, "{\"hello\":1}");

        // HEAD: the head a GET would have, no body.
        let resp = within(
            client.request(
                Request::head(format!("{url}/hello"))
                    .body(empty())
                    .expect("request"),
            ),
        )
        .await
        .expect("an answer");
        assert_eq!(resp.status(), 200);
        assert_eq!(response_values(&resp, "content-length"), ["11"]);
        assert_eq!(response_values(&resp, "content-type"), ["application/json"]);
        assert_eq!(support::text(resp).await, "");
    }
    let resp = send(support::get(&format!("{url}/teapot"))).await;
    assert_eq!(resp.status(), 418);
    assert_eq!(
        response_values(&resp, "content-type"),
        ["text/plain; charset=utf-8"]
    );
    assert_eq!(support::text(resp).await, "short and stout\n");
    let resp = send(support::get(&format!("{url}/nothing"))).await;
    assert_eq!(resp.status(), 204);
    assert!(resp.headers().get("content-type").is_none(), "{resp:?}");
    assert_eq!(support::text(resp).await, "");
    // A path no local route claims still goes upstream.
    let resp = send(support::get(&format!("{url}/else"))).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(support::text(resp).await, "ok");
    assert_eq!(
        upstream.requests(),
        1,
        "local answers never reach the upstream"
    );

    let text = support::metrics_text(&server);
    for line in [
        "tailguard_requests_total{route=\"r301\",method=\"GET\",status=\"301\"} 1",
        "tailguard_requests_total{route=\"keep\",method=\"POST\",status=\"308\"} 1",
        "tailguard_requests_total{route=\"hello\",method=\"GET\",status=\"200\"} 2",
        "tailguard_requests_total{route=\"hello\",method=\"HEAD\",status=\"200\"} 2",
        "tailguard_requests_total{route=\"nothing\",method=\"GET\",status=\"204\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }

    assert!(server.shutdown(Duration::from_secs(10)).await);
    let written = std::fs::read_to_string(&log).expect("the log");
    let lines: Vec<&str> = written.lines().collect();
    for line in [
        "r301 301 /301 -",
        "keep 308 /a/b?x=1&y -",
        "teapot 418 /teapot -",
        "nothing 204 /nothing -",
    ] {
        assert!(lines.contains(&line), "no `{line}` in:\n{written}");
    }
    assert_eq!(lines.len(), 13, "{written}");
}

#[tokio::test]
async fn a_config_of_local_answers_alone_needs_no_upstream() {
    let (_server, url) = support::start(support::with_listener(
        "[[routes]]\nid = \"up\"\npath = { exact = \"/up\" }\nrespond = { body = \"fine\" }\n\n\
         [[routes]]\nid = \"rest\"\nredirect = { location = \"/up\" }\n",
    ));
    let resp = send(support::get(&format!("{url}/up"))).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(support::text(resp).await, "fine");
    let resp = send(support::get(&format!("{url}/other"))).await;
    assert_eq!(resp.status(), 302);
    assert_eq!(response_values(&resp, "location"), ["/up"]);
}

#[test]
fn policy_config_errors_have_file_line_and_column() {
    let text = r#"[[listeners]]
address = "127.0.0.1:0"

[[upstreams]]
name = "up"
endpoints = [{ address = "127.0.0.1:1" }]

[[routes]]
id = "vars"
upstream = "up"
request_headers = { add = [{ name = "x-a", value = "$hots" }, { name = "transfer-encoding", value = "x" }], remove = ["bad name"] }
response_headers = { set = [{ name = "host", value = "h" }, { name = "x-b", value = "cost $5" }] }

[[routes]]
id = "noloc"
redirect = { status = 301 }

[[routes]]
id = "badstatus"
redirect = { status = 200, location = "ftp://x" }

[[routes]]
id = "both"
upstream = "up"
respond = { status = 204, body = "x" }

[[routes]]
id = "neither"

[[routes]]
id = "exact"
upstream = "up"
path = { exact = "/a" }
rewrite = { prefix = "/b" }

[[routes]]
id = "relative"
upstream = "up"
rewrite = { path = "b?c" }

[[routes]]
id = "local-rewrite"
respond = { status = 101 }
rewrite = { path = "/b" }
request_headers = { add = [{ name = "x", value = "y" }] }
retry = { attempts = 2 }
"#;
    let errs = crate::support::config_errors(text);
    let expected = [
        "gw.toml:11:52: routes[0].request_headers.add[0].value: unknown variable `$hots`; \
         known: `$remote_addr`, `$request_id`, `$host`, `$route` (`$$` is a `$`)",
        "gw.toml:11:72: routes[0].request_headers.add[1].name: `transfer-encoding` is a \
         hop-by-hop or framing field the gateway writes for each hop",
        "gw.toml:11:119: routes[0].request_headers.remove[0]: `bad name` is not a header name",
        "gw.toml:12:38: routes[0].response_headers.set[0].name: `host` is set by the gateway \
         (use the route's `host_rewrite`)",
        "gw.toml:12:85: routes[0].response_headers.set[1].value: unknown variable `$5`; \
         known: `$remote_addr`, `$request_id`, `$host`, `$route` (`$$` is a `$`)",
        "gw.toml:16:12: routes[1].redirect: needs `location`",
        "gw.toml:20:23: routes[2].redirect.status: 200 is not a redirect status \
         (301, 302, 303, 307 or 308)",
        "gw.toml:20:39: routes[2].redirect.location: `ftp://x` is not an absolute http(s) \
         URL or a path starting with `/`",
        "gw.toml:23:6: routes[3]: has more than one of `upstream`, `redirect` and `respond`; \
         choose one",
        "gw.toml:28:6: routes[4]: needs one of `upstream`, `redirect` or `respond`",
        "gw.toml:34:11: routes[5].rewrite.prefix: replaces the prefix the route matched and \
         needs `path = { prefix = .. }`; with an exact path use `rewrite = { path = .. }`",
        "gw.toml:39:11: routes[6].rewrite: `b?c` is not a path: it must start with `/` and \
         have no query or `#`",
        "gw.toml:43:22: routes[7].respond.status: 101 is not a final HTTP status (200..=599)",
        "gw.toml:44:11: routes[7].rewrite: this route answers by itself (`redirect`/`respond`) \
         and sends nothing upstream",
        "gw.toml:45:19: routes[7].request_headers: this route answers by itself \
         (`redirect`/`respond`) and sends nothing upstream",
        "gw.toml:46:9: routes[7].retry: this route answers by itself \
         (`redirect`/`respond`) and sends nothing upstream",
    ];
    for e in expected {
        assert!(
            errs.iter().any(|got| got == e),
            "missing {e:?} in {errs:#?}"
        );
    }
    assert_eq!(errs.len(), expected.len(), "{errs:#?}");

    // The body of a 204, on a route that is otherwise fine.
    let errs = crate::support::config_errors(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[routes]]\nid = \"r\"\nrespond = { status = 204, body = \"x\" }\n",
    );
    assert_eq!(
        errs,
        ["gw.toml:6:11: routes[0].respond.body: a 204 answer has no body"]
    );
}

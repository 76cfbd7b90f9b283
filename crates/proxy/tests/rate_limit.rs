//! Local rate limits on real sockets: exact counts over two serving threads, the 429's
//! fields, buckets per client address, per header value and per route, the listener's limit
//! before routing, state kept across a reload, the metrics, and the config's errors.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt as _, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tailguard_test_support::Upstream;

use crate::support::{config, metrics_text, start, within};

const LOCAL_1: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
// Linux routes all of 127/8 to the loopback interface: a second client address for free.
const LOCAL_2: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// A keep-alive HTTP/1.1 connection to `gateway` from address `from`.
async fn connect(gateway: SocketAddr, from: IpAddr) -> SendRequest<Empty<Bytes>> {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(from, 0))
        .expect("bind the client");
    let stream = socket.connect(gateway).await.expect("connect");
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    send
}

/// Sends `GET path` (with `headers`) and returns the status, the response's headers and
/// its body.
async fn get(
    conn: &mut SendRequest<Empty<Bytes>>,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, http::HeaderMap, String) {
    let mut req = Request::get(path).header("host", "gw.test");
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let req = req.body(Empty::new()).expect("request");
    within(async {
        conn.ready().await.expect("connection ready");
        let resp = conn.send_request(req).await.expect("response");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        (status, headers, String::from_utf8_lossy(&body).into_owned())
    })
    .await
}

async fn status(conn: &mut SendRequest<Empty<Bytes>>, path: &str) -> u16 {
    get(conn, path, &[]).await.0
}

/// One upstream `up` at `upstream`, a listener (with `listener_extra` in its table) and
/// `routes`.
fn gateway_config(upstream: SocketAddr, listener_extra: &str, routes: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n{listener_extra}\n\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{upstream}\" }}]\n\n{routes}"
    )
}

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_serving_threads_admit_the_limit_not_twice_it() {
    let upstream = Upstream::start().await;
    // 10 per second, burst 10, every client from 127.0.0.1: one bucket in the key table.
    let (server, _) = start(config(&gateway_config(
        upstream.addr,
        "",
        "[[routes]]\nid = \"all\"\nupstream = \"up\"\n\
         rate_limit = { rate = 10, burst = 10, key = \"client_ip\" }\n",
    )));
    let addr = server.local_addrs()[0];
    // Eight connections: the kernel spreads them over the gateway's two serving threads
    // (one SO_REUSEPORT socket each), so a per-thread limiter would admit about twice.
    let hammer = Duration::from_secs(2);
    let begin = Instant::now();
    let clients: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(async move {
                let mut conn = connect(addr, LOCAL_1).await;
                let (mut ok, mut limited) = (0u64, 0u64);
                while begin.elapsed() < hammer {
                    match status(&mut conn, "/x").await {
                        200 => ok += 1,
                        429 => limited += 1,
                        other => panic!("unexpected status {other}"),
                    }
                }
                (ok, limited)
            })
        })
        .collect();
    let (mut admitted, mut refused) = (0, 0);
    for c in clients {
        let (ok, limited) = c.await.expect("client");
        admitted += ok;
        refused += limited;
    }
    let elapsed = begin.elapsed().as_secs_f64();
    eprintln!("admitted {admitted}, refused {refused} in {elapsed:.3} s");
    // GCRA: at most the burst plus the rate over the time requests arrived in.
    let most = 10.0 + 10.0 * elapsed + 1.0;
    assert!(
        (admitted as f64) <= most,
        "admitted {admitted} in {elapsed:.2} s: more than {most:.1}"
    );
    // And the burst plus at least a second's worth: the limit refuses, it does not stall.
    assert!(admitted >= 20, "admitted only {admitted} in {elapsed:.2} s");
    assert!(refused > 0);
    assert_eq!(
        upstream.requests() as u64,
        admitted,
        "refused never went upstream"
    );
    let text = metrics_text(&server);
    assert!(
        has_line(
            &text,
            &format!("tailguard_rate_limited_total{{listener=\"\",route=\"all\"}} {refused}")
        ),
        "{text}"
    );
}

#[tokio::test]
async fn the_429_says_when_to_come_back_and_is_counted_like_any_answer() {
    let upstream = Upstream::start().await;
    let (server, _) = start(config(&gateway_config(
        upstream.addr,
        "",
        "[[routes]]\nid = \"all\"\nupstream = \"up\"\n\
         rate_limit = { rate = 1, per = \"minute\", burst = 2, key = \"route\" }\n",
    )));
    let mut conn = connect(server.local_addrs()[0], LOCAL_1).await;
    for _ in 0..2 {
        let (status, headers, _) = get(&mut conn, "/x", &[]).await;
        assert_eq!(status, 200);
        // Admitted answers carry no rate-limit fields (formatting them costs every request).
        assert!(headers.get("ratelimit").is_none());
    }
    let (status, headers, body) = get(&mut conn, "/x", &[]).await;
    assert_eq!(status, 429);
    assert_eq!(body, "too many requests\n");
    let field = |name: &str| {
        headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in {headers:?}"))
            .to_str()
            .expect("ASCII")
            .to_owned()
    };
    // One request a minute: the next one is a minute away.
    assert_eq!(field("retry-after"), "60");
    assert_eq!(field("ratelimit"), "\"route\";r=0;t=60");
    assert_eq!(
        field("ratelimit-policy"),
        "\"route\";q=1;w=60;tailguard-burst=2"
    );
    assert_eq!(upstream.requests(), 2);

    // Counted as the route's answer, as an error blamed on the client, and as limited.
    let text = metrics_text(&server);
    for line in [
        "tailguard_requests_total{route=\"all\",method=\"GET\",status=\"429\"} 1",
        "tailguard_errors_total{kind=\"rate_limited\",blame=\"downstream\"} 1",
        "tailguard_rate_limited_total{listener=\"\",route=\"all\"} 1",
        "tailguard_rate_limit_evictions_total{listener=\"\",route=\"all\"} 0",
    ] {
        assert!(has_line(&text, line), "no `{line}` in:\n{text}");
    }
}

#[tokio::test]
async fn each_client_address_has_its_own_bucket() {
    let upstream = Upstream::start().await;
    let (server, _) = start(config(&gateway_config(
        upstream.addr,
        "",
        "[[routes]]\nid = \"all\"\nupstream = \"up\"\n\
         rate_limit = { rate = 1, per = \"hour\", burst = 1 }\n",
    )));
    let addr = server.local_addrs()[0];
    let mut one = connect(addr, LOCAL_1).await;
    let mut two = connect(addr, LOCAL_2).await;
    assert_eq!(status(&mut one, "/").await, 200);
    assert_eq!(status(&mut one, "/").await, 429);
    // Another address: a full bucket of its own.
    assert_eq!(status(&mut two, "/").await, 200);
    assert_eq!(status(&mut two, "/").await, 429);
    // A new connection from the first address is still that address's bucket.
    let mut again = connect(addr, LOCAL_1).await;
    assert_eq!(status(&mut again, "/").await, 429);
    assert_eq!(upstream.requests(), 2);
}

#[tokio::test]
async fn a_header_key_limits_each_value_and_leaves_requests_without_it_alone() {
    let upstream = Upstream::start().await;
    let (server, _) = start(config(&gateway_config(
        upstream.addr,
        "",
        "[[routes]]\nid = \"all\"\nupstream = \"up\"\n\
         rate_limit = { rate = 1, per = \"hour\", burst = 1, key = \"header:X-Api-Key\" }\n",
    )));
    let mut conn = connect(server.local_addrs()[0], LOCAL_1).await;
    let key = |k| [("x-api-key", k)];
    assert_eq!(get(&mut conn, "/", &key("a")).await.0, 200);
    assert_eq!(get(&mut conn, "/", &key("a")).await.0, 429);
    assert_eq!(get(&mut conn, "/", &key("b")).await.0, 200);
    assert_eq!(get(&mut conn, "/", &key("b")).await.0, 429);
    // Without the header: not limited by this limit (as nginx skips an empty key).
    for _ in 0..3 {
        assert_eq!(status(&mut conn, "/").await, 200);
    }
    assert_eq!(upstream.requests(), 5);
}

#[tokio::test]
async fn a_route_key_is_one_bucket_for_every_client_of_the_route_only() {
    let upstream = Upstream::start().await;
    let (server, _) = start(config(&gateway_config(
        upstream.addr,
        "",
        "[[routes]]\nid = \"limited\"\nupstream = \"up\"\npath = { prefix = \"/limited\" }\n\
         rate_limit = { rate = 2, per = \"hour\", key = \"route\" }\n\n\
         [[routes]]\nid = \"free\"\nupstream = \"up\"\n",
    )));
    let addr = server.local_addrs()[0];
    let mut one = connect(addr, LOCAL_1).await;
    let mut two = connect(addr, LOCAL_2).await;
    // burst defaults to the rate: 2.
    assert_eq!(status(&mut one, "/limited").await, 200);
    assert_eq!(status(&mut two, "/limited").await, 200);
    assert_eq!(status(&mut one, "/limited").await, 429);
    assert_eq!(status(&mut two, "/limited/x").await, 429);
    // The other route has no limit.
    for _ in 0..3 {
        assert_eq!(status(&mut one, "/other").await, 200);
    }
}

#[tokio::test]
async fn the_listener_limit_comes_before_routing_and_health_is_never_limited() {
    let upstream = Upstream::start().await;
    let (server, _) = start(config(&gateway_config(
        upstream.addr,
        "rate_limit = { rate = 2, per = \"hour\", key = \"listener\" }",
        "[[routes]]\nid = \"api\"\nupstream = \"up\"\npath = { prefix = \"/api\" }\n",
    )));
    let mut conn = connect(server.local_addrs()[0], LOCAL_1).await;
    // No route matches `/nowhere`, yet the requests spend the listener's bucket.
    assert_eq!(status(&mut conn, "/nowhere").await, 404);
    assert_eq!(status(&mut conn, "/api").await, 200);
    let (code, headers, _) = get(&mut conn, "/api", &[]).await;
    assert_eq!(code, 429);
    assert_eq!(
        headers.get("ratelimit-policy").map(|v| v.as_bytes()),
        Some(&b"\"listener\";q=2;w=3600;tailguard-burst=2"[..])
    );
    assert_eq!(status(&mut conn, "/nowhere").await, 429);
    assert_eq!(status(&mut conn, "/healthz").await, 200);
    assert_eq!(upstream.requests(), 1);
    let text = metrics_text(&server);
    // Refused before routing: counted under the listener, and as an unrouted request.
    for line in [
        "tailguard_rate_limited_total{listener=\"127.0.0.1:0\",route=\"\"} 2",
        "tailguard_requests_total{route=\"api\",method=\"GET\",status=\"200\"} 1",
        "tailguard_requests_total{route=\"\",method=\"GET\",status=\"429\"} 2",
    ] {
        assert!(has_line(&text, line), "no `{line}` in:\n{text}");
    }
}

#[tokio::test]
async fn a_reload_keeps_unchanged_limits_and_restarts_changed_ones() {
    let upstream = Upstream::start().await;
    let text = |route_burst: u32, listener_rate: u32| {
        gateway_config(
            upstream.addr,
            &format!(
                "rate_limit = {{ rate = {listener_rate}, per = \"hour\", key = \"listener\" }}"
            ),
            &format!(
                "[[routes]]\nid = \"all\"\nupstream = \"up\"\n\
                 rate_limit = {{ rate = 1, per = \"hour\", burst = {route_burst} }}\n"
            ),
        )
    };
    let (server, _) = start(config(&text(1, 100)));
    let addr = server.local_addrs()[0];
    let mut conn = connect(addr, LOCAL_1).await;
    assert_eq!(status(&mut conn, "/").await, 200);
    assert_eq!(status(&mut conn, "/").await, 429);

    // The same limits: the spent bucket stays spent (a reload is no way around a limit).
    server.reload(config(&text(1, 100))).expect("reload");
    let mut conn = connect(addr, LOCAL_1).await;
    assert_eq!(status(&mut conn, "/").await, 429);

    // The route's limit changed: a new one, with full buckets.
    server.reload(config(&text(2, 100))).expect("reload");
    let mut conn = connect(addr, LOCAL_1).await;
    assert_eq!(status(&mut conn, "/").await, 200);
    assert_eq!(status(&mut conn, "/").await, 200);
    assert_eq!(status(&mut conn, "/").await, 429);

    // The listener's limit: 6 requests of its 100 spent so far; lowered to 8, a new one
    // with 8 to spend (the route's unchanged limit still refuses them, after the listener's).
    server.reload(config(&text(2, 8))).expect("reload");
    let mut conn = connect(addr, LOCAL_1).await;
    for _ in 0..8 {
        assert_eq!(status(&mut conn, "/").await, 429);
    }
    let (_, headers, _) = get(&mut conn, "/", &[]).await;
    assert_eq!(
        headers.get("ratelimit").map(|v| v.as_bytes()),
        Some(&b"\"listener\";r=0;t=450"[..]),
        "the ninth is the listener's refusal"
    );
    // Unchanged, the listener's limit keeps its state too.
    server.reload(config(&text(2, 8))).expect("reload");
    let mut conn = connect(addr, LOCAL_1).await;
    let (code, headers, _) = get(&mut conn, "/", &[]).await;
    assert_eq!(code, 429);
    assert!(headers["ratelimit"].as_bytes().starts_with(b"\"listener\""));
}

#[test]
fn config_errors_name_the_line_column_and_field() {
    let text = r#"[[listeners]]
address = "127.0.0.1:0"
rate_limit = { rate = 5, key = "route" }

[[upstreams]]
name = "up"
endpoints = [{ address = "127.0.0.1:1" }]

[[routes]]
id = "a"
upstream = "up"
rate_limit = { rate = 0, burst = 0 }

[[routes]]
id = "b"
upstream = "up"
rate_limit = { rate = 10, key = "header:" }

[[routes]]
id = "c"
upstream = "up"
rate_limit = { rate = 10, key = "cookie", max_keys = 0 }

[[routes]]
id = "d"
upstream = "up"
rate_limit = { rate = 10, per = "day" }
"#;
    assert_eq!(
        crate::support::config_errors(text),
        [
            "gw.toml:3:32: listeners[0].rate_limit.key: `route` is not a key; expected \
             `client_ip`, `header:NAME` or `listener`",
            "gw.toml:12:23: routes[0].rate_limit.rate: 0 is outside 1..=1000000000",
            "gw.toml:12:34: routes[0].rate_limit.burst: 0 is outside 1..=1000000",
            "gw.toml:17:33: routes[1].rate_limit.key: `header:` needs a header name, like \
             `header:X-Api-Key`",
            "gw.toml:22:33: routes[2].rate_limit.key: `cookie` is not a key; expected \
             `client_ip`, `header:NAME`, `route` or `consumer`",
            "gw.toml:22:54: routes[2].rate_limit.max_keys: 0 is outside 1..=16777216",
            "gw.toml:27:33: routes[3]: unknown variant `day`, expected one of `second`, \
             `minute`, `hour`",
        ]
    );
}

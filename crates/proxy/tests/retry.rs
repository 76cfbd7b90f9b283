//! Per-route timeouts and retries (`timeouts` and `retry` on a route), on real sockets:
//! which timeout a route's requests get, which failed tries are sent again and where, what
//! the upstreams saw, and how retries show in the metrics and the access log.

use std::net::SocketAddr;
use std::time::Duration;

use http::Request;
use http_body_util::BodyExt;
use tailguard_proxy::{Config, Server};
use tailguard_test_support::{Upstream, h2c_client, http1_client};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use crate::support::{self, empty, metrics_text, start, within};

/// Upstream `up` over `endpoints` (with `upstream_fields` in its table) and routes given as
/// whole `[[routes]]` tables, then `rest`.
fn config(endpoints: &[SocketAddr], upstream_fields: &str, routes: &str, rest: &str) -> Config {
    let eps: Vec<String> = endpoints
        .iter()
        .map(|a| format!("{{ address = \"{a}\" }}"))
        .collect();
    support::with_listener(&format!(
        "[[upstreams]]\nname = \"up\"\n{upstream_fields}\nendpoints = [{}]\n\n{routes}\n{rest}",
        eps.join(", ")
    ))
}

/// One catch-all route `all` with `fields`.
fn all(fields: &str) -> String {
    format!("[[routes]]\nid = \"all\"\nupstream = \"up\"\n{fields}\n")
}

/// A port bound and never listened on: a connect to it is refused, and no other test takes
/// it while the socket lives.
fn refusing() -> (socket2::Socket, SocketAddr) {
    let s =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a socket");
    s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .expect("bind 127.0.0.1:0");
    let addr = s
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .expect("an IPv4 address");
    (s, addr)
}

/// The value of one series in a scrape (0 when it is absent).
fn series(server: &Server, line_prefix: &str) -> u64 {
    metrics_text(server)
        .lines()
        .find_map(|l| l.strip_prefix(line_prefix)?.strip_prefix(' '))
        .map_or(0, |v| v.parse().expect("a counter value"))
}

fn retries(server: &Server, reason: &str) -> u64 {
    series(
        server,
        &format!("tailguard_upstream_retries_total{{route=\"all\",reason=\"{reason}\"}}"),
    )
}

async fn status_of(url: &str, method: &str) -> u16 {
    let req = Request::builder()
        .method(method)
        .uri(url)
        .body(empty())
        .expect("a request");
    let resp = within(http1_client().request(req))
        .await
        .expect("an answer");
    let status = resp.status().as_u16();
    resp.into_body().collect().await.expect("the body");
    status
}

#[tokio::test]
async fn a_route_request_timeout_overrides_the_global_one_both_ways() {
    let slow = Upstream::builder()
        .delay(Duration::from_millis(400))
        .start()
        .await;
    let routes = "[[routes]]\nid = \"long\"\nupstream = \"up\"\npath = { prefix = \"/long\" }\n\
         timeouts = { request_ms = 20000 }\n\n\
         [[routes]]\nid = \"off\"\nupstream = \"up\"\npath = { prefix = \"/off\" }\n\
         timeouts = { request_ms = 0 }\n\n\
         [[routes]]\nid = \"short\"\nupstream = \"up\"\npath = { prefix = \"/short\" }\n\
         timeouts = { request_ms = 50 }\n\n\
         [[routes]]\nid = \"global\"\nupstream = \"up\"\n";
    let (_server, url) = start(config(
        &[slow.addr],
        "",
        routes,
        "[timeouts]\nrequest_ms = 100\n",
    ));
    assert_eq!(status_of(&format!("{url}/long"), "GET").await, 200);
    assert_eq!(
        status_of(&format!("{url}/off"), "GET").await,
        200,
        "0 disables"
    );
    assert_eq!(status_of(&format!("{url}/short"), "GET").await, 504);
    assert_eq!(status_of(&format!("{url}/other"), "GET").await, 504);
}

#[tokio::test]
async fn a_route_connect_timeout_overrides_the_global_one() {
    // Accepts and never answers: a TLS handshake to it hangs, and the handshake is part of
    // the connect.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            open.push(s);
        }
    });
    let (_server, url) = start(config(
        &[addr],
        "tls = { verify = false }",
        &all("timeouts = { connect_ms = 100 }"),
        "[timeouts]\nconnect_ms = 60000\n",
    ));
    // Bounded well under the global 60 s: only the route's 100 ms gets an answer in time.
    let req = http1_client().request(support::get(&url));
    let resp = tokio::time::timeout(Duration::from_secs(15), req)
        .await
        .expect("the route's connect timeout applied, not the global one")
        .unwrap();
    assert_eq!(resp.status(), 504);
    held.abort();
}

#[tokio::test]
async fn a_route_read_timeout_overrides_the_global_one() {
    // Sends the head and part of the body, then nothing.
    let stalling = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = stalling.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((mut s, _)) = stalling.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\nabc")
                .await;
            open.push(s);
        }
    });
    let (_server, url) = start(config(
        &[addr],
        "",
        &all("timeouts = { read_ms = 100 }"),
        "[timeouts]\nread_ms = 60000\n",
    ));
    let resp = within(http1_client().request(support::get(&url)))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "the head went out");
    let body = tokio::time::timeout(Duration::from_secs(15), resp.into_body().collect())
        .await
        .expect("the route's read timeout cut the body, not the global one");
    assert!(body.is_err(), "a body cut short is an error to the client");
    held.abort();
}

#[tokio::test]
async fn a_503_is_retried_on_the_other_endpoint_and_logged_with_both() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let failing = Upstream::builder().status(503).start().await;
    let healthy = Upstream::start().await;
    let (server, url) = start(config(
        &[failing.addr, healthy.addr],
        "",
        &all("retry = { attempts = 2, on = [\"503\"], backoff_ms = 1 }"),
        &format!(
            "[access_log]\npath = \"{}\"\n\
             template = \"$upstream_addr|$upstream_status|$upstream_tries|$status\"\n",
            log.display()
        ),
    ));
    for _ in 0..8 {
        assert_eq!(status_of(&url, "GET").await, 200);
    }
    // Every request ended on the healthy endpoint; the failing one saw exactly the tries
    // that were retried, each counted once.
    assert_eq!(healthy.requests(), 8);
    assert!(failing.requests() >= 1, "round robin picked it");
    assert_eq!(retries(&server, "503"), failing.requests() as u64);
    assert!(server.shutdown(Duration::from_secs(10)).await);
    let written = std::fs::read_to_string(&log).unwrap();
    let retried = format!("{}, {}|503, 200|2|200", failing.addr, healthy.addr);
    let direct = format!("{}|200|1|200", healthy.addr);
    let lines: Vec<&str> = written.lines().collect();
    assert_eq!(lines.len(), 8, "{written}");
    assert_eq!(
        lines.iter().filter(|l| **l == retried).count(),
        failing.requests(),
        "{written}"
    );
    assert!(
        lines.iter().all(|l| *l == retried || *l == direct),
        "{written}"
    );
}

#[tokio::test]
async fn a_post_is_never_retried() {
    let failing = Upstream::builder().status(503).start().await;
    let healthy = Upstream::start().await;
    let (server, url) = start(config(
        &[failing.addr, healthy.addr],
        "",
        &all("retry = { attempts = 3, on = [\"connect\", \"503\"], backoff_ms = 0 }"),
        "",
    ));
    let mut unavailable = 0;
    for _ in 0..8 {
        if status_of(&url, "POST").await == 503 {
            unavailable += 1;
        }
    }
    assert_eq!(failing.requests() + healthy.requests(), 8, "one try each");
    assert_eq!(
        unavailable,
        failing.requests(),
        "its 503 went to the client as is"
    );
    assert!(failing.requests() >= 1, "round robin picked it");
    assert_eq!(retries(&server, "503"), 0);
}

#[tokio::test]
async fn retries_stop_at_the_upstream_budget() {
    let a = Upstream::builder().status(503).start().await;
    let b = Upstream::builder().status(503).start().await;
    let (server, url) = start(config(
        &[a.addr, b.addr],
        "",
        &all("retry = { attempts = 2, on = [\"503\"], backoff_ms = 0 }"),
        "",
    ));
    for _ in 0..60 {
        assert_eq!(status_of(&url, "GET").await, 503, "the last try's answer");
    }
    // The budget: 3 retries a second over its 10 s window (30) plus 10 % of the requests.
    let retried = retries(&server, "503");
    assert!((30..=36).contains(&retried), "{retried} retries");
    assert_eq!((a.requests() + b.requests()) as u64, 60 + retried);
}

#[tokio::test]
async fn a_refused_connect_is_retried_elsewhere() {
    let (dead, dead_addr) = refusing();
    let live = Upstream::start().await;
    let (server, url) = start(config(
        &[dead_addr, live.addr],
        "",
        &all("retry = { attempts = 2, on = [\"connect\"], backoff_ms = 0 }"),
        "",
    ));
    for _ in 0..6 {
        assert_eq!(status_of(&url, "GET").await, 200);
    }
    assert_eq!(live.requests(), 6);
    let picked_dead = series(
        &server,
        &format!("tailguard_balancer_picks_total{{upstream=\"up\",endpoint=\"{dead_addr}\"}}"),
    );
    assert!(picked_dead >= 1, "round robin picked it");
    assert_eq!(retries(&server, "connect"), picked_dead);
    drop(dead);
}

#[tokio::test]
async fn without_a_retry_block_a_refused_connect_is_retried_once_and_counted() {
    let (dead, dead_addr) = refusing();
    let live = Upstream::start().await;
    let (server, url) = start(config(&[dead_addr, live.addr], "", &all(""), ""));
    for _ in 0..6 {
        assert_eq!(status_of(&url, "GET").await, 200);
    }
    assert_eq!(live.requests(), 6);
    assert!(retries(&server, "connect") >= 1);
    drop(dead);
}

#[tokio::test]
async fn a_try_past_its_request_timeout_is_retried_on_the_other_endpoint() {
    let slow = Upstream::builder()
        .delay(Duration::from_secs(20))
        .start()
        .await;
    let fast = Upstream::start().await;
    let (server, url) = start(config(
        &[slow.addr, fast.addr],
        "",
        &all("timeouts = { request_ms = 1000 }\n\
             retry = { attempts = 2, on = [\"timeout\"], backoff_ms = 0 }"),
        "",
    ));
    for _ in 0..4 {
        assert_eq!(status_of(&url, "GET").await, 200);
    }
    assert_eq!(fast.requests(), 4);
    let timed_out = retries(&server, "timeout");
    assert!(timed_out >= 1, "round robin picked the slow one");
    assert_eq!(slow.requests() as u64, timed_out);
}

#[tokio::test]
async fn attempts_count_every_try_and_the_last_answer_goes_to_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    let ups = [
        Upstream::builder().status(503).start().await,
        Upstream::builder().status(503).start().await,
        Upstream::builder().status(503).start().await,
        Upstream::builder().status(503).start().await,
    ];
    let addrs: Vec<SocketAddr> = ups.iter().map(|u| u.addr).collect();
    let (server, url) = start(config(
        &addrs,
        "",
        &all("retry = { attempts = 3, on = [\"503\"], backoff_ms = 1 }"),
        &format!(
            "[access_log]\npath = \"{}\"\ntemplate = \"$upstream_status|$upstream_tries\"\n",
            log.display()
        ),
    ));
    assert_eq!(status_of(&url, "GET").await, 503);
    assert_eq!(ups.iter().map(Upstream::requests).sum::<usize>(), 3);
    assert!(
        ups.iter().all(|u| u.requests() <= 1),
        "each retry went to another endpoint"
    );
    assert_eq!(retries(&server, "503"), 2);
    assert!(server.shutdown(Duration::from_secs(10)).await);
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "503, 503, 503|3\n");
}

#[tokio::test]
async fn an_h2c_upstream_503_is_retried_on_the_other_endpoint() {
    let failing = Upstream::builder().status(503).start().await;
    let healthy = Upstream::start().await;
    let (server, url) = start(config(
        &[failing.addr, healthy.addr],
        "protocol = \"h2c\"",
        &all("retry = { attempts = 2, on = [\"503\"], backoff_ms = 0 }"),
        "",
    ));
    for client in [http1_client(), h2c_client()] {
        for _ in 0..4 {
            let resp = within(client.request(support::get(&url))).await.unwrap();
            assert_eq!(resp.status(), 200);
            resp.into_body().collect().await.unwrap();
        }
    }
    assert_eq!(healthy.requests(), 8);
    assert!(failing.requests() >= 1, "round robin picked it");
    assert_eq!(retries(&server, "503"), failing.requests() as u64);
}

#[test]
fn retry_and_route_timeouts_are_checked_with_their_position() {
    let head = "[[listeners]]\naddress = \"127.0.0.1:0\"\n\
                [[upstreams]]\nname = \"u\"\nendpoints = [{ address = \"127.0.0.1:1\" }]\n";
    let route =
        |fields: &str| format!("{head}[[routes]]\nid = \"r\"\nupstream = \"u\"\n{fields}\n");
    assert_eq!(
        crate::support::config_errors(&route("retry = { on = [\"connect\", \"500\"] }")),
        [
            "gw.toml:9:28: routes[0].retry.on[1]: `500` is not a retry condition; expected one \
          of `connect`, `502`, `503`, `504`, `timeout`"
        ]
    );
    assert_eq!(
        crate::support::config_errors(&route("retry = { attempts = 0 }")),
        [
            "gw.toml:9:22: routes[0].retry.attempts: 0 is outside 1..=10 (tries in all, the \
          first included)"
        ]
    );
    assert_eq!(
        crate::support::config_errors(&route("retry = { backoff_ms = 60000 }")),
        ["gw.toml:9:24: routes[0].retry.backoff_ms: 60000 ms is above the 10000 ms ceiling"]
    );
    assert_eq!(
        crate::support::config_errors(&route("retry = { on = [] }")),
        [
            "gw.toml:9:16: routes[0].retry.on: names no condition; for no retries at all, set \
          `attempts = 1`"
        ]
    );
    assert_eq!(
        crate::support::config_errors(&route(
            "timeouts = { request_ms = 0 }\nretry = { on = [\"timeout\"] }"
        )),
        [
            "gw.toml:10:17: routes[0].retry.on[0]: `timeout` needs a request timeout, and \
          `request_ms` is 0 (disabled)"
        ]
    );
    assert_eq!(
        crate::support::config_errors(&route("timeouts = { connect = 5 }")),
        [
            "gw.toml:9:14: routes[0]: unknown field `connect`, expected one of `connect_ms`, \
          `request_ms`, `read_ms`"
        ]
    );
    // The same route with valid blocks parses.
    Config::parse(
        &route(
            "timeouts = { connect_ms = 100, request_ms = 500, read_ms = 0 }\n\
             retry = { attempts = 3, on = [\"connect\", \"502\", \"503\", \"504\", \"timeout\"], \
             backoff_ms = 50 }",
        ),
        "gw.toml",
        std::path::Path::new("."),
    )
    .expect("valid");
}

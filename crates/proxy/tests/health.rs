//! Active health checks and passive ejection against real upstreams that fail, stop and
//! come back: which endpoints get traffic, the `tailguard_upstream_endpoint_up` gauge, the
//! immediate 503 when every endpoint is down, and health state across a reload.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http_body_util::BodyExt as _;
use tailguard_proxy::{Config, Server};
use tailguard_test_support::{SwitchableUpstream, TestCa, TlsUpstream, http1_client};
use tailguard_upstream::health::EndpointHealth;

use crate::support::{get, start, with_listener};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Every wait for a state change gives up after this long: the checks below run every few
/// tens of milliseconds, so only a broken gateway gets near it.
const PATIENCE: Duration = Duration::from_secs(10);

/// One upstream `up` over `endpoints` with `balance`, `[upstreams.health]` set to `health`
/// (none when `None`), and a catch-all route.
fn config(endpoints: &[SocketAddr], balance: &str, health: Option<&str>) -> Config {
    let eps: Vec<String> = endpoints
        .iter()
        .map(|a| format!("{{ address = \"{a}\" }}"))
        .collect();
    let health = health.map_or(String::new(), |h| format!("[upstreams.health]\n{h}\n"));
    with_listener(&format!(
        "[[upstreams]]\nname = \"up\"\nbalance = \"{balance}\"\nendpoints = [{}]\n{health}\n\
         [[routes]]\nid = \"all\"\nupstream = \"up\"\n",
        eps.join(", ")
    ))
}

/// The value of a series of the rendered exposition, by its exact name and labels.
fn series(server: &Server, name_and_labels: &str) -> Option<i64> {
    crate::support::metrics_text(server)
        .lines()
        .find_map(|line| {
            let value = line.strip_prefix(name_and_labels)?.strip_prefix(' ')?;
            value.parse().ok()
        })
}

/// `tailguard_upstream_endpoint_up` of endpoint `addr` of upstream `up`.
fn up_gauge(server: &Server, addr: SocketAddr) -> Option<i64> {
    series(
        server,
        &format!("tailguard_upstream_endpoint_up{{upstream=\"up\",endpoint=\"{addr}\"}}"),
    )
}

/// Times the balancer picked `addr`.
fn picks(server: &Server, addr: SocketAddr) -> i64 {
    series(
        server,
        &format!("tailguard_balancer_picks_total{{upstream=\"up\",endpoint=\"{addr}\"}}"),
    )
    .unwrap_or(0)
}

/// Waits until `done` holds (checked every 5 ms), panicking after [`PATIENCE`]; returns
/// how long it took.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < PATIENCE, "gave up waiting: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    start.elapsed()
}

/// Sends `n` GETs one after another on one keep-alive client; returns their statuses.
async fn send(url: &str, n: usize) -> Vec<u16> {
    let client = http1_client();
    let mut statuses = Vec::with_capacity(n);
    for i in 0..n {
        let resp = client
            .request(get(&format!("{url}/req/{i}")))
            .await
            .expect("the gateway answers");
        statuses.push(resp.status().as_u16());
        let _ = resp.into_body().collect().await;
    }
    statuses
}

const ACTIVE: &str = "path = \"/health\"\ninterval_ms = 20\ntimeout_ms = 500\nhealthy = 2\n\
                      unhealthy = 2\nconsecutive_failures = 0";

async fn a_failing_check_takes_a_serving_endpoint_out_and_a_passing_one_brings_it_back(
    balance: &str,
) {
    let (a, b) = (
        SwitchableUpstream::start().await,
        SwitchableUpstream::start().await,
    );
    let health = format!("{ACTIVE}\nexpect_status = [\"200-299\", 418]");
    let (server, url) = start(config(&[a.addr, b.addr], balance, Some(&health)));
    assert_eq!(up_gauge(&server, a.addr), Some(1));
    assert_eq!(up_gauge(&server, b.addr), Some(1));

    // A status in the list keeps it up through several rounds.
    a.set_health_status(418);
    let checks = a.checks();
    eventually("three more checks of a", || a.checks() >= checks + 3).await;
    assert_eq!(up_gauge(&server, a.addr), Some(1), "418 is expected");

    // A status outside it takes it down within a few rounds, though it still answers
    // requests: from then on none reaches it.
    a.set_health_status(302);
    let took = eventually("a down", || up_gauge(&server, a.addr) == Some(0)).await;
    assert!(
        took < Duration::from_secs(3),
        "{took:?} for two 20 ms rounds"
    );
    let (on_a, on_b) = (a.requests(), b.requests());
    assert!(send(&url, 30).await.iter().all(|&s| s == 200));
    assert_eq!(a.requests(), on_a, "no request reaches a down endpoint");
    assert_eq!(b.requests(), on_b + 30);

    // Passing again: back after `healthy` passes, and it gets traffic again.
    a.set_health_status(200);
    eventually("a up", || up_gauge(&server, a.addr) == Some(1)).await;
    let on_a = a.requests();
    let deadline = Instant::now() + PATIENCE;
    while a.requests() == on_a {
        assert!(Instant::now() < deadline, "a never got traffic back");
        assert!(send(&url, 10).await.iter().all(|&s| s == 200));
    }
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn round_robin_skips_an_endpoint_its_checks_took_down() {
    a_failing_check_takes_a_serving_endpoint_out_and_a_passing_one_brings_it_back("round_robin")
        .await;
}

#[tokio::test]
async fn p2c_ewma_skips_an_endpoint_its_checks_took_down() {
    a_failing_check_takes_a_serving_endpoint_out_and_a_passing_one_brings_it_back("p2c_ewma").await;
}

#[tokio::test]
async fn an_endpoint_that_stops_is_taken_out_and_comes_back_when_it_listens_again() {
    let (a, b) = (
        SwitchableUpstream::start().await,
        SwitchableUpstream::start().await,
    );
    let (server, url) = start(config(&[a.addr, b.addr], "round_robin", Some(ACTIVE)));
    assert!(send(&url, 10).await.iter().all(|&s| s == 200));
    assert!(a.requests() > 0 && b.requests() > 0);

    a.stop().await;
    let took = eventually("a down", || up_gauge(&server, a.addr) == Some(0)).await;
    assert!(took < Duration::from_secs(3), "{took:?}");
    // Down: never picked (so never connected to, never retried onto).
    let picked = picks(&server, a.addr);
    assert!(send(&url, 30).await.iter().all(|&s| s == 200));
    assert_eq!(picks(&server, a.addr), picked);

    a.resume().await;
    eventually("a up", || up_gauge(&server, a.addr) == Some(1)).await;
    let on_a = a.requests();
    assert!(send(&url, 10).await.iter().all(|&s| s == 200));
    assert!(a.requests() > on_a, "round robin sends to it again");
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn every_endpoint_down_is_answered_503_at_once_without_reaching_one() {
    let (a, b) = (
        SwitchableUpstream::start().await,
        SwitchableUpstream::start().await,
    );
    let (server, url) = start(config(&[a.addr, b.addr], "round_robin", Some(ACTIVE)));
    let text = crate::support::metrics_text(&server);
    for addr in [a.addr, b.addr] {
        let line =
            format!("tailguard_upstream_endpoint_up{{upstream=\"up\",endpoint=\"{addr}\"}} 1");
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    a.set_health_status(503);
    b.set_health_status(503);
    eventually("both down", || {
        up_gauge(&server, a.addr) == Some(0) && up_gauge(&server, b.addr) == Some(0)
    })
    .await;
    let (picks_a, picks_b) = (picks(&server, a.addr), picks(&server, b.addr));

    let client = http1_client();
    let started = Instant::now();
    let resp = client
        .request(get(&format!("{url}/x")))
        .await
        .expect("answer");
    let took = started.elapsed();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"no healthy endpoint\n");
    assert!(took < Duration::from_secs(1), "{took:?}");
    // Nothing was picked, nothing reached an endpoint (both still answer requests).
    assert_eq!((a.requests(), b.requests()), (0, 0));
    assert_eq!(
        (picks(&server, a.addr), picks(&server, b.addr)),
        (picks_a, picks_b)
    );
    assert_eq!(
        series(
            &server,
            "tailguard_errors_total{kind=\"no_healthy_endpoint\",blame=\"upstream\"}"
        ),
        Some(1)
    );

    // The request's log line (`warn`, target `tailguard::request`) carries the error's text.
    let err = tailguard_proxy::Error::NoHealthyEndpoint {
        upstream: std::sync::Arc::from("up"),
    };
    assert_eq!(err.to_string(), "no healthy endpoint in upstream `up`");
    assert_eq!(
        (err.kind(), err.blame().as_str()),
        ("no_healthy_endpoint", "upstream")
    );

    b.set_health_status(200);
    eventually("b up", || up_gauge(&server, b.addr) == Some(1)).await;
    assert!(send(&url, 5).await.iter().all(|&s| s == 200));
    assert_eq!((a.requests(), b.requests()), (0, 5));
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn consecutive_503s_eject_an_endpoint() {
    let (a, b) = (
        SwitchableUpstream::start().await,
        SwitchableUpstream::start().await,
    );
    a.set_status(503);
    let health = "consecutive_failures = 3\nejection_ms = 60000";
    let (server, url) = start(config(&[a.addr, b.addr], "round_robin", Some(health)));
    let client = http1_client();
    let deadline = Instant::now() + PATIENCE;
    while up_gauge(&server, a.addr) != Some(0) {
        assert!(Instant::now() < deadline, "a never ejected");
        let resp = client
            .request(get(&format!("{url}/x")))
            .await
            .expect("answer");
        let _ = resp.into_body().collect().await;
    }
    assert!(a.requests() >= 3, "ejected after {} failures", a.requests());
    let on_a = a.requests();
    assert!(send(&url, 30).await.iter().all(|&s| s == 200));
    assert_eq!(a.requests(), on_a, "an ejected endpoint gets no traffic");
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn connect_failures_eject_an_endpoint() {
    let (a, b) = (
        SwitchableUpstream::start().await,
        SwitchableUpstream::start().await,
    );
    a.stop().await;
    let health = "consecutive_failures = 2\nejection_ms = 60000";
    let (server, url) = start(config(&[a.addr, b.addr], "round_robin", Some(health)));
    let client = http1_client();
    let deadline = Instant::now() + PATIENCE;
    while up_gauge(&server, a.addr) != Some(0) {
        assert!(Instant::now() < deadline, "a never ejected");
        let resp = client
            .request(get(&format!("{url}/x")))
            .await
            .expect("answer");
        let _ = resp.into_body().collect().await;
    }
    let picked = picks(&server, a.addr);
    assert!(send(&url, 30).await.iter().all(|&s| s == 200));
    assert_eq!(
        picks(&server, a.addr),
        picked,
        "an ejected endpoint is never picked"
    );
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn an_ejection_ends_on_time_and_a_repeat_lasts_twice_as_long() {
    let (a, b) = (
        SwitchableUpstream::start().await,
        SwitchableUpstream::start().await,
    );
    a.set_status(503);
    let health = "consecutive_failures = 2\nejection_ms = 300";
    let (server, url) = start(config(&[a.addr, b.addr], "round_robin", Some(health)));
    // Steady traffic, so a returned endpoint fails again at once.
    let traffic = tokio::spawn(async move {
        let client = http1_client();
        loop {
            if let Ok(resp) = client.request(get(&format!("{url}/x"))).await {
                let _ = resp.into_body().collect().await;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    let mut lengths = Vec::new();
    for _ in 0..2 {
        eventually("a ejected", || up_gauge(&server, a.addr) == Some(0)).await;
        let out = eventually("a back", || up_gauge(&server, a.addr) == Some(1)).await;
        lengths.push(out);
    }
    traffic.abort();
    // Seen through polls of the exposition, each a few ms apart (more on a loaded machine):
    // a length is seen short by at most one poll's delay, and long by the checker's.
    // 300 ms then 600 ms; without doubling both would be about 300 ms.
    assert!(lengths[0] >= Duration::from_millis(200), "{lengths:?}");
    assert!(
        lengths[1] >= Duration::from_millis(450) && lengths[1] > lengths[0] + ms(150),
        "{lengths:?}: the repeat doubles"
    );
    assert!(
        lengths.iter().all(|l| *l < Duration::from_secs(5)),
        "{lengths:?}"
    );
    server.shutdown(Duration::from_secs(1)).await;
}

/// The health state the running snapshot holds for endpoint `addr`.
fn health_of(server: &Server, addr: SocketAddr) -> std::sync::Arc<EndpointHealth> {
    let snapshot = server.gateway().snapshot();
    let endpoint = snapshot.upstreams[0]
        .endpoints
        .iter()
        .find(|e| e.addr == addr)
        .expect("the endpoint is in the snapshot");
    std::sync::Arc::clone(&endpoint.health)
}

/// Regression test for issue 22 item 1: an endpoint both ejected and down by checks came
/// back by its checks but stayed ejected (and its gauge at 0) for the rest of its ejection.
#[tokio::test]
async fn passing_checks_end_an_ejection_long_before_its_time() {
    let (a, b) = (
        SwitchableUpstream::start().await,
        SwitchableUpstream::start().await,
    );
    // Ten minutes: b back within PATIENCE can only have been brought back by its checks.
    let ejection = "consecutive_failures = 2\nejection_ms = 600000";
    let (server, url) = start(config(&[a.addr, b.addr], "round_robin", Some(ejection)));
    b.set_status(503);
    b.set_health_status(503);
    // First ejected by its failed requests (no checks yet, so nothing can take it down
    // before its requests fail)...
    let deadline = Instant::now() + PATIENCE;
    while !health_of(&server, b.addr).is_ejected() {
        assert!(Instant::now() < deadline, "b never ejected");
        send(&url, 2).await;
    }
    // ...then down by checks too: a reload adds them (keeping b's ejection), and they fail.
    let checked = format!(
        "path = \"/health\"\ninterval_ms = 20\ntimeout_ms = 500\nhealthy = 2\n\
         unhealthy = 2\n{ejection}"
    );
    server
        .reload(config(&[a.addr, b.addr], "round_robin", Some(&checked)))
        .expect("reload");
    eventually("b down by checks and ejected", || {
        let h = health_of(&server, b.addr);
        h.is_probe_down() && h.is_ejected()
    })
    .await;
    assert_eq!(up_gauge(&server, b.addr), Some(0));
    let on_b = b.requests();
    assert!(send(&url, 10).await.iter().all(|&s| s == 200));
    assert_eq!(b.requests(), on_b, "no request reaches b while it is out");

    // b recovers: two passed checks (about 40 ms) bring it back from both.
    b.set_status(200);
    b.set_health_status(200);
    eventually("b's gauge back at 1", || {
        up_gauge(&server, b.addr) == Some(1)
    })
    .await;
    let h = health_of(&server, b.addr);
    assert!(!h.is_ejected() && !h.is_probe_down());
    let deadline = Instant::now() + PATIENCE;
    while b.requests() == on_b {
        assert!(Instant::now() < deadline, "no request reached b again");
        assert!(send(&url, 4).await.iter().all(|&s| s == 200));
    }
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn max_ejected_percent_keeps_endpoints_in_service() {
    // Two endpoints both failing, at most 50 %: one is ejected, the other keeps serving
    // (its 503s reach the client, as they would without ejection).
    let (a, b) = (
        SwitchableUpstream::start().await,
        SwitchableUpstream::start().await,
    );
    a.set_status(503);
    b.set_status(503);
    let health = "consecutive_failures = 2\nejection_ms = 60000\nmax_ejected_percent = 50";
    let (server, url) = start(config(&[a.addr, b.addr], "round_robin", Some(health)));
    let gauges = |server: &Server| {
        up_gauge(server, a.addr).unwrap_or(-1) + up_gauge(server, b.addr).unwrap_or(-1)
    };
    let deadline = Instant::now() + PATIENCE;
    while gauges(&server) != 1 {
        assert!(Instant::now() < deadline, "neither was ejected");
        send(&url, 2).await;
    }
    let statuses = send(&url, 40).await;
    assert!(statuses.iter().all(|&s| s == 503), "{statuses:?}");
    assert_eq!(gauges(&server), 1, "never both");
    let text = crate::support::metrics_text(&server);
    assert!(!text.contains("kind=\"no_healthy_endpoint\""), "{text}");
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_lone_endpoint_is_never_ejected_at_50_percent_nor_without_a_health_table() {
    for health in [Some("consecutive_failures = 1"), None] {
        let a = SwitchableUpstream::start().await;
        a.set_status(503);
        let (server, url) = start(config(&[a.addr], "round_robin", health));
        let statuses = send(&url, 30).await;
        assert!(
            statuses.iter().all(|&s| s == 503),
            "{health:?}: {statuses:?}"
        );
        assert_eq!(a.requests(), 30, "{health:?}: every request reached it");
        // Give the checker thread time to act on the failures it was woken for.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(up_gauge(&server, a.addr), Some(1), "{health:?}");
        assert_eq!(send(&url, 1).await, [503]);
        assert_eq!(a.requests(), 31);
        server.shutdown(Duration::from_secs(1)).await;
    }
}

#[tokio::test]
async fn a_reload_keeps_the_health_of_endpoints_it_keeps() {
    let (a, b, c) = (
        SwitchableUpstream::start().await,
        SwitchableUpstream::start().await,
        SwitchableUpstream::start().await,
    );
    // Slow rounds: a state the reload forgot would put `a` back in service for at least
    // two of them (200 ms), far longer than the requests below take.
    let health = "path = \"/health\"\ninterval_ms = 100\ntimeout_ms = 500\nunhealthy = 2\n\
                  consecutive_failures = 0";
    let (server, url) = start(config(&[a.addr, b.addr], "round_robin", Some(health)));
    a.set_health_status(500);
    eventually("a down", || up_gauge(&server, a.addr) == Some(0)).await;

    server
        .reload(config(
            &[a.addr, b.addr, c.addr],
            "round_robin",
            Some(health),
        ))
        .expect("reload");
    assert_eq!(up_gauge(&server, a.addr), Some(0), "a kept its state");
    assert_eq!(
        up_gauge(&server, c.addr),
        Some(1),
        "a new endpoint starts up"
    );
    let on_a = a.requests();
    assert!(send(&url, 20).await.iter().all(|&s| s == 200));
    assert_eq!(
        a.requests(),
        on_a,
        "no request reached a right after the reload"
    );
    assert!(c.requests() > 0, "c takes traffic");

    // Removing b: its gauge reads 0; a reload without the health table brings a back.
    server
        .reload(config(&[a.addr, c.addr], "round_robin", Some(health)))
        .expect("reload");
    assert_eq!(up_gauge(&server, b.addr), Some(0), "b left the config");
    assert_eq!(up_gauge(&server, a.addr), Some(0));
    // Once nothing holds b's state any more, its series expires (else the endpoint-down
    // alerts would report b for ever); a and c, configured, keep theirs however long their
    // values stay the same. The sweeps stand in for the exporter's, run with a clock moved
    // past the series' TTL.
    let registry = server.gateway().metrics().registry();
    eventually("b's series expired", || {
        let now = std::time::Instant::now();
        registry.sweep(now);
        registry.sweep(now + Duration::from_secs(6));
        up_gauge(&server, b.addr).is_none()
    })
    .await;
    assert_eq!(up_gauge(&server, a.addr), Some(0));
    assert_eq!(up_gauge(&server, c.addr), Some(1));

    // A table without `path` (ejection only): nothing checks a any more, so it comes back.
    server
        .reload(config(
            &[a.addr, c.addr],
            "round_robin",
            Some("consecutive_failures = 5"),
        ))
        .expect("reload");
    eventually("a back without checks", || {
        up_gauge(&server, a.addr) == Some(1)
    })
    .await;
    let on_a = a.requests();
    assert!(send(&url, 10).await.iter().all(|&s| s == 200));
    assert!(a.requests() > on_a);

    // Down again, then a reload without the table: every endpoint in service at once.
    server
        .reload(config(&[a.addr, c.addr], "round_robin", Some(health)))
        .expect("reload");
    eventually("a down again", || up_gauge(&server, a.addr) == Some(0)).await;
    server
        .reload(config(&[a.addr, c.addr], "round_robin", None))
        .expect("reload");
    assert_eq!(
        up_gauge(&server, a.addr),
        Some(1),
        "nothing checks a any more"
    );
    let on_a = a.requests();
    assert!(send(&url, 10).await.iter().all(|&s| s == 200));
    assert!(a.requests() > on_a);
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn checks_go_over_the_upstreams_tls_and_a_certificate_that_fails_takes_it_down() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("health ca");
    ca.write(&dir.path().join("ca.pem"));
    let other = TestCa::new("other ca");
    let trusted = TlsUpstream::builder(ca.issue(&["127.0.0.1"])).start().await;
    let untrusted = TlsUpstream::builder(other.issue(&["127.0.0.1"]))
        .start()
        .await;
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{}\" }}, {{ address = \"{}\" }}]\n\
         [upstreams.tls]\nca = \"ca.pem\"\n\
         [upstreams.health]\n{ACTIVE}\n\n\
         [[routes]]\nid = \"all\"\nupstream = \"up\"\n",
        trusted.addr, untrusted.addr
    );
    let config = Config::parse(&text, "test.toml", dir.path()).expect("valid config");
    let (server, url) = start(config);

    // The certificate the upstream's TLS settings refuse fails every check.
    eventually("untrusted down", || {
        up_gauge(&server, untrusted.addr) == Some(0)
    })
    .await;
    // (The upstream counts a refused handshake when it reads the alert: maybe later.)
    eventually("two refused handshakes", || {
        untrusted.failed_handshakes() >= 2
    })
    .await;
    assert_eq!(untrusted.requests(), 0);
    // The trusted one passes its checks over TLS: each a handshake and a request.
    eventually("three checks over TLS", || trusted.requests() >= 3).await;
    assert_eq!(up_gauge(&server, trusted.addr), Some(1));
    assert!(trusted.handshakes() >= 3);
    let on_trusted = trusted.requests();
    assert!(send(&url, 10).await.iter().all(|&s| s == 200));
    assert!(trusted.requests() >= on_trusted + 10);
    server.shutdown(Duration::from_secs(1)).await;
}

/// Issue 22 item 1's figure (not a check: it prints): two endpoints, active checks every
/// 200 ms with `healthy = unhealthy = 2`, 200 req/s; B answers 503 (health path included)
/// from 3 s to 9 s. Prints, for three runs of each variant, the time from B's recovery to
/// its gauge reading 1 and to the first request B answers. Variants: passive ejection at
/// its defaults (5 failures, 30 s) and the default `timeout_ms` (1000, so rounds are 1 s
/// apart); the same with `timeout_ms = 150` (rounds 200 ms apart); and without ejection
/// (`consecutive_failures = 0`), the issue's baseline.
/// `cargo test -p tailguard-proxy --test main health::recovery_time_figure -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: prints the issue's figure, takes about 90 s"]
async fn recovery_time_figure() {
    let base = "path = \"/health\"\ninterval_ms = 200\nhealthy = 2\nunhealthy = 2";
    for extra in ["", "timeout_ms = 150", "consecutive_failures = 0"] {
        for run in 1..=3 {
            let (a, b) = (
                SwitchableUpstream::start().await,
                SwitchableUpstream::start().await,
            );
            let health = format!("{base}\n{extra}");
            let (server, url) = start(config(&[a.addr, b.addr], "round_robin", Some(&health)));
            let started = Instant::now();
            // Open loop at 200 req/s: a request every 5 ms, each in its own task.
            let traffic = tokio::spawn(async move {
                let client = http1_client();
                let mut tick = tokio::time::interval(Duration::from_millis(5));
                loop {
                    tick.tick().await;
                    let (client, url) = (client.clone(), url.clone());
                    tokio::spawn(async move {
                        if let Ok(resp) = client.request(get(&format!("{url}/x"))).await {
                            let _ = resp.into_body().collect().await;
                        }
                    });
                }
            });
            tokio::time::sleep_until((started + Duration::from_secs(3)).into()).await;
            b.set_status(503);
            b.set_health_status(503);
            tokio::time::sleep_until((started + Duration::from_secs(9)).into()).await;
            let (ejected, down) = {
                let h = health_of(&server, b.addr);
                (h.is_ejected(), h.is_probe_down())
            };
            // The figure means something only if B was out of service when it recovered.
            assert_eq!(
                up_gauge(&server, b.addr),
                Some(0),
                "b still in service at 9 s"
            );
            let on_b = b.requests();
            b.set_status(200);
            b.set_health_status(200);
            let recovered = Instant::now();
            let mut gauge_back = None;
            while b.requests() == on_b && recovered.elapsed() < Duration::from_secs(6) {
                if gauge_back.is_none() && up_gauge(&server, b.addr) == Some(1) {
                    gauge_back = Some(recovered.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let first_request = (b.requests() > on_b).then(|| recovered.elapsed());
            traffic.abort();
            println!(
                "[{extra:>24}] run {run}: at 9 s ejected={ejected} down={down}; after recovery: \
                 gauge 1 at {gauge_back:?}, first request answered by b at {first_request:?}"
            );
            server.shutdown(Duration::from_secs(1)).await;
        }
    }
}

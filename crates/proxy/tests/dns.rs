//! Endpoints by DNS name against a real DNS responder on 127.0.0.1 (test-support's): first
//! resolution, a changed answer, a failed lookup, TTL expiry, and a name that never
//! resolves. Upstreams listen on other loopback addresses (127.0.0.2, 127.0.0.3) on one
//! port, as the addresses of one name do.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tailguard_proxy::Server;
use tailguard_test_support::dns::DnsServer;
use tailguard_test_support::{Upstream, get, http1_client};

use crate::support::{start, with_listener};

/// Two upstreams on one free port, at 127.0.0.2 and 127.0.0.3, answering `a` and `b`.
async fn two_upstreams() -> (Upstream, Upstream, u16) {
    // A port free on 127.0.0.2 is tried on 127.0.0.3 too; a clash is retried.
    for _ in 0..20 {
        let a = Upstream::builder()
            .body("a")
            .bind(SocketAddr::from(([127, 0, 0, 2], 0)))
            .start()
            .await;
        let port = a.addr.port();
        let b_addr = SocketAddr::from(([127, 0, 0, 3], port));
        if std::net::TcpListener::bind(b_addr).is_ok() {
            let b = Upstream::builder().body("b").bind(b_addr).start().await;
            return (a, b, port);
        }
    }
    panic!("no port free on both 127.0.0.2 and 127.0.0.3");
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("IP literal")
}

/// A gateway whose upstream `up` is `name:port`, resolved by `dns`.
fn gateway(dns: &DnsServer, name: &str, port: u16, refresh_ms: u64) -> (Server, String) {
    start(with_listener(&format!(
        r#"
[dns]
servers = ["{dns}"]
timeout_ms = 200
attempts = 1

[[upstreams]]
name = "up"
dns_refresh_ms = {refresh_ms}
endpoints = [{{ address = "{name}:{port}" }}]

[[routes]]
id = "all"
upstream = "up"
"#,
        dns = dns.addr(),
    )))
}

/// The bodies of `n` requests, sorted.
async fn bodies(url: &str, n: usize) -> Vec<String> {
    let client = http1_client();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let (status, body) = get(&client, url).await;
        out.push(format!("{status} {body}"));
    }
    out.sort();
    out.dedup();
    out
}

/// Polls `check` every 20 ms until it holds or `limit` passes.
async fn eventually(limit: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn a_name_becomes_one_endpoint_per_address_and_follows_a_changed_answer() {
    let (_a, _b, port) = two_upstreams().await;
    let dns = DnsServer::start();
    dns.set("api.internal", &[ip("127.0.0.2"), ip("127.0.0.3")], 300);
    let (server, url) = gateway(&dns, "api.internal", port, 200);
    // Resolved before the first snapshot: the first requests already reach both addresses.
    assert_eq!(bodies(&url, 6).await, ["200 a", "200 b"]);
    let endpoints: Vec<String> = server.gateway().snapshot().upstreams[0]
        .endpoints
        .iter()
        .map(|e| format!("{} {:?}", e.addr, e.name.as_deref()))
        .collect();
    assert_eq!(
        endpoints,
        [
            format!("127.0.0.2:{port} Some(\"api.internal\")"),
            format!("127.0.0.3:{port} Some(\"api.internal\")")
        ]
    );

    // The answer shrinks to one address: within a few refreshes only it gets requests.
    dns.set("api.internal", &[ip("127.0.0.3")], 300);
    assert!(
        eventually(Duration::from_secs(5), async || bodies(&url, 4).await
            == ["200 b"])
        .await,
        "the changed answer was not applied"
    );
    let text = crate::support::metrics_text(&server);
    // Two changes: from nothing to the first answer, and to the second.
    assert!(
        text.contains("tailguard_dns_lookups_total{name=\"api.internal\",result=\"changed\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("tailguard_dns_addresses{name=\"api.internal\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn a_failed_lookup_keeps_the_last_good_addresses() {
    let (_a, _b, port) = two_upstreams().await;
    let dns = DnsServer::start();
    dns.set("api.internal", &[ip("127.0.0.2")], 300);
    let (server, url) = gateway(&dns, "api.internal", port, 100);
    assert_eq!(bodies(&url, 3).await, ["200 a"]);
    let pool_before =
        std::sync::Arc::clone(&server.gateway().snapshot().upstreams[0].endpoints[0].pool);

    dns.fail("api.internal");
    let before = dns.queries("api.internal");
    assert!(
        eventually(Duration::from_secs(5), async || dns.queries("api.internal")
            >= before + 3)
        .await,
        "the name was not looked up again"
    );
    // A query reaching the DNS server is not yet a lookup the gateway has seen fail (the
    // resolver may still be retrying it): wait for the count, not for a number of queries.
    assert!(
        eventually(Duration::from_secs(5), async || {
            crate::support::metrics_text(&server)
                .contains("tailguard_dns_lookups_total{name=\"api.internal\",result=\"failed\"}")
        })
        .await,
        "the failure was not counted"
    );
    assert_eq!(bodies(&url, 3).await, ["200 a"]);
    // Silence (a timed-out lookup) is a failure too.
    dns.silence("api.internal");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(bodies(&url, 3).await, ["200 a"]);

    // When it answers again with the same address nothing is rebuilt: the same pool.
    dns.set("api.internal", &[ip("127.0.0.2")], 300);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pool_after = &server.gateway().snapshot().upstreams[0].endpoints[0].pool;
    assert!(std::sync::Arc::ptr_eq(&pool_before, pool_after));
}

#[tokio::test]
async fn an_answer_is_looked_up_again_when_its_ttl_runs_out() {
    let (_a, _b, port) = two_upstreams().await;
    let dns = DnsServer::start();
    // A 1 s TTL and a one-minute refresh: only the TTL can bring the new answer in.
    dns.set("api.internal", &[ip("127.0.0.2")], 1);
    let (_server, url) = gateway(&dns, "api.internal", port, 60_000);
    assert_eq!(bodies(&url, 2).await, ["200 a"]);
    dns.set("api.internal", &[ip("127.0.0.3")], 1);
    let changed = Instant::now();
    assert!(
        eventually(Duration::from_secs(5), async || bodies(&url, 2).await
            == ["200 b"])
        .await,
        "the TTL did not trigger a lookup"
    );
    assert!(changed.elapsed() < Duration::from_secs(4));
}

#[tokio::test]
async fn a_name_that_never_resolved_answers_503_with_the_reason_until_it_does() {
    let (_a, _b, port) = two_upstreams().await;
    let dns = DnsServer::start();
    // Unknown to the responder: NXDOMAIN.
    let (server, url) = gateway(&dns, "missing.internal", port, 100);
    let client = http1_client();
    let (status, body) = get(&client, &url).await;
    assert_eq!((status, body.as_str()), (503, "upstream unavailable\n"));
    let snapshot = server.gateway().snapshot();
    let reason = snapshot.upstreams[0]
        .unavailable
        .as_deref()
        .expect("a reason");
    assert!(
        reason.starts_with("missing.internal did not resolve: "),
        "{reason}"
    );
    assert!(
        crate::support::metrics_text(&server)
            .contains("tailguard_errors_total{kind=\"no_endpoint\",blame=\"upstream\"} 1"),
    );

    // Once it resolves (retried within a second while it never has), it serves.
    dns.set("missing.internal", &[ip("127.0.0.3")], 300);
    assert!(
        eventually(Duration::from_secs(5), async || bodies(&url, 2).await
            == ["200 b"])
        .await,
        "the name never came in"
    );
}

#[tokio::test]
async fn a_reload_resolves_new_names_before_it_applies() {
    let (_a, _b, port) = two_upstreams().await;
    let dns = DnsServer::start();
    dns.set("one.internal", &[ip("127.0.0.2")], 300);
    dns.set("two.internal", &[ip("127.0.0.3")], 300);
    let (server, url) = gateway(&dns, "one.internal", port, 60_000);
    assert_eq!(bodies(&url, 2).await, ["200 a"]);
    let config = crate::support::config(&format!(
        r#"
[[listeners]]
address = "{listen}"

[dns]
servers = ["{dns}"]

[[upstreams]]
name = "up"
endpoints = [{{ address = "two.internal:{port}", weight = 3 }}, {{ address = "127.0.0.2:{port}" }}]

[[routes]]
id = "all"
upstream = "up"
"#,
        listen = server.local_addrs()[0],
        dns = dns.addr(),
    ));
    server.reload(config).expect("reload");
    // The very first request after the reload already sees the new name's address.
    let picks: Vec<String> = {
        let client = http1_client();
        let mut v = Vec::new();
        for _ in 0..8 {
            v.push(get(&client, &url).await.1);
        }
        v
    };
    assert_eq!(picks.iter().filter(|b| *b == "b").count(), 6, "{picks:?}");
    assert_eq!(picks.iter().filter(|b| *b == "a").count(), 2, "{picks:?}");
}

#[test]
fn check_accepts_names_and_localhost_and_names_bad_addresses() {
    let ok = crate::support::config(
        r#"
[[listeners]]
address = "127.0.0.1:0"

[[upstreams]]
name = "up"
endpoints = [{ address = "localhost:8080" }, { address = "api.internal:80" }]

[[routes]]
id = "all"
upstream = "up"
"#,
    );
    assert_eq!(ok.upstreams[0].endpoints.len(), 2);
    let err = tailguard_proxy::Config::parse(
        r#"[[listeners]]
address = "127.0.0.1:0"

[dns]
servers = ["dns.internal"]

[[upstreams]]
name = "up"
dns_refresh_ms = 10
endpoints = [{ address = "api_internal:80" }]
"#,
        "gw.toml",
        std::path::Path::new("."),
    )
    .expect_err("invalid")
    .to_string();
    assert!(
        err.contains(
            "gw.toml:5:12: dns.servers[0]: `dns.internal` is not an IP or IP:PORT address"
        ),
        "{err}"
    );
    assert!(
        err.contains(
            "gw.toml:10:26: upstreams[0].endpoints[0].address: `api_internal:80` is not an IP:PORT or NAME:PORT address"
        ),
        "{err}"
    );
    assert!(
        err.contains("upstreams[0].dns_refresh_ms: 10 ms is below the 100 ms floor"),
        "{err}"
    );
}

#[tokio::test]
async fn localhost_resolves_from_the_hosts_file() {
    let upstream = Upstream::builder().body("local").start().await;
    let (_server, url) = start(with_listener(&format!(
        r#"
[[upstreams]]
name = "up"
endpoints = [{{ address = "localhost:{port}" }}]

[[routes]]
id = "all"
upstream = "up"
"#,
        port = upstream.addr.port()
    )));
    let (status, body) = get(&http1_client(), &url).await;
    // /etc/hosts may list ::1 for localhost too; the upstream is on 127.0.0.1 only, and a
    // refused connect to ::1 is retried on 127.0.0.1.
    assert_eq!((status, body.as_str()), (200, "local"));
}

/// Upstreams on one free port at 127.0.0.1 and 127.0.0.2, answering `one` and `two`.
async fn upstreams_on_1_and_2() -> (Upstream, Upstream, u16) {
    for _ in 0..20 {
        let one = Upstream::builder()
            .body("one")
            .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .start()
            .await;
        let port = one.addr.port();
        let two_addr = SocketAddr::from(([127, 0, 0, 2], port));
        if std::net::TcpListener::bind(two_addr).is_ok() {
            let two = Upstream::builder().body("two").bind(two_addr).start().await;
            return (one, two, port);
        }
    }
    panic!("no port free on both 127.0.0.1 and 127.0.0.2");
}

/// Rewrites `path` in place (same inode, same size here) and waits until its modification
/// time differs from `before`'s, so the change is one the gateway can see and the test
/// does not depend on the file system's clock ticking between two writes.
fn rewrite_in_place(path: &std::path::Path, text: &str) {
    let before = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .expect("mtime");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        std::fs::write(path, text).expect("write the hosts file");
        let after = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .expect("mtime");
        if after != before {
            return;
        }
        assert!(Instant::now() < deadline, "the mtime never moved");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Regression test for issue 22 item 5: the hosts file was read once, so a name moved
/// there kept its old address for good.
#[tokio::test]
async fn a_name_moved_in_the_hosts_file_is_followed() {
    let (_one, _two, port) = upstreams_on_1_and_2().await;
    // The name servers know nothing: every address below comes from the hosts file.
    let dns = DnsServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "# test\n127.0.0.1 svc.hosts-test other\n").expect("write");
    let config = tailguard_proxy::Config::parse(
        &format!(
            r#"
[[listeners]]
address = "127.0.0.1:0"

[dns]
servers = ["{dns}"]
timeout_ms = 200
attempts = 1
hosts_file = "hosts"   # relative to the config file

[[upstreams]]
name = "up"
dns_refresh_ms = 1000
endpoints = [{{ address = "svc.hosts-test:{port}" }}]

[[routes]]
id = "all"
upstream = "up"
"#,
            dns = dns.addr(),
        ),
        "gw.toml",
        dir.path(),
    )
    .expect("valid config");
    assert_eq!(config.dns.hosts_path(), hosts);
    let (_server, url) = start(config);
    assert_eq!(bodies(&url, 3).await, ["200 one"]);

    // Moved in place, as it must be where the hosts file is a bind mount (containers).
    rewrite_in_place(&hosts, "# test\n127.0.0.2 svc.hosts-test other\n");
    assert!(
        eventually(Duration::from_secs(5), async || bodies(&url, 3).await
            == ["200 two"])
        .await,
        "the gateway kept the old address"
    );

    // Moved back by replacing the file (a new inode, as editors and platforms do).
    let next = dir.path().join("hosts.new");
    std::fs::write(&next, "# test\n127.0.0.1 svc.hosts-test other\n").expect("write");
    std::fs::rename(&next, &hosts).expect("rename over the hosts file");
    assert!(
        eventually(Duration::from_secs(5), async || bodies(&url, 3).await
            == ["200 one"])
        .await,
        "the replaced file was not read"
    );
}

#[test]
fn an_empty_hosts_file_path_is_an_error() {
    let errors = crate::support::config_errors(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[dns]\nhosts_file = \"\"\n",
    );
    assert_eq!(
        errors,
        ["gw.toml:5:14: dns.hosts_file: must be a file's path (the default is /etc/hosts)"]
    );
}

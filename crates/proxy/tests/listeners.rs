//! Listeners that follow a reload: added, removed, moved, unchanged under load, and a
//! reload whose new address cannot be bound changes nothing.
//!
//! Ports: a listener that may take any port says `127.0.0.1:0` (the kernel picks, the test
//! reads it from `Server::local_addrs`). A test that must name a free port before the
//! gateway binds it holds a reservation ([`reserve_port`]: bound with `SO_REUSEPORT`, never
//! listening), so nothing can race for the port between choosing it and the reload.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tailguard_proxy::{Error, Server};
use tailguard_test_support::{TestCert, Upstream, http1_client, reserve_port, tls_get};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support;

/// A config with a listener on each address (in order), one upstream `up` on `upstream`,
/// a catch-all route, then `extra`. Listener `k`'s address is on line `3k + 2`, column 11.
fn listening_on(addrs: &[String], upstream: SocketAddr, extra: &str) -> tailguard_proxy::Config {
    let mut text = String::new();
    for a in addrs {
        text.push_str(&format!("[[listeners]]\naddress = \"{a}\"\n\n"));
    }
    text.push_str(&format!(
        "[[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{upstream}\" }}]\n\n\
         [[routes]]\nid = \"all\"\nupstream = \"up\"\n\n{extra}"
    ));
    support::config(&text)
}

fn any_port(n: usize) -> Vec<String> {
    vec!["127.0.0.1:0".to_owned(); n]
}

/// `GET path` on a connection of its own (so a refused connect shows), returning the status
/// line, or the error.
async fn get_fresh(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut got = Vec::new();
    s.read_to_end(&mut got).await?;
    let text = String::from_utf8_lossy(&got);
    Ok(text.lines().next().unwrap_or("").to_owned())
}

async fn status_fresh(addr: SocketAddr) -> String {
    get_fresh(addr, "/")
        .await
        .unwrap_or_else(|e| panic!("GET via {addr}: {e}"))
}

/// Connecting to `addr` is refused. Checked right after a reload returns: a removed
/// listener's sockets are shut down before `reload` returns, not when its accept loops next
/// run.
async fn assert_refused(addr: SocketAddr) {
    match tokio::net::TcpStream::connect(addr).await {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
        other => panic!("{addr} is not refused: {other:?}"),
    }
}

#[tokio::test]
async fn a_reload_adds_a_listener_that_serves() {
    let upstream = Upstream::start().await;
    let server = Server::start(listening_on(&any_port(1), upstream.addr, ""), 2).unwrap();
    let first = server.local_addrs()[0];

    server
        .reload(listening_on(&any_port(2), upstream.addr, ""))
        .expect("reload with a second listener");
    let addrs = server.local_addrs();
    assert_eq!(addrs.len(), 2);
    assert_eq!(addrs[0], first, "the unchanged listener kept its socket");
    assert_ne!(addrs[1], first);
    // Through each serving thread's socket: enough connections that both threads take some.
    for _ in 0..20 {
        assert_eq!(status_fresh(addrs[1]).await, "HTTP/1.1 200 OK");
    }
    assert_eq!(status_fresh(first).await, "HTTP/1.1 200 OK");
}

#[tokio::test]
async fn a_reload_removes_a_listener_its_requests_finish_and_the_other_keeps_serving() {
    let upstream = Upstream::start().await;
    let server = Server::start(listening_on(&any_port(2), upstream.addr, ""), 2).unwrap();
    let [kept, removed] = server.local_addrs()[..] else {
        panic!("two listeners")
    };
    // A request in flight on the listener about to go, and an idle keep-alive connection.
    let in_flight = tokio::spawn(get_fresh(removed, "/delay/500"));
    let mut idle = tokio::net::TcpStream::connect(removed).await.unwrap();
    idle.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = idle.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200 OK"));
    let start = Instant::now();
    while upstream.requests() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "request never arrived"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    server
        .reload(listening_on(&any_port(1), upstream.addr, ""))
        .expect("reload without the second listener");
    assert_eq!(server.local_addrs(), vec![kept]);
    assert_refused(removed).await;
    assert_eq!(status_fresh(kept).await, "HTTP/1.1 200 OK");
    // The in-flight request was not cut; the idle connection was closed (EOF), as in a
    // graceful shutdown. 10 s bounds the test, not the behaviour.
    let answered = tokio::time::timeout(Duration::from_secs(10), in_flight)
        .await
        .expect("in-flight request finished")
        .unwrap();
    assert_eq!(answered.unwrap(), "HTTP/1.1 200 OK");
    let eof = tokio::time::timeout(Duration::from_secs(10), idle.read(&mut buf))
        .await
        .expect("idle connection closed");
    assert!(matches!(eof, Ok(0) | Err(_)), "idle connection got {eof:?}");
}

#[tokio::test]
async fn a_reload_moves_a_listener_to_another_port_and_straight_back() {
    let upstream = Upstream::start().await;
    let (_first, a) = reserve_port();
    let (_second, b) = reserve_port();
    let on = |addr: SocketAddr| listening_on(&[addr.to_string()], upstream.addr, "");
    let server = Server::start(on(a), 2).unwrap();
    assert_eq!(status_fresh(a).await, "HTTP/1.1 200 OK");

    server.reload(on(b)).expect("reload onto port b");
    assert_eq!(server.local_addrs(), vec![b]);
    assert_refused(a).await;
    for _ in 0..10 {
        assert_eq!(status_fresh(b).await, "HTTP/1.1 200 OK");
    }

    // Straight back, while a's old accept loops may still be draining: the new sockets on
    // a get every connection (an old socket still listening would reset its share).
    server.reload(on(a)).expect("reload back onto port a");
    assert_eq!(server.local_addrs(), vec![a]);
    assert_refused(b).await;
    for _ in 0..20 {
        assert_eq!(status_fresh(a).await, "HTTP/1.1 200 OK");
    }
}

#[tokio::test]
async fn a_reload_that_cannot_bind_changes_nothing_and_names_the_listener() {
    let a = Upstream::builder().body("a").start().await;
    let b = Upstream::builder().body("b").start().await;
    let server = Server::start(listening_on(&any_port(2), a.addr, ""), 2).unwrap();
    let before = server.local_addrs();
    // Another socket (no SO_REUSEPORT) holds this address; the reserved one could be bound.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap();
    let (_reservation, free) = reserve_port();

    // A new upstream, the first listener kept, a bindable new one and the taken one.
    let config = listening_on(
        &[
            "127.0.0.1:0".to_owned(),
            free.to_string(),
            taken_addr.to_string(),
        ],
        b.addr,
        "",
    );
    let err = server
        .reload(config)
        .expect_err("the taken address fails the reload");
    let Error::Config(diags) = &err else {
        panic!("not a config error: {err}")
    };
    assert_eq!(diags.len(), 1, "{err}");
    let message = err.to_string();
    assert!(
        message.starts_with(&format!(
            "test.toml:8:11: listeners[2].address: cannot listen on {taken_addr}: "
        )),
        "{message}"
    );

    // Nothing changed: the same listeners, the old route, and the bindable address was
    // not left listening.
    assert_eq!(server.local_addrs(), before);
    let client = http1_client();
    for addr in &before {
        let (status, body) = tailguard_test_support::get(&client, &format!("http://{addr}/")).await;
        assert_eq!((status, body.as_str()), (200, "a"));
    }
    assert!(
        tokio::net::TcpStream::connect(free).await.is_err(),
        "the new listener of the failed reload is not listening"
    );
    assert_eq!(b.requests(), 0);
    drop(taken);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_listener_serves_every_request_across_listener_reloads() {
    let upstream = Upstream::start().await;
    let server = Arc::new(Server::start(listening_on(&any_port(1), upstream.addr, ""), 2).unwrap());
    let addr = server.local_addrs()[0];
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    // Two clients on keep-alive connections, two opening a connection per request (a
    // refused or reset connect during a reload would show there).
    for fresh in [false, false, true, true] {
        let (stop, failures, done) = (stop.clone(), failures.clone(), done.clone());
        clients.push(tokio::spawn(async move {
            let client = http1_client();
            let url = format!("http://{addr}/");
            while !stop.load(Ordering::Relaxed) {
                let ok = if fresh {
                    matches!(get_fresh(addr, "/").await.as_deref(), Ok("HTTP/1.1 200 OK"))
                } else {
                    match client.request(support::get(&url)).await {
                        Ok(r) if r.status() == 200 => {
                            let _ = support::text(r).await;
                            true
                        }
                        _ => false,
                    }
                };
                if ok {
                    done.fetch_add(1, Ordering::Relaxed);
                } else {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    // Add a listener, change limits, remove it, move nothing: the first one stays.
    let rounds = [
        (2, ""),
        (2, "[limits]\nconnections = 500\nheader_bytes = 8192\n"),
        (1, "[timeouts]\nidle_ms = 5000\n"),
        (3, ""),
        (1, ""),
    ];
    for (round, (listeners, extra)) in rounds.iter().enumerate() {
        let start = Instant::now();
        while done.load(Ordering::Relaxed) < (round + 1) * 100 {
            assert!(start.elapsed() < Duration::from_secs(30), "no progress");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        server
            .reload(listening_on(&any_port(*listeners), upstream.addr, extra))
            .unwrap();
        assert_eq!(server.local_addrs()[0], addr);
        assert_eq!(server.local_addrs().len(), *listeners);
    }
    let target = done.load(Ordering::Relaxed) + 100;
    let start = Instant::now();
    while done.load(Ordering::Relaxed) < target {
        assert!(start.elapsed() < Duration::from_secs(30), "no progress");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    assert_eq!(failures.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn a_reload_switches_tls_on_and_off_on_the_same_socket() {
    let dir = tempfile::tempdir().unwrap();
    let cert = TestCert::generate(dir.path());
    let upstream = Upstream::start().await;
    let plain = || listening_on(&any_port(1), upstream.addr, "");
    let server = Server::start(plain(), 2).unwrap();
    let addr = server.local_addrs()[0];
    assert_eq!(status_fresh(addr).await, "HTTP/1.1 200 OK");

    let tls = support::config(&format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\ntls = {{ cert = \"{}\", key = \"{}\" }}\n\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{}\" }}]\n\n\
         [[routes]]\nid = \"all\"\nupstream = \"up\"\n",
        cert.cert_path.display(),
        cert.key_path.display(),
        upstream.addr
    ));
    server.reload(tls).expect("reload with tls");
    assert_eq!(server.local_addrs(), vec![addr]);
    let (_, status, _) = tls_get(addr, &cert.cert_der, &[b"h2"], "/").await;
    assert_eq!(status, 200);
    assert_ne!(
        get_fresh(addr, "/").await.unwrap_or_default(),
        "HTTP/1.1 200 OK",
        "plain HTTP is not served on a TLS listener"
    );

    server.reload(plain()).expect("reload back to plain");
    assert_eq!(status_fresh(addr).await, "HTTP/1.1 200 OK");
}

#[tokio::test]
async fn a_reload_that_raises_the_connection_limit_admits_the_waiting_connection() {
    let upstream = Upstream::start().await;
    let limit = |n: usize| {
        listening_on(
            &any_port(1),
            upstream.addr,
            &format!("[limits]\nconnections = {n}\n"),
        )
    };
    let server = Server::start(limit(1), 1).unwrap();
    let url = format!("http://{}/", server.local_addrs()[0]);
    // The first client holds the only slot with an idle keep-alive connection.
    let first = http1_client();
    assert_eq!(tailguard_test_support::get(&first, &url).await.0, 200);
    let second = tokio::spawn({
        let url = url.clone();
        async move { tailguard_test_support::get(&http1_client(), &url).await }
    });
    // Not a timing assertion that can flake: on a slow machine it only checks less.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!second.is_finished(), "served beyond the limit of 1");

    server
        .reload(limit(2))
        .expect("reload with connections = 2");
    let got = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("admitted after the limit was raised");
    assert_eq!(got.unwrap().0, 200);
    drop(first);
}

#[tokio::test]
async fn a_listener_added_with_its_own_access_log_logs_there_and_a_failed_reload_opens_none() {
    let dir = tempfile::tempdir().unwrap();
    let own = dir.path().join("second.log");
    let upstream = Upstream::start().await;
    let server = Server::start(listening_on(&any_port(1), upstream.addr, ""), 2).unwrap();
    let first = server.local_addrs()[0];
    let with_second = |second: &str| {
        support::config(&format!(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
             [[listeners]]\naddress = \"{second}\"\n\
             access_log = {{ path = \"{}\", format = \"combined\" }}\n\n\
             [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{}\" }}]\n\n\
             [[routes]]\nid = \"all\"\nupstream = \"up\"\n",
            own.display(),
            upstream.addr
        ))
    };

    // The new listener's address is taken: the reload fails before its log is opened.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap().to_string();
    assert!(server.reload(with_second(&taken_addr)).is_err());
    assert!(
        !own.exists(),
        "a failed reload created the new listener's log"
    );
    drop(taken);

    server
        .reload(with_second("127.0.0.1:0"))
        .expect("reload with a second listener and its log");
    let second = server.local_addrs()[1];
    for path in ["/via/second/1", "/via/second/2", "/via/second/3"] {
        assert_eq!(get_fresh(second, path).await.unwrap(), "HTTP/1.1 200 OK");
    }
    assert_eq!(
        get_fresh(first, "/via/first").await.unwrap(),
        "HTTP/1.1 200 OK"
    );
    assert!(server.shutdown(Duration::from_secs(10)).await);
    // The clean stop wrote every line of the second listener, and none of the first.
    let text = std::fs::read_to_string(&own).unwrap();
    // Each serving thread buffers its own lines: the order across threads is not fixed.
    let mut targets: Vec<&str> = text
        .lines()
        .map(|l| {
            let start = l.find("\"GET ").expect("a GET request line") + 5;
            &l[start..start + "/via/second/1".len()]
        })
        .collect();
    targets.sort_unstable();
    assert_eq!(
        targets,
        ["/via/second/1", "/via/second/2", "/via/second/3"],
        "{text}"
    );
}

//! SIGHUP applies listener changes: a listener is added, a reload that cannot bind its
//! new address is logged with the file and field and changes nothing, a listener is
//! removed; `--listen` keeps replacing the first listener's address throughout.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tailguard_test_support::{Upstream, http1_client, reserve_port};

use crate::support::Gateway;

/// Listeners on `addrs` (listener `k`'s address on line `3k + 2`, column 11), all proxying
/// to `upstream`.
fn config(addrs: &[String], upstream: SocketAddr) -> String {
    let mut text = String::new();
    for a in addrs {
        text.push_str(&format!("[[listeners]]\naddress = \"{a}\"\n\n"));
    }
    text.push_str(&format!(
        "[[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{upstream}\" }}]\n\n\
         [[routes]]\nid = \"all\"\nupstream = \"up\"\n"
    ));
    text
}

async fn status(addr: SocketAddr) -> u16 {
    tailguard_test_support::get(&http1_client(), &format!("http://{addr}/"))
        .await
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_adds_and_removes_listeners_and_a_failed_bind_keeps_them_all() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    // The file's first address is never bound: --listen replaces it at start and on reload.
    let overridden = "127.0.0.1:1".to_owned();
    std::fs::write(
        &path,
        config(std::slice::from_ref(&overridden), upstream.addr),
    )
    .unwrap();
    let gw = Gateway::run(&[
        "--config",
        path.to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "2",
        "--metrics-listen",
        "off",
    ]);
    let first = gw.addr;
    assert_eq!(status(first).await, 200);

    // Added.
    let (_reservation, added) = reserve_port();
    std::fs::write(
        &path,
        config(&[overridden.clone(), added.to_string()], upstream.addr),
    )
    .unwrap();
    gw.signal("HUP");
    gw.wait_for_log(&format!("listening on {added}"), Duration::from_secs(10));
    assert_eq!(status(added).await, 200);
    assert_eq!(
        status(first).await,
        200,
        "the --listen listener kept its port"
    );

    // A third address another socket holds: the reload fails as a whole.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap();
    std::fs::write(
        &path,
        config(
            &[
                overridden.clone(),
                added.to_string(),
                taken_addr.to_string(),
            ],
            upstream.addr,
        ),
    )
    .unwrap();
    gw.signal("HUP");
    gw.wait_for_log("rejected", Duration::from_secs(10));
    let log = gw.log();
    assert!(
        log.contains(&format!(
            "{}:8:11: listeners[2].address: cannot listen on {taken_addr}",
            path.display()
        )),
        "{log}"
    );
    assert!(log.contains("the running config keeps serving"), "{log}");
    assert_eq!(status(first).await, 200);
    assert_eq!(status(added).await, 200);
    drop(taken);

    // Removed.
    std::fs::write(&path, config(&[overridden], upstream.addr)).unwrap();
    gw.signal("HUP");
    gw.wait_for_log(
        &format!("stopped listening on {added}"),
        Duration::from_secs(10),
    );
    let start = Instant::now();
    while tokio::net::TcpStream::connect(added).await.is_ok() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{added} still accepts"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(status(first).await, 200);
}

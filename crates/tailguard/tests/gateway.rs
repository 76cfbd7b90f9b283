//! The binary end to end: the embedded demo, check, big bodies, reload and shutdown by signal.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use http_body_util::BodyExt;
use tailguard_test_support::{Source, Upstream, http1_client};

use crate::support::{Gateway, check, proxy_config};

#[test]
fn curl_of_the_embedded_demo_route_returns_200() {
    let gw = Gateway::run(&["--listen", "127.0.0.1:0"]);
    let out = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            &format!("{}/", gw.url()),
        ])
        .output()
        .expect("curl (installed by scripts/install-tools)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.ends_with("\n200"), "{text}");
    assert!(text.contains("Hello from tailguard!"), "{text}");
    assert!(text.contains("x-forwarded-for: 127.0.0.1"), "{text}");
    let health = Command::new("curl")
        .args(["-sS", &format!("{}/healthz", gw.url())])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&health.stdout), "ok\n");
}

#[test]
fn check_accepts_the_docs_example_and_rejects_errors_with_positions() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/config.example.toml");
    let (code, stdout, stderr) = check(&example);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains(": ok ("), "{stdout}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[listeners]]\naddress = \"127.0.0.1:99999\"\n\n[[routes]]\nid = \"r\"\nupstream = \"ghost\"\nfoo = 1\n\n[[routes]]\nid = \"s\"\nupstream = \"ghost\"\n",
    )
    .unwrap();
    let (code, _, stderr) = check(&bad);
    assert_eq!(code, 64);
    let file = bad.display();
    assert!(
        stderr.contains(&format!(
            "{file}:2:11: listeners[0].address: `127.0.0.1:99999` is not an IP:PORT address"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("{file}:7:1: routes[0]: unknown field `foo`")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "{file}:11:12: routes[1].upstream: unknown upstream `ghost`"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("3 errors in config"), "{stderr}");

    // `run` refuses the same file with the same messages and EX_USAGE.
    let out = Command::new(env!("CARGO_BIN_EXE_tailguard"))
        .args(["run", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown upstream `ghost`"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_of_256_mib_streams_both_ways_with_bounded_gateway_memory() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    std::fs::write(
        &path,
        proxy_config(
            &[upstream.addr],
            // No request timeout: on a loaded machine a debug build may take more than the
            // default 30 s to stream 256 MiB, and the upstream answers only at the end.
            "[limits]\nbody_bytes = 1_000_000_000\n\n[timeouts]\nrequest_ms = 0\n",
        ),
    )
    .unwrap();
    let gw = Gateway::run(&["--config", path.to_str().unwrap(), "--threads", "2"]);
    let n: u64 = 256 * 1024 * 1024;
    let client = http1_client();

    let req = http::Request::post(format!("{}/sink", gw.url()))
        .body(Source::chunked(n).boxed())
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, n.to_string().as_bytes());

    let resp = client
        .request(
            http::Request::get(format!("{}/source/{n}", gw.url()))
                .body(tailguard_test_support::TestBody::default())
                .unwrap(),
        )
        .await
        .unwrap();
    let mut body = resp.into_body();
    let mut got = 0u64;
    while let Some(frame) = body.frame().await {
        got += frame.unwrap().data_ref().map_or(0, |d| d.len() as u64);
    }
    assert_eq!(got, n);

    // Peak resident set of the gateway process over its whole life.
    let peak_kib = gw.status_kib("VmHWM");
    eprintln!("gateway peak RSS: {peak_kib} KiB");
    assert!(
        peak_kib < 64 * 1024,
        "gateway peak RSS {peak_kib} KiB for 2 x 256 MiB streamed"
    );
}

fn spawn_load(
    url: String,
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..4)
        .map(|_| {
            let (url, stop, ok, failed) = (url.clone(), stop.clone(), ok.clone(), failed.clone());
            tokio::spawn(async move {
                let client = http1_client();
                while !stop.load(Ordering::Relaxed) {
                    let (status, _) =
                        tailguard_test_support::get(&client, &format!("{url}/")).await;
                    if status == 200 {
                        ok.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect()
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reload_under_load_fails_nothing_and_invalid_config_keeps_the_old_one() {
    let a = Upstream::builder().body("a").start().await;
    let b = Upstream::builder().body("b").start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, proxy_config(&[a.addr], "")).unwrap();
    let gw = Gateway::run(&["--config", path.to_str().unwrap()]);

    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let load = spawn_load(gw.url(), stop.clone(), ok.clone(), failed.clone());
    wait_until("traffic to a", || a.requests() > 100).await;

    std::fs::write(&path, proxy_config(&[b.addr], "")).unwrap();
    gw.signal("HUP");
    wait_until("traffic to b", || b.requests() > 100).await;
    let a_after = a.requests();

    // An invalid file: logged with check's messages, and b keeps serving.
    std::fs::write(&path, "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[[routes]]\nid = \"r\"\nupstream = \"ghost\"\n").unwrap();
    gw.signal("HUP");
    gw.wait_for_log("reload of", Duration::from_secs(10));
    let log = gw.log();
    assert!(
        log.contains(&format!(
            "{}:6:12: routes[0].upstream: unknown upstream `ghost`",
            path.display()
        )),
        "{log}"
    );
    assert!(log.contains("the running config keeps serving"), "{log}");
    let b_before = b.requests();
    wait_until("more traffic to b", || b.requests() > b_before + 100).await;

    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.await.unwrap();
    }
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "requests failed during reloads"
    );
    assert!(
        a.requests() <= a_after + 8,
        "a got traffic after the reload (in-flight at most)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_and_exits_0() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, proxy_config(&[upstream.addr], "")).unwrap();
    let mut gw = Gateway::run(&["--config", path.to_str().unwrap()]);
    let url = gw.url();
    let in_flight: Vec<_> = (0..20)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                tailguard_test_support::get(&http1_client(), &format!("{url}/delay/700")).await
            })
        })
        .collect();
    wait_until("20 requests at the upstream", || upstream.requests() == 20).await;
    gw.signal("TERM");
    for r in in_flight {
        assert_eq!(r.await.unwrap(), (200, "ok".to_owned()));
    }
    let status = tokio::task::block_in_place(|| gw.wait_exit(Duration::from_secs(10)));
    assert_eq!(status.code(), Some(0), "{}", gw.log());
    assert!(gw.log().contains("drained, exiting"), "{}", gw.log());
}

//! The access log through the built gateway: a clean stop leaves one line per answered
//! request, SIGUSR1 rotation under load loses and splits nothing, bad config is named.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tailguard_test_support::{get, http1_client};

use crate::support::{Gateway, check};

/// Sends `per_task` GETs from each of `tasks` keep-alive clients, paths `/n/<task>/<i>`;
/// returns how many were answered 200.
fn send(url: &str, tasks: usize, per_task: usize) -> usize {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a client runtime");
    rt.block_on(async {
        let handles: Vec<_> = (0..tasks)
            .map(|t| {
                let url = url.to_owned();
                tokio::spawn(async move {
                    let client = http1_client();
                    let mut ok = 0;
                    for i in 0..per_task {
                        let (status, _) = get(&client, &format!("{url}/n/{t}/{i}")).await;
                        ok += usize::from(status == 200);
                    }
                    ok
                })
            })
            .collect();
        let mut ok = 0;
        for h in handles {
            ok += h.await.expect("client task");
        }
        ok
    })
}

/// The request targets of a combined log, checking each line's shape.
fn targets(text: &str) -> Vec<String> {
    assert!(text.is_empty() || text.ends_with('\n'), "log ends mid-line");
    text.lines()
        .map(|l| {
            assert!(l.starts_with("127.0.0.1 - - ["), "bad line {l:?}");
            let start = l.find("\"GET ").unwrap_or_else(|| panic!("bad line {l:?}")) + 5;
            let end = l
                .find(" HTTP/1.1\" 200 ")
                .unwrap_or_else(|| panic!("bad line {l:?}"));
            l[start..end].to_owned()
        })
        .collect()
}

#[test]
fn clean_stop_after_n_requests_leaves_exactly_n_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let mut gw = Gateway::run(&[
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "2",
        "--access-log",
        path.to_str().unwrap(),
        "--access-log-buffer",
        "4096",
    ]);
    let (tasks, per_task) = (4, 150);
    assert_eq!(send(&gw.url(), tasks, per_task), tasks * per_task);
    gw.signal("TERM");
    assert!(
        gw.wait_exit(Duration::from_secs(30)).success(),
        "{}",
        gw.log()
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let got = targets(&text);
    assert_eq!(got.len(), tasks * per_task, "{}", gw.log());
    let unique: HashSet<&String> = got.iter().collect();
    assert_eq!(unique.len(), tasks * per_task, "a request was logged twice");
    assert!(unique.contains(&"/n/3/149".to_owned()));
}

#[test]
fn json_lines_carry_route_upstream_and_timing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.json");
    let mut gw = Gateway::run(&[
        "--listen",
        "127.0.0.1:0",
        "--access-log",
        path.to_str().unwrap(),
        "--access-log-format",
        "json",
    ]);
    assert_eq!(send(&gw.url(), 1, 20), 20);
    gw.signal("TERM");
    assert!(gw.wait_exit(Duration::from_secs(30)).success());
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 20);
    // Lines from different serving threads' buffers need not be in request order.
    let uris: HashSet<&str> = lines
        .iter()
        .map(|v| v["request_uri"].as_str().unwrap())
        .collect();
    assert_eq!(
        uris,
        (0..20)
            .map(|i| format!("/n/0/{i}"))
            .collect::<HashSet<_>>()
            .iter()
            .map(String::as_str)
            .collect()
    );
    for v in &lines {
        assert_eq!(v["status"], 200);
        assert_eq!(v["route"], "demo");
        assert_eq!(v["upstream_status"], 200);
        assert!(
            v["upstream_addr"]
                .as_str()
                .unwrap()
                .starts_with("127.0.0.1:"),
            "{v}"
        );
        assert!(v["request_time"].as_f64().unwrap() >= 0.0);
        assert!(!v["request_id"].as_str().unwrap().is_empty(), "{v}");
    }
}

#[test]
fn sigusr1_rotation_under_load_loses_and_splits_no_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let mut gw = Gateway::run(&[
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "2",
        "--access-log",
        path.to_str().unwrap(),
        "--access-log-buffer",
        "4096",
    ]);
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let load = {
        let (url, stop, answered) = (gw.url(), Arc::clone(&stop), Arc::clone(&answered));
        std::thread::spawn(move || {
            let mut round = 0;
            while !stop.load(Ordering::Relaxed) {
                answered.fetch_add(send(&url, 2, 50), Ordering::Relaxed);
                round += 1;
            }
            round
        })
    };
    let mut rotated = Vec::new();
    for k in 0..3 {
        // Let some traffic land in the current file, then rotate as logrotate does.
        let before = answered.load(Ordering::Relaxed);
        while answered.load(Ordering::Relaxed) < before + 100 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let old = dir.path().join(format!("access.log.{k}"));
        std::fs::rename(&path, &old).unwrap();
        gw.signal("USR1");
        let start = std::time::Instant::now();
        while !path.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no reopen:\n{}",
                gw.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        rotated.push(old);
    }
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    gw.signal("TERM");
    assert!(
        gw.wait_exit(Duration::from_secs(30)).success(),
        "{}",
        gw.log()
    );
    let mut lines = Vec::new();
    for file in rotated.iter().chain([&path]) {
        lines.extend(targets(&std::fs::read_to_string(file).unwrap()));
    }
    let total = answered.load(Ordering::Relaxed);
    assert_eq!(
        lines.len(),
        total,
        "lines across all files == answered requests"
    );
}

#[test]
fn check_names_a_bad_access_log_variable() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("gw.toml");
    std::fs::write(
        &cfg,
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[[upstreams]]\nname = \"up\"\nendpoints = [{ address = \"127.0.0.1:9\" }]\n\n[[routes]]\nid = \"r\"\nupstream = \"up\"\n\n[access_log]\npath = \"-\"\ntemplate = '$remote_addr $bogus_var'\n",
    )
    .unwrap();
    let (code, _, stderr) = check(&cfg);
    assert_eq!(code, 64, "{stderr}");
    assert!(
        stderr.contains("access_log") && stderr.contains("$bogus_var"),
        "{stderr}"
    );
}

/// The exporter's exposition (HTTP/1.0, so the body is not chunked).
fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect exporter");
    write!(stream, "GET /metrics HTTP/1.0\r\n\r\n").expect("write");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).expect("read");
    raw.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

#[test]
fn idle_lines_reach_the_file_and_the_metrics_within_the_flush_interval() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let mut gw = Gateway::run(&[
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--access-log",
        path.to_str().unwrap(),
    ]);
    gw.wait_for_log("/metrics", Duration::from_secs(20));
    let log = gw.log();
    let metrics = log
        .split("tailguard: metrics on http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("metrics address in the log")
        .to_owned();
    assert_eq!(send(&gw.url(), 1, 20), 20);
    // No more traffic and no shutdown: only the writer's flush interval (1 s) can write
    // the partly filled buffer.
    let series = format!(
        "tailguard_access_log_lines_written_total{{log=\"{}\"}} ",
        path.display()
    );
    let start = std::time::Instant::now();
    loop {
        let text = scrape(&metrics);
        let written = text
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .map(str::to_owned);
        if written.as_deref() == Some("20") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{series}: {written:?}\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(targets(&std::fs::read_to_string(&path).unwrap()).len(), 20);
    gw.signal("TERM");
    assert!(gw.wait_exit(Duration::from_secs(30)).success());
}

#[test]
fn a_log_on_dev_full_keeps_serving_and_counts_errors() {
    let mut gw = Gateway::run(&[
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--access-log",
        "/dev/full",
        "--access-log-buffer",
        "4096",
    ]);
    gw.wait_for_log("/metrics", Duration::from_secs(20));
    let metrics = gw
        .log()
        .split("tailguard: metrics on http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("metrics address in the log")
        .to_owned();
    // Every request is answered although no line can be written.
    assert_eq!(send(&gw.url(), 2, 200), 400);
    let series = "tailguard_access_log_write_errors_total{log=\"/dev/full\"} ";
    let start = std::time::Instant::now();
    loop {
        let text = scrape(&metrics);
        let errors: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(series))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        if errors > 0.0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no write errors counted:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    gw.signal("TERM");
    assert!(
        gw.wait_exit(Duration::from_secs(30)).success(),
        "{}",
        gw.log()
    );
    assert!(gw.log().contains("access log write failed"), "{}", gw.log());
}

#[test]
fn a_stalled_log_pipe_drops_and_counts_but_never_holds_requests_or_the_exit() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("stalled.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    // The read end: opened (which waits for the gateway to open the write end), then left
    // unread until the gateway has exited.
    let (opened_tx, opened_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut file = std::fs::File::open(&fifo).unwrap();
            opened_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            let mut text = String::new();
            file.read_to_string(&mut text).unwrap();
            text
        })
    };
    let mut gw = Gateway::run(&[
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--access-log",
        fifo.to_str().unwrap(),
        "--access-log-buffer",
        "4096",
    ]);
    opened_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    gw.wait_for_log("/metrics", Duration::from_secs(20));
    let metrics = gw
        .log()
        .split("tailguard: metrics on http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("metrics address in the log")
        .to_owned();
    // 4000 lines of ~80 B: far more than the 64 KiB pipe plus 32 buffers of 4 KiB.
    assert_eq!(send(&gw.url(), 4, 1000), 4000, "every request answered");
    let text = scrape(&metrics);
    let series = format!(
        "tailguard_access_log_dropped_lines_total{{log=\"{}\"}} ",
        fifo.display()
    );
    let dropped: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(
        dropped > 0.0,
        "{series} in\n{}",
        text.lines()
            .filter(|l| l.contains("access_log"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The writer is stuck in write(2); the stop gives up on it after its deadline.
    gw.signal("TERM");
    assert!(
        gw.wait_exit(Duration::from_secs(30)).success(),
        "{}",
        gw.log()
    );
    assert!(gw.log().contains("still writing"), "{}", gw.log());
    go_tx.send(()).unwrap();
    let lines = reader.join().unwrap();
    assert!(lines.lines().count() < 4000);
}

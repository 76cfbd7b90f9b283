//! The gateway's metrics, scraped from the binary's exporter: the request, error, reload and
//! synthetic series move with real traffic, and `promtool check metrics` accepts the scrape.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::support::Gateway;

const CONFIG: &str = r#"
[[listeners]]
address = "127.0.0.1:0"

[[upstreams]]
name = "demo"
builtin = { status = 200, body = "hi" }

[[upstreams]]
name = "down"
endpoints = [{ address = "127.0.0.1:1" }]

[[routes]]
id = "demo"
upstream = "demo"
path = { prefix = "/" }

[[routes]]
id = "down"
upstream = "down"
path = { prefix = "/down" }

# The command line's --metrics-listen overrides `listen`; synthetic_series comes from here.
[metrics]
listen = "off"
synthetic_series = 2000
"#;

/// GET over a fresh connection; returns (status, body).
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

/// The exposition as text; the exporter answers HTTP/1.1 with a chunked body, so ask
/// HTTP/1.0 for a plain one.
fn scrape(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect exporter");
    write!(stream, "GET /metrics HTTP/1.0\r\n\r\n").expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read");
    let text = String::from_utf8(raw).expect("utf-8 exposition");
    let (head, body) = text.split_once("\r\n\r\n").expect("head");
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    body.to_owned()
}

fn value(exposition: &str, series: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn gateway_scrape_counts_traffic_and_passes_promtool() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("gw.toml");
    std::fs::write(&config, CONFIG).expect("write config");
    let config = config.to_str().expect("utf-8 path");
    // One serving thread: each thread has its own upstream pool, and the counts below
    // assume all five requests share one.
    let gateway = Gateway::run(&[
        "--config",
        config,
        "--metrics-listen",
        "127.0.0.1:0",
        "--threads",
        "1",
    ]);
    gateway.wait_for_log("/metrics", Duration::from_secs(20));
    let log = gateway.log();
    let metrics: SocketAddr = log
        .split("tailguard: metrics on http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|a| a.parse().ok())
        .expect("metrics address in the log");

    for _ in 0..5 {
        assert_eq!(get(gateway.addr, "/").0, 200);
    }
    for _ in 0..2 {
        assert_eq!(get(gateway.addr, "/down/x").0, 502);
    }
    let text = scrape(metrics);
    for (series, expected) in [
        (
            r#"tailguard_requests_total{route="demo",method="GET",status="200"}"#,
            5.0,
        ),
        (
            r#"tailguard_requests_total{route="down",method="GET",status="502"}"#,
            2.0,
        ),
        (
            r#"tailguard_errors_total{kind="upstream_connect",blame="upstream"}"#,
            2.0,
        ),
        (
            r#"tailguard_request_duration_seconds_count{route="demo"}"#,
            5.0,
        ),
        (r#"tailguard_downstream_connections_opened_total"#, 7.0),
        (r#"tailguard_requests_in_flight"#, 0.0),
        ("tailguard_upstream_connections_opened_total", 1.0),
        ("tailguard_upstream_connections_reused_total", 4.0),
        (r#"tailguard_build_info{version="0.1.0"}"#, 1.0),
    ] {
        assert_eq!(
            value(&text, series),
            Some(expected),
            "{series} in\n{}",
            text.lines()
                .filter(|l| !l.contains("synthetic"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert!(value(&text, "process_resident_memory_bytes").is_some_and(|v| v > 0.0));
    // The synthetic series: at least 2000 samples, and every request updated one unit.
    let synthetic: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("tailguard_synthetic_"))
        .collect();
    assert!(
        synthetic.len() >= 2000,
        "{} synthetic samples",
        synthetic.len()
    );
    let updates: f64 = synthetic
        .iter()
        .filter(|l| l.starts_with("tailguard_synthetic_http_status_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(updates, 7.0);

    let (ok, output) = tailguard_test_support::promtool_check(text.as_bytes());
    assert!(ok, "promtool check metrics: {output}");

    gateway.signal("HUP");
    gateway.wait_for_log("reloaded", Duration::from_secs(20));
    let text = scrape(metrics);
    assert_eq!(
        value(&text, r#"tailguard_config_reloads_total{result="ok"}"#),
        Some(1.0)
    );
}

#[test]
fn rejected_reload_sets_last_reload_successful_to_0_until_one_is_applied() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, CONFIG).expect("write config");
    let config = path.to_str().expect("utf-8 path");
    let gateway = Gateway::run(&["--config", config, "--metrics-listen", "127.0.0.1:0"]);
    gateway.wait_for_log("/metrics", Duration::from_secs(20));
    let metrics: SocketAddr = gateway
        .log()
        .split("tailguard: metrics on http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|a| a.parse().ok())
        .expect("metrics address in the log");
    let last = "tailguard_config_last_reload_successful";
    assert_eq!(value(&scrape(metrics), last), Some(1.0), "at startup");

    std::fs::write(&path, format!("{CONFIG}\n[[routes]]\nid = \"ghost\"\n")).expect("write");
    gateway.signal("HUP");
    gateway.wait_for_log("rejected", Duration::from_secs(20));
    let text = scrape(metrics);
    assert_eq!(value(&text, last), Some(0.0), "after a rejected reload");
    assert_eq!(
        value(&text, r#"tailguard_config_reloads_total{result="failed"}"#),
        Some(1.0)
    );

    std::fs::write(&path, CONFIG).expect("write");
    gateway.signal("HUP");
    gateway.wait_for_log("reloaded", Duration::from_secs(20));
    assert_eq!(
        value(&scrape(metrics), last),
        Some(1.0),
        "after a good reload"
    );
}

/// Issue 25: the gateway runs without transparent huge pages, whatever the host's mode: its
/// allocator's freed memory must be given back 64 KiB at a time, not held in 2 MiB pages.
#[test]
fn the_gateway_runs_without_transparent_huge_pages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("gw.toml");
    std::fs::write(&config, CONFIG).expect("write config");
    let config = config.to_str().expect("utf-8 path");
    let gateway = Gateway::run(&["--config", config, "--metrics-listen", "127.0.0.1:0"]);
    gateway.wait_for_log("listening on", Duration::from_secs(20));
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", gateway.child.id())).expect("status");
    let thp = status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(str::trim);
    // Kernels before 5.0 do not show the flag; there is nothing to check then.
    if let Some(thp) = thp {
        assert_eq!(thp, "0", "THP_enabled in /proc/<pid>/status");
    }
}

/// Issue 26: the gateway's exporter thread runs at SCHED_IDLE unless told otherwise, so on a
/// core it shares with a serving thread it gives way as soon as that thread wakes (at nice 19
/// it could keep the core for the rest of its time slice).
#[test]
fn exporter_thread_runs_at_sched_idle_by_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("gw.toml");
    std::fs::write(&config, CONFIG).expect("write config");
    let config = config.to_str().expect("utf-8 path");
    let gateway = Gateway::run(&["--config", config, "--metrics-listen", "127.0.0.1:0"]);
    gateway.wait_for_log(
        "metrics exporter: running at SCHED_IDLE",
        Duration::from_secs(20),
    );
    let tasks = std::fs::read_dir(format!("/proc/{}/task", gateway.child.id())).expect("tasks");
    let exporters: Vec<(u32, i32)> = tasks
        .map(|task| task.expect("task").path())
        .filter(|task| {
            std::fs::read_to_string(task.join("comm")).is_ok_and(|c| c.trim() == "metrics-exporte")
        })
        .map(|task| {
            let stat = std::fs::read_to_string(task.join("stat")).expect("stat");
            let fields: Vec<&str> = stat[stat.rfind(')').expect("comm") + 2..]
                .split(' ')
                .collect();
            // Policy is field 41 of /proc/<pid>/task/<tid>/stat (SCHED_IDLE = 5), nice 19.
            (
                fields[41 - 3].parse().expect("policy"),
                fields[19 - 3].parse().expect("nice"),
            )
        })
        .collect();
    assert_eq!(exporters, [(5, 19)], "the gateway's one exporter thread");
}

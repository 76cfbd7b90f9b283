//! A real Prometheus server (Debian's `/usr/bin/prometheus`) scrapes the exporter; its HTTP
//! API must report the target up and the counter's value. Bounded: waits at most 30 s,
//! and the server is killed when the test ends, pass or fail.

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tailguard_metrics::{Exporter, ExporterConfig, Registry};

use crate::support::get;

/// Kills the child process on drop.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    // The port is free when we look; Prometheus binds it a moment later (a small race that
    // only ever makes the test fail loudly, never pass wrongly).
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Queries Prometheus's instant-query API; returns the first result's value if any.
fn query(prometheus: SocketAddr, promql: &str) -> Option<String> {
    let encoded: String = promql
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let response = get(prometheus, &format!("/api/v1/query?query={encoded}"), &[]);
    if response.status != 200 {
        return None;
    }
    let json: serde_json::Value = serde_json::from_slice(&response.body).ok()?;
    json["data"]["result"][0]["value"][1]
        .as_str()
        .map(str::to_owned)
}

#[test]
fn prometheus_scrapes_the_exporter() {
    let registry = Registry::new();
    let requests = registry
        .counter("demo_requests", "Requests served.", &["route"])
        .unwrap()
        .get_or_create(&["/a"])
        .unwrap();
    requests.add(42);
    registry
        .histogram("demo_latency_seconds", "Latency.", &["route"], &[0.1, 1.0])
        .unwrap()
        .get_or_create(&["/a"])
        .unwrap()
        .observe(0.5);
    let exporter = Exporter::spawn(
        registry,
        ExporterConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..ExporterConfig::default()
        },
    )
    .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n  - job_name: tailguard\n    static_configs:\n      - targets: ['{}']\n",
            exporter.local_addr()
        ),
    )
    .unwrap();
    let port = free_port();
    let prometheus_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let _prometheus = KillOnDrop(
        Command::new("/usr/bin/prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={prometheus_addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
            .spawn()
            .expect("/usr/bin/prometheus is installed (scripts/install-tools)"),
    );

    let deadline = Instant::now() + Duration::from_secs(30);
    let mut up = None;
    let mut value = None;
    let mut bucket = None;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(prometheus_addr).is_ok() {
            up = query(prometheus_addr, "up{job=\"tailguard\"}");
            value = query(prometheus_addr, "demo_requests_total{route=\"/a\"}");
            bucket = query(
                prometheus_addr,
                "demo_latency_seconds_bucket{le=~\"1|1.0\"}",
            );
            if up.as_deref() == Some("1") && value.is_some() && bucket.is_some() {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(up.as_deref(), Some("1"), "target never came up");
    assert_eq!(value.as_deref(), Some("42"));
    // Prometheus 3 normalises `le="1.0"` to `le="1"` on ingestion; 2.x keeps it.
    assert_eq!(bucket.as_deref(), Some("1"));
    exporter.shutdown();
}

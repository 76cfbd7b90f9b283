//! The exporter over real sockets: negotiation, gzip, paths, the scrape budget.

use std::io::Read;

use tailguard_metrics::{Exporter, ExporterConfig, Format, Priority, Registry};

use crate::support::{every_type, get};

fn spawn(registry: Registry, priority: Priority) -> Exporter {
    Exporter::spawn(
        registry,
        ExporterConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            priority,
            ..ExporterConfig::default()
        },
    )
    .unwrap()
}

#[test]
fn serves_text_by_default_and_openmetrics_when_asked() {
    let registry = every_type();
    let exporter = spawn(registry.clone(), Priority::Normal);
    let addr = exporter.local_addr();

    let text = get(addr, "/metrics", &[]);
    assert_eq!(text.status, 200);
    assert!(text.complete);
    assert_eq!(
        text.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert_eq!(text.body, registry.render(Format::Text));

    let prometheus_accept = "application/openmetrics-text;version=1.0.0;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
    let om = get(addr, "/metrics", &[("Accept", prometheus_accept)]);
    assert_eq!(om.status, 200);
    assert_eq!(
        om.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    assert!(om.body.ends_with(b"# EOF\n"));
    assert_eq!(om.body, registry.render(Format::OpenMetrics));

    assert_eq!(get(addr, "/other", &[]).status, 404);
    exporter.shutdown();
}

#[test]
fn gzips_when_accept_encoding_allows() {
    let registry = Registry::builder()
        .self_metrics_prefix(None)
        .build()
        .unwrap();
    let family = registry.counter("many", "Many series.", &["i"]).unwrap();
    for i in 0..20_000 {
        family.get_or_create(&[&i.to_string()]).unwrap().inc();
    }
    let exporter = spawn(registry.clone(), Priority::Nice(10));
    let response = get(
        exporter.local_addr(),
        "/metrics",
        &[("Accept-Encoding", "gzip")],
    );
    assert_eq!(response.status, 200);
    assert!(response.complete);
    assert_eq!(response.header("content-encoding"), Some("gzip"));
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(&response.body[..])
        .read_to_end(&mut plain)
        .unwrap();
    assert_eq!(plain, registry.render(Format::Text));
    assert!(
        response.body.len() * 4 < plain.len(),
        "gzip should shrink the text"
    );

    let identity = get(
        exporter.local_addr(),
        "/metrics",
        &[("Accept-Encoding", "identity")],
    );
    assert_eq!(identity.header("content-encoding"), None);
    assert_eq!(identity.body, plain);
}

#[test]
fn a_scrape_past_its_budget_is_aborted_not_truncated() {
    let registry = Registry::new();
    let family = registry
        .counter("many", "Many series.", &["route", "status"])
        .unwrap();
    for i in 0..300_000 {
        family
            .get_or_create(&[
                &format!("/a/rather/long/route/{}", i / 100),
                &(i % 100).to_string(),
            ])
            .unwrap();
    }
    let exporter = spawn(registry.clone(), Priority::Normal);
    // 0.01 s leaves a 10 ms budget: far less than rendering 300k series takes.
    let response = get(
        exporter.local_addr(),
        "/metrics",
        &[("X-Prometheus-Scrape-Timeout-Seconds", "0.01")],
    );
    assert_eq!(response.status, 200);
    assert!(
        !response.complete,
        "an over-budget scrape must not end like a whole one"
    );
    // The next scrape, without a tight budget, is whole and counts the timeout.
    let whole = get(exporter.local_addr(), "/metrics", &[]);
    assert!(whole.complete);
    let text = String::from_utf8(whole.body).unwrap();
    assert!(
        text.contains("metrics_scrapes_total{outcome=\"timeout\"} 1\n"),
        "{}",
        &text[..2000]
    );
}

/// The `/proc` directory of every exporter thread of this process (tests run in parallel,
/// so there may be several).
fn exporter_tasks() -> Vec<std::path::PathBuf> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .map(|task| task.unwrap().path())
        .filter(|task| {
            std::fs::read_to_string(task.join("comm")).is_ok_and(|c| c.trim() == "metrics-exporte")
        })
        .collect()
}

/// (scheduling policy, nice) of every exporter thread.
fn exporter_threads() -> Vec<(u32, i32)> {
    exporter_tasks()
        .iter()
        .map(|task| {
            let stat = std::fs::read_to_string(task.join("stat")).unwrap();
            let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
            // policy is field 41 of /proc/<pid>/task/<tid>/stat, nice field 19.
            (
                fields[41 - 3].parse().unwrap(),
                fields[19 - 3].parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn runs_at_idle_priority() {
    let registry = every_type();
    let exporter = spawn(registry.clone(), Priority::Idle);
    let response = get(exporter.local_addr(), "/metrics", &[]);
    assert_eq!(response.status, 200);
    assert_eq!(response.body, registry.render(Format::Text));
    // SCHED_IDLE is policy 5, set by the exporter thread itself (no helper process).
    let threads = exporter_threads();
    assert!(threads.contains(&(5, 19)), "{threads:?}");
}

/// Issue 26: on a shared core a nice 19 exporter delayed a waking serving thread by up to a
/// time slice; the default is SCHED_IDLE, which gives way at once.
#[test]
fn runs_at_sched_idle_by_default() {
    assert_eq!(ExporterConfig::default().priority, Priority::Idle);
    let registry = every_type();
    let exporter = Exporter::spawn(
        registry.clone(),
        ExporterConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..ExporterConfig::default()
        },
    )
    .unwrap();
    let response = get(exporter.local_addr(), "/metrics", &[]);
    assert_eq!(response.status, 200);
    let threads = exporter_threads();
    assert!(threads.contains(&(5, 19)), "{threads:?}");
}

#[test]
fn runs_at_nice_19_when_asked() {
    let registry = every_type();
    let exporter = spawn(registry.clone(), Priority::Nice(19));
    let response = get(exporter.local_addr(), "/metrics", &[]);
    assert_eq!(response.status, 200);
    // Normal policy (0) at nice 19: no other test here asks for that.
    let threads = exporter_threads();
    assert!(threads.contains(&(0, 19)), "{threads:?}");
}

#[test]
fn pins_the_exporter_thread_to_the_cpus_asked_for() {
    // The last CPU this process may use: pinned there, the exporter's allowed list is it.
    let last = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
    let registry = every_type();
    let exporter = Exporter::spawn(
        registry.clone(),
        ExporterConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            cpus: vec![last],
            ..ExporterConfig::default()
        },
    )
    .unwrap();
    let response = get(exporter.local_addr(), "/metrics", &[]);
    assert_eq!(response.body, registry.render(Format::Text));
    let allowed: Vec<String> = exporter_tasks()
        .iter()
        .map(|task| {
            let status = std::fs::read_to_string(task.join("status")).unwrap();
            status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .unwrap()
                .trim()
                .to_owned()
        })
        .collect();
    assert!(allowed.contains(&last.to_string()), "{allowed:?}");
}

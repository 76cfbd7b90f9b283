//! A stepped load's timeline: per-second counts and latency, the step timings, the gateway's
//! gauges read every second (or absent), and several streams on one clock.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tailguard_loadgen::load::{LoadConfig, run, run_streams};
use tailguard_loadgen::schedule::Phase;
use tailguard_loadgen::scrape::{WatchConfig, read_samples};
use tailguard_test_support::blocking;

/// A gateway in miniature: at most `limit` requests in flight, each held `hold`; the rest get
/// 503 at once. `/metrics` exports the limit, the in-flight count and the rejections the way
/// the gateway names them.
fn limited_server(limit: usize, hold: Duration) -> blocking::Server {
    let inflight = Arc::new(AtomicUsize::new(0));
    let limited = Arc::new(AtomicU64::new(0));
    blocking::start(move |listener| async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let (inflight, limited) = (inflight.clone(), limited.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let (inflight, limited) = (inflight.clone(), limited.clone());
                    async move {
                        if req.uri().path() == "/metrics" {
                            let text = format!(
                                "# TYPE tailguard_upstream_limit gauge\n\
                                 tailguard_upstream_limit{{upstream=\"a\"}} {limit}\n\
                                 tailguard_upstream_inflight{{upstream=\"a\"}} {}\n\
                                 tailguard_upstream_limited_total{{upstream=\"a\"}} {}\n",
                                inflight.load(Ordering::Relaxed),
                                limited.load(Ordering::Relaxed)
                            );
                            return Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(
                                text,
                            ))));
                        }
                        if inflight.fetch_add(1, Ordering::Relaxed) >= limit {
                            inflight.fetch_sub(1, Ordering::Relaxed);
                            limited.fetch_add(1, Ordering::Relaxed);
                            let mut resp = Response::new(Full::new(Bytes::new()));
                            *resp.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
                            return Ok(resp);
                        }
                        tokio::time::sleep(hold).await;
                        inflight.fetch_sub(1, Ordering::Relaxed);
                        Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    })
}

fn phases(list: &[(f64, u64)]) -> Vec<Phase> {
    list.iter()
        .map(|&(rate, ms)| Phase {
            rate,
            duration: Duration::from_millis(ms),
        })
        .collect()
}

#[test]
fn a_stepped_run_counts_each_second_and_times_the_rejections_after_each_step() {
    // Capacity 16 / 80 ms = 200 req/s: 50/s passes, 1000/s is rejected from the step on.
    // (16 slots held 80 ms rather than 4 held 20 ms: the same capacity, but at 50/s a stall
    // of the test's own server must last 240 ms, not 60, before a request finds no slot; one
    // run on a machine busy with builds saw a 98 ms stall reject one request at 50/s.)
    let server = limited_server(16, Duration::from_millis(80));
    let mut config = LoadConfig::new(&server.url("/"), 50.0, Duration::from_secs(3), 64);
    config.phases = phases(&[(50.0, 1000), (1000.0, 1000), (50.0, 1000)]);
    config.timeout = Duration::from_secs(2);
    config.watch = Some(WatchConfig {
        url: server.url("/metrics"),
        every: Duration::from_secs(1),
        metrics: tailguard_loadgen::timeline::DEFAULT_GAUGES
            .iter()
            .map(ToString::to_string)
            .collect(),
    });
    let report = run(&config).unwrap();
    let t = &report.timeline;
    assert!((report.requested_rate - 366.67).abs() < 0.1);
    let offered: Vec<u64> = t.seconds.iter().take(3).map(|s| s.offered).collect();
    assert_eq!(offered, [50, 1000, 50]);
    assert_eq!(t.seconds[0].rejected, 0, "{:?}", t.seconds[0]);
    // At most 16 in flight for 80 ms: ~200 of the 1000 pass in the step's second.
    let step = &t.seconds[1];
    assert!(step.rejected >= 600, "{} rejected", step.rejected);
    assert!(step.ok >= 100 && step.ok <= 260, "{} ok", step.ok);
    assert!(step.admitted.percentile_us(50.0) >= 80_000);
    // The phases agree with the seconds (the steps fall on whole seconds here).
    assert_eq!(t.phases.len(), 3);
    assert_eq!(t.phases[1].offered, 1000);
    assert_eq!(
        t.phases.iter().map(|p| p.rejected).sum::<u64>(),
        report.status.get(&503).copied().unwrap_or(0)
    );
    let steps = t.steps();
    assert_eq!(steps.len(), 2);
    assert_eq!((steps[0].from_rate, steps[0].to_rate), (50.0, 1000.0));
    let first = steps[0]
        .first_reject_after_s
        .expect("rejections after the step up");
    assert!(first < 0.1, "first rejection {first} s after the step");
    // After the step down the queue is gone within a service time or two.
    if let Some(last) = steps[1].last_reject_after_s {
        assert!(last < 0.2, "last rejection {last} s after the step down");
    }
    let lines = tailguard_loadgen::timeline::step_lines(t);
    assert!(lines[0].starts_with("step up at 1.0 s (50 -> 1000 req/s): first rejection "));
    assert!(
        lines[1].starts_with("step down at 2.0 s (1000 -> 50 req/s): recovery "),
        "{lines:?}"
    );
    // The gauges, read once a second; the counter as its increase per second.
    let limit = &t.gauges["upstream_limit[a]"];
    assert!(
        limit.len() >= 3 && limit.iter().take(3).all(|v| *v == Some(16.0)),
        "{limit:?}"
    );
    assert!(t.gauges.contains_key("upstream_inflight[a]"));
    let limited = &t.gauges["upstream_limited_per_s[a]"];
    assert!(
        limited[1].unwrap_or(0.0) + limited[2].unwrap_or(0.0) >= 500.0,
        "{limited:?}"
    );
    let csv = tailguard_loadgen::timeline::csv(t, &[]);
    let header = csv.lines().next().unwrap();
    assert!(
        header.starts_with("t_s,offered,goodput,rejected_503,"),
        "{header}"
    );
    assert!(header.ends_with(",upstream_limit[a],upstream_inflight[a],upstream_limited_per_s[a]"));
    assert!(csv.lines().nth(1).unwrap().starts_with("0,50,"));
    let svg = tailguard_loadgen::timeline::plot("t", t, &[]);
    assert!(svg.starts_with("<svg") && svg.contains("limit a") && svg.contains("admitted P99"));
    // The report keeps the timeline through JSON.
    let back = tailguard_loadgen::report::Report::from_json(&report.to_json()).unwrap();
    // (Not assert_eq: the Debug form of a timeline is every bucket of every second.)
    assert!(back.timeline == report.timeline);
}

#[test]
fn metrics_the_gateway_does_not_export_leave_empty_columns() {
    let server = limited_server(100, Duration::from_millis(20));
    let mut config = LoadConfig::new(&server.url("/"), 100.0, Duration::from_secs(2), 8);
    config.watch = Some(WatchConfig {
        url: server.url("/no-such-metrics"),
        every: Duration::from_secs(1),
        metrics: vec!["tailguard_nothing".into()],
    });
    let report = run(&config).unwrap();
    assert!(report.timeline.gauges.is_empty());
    let csv = tailguard_loadgen::timeline::csv(&report.timeline, &[]);
    let mut lines = csv.lines();
    assert!(
        lines
            .next()
            .unwrap()
            .ends_with(",upstream_limit,upstream_inflight")
    );
    assert!(lines.next().unwrap().ends_with(",,"));
    let table = tailguard_loadgen::timeline::second_table(&report.timeline);
    assert!(
        table.lines().nth(2).unwrap().ends_with("| - | - |"),
        "{table}"
    );
    let svg = tailguard_loadgen::timeline::plot("t", &report.timeline, &[]);
    assert!(svg.contains("no tailguard_upstream_limit"));
}

#[test]
fn streams_share_one_clock_and_keep_their_own_reports() {
    let server = limited_server(100, Duration::from_millis(20));
    let a = LoadConfig::new(&server.url("/a"), 200.0, Duration::from_secs(2), 8);
    let mut b = LoadConfig::new(&server.url("/b"), 50.0, Duration::from_secs(2), 4);
    // A stream may step on its own; the window is the first stream's.
    b.phases = phases(&[(50.0, 1000), (0.0, 1000)]);
    let reports = run_streams(&[a, b]).unwrap();
    assert_eq!(reports.len(), 2);
    assert_eq!(reports[0].sent, 400);
    assert_eq!(reports[1].sent, 50);
    assert!(reports[0].url.ends_with("/a") && reports[1].url.ends_with("/b"));
    let b = &reports[1].timeline;
    assert_eq!(
        (
            b.seconds[0].offered,
            b.seconds.get(1).map_or(0, |s| s.offered)
        ),
        (50, 0)
    );
    assert_eq!(reports[1].requested_rate, 25.0);
    let mut total = reports[0].timeline.clone();
    total.add_stream(b);
    assert_eq!(total.seconds[0].offered, 250);
    // b steps where a does not: the total keeps one phase, at the mean rate of both.
    assert_eq!(total.phases.len(), 1);
    assert_eq!(total.phases[0].rate, 225.0);
    assert_eq!(total.phases[0].offered, 450);
    // Two constant streams: one phase, rates added.
    let mut same = reports[0].timeline.clone();
    same.add_stream(&reports[0].timeline);
    assert_eq!((same.phases.len(), same.phases[0].rate), (1, 400.0));
    let streams = vec![
        ("a".to_string(), &reports[0].timeline),
        ("b".to_string(), b),
    ];
    let csv = tailguard_loadgen::timeline::csv(&total, &streams);
    assert!(csv.lines().next().unwrap().contains(",a.goodput,") && csv.contains(",b.offered,"));
}

#[test]
fn samples_are_read_by_name_with_label_values_as_the_column() {
    let text = "# HELP x\n\
        tailguard_upstream_limit{upstream=\"a\"} 12\n\
        tailguard_upstream_limit{upstream=\"b \\\"q\\\"\"} 7.5\n\
        tailguard_upstream_limit_other{upstream=\"a\"} 1\n\
        tailguard_overload_shed_total{group=\"all\",class=\"normal\"} 3 1700000000\n\
        tailguard_plain 2\n\
        tailguard_upstream_inflight{upstream=\"a\"} NaN\n";
    let names: Vec<String> = [
        "tailguard_upstream_limit",
        "tailguard_overload_shed_total",
        "tailguard_plain",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    let got = read_samples(text, &names);
    assert_eq!(
        got,
        [
            ("upstream_limit[a]".to_string(), 12.0),
            ("upstream_limit[b \"q\"]".to_string(), 7.5),
            ("overload_shed_total[all/normal]".to_string(), 3.0),
            ("plain".to_string(), 2.0),
        ]
    );
}

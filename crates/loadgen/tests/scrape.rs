//! A scrape that stalls the server (the APISIX failure) shows in the distribution of the
//! requests that overlapped it, and each scrape is recorded on the generator's clock.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use tailguard_loadgen::load::{LoadConfig, run};
use tailguard_loadgen::scrape::ScrapeConfig;
use tailguard_test_support::blocking;
use tokio::sync::RwLock;

use crate::support;

#[test]
fn requests_overlapping_a_stalling_scrape_get_their_own_percentiles() {
    // /metrics holds the server-wide lock for 150 ms, as a scrape rendered on a serving worker
    // does; every other request takes the lock briefly.
    let gate = Arc::new(RwLock::new(()));
    let server = blocking::start(move |listener| {
        support::serve_requests(listener, move |req, _| {
            let gate = gate.clone();
            async move {
                if req.uri().path() == "/metrics" {
                    let _held = gate.write().await;
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    return Response::new(Full::new(Bytes::from(vec![b'#'; 5000])));
                }
                drop(gate.read().await);
                Response::new(Full::new(Bytes::from_static(b"ok")))
            }
        })
    });
    let mut config = LoadConfig::new(&server.url("/"), 500.0, Duration::from_secs(3), 8);
    config.scrape = Some(ScrapeConfig {
        url: server.url("/metrics"),
        every: Duration::from_secs(1),
        gzip: true,
    });
    let report = run(&config).unwrap();
    // Scrapes at 0.5 s, 1.5 s and 2.5 s of the run, each ~150 ms, 5000 bytes, status 200.
    assert_eq!(report.scrapes.len(), 3, "{:?}", report.scrapes);
    for (i, s) in report.scrapes.iter().enumerate() {
        assert_eq!((s.status, s.bytes, s.error.as_deref()), (200, 5000, None));
        assert!(
            s.duration_ms >= 150.0,
            "scrape {i} took {} ms",
            s.duration_ms
        );
        assert!(
            (s.start_s - (0.5 + i as f64)).abs() < 0.1,
            "scrape {i} at {} s",
            s.start_s
        );
    }
    let during = &report.latency_during_scrape;
    // ~75 requests are due during each 150 ms stall, so at least that many overlap in all,
    // and fewer than half of the run.
    assert!(during.count() >= 150, "{} overlapped", during.count());
    assert!(during.count() < report.latency.count() / 2);
    let ms = |l: &tailguard_loadgen::latency::Latency, p: f64| l.percentile_us(p) as f64 / 1000.0;
    assert!(
        ms(during, 90.0) >= 100.0,
        "overlapping P90 {} ms",
        ms(during, 90.0)
    );
    assert!(ms(&report.latency, 100.0) >= 140.0);
    assert!(ms(&report.latency, 50.0) < 50.0);
    // The slowest request is one a stall held, and it says so.
    let slowest = &report.slowest[0];
    assert!(slowest.latency_ns >= 140_000_000, "{slowest:?}");
    assert!(slowest.overlaps_scrape, "{slowest:?}");
    let printed = report.render();
    assert!(printed.contains("Scrapes: 3 (0 failed)"), "{printed}");
    assert!(printed.contains("Requests that overlapped a scrape:"));
}

/// The scraper scrapes once before the load's first request, on the connection it then
/// keeps, and that scrape is not in the report: a scraper's first scrape (its connection
/// and buffers new) is not what a Prometheus that has been scraping for days makes.
#[test]
fn the_scraper_primes_before_the_load_starts_and_does_not_report_it() {
    // Every request's path and arrival order, and the connection it came on.
    let seen = Arc::new(std::sync::Mutex::new(Vec::<(String, usize)>::new()));
    let log = seen.clone();
    let server = blocking::start(move |listener| {
        support::serve_requests(listener, move |req, connection| {
            let log = log.clone();
            async move {
                log.lock()
                    .unwrap()
                    .push((req.uri().path().to_owned(), connection));
                Response::new(Full::new(Bytes::from_static(b"ok")))
            }
        })
    });
    let mut config = LoadConfig::new(&server.url("/"), 200.0, Duration::from_secs(2), 2);
    config.scrape = Some(ScrapeConfig {
        url: server.url("/metrics"),
        every: Duration::from_secs(1),
        gzip: false,
    });
    let report = run(&config).unwrap();
    // Recorded: the scrapes at 0.5 s and 1.5 s only.
    assert_eq!(report.scrapes.len(), 2, "{:?}", report.scrapes);
    let seen = seen.lock().unwrap();
    let first_load = seen
        .iter()
        .position(|(path, _)| path == "/")
        .expect("load requests arrived");
    let scrapes: Vec<_> = seen.iter().filter(|(path, _)| path == "/metrics").collect();
    assert_eq!(
        scrapes.len(),
        3,
        "the priming scrape and two more: {scrapes:?}"
    );
    assert_eq!(
        seen.iter().position(|(path, _)| path == "/metrics"),
        Some(0),
        "the first request of all is the priming scrape"
    );
    assert!(first_load > 0);
    assert!(
        scrapes.iter().all(|(_, c)| *c == scrapes[0].1),
        "every scrape on the primed connection: {scrapes:?}"
    );
}

/// The scraper runs on the generator's cores (`pin`), never where the scheduler happens to
/// put it (the target's core, whose cost it would then inflate), and asks for gzip only when
/// told to: `gzip: false` fetches the whole text, as `curl` does.
#[test]
fn the_scraper_runs_on_the_generators_cores_and_asks_for_gzip_only_when_told() {
    // /metrics answers 1000 bytes to a client that accepts gzip, 3000 to one that does not.
    let server = blocking::start(move |listener| {
        support::serve_requests(listener, |req, _| async move {
            let size = if req.headers().contains_key("accept-encoding") {
                1000
            } else {
                3000
            };
            Response::new(Full::new(Bytes::from(vec![b'#'; size])))
        })
    });
    let last = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
    for (gzip, bytes) in [(false, 3000), (true, 1000)] {
        let mut config = LoadConfig::new(&server.url("/"), 100.0, Duration::from_secs(2), 2);
        config.pin = vec![last];
        config.scrape = Some(ScrapeConfig {
            url: server.url("/metrics"),
            every: Duration::from_millis(500),
            gzip,
        });
        // The scraper thread lives as long as the run: read its allowed cores meanwhile.
        let watcher = std::thread::spawn(|| {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                if let Some(cpus) = scraper_cpus() {
                    return Some(cpus);
                }
                if std::time::Instant::now() > deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let report = run(&config).unwrap();
        assert!(!report.scrapes.is_empty());
        for s in &report.scrapes {
            assert_eq!((s.status, s.bytes), (200, bytes), "gzip {gzip}");
        }
        assert_eq!(watcher.join().unwrap(), Some(last.to_string()));
    }
}

/// `Cpus_allowed_list` of this process's `load-scraper` thread, once it is pinned (the thread
/// pins itself as it starts).
fn scraper_cpus() -> Option<String> {
    let all = format!(
        "0-{}",
        std::thread::available_parallelism().map_or(1, |n| n.get()) - 1
    );
    std::fs::read_dir("/proc/self/task")
        .ok()?
        .filter_map(Result::ok)
        .map(|task| task.path())
        .filter(|task| {
            std::fs::read_to_string(task.join("comm")).is_ok_and(|c| c.trim() == "load-scraper")
        })
        .find_map(|task| {
            let status = std::fs::read_to_string(task.join("status")).ok()?;
            let cpus = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
                .trim()
                .to_owned();
            // Not yet pinned: it still has every core (unless the machine has only one).
            (cpus != all || all == "0-0").then_some(cpus)
        })
}

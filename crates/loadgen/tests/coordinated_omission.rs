//! A server that stalls 200 ms once a second must show ~200 ms in the tail: requests whose
//! intended time falls in the stall wait for a connection and are timed from that intended
//! time, as wrk2 does (a closed-loop count would see one slow request per connection).

use std::sync::Arc;
use std::time::Duration;

use tailguard_loadgen::load::{LoadConfig, run};
use tailguard_test_support::blocking;
use tokio::sync::RwLock;

use crate::support;

#[test]
fn a_200ms_stall_every_second_shows_in_the_p99_tail() {
    let gate = Arc::new(RwLock::new(()));
    let g = gate.clone();
    let server = blocking::start(move |listener| async move {
        let stall = g.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(800)).await;
                let _held = stall.write().await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        support::serve_http1(listener, move || {
            let g = g.clone();
            async move {
                drop(g.read().await);
            }
        })
        .await;
    });
    let report = run(&LoadConfig::new(
        &server.url("/"),
        1000.0,
        Duration::from_secs(3),
        8,
    ))
    .unwrap();
    let ms = |p: f64| report.latency.percentile_us(p) as f64 / 1000.0;
    // About 20% of the intended times fall in a stall and wait up to 200 ms, so the tail from
    // P90 up is tens to 200 ms, while the median stays fast.
    assert!(ms(50.0) < 50.0, "P50 {} ms", ms(50.0));
    assert!(
        ms(99.0) >= 150.0,
        "P99 {} ms should show the stall",
        ms(99.0)
    );
    assert!(
        (180.0..=450.0).contains(&ms(100.0)),
        "P100 {} ms should be about the 200 ms stall",
        ms(100.0)
    );
    let stalled = report.latency.histogram().count_between(50_000, 500_000) as f64;
    assert!(
        stalled / report.latency.count() as f64 > 0.05,
        "only {stalled} of {} requests took 50..500 ms",
        report.latency.count()
    );
    assert!(
        report.queued > 0,
        "requests must have waited for a connection"
    );
    assert_eq!(report.error_count(), 0, "{:?}", report.errors);
}

//! A run's slowest requests: the one request the server held is the slowest, with the
//! intended time the schedule gave it, its status and its connection.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tailguard_loadgen::load::{LoadConfig, run};
use tailguard_loadgen::report::Report;
use tailguard_loadgen::schedule::Schedule;
use tailguard_loadgen::slowest::KEPT;
use tailguard_test_support::blocking;

/// Which request the server holds (the 5th it receives) and for how long.
const HELD: u64 = 5;
const DELAY: Duration = Duration::from_millis(200);

#[test]
fn the_request_the_server_held_is_the_slowest_with_its_intended_time() {
    // The 5th request the server receives waits 200 ms and is answered 201; every other one
    // gets 200 at once. One connection, so the server receives them in schedule order. At 20
    // requests a second the next one, queued behind it, is intended 50 ms later: it waits
    // 50 ms less, a margin no scheduling delay of the test machine closes.
    let received = Arc::new(AtomicU64::new(0));
    let server = blocking::start(move |listener| async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let received = received.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |_req: Request<Incoming>| {
                    let nth = received.fetch_add(1, Ordering::SeqCst) + 1;
                    async move {
                        let mut resp = Response::new(Full::new(Bytes::from_static(b"ok")));
                        if nth == HELD {
                            tokio::time::sleep(DELAY).await;
                            *resp.status_mut() = StatusCode::CREATED;
                        }
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let config = LoadConfig::new(&server.url("/"), 20.0, Duration::from_secs(2), 1);
    let report = run(&config).unwrap();
    assert_eq!(report.errors.len(), 0, "{:?}", report.errors);
    assert_eq!(report.status.get(&201), Some(&1), "{:?}", report.status);

    // The schedule is fixed before the run: the 5th request's intended time is its offset.
    let mut schedule = Schedule::constant(20.0, 0, 1);
    let intended = (0..HELD).map(|_| schedule.next_offset()).last().unwrap();
    assert_eq!(report.slowest.len(), KEPT);
    let held = &report.slowest[0];
    assert_eq!(
        (
            held.status,
            held.intended_ns,
            held.connection,
            held.error.as_deref()
        ),
        (201, intended, 0, None),
        "{held:?}"
    );
    assert!(held.latency_ns >= DELAY.as_nanos() as u64, "{held:?}");
    // No scrapes: nothing to be placed against.
    assert_eq!(
        (held.since_scrape_end_ns, held.overlaps_scrape),
        (None, false)
    );
    assert!(
        report
            .slowest
            .windows(2)
            .all(|w| w[0].latency_ns >= w[1].latency_ns),
        "slowest first"
    );
    // The histogram's P100 is the held request (to its 3 significant digits).
    let max_ns = report.latency.max_us() * 1000;
    assert!(max_ns >= held.latency_ns && max_ns - held.latency_ns <= held.latency_ns / 500);

    let printed = report.render();
    assert!(
        printed.contains(&format!(
            "Slowest requests (5 of the {KEPT} kept; time of the intended send in the measured window):\n  {:.2} ms at {:.3} s, connection 0, status 201\n",
            held.latency_ns as f64 / 1e6,
            intended as f64 / 1e9
        )),
        "{printed}"
    );
    assert_eq!(Report::from_json(&report.to_json()).unwrap(), report);
}

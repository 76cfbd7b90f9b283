//! The open-loop schedule holds the requested rate, measured at a real sink.

use std::time::Duration;

use tailguard_lab::load::{LoadConfig, run};
use tailguard_lab::schedule::Schedule;

use crate::support;

#[test]
fn constant_rate_reaches_the_sink_within_one_percent() {
    let (sink, arrivals) = support::sink();
    let rate = 1000.0;
    let report = run(&LoadConfig::new(
        &sink.url("/"),
        rate,
        Duration::from_secs(3),
        8,
    ))
    .unwrap();
    let arrivals = arrivals.lock().unwrap().clone();
    let expected = 3000.0;
    assert!(
        (arrivals.len() as f64 - expected).abs() <= expected * 0.01,
        "sink saw {} requests, expected {expected}",
        arrivals.len()
    );
    // The rate the sink saw: the least-squares slope of arrival time against request index,
    // so one scheduling hiccup of this shared machine at either end does not decide it.
    let mut arrivals = arrivals;
    arrivals.sort_unstable();
    let n = arrivals.len() as f64;
    let t0 = arrivals[0] as f64;
    let (mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0);
    for (i, &t) in arrivals.iter().enumerate() {
        let (x, y) = (i as f64, (t as f64 - t0) / 1e9);
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
    }
    let seconds_per_request = (n * sxy - sx * sy) / (n * sxx - sx * sx);
    let sink_rate = 1.0 / seconds_per_request;
    assert!(
        (sink_rate - rate).abs() <= rate * 0.01,
        "sink measured {sink_rate:.1} req/s for a requested {rate}"
    );
    assert_eq!(report.sent, 3000);
    assert!(
        (report.achieved_rate - rate).abs() <= rate * 0.02,
        "report says {:.1} req/s",
        report.achieved_rate
    );
    assert_eq!(report.status.get(&200).copied(), Some(report.completed));
    assert_eq!(report.error_count(), 0, "{:?}", report.errors);
}

#[test]
fn two_threads_interleave_into_one_rate() {
    let (sink, arrivals) = support::sink();
    let mut config = LoadConfig::new(&sink.url("/"), 2000.0, Duration::from_secs(1), 8);
    config.threads = 2;
    let report = run(&config).unwrap();
    assert_eq!(report.threads, 2);
    let n = arrivals.lock().unwrap().len() as f64;
    assert!((n - 2000.0).abs() <= 20.0, "sink saw {n}");
}

#[test]
fn constant_schedule_lanes_partition_the_global_schedule() {
    let mut all: Vec<u64> = Vec::new();
    for lane in 0..3 {
        let mut s = Schedule::constant(1000.0, lane, 3);
        all.extend((0..100).map(|_| s.next_offset()));
    }
    all.sort_unstable();
    let expected: Vec<u64> = (0..300).map(|n| n * 1_000_000).collect();
    assert_eq!(all, expected);
}

#[test]
fn poisson_schedule_has_the_requested_mean_and_is_seeded() {
    let mut a = Schedule::poisson(1000.0, 0, 1, 7);
    let offsets: Vec<u64> = (0..100_000).map(|_| a.next_offset()).collect();
    let mean_gap_ns = offsets[offsets.len() - 1] as f64 / (offsets.len() - 1) as f64;
    assert!(
        (mean_gap_ns - 1e6).abs() < 1e6 * 0.02,
        "mean gap {mean_gap_ns}"
    );
    // Exponential gaps: about 1/e of them are longer than the mean.
    let longer = offsets
        .windows(2)
        .filter(|w| w[1] - w[0] > 1_000_000)
        .count() as f64;
    assert!((longer / 99_999.0 - (-1.0f64).exp()).abs() < 0.01);
    let mut b = Schedule::poisson(1000.0, 0, 1, 7);
    assert_eq!(
        offsets[..100],
        (0..100).map(|_| b.next_offset()).collect::<Vec<_>>()[..]
    );
}

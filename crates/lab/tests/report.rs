//! A real run's report survives JSON and `.hgrm` round trips and prints wrk2's layout.

use std::time::Duration;

use tailguard_lab::upstream::UpstreamConfig;
use tailguard_loadgen::hgrm;
use tailguard_loadgen::load::{LoadConfig, run};
use tailguard_loadgen::report::Report;

use crate::support;

fn short_run() -> Report {
    let server = support::upstream(UpstreamConfig {
        body_bytes: 100,
        error_rate: 0.2,
        ..UpstreamConfig::default()
    });
    run(&LoadConfig::new(
        &server.url("/x"),
        300.0,
        Duration::from_secs(1),
        4,
    ))
    .unwrap()
}

#[test]
fn report_round_trips_through_json() {
    let report = short_run();
    assert!(report.completed >= 290, "completed {}", report.completed);
    assert!(report.status.contains_key(&200) && report.status.contains_key(&500));
    assert_eq!(
        report.bytes_read,
        report.status[&200] * 100 + report.status[&500] * 15
    );
    assert_eq!(report.latency_ok.count(), report.status[&200]);
    let json = report.to_json();
    let back = Report::from_json(&json).unwrap();
    assert_eq!(back, report);
    // Readers get the summary without rebuilding the histogram.
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    let p100 = &value["latency"]["summary"]["percentiles_us"][7];
    assert_eq!(p100[0], "100");
    assert_eq!(p100[1].as_u64().unwrap(), report.latency.max_us());
}

#[test]
fn hgrm_round_trips_and_prints_like_wrk2() {
    let report = short_run();
    let text = hgrm::render(&report.latency);
    assert!(text.starts_with("       Value   Percentile   TotalCount 1/(1-Percentile)\n\n"));
    assert!(text.contains(&format!("Total count    = {:>12}]", report.latency.count())));
    let parsed = hgrm::parse(&text).unwrap();
    let direct = hgrm::points(&report.latency);
    assert_eq!(parsed.len(), direct.len());
    for (a, b) in parsed.iter().zip(&direct) {
        assert!((a.value_ms - b.value_ms).abs() < 0.0006, "{a:?} vs {b:?}");
        assert!((a.quantile - b.quantile).abs() < 1e-6);
    }
    assert_eq!(parsed.last().unwrap().quantile, 1.0);
    let printed = report.render();
    for line in [
        "  Latency Distribution (HdrHistogram - Recorded Latency)",
        "  Detailed Percentile spectrum:",
        "Requests/sec:",
        "Status codes: 200: ",
    ] {
        assert!(printed.contains(line), "missing `{line}` in\n{printed}");
    }
    assert!(printed.contains(" 100.000%"));
    assert!(printed.contains("  99.999%"));
}

#[test]
fn plot_overlays_every_series_with_a_legend() {
    let report = short_run();
    let series = vec![
        tailguard_loadgen::plot::Series {
            label: "first <run>".into(),
            points: hgrm::points(&report.latency),
        },
        tailguard_loadgen::plot::Series {
            label: "second".into(),
            points: hgrm::points(&report.latency_ok),
        },
    ];
    let svg = tailguard_loadgen::plot::render("t", &series);
    assert!(svg.starts_with("<svg"));
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<polyline").count(), 2);
    assert!(svg.contains("first &lt;run&gt;") && svg.contains("second"));
    for label in [">90%<", ">99%<", ">99.9%<"] {
        assert!(svg.contains(label), "axis label {label}");
    }
}

//! Cardinality control: the series cap with its overflow series, TTL expiry on an injected
//! clock, and the self-metrics that report both.

use std::time::{Duration, Instant};

use tailguard_metrics::{Counter, Desc, Format, OVERFLOW_LABEL_VALUE, Registry};

#[test]
fn past_the_cap_new_label_sets_go_to_one_overflow_series() {
    let registry = Registry::new();
    let family = registry
        .register::<Counter>(
            Desc::new("by_user", "Per user.")
                .labels(&["user"])
                .max_series(3),
        )
        .unwrap();
    for user in ["a", "b", "c", "d", "e"] {
        family.get_or_create(&[user]).unwrap().inc();
    }
    // Existing series still resolve to themselves.
    family.get_or_create(&["a"]).unwrap().inc();
    assert_eq!(family.overflowed(), 2);
    assert_eq!(family.len(), 4, "three series and the overflow series");
    let text = String::from_utf8(registry.render(Format::Text)).unwrap();
    assert!(text.contains("by_user_total{user=\"a\"} 2\n"));
    assert!(text.contains(&format!(
        "by_user_total{{user=\"{OVERFLOW_LABEL_VALUE}\"}} 2\n"
    )));
    assert!(!text.contains("user=\"d\""));
    assert!(text.contains("metrics_series_overflowed_total{family=\"by_user\"} 2\n"));
    assert!(text.contains("metrics_series{family=\"by_user\"} 4\n"));
}

#[test]
fn idle_series_without_handles_expire_after_the_ttl() {
    let registry = Registry::new();
    let family = registry
        .register::<Counter>(
            Desc::new("by_peer", "Per peer.")
                .labels(&["peer"])
                .ttl(Duration::from_secs(60)),
        )
        .unwrap();
    family.get_or_create(&["idle"]).unwrap().inc(); // handle dropped at once
    let held = family.get_or_create(&["held"]).unwrap();
    held.inc();
    let busy = family.get_or_create(&["busy"]).unwrap();

    let t0 = Instant::now();
    assert_eq!(registry.sweep(t0), 0);
    drop(busy);
    family.get_or_create(&["busy"]).unwrap().inc(); // recorded, then dropped
    assert_eq!(registry.sweep(t0 + Duration::from_secs(30)), 0);
    // 61 s after the first sight: `idle` is idle and unheld; `busy` changed at 30 s.
    assert_eq!(registry.sweep(t0 + Duration::from_secs(61)), 1);
    let text = String::from_utf8(registry.render(Format::Text)).unwrap();
    assert!(!text.contains("peer=\"idle\""), "{text}");
    assert!(text.contains("by_peer_total{peer=\"held\"} 1\n"));
    assert!(text.contains("by_peer_total{peer=\"busy\"} 1\n"));
    assert!(text.contains("metrics_series_expired_total{family=\"by_peer\"} 1\n"));
    assert!(text.contains("metrics_series{family=\"by_peer\"} 2\n"));

    // `busy` goes idle too; `held` never expires while its handle lives.
    assert_eq!(registry.sweep(t0 + Duration::from_secs(200)), 1);
    assert_eq!(family.len(), 1);
    // A recreated series starts from zero (Prometheus sees a counter reset).
    family.get_or_create(&["idle"]).unwrap().inc();
    let text = String::from_utf8(registry.render(Format::Text)).unwrap();
    assert!(text.contains("by_peer_total{peer=\"idle\"} 1\n"));
    assert_eq!(family.expired(), 2);
}

#[test]
fn expiry_frees_memory_a_chunk_at_a_time() {
    let registry = Registry::builder()
        .self_metrics_prefix(None)
        .build()
        .unwrap();
    let family = registry
        .register::<Counter>(
            Desc::new("churn", "Churning series.")
                .labels(&["id"])
                .ttl(Duration::from_secs(1)),
        )
        .unwrap();
    for i in 0..10_000 {
        family.get_or_create(&[&i.to_string()]).unwrap().inc();
    }
    let full = registry.heap_bytes();
    let t0 = Instant::now();
    registry.sweep(t0);
    assert_eq!(registry.sweep(t0 + Duration::from_secs(2)), 10_000);
    assert_eq!(family.len(), 0);
    let after = registry.heap_bytes();
    assert!(after * 10 < full, "heap {full} -> {after}");
    eprintln!("heap {full} -> {after}");
    assert_eq!(
        registry.render(Format::Text),
        b"# HELP churn_total Churning series.\n# TYPE churn_total counter\n"
    );
}

#[test]
fn bad_input_gets_a_clear_error() {
    let registry = Registry::new();
    let err = registry.counter("bad-name", "x", &[]).unwrap_err();
    assert!(err.to_string().contains("bad-name"), "{err}");
    assert!(registry.counter("ok", "x", &["__reserved"]).is_err());
    assert!(registry.counter("ok", "x", &["a", "a"]).is_err());
    assert!(registry.histogram("h", "x", &["le"], &[1.0]).is_err());
    assert!(registry.histogram("h", "x", &[], &[2.0, 1.0]).is_err());
    assert!(registry.histogram("h", "x", &[], &[f64::NAN]).is_err());
    let family = registry.counter("ok", "x", &["a"]).unwrap();
    assert!(
        registry.counter("ok_total", "again", &[]).is_err(),
        "duplicate family"
    );
    let err = family.get_or_create(&["1", "2"]).unwrap_err();
    assert!(
        err.to_string().contains("1 label names but 2 values"),
        "{err}"
    );
}

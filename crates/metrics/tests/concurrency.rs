//! Threads recording at once lose nothing, and creating series never waits for a scrape.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::time::{Duration, Instant};

use tailguard_metrics::{Format, Registry, Render};

#[test]
fn totals_are_exact_after_n_threads_times_m_records() {
    const THREADS: usize = 8;
    const RECORDS: u64 = 50_000;
    let registry = Registry::builder().shards(2).build().unwrap();
    let counter = registry
        .counter("hits", "Hits.", &[])
        .unwrap()
        .get_or_create(&[])
        .unwrap();
    let gauge = registry
        .gauge("level", "Level.", &[])
        .unwrap()
        .get_or_create(&[])
        .unwrap();
    let histogram = registry
        .histogram("sizes", "Sizes.", &[], &[1.0, 10.0])
        .unwrap()
        .get_or_create(&[])
        .unwrap();
    let barrier = Arc::new(Barrier::new(THREADS));
    // More threads than shards: the threads beyond them share one region, and the adds must
    // still be exact.
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (counter, gauge, histogram, barrier) = (
                counter.clone(),
                gauge.clone(),
                histogram.clone(),
                Arc::clone(&barrier),
            );
            std::thread::spawn(move || {
                barrier.wait();
                for i in 0..RECORDS {
                    counter.inc();
                    gauge.inc();
                    if i % 2 == 0 {
                        gauge.dec();
                    }
                    histogram.observe(if t % 2 == 0 { 0.5 } else { 5.0 });
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let n = THREADS as u64 * RECORDS;
    assert_eq!(counter.get(), n);
    assert_eq!(gauge.get(), (n / 2) as i64);
    assert_eq!(histogram.count(), n);
    assert_eq!(histogram.sum(), (n / 2) as f64 * 0.5 + (n / 2) as f64 * 5.0);
    let text = String::from_utf8(registry.render(Format::Text)).unwrap();
    assert!(text.contains(&format!("hits_total {n}\n")), "{text}");
    assert!(text.contains(&format!("sizes_bucket{{le=\"1.0\"}} {}\n", n / 2)));
    assert!(text.contains(&format!("sizes_bucket{{le=\"+Inf\"}} {n}\n")));
}

#[test]
fn threads_of_the_shared_region_and_shard_owners_together_add_exactly() {
    const RECORDS: u64 = 100_000;
    let registry = Registry::builder().shards(4).build().unwrap();
    let counter = registry
        .counter("mixed", "Mixed.", &[])
        .unwrap()
        .get_or_create(&[])
        .unwrap();
    let histogram = registry
        .histogram("mixed_sizes", "Sizes.", &[], &[1.0])
        .unwrap()
        .get_or_create(&[])
        .unwrap();
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let (counter, histogram) = (counter.clone(), histogram.clone());
            std::thread::spawn(move || {
                if t % 2 == 0 {
                    tailguard_metrics::use_shared_shard();
                }
                for _ in 0..RECORDS {
                    counter.inc();
                    histogram.observe(0.5);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(counter.get(), 6 * RECORDS);
    assert_eq!(histogram.count(), 6 * RECORDS);
    assert_eq!(histogram.sum(), 6.0 * RECORDS as f64 * 0.5);
}

#[test]
fn concurrent_get_or_create_of_one_label_set_yields_one_series() {
    let registry = Registry::builder()
        .self_metrics_prefix(None)
        .build()
        .unwrap();
    let family = registry.counter("c", "C.", &["k"]).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let family = family.clone();
            std::thread::spawn(move || {
                for i in 0..2_000 {
                    family
                        .get_or_create(&[&(i % 500).to_string()])
                        .unwrap()
                        .inc();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(family.len(), 500);
    let text = String::from_utf8(registry.render(Format::Text)).unwrap();
    assert_eq!(
        text.lines().filter(|l| l.starts_with("c_total{")).count(),
        500
    );
    assert!(text.contains("c_total{k=\"7\"} 16\n"));
}

/// A scrape of a million series is under way (its snapshot taken, half rendered, more
/// rendering on another thread) while another thread creates and records new series. If
/// creation waited for the scrape, the creator could not finish before the render does;
/// the test checks that the creator finishes while the render provably has not.
#[test]
fn creating_series_never_waits_for_a_scrape_of_a_million_series() {
    const SERIES: usize = 1_000_000;
    const NEW: usize = 1_000;
    let registry = Registry::builder()
        .self_metrics_prefix(None)
        .build()
        .unwrap();
    let family = registry
        .counter("big", "A big family.", &["route", "status"])
        .unwrap();
    for i in 0..SERIES {
        family
            .get_or_create(&[&format!("/r{}", i / 100), &(i % 100).to_string()])
            .unwrap();
    }

    let render_done = Arc::new(AtomicBool::new(false));
    let pieces_after_creation = Arc::new(AtomicUsize::new(0));
    let (started_tx, started_rx) = mpsc::channel();
    let (created_tx, created_rx) = mpsc::channel::<Duration>();
    let scraper = {
        let registry = registry.clone();
        let render_done = Arc::clone(&render_done);
        let pieces_after_creation = Arc::clone(&pieces_after_creation);
        std::thread::spawn(move || {
            let mut render = Render::new(registry.snapshot(), Format::Text);
            let mut buf = Vec::new();
            let started = Instant::now();
            // Render the first piece, then tell the creator the scrape is under way.
            render.fill(&mut buf, 1 << 20);
            started_tx.send(()).unwrap();
            let mut bytes = buf.len();
            let mut created = false;
            loop {
                buf.clear();
                let finished = render.fill(&mut buf, 64 * 1024);
                bytes += buf.len();
                if !created && created_rx.try_recv().is_ok() {
                    created = true;
                }
                if created {
                    pieces_after_creation.fetch_add(1, Ordering::SeqCst);
                }
                if finished {
                    break;
                }
            }
            render_done.store(true, Ordering::SeqCst);
            (bytes, started.elapsed())
        })
    };

    started_rx.recv().unwrap();
    let mut worst = Duration::ZERO;
    for i in 0..NEW {
        let t = Instant::now();
        let handle = family.get_or_create(&["/new", &i.to_string()]).unwrap();
        handle.inc();
        worst = worst.max(t.elapsed());
    }
    let render_was_done = render_done.load(Ordering::SeqCst);
    created_tx.send(worst).unwrap();
    let (bytes, render_time) = scraper.join().unwrap();

    assert!(
        !render_was_done,
        "the scrape finished before {NEW} series were created: creation waited (worst {worst:?}, render {render_time:?})"
    );
    assert!(pieces_after_creation.load(Ordering::SeqCst) > 1);
    assert!(bytes > SERIES * 20);
    // The slowest single creation is far below the scrape it overlapped.
    assert!(
        worst < render_time,
        "worst creation {worst:?} vs render {render_time:?}"
    );
    assert_eq!(family.len(), SERIES + NEW);
    eprintln!(
        "1M-series render: {render_time:?}, {bytes} bytes; worst of {NEW} creations during it: {worst:?}"
    );
}

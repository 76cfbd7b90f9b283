//! Appending a line to the per-thread buffer versus nginx's unbuffered `write` per line.

use std::hint::black_box;
use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use criterion::{Criterion, criterion_group, criterion_main};
use tailguard_access_log::{AccessLog, Config, Format, Output, Record};

fn record() -> Record<'static> {
    Record {
        time: SystemTime::now(),
        remote_addr: Some([192, 0, 2, 7].into()),
        method: b"GET",
        target: b"/api/v1/users/12345?fields=name,email",
        status: 200,
        body_bytes_sent: 1024,
        bytes_sent: 1300,
        request_time: Duration::from_micros(1500),
        upstream_addr: Some(SocketAddr::from(([127, 0, 0, 1], 9000))),
        upstream_status: Some(200),
        upstream_response_time: Some(Duration::from_micros(1200)),
        referer: Some(b"https://example.com/dashboard"),
        user_agent: Some(b"Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"),
        route: Some("users"),
        ..Record::default()
    }
}

fn bench(c: &mut Criterion) {
    let r = record();
    let mut g = c.benchmark_group("append");
    for (name, format) in [("combined", Format::combined()), ("json", Format::json())] {
        let mut out = Vec::with_capacity(4096);
        g.bench_function(format!("format_only/{name}"), |b| {
            b.iter(|| {
                out.clear();
                format.write(black_box(&r), &mut out);
            })
        });
    }
    // The product: format into this thread's 64 KiB buffer; the writer thread writes full
    // buffers to /dev/null (the disk is not what this measures).
    for (name, fmt) in [
        ("combined", None),
        ("json", Some(tailguard_access_log::FormatName::Json)),
    ] {
        let (log, writer) = AccessLog::start(&Config {
            path: Output::File("/dev/null".into()),
            format: fmt,
            ..Config::default()
        })
        .expect("/dev/null opens");
        g.bench_function(format!("buffered/{name}/buffer_64k"), |b| {
            b.iter(|| log.log(black_box(&r)))
        });
        let stats = writer.shutdown();
        eprintln!("buffered/{name}: {stats:?}");
    }
    let off = AccessLog::off();
    g.bench_function("off", |b| b.iter(|| off.log(black_box(&r))));
    // Baseline: nginx without `buffer=`: format, then one write(2) per line to a real file.
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.path().join("direct.log"))
        .expect("a temp file");
    let format = Format::combined();
    let mut line = Vec::with_capacity(4096);
    g.bench_function("direct_write_all_per_line/combined", |b| {
        b.iter(|| {
            line.clear();
            format.write(black_box(&r), &mut line);
            file.write_all(&line).expect("write to a temp file");
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

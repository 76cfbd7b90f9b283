//! Recording a span into this thread's buffer, exported by the exporter thread to a real
//! OTLP/HTTP sink on 127.0.0.1, the queue never full: written in place as it is built (the
//! gateway's path), or built on the stack as a fixed-size `Span` and written out; against
//! two baselines: building the `Span` alone, and pushing it into one `Mutex<Vec<Span>>`
//! shared by every thread (the shape of a shared bounded queue). And `encode`: a batch of
//! fixed-size spans into one OTLP request, per span.

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http_body_util::{BodyExt as _, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tailguard_trace::{
    ExportConfig, Exporter, Resource, Span, SpanContext, SpanId, SpanKind, TraceId, TraceMetrics,
    encode_request,
};

/// The attributes of a server span as the gateway sets them: 10, 3 of them copied strings.
/// A macro, so that the fixed-size `Span` and the `SpanWriter` get the same calls.
macro_rules! server_attributes {
    ($s:expr) => {{
        $s.start_unix_nanos = 1_700_000_000_000_000_000;
        $s.end_unix_nanos = $s.start_unix_nanos + 1_500_000;
        $s.set_name_parts(&[b"GET", b"/api/v1/users/{id}"]);
        $s.str("http.request.method", "GET");
        $s.bytes("http.route", b"/api/v1/users/{id}");
        $s.bytes("url.path", b"/api/v1/users/12345");
        $s.int("http.response.status_code", 200);
        $s.bytes("server.address", b"api.example.com");
        $s.bytes("client.address", b"192.0.2.7");
        $s.str("network.protocol.version", "1.1");
        $s.int("server.port", 8080);
        $s.str("tailguard.outcome", "forwarded");
        $s.int("tailguard.tries", 1);
    }};
}

/// A server span as the gateway builds one, as a fixed-size value.
fn span(ctx: &SpanContext) -> Span {
    let mut s = Span::new(SpanKind::Server, ctx, Some(SpanId([7; 8])));
    server_attributes!(s);
    s
}

/// An OTLP/HTTP collector that reads each request and answers 200.
fn sink() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    let svc = service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                        let _ = req.into_body().collect().await;
                        Ok::<_, hyper::Error>(hyper::Response::new(Full::new(Bytes::new())))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
    });
    addr
}

fn bench(c: &mut Criterion) {
    let ctx = SpanContext {
        trace_id: TraceId::random(),
        span_id: SpanId::random(),
        sampled: true,
    };
    let mut g = c.benchmark_group("record");
    g.bench_function("build_only", |b| {
        b.iter(|| black_box(span(black_box(&ctx))))
    });

    let shared: Mutex<Vec<Span>> = Mutex::new(Vec::with_capacity(1024));
    g.bench_function("baseline_shared_mutex_vec", |b| {
        b.iter(|| {
            let s = span(black_box(&ctx));
            let mut v = shared.lock().expect("not poisoned");
            if v.len() == 1024 {
                v.clear();
            }
            v.push(s);
        })
    });

    let addr = sink();
    let mut config = ExportConfig::new(format!("http://{addr}"), "bench");
    config.batch_interval = Duration::from_millis(100);
    config.queue_max_spans = 8192;
    let metrics = TraceMetrics::unregistered();
    let exporter = Exporter::start(config, metrics.clone()).expect("exporter starts");
    let tracer = exporter.tracer();
    let flusher = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // The fixed-size span built on the stack, then written out (`Tracer::record`).
    g.bench_function("span", |b| {
        b.iter_custom(|iters| {
            timed_in_runs(iters, &flusher, &exporter, || {
                tracer.record(&span(black_box(&ctx)));
            })
        })
    });
    // The gateway's path: written in place as it is built (`Recording::start`).
    g.bench_function("written_in_place", |b| {
        b.iter_custom(|iters| {
            timed_in_runs(iters, &flusher, &exporter, || {
                tracer.record_with(|spans| {
                    if let Some(mut s) =
                        spans.start(SpanKind::Server, black_box(&ctx), Some(SpanId([7; 8])))
                    {
                        server_attributes!(s);
                    }
                });
            })
        })
    });
    g.finish();
    let dropped = metrics.dropped_total(tailguard_trace::DropReason::QueueFull);
    exporter.shutdown();
    eprintln!(
        "record/span: exported {}, dropped (queue full) {}",
        metrics.exported_total(),
        dropped
    );
}

/// `iters` calls of `record`, timed in runs of at most half the queue, each followed by an
/// (untimed) flush: criterion records spans far faster than any exporter sends them, and
/// without the flushes most iterations would time the queue-full drop instead.
fn timed_in_runs(
    iters: u64,
    flusher: &tokio::runtime::Runtime,
    exporter: &Exporter,
    mut record: impl FnMut(),
) -> Duration {
    let mut timed = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(4096);
        let start = std::time::Instant::now();
        for _ in 0..n {
            record();
        }
        timed += start.elapsed();
        left -= n;
        flusher.block_on(exporter.flush());
    }
    timed
}

/// The exporter's encoding: a batch of 512 server spans (as `span` builds them) into one
/// OTLP request, per span. The exporter thread pays this for every span it sends.
fn encode(c: &mut Criterion) {
    let ctx = SpanContext {
        trace_id: TraceId::random(),
        span_id: SpanId::random(),
        sampled: true,
    };
    let spans: Vec<Span> = (0..512).map(|_| span(&ctx)).collect();
    let resource = Resource::new("bench");
    let mut g = c.benchmark_group("encode");
    g.throughput(criterion::Throughput::Elements(512));
    g.bench_function("server_spans_512", |b| {
        b.iter(|| encode_request(black_box(&resource), black_box(&spans)));
    });
    g.finish();
}

criterion_group!(benches, bench, encode);
criterion_main!(benches);

//! The exporter against a real OTLP receiver: what arrives, and what a failing, stalled or
//! dead collector costs (drops counted, recording never waits, the queue bounded).

use std::time::Duration;

use tailguard_test_support::otlp::{Answer, OtlpReceiver, attr_int, attr_str};
use tailguard_trace::{
    DropReason, ExportConfig, Exporter, Protocol, Retry, Span, SpanContext, SpanId, SpanKind,
    TraceId, TraceMetrics,
};

const WAIT: Duration = Duration::from_secs(10);

fn span(i: i64) -> Span {
    let ctx = SpanContext {
        trace_id: TraceId::random(),
        span_id: SpanId::random(),
        sampled: true,
    };
    let mut s = Span::new(SpanKind::Server, &ctx, Some(SpanId([1; 8])));
    s.set_name("GET");
    s.start_unix_nanos = 1_000;
    s.end_unix_nanos = 2_000;
    s.int("n", i);
    s.bytes("url.path", b"/users/7");
    s
}

fn config(endpoint: String) -> ExportConfig {
    let mut c = ExportConfig::new(endpoint, "test-service");
    c.batch_interval = Duration::from_millis(50);
    c.timeout = Duration::from_millis(500);
    c.retry = Retry {
        max_retries: 2,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(20),
    };
    c
}

async fn export_reaches_the_receiver(receiver: OtlpReceiver, protocol: Protocol, gzip: bool) {
    let mut c = config(receiver.endpoint());
    c.protocol = protocol;
    c.gzip = gzip;
    c.headers = vec![("x-api-key".to_owned(), "secret".to_owned())];
    let metrics = TraceMetrics::unregistered();
    let exporter = Exporter::start(c, metrics.clone()).expect("starts");
    let tracer = exporter.tracer();
    let sent: Vec<Span> = (0..3).map(span).collect();
    for s in &sent {
        tracer.record(s);
    }
    exporter.flush().await;
    let spans = receiver.wait_for(WAIT, |s| s.len() == 3).await;
    for s in &sent {
        let got = spans
            .iter()
            .find(|p| p.span_id == s.span_id.0)
            .expect("every span arrives");
        assert_eq!(got.trace_id, s.trace_id.0);
        assert_eq!(got.parent_span_id, [1; 8]);
        assert_eq!(got.name, "GET");
        assert_eq!(attr_str(got, "url.path").as_deref(), Some("/users/7"));
        assert!(attr_int(got, "n").is_some());
    }
    let received = receiver.received();
    let resource = received[0].request.resource_spans[0]
        .resource
        .as_ref()
        .expect("a resource");
    let keys: Vec<&str> = resource
        .attributes
        .iter()
        .map(|kv| kv.key.as_str())
        .collect();
    assert_eq!(keys, ["service.name", "service.instance.id", "host.name"]);
    assert!(
        received[0]
            .headers
            .iter()
            .any(|(k, v)| k == "x-api-key" && v == "secret"),
        "{:?}",
        received[0].headers
    );
    assert_eq!(metrics.exported_total(), 3);
    exporter.shutdown();
}

#[tokio::test]
async fn http_export_reaches_a_real_receiver_gzip() {
    export_reaches_the_receiver(OtlpReceiver::http().await, Protocol::HttpProtobuf, true).await;
}

#[tokio::test]
async fn http_export_reaches_a_real_receiver_plain() {
    export_reaches_the_receiver(OtlpReceiver::http().await, Protocol::HttpProtobuf, false).await;
}

#[tokio::test]
async fn grpc_export_reaches_a_real_receiver() {
    export_reaches_the_receiver(OtlpReceiver::grpc().await, Protocol::Grpc, true).await;
}

#[tokio::test]
async fn batches_hold_at_most_batch_max_spans_and_every_span_arrives_once_in_order() {
    let receiver = OtlpReceiver::http().await;
    let mut c = config(receiver.endpoint());
    c.batch_max_spans = 7;
    c.buffer_spans = 4;
    // Only the size bound and the flush cut batches here.
    c.batch_interval = Duration::from_secs(3600);
    let metrics = TraceMetrics::unregistered();
    let exporter = Exporter::start(c, metrics.clone()).expect("starts");
    let tracer = exporter.tracer();
    for i in 0..100 {
        tracer.record(&span(i));
    }
    exporter.flush().await;
    receiver.wait_for(WAIT, |s| s.len() == 100).await;
    let requests = receiver.received();
    let mut seen = Vec::new();
    for r in &requests {
        let spans: Vec<_> = r.request.resource_spans[0].scope_spans[0]
            .spans
            .iter()
            .map(|s| attr_int(s, "n").expect("every span has n"))
            .collect();
        assert!(
            (1..=7).contains(&spans.len()),
            "a request of {} spans",
            spans.len()
        );
        seen.extend(spans);
    }
    // One recording thread: its spans reach the collector in the order recorded.
    assert_eq!(seen, (0..100).collect::<Vec<_>>());
    assert!(
        requests.len() >= 100usize.div_ceil(7),
        "{} requests",
        requests.len()
    );
    assert_eq!(metrics.exported_total(), 100);
    assert_eq!(metrics.queued(), 0);
    exporter.shutdown();
}

/// Records a span numbered `n` whose `url.path` is `path_len` bytes long, written in place
/// (a [`Span`] built apart holds at most `ARENA_BYTES` of attributes).
fn record_sized(tracer: &tailguard_trace::Tracer, n: i64, path_len: usize) {
    let ctx = SpanContext {
        trace_id: TraceId::random(),
        span_id: SpanId::random(),
        sampled: true,
    };
    let path = "p".repeat(path_len);
    tracer.record_with(|recording| {
        let mut writer = recording
            .start(SpanKind::Server, &ctx, None)
            .expect("the queue has room");
        writer.set_name("GET");
        writer.int("n", n);
        writer.bytes("url.path", path.as_bytes());
    });
}

/// The spans' `n`, request by request, as the receiver got them.
fn numbers_by_request(receiver: &OtlpReceiver) -> Vec<Vec<i64>> {
    receiver
        .received()
        .iter()
        .map(|r| {
            r.request.resource_spans[0].scope_spans[0]
                .spans
                .iter()
                .map(|s| attr_int(s, "n").expect("every span has n"))
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn a_batch_closes_before_the_span_that_would_take_it_past_batch_max_bytes() {
    let receiver = OtlpReceiver::http().await;
    let mut c = config(receiver.endpoint());
    const MAX_BYTES: usize = 8 * 1024;
    c.batch_max_bytes = MAX_BYTES;
    c.batch_max_spans = 1000;
    c.queue_max_spans = 4096;
    c.buffer_spans = 16;
    c.batch_interval = Duration::from_secs(3600);
    let metrics = TraceMetrics::unregistered();
    let exporter = Exporter::start(c, metrics.clone()).expect("starts");
    let tracer = exporter.tracer();
    // Spans of different sizes, so that batches do not cut at a multiple of one size.
    let sizes: Vec<usize> = (0..300).map(|i| 20 + (i * 37) % 400).collect();
    for (i, len) in sizes.iter().enumerate() {
        record_sized(&tracer, i as i64, *len);
    }
    exporter.flush().await;
    receiver.wait_for(WAIT, |s| s.len() == 300).await;
    let requests = receiver.received();
    let numbers = numbers_by_request(&receiver);
    assert_eq!(numbers.concat(), (0..300).collect::<Vec<_>>());
    // Every request within the bound, and every one but the last closed only because the
    // next span would not fit: a request plus the next span's field passes the bound.
    assert!(requests.len() >= 2, "{} requests", requests.len());
    for (i, r) in requests.iter().enumerate() {
        assert!(r.body_len <= MAX_BYTES, "request {i}: {} bytes", r.body_len);
        assert_eq!(r.span_lens.len(), numbers[i].len());
        if let Some(next) = requests.get(i + 1) {
            let next_len = next.span_lens[0];
            assert!(
                r.body_len + next_len > MAX_BYTES,
                "request {i} closed at {} bytes with room for the next span ({next_len})",
                r.body_len
            );
        }
    }
    assert_eq!(metrics.exported_total(), 300);
    assert_eq!(metrics.queued(), 0);
    exporter.shutdown();
}

#[tokio::test]
async fn large_batches_stay_within_the_grpc_message_limit_by_default() {
    // tonic's server refuses a message over 4 MiB, the OpenTelemetry Collector's default
    // limit too. 6000 spans of ~1 KiB in one batch of spans would be ~6 MB: refused whole.
    let receiver = OtlpReceiver::grpc().await;
    let mut c = config(receiver.endpoint());
    c.protocol = Protocol::Grpc;
    c.batch_max_spans = 8192;
    c.queue_max_spans = 16384;
    c.batch_interval = Duration::from_secs(3600);
    // A 4 MiB request decoded by a debug build: no attempt may time out and be sent twice.
    c.timeout = Duration::from_secs(30);
    let metrics = TraceMetrics::unregistered();
    let exporter = Exporter::start(c, metrics.clone()).expect("starts");
    let tracer = exporter.tracer();
    for i in 0..6000 {
        record_sized(&tracer, i, 900);
    }
    exporter.flush().await;
    assert_eq!(metrics.dropped_total(DropReason::ExportFailed), 0);
    assert_eq!(metrics.exported_total(), 6000);
    let numbers = numbers_by_request(&receiver);
    assert_eq!(numbers.concat(), (0..6000).collect::<Vec<_>>());
    assert!(numbers.len() >= 2, "{} requests", numbers.len());
    for r in receiver.received() {
        assert!(r.body_len <= tailguard_trace::DEFAULT_BATCH_MAX_BYTES);
    }
    exporter.shutdown();
}

#[tokio::test]
async fn a_503_collector_is_retried_then_the_batch_is_dropped_and_counted() {
    let receiver = OtlpReceiver::http().await;
    receiver.set_answer(Answer::Status(503));
    let metrics = TraceMetrics::unregistered();
    let exporter = Exporter::start(config(receiver.endpoint()), metrics.clone()).expect("starts");
    let tracer = exporter.tracer();
    for i in 0..5 {
        tracer.record(&span(i));
    }
    exporter.flush().await;
    // One attempt and two retries, then the batch is dropped.
    assert_eq!(receiver.attempts(), 3);
    assert_eq!(metrics.dropped_total(DropReason::ExportFailed), 5);
    assert_eq!(metrics.exported_total(), 0);

    // The collector recovers: later spans go through.
    receiver.set_answer(Answer::Accept);
    tracer.record(&span(9));
    exporter.flush().await;
    receiver.wait_for(WAIT, |s| s.len() == 1).await;
    assert_eq!(metrics.exported_total(), 1);
}

#[tokio::test]
async fn a_400_is_not_retried() {
    let receiver = OtlpReceiver::http().await;
    receiver.set_answer(Answer::Status(400));
    let metrics = TraceMetrics::unregistered();
    let exporter = Exporter::start(config(receiver.endpoint()), metrics.clone()).expect("starts");
    exporter.tracer().record(&span(0));
    exporter.flush().await;
    assert_eq!(receiver.attempts(), 1);
    assert_eq!(metrics.dropped_total(DropReason::ExportFailed), 1);
}

/// Records `n` spans and returns; with the queue bounded and nothing ever waiting, this
/// returns whatever the collector does.
fn record_many(exporter: &Exporter, n: i64) {
    let tracer = exporter.tracer();
    for i in 0..n {
        tracer.record(&span(i));
    }
}

#[tokio::test]
async fn a_stalled_collector_drops_and_counts_and_the_queue_stays_bounded() {
    let receiver = OtlpReceiver::http().await;
    receiver.set_answer(Answer::Stall);
    let mut c = config(receiver.endpoint());
    c.queue_max_spans = 256;
    c.batch_max_spans = 64;
    c.buffer_spans = 16;
    c.timeout = Duration::from_millis(300);
    c.retry.max_retries = 0;
    let metrics = TraceMetrics::unregistered();
    let exporter = Exporter::start(c, metrics.clone()).expect("starts");
    // The first batch goes out and stalls; everything recorded meanwhile fills the pool.
    record_many(&exporter, 64);
    receiver.wait_for_attempts(1, WAIT).await;
    record_many(&exporter, 10_000);
    // Memory: the pool, and nothing beside it. The batch in export is the pool's own
    // buffers, lent; a copy of it would have let the pool fill again behind it (256 + 64).
    assert!(metrics.queued() <= 256, "queued {}", metrics.queued());
    // Each 300 ms timeout lets at most ~320 more spans in; recording 10 000 takes far less
    // than the 15 timeouts it would need to let 5 000 through.
    assert!(
        metrics.dropped_total(DropReason::QueueFull) >= 5_000,
        "dropped {}",
        metrics.dropped_total(DropReason::QueueFull)
    );
    exporter.flush().await;
    // Every span is accounted for: dropped for a full queue, or dropped after its export
    // timed out; none exported, none left waiting.
    let failed = metrics.dropped_total(DropReason::ExportFailed);
    let full = metrics.dropped_total(DropReason::QueueFull);
    assert_eq!(failed + full, 10_064);
    assert_eq!(metrics.exported_total(), 0);
}

#[tokio::test]
async fn a_dead_collector_drops_and_counts() {
    // A port nothing listens on: every connect is refused.
    let dead = tailguard_test_support::free_port();
    let mut c = config(format!("http://127.0.0.1:{dead}"));
    c.queue_max_spans = 128;
    c.batch_max_spans = 32;
    c.buffer_spans = 16;
    let metrics = TraceMetrics::unregistered();
    let exporter = Exporter::start(c, metrics.clone()).expect("a dead collector is no start error");
    record_many(&exporter, 5_000);
    exporter.flush().await;
    let failed = metrics.dropped_total(DropReason::ExportFailed);
    let full = metrics.dropped_total(DropReason::QueueFull);
    assert!(failed > 0, "exports failed and were counted");
    assert_eq!(failed + full, 5_000);
    exporter.shutdown();
}

#[tokio::test]
async fn shutdown_exports_what_is_left() {
    let receiver = OtlpReceiver::http().await;
    let mut c = config(receiver.endpoint());
    // Long enough that only the shutdown can export it.
    c.batch_interval = Duration::from_secs(3600);
    let exporter = Exporter::start(c, TraceMetrics::unregistered()).expect("starts");
    exporter.tracer().record(&span(1));
    tokio::task::spawn_blocking(move || exporter.shutdown())
        .await
        .expect("shutdown joins");
    assert_eq!(receiver.spans().len(), 1);
}

/// The scheduling policy and nice value of this process's threads named `name`, from
/// `/proc/self/task/<tid>/stat` (policy is field 41, nice field 19).
fn threads_named(name: &str) -> Vec<(u32, i32)> {
    let mut found = Vec::new();
    for task in
        std::fs::read_dir("/proc/self/task").expect("Linux: /proc/self/task lists the threads")
    {
        let task = task.expect("a task entry").path();
        let Ok(comm) = std::fs::read_to_string(task.join("comm")) else {
            continue; // the thread ended while we looked
        };
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.join("stat")).expect("the thread's stat");
        let fields: Vec<&str> = stat[stat
            .rfind(')')
            .expect("stat names the command in parentheses")
            + 2..]
            .split(' ')
            .collect();
        found.push((
            fields[41 - 3].parse().expect("policy is a number"),
            fields[19 - 3].parse().expect("nice is a number"),
        ));
    }
    found
}

#[tokio::test]
async fn the_exporter_thread_runs_at_sched_idle() {
    // Encoding and gzip never take a serving thread's core from it (issue 24: at normal
    // priority on the serving core, P99 at 2000 req/s went from 0.26 to 1.91 ms).
    let receiver = OtlpReceiver::http().await;
    let metrics = TraceMetrics::unregistered();
    let exporter = Exporter::start(config(receiver.endpoint()), metrics.clone()).expect("starts");
    // The thread sets its own policy when it starts: a flush answered proves it has.
    exporter.tracer().record(&span(1));
    exporter.flush().await;
    receiver.wait_for(WAIT, |s| s.len() == 1).await;
    // SCHED_IDLE is policy 5; nice 19 is what it keeps if something moves it back. Other
    // tests of this binary run exporters at the same time: every one of them must be idle.
    let threads = threads_named("trace-exporter");
    assert!(
        !threads.is_empty() && threads.iter().all(|&t| t == (5, 19)),
        "{threads:?}"
    );
}

//! The exporter: its own OS thread, its own current-thread tokio runtime and its own
//! listener, serving the exposition at `/metrics`; it never runs on a serving thread.
//!
//! Scrapes are coalesced: requests that arrive while a render is running wait for it to end
//! and are then served together by one render per (format, gzip) pair, each piece sent to
//! every waiting client. A render produces the exposition ~64 KiB at a time and waits for
//! the slowest client's channel, so memory stays bounded whatever the series count. A scrape
//! that outlives its `X-Prometheus-Scrape-Timeout-Seconds` budget is aborted (the connection
//! is reset, so the client can never mistake a truncated body for a whole one).
//!
//! Any [`Page`](crate::Page) in [`ExporterConfig::pages`] is asked first, and ticked on this
//! thread at its own interval.

use std::convert::Infallible;
use std::io::Write as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use flate2::Compression;
use flate2::write::GzEncoder;
use http::{Method, Request, Response, StatusCode, header};
use http_body::Frame;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::family::lock;
use crate::negotiate::{accepts_gzip, negotiate_format, scrape_budget};
use crate::render::{Format, Render};
use crate::{MetricsError, Pages, Registry};

/// Scheduling priority of the exporter thread.
///
/// The default is `SCHED_IDLE` (issue 26, `docs/benchmarks/2026-11-27-scrape-shared-core/`):
/// on the serving thread's core, a nice 19 exporter still kept the core for up to 4.2 ms
/// after the serving thread woke (a `perf sched` trace of a 1M-series scrape), because the
/// kernel's EEVDF scheduler lets a task it has just picked run out its time slice (1.4 ms
/// here, noticed at the next tick) before a waking task of any weight may preempt it (run to
/// parity). A `SCHED_IDLE` task is preempted at once by any waking normal task (130 us at
/// most in the same trace). The trade:
/// on a core saturated by serving threads a `SCHED_IDLE` exporter gets ~0.3 % of it (weight 3
/// against 1024) where nice 19 got ~1.5 %, so a large scrape there is slower; `Nice(19)`
/// remains available for that case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Priority {
    /// The process's own priority: the exporter competes with serving threads as an equal.
    Normal,
    /// A nice value (1..=19 lowers the priority; raising it needs privileges).
    Nice(i32),
    /// `SCHED_IDLE` (the default): runs only when a core has nothing else to run, and gives
    /// way at once when a serving thread wakes. Falls back to nice 19 if the kernel refuses.
    #[default]
    Idle,
}

impl FromStr for Priority {
    type Err = String;

    /// `normal`, `idle`, or `nice:N`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "normal" => Ok(Priority::Normal),
            "idle" => Ok(Priority::Idle),
            _ => s
                .strip_prefix("nice:")
                .and_then(|n| n.parse().ok())
                .map(Priority::Nice)
                .ok_or_else(|| format!("priority {s:?}: expected normal, idle or nice:N")),
        }
    }
}

/// How the exporter listens and renders.
#[derive(Debug, Clone)]
pub struct ExporterConfig {
    /// Listen address. Default `127.0.0.1:9091`.
    pub listen: SocketAddr,
    /// Path of the exposition. Default `/metrics`.
    pub path: String,
    /// Scheduling priority of the exporter thread. Default `SCHED_IDLE`
    /// ([`Priority::default`]).
    pub priority: Priority,
    /// CPUs the exporter thread may run on (empty: wherever the process may). Give it a
    /// core that serves no traffic when there is one: a render of a large registry sweeps
    /// memory (~134 MB for 1M series) and a priority cannot stop that from evicting the
    /// caches of a serving thread on the same core.
    pub cpus: Vec<usize>,
    /// Uncompressed bytes rendered per piece sent. Default 64 KiB.
    pub chunk_bytes: usize,
    /// Time budget of a scrape that sends no timeout header. Default 30 s.
    pub default_budget: Duration,
    /// How often idle series of TTL families are swept. Default 1 s.
    pub sweep_every: Duration,
    /// Pages served beside the exposition, asked before it (default: none).
    pub pages: Pages,
}

impl Default for ExporterConfig {
    fn default() -> Self {
        ExporterConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9091)),
            path: "/metrics".to_owned(),
            priority: Priority::default(),
            cpus: Vec::new(),
            chunk_bytes: 64 * 1024,
            default_budget: Duration::from_secs(30),
            sweep_every: Duration::from_secs(1),
            pages: Pages::default(),
        }
    }
}

/// A running exporter. Dropping it (or [`Exporter::shutdown`]) stops the thread.
#[derive(Debug)]
pub struct Exporter {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Exporter {
    /// Binds `config.listen` (here, so a bad address is an error now) and starts the
    /// exporter thread serving `registry`.
    pub fn spawn(registry: Registry, config: ExporterConfig) -> Result<Exporter, MetricsError> {
        let listen = config.listen;
        let error = move |source| MetricsError::Exporter {
            addr: listen,
            source,
        };
        let listener = std::net::TcpListener::bind(config.listen).map_err(error)?;
        listener.set_nonblocking(true).map_err(error)?;
        let addr = listener.local_addr().map_err(error)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(error)?;
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("metrics-exporter".to_owned())
            .spawn(move || {
                // Scrapes record a few self-metrics: not worth a shard a serving thread
                // could own.
                crate::use_shared_shard();
                set_thread_priority(config.priority, "metrics exporter");
                apply_cpus(&config.cpus);
                runtime.block_on(serve(listener, registry, config, stopped));
            })
            .map_err(error)?;
        tracing::info!(%addr, "metrics exporter listening");
        Ok(Exporter {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address the exporter listens on (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the exporter and waits for its thread to end.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// Pins the calling (exporter) thread to `cpus`; a failure is logged, the exporter runs.
fn apply_cpus(cpus: &[usize]) {
    if cpus.is_empty() {
        return;
    }
    let mut set = rustix::thread::CpuSet::new();
    for &cpu in cpus {
        if cpu < rustix::thread::CpuSet::MAX_CPU {
            set.set(cpu);
        }
    }
    if let Err(err) = rustix::thread::sched_setaffinity(None, &set) {
        tracing::warn!(%err, ?cpus, "metrics exporter: could not pin to these CPUs");
    }
}

/// Sets the calling thread's priority and logs the one it got (`thread`: how the log names
/// it): `SCHED_IDLE` falls back to nice 19 when the kernel refuses it (a seccomp filter, a
/// non-Linux kernel). For any off-path thread that may share a core with serving threads
/// (the metrics exporter, a trace exporter): at `SCHED_IDLE` a serving thread that wakes
/// takes the core at once, where nice 19 still lets the thread finish its time slice
/// (issue 26: up to 4.2 ms).
pub fn set_thread_priority(priority: Priority, thread: &str) {
    let tid = rustix::thread::gettid();
    let set_nice = |value: i32| {
        // PRIO_PROCESS with a thread id: on Linux the nice value is per thread.
        if let Err(err) = rustix::process::setpriority_process(Some(tid), value) {
            tracing::warn!(%err, value, "{thread}: could not set nice value");
        }
    };
    match priority {
        Priority::Normal => {}
        Priority::Nice(value) => set_nice(value),
        Priority::Idle => {
            use thread_priority::{
                NormalThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
            };
            let idle = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle);
            // The call also sets nice 0, which fails in a process already at a positive nice
            // after the policy itself was applied: the policy read back is what counts.
            let result = thread_priority::set_thread_priority_and_policy(
                thread_priority::thread_native_id(),
                ThreadPriority::Min,
                idle,
            );
            // Nice 19 either way: the fallback, and what the thread keeps if something moves it
            // back to SCHED_OTHER.
            set_nice(19);
            if thread_priority::thread_schedule_policy().is_ok_and(|policy| policy == idle) {
                tracing::info!("{thread}: running at SCHED_IDLE");
            } else {
                tracing::warn!(
                    ?result,
                    "{thread}: SCHED_IDLE refused; running at nice 19 instead"
                );
            }
        }
    }
}

/// One waiting scrape.
struct Subscriber {
    format: Format,
    gzip: bool,
    deadline: Instant,
    tx: mpsc::Sender<Piece>,
}

/// What the render sends a response body.
enum Piece {
    Data(Bytes),
    /// The exposition is complete; the body ends cleanly.
    Done,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Subscriber>,
    rendering: bool,
}

struct Hub {
    registry: Registry,
    config: ExporterConfig,
    queue: Mutex<Queue>,
}

async fn serve(
    listener: std::net::TcpListener,
    registry: Registry,
    config: ExporterConfig,
    mut stopped: oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(err) => {
            tracing::error!(%err, "metrics exporter: listener unusable");
            return;
        }
    };
    let sweep_every = config.sweep_every;
    let hub = Arc::new(Hub {
        registry,
        config,
        queue: Mutex::default(),
    });
    let sweeper = {
        let registry = hub.registry.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(sweep_every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if registry.has_ttl() {
                    registry.sweep(std::time::Instant::now());
                }
            }
        })
    };
    let tickers: Vec<_> = hub
        .config
        .pages
        .0
        .iter()
        .filter_map(|page| {
            let every = page.tick_every()?;
            let page = Arc::clone(page);
            Some(tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    page.tick();
                }
            }))
        })
        .collect();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let hub = Arc::clone(&hub);
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let hub = Arc::clone(&hub);
                        async move { Ok::<_, Infallible>(handle(&hub, req)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
    sweeper.abort();
    for ticker in tickers {
        ticker.abort();
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<ExpositionBody> {
    let mut response = Response::new(ExpositionBody::Full(Some(Bytes::from_static(
        text.as_bytes(),
    ))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn handle(hub: &Arc<Hub>, req: Request<Incoming>) -> Response<ExpositionBody> {
    if !hub.config.pages.0.is_empty() {
        let (parts, body) = req.into_parts();
        for page in &hub.config.pages.0 {
            if let Some(response) = page.respond(&parts) {
                let head = parts.method == Method::HEAD;
                return response.map(|bytes| ExpositionBody::Full((!head).then_some(bytes)));
            }
        }
        return exposition(hub, Request::from_parts(parts, body));
    }
    exposition(hub, req)
}

fn exposition(hub: &Arc<Hub>, req: Request<Incoming>) -> Response<ExpositionBody> {
    if req.uri().path() != hub.config.path {
        return plain(StatusCode::NOT_FOUND, "not found\n");
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
    }
    let header_str = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let format = negotiate_format(header_str(header::ACCEPT.as_str()));
    let gzip = accepts_gzip(header_str(header::ACCEPT_ENCODING.as_str()));
    let budget = scrape_budget(header_str("x-prometheus-scrape-timeout-seconds"))
        .unwrap_or(hub.config.default_budget);

    let body = if req.method() == Method::HEAD {
        ExpositionBody::Full(None)
    } else {
        // A few pieces of slack: the render runs ahead of a slow client by at most this.
        let (tx, rx) = mpsc::channel(4);
        enqueue(
            hub,
            Subscriber {
                format,
                gzip,
                deadline: Instant::now() + budget,
                tx,
            },
        );
        ExpositionBody::Stream { rx, done: false }
    };
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(format.content_type()),
    );
    if gzip {
        headers.insert(
            header::CONTENT_ENCODING,
            header::HeaderValue::from_static("gzip"),
        );
    }
    headers.insert(
        header::VARY,
        header::HeaderValue::from_static("Accept, Accept-Encoding"),
    );
    response
}

fn enqueue(hub: &Arc<Hub>, subscriber: Subscriber) {
    let mut queue = lock(&hub.queue);
    queue.waiting.push(subscriber);
    if !queue.rendering {
        queue.rendering = true;
        tokio::spawn(render_loop(Arc::clone(hub)));
    }
}

async fn render_loop(hub: Arc<Hub>) {
    loop {
        let mut batch = {
            let mut queue = lock(&hub.queue);
            if queue.waiting.is_empty() {
                queue.rendering = false;
                return;
            }
            std::mem::take(&mut queue.waiting)
        };
        while let Some(first) = batch.first() {
            let key = (first.format, first.gzip);
            let (group, rest): (Vec<_>, Vec<_>) =
                batch.into_iter().partition(|s| (s.format, s.gzip) == key);
            batch = rest;
            if let Some(metrics) = hub.registry.scrape_metrics() {
                metrics.coalesced.add(group.len() as u64 - 1);
            }
            render_group(&hub, key.0, key.1, group).await;
        }
    }
}

/// Renders one exposition and streams it to every subscriber of the group.
async fn render_group(hub: &Hub, format: Format, gzip: bool, mut subscribers: Vec<Subscriber>) {
    let started = std::time::Instant::now();
    let chunk_bytes = hub.config.chunk_bytes.max(1024);
    let mut render = Render::new(hub.registry.snapshot(), format);
    let mut encoder = gzip.then(|| GzEncoder::new(Vec::new(), Compression::fast()));
    let mut buf = Vec::with_capacity(chunk_bytes + chunk_bytes / 4);
    let mut total = 0usize;
    let metrics = hub.registry.scrape_metrics();
    loop {
        buf.clear();
        let finished = render.fill(&mut buf, chunk_bytes);
        total += buf.len();
        let piece = match &mut encoder {
            None => Bytes::copy_from_slice(&buf),
            Some(encoder) => {
                // Writing into a Vec cannot fail.
                let _ = encoder.write_all(&buf);
                if finished {
                    let _ = encoder.try_finish();
                }
                Bytes::from(std::mem::take(encoder.get_mut()))
            }
        };
        if !piece.is_empty() {
            let mut kept = Vec::with_capacity(subscribers.len());
            let mut timed_out = false;
            for sub in subscribers {
                let sent =
                    tokio::time::timeout_at(sub.deadline, sub.tx.send(Piece::Data(piece.clone())))
                        .await;
                match sent {
                    Ok(Ok(())) if Instant::now() <= sub.deadline => kept.push(sub),
                    Ok(Ok(())) | Err(_) => {
                        // Past its budget: dropping the sender without `Done` resets the
                        // response, so the client sees a failed scrape, not a short one.
                        timed_out = true;
                        if let Some(m) = metrics {
                            m.timed_out.inc();
                        }
                    }
                    Ok(Err(_)) => {} // the client went away
                }
            }
            subscribers = kept;
            if subscribers.is_empty() {
                if let Some(m) = metrics
                    && !timed_out
                {
                    m.abandoned.inc();
                }
                return;
            }
        }
        if finished {
            break;
        }
    }
    for sub in subscribers {
        let _ = sub.tx.send(Piece::Done).await;
        if let Some(m) = metrics {
            m.ok.inc();
        }
    }
    if let Some(m) = metrics {
        m.bytes.set(i64::try_from(total).unwrap_or(i64::MAX));
        m.duration.observe_duration(started.elapsed());
    }
}

/// The response body of the exporter: a fixed text, or the stream of a render.
enum ExpositionBody {
    Full(Option<Bytes>),
    Stream {
        rx: mpsc::Receiver<Piece>,
        done: bool,
    },
}

impl http_body::Body for ExpositionBody {
    type Data = Bytes;
    type Error = std::io::Error;

    /// A fixed text's length, so it goes out with `Content-Length` rather than chunked.
    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            ExpositionBody::Full(Some(bytes)) => {
                http_body::SizeHint::with_exact(bytes.len() as u64)
            }
            _ => http_body::SizeHint::default(),
        }
    }

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.get_mut() {
            ExpositionBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ExpositionBody::Stream { rx, done } => {
                if *done {
                    return Poll::Ready(None);
                }
                match rx.poll_recv(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(Some(Piece::Data(bytes))) => {
                        Poll::Ready(Some(Ok(Frame::data(bytes))))
                    }
                    Poll::Ready(Some(Piece::Done)) => {
                        *done = true;
                        Poll::Ready(None)
                    }
                    Poll::Ready(None) => {
                        *done = true;
                        Poll::Ready(Some(Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "metrics exposition aborted (scrape budget exceeded)",
                        ))))
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three scrapes queued before the render starts (on the exporter's current-thread
    /// runtime nothing runs until the handler yields) are served by one render.
    #[test]
    fn concurrent_scrapes_share_one_render() {
        let registry = Registry::new();
        registry
            .counter("c", "C.", &[])
            .unwrap()
            .get_or_create(&[])
            .unwrap()
            .inc();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let bodies = runtime.block_on(async {
            let hub = Arc::new(Hub {
                registry: registry.clone(),
                config: ExporterConfig::default(),
                queue: Mutex::default(),
            });
            let mut receivers = Vec::new();
            for _ in 0..3 {
                let (tx, rx) = mpsc::channel(4);
                enqueue(
                    &hub,
                    Subscriber {
                        format: Format::Text,
                        gzip: false,
                        deadline: Instant::now() + Duration::from_secs(60),
                        tx,
                    },
                );
                receivers.push(rx);
            }
            let mut bodies = Vec::new();
            for mut rx in receivers {
                let mut body = Vec::new();
                loop {
                    match rx.recv().await {
                        Some(Piece::Data(bytes)) => body.extend_from_slice(&bytes),
                        Some(Piece::Done) => break,
                        None => panic!("render aborted"),
                    }
                }
                bodies.push(body);
            }
            bodies
        });
        assert_eq!(bodies[0], bodies[1]);
        assert_eq!(bodies[1], bodies[2]);
        assert!(String::from_utf8_lossy(&bodies[0]).contains("c_total 1\n"));
        let after = String::from_utf8(registry.render(Format::Text)).unwrap();
        assert!(
            after.contains("metrics_scrapes_coalesced_total 2\n"),
            "{after}"
        );
        assert!(after.contains("metrics_scrapes_total{outcome=\"ok\"} 3\n"));
        assert!(after.contains("metrics_scrape_duration_seconds_count 1\n"));
    }
}

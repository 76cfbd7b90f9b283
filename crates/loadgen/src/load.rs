//! The open-loop load generator: sends requests at their scheduled times over keep-alive
//! connections it manages itself, and times each response from its intended send time.
//!
//! Each generator thread runs a current-thread tokio runtime with one dispatcher and its share
//! of the connections. The dispatcher sleeps on a `timerfd` (nanosecond deadlines; tokio's own
//! timer rounds to milliseconds, which would add up to 1 ms to loopback latencies) and, when a
//! request's time comes, puts its intended time in a FIFO. Idle connections take from the FIFO;
//! when every connection is busy the request waits there and is counted as queued, but its
//! latency still runs from the intended time, so a stalled target shows as latency instead of
//! as a lower rate (no coordinated omission).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustix::time::{Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::LoadError;
use crate::clock::{from_ns, now_ns};
use crate::keys::{KeyCounts, KeyTally};
use crate::latency::Latency;
use crate::report::{Report, Scrape};
use crate::schedule::{Phase, Schedule};
use crate::scrape::{ScrapeClock, ScrapeConfig, WatchConfig};
use crate::scraper_process::Scraper;
use crate::slowest::{Kept, Outcome, ScrapeSpan, Slowest};
use crate::target::{Target, parse_target};
use crate::timeline::Timeline;
use crate::timer::register_timer;

/// Everything a load run needs.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Target URL (`http://host:port/path`).
    pub url: String,
    /// Request method.
    pub method: Method,
    /// Extra request headers.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// A header whose value changes from request to request: each generator thread sends
    /// these values in turn, from the first, round and round (e.g. 1,000 distinct tokens, so
    /// that a gateway sees many credentials rather than one).
    pub rotate: Option<(HeaderName, Arc<[HeaderValue]>)>,
    /// With `rotate`: count the answers per value and per wall-clock window of this length
    /// (the report's `keys`), e.g. to check a per-key rate limit key by key.
    pub count_values: Option<Duration>,
    /// Request body.
    pub body: Bytes,
    /// Requests per second.
    pub rate: f64,
    /// Measured duration.
    pub duration: Duration,
    /// Time at the same rate before measuring.
    pub warmup: Duration,
    /// Keep-alive connections, spread over the threads.
    pub connections: usize,
    /// Generator threads.
    pub threads: usize,
    /// Poisson arrivals instead of a constant interval.
    pub poisson: bool,
    /// Seed for Poisson arrivals.
    pub seed: u64,
    /// Per-request timeout, from the moment it is written.
    pub timeout: Duration,
    /// A metrics endpoint to scrape during the run.
    pub scrape: Option<ScrapeConfig>,
    /// Print a progress line every second (stdout).
    pub progress: bool,
    /// Cores to pin the generator threads to (empty: not pinned).
    pub pin: Vec<usize>,
    /// Nice value of the generator threads (negative: ahead of other work; needs root).
    pub nice: Option<i32>,
    /// A stepped load: these rates one after the other, the last one until the end (empty:
    /// `rate` throughout). The warmup runs at the first phase's rate.
    pub phases: Vec<Phase>,
    /// Gateway metrics to read every second into the report's timeline.
    pub watch: Option<WatchConfig>,
}

impl LoadConfig {
    /// A GET at `rate` for `duration` over `connections`, one thread, no warmup.
    pub fn new(url: &str, rate: f64, duration: Duration, connections: usize) -> Self {
        Self {
            url: url.to_string(),
            method: Method::GET,
            headers: Vec::new(),
            rotate: None,
            count_values: None,
            body: Bytes::new(),
            rate,
            duration,
            warmup: Duration::ZERO,
            connections,
            threads: 1,
            poisson: false,
            seed: 1,
            timeout: Duration::from_secs(10),
            scrape: None,
            progress: false,
            pin: Vec::new(),
            nice: None,
            phases: Vec::new(),
            watch: None,
        }
    }
}

/// A request built once; each send clones its parts (cheap: shared bytes).
struct Template {
    method: Method,
    path: Uri,
    headers: HeaderMap,
    body: Bytes,
    /// The rotating header and the index of the value the next request carries.
    rotate: Option<(HeaderName, Arc<[HeaderValue]>)>,
    next: Cell<usize>,
}

impl Template {
    /// The next request, and the number of the rotating header's value it carries.
    fn build(&self) -> (Request<Full<Bytes>>, Option<usize>) {
        let mut req = Request::new(Full::new(self.body.clone()));
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.path.clone();
        *req.headers_mut() = self.headers.clone();
        let mut value = None;
        if let Some((name, values)) = &self.rotate
            && !values.is_empty()
        {
            let i = self.next.get();
            self.next.set((i + 1) % values.len());
            req.headers_mut().insert(name.clone(), values[i].clone());
            value = Some(i);
        }
        (req, value)
    }
}

/// Counters shared with the progress line.
#[derive(Default)]
struct Progress {
    sent: AtomicU64,
    completed: AtomicU64,
    interval: Mutex<Latency>,
}

/// What one generator thread measured.
#[derive(Default)]
struct ThreadStats {
    latency: Latency,
    latency_ok: Latency,
    during_scrape: Latency,
    lag: Latency,
    from_release: Latency,
    status: BTreeMap<u16, u64>,
    errors: BTreeMap<String, u64>,
    sent: u64,
    completed: u64,
    completed_in_window: u64,
    bytes: u64,
    queued: u64,
    max_queue: u64,
    timeline: Timeline,
    slowest: Slowest,
    keys: Option<KeyCounts>,
}

/// The FIFO between the dispatcher and the connections of one thread.
struct Shared {
    /// `(intended, released)`: when the request was due, and when the dispatcher saw it due.
    queue: RefCell<VecDeque<(u64, u64)>>,
    notify: Notify,
    closed: Cell<bool>,
    /// Connections waiting for work right now.
    idle: Cell<usize>,
    stats: RefCell<ThreadStats>,
    template: Template,
    target: Target,
    measure_from: u64,
    window_end: u64,
    timeout: Duration,
    scrape_clock: Arc<ScrapeClock>,
    progress: Option<Arc<Progress>>,
    keys: Option<RefCell<KeyTally>>,
}

impl Shared {
    fn push(&self, intended: u64, released: u64) {
        let mut q = self.queue.borrow_mut();
        q.push_back((intended, released));
        let waiting = q.len().saturating_sub(self.idle.get()) as u64;
        drop(q);
        if intended >= self.measure_from {
            let mut s = self.stats.borrow_mut();
            s.sent += 1;
            s.timeline.offered(intended - self.measure_from);
            if waiting > 0 {
                s.queued += 1;
                s.max_queue = s.max_queue.max(waiting);
            }
        }
        if let Some(p) = &self.progress {
            p.sent.fetch_add(1, Ordering::Relaxed);
        }
        self.notify.notify_one();
    }

    async fn pop(&self) -> Option<(u64, u64)> {
        loop {
            if let Some(t) = self.queue.borrow_mut().pop_front() {
                return Some(t);
            }
            if self.closed.get() {
                return None;
            }
            self.idle.set(self.idle.get() + 1);
            self.notify.notified().await;
            self.idle.set(self.idle.get() - 1);
        }
    }

    fn error(&self, intended: u64, kind: &'static str, connection: usize) {
        if intended >= self.measure_from {
            let now = now_ns();
            let mut s = self.stats.borrow_mut();
            *s.errors.entry(kind.to_string()).or_default() += 1;
            s.timeline.error(now.saturating_sub(self.measure_from));
            s.slowest.offer(Kept {
                latency_ns: now.saturating_sub(intended),
                intended_ns: intended - self.measure_from,
                connection,
                outcome: Outcome::Error(kind),
            });
        }
    }
}

/// Runs the load and returns its report. Blocks the calling thread for the run.
pub fn run(config: &LoadConfig) -> Result<Report, LoadError> {
    let mut reports = run_streams(std::slice::from_ref(config))?;
    Ok(reports.remove(0))
}

/// The measured window's requested rate: `rate`, or the phases' mean over the window.
fn mean_rate(config: &LoadConfig) -> f64 {
    if config.phases.is_empty() {
        return config.rate;
    }
    let window = config.duration.as_secs_f64();
    let t = Timeline::new(&config.phases, config.rate, window);
    t.phases
        .iter()
        .map(|p| p.rate * (p.end_s.min(window) - p.start_s).max(0.0))
        .sum::<f64>()
        / window.max(1e-9)
}

fn validate(config: &LoadConfig) -> Result<(), LoadError> {
    if config.phases.is_empty() {
        if !(config.rate > 0.0 && config.rate.is_finite()) {
            return Err(LoadError::Config("--rate must be a positive number".into()));
        }
    } else if config
        .phases
        .iter()
        .any(|p| !(p.rate >= 0.0 && p.rate.is_finite()))
        || config.phases.iter().all(|p| p.rate == 0.0)
    {
        return Err(LoadError::Config(
            "phase rates must be 0 or more, and one above 0".into(),
        ));
    }
    if config.connections == 0 {
        return Err(LoadError::Config("--connections must be at least 1".into()));
    }
    if config.duration.is_zero() {
        return Err(LoadError::Config("--duration must be above 0".into()));
    }
    Ok(())
}

/// Runs several loads at once on one clock (one stream per config, e.g. one per upstream of
/// a gateway) and returns one report per stream, in order. Every stream shares the first
/// one's warmup and measured window, so their timelines line up second by second; the first
/// one's scraper and watcher serve the whole run and their results land in its report.
pub fn run_streams(configs: &[LoadConfig]) -> Result<Vec<Report>, LoadError> {
    let Some(first) = configs.first() else {
        return Err(LoadError::Config("no load to run".into()));
    };
    for config in configs {
        validate(config)?;
    }
    let scrape_clock = Arc::new(ScrapeClock::default());
    let progress = first.progress.then(|| Arc::new(Progress::default()));
    let start_cell = Arc::new(OnceLock::<u64>::new());
    let lanes_of = |c: &LoadConfig| c.threads.clamp(1, c.connections);
    let all_threads: usize = configs.iter().map(lanes_of).sum();
    let connected = Arc::new(Barrier::new(all_threads + 1));
    let started = Arc::new(Barrier::new(all_threads + 1));
    let warmup_ns = first.warmup.as_nanos() as u64;
    let duration_ns = first.duration.as_nanos() as u64;
    let duration_s = first.duration.as_secs_f64();

    let mut handles: Vec<Vec<_>> = Vec::new();
    for config in configs {
        let target = parse_target(&config.url)?;
        let threads = lanes_of(config);
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::HOST,
            HeaderValue::from_str(&target.authority)
                .map_err(|_| LoadError::Config("host is not a valid header value".into()))?,
        );
        for (name, value) in &config.headers {
            headers.append(name.clone(), value.clone());
        }
        // The warmup runs at the first phase's rate, so the window opens on the first step.
        let mut phases = config.phases.clone();
        if phases.is_empty() {
            phases.push(Phase {
                rate: config.rate,
                duration: Duration::MAX,
            });
        }
        if !first.warmup.is_zero() {
            phases.insert(
                0,
                Phase {
                    rate: phases[0].rate,
                    duration: first.warmup,
                },
            );
        }
        let mut stream_handles = Vec::new();
        let mut first_connection = 0;
        for lane in 0..threads {
            let connections =
                config.connections / threads + usize::from(lane < config.connections % threads);
            let lane_first_connection = first_connection;
            first_connection += connections;
            let schedule = if config.poisson {
                Schedule::stepped_poisson(&phases, lane as u64, threads as u64, config.seed)
            } else {
                Schedule::stepped(&phases, lane as u64, threads as u64)
            };
            let template = Template {
                method: config.method.clone(),
                path: target.path.clone(),
                headers: headers.clone(),
                body: config.body.clone(),
                rotate: config.rotate.clone(),
                next: Cell::new(0),
            };
            let timeline = Timeline::new(&config.phases, config.rate, duration_s);
            let target = target.clone();
            let (scrape_clock, progress) = (scrape_clock.clone(), progress.clone());
            let (start_cell, connected, started) =
                (start_cell.clone(), connected.clone(), started.clone());
            let timeout = config.timeout;
            let keys = match (&config.rotate, config.count_values) {
                (Some((name, values)), Some(window)) => {
                    Some(KeyTally::new(name, values.len(), window))
                }
                _ => None,
            };
            let pin = config.pin.clone();
            let nice = config.nice;
            let handle = std::thread::Builder::new()
                .name(format!("load-{lane}"))
                .spawn(move || -> Result<ThreadStats, LoadError> {
                    if !pin.is_empty()
                        && let Err(e) = crate::pinning::pin_current_thread(&pin)
                    {
                        eprintln!(
                            "load: cannot pin thread {lane} to cpu {pin:?}: {e}; running unpinned"
                        );
                    }
                    if let Some(n) = nice
                        && let Err(e) = crate::pinning::nice_current_thread(n)
                    {
                        eprintln!("load: cannot set nice {n} on thread {lane}: {e}");
                    }
                    // The default 50 us timer slack would let every timerfd wake-up come late
                    // by up to that much, and the lateness would count as latency.
                    let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1));
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            // Still meet the other threads at both barriers, or they wait
                            // forever.
                            connected.wait();
                            started.wait();
                            return Err(LoadError::Io(e));
                        }
                    };
                    let local = tokio::task::LocalSet::new();
                    local.block_on(&rt, async move {
                        let setup = ThreadSetup {
                            connections,
                            first_connection: lane_first_connection,
                            schedule,
                            template,
                            target,
                            scrape_clock,
                            progress,
                            start_cell,
                            connected,
                            started,
                            warmup_ns,
                            duration_ns,
                            timeout,
                            timeline,
                            keys,
                        };
                        run_thread(setup).await
                    })
                })
                .map_err(LoadError::Io)?;
            stream_handles.push(handle);
        }
        handles.push(stream_handles);
    }

    // The scraper starts, and scrapes once, before the load does, as a Prometheus has been
    // scraping long before a measurement starts. Its first scrape in the run used to open
    // the connection and build its buffers there: 66-117 ms against 9-16 ms for the later
    // ones, 100k series of `tailguard-axum-bench`.
    let scraper = first
        .scrape
        .clone()
        .map(|sc| Scraper::start(sc, first.pin.clone(), scrape_clock.clone()));

    connected.wait();
    // 10 ms of slack so every thread has its timer armed before the first intended send.
    let start = now_ns() + 10_000_000;
    start_cell
        .set(start)
        .expect("the start time is set exactly once, here");
    started.wait();
    let measure_from = start + warmup_ns;
    let window_end = measure_from + duration_ns;
    let scraper = scraper.map(|mut scraper| {
        scraper.begin(start, measure_from, window_end);
        scraper
    });
    let watcher = first.watch.clone().map(|wc| {
        std::thread::spawn(move || crate::scrape::watch(wc, start, measure_from, window_end))
    });

    let total_rate: f64 = configs.iter().map(mean_rate).sum();
    let mut last_print = now_ns();
    while handles.iter().flatten().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
        if let Some(p) = &progress {
            let now = now_ns();
            if now - last_print >= 1_000_000_000 {
                last_print = now;
                print_progress(p, now.saturating_sub(start), total_rate);
            }
        }
    }
    if progress.is_some() {
        println!();
    }
    let mut scrapes: Vec<Scrape> = scraper.map(Scraper::join).unwrap_or_default();
    let readings = match watcher {
        Some(h) => h.join().unwrap_or_default(),
        None => Vec::new(),
    };
    // Every stream's slowest requests are placed against the one scraper's scrapes: one clock.
    let scrape_spans: Vec<ScrapeSpan> = scrapes.iter().map(Scrape::span).collect();
    let mut reports = Vec::new();
    for (config, stream_handles) in configs.iter().zip(handles) {
        let threads = stream_handles.len();
        let mut total = ThreadStats {
            timeline: Timeline::new(&config.phases, config.rate, duration_s),
            ..ThreadStats::default()
        };
        for h in stream_handles {
            let stats = h
                .join()
                .map_err(|_| LoadError::Config("a generator thread panicked".into()))??;
            total.latency.add(&stats.latency);
            total.during_scrape.add(&stats.during_scrape);
            total.latency_ok.add(&stats.latency_ok);
            total.lag.add(&stats.lag);
            total.from_release.add(&stats.from_release);
            for (k, v) in stats.status {
                *total.status.entry(k).or_default() += v;
            }
            for (k, v) in stats.errors {
                *total.errors.entry(k).or_default() += v;
            }
            total.sent += stats.sent;
            total.completed += stats.completed;
            total.completed_in_window += stats.completed_in_window;
            total.bytes += stats.bytes;
            total.queued += stats.queued;
            total.max_queue = total.max_queue.max(stats.max_queue);
            total.timeline.add(&stats.timeline);
            total.slowest.add(stats.slowest);
            if let Some(k) = &stats.keys {
                total.keys.get_or_insert_with(KeyCounts::default).add(k);
            }
        }
        if reports.is_empty() {
            total.timeline.set_gauges(&readings);
        }
        reports.push(Report {
            url: config.url.clone(),
            method: config.method.to_string(),
            requested_rate: mean_rate(config),
            poisson: config.poisson,
            seed: config.seed,
            duration_s,
            warmup_s: first.warmup.as_secs_f64(),
            connections: config.connections,
            threads,
            sent: total.sent,
            completed: total.completed,
            achieved_rate: total.completed_in_window as f64 / duration_s,
            bytes_read: total.bytes,
            queued: total.queued,
            max_queue: total.max_queue,
            status: total.status,
            errors: total.errors,
            latency: total.latency,
            latency_ok: total.latency_ok,
            generator_lag: total.lag,
            latency_from_release: total.from_release,
            latency_during_scrape: total.during_scrape,
            scrapes: std::mem::take(&mut scrapes),
            slowest: total.slowest.report(&scrape_spans),
            timeline: total.timeline,
            keys: total.keys,
        });
    }
    Ok(reports)
}

fn print_progress(p: &Progress, elapsed_ns: u64, rate: f64) {
    use std::io::Write as _;
    let interval = {
        let mut guard = p.interval.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *guard)
    };
    let secs = elapsed_ns as f64 / 1e9;
    let completed = p.completed.load(Ordering::Relaxed);
    print!(
        "\r{:>6.1}s  sent {:>9}  done {:>9}  achieved {:>9.1}/{} req/s  P99 (last 1s) {:>9}   ",
        secs,
        p.sent.load(Ordering::Relaxed),
        completed,
        completed as f64 / secs.max(1e-9),
        rate,
        crate::latency::format_us(interval.percentile_us(99.0) as f64)
    );
    let _ = std::io::stdout().flush();
}

struct ThreadSetup {
    connections: usize,
    /// The number of this thread's first connection in its stream (each thread has a slice).
    first_connection: usize,
    schedule: Schedule,
    template: Template,
    target: Target,
    scrape_clock: Arc<ScrapeClock>,
    progress: Option<Arc<Progress>>,
    start_cell: Arc<OnceLock<u64>>,
    connected: Arc<Barrier>,
    started: Arc<Barrier>,
    warmup_ns: u64,
    duration_ns: u64,
    timeout: Duration,
    timeline: Timeline,
    keys: Option<KeyTally>,
}

async fn run_thread(setup: ThreadSetup) -> Result<ThreadStats, LoadError> {
    // Connect every connection before the clock starts, so the first second measures the
    // target, not our handshakes.
    let mut senders = Vec::with_capacity(setup.connections);
    let mut connect_errors = 0;
    for _ in 0..setup.connections {
        match tokio::time::timeout(setup.timeout, connect(setup.target.addr)).await {
            Ok(Ok(s)) => senders.push(Some(s)),
            _ => {
                connect_errors += 1;
                senders.push(None);
            }
        }
    }
    // Barrier waits block the thread; nothing else runs on it yet, so that is harmless.
    setup.connected.wait();
    setup.started.wait();
    let start = *setup
        .start_cell
        .get()
        .expect("the start time is set before the second barrier");
    let measure_from = start + setup.warmup_ns;
    let window_end = measure_from + setup.duration_ns;
    let shared = Rc::new(Shared {
        queue: RefCell::new(VecDeque::new()),
        notify: Notify::new(),
        closed: Cell::new(false),
        idle: Cell::new(0),
        stats: RefCell::new(ThreadStats {
            timeline: setup.timeline,
            ..ThreadStats::default()
        }),
        template: setup.template,
        target: setup.target,
        measure_from,
        window_end,
        timeout: setup.timeout,
        scrape_clock: setup.scrape_clock,
        progress: setup.progress,
        keys: setup.keys.map(RefCell::new),
    });
    if connect_errors > 0 {
        shared
            .stats
            .borrow_mut()
            .errors
            .insert("connect (setup)".to_string(), connect_errors);
    }
    let mut tasks = Vec::new();
    for (i, sender) in senders.into_iter().enumerate() {
        let number = setup.first_connection + i;
        tasks.push(tokio::task::spawn_local(connection(
            shared.clone(),
            sender,
            number,
        )));
    }
    dispatch(&shared, setup.schedule, start, window_end).await?;
    shared.closed.set(true);
    shared.notify.notify_waiters();
    // Requests still queued or in flight get the timeout to finish; then the rest is counted.
    let drain_deadline = tokio::time::Instant::now() + setup.timeout + Duration::from_millis(500);
    for task in &mut tasks {
        if tokio::time::timeout_at(drain_deadline, &mut *task)
            .await
            .is_err()
        {
            break;
        }
    }
    for task in &tasks {
        task.abort();
    }
    let left: u64 = shared
        .queue
        .borrow()
        .iter()
        .filter(|&&(t, _)| t >= measure_from)
        .count() as u64;
    let mut stats = shared.stats.take();
    stats.keys = shared
        .keys
        .as_ref()
        .map(|k| k.borrow_mut().finish(start, window_end));
    let accounted = stats.completed + stats.errors.values().sum::<u64>() - connect_errors;
    let unfinished = stats.sent.saturating_sub(accounted).max(left);
    if unfinished > 0 {
        stats
            .errors
            .insert("unfinished at end".to_string(), unfinished);
    }
    Ok(stats)
}

/// Pushes each intended send time into the FIFO when it comes, sleeping on a timerfd between.
async fn dispatch(
    shared: &Shared,
    mut schedule: Schedule,
    start: u64,
    end: u64,
) -> Result<(), LoadError> {
    let fd = rustix::time::timerfd_create(
        TimerfdClockId::Monotonic,
        TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
    )
    .map_err(|e| LoadError::Io(e.into()))?;
    let timer = register_timer(fd).map_err(LoadError::Io)?;
    // A schedule that has nothing more to send says NEVER, which saturates past `end`.
    let mut next = start.saturating_add(schedule.next_offset());
    let mut buf = [0u8; 8];
    while next < end {
        let now = now_ns();
        if next <= now {
            while next <= now && next < end {
                shared.push(next, now);
                next = start.saturating_add(schedule.next_offset());
            }
            // Let the connections run before looking at the clock again.
            tokio::task::yield_now().await;
            continue;
        }
        let spec = Itimerspec {
            it_interval: from_ns(0),
            it_value: from_ns(next),
        };
        rustix::time::timerfd_settime(timer.get_ref(), TimerfdTimerFlags::ABSTIME, &spec)
            .map_err(|e| LoadError::Io(e.into()))?;
        let mut guard = timer.readable().await.map_err(LoadError::Io)?;
        // Reading resets the expiry count; EAGAIN means it was a spurious wake.
        let _ = rustix::io::read(timer.get_ref(), &mut buf);
        guard.clear_ready();
    }
    Ok(())
}

async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>, LoadError> {
    let stream = TcpStream::connect(addr).await.map_err(LoadError::Io)?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| LoadError::Config(e.to_string()))?;
    tokio::task::spawn_local(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

fn error_kind(e: &hyper::Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_incomplete_message() || e.is_closed() || e.is_canceled() {
        "closed"
    } else if e.is_parse() || e.is_parse_status() {
        "parse"
    } else {
        "io"
    }
}

/// One keep-alive connection (`number` in its stream): takes the oldest waiting request,
/// sends it, reads the whole response, records the latency from the intended time;
/// reconnects after any failure.
async fn connection(
    shared: Rc<Shared>,
    mut sender: Option<SendRequest<Full<Bytes>>>,
    number: usize,
) {
    while let Some((intended, released)) = shared.pop().await {
        if intended >= shared.measure_from {
            // How late the generator itself was: timer wake-up, scheduling, and the wait for
            // a free connection.
            let lag = now_ns().saturating_sub(intended);
            shared.stats.borrow_mut().lag.record_ns(lag);
        }
        let mut s = match sender.take() {
            Some(s) if !s.is_closed() => s,
            _ => match connect(shared.target.addr).await {
                Ok(s) => s,
                Err(_) => {
                    shared.error(intended, "connect", number);
                    continue;
                }
            },
        };
        let (req, value) = shared.template.build();
        let sent_ns = now_ns();
        let count = |status: Option<u16>| {
            if let (Some(k), Some(value)) = (&shared.keys, value) {
                k.borrow_mut().record(value, sent_ns, status);
            }
        };
        let exchange = async {
            s.ready().await?;
            let resp = s.send_request(req).await?;
            let status = resp.status().as_u16();
            let mut body = resp.into_body();
            let mut bytes = 0u64;
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame?.into_data() {
                    bytes += data.len() as u64;
                }
            }
            Ok::<_, hyper::Error>((status, bytes))
        };
        match tokio::time::timeout(shared.timeout, exchange).await {
            Ok(Ok((status, bytes))) => {
                let done = now_ns();
                sender = Some(s);
                count(Some(status));
                if let Some(p) = &shared.progress {
                    p.completed.fetch_add(1, Ordering::Relaxed);
                    p.interval
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .record_ns(done.saturating_sub(intended));
                }
                if intended < shared.measure_from {
                    continue;
                }
                let mut st = shared.stats.borrow_mut();
                let latency = done.saturating_sub(intended);
                st.latency.record_ns(latency);
                st.from_release.record_ns(done.saturating_sub(released));
                if status < 400 {
                    st.latency_ok.record_ns(latency);
                }
                st.timeline.response(
                    intended - shared.measure_from,
                    done - shared.measure_from,
                    status,
                );
                if shared.scrape_clock.overlaps(intended) {
                    st.during_scrape.record_ns(latency);
                }
                // One compare unless it is among this thread's slowest so far.
                st.slowest.offer(Kept {
                    latency_ns: latency,
                    intended_ns: intended - shared.measure_from,
                    connection: number,
                    outcome: Outcome::Status(status),
                });
                *st.status.entry(status).or_default() += 1;
                st.completed += 1;
                if done <= shared.window_end {
                    st.completed_in_window += 1;
                }
                st.bytes += bytes;
            }
            Ok(Err(e)) => {
                count(None);
                shared.error(intended, error_kind(&e), number);
            }
            // HTTP/1.1 cannot cancel a request in flight: the connection is dropped.
            Err(_) => {
                count(None);
                shared.error(intended, "timeout", number);
            }
        }
    }
}

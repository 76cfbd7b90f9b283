//! The scraper: fetches a metrics endpoint every interval during a load run (in a process of
//! its own or on a thread, [`crate::scraper_process`]), marking each scrape on the
//! generator's clock so requests can be matched to it; or, as the watcher, reads chosen
//! metrics from it every second for the run's timeline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustix::time::{Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags};
use tokio::net::TcpStream;

use crate::clock::{from_ns, now_ns};
use crate::report::Scrape;
use crate::timeline::GaugeReading;

/// What to scrape and how often.
#[derive(Debug, Clone)]
pub struct ScrapeConfig {
    /// Metrics URL, e.g. `http://127.0.0.1:9091/metrics`.
    pub url: String,
    /// Interval between scrape starts.
    pub every: Duration,
    /// Ask for gzip, as Prometheus does (`false`: the whole uncompressed text, as `curl`
    /// fetches it, so the exporter sends every byte of a large exposition).
    pub gzip: bool,
}

/// Which metrics to read from the gateway, and how often, for the run's timeline.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    /// Metrics URL, e.g. `http://127.0.0.1:9091/metrics`.
    pub url: String,
    /// Interval between readings (the timeline has one slot per second).
    pub every: Duration,
    /// Metric names to read, e.g. `tailguard_upstream_limit`; the others are ignored, and a
    /// name the exporter does not have is simply absent from the readings.
    pub metrics: Vec<String>,
}

/// When scrapes ran, readable by the generator threads without a lock.
#[derive(Debug, Default)]
pub struct ScrapeClock {
    /// Start of the scrape in progress (monotonic ns), 0 when none is.
    active_since: AtomicU64,
    /// End of the last finished scrape (monotonic ns).
    last_end: AtomicU64,
}

impl ScrapeClock {
    /// Whether a request intended at `intended` and completing now overlapped a scrape: one is
    /// running now, or the last one ended after the request's intended time. Scrapes are
    /// sequential, so these two cases cover every overlap.
    pub fn overlaps(&self, intended: u64) -> bool {
        self.active_since.load(Ordering::Acquire) != 0
            || self.last_end.load(Ordering::Acquire) >= intended
    }

    /// Marks a scrape as started at `at`.
    pub fn begin(&self, at: u64) {
        self.active_since.store(at.max(1), Ordering::Release);
    }

    /// Marks the running scrape as finished at `at`.
    pub fn end(&self, at: u64) {
        self.last_end.store(at, Ordering::Release);
        self.active_since.store(0, Ordering::Release);
    }
}

/// When the first scrape is due, from the start of the run (warmup included): half an
/// interval in, so the scrapes fall between the run's edges rather than on them.
fn first_scrape_ns(every_ns: u64) -> u64 {
    every_ns / 2
}

/// The starts the scraper aims at, nanoseconds from the start of the measured window (negative
/// during the warmup): the first half an interval into the run, then one every `every`, while
/// before the window's end. Its actual starts are these plus its timer's lateness; the lab
/// places an unscraped run's slowest requests against this schedule, as a control.
pub fn planned_starts_ns(every: Duration, warmup: Duration, duration: Duration) -> Vec<i64> {
    let every = every.as_nanos().max(1) as i64;
    let warmup = warmup.as_nanos() as i64;
    let end = duration.as_nanos() as i64;
    let mut at = first_scrape_ns(every as u64) as i64 - warmup;
    let mut out = Vec::new();
    while at < end {
        out.push(at);
        at += every;
    }
    out
}

/// Where a scraper says when each scrape began and ended: the generator's [`ScrapeClock`]
/// when the scraper is a thread of its process, the parent's pipe when it is a process of
/// its own ([`crate::scraper_process`]).
pub(crate) trait Marks {
    /// A scrape began at `at` (monotonic ns).
    fn begin(&self, at: u64);
    /// The running scrape ended at `at`.
    fn end(&self, at: u64);
}

impl Marks for ScrapeClock {
    fn begin(&self, at: u64) {
        ScrapeClock::begin(self, at);
    }
    fn end(&self, at: u64) {
        ScrapeClock::end(self, at);
    }
}

/// Scrapes once (not recorded), says so on `primed`, then waits for the run's `(start,
/// measure_from, end)` on `window`; scrapes from `start + every/2` every `every` until `end`
/// (see [`planned_starts_ns`]) and returns every scrape made, with starts relative to
/// `measure_from`.
pub(crate) fn run(
    config: ScrapeConfig,
    marks: &impl Marks,
    primed: impl FnOnce(),
    window: impl FnOnce() -> Option<(u64, u64, u64)>,
) -> Vec<Scrape> {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            primed();
            return vec![failed(0.0, format!("cannot start the scraper: {e}"))];
        }
    };
    let mut sender = None;
    if let Ok(target) = crate::target::parse_target(&config.url) {
        // A failure here is the first recorded scrape's to report.
        let _ = rt.block_on(scrape_once(&mut sender, &target, None, config.gzip));
    }
    primed();
    let Some((start, measure_from, end)) = window() else {
        return Vec::new(); // the run did not start
    };
    rt.block_on(scrape_loop(config, marks, sender, start, measure_from, end))
}

/// A scrape that failed with `error`, begun `start_s` into the window.
pub(crate) fn failed(start_s: f64, error: String) -> Scrape {
    Scrape {
        start_s,
        duration_ms: 0.0,
        bytes: 0,
        status: 0,
        error: Some(error),
    }
}

async fn scrape_loop(
    config: ScrapeConfig,
    clock: &impl Marks,
    mut sender: Option<SendRequest<Empty<Bytes>>>,
    start: u64,
    measure_from: u64,
    end: u64,
) -> Vec<Scrape> {
    let mut out = Vec::new();
    let target = match crate::target::parse_target(&config.url) {
        Ok(t) => t,
        Err(e) => return vec![failed(0.0, e.to_string())],
    };
    let every = config.every.as_nanos().max(1) as u64;
    let timer =
        match rustix::time::timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::NONBLOCK)
            .map_err(std::io::Error::from)
            .and_then(crate::timer::register_timer)
        {
            Ok(t) => t,
            Err(e) => return vec![failed(0.0, e.to_string())],
        };
    let mut at = start + first_scrape_ns(every);
    let mut buf = [0u8; 8];
    while at < end {
        let spec = Itimerspec {
            it_interval: from_ns(0),
            it_value: from_ns(at),
        };
        if rustix::time::timerfd_settime(timer.get_ref(), TimerfdTimerFlags::ABSTIME, &spec)
            .is_err()
        {
            break;
        }
        while now_ns() < at {
            match timer.readable().await {
                Ok(mut guard) => {
                    let _ = rustix::io::read(timer.get_ref(), &mut buf);
                    guard.clear_ready();
                }
                Err(_) => break,
            }
        }
        let began = now_ns();
        clock.begin(began);
        let result = tokio::time::timeout(
            config.every,
            scrape_once(&mut sender, &target, None, config.gzip),
        )
        .await;
        let ended = now_ns();
        clock.end(ended);
        let start_s = (began as f64 - measure_from as f64) / 1e9;
        let duration_ms = (ended - began) as f64 / 1e6;
        out.push(match result {
            Ok(Ok((status, bytes))) => Scrape {
                start_s,
                duration_ms,
                bytes,
                status,
                error: None,
            },
            Ok(Err(e)) => {
                sender = None;
                Scrape {
                    duration_ms,
                    ..failed(start_s, e)
                }
            }
            Err(_) => {
                sender = None;
                Scrape {
                    duration_ms,
                    ..failed(start_s, "timeout".to_string())
                }
            }
        });
        at += every;
    }
    out
}

/// Fetches the metrics once: as Prometheus does (OpenMetrics first, compressed when `gzip`),
/// or with `keep` as plain uncompressed text whose body is returned.
async fn scrape_once(
    sender: &mut Option<SendRequest<Empty<Bytes>>>,
    target: &crate::target::Target,
    mut keep: Option<&mut Vec<u8>>,
    gzip: bool,
) -> Result<(u16, u64), String> {
    let mut s = match sender.take() {
        Some(s) if !s.is_closed() => s,
        _ => {
            let stream = TcpStream::connect(target.addr)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let _ = stream.set_nodelay(true);
            let (s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| format!("handshake: {e}"))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            s
        }
    };
    let mut req = Request::new(Empty::new());
    *req.uri_mut() = target.path.clone();
    let h = req.headers_mut();
    h.insert(
        http::header::HOST,
        HeaderValue::from_str(&target.authority).map_err(|e| e.to_string())?,
    );
    if keep.is_some() {
        // The watcher reads the text: the classic format, uncompressed.
        h.insert(
            http::header::ACCEPT,
            HeaderValue::from_static("text/plain;version=0.0.4"),
        );
    } else {
        // What Prometheus itself sends, so the exporter does the work a real scrape costs.
        h.insert(
            http::header::ACCEPT,
            HeaderValue::from_static(
                "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1",
            ),
        );
        if gzip {
            h.insert(
                http::header::ACCEPT_ENCODING,
                HeaderValue::from_static("gzip"),
            );
        }
    }
    h.insert(
        "x-prometheus-scrape-timeout-seconds",
        HeaderValue::from_static("10"),
    );
    s.ready().await.map_err(|e| e.to_string())?;
    let resp = s.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    let mut bytes = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.map_err(|e| e.to_string())?.into_data() {
            bytes += data.len() as u64;
            if let Some(body) = keep.as_deref_mut() {
                body.extend_from_slice(&data);
            }
        }
    }
    *sender = Some(s);
    Ok((status, bytes))
}

/// Reads `config.metrics` from `start + every/2` every `every` until `end`; readings are
/// timed from `measure_from`. A failed or refused fetch is a missing reading, never an
/// error: the timeline's gauge columns are then empty for that second.
pub(crate) fn watch(
    config: WatchConfig,
    start: u64,
    measure_from: u64,
    end: u64,
) -> Vec<GaugeReading> {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return Vec::new();
    };
    rt.block_on(async {
        let Ok(target) = crate::target::parse_target(&config.url) else {
            return Vec::new();
        };
        let every = config.every.as_nanos().max(1) as u64;
        let mut out = Vec::new();
        let mut sender = None;
        let mut at = start + every / 2;
        while at < end {
            let now = now_ns();
            if at > now {
                // Millisecond resolution is plenty for a once-a-second reading.
                tokio::time::sleep(Duration::from_nanos(at - now)).await;
            }
            let began = now_ns();
            let mut body = Vec::new();
            let fetched = tokio::time::timeout(
                config.every,
                scrape_once(&mut sender, &target, Some(&mut body), false),
            )
            .await;
            match fetched {
                Ok(Ok((200, _))) => out.push(GaugeReading {
                    at_s: (began as f64 - measure_from as f64) / 1e9,
                    values: read_samples(&String::from_utf8_lossy(&body), &config.metrics),
                }),
                _ => sender = None,
            }
            at += every;
        }
        out
    })
}

/// The samples of the named metrics in a Prometheus text exposition, as timeline columns:
/// the name without its `tailguard_` prefix, then the label values in brackets joined by `/`
/// (`tailguard_upstream_limit{upstream="a"} 12` is `("upstream_limit[a]", 12.0)`). Lines it
/// cannot read are skipped.
pub fn read_samples(text: &str, metrics: &[String]) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        if !metrics.iter().any(|m| m == name) {
            continue;
        }
        let (labels, rest) = if line[name_end..].starts_with('{') {
            match parse_labels(&line[name_end + 1..]) {
                Some(parsed) => parsed,
                None => continue,
            }
        } else {
            (Vec::new(), &line[name_end..])
        };
        let Some(value) = rest.split_whitespace().next().and_then(parse_value) else {
            continue;
        };
        let short = name.strip_prefix("tailguard_").unwrap_or(name);
        let column = if labels.is_empty() {
            short.to_string()
        } else {
            format!("{short}[{}]", labels.join("/"))
        };
        out.push((column, value));
    }
    out
}

/// Label values of `a="x",b="y"}` (after the `{`) and what follows the `}`.
fn parse_labels(mut s: &str) -> Option<(Vec<String>, &str)> {
    let mut values = Vec::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(rest) = s.strip_prefix('}') {
            return Some((values, rest));
        }
        let eq = s.find('=')?;
        s = s[eq + 1..].strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        values.push(value);
        s = &s[end + 1..];
    }
}

fn parse_value(v: &str) -> Option<f64> {
    match v {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => v.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn planned_starts_are_half_an_interval_into_the_run_then_one_every_interval() {
        let s = |ms| Duration::from_millis(ms);
        // 5 s interval, 5 s warmup, 20 s window: at 2.5 s of the run (-2.5 s in the window),
        // then 2.5, 7.5, 12.5 and 17.5 s.
        assert_eq!(
            super::planned_starts_ns(s(5_000), s(5_000), s(20_000)),
            [-2_500, 2_500, 7_500, 12_500, 17_500].map(|ms: i64| ms * 1_000_000)
        );
        // No warmup, a window shorter than half an interval: none.
        assert!(super::planned_starts_ns(s(5_000), s(0), s(2_000)).is_empty());
    }
}

//! The checker thread: one per gateway (so one per process), an OS thread with its own
//! current-thread runtime, never a serving thread. It runs the active checks of every
//! health-checked upstream, ejects endpoints whose failures crossed their upstream's
//! threshold, and ends ejections when they are due.
//!
//! Each round reads the current upstreams through the [`Current`] it is handed (the
//! gateway's current snapshot), so endpoints added or removed by a reload (or a
//! re-resolution that swaps a snapshot) are followed without telling the thread anything.
//! The layer above holds itself only weakly in it: the thread stops when it answers `None`
//! (the gateway was dropped), or when its [`Checker`] handle is dropped.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tailguard_http1::stream::Stream;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::{Notify, oneshot};

use super::{ActiveCheck, Ejection};
use crate::h2::H2Body;
use crate::upstream::{Endpoint, Upstream};

/// How long the thread sleeps when nothing is due: it also wakes on every reload and on
/// every ejection threshold crossed, so this only bounds how late a missed wake is noticed.
const IDLE_WAKE: Duration = Duration::from_secs(1);

/// The most bytes of a check's answer read while looking for its status line.
const STATUS_LINE_MAX: usize = 4 * 1024;

/// The upstreams the checker thread works on, held for as long as a round runs: the
/// gateway's snapshot implements it (`B`: the request body of the upstreams' HTTP/2 pools).
pub trait Upstreams<B>: Send + Sync {
    /// The upstreams, in the order their indexes refer to.
    fn upstreams(&self) -> &[Upstream<B>];
}

/// How the checker thread gets the current upstreams at each turn of its loop; `None` once
/// the layer above is gone, which stops the thread. It should hold that layer weakly, so the
/// thread never keeps it alive.
pub type Current<B> = Box<dyn Fn() -> Option<Arc<dyn Upstreams<B>>> + Send>;

/// The gateway's side of the checker thread: wakes it, and stops it when dropped.
#[derive(Debug)]
pub struct Checker {
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for Checker {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The gateway's health machinery: the wake every endpoint state shares, and the checker
/// thread, started when a snapshot first has a `[upstreams.health]` table.
#[derive(Debug, Default)]
pub struct Hub {
    wake: Arc<Notify>,
    checker: std::sync::OnceLock<Option<Checker>>,
}

impl Hub {
    /// What endpoint states wake the checker thread with.
    pub fn wake(&self) -> &Arc<Notify> {
        &self.wake
    }

    /// Starts the checker thread if `upstreams` (a new snapshot's) check or eject anything
    /// and the thread is not running yet, reading the upstreams from `current` from then on;
    /// else wakes it, so a new snapshot's checks start now.
    pub fn follow<B: H2Body>(&self, upstreams: &[Upstream<B>], current: Current<B>) {
        if upstreams.iter().any(|u| u.health.is_some()) {
            self.checker
                .get_or_init(|| spawn(current, Arc::clone(&self.wake)));
        }
        self.wake.notify_one();
    }
}

fn spawn<B: H2Body>(current: Current<B>, wake: Arc<Notify>) -> Option<Checker> {
    let (stop, stopped) = oneshot::channel();
    let started = std::thread::Builder::new()
        .name("tailguard-health".to_owned())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!("health: cannot build the checker runtime: {e}");
                    return;
                }
            };
            runtime.block_on(run(current, wake, stopped));
        });
    match started {
        Ok(_) => Some(Checker { stop: Some(stop) }),
        Err(e) => {
            // Without the thread nothing is checked or ejected: requests still flow to every
            // endpoint, as without a `[upstreams.health]` table.
            tracing::error!("health: cannot start the checker thread: {e}");
            None
        }
    }
}

/// The thread's loop: start the rounds that are due, eject and un-eject, sleep until the
/// next thing is due or a wake comes.
async fn run<B: H2Body>(
    current: Current<B>,
    wake: Arc<Notify>,
    mut stopped: oneshot::Receiver<()>,
) {
    // Each upstream's rounds by name (kept across snapshots; a changed interval starts a
    // round now).
    let mut due: HashMap<Arc<str>, Rounds> = HashMap::new();
    loop {
        let Some(snapshot) = current() else {
            return;
        };
        let now = Instant::now();
        let mut next = now + IDLE_WAKE;
        for (index, upstream) in snapshot.upstreams().iter().enumerate() {
            let Some(settings) = &upstream.health else {
                continue;
            };
            // Ejections end on time even when a reload turned ejection off since.
            let ejection = settings.ejection.as_ref();
            if let Some(at) = eject_and_expire(upstream, ejection, now) {
                next = next.min(at);
            }
            match &settings.active {
                Some(check) => {
                    let rounds = due
                        .entry(Arc::clone(&upstream.name))
                        .or_insert_with(|| Rounds::new(now, check.interval));
                    if rounds.interval != check.interval {
                        (rounds.at, rounds.interval) = (now, check.interval);
                    }
                    // Rounds never overlap: one still waiting on a slow endpoint (at most
                    // `timeout`) delays the next, and wakes this loop when it ends.
                    let running = rounds.running.load(Ordering::Acquire);
                    if rounds.at <= now && !running {
                        rounds.at = now + rounds.interval;
                        rounds.running.store(true, Ordering::Release);
                        tokio::spawn(round(
                            Arc::clone(&snapshot),
                            index,
                            check.clone(),
                            Arc::clone(&rounds.running),
                            Arc::clone(&wake),
                        ));
                    }
                    if !running {
                        next = next.min(rounds.at);
                    }
                }
                // A reload removed `path`: nothing would ever bring a down endpoint back.
                None => {
                    for e in &upstream.endpoints {
                        e.health.unchecked();
                    }
                }
            }
        }
        due.retain(|name, _| {
            snapshot
                .upstreams()
                .iter()
                .any(|u| &u.name == name && u.health.as_ref().is_some_and(|h| h.active.is_some()))
        });
        drop(snapshot);
        tokio::select! {
            _ = tokio::time::sleep_until(next.into()) => {}
            _ = wake.notified() => {}
            _ = &mut stopped => return,
        }
    }
}

/// Ends the ejections of `upstream` that are due and (with `ejection` on) ejects the
/// endpoints whose failures reached the threshold, as far as `max_ejected_percent` allows;
/// returns when the next ejection ends.
fn eject_and_expire<B>(
    upstream: &Upstream<B>,
    ejection: Option<&Ejection>,
    now: Instant,
) -> Option<Instant> {
    let mut next: Option<Instant> = None;
    let mut soonest = |at: Instant| next = Some(next.map_or(at, |n| n.min(at)));
    for e in &upstream.endpoints {
        if let Some(at) = e.health.expire(now) {
            soonest(at);
        }
    }
    let Some(ejection) = ejection else {
        return next;
    };
    let total = upstream.endpoints.len() as u64;
    for e in &upstream.endpoints {
        if e.health.failures() < ejection.consecutive_failures {
            continue;
        }
        // Out of service after this ejection: the ones out now, plus this one if it is up.
        let out = upstream
            .endpoints
            .iter()
            .filter(|other| !other.health.is_up())
            .count() as u64
            + u64::from(e.health.is_up());
        let allowed = out * 100 <= total * u64::from(ejection.max_ejected_percent);
        if let Some(at) = e.health.eject(ejection, now, allowed) {
            soonest(at);
        }
    }
    next
}

/// When an upstream's next round is due, at what interval, and whether one is running.
struct Rounds {
    at: Instant,
    interval: Duration,
    running: Arc<AtomicBool>,
}

impl Rounds {
    fn new(now: Instant, interval: Duration) -> Self {
        Rounds {
            at: now,
            interval,
            running: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// Checks every endpoint of upstream `index` at once and applies the results; then clears
/// `running` and wakes the loop, which starts the next round if it is already due.
async fn round<B: H2Body>(
    snapshot: Arc<dyn Upstreams<B>>,
    index: usize,
    check: ActiveCheck,
    running: Arc<AtomicBool>,
    wake: Arc<Notify>,
) {
    let upstream = &snapshot.upstreams()[index];
    let probes = upstream.endpoints.iter().map(|e| {
        let check = &check;
        async move {
            let result = probe(e, check).await;
            e.health.probed(check, result, Instant::now());
        }
    });
    futures_util::future::join_all(probes).await;
    running.store(false, Ordering::Release);
    wake.notify_one();
}

/// Opens the connection a check of `endpoint` goes over: the transport the upstream's own
/// requests use (TCP, or TLS with the upstream's `[upstreams.tls]`: a certificate that no
/// longer verifies fails the check), from the endpoint's pool but not counted in its
/// metrics and never pooled.
pub(crate) async fn connect<B>(endpoint: &Endpoint<B>) -> Result<Stream, String> {
    endpoint.pool.open().await.map_err(|e| e.to_string())
}

/// One check: `GET path` over HTTP/1.1 with the endpoint's `Host` (over HTTP/2 for an
/// `h2c`/`h2` upstream), bounded by the check's timeout (connect included); the status of
/// the answer, or why there is none.
pub(crate) async fn probe<B: H2Body>(
    endpoint: &Endpoint<B>,
    check: &ActiveCheck,
) -> Result<u16, String> {
    // An HTTP/2 upstream's endpoints may speak nothing else (a gRPC server): checked in
    // HTTP/2, on a connection opened as its requests' are.
    if let Some(h2) = &endpoint.h2 {
        let authority = endpoint.host.to_str().unwrap_or("");
        return match tokio::time::timeout(check.timeout, h2.probe(&check.path, authority)).await {
            Ok(result) => result,
            Err(_) => Err(format!("timed out after {} ms", check.timeout.as_millis())),
        };
    }
    let exchange = async {
        let mut stream = connect(endpoint).await?;
        let host = endpoint.host.to_str().unwrap_or("");
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: tailguard-health-check\r\n\
             Connection: close\r\n\r\n",
            check.path
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        read_status(&mut stream).await
    };
    match tokio::time::timeout(check.timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(format!("timed out after {} ms", check.timeout.as_millis())),
    }
}

/// Reads up to the end of the status line and returns its code (interim 1xx answers are
/// not expected: the check sends no `Expect`).
async fn read_status(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> Result<u16, String> {
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 512];
    loop {
        if let Some(end) = buf.windows(2).position(|w| w == b"\r\n") {
            return parse_status_line(&buf[..end]);
        }
        if buf.len() >= STATUS_LINE_MAX {
            return Err("no status line in the first 4 KiB".to_owned());
        }
        match stream.read(&mut chunk).await {
            Ok(0) => return Err("connection closed before a status line".to_owned()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(format!("read: {e}")),
        }
    }
}

/// `HTTP/1.x NNN reason` → `NNN`.
fn parse_status_line(line: &[u8]) -> Result<u16, String> {
    let bad = || {
        format!(
            "not an HTTP/1.x status line: {:?}",
            String::from_utf8_lossy(&line[..line.len().min(64)])
        )
    };
    let rest = line.strip_prefix(b"HTTP/1.").ok_or_else(bad)?;
    let code = rest.get(2..5).ok_or_else(bad)?;
    if rest.get(1) != Some(&b' ')
        || !code.iter().all(u8::is_ascii_digit)
        || rest.get(5).is_some_and(|&b| b != b' ')
    {
        return Err(bad());
    }
    std::str::from_utf8(code)
        .ok()
        .and_then(|c| c.parse().ok())
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(parse_status_line(b"HTTP/1.1 200 OK"), Ok(200));
        assert_eq!(parse_status_line(b"HTTP/1.0 503"), Ok(503));
        assert_eq!(parse_status_line(b"HTTP/1.1 204 "), Ok(204));
        for bad in [
            &b"HTTP/2 200"[..],
            b"HTTP/1.1 20 OK",
            b"HTTP/1.1 2000 OK",
            b"HTTP/1.1  200",
            b"SSH-2.0-OpenSSH",
            b"",
        ] {
            assert!(parse_status_line(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn reads_a_status_line_split_over_reads() {
        let (mut a, mut b) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            for part in [
                &b"HTT"[..],
                b"P/1.1 4",
                b"18 I'm a teapot\r",
                b"\nx: y\r\n\r\n",
            ] {
                b.write_all(part).await.unwrap();
                tokio::task::yield_now().await;
            }
        });
        assert_eq!(read_status(&mut a).await, Ok(418));
        writer.await.unwrap();
    }
}

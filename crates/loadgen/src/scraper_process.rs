//! Where a load run's scraper runs: a process of its own when the host binary can be one (as a
//! Prometheus is one), else a thread of the generator's process.
//!
//! Why a process: with the scraper as a thread of the generator's process, reading a 250 KB
//! exposition every 5 s at 70,000 req/s, the run's slowest requests fell 0.4-1.8 s after the
//! first scrape of the measured window in 30 of 34 runs: one stall of 5-10 ms, answered late
//! although sent on time, whichever process was scraped. With the same scrapes made by
//! another process (curl), 0 of 7; with no scrapes, 0 of 3; with the thread fetching 13
//! bytes, 0 of 3; with this process scraper, 1 of 6. The cause inside the process is not found
//! (not the scraper's `SCHED_IDLE`, its first connection, `ksoftirqd`, mimalloc's purge or
//! transparent huge pages: each was ruled out by runs;
//! `docs/benchmarks/2026-11-27-axum-scrape/first-scrape/`).
//!
//! The child is the same executable, started with [`CHILD_ENV`] set; the host binary opts in
//! by calling [`run_if_child`] first thing in `main`. A process that did not (this crate's
//! tests) scrapes from a thread. One line per message:
//! - parent to child (stdin): the config as JSON; later the window, `start measure_from end`
//!   (monotonic ns, one clock for every process);
//! - child to parent (stdout): `primed` after the priming scrape; `b <ns>` and `e <ns>` as
//!   each scrape begins and ends (the parent's reader thread sets the generator's
//!   [`ScrapeClock`] from them); last, `done <the scrapes as JSON>`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};

use crate::report::Scrape;
use crate::scrape::{Marks, ScrapeClock, ScrapeConfig};

/// Set in the environment of the child process that scrapes for a run.
pub const CHILD_ENV: &str = "TAILGUARD_LOAD_SCRAPER";

/// Whether this executable runs [`run_if_child`] at start, so it can be started as a
/// scraper.
static HOST_CAN_BE_CHILD: AtomicBool = AtomicBool::new(false);

/// For a binary's `main`, first thing: when this process was started as a run's scraper, it
/// scrapes and exits here; otherwise this notes that the binary can be started as one, and
/// load runs scrape from a separate process.
pub fn run_if_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        HOST_CAN_BE_CHILD.store(true, Ordering::Relaxed);
        return;
    }
    let code = match child_main() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("load scraper: {e}");
            1
        }
    };
    std::process::exit(code);
}

/// What the parent tells the child first.
#[derive(Debug, Serialize, Deserialize)]
struct ChildConfig {
    url: String,
    every_ns: u64,
    gzip: bool,
    pin: Vec<usize>,
}

fn child_main() -> Result<(), String> {
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let first = lines
        .next()
        .ok_or("no config on stdin")?
        .map_err(|e| e.to_string())?;
    let config: ChildConfig = serde_json::from_str(&first).map_err(|e| e.to_string())?;
    settle(&config.pin);
    let scrape_config = ScrapeConfig {
        url: config.url,
        every: std::time::Duration::from_nanos(config.every_ns),
        gzip: config.gzip,
    };
    let scrapes = crate::scrape::run(
        scrape_config,
        &ToParent,
        || say("primed"),
        || {
            let line = lines.next()?.ok()?;
            let mut n = line.split(' ').map(str::parse::<u64>);
            match (n.next(), n.next(), n.next()) {
                (Some(Ok(a)), Some(Ok(b)), Some(Ok(c))) => Some((a, b, c)),
                _ => None,
            }
        },
    );
    let json = serde_json::to_string(&scrapes).map_err(|e| e.to_string())?;
    say(&format!("done {json}"));
    Ok(())
}

/// The scraper's place: on the generator's cores, and only when they are idle. Left
/// unpinned, it may land on the target's core and its reading would be counted as the
/// target's cost; a Prometheus runs on another machine, so its reading must not delay a send.
fn settle(pin: &[usize]) {
    if !pin.is_empty()
        && let Err(e) = crate::pinning::pin_current_thread(pin)
    {
        eprintln!("load: cannot pin the scraper to cpu {pin:?}: {e}; running unpinned");
    }
    if !crate::pinning::idle_current_thread() {
        eprintln!(
            "load: the scraper could not run at SCHED_IDLE; it shares the generator's cores at its nice"
        );
    }
}

/// One line to the parent, at once.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    // The parent gone: the child's reads end too, and it exits.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// A child's marks go to its parent.
struct ToParent;

impl Marks for ToParent {
    fn begin(&self, at: u64) {
        say(&format!("b {at}"));
    }
    fn end(&self, at: u64) {
        say(&format!("e {at}"));
    }
}

/// A run's scraper, primed, waiting for the run's window.
#[derive(Debug)]
pub(crate) enum Scraper {
    /// A thread of this process.
    Thread {
        handle: JoinHandle<Vec<Scrape>>,
        window: mpsc::Sender<(u64, u64, u64)>,
    },
    /// A child process; `reader` turns its lines into marks and its report.
    Process {
        child: Child,
        stdin: ChildStdin,
        reader: JoinHandle<Vec<Scrape>>,
    },
}

impl Scraper {
    /// Starts the scraper and returns once its priming scrape is made (or it failed).
    pub(crate) fn start(config: ScrapeConfig, pin: Vec<usize>, clock: Arc<ScrapeClock>) -> Scraper {
        if HOST_CAN_BE_CHILD.load(Ordering::Relaxed) {
            match Scraper::start_process(&config, &pin, clock.clone()) {
                Ok(scraper) => return scraper,
                Err(e) => eprintln!(
                    "load: cannot start the scraper process ({e}); scraping from a thread"
                ),
            }
        }
        let (primed_tx, primed_rx) = mpsc::channel::<()>();
        let (window_tx, window_rx) = mpsc::channel::<(u64, u64, u64)>();
        let spawned = std::thread::Builder::new()
            .name("load-scraper".into())
            .spawn(move || {
                settle(&pin);
                crate::scrape::run(
                    config,
                    clock.as_ref(),
                    || {
                        let _ = primed_tx.send(());
                    },
                    || window_rx.recv().ok(),
                )
            });
        // What `std::thread::spawn` does, with a name the tests can find the thread by.
        let handle = spawned.expect("the OS lets this process start one more thread");
        // Fails only when the thread ended early; its report says why.
        let _ = primed_rx.recv();
        Scraper::Thread {
            handle,
            window: window_tx,
        }
    }

    fn start_process(
        config: &ScrapeConfig,
        pin: &[usize],
        clock: Arc<ScrapeClock>,
    ) -> std::io::Result<Scraper> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .env(CHILD_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other("the child's pipes are missing"));
        };
        let child_config = ChildConfig {
            url: config.url.clone(),
            every_ns: u64::try_from(config.every.as_nanos()).unwrap_or(u64::MAX),
            gzip: config.gzip,
            pin: pin.to_vec(),
        };
        let line = serde_json::to_string(&child_config).map_err(std::io::Error::other)?;
        writeln!(stdin, "{line}")?;
        stdin.flush()?;
        let (primed_tx, primed_rx) = mpsc::channel::<()>();
        let reader = std::thread::Builder::new()
            .name("load-scraper-pipe".into())
            .spawn(move || read_child(BufReader::new(stdout), &clock, &primed_tx))?;
        // Fails only when the child ended early; the reader reports why.
        let _ = primed_rx.recv();
        Ok(Scraper::Process {
            child,
            stdin,
            reader,
        })
    }

    /// The run's window is set: scrapes from `start + every/2` until `end`.
    pub(crate) fn begin(&mut self, start: u64, measure_from: u64, end: u64) {
        match self {
            // A send fails only when the scraper ended early; its report says why.
            Scraper::Thread { window, .. } => {
                let _ = window.send((start, measure_from, end));
            }
            Scraper::Process { stdin, .. } => {
                let _ = writeln!(stdin, "{start} {measure_from} {end}");
                let _ = stdin.flush();
            }
        }
    }

    /// Every scrape made, once the scraper is done.
    pub(crate) fn join(self) -> Vec<Scrape> {
        match self {
            Scraper::Thread { handle, .. } => handle.join().unwrap_or_default(),
            Scraper::Process {
                mut child,
                stdin,
                reader,
            } => {
                drop(stdin);
                let scrapes = reader.join().unwrap_or_default();
                let _ = child.wait();
                scrapes
            }
        }
    }
}

/// The parent's side of the pipe: marks into `clock`, `primed` passed on, the report parsed.
fn read_child(stdout: impl BufRead, clock: &ScrapeClock, primed: &mpsc::Sender<()>) -> Vec<Scrape> {
    for line in stdout.lines() {
        let Ok(line) = line else { break };
        let (word, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        match (word, rest.parse::<u64>()) {
            ("b", Ok(at)) => clock.begin(at),
            ("e", Ok(at)) => clock.end(at),
            ("primed", _) => {
                let _ = primed.send(());
            }
            ("done", _) => {
                return serde_json::from_str(rest).unwrap_or_else(|e| {
                    vec![failure(format!("the scraper's report does not parse: {e}"))]
                });
            }
            _ => {}
        }
    }
    vec![failure(
        "the scraper process ended before its report".into(),
    )]
}

/// A failure of the scraper process, as its report's one scrape.
fn failure(error: String) -> Scrape {
    crate::scrape::failed(0.0, error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_childs_lines_set_the_clock_and_make_the_report() {
        let clock = ScrapeClock::default();
        let (tx, rx) = mpsc::channel();
        let scrape = failure("x".into());
        let json = serde_json::to_string(&vec![scrape.clone()]).expect("serializes");
        let lines = format!("primed\nb 100\nnoise\ne 250\ndone {json}\n");
        let scrapes = read_child(lines.as_bytes(), &clock, &tx);
        assert_eq!(scrapes, vec![scrape]);
        assert!(rx.try_recv().is_ok(), "primed was passed on");
        assert!(clock.overlaps(200), "a request intended at 200 overlapped");
        assert!(!clock.overlaps(300), "one at 300 did not");
    }

    #[test]
    fn a_child_that_ends_early_is_a_failed_scrape() {
        let (tx, _rx) = mpsc::channel();
        let scrapes = read_child("b 1\n".as_bytes(), &ScrapeClock::default(), &tx);
        assert_eq!(scrapes.len(), 1);
        assert!(
            scrapes[0]
                .error
                .as_deref()
                .is_some_and(|e| e.contains("ended before"))
        );
    }
}

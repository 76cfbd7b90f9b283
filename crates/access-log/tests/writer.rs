//! The buffered log against real files, a FIFO nobody reads, and /dev/full.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use tailguard_access_log::{AccessLog, Config, OnFull, Output};

use crate::support::{combined_targets, dropped_notes, numbered};

fn config(path: &Path, buffer_size: usize, buffers: usize) -> Config {
    Config {
        path: Output::File(path.to_owned()),
        buffer_size,
        buffers,
        ..Config::default()
    }
}

/// Tight loops append faster than any disk; tests that count every line make the
/// appenders wait for the writer rather than drop (the drop path has its own tests).
fn lossless(path: &Path, buffer_size: usize, buffers: usize) -> Config {
    Config {
        on_full: OnFull::Block,
        ..config(path, buffer_size, buffers)
    }
}

/// Logs `n` numbered records from `threads` threads; targets are `/t<thread>/<i>`.
fn log_from_threads(log: &AccessLog, threads: usize, n: usize) {
    thread::scope(|s| {
        for t in 0..threads {
            let log = log.clone();
            s.spawn(move || {
                for i in 0..n {
                    let target = format!("/t{t}/{i}");
                    log.log(&numbered(target.as_bytes()));
                }
            });
        }
    });
}

fn assert_each_once(targets: &[String], threads: usize, n: usize) {
    assert_eq!(targets.len(), threads * n);
    let unique: HashSet<&String> = targets.iter().collect();
    assert_eq!(unique.len(), threads * n, "a line was written twice");
    for t in 0..threads {
        for i in [0, n / 2, n - 1] {
            assert!(unique.contains(&format!("/t{t}/{i}")), "missing /t{t}/{i}");
        }
    }
}

/// Waits (bounded) until `cond` holds; the bound only guards against a hang.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn clean_stop_after_n_records_leaves_exactly_n_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    // 4 KiB buffers: many hand-offs, and every thread ends with a partial buffer.
    let (log, writer) = AccessLog::start(&lossless(&path, 4096, 16)).unwrap();
    log_from_threads(&log, 4, 5_000);
    let stats = writer.shutdown();
    let text = fs::read_to_string(&path).unwrap();
    assert_each_once(&combined_targets(&text), 4, 5_000);
    assert_eq!(stats.lines_written, 20_000);
    assert_eq!(stats.dropped_lines, 0);
    assert_eq!(stats.write_errors, 0);
    assert_eq!(stats.bytes_written, text.len() as u64);
    let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode & !0o640,
        0,
        "created with 0640 (minus umask), got {mode:o}"
    );
}

#[test]
fn idle_collection_racing_appenders_loses_and_repeats_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    // A 1 ms flush interval: the writer swaps buffers out from under busy appenders
    // hundreds of times during the run.
    let cfg = Config {
        flush_ms: 1,
        ..lossless(&path, 65536, 16)
    };
    let (log, writer) = AccessLog::start(&cfg).unwrap();
    log_from_threads(&log, 4, 5_000);
    let stats = writer.shutdown();
    assert_each_once(
        &combined_targets(&fs::read_to_string(&path).unwrap()),
        4,
        5_000,
    );
    assert_eq!(stats.lines_written, 20_000);
    assert!(stats.flushes > 4, "idle collection ran: {stats:?}");
}

#[test]
fn clean_stop_from_a_tokio_multi_thread_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let (log, writer) = AccessLog::start(&lossless(&path, 8192, 16)).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(3)
        .build()
        .unwrap();
    rt.block_on(async {
        let tasks: Vec<_> = (0..50)
            .map(|t| {
                let log = log.clone();
                tokio::spawn(async move {
                    for i in 0..200 {
                        let target = format!("/t{t}/{i}");
                        log.log(&numbered(target.as_bytes()));
                        // Move between worker threads.
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
    // The runtime's threads still hold their buffers; shutdown must take them.
    let stats = writer.shutdown();
    drop(rt);
    let text = fs::read_to_string(&path).unwrap();
    assert_each_once(&combined_targets(&text), 50, 200);
    assert_eq!(stats.lines_written, 10_000);
}

#[test]
fn records_after_shutdown_are_counted_not_lost_silently() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let (log, writer) = AccessLog::start(&config(&path, 4096, 4)).unwrap();
    log.log(&numbered(b"/before"));
    let reopener = writer.reopener();
    let stats = writer.shutdown();
    log.log(&numbered(b"/after"));
    reopener.reopen();
    assert_eq!(stats.lines_written, 1);
    assert_eq!(
        combined_targets(&fs::read_to_string(&path).unwrap()),
        ["/before"]
    );
}

#[test]
fn idle_buffer_reaches_the_file_within_the_flush_interval() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let cfg = Config {
        flush_ms: 20,
        ..config(&path, 65536, 4)
    };
    let (log, writer) = AccessLog::start(&cfg).unwrap();
    log.log(&numbered(b"/quiet"));
    // Nobody fills the buffer and nobody calls flush: only the interval can write it.
    eventually("the idle flush", || {
        fs::read_to_string(&path).unwrap().contains("/quiet")
    });
    assert_eq!(writer.stats().lines_written, 1);
    log.log(&numbered(b"/second"));
    writer.flush();
    assert_eq!(
        combined_targets(&fs::read_to_string(&path).unwrap()),
        ["/quiet", "/second"]
    );
}

#[test]
fn reopen_under_constant_load_loses_and_splits_no_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let (log, writer) = AccessLog::start(&lossless(&path, 4096, 16)).unwrap();
    let reopener = writer.reopener();
    let (threads, n) = (2, 40_000);
    let rotated = thread::scope(|s| {
        let appenders: Vec<_> = (0..threads)
            .map(|t| {
                let log = log.clone();
                s.spawn(move || {
                    for i in 0..n {
                        let target = format!("/t{t}/{i}");
                        log.log(&numbered(target.as_bytes()));
                    }
                })
            })
            .collect();
        // logrotate: rename, then SIGUSR1 (here the handle the signal handler calls).
        let mut rotated = Vec::new();
        for k in 0..5 {
            if appenders.iter().all(|a| a.is_finished()) {
                break;
            }
            let old = dir.path().join(format!("access.log.{k}"));
            fs::rename(&path, &old).unwrap();
            let before = writer.stats().reopens;
            reopener.reopen();
            eventually("the reopen", || writer.stats().reopens > before);
            assert!(path.exists(), "reopen creates the file again");
            rotated.push(old);
            thread::sleep(Duration::from_millis(10));
        }
        rotated
    });
    let stats = writer.shutdown();
    assert!(!rotated.is_empty());
    let mut targets = Vec::new();
    for file in rotated.iter().chain([&path]) {
        // Each file ends on a line boundary and holds only whole lines.
        targets.extend(combined_targets(&fs::read_to_string(file).unwrap()));
    }
    assert_each_once(&targets, threads, n);
    assert_eq!(
        stats.dropped_lines, 0,
        "block-free run on a healthy disk dropped lines"
    );
    assert_eq!(stats.lost_lines, 0);
}

#[test]
fn dev_full_keeps_accepting_and_counts_errors() {
    let (log, writer) = AccessLog::start(&Config {
        flush_ms: 10,
        ..config(Path::new("/dev/full"), 4096, 4)
    })
    .unwrap();
    let n = 10_000;
    log_from_threads(&log, 1, n);
    eventually("a counted write error", || writer.stats().write_errors > 0);
    let stats = writer.shutdown();
    assert!(stats.write_errors > 0);
    assert_eq!(stats.lines_written, 0);
    // Every record is accounted for: dropped at append, or lost at shutdown.
    assert_eq!(
        stats.dropped_lines + stats.lost_lines,
        n as u64,
        "{stats:?}"
    );
    assert!(stats.dropped_lines > 0);
}

fn fifo(dir: &Path) -> (std::path::PathBuf, File) {
    let path = dir.join("stalled.fifo");
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        &path,
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .unwrap();
    // Non-blocking, so opening the read end does not wait for a writer; it is never read
    // until the test decides so.
    let reader = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)
        .unwrap();
    (path, reader)
}

/// Reads the FIFO to its end (the writer closes it when the log shuts down).
fn drain(mut reader: File) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65536];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("{e}"),
            }
        }
        String::from_utf8(out).unwrap()
    })
}

#[test]
fn stalled_sink_with_drop_keeps_appending_and_counts_drops() {
    let dir = tempfile::tempdir().unwrap();
    let (path, reader) = fifo(dir.path());
    let (log, writer) = AccessLog::start(&config(&path, 4096, 4)).unwrap();
    // ~170 B a line: 20k lines = 3.4 MB against a 64 KiB pipe that nobody reads.
    let n = 20_000;
    let mut slowest = Duration::ZERO;
    for i in 0..n {
        let target = format!("/t0/{i}");
        let start = Instant::now();
        log.log(&numbered(target.as_bytes()));
        slowest = slowest.max(start.elapsed());
    }
    // Reaching this line is the proof: with a stalled writer, appends did not wait.
    let dropped = writer.stats().dropped_lines;
    assert!(
        dropped > 0,
        "the pool cannot hold 3.4 MB; lines must have been dropped"
    );
    eprintln!("stalled sink: {n} appends, slowest {slowest:?}, dropped {dropped}");
    let reading = drain(reader);
    let stats = writer.shutdown();
    let text = reading.join().unwrap();
    let written = combined_targets(&text);
    assert_eq!(written.len() as u64, stats.lines_written);
    assert_eq!(stats.lines_written + stats.dropped_lines, n as u64);
    assert_eq!(
        dropped_notes(&text),
        stats.dropped_lines,
        "the log itself says how many were dropped"
    );
}

#[test]
fn stalled_sink_with_block_applies_backpressure_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (path, reader) = fifo(dir.path());
    let cfg = Config {
        on_full: OnFull::Block,
        ..config(&path, 4096, 2)
    };
    let (log, writer) = AccessLog::start(&cfg).unwrap();
    let n = 5_000; // ~850 KB: far more than the pipe plus two buffers.
    let progress = Arc::new(AtomicU64::new(0));
    let appender = {
        let (log, progress) = (log.clone(), Arc::clone(&progress));
        thread::spawn(move || {
            for i in 0..n {
                let target = format!("/t0/{i}");
                log.log(&numbered(target.as_bytes()));
                progress.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // Wait until the appender stops making progress: it is blocked on the pool.
    let mut last = u64::MAX;
    eventually("the appender to block", || {
        let now = progress.load(Ordering::Relaxed);
        let still = now == last;
        last = now;
        thread::sleep(Duration::from_millis(200));
        still && !appender.is_finished()
    });
    assert!(progress.load(Ordering::Relaxed) < n as u64);
    let reading = drain(reader);
    appender.join().unwrap();
    let stats = writer.shutdown();
    let text = reading.join().unwrap();
    assert_each_once(&combined_targets(&text), 1, n);
    assert_eq!(stats.dropped_lines, 0);
    assert_eq!(stats.lines_written, n as u64);
}

#[test]
fn off_writes_nothing_and_start_reports_bad_paths() {
    let (log, writer) = AccessLog::start(&Config::default()).unwrap();
    log.log(&numbered(b"/x"));
    writer.flush();
    assert_eq!(writer.shutdown(), tailguard_access_log::Stats::default());
    let err = AccessLog::start(&Config::to("/nonexistent-dir/a.log")).unwrap_err();
    assert!(err.to_string().contains("/nonexistent-dir/a.log"), "{err}");
}

#[test]
fn json_file_lines_all_parse() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.json");
    let cfg = Config {
        format: Some(tailguard_access_log::FormatName::Json),
        ..lossless(&path, 4096, 8)
    };
    let (log, writer) = AccessLog::start(&cfg).unwrap();
    for i in 0..500u32 {
        let mut ua = b"agent \"\n\xff".to_vec();
        ua.extend_from_slice(i.to_string().as_bytes());
        log.log(&tailguard_access_log::Record {
            user_agent: Some(&ua),
            ..numbered(b"/j")
        });
    }
    writer.shutdown();
    let text = fs::read_to_string(&path).unwrap();
    let mut count = 0;
    for (i, l) in text.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["http_user_agent"], format!("agent \"\n\\xFF{i}"));
        count += 1;
    }
    assert_eq!(count, 500);
}

#[test]
fn metrics_count_lines_bytes_drops_and_errors() {
    let registry = tailguard_metrics::Registry::builder()
        .self_metrics_prefix(None)
        .build()
        .unwrap();
    let metrics = tailguard_access_log::Metrics::register(&registry).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let (log, writer) = AccessLog::start_with_metrics(
        &lossless(&path, 4096, 4),
        Some(metrics.log("main").unwrap()),
    )
    .unwrap();
    log_from_threads(&log, 2, 1000);
    let ok = writer.shutdown();
    let full_cfg = Config {
        flush_ms: 10,
        ..config(Path::new("/dev/full"), 4096, 2)
    };
    let (log, writer) =
        AccessLog::start_with_metrics(&full_cfg, Some(metrics.log("full").unwrap())).unwrap();
    log_from_threads(&log, 1, 1000);
    eventually("a write error", || writer.stats().write_errors > 0);
    let full = writer.shutdown();
    let text = String::from_utf8(registry.render(tailguard_metrics::Format::Text)).unwrap();
    let value = |series: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"));
        line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64
    };
    assert_eq!(
        value("tailguard_access_log_lines_written_total{log=\"main\"}"),
        2000
    );
    assert_eq!(
        value("tailguard_access_log_bytes_written_total{log=\"main\"}"),
        ok.bytes_written
    );
    assert_eq!(
        value("tailguard_access_log_flushes_total{log=\"main\"}"),
        ok.flushes
    );
    assert_eq!(
        value("tailguard_access_log_dropped_lines_total{log=\"main\"}"),
        0
    );
    assert_eq!(
        value("tailguard_access_log_dropped_lines_total{log=\"full\"}"),
        full.dropped_lines
    );
    assert_eq!(
        value("tailguard_access_log_lost_lines_total{log=\"full\"}"),
        full.lost_lines
    );
    assert_eq!(
        value("tailguard_access_log_write_errors_total{log=\"full\"}"),
        full.write_errors
    );
    assert!(full.write_errors > 0 && full.dropped_lines > 0);
    assert!(text.contains("# TYPE tailguard_access_log_writer_lag_seconds gauge"));
}

#[test]
fn writer_thread_runs_at_the_configured_nice_value() {
    let dir = tempfile::tempdir().unwrap();
    let (_log, writer) = AccessLog::start(&config(&dir.path().join("a.log"), 4096, 2)).unwrap();
    // The writer names itself; find it among this process's threads and read its nice value
    // (field 19 of /proc/<pid>/task/<tid>/stat).
    let nice_of_writer = || {
        fs::read_dir("/proc/self/task").unwrap().find_map(|t| {
            let dir = t.unwrap().path();
            let comm = fs::read_to_string(dir.join("comm")).ok()?;
            if !comm.starts_with("tailguard-log-w") {
                return None;
            }
            let stat = fs::read_to_string(dir.join("stat")).ok()?;
            let after_name = &stat[stat.rfind(')')? + 2..];
            after_name.split(' ').nth(16)?.parse::<i32>().ok()
        })
    };
    let mut nice = None;
    eventually("the writer's nice value", || {
        nice = nice_of_writer();
        nice == Some(tailguard_access_log::DEFAULT_WRITER_NICE)
    });
    writer.shutdown();
}

#[test]
fn shutdown_within_gives_up_on_a_stalled_sink() {
    let dir = tempfile::tempdir().unwrap();
    let (path, reader) = fifo(dir.path());
    let (log, writer) = AccessLog::start(&config(&path, 4096, 4)).unwrap();
    for i in 0..5_000 {
        let target = format!("/t0/{i}");
        log.log(&numbered(target.as_bytes()));
    }
    // The writer is blocked in write(2) on the full pipe: shutdown must still return.
    let stats = writer.shutdown_within(Duration::from_millis(200));
    assert!(stats.lines_written < 5_000, "{stats:?}");
    // Unblock the writer so it ends before the test process does.
    let text = drain(reader).join().unwrap();
    assert!(!combined_targets(&text).is_empty());
}

//! `tailguard load --scrape`: the scraper is a process of its own, as a Prometheus is, and
//! what it scraped lands in the run's report.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tailguard_test_support::Upstream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scraper_is_a_child_process_and_its_scrapes_are_in_the_report() {
    let target = Upstream::start().await;
    let url = format!("http://{}", target.addr);
    let dir = tempfile::tempdir().expect("a temp dir");
    let json = dir.path().join("run.json");
    let mut load = Command::new(env!("CARGO_BIN_EXE_tailguard"))
        .args([
            "load",
            &format!("{url}/"),
            "--rate",
            "50",
            "--duration",
            "3s",
        ])
        .args(["--connections", "2", "--every", "1s", "--brief"])
        .args(["--scrape", &format!("{url}/metrics")])
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::null())
        .spawn()
        .expect("tailguard load starts");
    // While the run lasts, one of its children is the scraper.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut scraper = None;
    while scraper.is_none() && Instant::now() < deadline {
        scraper = scraper_child_of(load.id());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = load.wait().expect("tailguard load ends");
    assert!(status.success(), "{status}");
    assert!(
        scraper.is_some(),
        "no child of the run had the scraper's environment"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the report")).expect("JSON");
    // Scrapes planned at 0.5 s, 1.5 s and 2.5 s of the 3 s window, each answered 200 with
    // `ok`. A scrape never starts before its plan; at `SCHED_IDLE` on a busy machine it may
    // start late, so only the lower bound and the order are checked.
    let scrapes = report["scrapes"].as_array().expect("scrapes");
    assert_eq!(scrapes.len(), 3, "{scrapes:?}");
    let mut previous = 0.0;
    for (s, planned) in scrapes.iter().zip([0.5, 1.5, 2.5]) {
        assert_eq!(
            (s["status"].as_u64(), s["bytes"].as_u64()),
            (Some(200), Some(2)),
            "{s}"
        );
        let start = s["start_s"].as_f64().expect("a start");
        assert!(start >= planned - 0.01 && start >= previous, "{s}");
        previous = start;
    }
}

/// The pid of a child of `parent` whose environment marks it as a run's scraper.
fn scraper_child_of(parent: u32) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(Result::ok)
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid ...`: the fields after the last ')'.
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let marked = environ
                .split(|&b| b == 0)
                .any(|var| var == b"TAILGUARD_LOAD_SCRAPER=1");
            (ppid == parent && marked).then_some(pid)
        })
}

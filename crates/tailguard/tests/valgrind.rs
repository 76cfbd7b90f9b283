//! The binary under `valgrind --tool=none`: it serves, its process metrics are right and it
//! exits 0 on SIGTERM. Skipped, loudly, where valgrind is not installed (`scripts/install-tools`
//! installs it; CI also runs `scripts/valgrind-smoke` on the release binary).

use std::process::Command;
use std::time::Duration;

use crate::support::Gateway;

fn valgrind_installed() -> bool {
    Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success())
}

/// The value of an unlabelled sample in an exposition.
fn sample(exposition: &str, name: &str) -> f64 {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in:\n{exposition}"))
        .parse()
        .expect("a number")
}

fn curl(url: &str) -> String {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "60", "-w", "\n%{http_code}", url])
        .output()
        .expect("curl (installed by scripts/install-tools)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Issue 22: rustix asked the kernel for the aux vector (prctl PR_GET_AUXV), which under
/// valgrind is valgrind's own; the gateway read an unmapped vDSO address from it and died
/// with SIGSEGV while registering the process metrics, before it served.
#[test]
fn the_binary_serves_under_valgrind_which_crashed_it_reading_the_aux_vector() {
    if !valgrind_installed() {
        eprintln!(
            "SKIPPED the_binary_serves_under_valgrind...: valgrind is not installed \
             (scripts/install-tools installs it)"
        );
        return;
    }
    // Valgrind translates every instruction before it runs it: a debug binary starts in
    // seconds, on a loaded machine in tens of seconds.
    let mut gw = Gateway::run_under(
        &["valgrind", "--tool=none"],
        &[
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--threads",
            "1",
        ],
        Duration::from_secs(120),
    );
    let page = curl(&format!("{}/", gw.url()));
    assert!(page.ends_with("\n200"), "{page}\n{}", gw.log());
    assert!(page.contains("Hello from tailguard!"), "{page}");

    gw.wait_for_log("tailguard: metrics on http://", Duration::from_secs(10));
    let log = gw.log();
    let metrics = log
        .split("tailguard: metrics on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the exporter's address")
        .to_owned();
    let scrape = curl(&metrics);
    assert!(scrape.ends_with("\n200"), "{scrape}");
    // Page size and clock ticks come from the aux vector: a wrong one shows here.
    let rss = sample(&scrape, "process_resident_memory_bytes");
    assert!(rss >= 4096.0, "resident memory {rss} B:\n{scrape}");
    let start = sample(&scrape, "process_start_time_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    assert!(
        (now - 3600.0..=now + 60.0).contains(&start),
        "start time {start}, now {now}"
    );

    gw.signal("TERM");
    let status = gw.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "{status:?}\n{}", gw.log());
}

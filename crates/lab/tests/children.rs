//! The lab stops every child process it started: when a guard drops, when the lab is killed
//! with SIGTERM, and when a gateway condition fails (a rejected flag is named, not a crash).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use tailguard_lab::procs::ChildGuard;
use tailguard_lab::runner::{RunOptions, run};

/// True once `pid` is gone or a zombie waiting for its reaper.
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

fn wait_dead(pid: u32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if dead(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn dropping_a_guard_stops_the_child() {
    let guard = ChildGuard::spawn("sleeper", Command::new("sleep").arg("300")).unwrap();
    let pid = guard.id();
    assert!(!dead(pid));
    drop(guard);
    assert!(wait_dead(pid));
}

/// Run by `sigterm_stops_every_child` in a child test process: starts two sleepers under the
/// lab's signal handler, writes their pids and waits to be killed. Does nothing otherwise.
#[test]
#[ignore = "helper process for sigterm_stops_every_child"]
fn lab_child_helper() {
    let Some(pidfile) = std::env::var_os("LAB_HELPER_PIDFILE") else {
        return;
    };
    tailguard_lab::procs::install_signal_handler().unwrap();
    let a = ChildGuard::spawn("a", Command::new("sleep").arg("300")).unwrap();
    let b = ChildGuard::spawn("b", Command::new("sleep").arg("300")).unwrap();
    std::fs::write(&pidfile, format!("{} {}", a.id(), b.id())).unwrap();
    // Bounded: the parent test kills us long before this.
    std::thread::sleep(Duration::from_secs(60));
    drop((a, b));
}

#[test]
fn sigterm_stops_every_child() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pids");
    let mut helper = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "children::lab_child_helper",
            "--ignored",
            "--nocapture",
        ])
        .env("LAB_HELPER_PIDFILE", &pidfile)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let pids: Vec<u32> = loop {
        if let Ok(text) = std::fs::read_to_string(&pidfile)
            && text.split(' ').count() == 2
        {
            break text.split(' ').map(|p| p.parse().unwrap()).collect();
        }
        assert!(
            Instant::now() < deadline,
            "helper never started its children"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(pids.iter().all(|&p| !dead(p)));
    let helper_pid = rustix::process::Pid::from_child(&helper);
    rustix::process::kill_process(helper_pid, rustix::process::Signal::TERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = helper.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the lab did not exit on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(130));
    for pid in pids {
        assert!(wait_dead(pid), "child {pid} outlived the lab");
    }
}

#[test]
fn a_rejected_gateway_flag_skips_the_condition_and_stops_the_upstream() {
    let dir = tempfile::tempdir().unwrap();
    // A stand-in `tailguard`: its upstream prints the ready line and sleeps, its gateway
    // rejects a flag the way clap does.
    let exe = dir.path().join("tailguard");
    let pidfile = dir.path().join("upstream.pid");
    let argsfile = dir.path().join("gateway.args");
    std::fs::write(
        &exe,
        format!(
            "#!/bin/sh\ncase \"$1\" in\n upstream) echo $$ > {}; echo 'listening on 127.0.0.1:9'; exec sleep 300;;\n run) echo \"$@\" > {}; echo \"error: unexpected argument '--synthetic-series' found\" >&2; exit 2;;\nesac\n",
            pidfile.display(),
            argsfile.display()
        ),
    )
    .unwrap();
    std::os::unix::fs::PermissionsExt::set_mode(
        &mut std::fs::metadata(&exe).unwrap().permissions(),
        0o755,
    );
    std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let scenario = dir.path().join("scenario.toml");
    std::fs::write(
        &scenario,
        "name = \"t\"\ndescription = \"d\"\n[load]\nrate = 10\nduration = \"1s\"\nconnections = 1\n\
         [[condition]]\nname = \"1M series\"\ngateway = [\"--synthetic-series\", \"1000000\"]\n",
    )
    .unwrap();
    let outcome = run(&RunOptions {
        scenario: scenario.display().to_string(),
        scenarios_dir: Path::new("unused").to_path_buf(),
        quick: false,
        out: dir.path().join("out"),
        exe,
        nice: None,
        duration: None,
    })
    .unwrap();
    let why = outcome.rows[0].result.as_ref().unwrap_err();
    assert!(
        why.contains("feature missing") && why.contains("--synthetic-series"),
        "{why}"
    );
    assert!(outcome.table.contains("skipped: feature missing"));
    // The gateway got the contract's flags and the condition's, each once.
    let args = std::fs::read_to_string(&argsfile).unwrap();
    let mut args: Vec<&str> = args.split_whitespace().collect();
    assert_eq!(args[..2], ["run", "--listen"]);
    // This stand-in has no `run --help`, so the runner assumes the exporter flag exists.
    let m = args.iter().position(|a| *a == "--metrics-listen").unwrap();
    args.drain(m..m + 2);
    assert_eq!(
        args[3..],
        [
            "--upstream",
            "demo=127.0.0.1:9",
            "--synthetic-series",
            "1000000"
        ]
    );
    let upstream_pid: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        wait_dead(upstream_pid),
        "the upstream outlived the scenario"
    );
}

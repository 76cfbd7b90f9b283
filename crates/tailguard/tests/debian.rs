//! The Debian package of `deploy/debian`: built by `deploy/debian/build-deb` (dpkg-deb),
//! installed on this machine with `dpkg -i`, its config checked and its binary started the
//! way its systemd unit starts them (the `ExecStartPre=` and `ExecStart=` lines read from the
//! installed unit, as its `User=`, in a network namespace of the test's own so the default
//! ports cannot collide), upgraded over an edited config, which stays, then purged.
//!
//! Needs root (dpkg). It refuses to run where a `tailguard` package is already installed,
//! rather than replace and purge someone's gateway.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::{output, package_binary, workspace_root};

const UNIT: &str = "/lib/systemd/system/tailguard.service";
const CONFIG: &str = "/etc/tailguard/tailguard.toml";

/// `dpkg ARGS`, again while another dpkg or apt holds dpkg's lock (the machine is shared).
fn dpkg(args: &[&str]) -> (bool, String) {
    let start = Instant::now();
    loop {
        let (ok, out) = output(Command::new("dpkg").args(args));
        if ok || !out.contains("lock") || start.elapsed() > Duration::from_secs(120) {
            return (ok, out);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn installed_version() -> Option<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f", "${db:Status-Status} ${Version}", "tailguard"])
        .output()
        .expect("dpkg-query");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.strip_prefix("installed ").map(str::to_owned)
}

/// Purges the package on drop, so a failed assertion leaves nothing installed.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = dpkg(&["--purge", "tailguard"]);
    }
}

/// The values of `key=` in a unit file, in order.
fn unit_values(unit: &str, key: &str) -> Vec<String> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_owned)
        .collect()
}

/// A line of /etc/passwd for `user`.
fn passwd(user: &str) -> Option<Vec<String>> {
    let out = Command::new("getent")
        .args(["passwd", user])
        .output()
        .expect("getent");
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .split(':')
            .map(str::to_owned)
            .collect()
    })
}

/// `Command` for a unit's command line, run as its user with the environment systemd gives
/// it (`Environment=`, `STATE_DIRECTORY`, `LOGS_DIRECTORY`), in a new network namespace
/// whose loopback is up when `own_network`.
fn as_the_unit(unit: &str, line: &str, own_network: bool) -> Command {
    let user = unit_values(unit, "User").pop().expect("User=");
    let group = unit_values(unit, "Group").pop().expect("Group=");
    let mut env = vec!["env".to_owned(), "-i".to_owned()];
    env.extend(unit_values(unit, "Environment"));
    env.push("STATE_DIRECTORY=/var/lib/tailguard".to_owned());
    env.push("LOGS_DIRECTORY=/var/log/tailguard".to_owned());
    let exec = format!(
        "exec setpriv --reuid={user} --regid={group} --init-groups -- {} {line}",
        env.join(" ")
    );
    let mut cmd = if own_network {
        let mut c = Command::new("unshare");
        c.args(["--net", "--", "sh", "-c"])
            .arg(format!("ip link set lo up && {exec}"));
        c
    } else {
        let mut c = Command::new("sh");
        c.arg("-c").arg(exec);
        c
    };
    cmd.stdin(Stdio::null());
    cmd
}

/// curl run inside the network namespace of process `pid`: status and body.
fn curl_in(pid: u32, url: &str) -> (u16, String) {
    let out = Command::new("nsenter")
        .args([
            "-t",
            &pid.to_string(),
            "-n",
            "curl",
            "-sS",
            "--max-time",
            "10",
        ])
        .args(["-w", "\n%{http_code}", url])
        .output()
        .expect("nsenter curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

#[test]
fn the_package_installs_runs_as_its_unit_keeps_an_edited_config_on_upgrade_and_purges() {
    let uid = output(Command::new("id").arg("-u")).1;
    assert_eq!(uid.trim(), "0", "dpkg -i needs root (CI runs as root)");
    assert_eq!(
        installed_version(),
        None,
        "a tailguard package is installed on this machine: this test would replace and \
         purge it; remove it first (dpkg --purge tailguard)"
    );
    let out = tempfile::tempdir().expect("tempdir");
    let build = |revision: &str| {
        let built = Command::new(workspace_root().join("deploy/debian/build-deb"))
            .arg("--binary")
            .arg(package_binary())
            .arg("--out")
            .arg(out.path())
            .args(["--revision", revision])
            .output()
            .expect("run build-deb");
        let stdout = String::from_utf8_lossy(&built.stdout).into_owned();
        assert!(
            built.status.success(),
            "build-deb:\n{stdout}{}",
            String::from_utf8_lossy(&built.stderr)
        );
        stdout.lines().last().expect("the .deb's path").to_owned()
    };
    let first = build("1");
    let second = build("2");

    let (ok, text) = dpkg(&["-i", &first]);
    let _installed = Installed;
    assert!(ok, "dpkg -i {first}:\n{text}");
    let version = installed_version().expect("installed");
    assert!(version.ends_with("-1"), "{version}");

    // The system user, and the unit running as it.
    let user = passwd("tailguard").expect("postinst creates the user tailguard");
    let uid: u32 = user[2].parse().expect("uid");
    assert!(uid < 1000, "a system user: {user:?}");
    assert_eq!(user[6], "/usr/sbin/nologin", "{user:?}");
    let unit = std::fs::read_to_string(UNIT).expect("the installed unit");
    assert_eq!(unit_values(&unit, "User"), ["tailguard"]);
    assert_eq!(unit_values(&unit, "StateDirectory"), ["tailguard"]);
    assert!(unit_values(&unit, "DynamicUser").is_empty(), "{unit}");
    let conffiles =
        output(Command::new("dpkg-query").args(["-W", "-f", "${Conffiles}", "tailguard"])).1;
    for file in [CONFIG, "/etc/logrotate.d/tailguard"] {
        assert!(
            conffiles.contains(file),
            "{file} not a conffile:\n{conffiles}"
        );
    }
    if Path::new("/usr/bin/systemd-analyze").exists() {
        let (ok, text) = output(Command::new("systemd-analyze").args(["verify", UNIT]));
        assert!(
            ok && text.trim().is_empty(),
            "systemd-analyze verify:\n{text}"
        );
    }

    // ExecStartPre: `tailguard check` on the installed config, as the unit's user.
    let pre = unit_values(&unit, "ExecStartPre")
        .pop()
        .expect("ExecStartPre=");
    assert!(pre.contains(" check --config /etc/tailguard/tailguard.toml"));
    let (ok, text) = output(&mut as_the_unit(&unit, &pre, false));
    assert!(ok && text.contains(": ok ("), "{pre}:\n{text}");

    // ExecStart, with the directories systemd would create for it.
    for (dir, mode) in [
        ("/var/lib/tailguard", "0700"),
        ("/var/log/tailguard", "0750"),
    ] {
        let (ok, text) = output(
            Command::new("install")
                .args(["-d", "-o", "tailguard", "-g", "tailguard", "-m", mode])
                .arg(dir),
        );
        assert!(ok, "{text}");
    }
    let start = unit_values(&unit, "ExecStart").pop().expect("ExecStart=");
    assert_eq!(
        start,
        "/usr/bin/tailguard run --config /etc/tailguard/tailguard.toml"
    );
    let mut gateway = as_the_unit(&unit, &start, true)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the unit's ExecStart");
    let (tx, rx) = mpsc::channel();
    let stderr = gateway.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut log = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("tailguard: listening on 127.0.0.1:8080") {
                let _ = tx.send(());
            }
            log.push_str(&line);
            log.push('\n');
        }
        log
    });
    if rx.recv_timeout(Duration::from_secs(30)).is_err() {
        let _ = gateway.kill();
        panic!(
            "the gateway did not start:\n{}",
            reader.join().expect("log")
        );
    }
    let pid = gateway.id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let uids = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .expect("Uid:");
    assert!(
        uids.split_whitespace().all(|u| u == uid.to_string()),
        "runs as tailguard ({uid}): {uids}"
    );
    let (code, body) = curl_in(pid, "http://127.0.0.1:8080/");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("Hello from tailguard!"), "{body}");
    let (code, scrape) = curl_in(pid, "http://127.0.0.1:9091/metrics");
    assert_eq!(code, 200, "{scrape}");
    assert!(
        scrape
            .lines()
            .any(|l| l == r#"tailguard_requests_total{route="demo",method="GET",status="200"} 1"#),
        "{scrape}"
    );
    // systemd's KillSignal=SIGTERM.
    assert_eq!(unit_values(&unit, "KillSignal"), ["SIGTERM"]);
    let killed = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let exit = gateway.wait().expect("wait");
    let log = reader.join().expect("log");
    assert!(exit.success(), "{exit:?}\n{log}");
    assert!(log.contains("drained, exiting"), "{log}");

    // An upgrade keeps the operator's edit of the config (a conffile).
    let edited = format!(
        "{}\n# edited by the operator\n",
        std::fs::read_to_string(CONFIG).expect("config")
    );
    std::fs::write(CONFIG, &edited).expect("edit the config");
    let (ok, text) = dpkg(&["-i", &second]);
    assert!(ok, "dpkg -i {second}:\n{text}");
    let version = installed_version().expect("installed");
    assert!(version.ends_with("-2"), "{version}");
    assert_eq!(
        std::fs::read_to_string(CONFIG).expect("config"),
        edited,
        "the upgrade replaced the edited config:\n{text}"
    );
    assert!(!Path::new("/etc/tailguard/tailguard.toml.dpkg-new").exists());

    // Purge: every file of the package, the config and what the service wrote are gone.
    let files = output(Command::new("dpkg").args(["-L", "tailguard"])).1;
    let (ok, text) = dpkg(&["--purge", "tailguard"]);
    assert!(ok, "dpkg --purge:\n{text}");
    assert_eq!(installed_version(), None);
    for file in files.lines().map(Path::new).filter(|p| !p.is_dir()) {
        assert!(!file.exists(), "{} left after purge", file.display());
    }
    for dir in ["/etc/tailguard", "/var/lib/tailguard", "/var/log/tailguard"] {
        assert!(!Path::new(dir).exists(), "{dir} left after purge");
    }
    let status = output(Command::new("dpkg").args(["-s", "tailguard"])).1;
    assert!(!status.contains("Status: deinstall"), "{status}");
    // The user stays (see deploy/debian/postrm).
    assert!(passwd("tailguard").is_some());
}

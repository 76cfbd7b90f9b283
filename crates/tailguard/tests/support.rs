//! Running the built binary and reading its stderr.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// A `tailguard run` child process.
pub(crate) struct Gateway {
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
    stderr: Arc<Mutex<String>>,
    /// Its `$STATE_DIRECTORY` (where a gateway on etcd keeps its default cache), so no test
    /// writes to /var/lib/tailguard.
    state: PathBuf,
    /// The state directory when it is the gateway's own (removed when it drops).
    _own_state: Option<tempfile::TempDir>,
}

impl Gateway {
    /// Starts `tailguard run ARGS` and waits (at most 20 s) for its listening line.
    pub(crate) fn run(args: &[&str]) -> Gateway {
        Gateway::run_binary(env!("CARGO_BIN_EXE_tailguard").as_ref(), args)
    }

    /// [`Gateway::run`] with another build of the binary (a release build for figures).
    pub(crate) fn run_binary(binary: &std::ffi::OsStr, args: &[&str]) -> Gateway {
        Gateway::start(Command::new(binary), args, Duration::from_secs(20))
    }

    /// [`Gateway::run`] under a program that runs it (`valgrind --tool=none`): `wrapper`,
    /// then the binary and `run ARGS`; waits at most `limit` for the listening line.
    pub(crate) fn run_under(wrapper: &[&str], args: &[&str], limit: Duration) -> Gateway {
        let (program, wrapper_args) = wrapper.split_first().expect("a wrapper program");
        let mut cmd = Command::new(program);
        cmd.args(wrapper_args).arg(env!("CARGO_BIN_EXE_tailguard"));
        Gateway::start(cmd, args, limit)
    }

    /// [`Gateway::run`] with `state` as its `$STATE_DIRECTORY`, which other gateways may
    /// share (as several gateways on one host do).
    pub(crate) fn run_in_state(args: &[&str], state: &Path) -> Gateway {
        let cmd = Command::new(env!("CARGO_BIN_EXE_tailguard"));
        Gateway::start_in(cmd, args, Duration::from_secs(20), state.to_owned(), None)
    }

    fn start(cmd: Command, args: &[&str], limit: Duration) -> Gateway {
        let own = tempfile::tempdir().expect("state dir");
        Gateway::start_in(cmd, args, limit, own.path().to_owned(), Some(own))
    }

    fn start_in(
        mut cmd: Command,
        args: &[&str],
        limit: Duration,
        state: PathBuf,
        own_state: Option<tempfile::TempDir>,
    ) -> Gateway {
        let mut child = cmd
            .arg("run")
            .args(args)
            .env("RUST_LOG", "info")
            .env("STATE_DIRECTORY", &state)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tailguard");
        let stderr = child.stderr.take().expect("stderr piped");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let log2 = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("tailguard: listening on ").nth(1) {
                    let addr = rest.split_whitespace().next().unwrap_or("").to_owned();
                    let _ = tx.send(addr);
                }
                log2.lock().expect("log lock").push_str(&line);
                log2.lock().expect("log lock").push('\n');
            }
        });
        let addr = match rx.recv_timeout(limit) {
            Ok(a) => a.parse().expect("listening address"),
            Err(_) => {
                let _ = child.kill();
                panic!("gateway did not start:\n{}", log.lock().expect("log lock"));
            }
        };
        Gateway {
            child,
            addr,
            stderr: log,
            state,
            _own_state: own_state,
        }
    }

    /// Its `$STATE_DIRECTORY`.
    pub(crate) fn state_dir(&self) -> &Path {
        &self.state
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sends a signal by name (`HUP`, `TERM`) with kill(1).
    pub(crate) fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill(1)")
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// Everything the gateway wrote to stderr so far.
    pub(crate) fn log(&self) -> String {
        self.stderr.lock().expect("log lock").clone()
    }

    /// Waits until the log contains `needle` (at most `limit`).
    pub(crate) fn wait_for_log(&self, needle: &str, limit: Duration) {
        let start = Instant::now();
        while !self.log().contains(needle) {
            assert!(
                start.elapsed() < limit,
                "log never showed {needle:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the process to exit (at most `limit`).
    pub(crate) fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                start.elapsed() < limit,
                "gateway did not exit:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A field of /proc/PID/status in KiB (e.g. `VmHWM`, peak resident set).
    pub(crate) fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .expect("status field")
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tailguard check --config FILE`: exit code, stdout, stderr.
pub(crate) fn check(path: &std::path::Path) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tailguard"))
        .arg("check")
        .arg("--config")
        .arg(path)
        .output()
        .expect("run tailguard check");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A config file proxying everything to `addrs`, plus `extra` TOML.
pub(crate) fn proxy_config(addrs: &[SocketAddr], extra: &str) -> String {
    let eps: Vec<String> = addrs
        .iter()
        .map(|a| format!("{{ address = \"{a}\" }}"))
        .collect();
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[[upstreams]]\nname = \"up\"\nendpoints = [{}]\n\n[[routes]]\nid = \"all\"\nupstream = \"up\"\n\n{extra}",
        eps.join(", ")
    )
}

/// The binary the image and package tests ship: `$TAILGUARD_PACKAGE_BIN` (CI sets the
/// release binary it builds for valgrind; a relative path is taken from the workspace root),
/// else this test build's own binary. Either way its debug info is stripped when packaged.
pub(crate) fn package_binary() -> std::path::PathBuf {
    match std::env::var_os("TAILGUARD_PACKAGE_BIN") {
        Some(path) => workspace_root().join(path),
        None => env!("CARGO_BIN_EXE_tailguard").into(),
    }
}

/// The repository's root directory.
pub(crate) fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs a command to its end: success, and stdout followed by stderr.
pub(crate) fn output(cmd: &mut Command) -> (bool, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// GET with curl: the HTTP status (0 when no answer came) and the body.
pub(crate) fn curl_get(url: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30", "-w", "\n%{http_code}", url])
        .output()
        .expect("curl (installed by scripts/install-tools)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

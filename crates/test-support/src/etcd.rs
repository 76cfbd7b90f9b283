//! A real etcd (Debian's `etcd-server`, installed by scripts/install-tools) on free
//! 127.0.0.1 ports with a temporary data dir, for tests of the etcd client and of the
//! gateway's config from etcd.
//!
//! Without an `etcd` binary [`EtcdServer::start`] fails the test, unless
//! `TAILGUARD_SKIP_ETCD_TESTS=1` says skipping is allowed (CI installs etcd, so there the
//! tests always run).

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A real etcd, killed (and its data dir removed) on drop. It can be stopped and started
/// again on the same data dir, on its own client port or another.
#[derive(Debug)]
pub struct EtcdServer {
    child: Option<Child>,
    dir: PathBuf,
    _tempdir: TempDir,
    /// The client port the server was first started on (where the code under test looks).
    pub client_port: u16,
    peer_port: u16,
}

/// A directory removed on drop (test-support has no `tempfile`).
#[derive(Debug)]
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A port free when asked (bound to 127.0.0.1:0, then released) for a server that binds it
/// itself, such as etcd.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

impl EtcdServer {
    /// Starts etcd and waits until it serves, or returns `None` when it is absent and
    /// skipping is allowed.
    pub fn start() -> Option<EtcdServer> {
        let present = Command::new("etcd")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !present {
            assert!(
                std::env::var("TAILGUARD_SKIP_ETCD_TESTS").as_deref() == Ok("1"),
                "etcd is not installed: run scripts/install-tools (apt-get install etcd-server), \
                 or set TAILGUARD_SKIP_ETCD_TESTS=1 to skip the etcd tests"
            );
            eprintln!("etcd not installed and TAILGUARD_SKIP_ETCD_TESTS=1: skipping");
            return None;
        }
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tailguard-etcd-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("etcd temp dir");
        let mut etcd = EtcdServer {
            child: None,
            _tempdir: TempDir(dir.clone()),
            dir,
            client_port: free_port(),
            peer_port: free_port(),
        };
        etcd.spawn(etcd.client_port);
        Some(etcd)
    }

    /// Its client URL on [`client_port`](Self::client_port).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Starts etcd on the data dir, serving clients on `port`, and waits (at most 20 s) until
    /// it answers its health check.
    pub fn spawn(&mut self, port: u16) {
        self.spawn_no_wait(port);
        self.wait_healthy(port);
    }

    /// Starts etcd on the data dir, serving clients on `port`, and returns at once: the
    /// caller sees etcd answer for itself (e.g. to time what follows from that moment).
    pub fn spawn_no_wait(&mut self, port: u16) {
        let client = format!("http://127.0.0.1:{port}");
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .expect("etcd log");
        let child = Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(self.dir.join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        self.child = Some(child);
    }

    /// Waits (at most 20 s) until etcd on `port` answers its health check.
    pub fn wait_healthy(&self, port: u16) {
        let start = Instant::now();
        while !healthy(port) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "etcd did not start:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops etcd (SIGKILL), keeping its data dir.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts etcd again where the code under test looks for it (its first client port),
    /// on the same data dir: after [`kill`](Self::kill), a restart as after a crash.
    pub fn restart(&mut self) {
        self.restart_no_wait();
        self.wait_healthy(self.client_port);
    }

    /// [`restart`](Self::restart) without waiting for etcd to answer.
    pub fn restart_no_wait(&mut self) {
        self.kill();
        let port = self.client_port;
        self.spawn_no_wait(port);
    }

    /// Freezes etcd (SIGSTOP) or thaws it (SIGCONT): its connections stay open but nothing
    /// answers, as behind a silent network.
    pub fn freeze(&self, frozen: bool) {
        let child = self.child.as_ref().expect("etcd is running");
        let status = Command::new("kill")
            .arg(if frozen { "-STOP" } else { "-CONT" })
            .arg(child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -STOP/-CONT etcd");
    }

    /// What etcd has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// etcd's `/health` on the client port says `"health":"true"`: it has a leader and serves
/// reads and writes.
fn healthy(port: u16) -> bool {
    let attempt = || -> std::io::Result<String> {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"GET /health HTTP/1.0\r\nHost: etcd\r\n\r\n")?;
        let mut raw = String::new();
        s.read_to_string(&mut raw)?;
        Ok(raw)
    };
    attempt().is_ok_and(|raw| raw.contains("\"health\":\"true\""))
}

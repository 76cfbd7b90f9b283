//! A real Redis (Debian's `redis-server`, installed by scripts/install-tools) on a free
//! 127.0.0.1 port (outside the ephemeral range, so it stays free while Redis is down), with
//! no persistence; optionally serving TLS only (`--tls-port`, certificates from a test CA,
//! client certificates required) or with an ACL file (the default user off, one user of
//! the test's). Killed, restarted (empty, as after a crash without persistence), frozen.
//!
//! Without a `redis-server` binary [`RedisServer::start`] fails the test, unless
//! `TAILGUARD_SKIP_REDIS_TESTS=1` says skipping is allowed (CI installs it, so there the
//! tests always run).

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::TestCa;
use crate::ports::free_port;

/// How [`RedisServer::builder`] starts Redis.
#[derive(Debug, Default)]
pub struct RedisBuilder {
    tls: bool,
    acl: Option<(String, String)>,
}

impl RedisBuilder {
    /// Serve TLS only (`--port 0 --tls-port P`), requiring client certificates, with a
    /// server certificate for 127.0.0.1 from a CA of the test's own.
    pub fn tls(mut self) -> RedisBuilder {
        self.tls = true;
        self
    }

    /// An ACL file: the default user off; `user` with `password`, allowed every command on
    /// keys under `tailguard:` only.
    pub fn acl_user(mut self, user: &str, password: &str) -> RedisBuilder {
        self.acl = Some((user.to_owned(), password.to_owned()));
        self
    }

    /// Starts Redis and waits until it answers, or returns `None` when it is absent and
    /// skipping is allowed.
    pub fn start(self) -> Option<RedisServer> {
        RedisServer::start_with(self)
    }
}

/// The certificate files of a Redis serving TLS.
#[derive(Debug, Clone)]
pub struct RedisPki {
    /// The CA that signed Redis's certificate and the client's (PEM).
    pub ca: PathBuf,
    /// A client certificate signed by that CA (PEM).
    pub client_cert: PathBuf,
    /// Its private key (PEM, PKCS#8).
    pub client_key: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
}

/// A real Redis, killed (and its directory removed) on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    dir: PathBuf,
    /// The port it serves on (TLS only, with [`RedisBuilder::tls`]).
    pub port: u16,
    pki: Option<RedisPki>,
    acl: Option<(String, String)>,
}

impl RedisServer {
    /// A plain Redis.
    pub fn start() -> Option<RedisServer> {
        RedisServer::builder().start()
    }

    /// A Redis with TLS or an ACL file.
    pub fn builder() -> RedisBuilder {
        RedisBuilder::default()
    }

    fn start_with(options: RedisBuilder) -> Option<RedisServer> {
        if !crate::tools::installed_or_skipped(
            "redis-server",
            "TAILGUARD_SKIP_REDIS_TESTS",
            "apt-get install redis-server",
        ) {
            return None;
        }
        let dir = crate::tools::fresh_dir("redis");
        let pki = options.tls.then(|| {
            let ca = TestCa::new("tailguard redis test CA");
            let ca_path = dir.join("ca.pem");
            ca.write(&ca_path);
            let (server_cert, server_key) =
                ca.issue(&["127.0.0.1", "localhost"]).write(&dir, "server");
            let (client_cert, client_key) = ca.issue(&["tailguard"]).write(&dir, "client");
            RedisPki {
                ca: ca_path,
                client_cert,
                client_key,
                server_cert,
                server_key,
            }
        });
        if let Some((user, password)) = &options.acl {
            std::fs::write(
                dir.join("users.acl"),
                format!("user default off\nuser {user} on >{password} ~tailguard:* +@all\n"),
            )
            .expect("write the ACL file");
        }
        let mut redis = RedisServer {
            child: None,
            dir,
            port: free_port(),
            pki,
            acl: options.acl,
        };
        redis.spawn();
        Some(redis)
    }

    /// Its URL (`rediss://` with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.pki.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Its certificates, if it serves TLS.
    pub fn pki(&self) -> Option<&RedisPki> {
        self.pki.as_ref()
    }

    fn spawn(&mut self) {
        let port = self.port.to_string();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"));
        match &self.pki {
            Some(pki) => {
                cmd.args(["--port", "0", "--tls-port", &port])
                    .arg("--tls-cert-file")
                    .arg(&pki.server_cert)
                    .arg("--tls-key-file")
                    .arg(&pki.server_key)
                    .arg("--tls-ca-cert-file")
                    .arg(&pki.ca)
                    .args(["--tls-auth-clients", "yes"]);
            }
            None => {
                cmd.args(["--port", &port]);
            }
        }
        if self.acl.is_some() {
            cmd.arg("--aclfile").arg(self.dir.join("users.acl"));
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        self.wait_ready();
    }

    /// Waits (at most 20 s) until Redis answers `PING`.
    fn wait_ready(&self) {
        let start = Instant::now();
        loop {
            let out = self.cli(&["PING"]);
            if String::from_utf8_lossy(&out.stdout).trim() == "PONG" {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "redis-server did not start:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `redis-cli ARGS` against it (with its TLS files and ACL user).
    pub fn cli(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new("redis-cli");
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        if let Some(pki) = &self.pki {
            cmd.arg("--tls")
                .arg("--cacert")
                .arg(&pki.ca)
                .arg("--cert")
                .arg(&pki.client_cert)
                .arg("--key")
                .arg(&pki.client_key);
        }
        if let Some((user, password)) = &self.acl {
            cmd.args(["--user", user, "--pass", password, "--no-auth-warning"]);
        }
        cmd.args(args)
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli (installed with redis-server)")
    }

    /// `redis-cli ARGS`' output, trimmed.
    pub fn cli_text(&self, args: &[&str]) -> String {
        String::from_utf8_lossy(&self.cli(args).stdout)
            .trim()
            .to_owned()
    }

    /// Stops Redis (SIGKILL): its data is gone (no persistence).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts Redis again on its port, empty, and waits until it answers.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Freezes Redis (SIGSTOP) or thaws it (SIGCONT): connections stay open, nothing
    /// answers.
    pub fn freeze(&self, frozen: bool) {
        let child = self.child.as_ref().expect("redis is running");
        let status = Command::new("kill")
            .arg(if frozen { "-STOP" } else { "-CONT" })
            .arg(child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -STOP/-CONT redis");
    }

    /// What Redis has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // A frozen Redis would not die of SIGKILL until thawed on some kernels' view of
            // stopped tasks; thaw first, ignoring failure.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(c.id().to_string())
                .status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

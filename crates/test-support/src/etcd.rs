//! A real etcd (Debian's `etcd-server`, installed by scripts/install-tools) on free
//! 127.0.0.1 ports (outside the ephemeral range, so they stay free while it is down) with a temporary data dir, for tests of the etcd client and of the
//! gateway's config from etcd; optionally serving its clients over TLS (certificates from a
//! test CA), requiring client certificates, or with extra flags (`--auth-token-ttl`).
//!
//! Without an `etcd` binary [`EtcdServer::start`] fails the test, unless
//! `TAILGUARD_SKIP_ETCD_TESTS=1` says skipping is allowed (CI installs etcd, so there the
//! tests always run).

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::TestCa;

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
    /// With TLS: the certificates, and a client for the health check.
    pki: Option<EtcdPki>,
    args: Vec<String>,
}

/// The certificate files of an etcd serving over TLS, in its temporary dir.
#[derive(Debug, Clone)]
pub struct EtcdPki {
    /// The CA that signed the server's certificate and the client's (PEM).
    pub ca: PathBuf,
    /// A client certificate signed by that CA (PEM), and its key.
    pub client_cert: PathBuf,
    /// The client certificate's private key (PEM, PKCS#8).
    pub client_key: PathBuf,
    /// Whether etcd requires a client certificate (`--client-cert-auth`).
    pub client_cert_auth: bool,
    server_cert: PathBuf,
    server_key: PathBuf,
    health: Arc<rustls::ClientConfig>,
}

/// How [`EtcdServer::builder`] starts etcd.
#[derive(Debug, Default)]
pub struct EtcdBuilder {
    tls: bool,
    client_cert_auth: bool,
    args: Vec<String>,
}

impl EtcdBuilder {
    /// Serve clients over TLS (`https://`), with a server certificate for 127.0.0.1 and
    /// localhost from a CA of the test's own ([`EtcdServer::pki`]).
    pub fn tls(mut self) -> EtcdBuilder {
        self.tls = true;
        self
    }

    /// Serve clients over TLS and require a client certificate signed by that CA
    /// (`--client-cert-auth --trusted-ca-file`).
    pub fn client_cert_auth(mut self) -> EtcdBuilder {
        self.tls = true;
        self.client_cert_auth = true;
        self
    }

    /// One more command-line argument for etcd (e.g. `--auth-token-ttl=2`).
    pub fn arg(mut self, arg: &str) -> EtcdBuilder {
        self.args.push(arg.to_owned());
        self
    }

    /// Starts etcd and waits until it serves, or returns `None` when it is absent and
    /// skipping is allowed.
    pub fn start(self) -> Option<EtcdServer> {
        EtcdServer::start_with(self)
    }
}

/// A directory removed on drop (test-support has no `tempfile`).
#[derive(Debug)]
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// etcd's ports (client, peer, and the other client ports the tests move it to) must stay
/// free while it is killed, until it is started again on them: see [`crate::ports`].
pub use crate::ports::free_port;

impl EtcdServer {
    /// Starts etcd and waits until it serves, or returns `None` when it is absent and
    /// skipping is allowed.
    pub fn start() -> Option<EtcdServer> {
        EtcdServer::builder().start()
    }

    /// An etcd with TLS, client certificates or extra flags.
    pub fn builder() -> EtcdBuilder {
        EtcdBuilder::default()
    }

    fn start_with(options: EtcdBuilder) -> Option<EtcdServer> {
        if !crate::tools::installed_or_skipped(
            "etcd",
            "TAILGUARD_SKIP_ETCD_TESTS",
            "apt-get install etcd-server",
        ) {
            return None;
        }
        let dir = crate::tools::fresh_dir("etcd");
        let pki = options
            .tls
            .then(|| EtcdPki::write(&dir, options.client_cert_auth));
        let mut etcd = EtcdServer {
            child: None,
            _tempdir: TempDir(dir.clone()),
            dir,
            client_port: free_port(),
            peer_port: free_port(),
            pki,
            args: options.args,
        };
        etcd.spawn(etcd.client_port);
        Some(etcd)
    }

    /// Its client URL on [`client_port`](Self::client_port) (`https://` with TLS).
    pub fn url(&self) -> String {
        self.url_at(self.client_port)
    }

    /// Its client URL if it served on `port`.
    pub fn url_at(&self, port: u16) -> String {
        let scheme = if self.pki.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{port}")
    }

    /// Its certificates, if it serves over TLS.
    pub fn pki(&self) -> Option<&EtcdPki> {
        self.pki.as_ref()
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
        let client = self.url_at(port);
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
            .args(self.pki.iter().flat_map(EtcdPki::args))
            .args(&self.args)
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
        while !healthy(port, self.pki.as_ref()) {
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
fn healthy(port: u16, pki: Option<&EtcdPki>) -> bool {
    let attempt = || -> std::io::Result<String> {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        let request = b"GET /health HTTP/1.0\r\nHost: etcd\r\n\r\n";
        let mut raw = String::new();
        match pki {
            None => {
                s.write_all(request)?;
                s.read_to_string(&mut raw)?;
            }
            Some(pki) => {
                let name = ServerName::try_from("127.0.0.1").expect("an IP address");
                let conn = rustls::ClientConnection::new(pki.health.clone(), name)
                    .map_err(std::io::Error::other)?;
                let mut tls = rustls::StreamOwned::new(conn, s);
                tls.write_all(request)?;
                // etcd closes without close_notify after an HTTP/1.0 answer.
                let mut bytes = Vec::new();
                let _ = tls.read_to_end(&mut bytes);
                raw = String::from_utf8_lossy(&bytes).into_owned();
            }
        }
        Ok(raw)
    };
    attempt().is_ok_and(|raw| raw.contains("\"health\":\"true\""))
}

impl EtcdPki {
    /// A CA, a server certificate for 127.0.0.1 and localhost, and a client certificate,
    /// written into `dir`.
    fn write(dir: &std::path::Path, client_cert_auth: bool) -> EtcdPki {
        let ca = TestCa::new("etcd test CA");
        let ca_path = dir.join("ca.pem");
        ca.write(&ca_path);
        let (server_cert, server_key) = ca.issue(&["127.0.0.1", "localhost"]).write(dir, "server");
        let client = ca.issue(&["tailguard-client"]);
        let (client_cert, client_key) = client.write(dir, "client");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der.clone()).expect("ca root");
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots);
        let chain = CertificateDer::pem_slice_iter(client.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("client certificate");
        let key = PrivateKeyDer::from_pem_slice(client.key_pem.as_bytes()).expect("client key");
        let health = builder
            .with_client_auth_cert(chain, key)
            .expect("client auth");
        EtcdPki {
            ca: ca_path,
            client_cert,
            client_key,
            client_cert_auth,
            server_cert,
            server_key,
            health: Arc::new(health),
        }
    }

    fn args(&self) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = vec![
            "--cert-file".into(),
            self.server_cert.clone().into(),
            "--key-file".into(),
            self.server_key.clone().into(),
        ];
        if self.client_cert_auth {
            args.extend([
                "--client-cert-auth".into(),
                "--trusted-ca-file".into(),
                self.ca.clone().into(),
            ]);
        }
        args
    }
}

//! An HTTPS upstream on 127.0.0.1:0 with certificates from a test CA (rcgen), that counts
//! handshakes (full and resumed) and can do to an idle connection what real TLS servers do:
//! send a key update, or close with `close_notify`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    date_time_ymd,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A certificate authority that issues test certificates.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate, PEM (what a `ca` file holds).
    pub cert_pem: String,
    /// The CA certificate, DER.
    pub cert_der: CertificateDer<'static>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

/// A certificate issued by a [`TestCa`], with its key.
#[derive(Debug, Clone)]
pub struct IssuedCert {
    /// Certificate, PEM.
    pub cert_pem: String,
    /// Private key, PEM (PKCS#8).
    pub key_pem: String,
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("ca key");
        let cert = params.self_signed(&key).expect("ca certificate");
        TestCa {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        }
    }

    /// Writes the CA certificate as PEM to `path`.
    pub fn write(&self, path: &Path) {
        std::fs::write(path, &self.cert_pem).expect("write ca");
    }

    /// A certificate for `names` (DNS names or IP addresses), valid now.
    pub fn issue(&self, names: &[&str]) -> IssuedCert {
        self.issue_with(names, |_| {})
    }

    /// A certificate for `names` that expired in 2001.
    pub fn issue_expired(&self, names: &[&str]) -> IssuedCert {
        self.issue_with(names, |p| {
            p.not_before = date_time_ymd(2000, 1, 1);
            p.not_after = date_time_ymd(2001, 1, 1);
        })
    }

    fn issue_with(&self, names: &[&str], edit: impl FnOnce(&mut CertificateParams)) -> IssuedCert {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, "tailguard test");
        edit(&mut params);
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign leaf");
        IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

impl IssuedCert {
    /// Writes `{stem}.pem` and `{stem}.key` into `dir`; returns their paths.
    pub fn write(&self, dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{stem}.pem"));
        let key = dir.join(format!("{stem}.key"));
        std::fs::write(&cert, &self.cert_pem).expect("write cert");
        std::fs::write(&key, &self.key_pem).expect("write key");
        (cert, key)
    }

    /// A rustls server config presenting this certificate (no ALPN set), requiring a
    /// client certificate issued by `client_ca` when one is given (mTLS).
    pub fn server_config(&self, client_ca: Option<&TestCa>) -> rustls::ServerConfig {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .expect("protocol versions");
        let builder = match client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(ca.cert_der.clone()).expect("client ca");
                let verifier = WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    Arc::clone(&provider),
                )
                .build()
                .expect("client verifier");
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        builder
            .with_single_cert(self.chain(), self.key())
            .expect("server certificate")
    }

    fn chain(&self) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .expect("certificate pem")
    }

    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).expect("key pem")
    }
}

/// What the upstream does to a connection after each response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AfterResponse {
    /// Keeps it open, waiting for the next request.
    #[default]
    Wait,
    /// Sends a TLS key update (a record with no application data), then waits.
    KeyUpdate,
    /// Sends `close_notify` but keeps the TCP connection open.
    CloseNotify,
    /// As [`AfterResponse::CloseNotify`], once [`TlsUpstream::send_close_notifies`] is called:
    /// the peer has read the whole response by then, so the alert reaches an idle connection.
    CloseNotifyWhenTold,
    /// Waits for the next request and, instead of answering it, sends `close_notify`
    /// (keeping the TCP connection open): what a client meets when an upstream closes an
    /// idle connection just as a request is written on it (the keep-alive race).
    CloseNotifyOnNextRequest,
    /// Answers with `connection: close` and closes (so every request is a new connection).
    Close,
}

/// Configures a [`TlsUpstream`].
#[derive(Debug)]
pub struct TlsUpstreamBuilder {
    cert: IssuedCert,
    client_ca: Option<CertificateDer<'static>>,
    after: AfterResponse,
    body: String,
    body_delay: Duration,
    hold_until: usize,
}

impl TlsUpstreamBuilder {
    /// Answers no request before `n` requests have arrived (0: each at once). A client that
    /// sends `n` requests at once so makes the gateway open `n` connections, one per
    /// request, whatever the timing.
    pub fn hold_until(mut self, n: usize) -> Self {
        self.hold_until = n;
        self
    }

    /// Waits this long after a request head before reading its body, so a large body fills
    /// the socket buffers and the sender must wait for room (0).
    pub fn body_delay(mut self, delay: Duration) -> Self {
        self.body_delay = delay;
        self
    }

    /// Requires a client certificate issued by `ca` (mTLS).
    pub fn client_ca(mut self, ca: &TestCa) -> Self {
        self.client_ca = Some(ca.cert_der.clone());
        self
    }

    /// What happens after each response ([`AfterResponse::Wait`]).
    pub fn after_response(mut self, after: AfterResponse) -> Self {
        self.after = after;
        self
    }

    /// Body of every answer (`ok`).
    pub fn body(mut self, body: &str) -> Self {
        self.body = body.to_owned();
        self
    }

    /// Binds 127.0.0.1:0 and serves.
    pub async fn start(self) -> TlsUpstream {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .expect("protocol versions");
        let builder = match &self.client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(ca.clone()).expect("client ca");
                let verifier = WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    Arc::clone(&provider),
                )
                .build()
                .expect("client verifier");
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(self.cert.chain(), self.cert.key())
            .expect("server certificate");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let counts = Arc::new(Counts::default());
        let c = Arc::clone(&counts);
        let (after, body, body_delay, hold_until) = (
            self.after,
            Arc::new(self.body),
            self.body_delay,
            self.hold_until,
        );
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                // A record is on its way to the peer once flushed: with Nagle, a small one
                // written while the last is unacked (a close_notify right after a response)
                // waits in this side's kernel for the peer's delayed ACK, up to 40 ms.
                let _ = tcp.set_nodelay(true);
                let (acceptor, c, body) = (acceptor.clone(), Arc::clone(&c), Arc::clone(&body));
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        c.failed.fetch_add(1, Ordering::SeqCst);
                        return;
                    };
                    c.handshakes.fetch_add(1, Ordering::SeqCst);
                    if tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                        c.resumed.fetch_add(1, Ordering::SeqCst);
                    }
                    serve(tls, after, &body, body_delay, hold_until, &c).await;
                });
            }
        });
        TlsUpstream { addr, counts }
    }
}

#[derive(Debug, Default)]
struct Counts {
    handshakes: AtomicUsize,
    resumed: AtomicUsize,
    failed: AtomicUsize,
    requests: AtomicUsize,
    close_notifies: AtomicUsize,
    /// Told each time a request arrives (for [`TlsUpstreamBuilder::hold_until`]).
    arrived: tokio::sync::Notify,
    /// Set by [`TlsUpstream::send_close_notifies`].
    close_notify_told: tokio::sync::watch::Sender<bool>,
}

/// Answers requests on one TLS connection: a request with a `content-length` body is read
/// whole and answered `got N`, others with the fixed body. A WebSocket upgrade is answered
/// `101` and the connection then echoes what it receives.
async fn serve(
    mut tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    after: AfterResponse,
    body: &str,
    body_delay: Duration,
    hold_until: usize,
    counts: &Counts,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match tls.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        buf.drain(..end + 4);
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if length > 0 && !body_delay.is_zero() {
            tokio::time::sleep(body_delay).await;
        }
        while buf.len() < length {
            match tls.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..length);
        counts.requests.fetch_add(1, Ordering::SeqCst);
        counts.arrived.notify_waiters();
        loop {
            // Registered before the count is read, so an arrival between the two still wakes.
            let mut arrived = std::pin::pin!(counts.arrived.notified());
            arrived.as_mut().enable();
            if counts.requests.load(Ordering::SeqCst) >= hold_until {
                break;
            }
            arrived.await;
        }
        if head.contains("\nupgrade: websocket") {
            let answer = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n";
            if tls.write_all(answer).await.is_err() || tls.write_all(&buf).await.is_err() {
                return;
            }
            loop {
                match tls.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if tls.write_all(&chunk[..n]).await.is_err() || tls.flush().await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
        let client_cert = tls.get_ref().1.peer_certificates().is_some();
        let resumed = tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
        let close = if after == AfterResponse::Close {
            "connection: close\r\n"
        } else {
            ""
        };
        let body = if length > 0 {
            format!("got {length}")
        } else {
            body.to_owned()
        };
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nx-client-cert: {client_cert}\r\nx-tls-resumed: {resumed}\r\n{close}\r\n{body}",
            body.len()
        );
        if tls.write_all(answer.as_bytes()).await.is_err() || tls.flush().await.is_err() {
            return;
        }
        match after {
            AfterResponse::Wait => {}
            AfterResponse::KeyUpdate => {
                if tls.get_mut().1.refresh_traffic_keys().is_err() || tls.flush().await.is_err() {
                    return;
                }
            }
            AfterResponse::CloseNotify
            | AfterResponse::CloseNotifyWhenTold
            | AfterResponse::CloseNotifyOnNextRequest => {
                if after == AfterResponse::CloseNotifyWhenTold {
                    let mut told = counts.close_notify_told.subscribe();
                    if told.wait_for(|told| *told).await.is_err() {
                        return;
                    }
                }
                if after == AfterResponse::CloseNotifyOnNextRequest
                    && !matches!(tls.read(&mut chunk).await, Ok(n) if n > 0)
                {
                    return;
                }
                tls.get_mut().1.send_close_notify();
                let _ = tls.flush().await;
                counts.close_notifies.fetch_add(1, Ordering::SeqCst);
                // The TCP connection stays open until the peer closes it.
                while matches!(tls.get_mut().0.read(&mut chunk).await, Ok(n) if n > 0) {}
                return;
            }
            AfterResponse::Close => {
                let _ = tls.shutdown().await;
                return;
            }
        }
    }
}

/// An HTTPS upstream on 127.0.0.1:0 answering `200` with a fixed body (`got N` to a request
/// with an N-byte body), headers
/// `x-client-cert` (whether the client sent a certificate) and `x-tls-resumed`.
#[derive(Debug)]
pub struct TlsUpstream {
    /// Where it listens.
    pub addr: SocketAddr,
    counts: Arc<Counts>,
}

impl TlsUpstream {
    /// An upstream presenting `cert`.
    pub fn builder(cert: IssuedCert) -> TlsUpstreamBuilder {
        TlsUpstreamBuilder {
            cert,
            client_ca: None,
            after: AfterResponse::Wait,
            body: "ok".to_owned(),
            body_delay: Duration::ZERO,
            hold_until: 0,
        }
    }

    /// Completed handshakes (connections that could carry requests).
    pub fn handshakes(&self) -> usize {
        self.counts.handshakes.load(Ordering::SeqCst)
    }

    /// Completed handshakes that resumed an earlier session.
    pub fn resumed(&self) -> usize {
        self.counts.resumed.load(Ordering::SeqCst)
    }

    /// Handshakes that failed (the client refused the certificate, or sent none when one
    /// was required, or broke off).
    pub fn failed_handshakes(&self) -> usize {
        self.counts.failed.load(Ordering::SeqCst)
    }

    /// Request heads answered.
    pub fn requests(&self) -> usize {
        self.counts.requests.load(Ordering::SeqCst)
    }

    /// `close_notify`s sent and flushed ([`AfterResponse::CloseNotify`]): a test waits for
    /// one instead of sleeping and hoping it went. Flushed is sent: the upstream's sockets
    /// have Nagle off, so an alert written while the response is unacknowledged goes at
    /// once instead of waiting for the peer's delayed ACK (on loopback, it is in the peer's
    /// socket when the write returns).
    pub fn close_notifies(&self) -> usize {
        self.counts.close_notifies.load(Ordering::SeqCst)
    }

    /// Lets every connection under [`AfterResponse::CloseNotifyWhenTold`] send its
    /// `close_notify`, now and after any later response.
    pub fn send_close_notifies(&self) {
        self.counts.close_notify_told.send_replace(true);
    }
}

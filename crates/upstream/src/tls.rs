//! TLS to upstreams: the rustls client config of an upstream's `[upstreams.tls]`, built at
//! config load (files read there, never on the request path), and the handshake a pool runs
//! on each new connection.
//!
//! One [`UpstreamTls`] (one `Arc<rustls::ClientConfig>`) serves every endpoint of its
//! upstream on every serving thread, so its session cache is shared: the second connection
//! to an endpoint resumes the first one's session (an abbreviated handshake, no certificate
//! chain sent or verified again). A reload that finds the same settings and the same file
//! contents keeps the running one, its cache and its pools' warm connections; a changed CA,
//! certificate or key makes a new one, and new pools with it.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::sign::SingleCertAndKey;
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use tailguard_config::UpstreamTlsConfig;
use tailguard_config::upstream_tls;

pub use tailguard_config::upstream_tls::LoadError;

/// ALPN offered to an HTTP/1.1 upstream.
pub const ALPN_HTTP1: &[&[u8]] = &[b"http/1.1"];
/// ALPN offered to an HTTP/2 upstream (`protocol = "h2"`).
pub const ALPN_H2: &[&[u8]] = &[b"h2"];

/// What a loaded config was made of: two loads with equal identities make interchangeable
/// client configs (so a reload keeps the running one). File contents, not paths: a file
/// rewritten in place is a change.
#[derive(Clone, PartialEq, Eq)]
struct Identity {
    sni: Option<String>,
    verify: bool,
    /// `None`: the system roots.
    ca: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
    alpn: Vec<Vec<u8>>,
}

/// The TLS side of one upstream: the client config its pools handshake with.
pub struct UpstreamTls {
    config: Arc<rustls::ClientConfig>,
    sni: Option<ServerName<'static>>,
    identity: Identity,
}

impl fmt::Debug for UpstreamTls {
    // Key material stays out of debug output.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("sni", &self.sni)
            .field("verify", &self.identity.verify)
            .field("ca", &self.identity.ca.as_ref().map(|_| ".."))
            .field("client_cert", &self.identity.client.is_some())
            .field("alpn", &self.config.alpn_protocols)
            .finish()
    }
}

impl UpstreamTls {
    /// Loads `tls` (files relative to `base_dir`, read and parsed by
    /// [`tailguard_config::upstream_tls::load`]) into a client config that offers `alpn`
    /// ([`ALPN_HTTP1`], or [`ALPN_H2`] for an HTTP/2 upstream).
    pub fn load(
        base_dir: &Path,
        tls: &UpstreamTlsConfig,
        alpn: &[&[u8]],
    ) -> Result<UpstreamTls, LoadError> {
        let files = upstream_tls::load(base_dir, tls)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| LoadError {
                field: "ca",
                message: e.to_string(),
            })?;
        let builder = match files.roots {
            Some(roots) => builder.with_root_certificates(roots),
            // `verify = false`.
            None => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(Arc::clone(&provider)))),
        };
        let mut config = match files.client_key {
            Some(key) => builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(key))),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        // The default resumption: an in-memory cache of 256 sessions (TLS 1.3 tickets, TLS
        // 1.2 ids and tickets), shared by whoever holds this config.
        Ok(UpstreamTls {
            identity: Identity {
                sni: tls.sni.as_ref().map(|s| s.get_ref().clone()),
                verify: tls.verify,
                ca: files.ca,
                client: files.client,
                alpn: config.alpn_protocols.clone(),
            },
            config: Arc::new(config),
            sni: files.sni,
        })
    }

    /// Whether `other` was loaded from the same settings and file contents (a reload keeps
    /// `self`, with its session cache, instead of `other`).
    pub fn same_as(&self, other: &UpstreamTls) -> bool {
        self.identity == other.identity
    }

    /// Whether certificates go unverified (`verify = false`).
    pub fn verifies(&self) -> bool {
        self.identity.verify
    }

    /// The name an endpoint is verified against and sent as SNI: `sni` if set, else the
    /// endpoint's host as written (a DNS name, or an IP literal, which rustls verifies
    /// against the certificate's IP addresses and sends no SNI for). `None` if `host` is
    /// neither.
    pub fn server_name(&self, host: &str) -> Option<ServerName<'static>> {
        match &self.sni {
            Some(name) => Some(name.clone()),
            None => ServerName::try_from(host.to_owned()).ok(),
        }
    }

    /// [`UpstreamTls::server_name`] of an endpoint written as an IP literal.
    pub fn server_name_of_addr(&self, addr: SocketAddr) -> ServerName<'static> {
        match &self.sni {
            Some(name) => name.clone(),
            None => ServerName::IpAddress(addr.ip().into()),
        }
    }

    /// The rustls client config (for an HTTP/2 client that runs its own handshake).
    pub fn client_config(&self) -> &Arc<rustls::ClientConfig> {
        &self.config
    }
}

/// What a pool handshakes with: its upstream's TLS and the endpoint's server name.
#[derive(Debug, Clone)]
pub struct TlsTarget {
    /// The upstream's TLS (shared by its pools).
    pub tls: Arc<UpstreamTls>,
    /// Verified against and sent as SNI.
    pub name: ServerName<'static>,
}

impl TlsTarget {
    /// Runs the TLS handshake over a connected socket.
    pub async fn connect(&self, tcp: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
        tokio_rustls::TlsConnector::from(Arc::clone(&self.tls.config))
            .connect(self.name.clone(), tcp)
            .await
    }

    /// Whether two targets make the same connections (a reload keeps a pool only then).
    pub fn same_as(&self, other: &TlsTarget) -> bool {
        Arc::ptr_eq(&self.tls, &other.tls) && self.name == other.name
    }

    /// [`TlsTarget::same_as`] for a pool's optional target: both plain, or the same TLS.
    pub fn same_option(a: Option<&TlsTarget>, b: Option<&TlsTarget>) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => a.same_as(b),
            _ => false,
        }
    }
}

/// `verify = false`: any certificate is accepted, for any name, expired or not (nginx's
/// `proxy_ssl_verify off`). The handshake's signatures are still checked, so the peer must
/// hold the key of the certificate it sent; it just need not be anyone in particular.
/// Public for clients that inspect the certificate themselves (the listeners' SNI tests).
#[derive(Debug)]
pub struct AnyCertificate(Arc<CryptoProvider>);

impl AnyCertificate {
    /// A verifier that checks the handshake signatures with `provider`'s algorithms.
    pub fn new(provider: Arc<CryptoProvider>) -> AnyCertificate {
        AnyCertificate(provider)
    }
}

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

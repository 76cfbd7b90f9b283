//! The connections of forward auth's pooled client: TCP for an `http://` auth service, TCP
//! then TLS (rustls, ring) for an `https://` one, verified against the system's roots and,
//! when given, the CA certificates of a PEM file (`ca`).

use std::error::Error as StdError;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tower_service::Service;

type BoxError = Box<dyn StdError + Send + Sync>;

/// The certificates of a PEM file, at least one; the error names what is wrong with it.
pub fn read_ca(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("`{}` is not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("`{}` holds no certificate", path.display()));
    }
    Ok(certs)
}

/// A TLS client config trusting the system's roots and the certificates of `ca`; HTTP/1.1
/// by ALPN (the client speaks nothing else).
pub fn tls_config(ca: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        // A system root rustls cannot parse is skipped, as browsers do.
        let _ = roots.add(cert);
    }
    if let Some(path) = ca {
        for cert in read_ca(path)? {
            roots
                .add(cert)
                .map_err(|e| format!("`{}`: a certificate rustls refuses: {e}", path.display()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Connects to `http://` and `https://` URLs (the latter only when built with a TLS config).
#[derive(Clone)]
pub struct Connector {
    http: HttpConnector,
    tls: Option<tokio_rustls::TlsConnector>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// A connector with TCP_NODELAY, and TLS by `tls` for `https://` URLs.
    pub fn new(tls: Option<Arc<rustls::ClientConfig>>) -> Connector {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        // The scheme is ours to look at: the TCP part serves both.
        http.enforce_http(false);
        Connector {
            http,
            tls: tls.map(tokio_rustls::TlsConnector::from),
        }
    }
}

/// A connection to the auth service.
#[derive(Debug)]
pub enum Stream {
    /// `http://`.
    Plain(TokioIo<TcpStream>),
    /// `https://`.
    Tls(Box<TokioIo<TlsStream<TcpStream>>>),
}

impl Service<Uri> for Connector {
    type Response = Stream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let https = uri.scheme_str() == Some("https");
        let tls = self.tls.clone();
        let host = uri
            .host()
            .unwrap_or_default()
            .trim_matches(['[', ']'])
            .to_owned();
        let connecting = self.http.call(uri);
        Box::pin(async move {
            let tcp = connecting.await?;
            if !https {
                return Ok(Stream::Plain(tcp));
            }
            let tls = tls.ok_or("an https:// URL without a TLS config")?;
            let name = ServerName::try_from(host)?;
            let stream = tls.connect(name, tcp.into_inner()).await?;
            Ok(Stream::Tls(Box::new(TokioIo::new(stream))))
        })
    }
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        match self {
            Stream::Plain(s) => s.connected(),
            Stream::Tls(s) => s.inner().get_ref().0.connected(),
        }
    }
}

impl hyper::rt::Read for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl hyper::rt::Write for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

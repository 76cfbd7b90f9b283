//! TLS to etcd (`https://` endpoints): the trust the server's certificate is checked against
//! (a CA, or the system's roots) and an optional client certificate, checked when they are
//! given so a bad file is reported where it is named rather than at the first connection.
//!
//! The handshake is tonic's (`tls-ring`: rustls with the ring provider, as the rest of the
//! workspace uses); this module only hands it checked PEM and reads its errors back.

use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::ring::default_provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::sign::CertifiedKey;
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// How the client speaks TLS: which server certificates it trusts and which certificate it
/// presents. The server's certificate is always verified, for the endpoint's host name (or
/// IP address); there is no way to turn that off.
#[derive(Clone, Default)]
pub struct Tls {
    /// PEM; `None`: the system's roots.
    ca: Option<Vec<u8>>,
    /// The client's certificate chain and key, PEM.
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Tls")
            .field("ca", &self.has_ca())
            .field("client_cert", &self.has_client_cert())
            .finish()
    }
}

impl Tls {
    /// Trust the system's root certificates (e.g. `/etc/ssl/certs`, or `SSL_CERT_FILE`) and
    /// present no client certificate.
    pub fn system_roots() -> Tls {
        Tls::default()
    }

    /// Trust only the certificates in `pem` (etcd's `--trusted-ca-file` for its clients is
    /// usually the CA that signed its `--cert-file`). Fails if `pem` holds no certificate.
    pub fn with_ca_pem(mut self, pem: &[u8]) -> Result<Tls, String> {
        certificates(pem)?;
        self.ca = Some(pem.to_vec());
        Ok(self)
    }

    /// Present the certificate chain in `cert_pem` (first the client's own certificate) with
    /// the private key in `key_pem` (for etcd's `--client-cert-auth`). Fails if either does
    /// not parse or the key is not the certificate's.
    pub fn with_client_cert_pem(mut self, cert_pem: &[u8], key_pem: &[u8]) -> Result<Tls, String> {
        let chain = certificates(cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem)
            .map_err(|e| format!("no private key found: {e}"))?;
        CertifiedKey::from_der(chain, key, &default_provider())
            .map_err(|e| format!("the key does not go with the certificate: {e}"))?;
        self.identity = Some((cert_pem.to_vec(), key_pem.to_vec()));
        Ok(self)
    }

    /// Whether a client certificate is presented.
    pub fn has_client_cert(&self) -> bool {
        self.identity.is_some()
    }

    /// Whether the server is checked against a given CA rather than the system's roots.
    pub fn has_ca(&self) -> bool {
        self.ca.is_some()
    }

    pub(crate) fn client_config(&self, timeout: Option<std::time::Duration>) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new();
        config = match &self.ca {
            Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
            None => config.with_native_roots(),
        };
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(t) = timeout {
            config = config.timeout(t);
        }
        config
    }
}

/// A second look at a connection that failed: a TLS handshake of its own with the same
/// settings, then a wait for the server's first record. tonic reports an alert that comes
/// after the client's side of the handshake is done (TLS 1.3's "certificate required")
/// only as "connection closed"; this sees the alert itself.
pub(crate) struct Probe {
    config: Arc<rustls::ClientConfig>,
    /// Host and port of each endpoint.
    targets: Vec<(String, u16)>,
    timeout: Duration,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe")
            .field("targets", &self.targets)
            .finish_non_exhaustive()
    }
}

/// No answer to a probe within this (without a connect timeout): the server is not
/// refusing, it is slow or away, and the caller's own error says so.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

impl Probe {
    pub(crate) fn new(
        tls: &Tls,
        targets: Vec<(String, u16)>,
        timeout: Option<Duration>,
    ) -> Result<Probe, String> {
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let mut roots = rustls::RootCertStore::empty();
        match &tls.ca {
            Some(ca) => {
                for cert in certificates(ca)? {
                    roots
                        .add(cert)
                        .map_err(|e| format!("CA certificate: {e}"))?;
                }
            }
            None => {
                roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            }
        }
        let builder = builder.with_root_certificates(roots);
        let mut config = match &tls.identity {
            Some((cert, key)) => {
                let chain = certificates(cert)?;
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|e| format!("no private key found: {e}"))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| e.to_string())?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols.push(b"h2".to_vec());
        Ok(Probe {
            config: Arc::new(config),
            targets,
            timeout: timeout.unwrap_or(PROBE_TIMEOUT),
        })
    }

    /// The TLS error the first endpoint that ends a handshake with one gives.
    pub(crate) async fn tls_error(&self) -> Option<rustls::Error> {
        for (host, port) in &self.targets {
            let attempt = tokio::time::timeout(self.timeout, self.handshake(host, *port));
            if let Ok(Some(e)) = attempt.await {
                return Some(e);
            }
        }
        None
    }

    async fn handshake(&self, host: &str, port: u16) -> Option<rustls::Error> {
        let name = ServerName::try_from(host.to_owned()).ok()?;
        let tcp = TcpStream::connect((host, port)).await.ok()?;
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&self.config));
        let mut stream = match connector.connect(name, tcp).await {
            Ok(s) => s,
            Err(e) => return rustls_in_io(&e).cloned(),
        };
        // etcd's HTTP/2 server speaks first (its SETTINGS): data means TLS is fine; an alert
        // means the server refused the client's certificate (or its absence).
        let mut byte = [0u8; 1];
        match stream.read(&mut byte).await {
            Ok(_) => None,
            Err(e) => rustls_in_io(&e).cloned(),
        }
    }
}

fn rustls_in_io(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate: {e}"))?;
    if certs.is_empty() {
        return Err("no certificate found (expected PEM, `-----BEGIN CERTIFICATE-----`)".into());
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_without_a_certificate_is_refused_when_given() {
        let e = Tls::system_roots()
            .with_ca_pem(b"not a certificate")
            .expect_err("no certificate");
        assert!(e.contains("no certificate found"), "{e}");
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused() {
        let one = rcgen::generate_simple_self_signed(vec!["a".into()]).expect("rcgen");
        let two = rcgen::generate_simple_self_signed(vec!["b".into()]).expect("rcgen");
        let e = Tls::system_roots()
            .with_client_cert_pem(
                one.cert.pem().as_bytes(),
                two.signing_key.serialize_pem().as_bytes(),
            )
            .expect_err("mismatched key");
        assert!(e.contains("does not go with the certificate"), "{e}");
        let ok = Tls::system_roots().with_client_cert_pem(
            one.cert.pem().as_bytes(),
            one.signing_key.serialize_pem().as_bytes(),
        );
        assert!(ok.is_ok_and(|t| t.has_client_cert()));
    }
}

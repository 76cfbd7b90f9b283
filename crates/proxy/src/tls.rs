//! TLS for listeners: load a PEM certificate chain and key into a rustls server config
//! (ring provider) that offers ALPN `h2` and `http/1.1`.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::TlsConfig;
use crate::error::Error;

/// Builds the rustls server config of a TLS listener.
pub fn server_config(base_dir: &Path, tls: &TlsConfig) -> Result<Arc<rustls::ServerConfig>, Error> {
    let cert_path = base_dir.join(tls.cert.get_ref());
    let key_path = base_dir.join(tls.key.get_ref());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| Error::Tls(format!("certificate {}: {e}", cert_path.display())))?;
    if certs.is_empty() {
        return Err(Error::Tls(format!(
            "certificate {}: no certificate in file",
            cert_path.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(&key_path)
        .map_err(|e| Error::Tls(format!("key {}: {e}", key_path.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| Error::Tls(format!("certificate and key do not fit: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

//! `[upstreams.tls]`: TLS to an upstream's endpoints as written, and its files read and
//! parsed (the name to verify, the trust anchors, the client certificate matched with its
//! key): what the runtime builds its rustls client config from, and what the config check
//! loads to report a bad file at its field.

use std::fmt;
use std::path::{Path, PathBuf};

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::sign::CertifiedKey;
use serde::Deserialize;
use toml::Spanned;

/// TLS to an upstream's endpoints (`[upstreams.tls]`). Paths are relative to the config
/// file, like a listener's; the files are read at load and on each reload.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsConfig {
    /// The name sent as SNI and verified in the certificate (default: the endpoint's host,
    /// for an IP literal the IP).
    #[serde(default)]
    pub sni: Option<Spanned<String>>,
    /// CA certificates (PEM) the upstream's certificate must chain to (default: the system
    /// roots).
    #[serde(default)]
    pub ca: Option<Spanned<PathBuf>>,
    /// Verify the upstream's certificate (default true); false accepts any certificate, as
    /// nginx's `proxy_ssl_verify off`, and is warned about at load.
    #[serde(default = "default_verify")]
    pub verify: bool,
    /// Client certificate chain (PEM) for mTLS; needs `client_key`.
    #[serde(default)]
    pub client_cert: Option<Spanned<PathBuf>>,
    /// The client certificate's private key (PEM); needs `client_cert`.
    #[serde(default)]
    pub client_key: Option<Spanned<PathBuf>>,
}

fn default_verify() -> bool {
    true
}

/// A `[upstreams.tls]` that cannot be loaded: the field whose file is at fault, and why
/// (the message names the file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// `ca`, `client_cert`, `client_key` or `sni`.
    pub field: &'static str,
    /// What is wrong, naming the file.
    pub message: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tls.{}: {}", self.field, self.message)
    }
}

/// The files of one `[upstreams.tls]`, read and parsed.
pub struct Loaded {
    /// `sni`, parsed.
    pub sni: Option<ServerName<'static>>,
    /// What the upstream's certificate must chain to: `ca`'s certificates, else the
    /// system's; `None` with `verify = false`.
    pub roots: Option<RootCertStore>,
    /// The client certificate chain with its key, which fit (mTLS).
    pub client_key: Option<CertifiedKey>,
    /// `ca` as read, when set (what a reload compares to keep the running client config).
    pub ca: Option<Vec<u8>>,
    /// `client_cert` and `client_key` as read, when set.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for Loaded {
    // Key material stays out of debug output.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loaded")
            .field("sni", &self.sni)
            .field("roots", &self.roots.as_ref().map(RootCertStore::len))
            .field("client_cert", &self.client.is_some())
            .finish()
    }
}

/// Reads and parses the files of `tls` (relative to `base_dir`): the first problem found,
/// at the field it is about.
pub fn load(base_dir: &Path, tls: &UpstreamTlsConfig) -> Result<Loaded, LoadError> {
    let sni = match &tls.sni {
        Some(name) => {
            Some(
                ServerName::try_from(name.get_ref().clone()).map_err(|_| LoadError {
                    field: "sni",
                    message: format!("`{}` is not a DNS name or IP address", name.get_ref()),
                })?,
            )
        }
        None => None,
    };
    let ca = match &tls.ca {
        Some(path) => Some(read(base_dir, path.get_ref(), "ca")?),
        None => None,
    };
    let roots = if !tls.verify {
        None
    } else {
        let mut roots = RootCertStore::empty();
        match (&ca, &tls.ca) {
            (Some(pem), Some(path)) => {
                let full = base_dir.join(path.get_ref());
                let certs = certificates(pem, &full, "ca")?;
                for cert in certs {
                    roots.add(cert).map_err(|e| LoadError {
                        field: "ca",
                        message: format!("{}: {e}", full.display()),
                    })?;
                }
            }
            _ => {
                let found = system_roots();
                roots.add_parsable_certificates(found);
                if roots.is_empty() {
                    return Err(LoadError {
                        field: "ca",
                        message: "no `ca` given and no system root certificates found \
                                  (install ca-certificates or set `ca`)"
                            .to_string(),
                    });
                }
            }
        }
        Some(roots)
    };
    let client = match (&tls.client_cert, &tls.client_key) {
        (Some(cert), Some(key)) => Some((
            read(base_dir, cert.get_ref(), "client_cert")?,
            read(base_dir, key.get_ref(), "client_key")?,
        )),
        // Config validation refuses one without the other.
        _ => None,
    };
    let client_key = match (&client, &tls.client_cert, &tls.client_key) {
        (Some((cert_pem, key_pem)), Some(cert_path), Some(key_path)) => {
            let cert_full = base_dir.join(cert_path.get_ref());
            let key_full = base_dir.join(key_path.get_ref());
            let certs = certificates(cert_pem, &cert_full, "client_cert")?;
            let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| LoadError {
                field: "client_key",
                message: format!("{}: {e}", key_full.display()),
            })?;
            // What rustls' `with_client_auth_cert` does, so its errors read the same.
            let provider = rustls::crypto::ring::default_provider();
            let key = CertifiedKey::from_der(certs, key, &provider).map_err(|e| LoadError {
                field: "client_key",
                message: format!(
                    "{} does not fit {}: {e}",
                    key_full.display(),
                    cert_full.display()
                ),
            })?;
            Some(key)
        }
        _ => None,
    };
    Ok(Loaded {
        sni,
        roots,
        client_key,
        ca,
        client,
    })
}

/// The system's trust anchors (rustls-native-certs: the OS store, e.g.
/// `/etc/ssl/certs`, or `SSL_CERT_FILE`). Unreadable entries are skipped, as a browser does.
fn system_roots() -> Vec<CertificateDer<'static>> {
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::debug!("system root certificates: {e}");
    }
    found.certs
}

fn read(base_dir: &Path, path: &PathBuf, field: &'static str) -> Result<Vec<u8>, LoadError> {
    let full = base_dir.join(path);
    std::fs::read(&full).map_err(|e| LoadError {
        field,
        message: format!("cannot read {}: {e}", full.display()),
    })
}

fn certificates(
    pem: &[u8],
    path: &Path,
    field: &'static str,
) -> Result<Vec<CertificateDer<'static>>, LoadError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| LoadError {
            field,
            message: format!("{}: {e}", path.display()),
        })?;
    if certs.is_empty() {
        return Err(LoadError {
            field,
            message: format!("{}: no certificate in file", path.display()),
        });
    }
    Ok(certs)
}

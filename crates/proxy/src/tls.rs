//! TLS for listeners: a listener's `tls` config (one certificate, or several picked by SNI;
//! its type, loading and checks are the config's, [`tailguard_config::tls`]) built into a
//! rustls server config (ring provider) that offers ALPN `h2` and `http/1.1`.
//!
//! Every certificate chain and key is read, parsed and matched when the config loads (and
//! again on each reload, which is how a renewed certificate is picked up); a handshake only
//! looks its certificate up ([`crate::sni`]).

use std::path::Path;
use std::sync::Arc;

use tailguard_config::ListenerConfig;
use tailguard_config::tls::load_entry;
use tailguard_http::error::Error;

use crate::sni::{CertResolver, Names, ServerName};

pub use tailguard_config::tls::{ListenerTls, TlsVersion};

/// Builds the rustls server config of a listener: `None` for a plain listener.
pub fn server_config(
    base_dir: &Path,
    listener: &ListenerConfig,
) -> Result<Option<Arc<rustls::ServerConfig>>, Error> {
    let Some(tls) = &listener.tls else {
        return Ok(None);
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let keys = tls
        .entries()
        .iter()
        .map(|e| {
            load_entry(base_dir, e, &provider)
                .map(Arc::new)
                .map_err(Error::Tls)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut names = Names::default();
    for (entry, key) in tls.entries().iter().zip(&keys) {
        for name in &entry.server_names {
            let name = ServerName::parse(name.get_ref()).map_err(Error::Tls)?;
            // A second claim of a name is a config error [`check`] reports; a config that
            // passed it has none, and the first claim stands anyway.
            let _ = names.claim(name, Arc::clone(key));
        }
    }
    let default = keys
        .get(tls.default_entry())
        .cloned()
        .ok_or_else(|| Error::Internal("a listener's tls list is empty".into()))?;
    let min_version = listener
        .tls_min_version
        .as_ref()
        .map_or(TlsVersion::default(), |v| *v.get_ref());
    let versions: &[&'static rustls::SupportedProtocolVersion] = match min_version {
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(CertResolver::new(names, default)));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Some(Arc::new(config)))
}

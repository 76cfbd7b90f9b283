//! Picks a TLS listener's certificate by the name the client asks for (SNI): an exact name,
//! else a one-label wildcard, else the listener's default certificate.
//!
//! Names are checked and lowercased, and every certificate parsed, when the config loads;
//! a handshake does at most two hash lookups on the name rustls has already lowercased, and
//! clones an `Arc`. A client whose name no entry claims (or that sends none, as a client
//! connecting to an IP address does) gets the default certificate, as nginx's default
//! server and Envoy's default filter chain do: a client that verifies the name then refuses
//! it itself, and one that does not (health checks, `curl -k`) is served.

use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

pub use tailguard_config::sni::{Names, ServerName};

/// A listener's certificates, picked per handshake by SNI (rustls calls
/// [`ResolvesServerCert::resolve`] with the ClientHello).
#[derive(Debug)]
pub struct CertResolver {
    names: Names<Arc<CertifiedKey>>,
    default: Arc<CertifiedKey>,
}

impl CertResolver {
    /// Serves `names` by SNI and `default` to every other client.
    pub fn new(names: Names<Arc<CertifiedKey>>, default: Arc<CertifiedKey>) -> CertResolver {
        CertResolver { names, default }
    }

    /// The certificate for an SNI name (already lowercase, as rustls gives it), or none.
    pub fn pick(&self, sni: Option<&str>) -> &Arc<CertifiedKey> {
        sni.and_then(|name| self.names.get(name))
            .unwrap_or(&self.default)
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(self.pick(client_hello.server_name())))
    }
}

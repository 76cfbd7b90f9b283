//! The target of a load or a scrape: an `http://` URL parsed once into the address to connect
//! to, the authority for `Host` and the path to ask for.

use std::net::{SocketAddr, ToSocketAddrs};

use http::Uri;

use crate::LoadError;

/// A parsed `http://` target.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) addr: SocketAddr,
    pub(crate) authority: String,
    pub(crate) path: Uri,
}

pub(crate) fn parse_target(url: &str) -> Result<Target, LoadError> {
    let bad = |why: &str| LoadError::Url {
        url: url.to_string(),
        why: why.to_string(),
    };
    let uri: Uri = url.parse().map_err(|_| bad("not a valid URL"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => {
            return Err(bad(&format!(
                "scheme `{other}` is not supported, use http://"
            )));
        }
        None => return Err(bad("missing scheme, e.g. http://127.0.0.1:8080/")),
    }
    let authority = uri.authority().ok_or_else(|| bad("missing host"))?;
    let port = authority.port_u16().unwrap_or(80);
    let addr = (authority.host().trim_matches(['[', ']']), port)
        .to_socket_addrs()
        .map_err(|e| bad(&format!("cannot resolve host: {e}")))?
        .next()
        .ok_or_else(|| bad("host resolves to no address"))?;
    let path = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .parse()
        .map_err(|_| bad("bad path"))?;
    Ok(Target {
        addr,
        authority: authority.as_str().to_string(),
        path,
    })
}

//! One `GET` of a key set's URL (http or https), bounded in time and size, for the key
//! fetcher's thread: a connection per fetch (a fetch every few minutes needs no pool), TLS
//! by the caller's config (the system's roots and `jwks_ca`, [`crate::connect::tls_config`]),
//! and the response's `Cache-Control: max-age`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::rt::TokioIo;

/// The largest key set accepted: 1 MiB (a JWKS of hundreds of keys is ~100 KiB).
pub const MAX_BODY: usize = 1 << 20;

/// A fetched document and its `max-age`, if the server sent one.
#[derive(Debug)]
pub struct Fetched {
    /// The body.
    pub body: Bytes,
    /// `Cache-Control: max-age`, in seconds.
    pub max_age: Option<u64>,
}

/// Fetches `url`, all of it within `timeout`; an `https://` URL over `tls`.
pub async fn get(
    url: &Uri,
    timeout: Duration,
    tls: &Arc<rustls::ClientConfig>,
) -> Result<Fetched, String> {
    tokio::time::timeout(timeout, get_inner(url, tls))
        .await
        .map_err(|_| format!("no answer within {} ms", timeout.as_millis()))?
}

async fn get_inner(url: &Uri, tls: &Arc<rustls::ClientConfig>) -> Result<Fetched, String> {
    let https = match url.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err("the URL is neither http nor https".into()),
    };
    let host = url.host().ok_or("the URL has no host")?.to_owned();
    let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let path = url.path_and_query().map_or("/", |p| p.as_str());
    let req = Request::get(path)
        .header(
            http::header::HOST,
            url.authority().map_or(host.as_str(), |a| a.as_str()),
        )
        .header(
            http::header::ACCEPT,
            "application/jwk-set+json, application/json",
        )
        .header(http::header::USER_AGENT, "tailguard")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = if https {
        let name =
            rustls::pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_owned())
                .map_err(|e| format!("server name: {e}"))?;
        let tls = tokio_rustls::TlsConnector::from(Arc::clone(tls))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        send(TokioIo::new(tls), req).await?
    } else {
        send(TokioIo::new(tcp), req).await?
    };
    if resp.status() != StatusCode::OK {
        return Err(format!("status {}", resp.status().as_u16()));
    }
    let max_age = resp
        .headers()
        .get_all(http::header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|d| {
            let (k, v) = d.trim().split_once('=')?;
            k.eq_ignore_ascii_case("max-age")
                .then(|| v.trim_matches('"').parse().ok())
                .flatten()
        });
    let body = Limited::new(resp.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    Ok(Fetched { body, max_age })
}

async fn send<T>(
    io: TokioIo<T>,
    req: Request<Empty<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))
}

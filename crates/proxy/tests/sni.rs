//! TLS listeners with several certificates picked by SNI (`tls = [{ cert, key,
//! server_names }, ...]`), `tls_min_version`, and the config checks of both: a rustls
//! client on real sockets reads which certificate the gateway presented.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use tailguard_proxy::{Config, Server};
use tailguard_test_support::Upstream;
use tailguard_upstream::tls::AnyCertificate;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::support::within;

/// A self-signed certificate for `names`, written as `<stem>.pem` and `<stem>.key` in `dir`.
fn cert(dir: &Path, stem: &str, names: &[&str]) -> CertificateDer<'static> {
    let names = names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
    let certified = rcgen::generate_simple_self_signed(names).expect("rcgen");
    std::fs::write(dir.join(format!("{stem}.pem")), certified.cert.pem()).expect("write cert");
    std::fs::write(
        dir.join(format!("{stem}.key")),
        certified.signing_key.serialize_pem(),
    )
    .expect("write key");
    certified.cert.der().clone()
}

/// Writes `gw.toml` in `dir`: one listener on 127.0.0.1:0 with `listener_fields` (its TLS),
/// an upstream at `upstream` and a catch-all route; returns it loaded as `tailguard run
/// --config` (and SIGHUP) would, certificate paths relative to `dir`.
fn write_config(dir: &Path, listener_fields: &str, upstream: SocketAddr) -> Config {
    let path = dir.join("gw.toml");
    std::fs::write(
        &path,
        format!(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n{listener_fields}\n\n\
             [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{upstream}\" }}]\n\n\
             [[routes]]\nid = \"all\"\nupstream = \"up\"\n"
        ),
    )
    .expect("write config");
    match Config::load(&path) {
        Ok(c) => c,
        Err(e) => panic!("invalid test config:\n{e}"),
    }
}

/// How a test client connects.
struct Client {
    /// `None`: trust any certificate; else trust only this one (and verify the name).
    trust: Option<CertificateDer<'static>>,
    alpn: Vec<Vec<u8>>,
    versions: &'static [&'static rustls::SupportedProtocolVersion],
}

impl Client {
    fn any() -> Client {
        Client {
            trust: None,
            alpn: Vec::new(),
            versions: rustls::DEFAULT_VERSIONS,
        }
    }

    /// Handshakes with `addr` naming `server` (a DNS name is sent as SNI; an IP address
    /// sends none).
    async fn connect(
        &self,
        addr: SocketAddr,
        server: &str,
    ) -> std::io::Result<TlsStream<TcpStream>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(self.versions)
            .expect("versions ring supports");
        let mut config = match &self.trust {
            None => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate::new(provider)))
                .with_no_client_auth(),
            Some(root) => {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(root.clone()).expect("a test certificate as root");
                builder.with_root_certificates(roots).with_no_client_auth()
            }
        };
        config.alpn_protocols = self.alpn.clone();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let name = ServerName::try_from(server.to_owned()).expect("a DNS name or an IP address");
        let tcp = TcpStream::connect(addr).await?;
        within(connector.connect(name, tcp)).await
    }

    /// The end-entity certificate the gateway presents to a client naming `server`.
    async fn presented(&self, addr: SocketAddr, server: &str) -> CertificateDer<'static> {
        let tls = self.connect(addr, server).await.expect("tls handshake");
        tls.get_ref().1.peer_certificates().expect("a certificate")[0].clone()
    }
}

/// `GET /` over an established TLS connection, in the protocol ALPN chose; the status.
async fn get(tls: TlsStream<TcpStream>, host: &str) -> u16 {
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(tls);
    let req = Request::get(format!("https://{host}/"))
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = if h2 {
        let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .expect("h2 handshake");
        tokio::spawn(conn);
        within(send.send_request(req)).await.expect("h2 response")
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .expect("h1 handshake");
        tokio::spawn(conn);
        let mut req = req;
        req.headers_mut()
            .insert(http::header::HOST, host.parse().expect("host"));
        *req.uri_mut() = http::Uri::from_static("/");
        within(send.send_request(req)).await.expect("h1 response")
    };
    let status = resp.status().as_u16();
    resp.into_body().collect().await.expect("body");
    status
}

/// Three entries: `a` for a.example, `dflt` without names (the default, though not first),
/// `b` for *.b.example.
const THREE: &str = "tls = [\n\
    { cert = \"a.pem\", key = \"a.key\", server_names = [\"a.example\"] },\n\
    { cert = \"dflt.pem\", key = \"dflt.key\" },\n\
    { cert = \"b.pem\", key = \"b.key\", server_names = [\"*.b.example\"] },\n]";

#[tokio::test]
async fn sni_picks_the_exact_name_then_a_one_label_wildcard_else_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let a = cert(dir.path(), "a", &["a.example"]);
    let dflt = cert(dir.path(), "dflt", &["default.example"]);
    let b = cert(dir.path(), "b", &["*.b.example"]);
    let upstream = Upstream::start().await;
    let server = Server::start(write_config(dir.path(), THREE, upstream.addr), 2).unwrap();
    let addr = server.local_addrs()[0];
    let client = Client::any();

    assert_eq!(client.presented(addr, "a.example").await, a);
    assert_eq!(
        client.presented(addr, "A.Example").await,
        a,
        "SNI compares case-insensitively"
    );
    assert_eq!(client.presented(addr, "x.b.example").await, b);
    assert_eq!(client.presented(addr, "other.b.example").await, b);
    for unclaimed in ["unknown.example", "b.example", "y.x.b.example"] {
        assert_eq!(
            client.presented(addr, unclaimed).await,
            dflt,
            "{unclaimed} gets the default certificate"
        );
    }
    assert_eq!(
        client.presented(addr, "127.0.0.1").await,
        dflt,
        "a client sending no SNI gets the default certificate"
    );
}

#[tokio::test]
async fn without_an_unnamed_entry_the_first_entry_is_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let a = cert(dir.path(), "a", &["a.example"]);
    let b = cert(dir.path(), "b", &["b.example"]);
    let upstream = Upstream::start().await;
    // The `[[listeners.tls]]` form of the same list.
    let config = write_config(
        dir.path(),
        "[[listeners.tls]]\ncert = \"a.pem\"\nkey = \"a.key\"\nserver_names = [\"a.example\"]\n\
         [[listeners.tls]]\ncert = \"b.pem\"\nkey = \"b.key\"\nserver_names = [\"b.example\"]",
        upstream.addr,
    );
    let server = Server::start(config, 1).unwrap();
    let addr = server.local_addrs()[0];
    let client = Client::any();
    assert_eq!(client.presented(addr, "b.example").await, b);
    assert_eq!(client.presented(addr, "unknown.example").await, a);
    assert_eq!(client.presented(addr, "127.0.0.1").await, a);
}

#[tokio::test]
async fn http1_and_h2_are_negotiated_with_a_certificate_a_verifying_client_accepts() {
    let dir = tempfile::tempdir().unwrap();
    cert(dir.path(), "a", &["a.example"]);
    cert(dir.path(), "dflt", &["default.example"]);
    let b = cert(dir.path(), "b", &["*.b.example"]);
    let upstream = Upstream::start().await;
    let server = Server::start(write_config(dir.path(), THREE, upstream.addr), 2).unwrap();
    let addr = server.local_addrs()[0];
    for (alpn, expected) in [(&b"h2"[..], &b"h2"[..]), (b"http/1.1", b"http/1.1")] {
        let client = Client {
            trust: Some(b.clone()),
            alpn: vec![alpn.to_vec()],
            versions: rustls::DEFAULT_VERSIONS,
        };
        let tls = client.connect(addr, "x.b.example").await.expect("verified");
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(expected));
        assert_eq!(get(tls, "x.b.example").await, 200);
    }
    // The certificate for a.example is not trusted by this client: the wildcard entry was
    // not served for it.
    let strict = Client {
        trust: Some(b),
        alpn: Vec::new(),
        versions: rustls::DEFAULT_VERSIONS,
    };
    assert!(strict.connect(addr, "a.example").await.is_err());
    assert_eq!(upstream.requests(), 2);
}

const ONLY_TLS12: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS12];

#[tokio::test]
async fn tls_min_version_1_3_refuses_a_client_that_only_speaks_1_2() {
    let dir = tempfile::tempdir().unwrap();
    cert(dir.path(), "a", &["a.example"]);
    let upstream = Upstream::start().await;
    let only_12 = Client {
        trust: None,
        alpn: Vec::new(),
        versions: ONLY_TLS12,
    };
    let tls = "tls = { cert = \"a.pem\", key = \"a.key\" }";

    let server = Server::start(write_config(dir.path(), tls, upstream.addr), 1).unwrap();
    let addr = server.local_addrs()[0];
    let accepted = only_12
        .connect(addr, "a.example")
        .await
        .expect("1.2 by default");
    assert_eq!(
        accepted.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );

    let strict = format!("{tls}\ntls_min_version = \"1.3\"");
    server
        .reload(write_config(dir.path(), &strict, upstream.addr))
        .unwrap();
    assert!(only_12.connect(addr, "a.example").await.is_err());
    let modern = Client::any().connect(addr, "a.example").await.unwrap();
    assert_eq!(
        modern.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    assert_eq!(get(modern, "a.example").await, 200);
}

#[tokio::test]
async fn a_reload_serves_a_renewed_certificate_for_its_name_and_keeps_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let a1 = cert(dir.path(), "a", &["a.example"]);
    let dflt = cert(dir.path(), "dflt", &["default.example"]);
    let b = cert(dir.path(), "b", &["*.b.example"]);
    let upstream = Upstream::start().await;
    let server = Server::start(write_config(dir.path(), THREE, upstream.addr), 2).unwrap();
    let addr = server.local_addrs()[0];
    let client = Client::any();
    assert_eq!(client.presented(addr, "a.example").await, a1);

    // What SIGHUP does: load the file again and reload.
    let a2 = cert(dir.path(), "a", &["a.example"]);
    assert_ne!(a1, a2);
    server
        .reload(Config::load(&dir.path().join("gw.toml")).unwrap())
        .unwrap();
    assert_eq!(server.local_addrs(), vec![addr]);
    assert_eq!(client.presented(addr, "a.example").await, a2);
    assert_eq!(client.presented(addr, "x.b.example").await, b);
    assert_eq!(client.presented(addr, "127.0.0.1").await, dflt);

    // A renewal that breaks the config (a key that is not the certificate's) changes
    // nothing: the old certificates stay served.
    std::fs::copy(dir.path().join("b.key"), dir.path().join("a.key")).unwrap();
    let err = Config::load(&dir.path().join("gw.toml")).unwrap_err();
    assert!(
        err.to_string().contains("certificate and key do not fit"),
        "{err}"
    );
    assert_eq!(client.presented(addr, "a.example").await, a2);
}

#[test]
fn config_errors_name_the_entry_and_the_server_name() {
    let dir = tempfile::tempdir().unwrap();
    cert(dir.path(), "a", &["a.example", "*.b.example"]);
    cert(dir.path(), "c", &["c.example"]);
    let text = r#"[[listeners]]
address = "127.0.0.1:0"
tls = [
  { cert = "a.pem", key = "a.key", server_names = ["a.example", "*.b.example"] },
  { cert = "c.pem", key = "c.key", server_names = ["A.EXAMPLE", "a..example", "*.c.example"] },
  { cert = "c.pem", key = "c.key" },
  { cert = "a.pem", key = "a.key" },
  { cert = "c.pem", key = "a.key", server_names = ["c.example", "*.com", "10.0.0.1"] },
]
tls_min_version = "1.3"

[[listeners]]
address = "127.0.0.1:1"
tls_min_version = "1.3"
"#;
    let errs = crate::support::config_errors_in(dir.path(), text);
    let expected = [
        "gw.toml:5:52: listeners[0].tls[1].server_names[0]: the certificate is not valid for \
         `a.example`; its DNS names are: c.example",
        "gw.toml:5:52: listeners[0].tls[1].server_names[0]: `A.EXAMPLE` is claimed twice on \
         this listener (names compare case-insensitively): listeners[0].tls[0] lists it too",
        "gw.toml:5:65: listeners[0].tls[1].server_names[1]: `a..example` is not a DNS name",
        "gw.toml:5:79: listeners[0].tls[1].server_names[2]: the certificate is not valid for \
         `*.c.example`; its DNS names are: c.example",
        "gw.toml:7:12: listeners[0].tls[3]: a second entry without `server_names`: only one \
         entry can be the default certificate, and listeners[0].tls[2] already is",
        "gw.toml:8:65: listeners[0].tls[4].server_names[1]: `*.com` would stand for every \
         name under a top-level domain; a wildcard needs at least two labels after `*.`",
        "gw.toml:8:74: listeners[0].tls[4].server_names[2]: `10.0.0.1` is an IP address; SNI \
         carries DNS names only (a client connecting to an address gets the default \
         certificate)",
        "gw.toml:14:19: listeners[1].tls_min_version: needs `tls`: a plain listener has no \
         TLS version",
    ];
    for e in expected {
        assert!(
            errs.iter().any(|got| got == e),
            "missing {e:?} in {errs:#?}"
        );
    }
    assert!(
        errs.iter().any(|e| e.starts_with(
            "gw.toml:8:12: listeners[0].tls[4]: tls: certificate and key do not fit: "
        )),
        "{errs:#?}"
    );
    assert_eq!(errs.len(), expected.len() + 1, "{errs:#?}");
}

#[test]
fn config_errors_in_the_form_of_tls_have_positions() {
    let dir = tempfile::tempdir().unwrap();
    // A listener that does not deserialize is reported at the offending value under the
    // listener's name, as for any other field of it (and then counts as missing).
    let cases = [
        (
            "tls = []",
            "gw.toml:3:7: listeners[0]: invalid length 0, expected at least one certificate",
        ),
        (
            "tls = [{ cert = \"a.pem\", key = \"a.key\", names = [\"a.example\"] }]",
            "gw.toml:3:41: listeners[0]: unknown field `names`, expected one of `cert`, `key`, \
             `server_names`",
        ),
        (
            "tls = \"a.pem\"",
            "gw.toml:3:7: listeners[0]: invalid type: string \"a.pem\", expected a table \
             `{ cert, key }` or a list of them `[{ cert, key, server_names }, ...]`",
        ),
        (
            "tls = { cert = \"a.pem\", key = \"a.key\" }\ntls_min_version = \"1.1\"",
            "gw.toml:4:19: listeners[0]: unknown variant `1.1`, expected `1.2` or `1.3`",
        ),
    ];
    for (fields, expected) in cases {
        let text = format!("[[listeners]]\naddress = \"127.0.0.1:0\"\n{fields}\n");
        let errs = crate::support::config_errors_in(dir.path(), &text);
        assert!(
            errs.iter().any(|e| e == expected),
            "missing {expected:?} in {errs:#?}"
        );
    }
}

//! TLS to a real etcd serving clients over TLS (`--cert-file`, `--key-file`) and requiring
//! client certificates (`--client-cert-auth --trusted-ca-file`): calls over mutual TLS, and
//! each refusal told apart (no client certificate, a client certificate etcd does not
//! trust, a server certificate the client does not trust); an https endpoint without TLS.

use std::time::Duration;

use tailguard_etcd::{Client, ConnectOptions, Error, Refusal, Tls};
use tailguard_test_support::TestCa;
use tailguard_test_support::etcd::{EtcdPki, EtcdServer};

async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("etcd answered within 20 s")
}

fn read(path: &std::path::Path) -> Vec<u8> {
    std::fs::read(path).expect("read pem")
}

/// TLS trusting the etcd's CA, with its client certificate.
fn mutual(pki: &EtcdPki) -> Tls {
    Tls::system_roots()
        .with_ca_pem(&read(&pki.ca))
        .expect("ca")
        .with_client_cert_pem(&read(&pki.client_cert), &read(&pki.client_key))
        .expect("client cert")
}

async fn client(url: &str, tls: Tls) -> Client {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_tls(tls);
    Client::connect(&[url], &options).await.expect("client")
}

async fn refusal(url: &str, tls: Tls) -> (Refusal, String) {
    let e = bounded(client(url, tls).await.get("/k"))
        .await
        .expect_err("refused");
    (
        e.refusal().unwrap_or_else(|| panic!("not a refusal: {e}")),
        e.to_string(),
    )
}

#[tokio::test]
async fn calls_go_over_mutual_tls_and_each_refusal_names_its_cause() {
    let Some(etcd) = EtcdServer::builder().client_cert_auth().start() else {
        return;
    };
    let pki = etcd.pki().expect("tls").clone();
    let url = etcd.url();
    assert!(url.starts_with("https://"), "{url}");

    let mut c = client(&url, mutual(&pki)).await;
    let revision = bounded(c.put("/k", "v")).await.expect("put").revision();
    let kv = bounded(c.get("/k"))
        .await
        .expect("get")
        .into_first()
        .expect("key");
    assert_eq!(
        (kv.value.as_slice(), kv.mod_revision),
        (&b"v"[..], revision)
    );
    // A bare host:port is https:// once TLS is configured.
    let mut bare = client(&format!("127.0.0.1:{}", etcd.client_port), mutual(&pki)).await;
    assert!(bounded(bare.get("/k")).await.is_ok());

    // No client certificate.
    let ca_only = Tls::system_roots().with_ca_pem(&read(&pki.ca)).expect("ca");
    let (r, text) = refusal(&url, ca_only.clone()).await;
    assert_eq!(r, Refusal::ClientCertificateRequired, "{text}");
    assert!(text.contains("requires a client certificate"), "{text}");

    // A client certificate from a CA etcd does not trust.
    let stranger = TestCa::new("stranger").issue(&["tailguard-client"]);
    let foreign = ca_only
        .with_client_cert_pem(stranger.cert_pem.as_bytes(), stranger.key_pem.as_bytes())
        .expect("client cert");
    let (r, text) = refusal(&url, foreign).await;
    assert_eq!(r, Refusal::ClientCertificateRejected, "{text}");

    // The server's certificate checked against an unrelated CA, then the system's roots.
    let other = TestCa::new("other");
    let wrong_ca = Tls::system_roots()
        .with_ca_pem(other.cert_pem.as_bytes())
        .expect("ca")
        .with_client_cert_pem(&read(&pki.client_cert), &read(&pki.client_key))
        .expect("client cert");
    let (r, text) = refusal(&url, wrong_ca).await;
    assert_eq!(r, Refusal::UntrustedServer, "{text}");
    assert!(text.contains("not trusted by the configured CA"), "{text}");
    let system = Tls::system_roots()
        .with_client_cert_pem(&read(&pki.client_cert), &read(&pki.client_key))
        .expect("client cert");
    let (r, text) = refusal(&url, system).await;
    assert_eq!(r, Refusal::UntrustedServerSystemRoots, "{text}");
}

#[tokio::test]
async fn https_to_a_plain_etcd_fails_its_handshake_and_http_with_tls_settings_is_an_error() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let https = format!("https://127.0.0.1:{}", etcd.client_port);
    let e = bounded(client(&https, Tls::system_roots()).await.get("/k"))
        .await
        .expect_err("no TLS there");
    // Not a refusal: a server that closes during the handshake may be restarting. A plain
    // etcd answers a ClientHello with a close or, at times, a reset: either is a transport
    // failure of the connection, never a named cause.
    assert_eq!(e.refusal(), None, "{e}");
    let text = e.to_string();
    assert!(
        text.contains("tls handshake") || text.contains("Connection reset by peer"),
        "{e}"
    );

    let options = ConnectOptions::new().with_tls(Tls::system_roots());
    let e = Client::connect(&[etcd.url()], &options)
        .await
        .expect_err("http with tls");
    assert!(matches!(e, Error::Endpoint { .. }), "{e}");
    assert!(e.to_string().contains("use https://"), "{e}");
}

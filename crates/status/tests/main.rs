//! The status page and its JSON against a real gateway: servers on 127.0.0.1:0, upstreams
//! that fail their checks, the metrics exporter serving the page, a real HTTP client, and
//! the JSON checked by an independent validator (Python's `jsonschema`). The browser tests
//! are the binary's (`crates/tailguard/tests/status.rs`).

mod page;
mod schema;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tailguard_metrics::{Exporter, ExporterConfig, Page, Pages};
use tailguard_proxy::{Config, GatewayMetrics, Server};
use tailguard_status::{Info, StatusPage};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Every wait for a state to show gives up after this long: checks run every 20 ms and the
/// page ticks every second, so only a broken page gets near it.
pub(crate) const PATIENCE: Duration = Duration::from_secs(15);

/// A gateway with its exporter serving the status page.
pub(crate) struct Harness {
    pub(crate) server: Server,
    pub(crate) exporter: Exporter,
    /// Held so the page outlives the test (the exporter holds it too).
    pub(crate) _page: Arc<StatusPage>,
}

impl Harness {
    /// Starts `config` (a listener on 127.0.0.1:0 is added) with the exporter on 127.0.0.1:0.
    pub(crate) fn start(rest: &str, dir: &std::path::Path) -> Harness {
        let text = format!("[[listeners]]\naddress = \"127.0.0.1:0\"\n\n{rest}");
        let config = Config::parse(&text, "gw.toml", dir).expect("a valid config");
        let registry = tailguard_metrics::Registry::new();
        let metrics = GatewayMetrics::register(&registry).expect("metrics register");
        let access = config.status.access().expect("status access loads");
        let page = StatusPage::new(
            registry.clone(),
            Info {
                version: "test".into(),
                threads: 2,
                started: Instant::now(),
            },
            access,
        );
        let exporter = Exporter::spawn(
            registry,
            ExporterConfig {
                listen: ([127, 0, 0, 1], 0).into(),
                pages: Pages(vec![Arc::clone(&page) as Arc<dyn Page>]),
                ..ExporterConfig::default()
            },
        )
        .expect("exporter starts");
        let server = Server::start_with_metrics(config, metrics, 2).expect("gateway starts");
        page.attach(server.gateway());
        Harness {
            server,
            exporter,
            _page: page,
        }
    }

    pub(crate) fn gateway_addr(&self) -> SocketAddr {
        self.server.local_addrs()[0]
    }

    /// GET `path` from the exporter with `headers`; (status, headers, body).
    pub(crate) async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        request(self.exporter.local_addr(), path, headers).await
    }

    /// `/status.json`, parsed (no credentials).
    pub(crate) async fn json(&self, headers: &[(&str, &str)]) -> serde_json::Value {
        let r = self.get("/status.json", headers).await;
        assert_eq!(r.status, 200, "{}", r.body);
        serde_json::from_str(&r.body).expect("the document is JSON")
    }
}

/// A response read whole.
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) head: String,
    pub(crate) body: String,
}

/// One HTTP/1.1 GET over a fresh connection (`Connection: close`, read to the end).
pub(crate) async fn request(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut raw))
        .await
        .expect("an answer within 30 s")
        .expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a head");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    // hyper answers a body of known length with Content-Length: no chunked framing to undo.
    Response {
        status,
        head: head.to_ascii_lowercase(),
        body: body.to_owned(),
    }
}

/// Waits until `f` holds for the status document (at most [`PATIENCE`]).
pub(crate) async fn wait_for(
    h: &Harness,
    what: &str,
    headers: &[(&str, &str)],
    f: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let doc = h.json(headers).await;
        if f(&doc) {
            return doc;
        }
        assert!(start.elapsed() < PATIENCE, "never saw {what}:\n{doc:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

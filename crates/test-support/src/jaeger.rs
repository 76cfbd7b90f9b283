//! A real Jaeger v2 (the OpenTelemetry collector the tracing tests export to) on free
//! 127.0.0.1 ports, and a client for its query API that returns the spans it stored.
//!
//! Jaeger is built from the Go module proxy into `$HOME/go/bin/jaeger` by
//! `scripts/install-tools` (issue 24). [`Jaeger::start`] runs it with its own all-in-one
//! defaults (memory storage, the `batch` processor, OTLP over gRPC and HTTP, the query
//! service), written out as a config file whose only changes are the addresses: every
//! listener on a free port of its own ([`crate::free_port`]), so several tests run their own
//! Jaeger at once, and the receivers, extensions and telemetry endpoints it does not need
//! (Jaeger's and Zipkin's own protocols, remote sampling, the collector's own metrics on the
//! fixed port 8888) left out.
//!
//! Without the binary [`Jaeger::start`] fails the test, unless `TAILGUARD_SKIP_JAEGER_TESTS=1`
//! says skipping is allowed (CI installs Jaeger, so there the tests always run).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::free_port;

/// How long [`Jaeger::start`] waits for Jaeger to report itself healthy. It reads no data
/// at startup (memory storage), so it is up within a second or two even on a busy machine.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running Jaeger, killed (and its directory removed) on drop.
#[derive(Debug)]
pub struct Jaeger {
    child: Option<Child>,
    dir: PathBuf,
    /// OTLP over gRPC (`receivers.otlp.protocols.grpc`; Jaeger's default 4317).
    pub otlp_grpc: SocketAddr,
    /// OTLP over HTTP (`/v1/traces`; Jaeger's default 4318).
    pub otlp_http: SocketAddr,
    /// The query service's HTTP API and UI (Jaeger's default 16686).
    pub query: SocketAddr,
    /// The `healthcheckv2` extension's HTTP endpoint (Jaeger's default 13133).
    pub health: SocketAddr,
}

/// One trace as Jaeger's query API returns it (`GET /api/traces/{id}`).
#[derive(Debug, Clone)]
pub struct Trace {
    /// 32 lowercase hex digits (Jaeger drops leading zeros; they are put back here).
    pub trace_id: String,
    /// Every span Jaeger has of the trace, in the order it returned them.
    pub spans: Vec<Span>,
}

/// One span of a [`Trace`], with its process's service name and attributes flattened in.
#[derive(Debug, Clone)]
pub struct Span {
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// 16 lowercase hex digits.
    pub span_id: String,
    /// The span's `CHILD_OF` parent (16 hex digits), whether or not Jaeger has that span.
    pub parent_span_id: Option<String>,
    /// The span's name.
    pub name: String,
    /// `server`, `client`, `internal`, `producer` or `consumer` (Jaeger's `span.kind` tag).
    pub kind: Option<String>,
    /// The `service.name` of the resource that sent it.
    pub service: String,
    /// Start, microseconds since the Unix epoch.
    pub start_us: u64,
    /// Duration in microseconds.
    pub duration_us: u64,
    /// The span's attributes (and the tags Jaeger derives: `span.kind`, `otel.status_code`,
    /// `error`, `otel.scope.name`), by key, with their JSON values.
    pub tags: BTreeMap<String, serde_json::Value>,
    /// The resource's attributes (`service.instance.id`, `host.name` ...), by key.
    pub process_tags: BTreeMap<String, serde_json::Value>,
}

impl Span {
    /// The tag `key` as text: a string tag as is, any other value in its JSON form.
    pub fn tag(&self, key: &str) -> Option<String> {
        self.tags.get(key).map(|v| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }
}

impl Trace {
    /// The spans of `kind` (`server`, `client`), in start order.
    pub fn spans_of_kind(&self, kind: &str) -> Vec<&Span> {
        let mut spans: Vec<&Span> = self
            .spans
            .iter()
            .filter(|s| s.kind.as_deref() == Some(kind))
            .collect();
        spans.sort_by_key(|s| s.start_us);
        spans
    }

    /// The span with id `span_id`.
    pub fn span(&self, span_id: &str) -> Option<&Span> {
        self.spans.iter().find(|s| s.span_id == span_id)
    }
}

/// Where `scripts/install-tools` puts the binary, or `jaeger` on `PATH`.
fn binary() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join("go/bin/jaeger"));
    if let Some(home) = home.filter(|p| p.is_file()) {
        return Some(home);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("jaeger"))
        .find(|p| p.is_file())
}

impl Jaeger {
    /// Starts Jaeger and waits until its health check says it is ready and its query API
    /// answers, or returns `None` when it is not installed and skipping is allowed.
    pub async fn start() -> Option<Jaeger> {
        let Some(exe) = binary() else {
            assert!(
                std::env::var("TAILGUARD_SKIP_JAEGER_TESTS").as_deref() == Ok("1"),
                "jaeger is not installed ($HOME/go/bin/jaeger): run scripts/install-tools, \
                 or set TAILGUARD_SKIP_JAEGER_TESTS=1 to skip the tests that need it"
            );
            eprintln!(
                "!!! jaeger not installed and TAILGUARD_SKIP_JAEGER_TESTS=1: SKIPPING a test \
                 that exports traces to a real collector !!!"
            );
            return None;
        };
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tailguard-jaeger-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("jaeger temp dir");
        let at = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        let mut jaeger = Jaeger {
            child: None,
            dir,
            otlp_grpc: at(free_port()),
            otlp_http: at(free_port()),
            query: at(free_port()),
            health: at(free_port()),
        };
        let config = jaeger.dir.join("config.yaml");
        std::fs::write(&config, jaeger.config()).expect("write jaeger's config");
        let log = std::fs::File::create(jaeger.dir.join("jaeger.log")).expect("jaeger log");
        let child = Command::new(exe)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn jaeger");
        jaeger.child = Some(child);
        jaeger.wait_ready().await;
        Some(jaeger)
    }

    /// Jaeger's all-in-one config (`cmd/jaeger/internal/all-in-one.yaml`) with this
    /// instance's addresses, and only the parts a test talks to.
    fn config(&self) -> String {
        format!(
            "service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    resource:
      service.name: jaeger
    metrics:
      level: none
    logs:
      level: info

extensions:
  jaeger_query:
    storage:
      traces: some_storage
    # The query service would trace its own calls; the tests read only what they sent.
    enable_tracing: false
    http:
      endpoint: \"{query}\"
    grpc:
      endpoint: \"127.0.0.1:{query_grpc}\"
  jaeger_storage:
    backends:
      some_storage:
        memory:
          max_traces: 100000
  healthcheckv2:
    use_v2: true
    http:
      endpoint: \"{health}\"

receivers:
  otlp:
    protocols:
      grpc:
        endpoint: \"{grpc}\"
      http:
        endpoint: \"{http}\"

processors:
  batch:

exporters:
  jaeger_storage_exporter:
    trace_storage: some_storage
",
            query = self.query,
            query_grpc = free_port(),
            health = self.health,
            grpc = self.otlp_grpc,
            http = self.otlp_http,
        )
    }

    async fn wait_ready(&mut self) {
        let start = Instant::now();
        loop {
            // healthcheckv2 answers 200 on /status once every pipeline component started;
            // the query service's API is an extension of its own, so ask it too.
            let healthy = get(self.health, "/status")
                .await
                .is_ok_and(|(s, _)| s == 200)
                && get(self.query, "/api/services")
                    .await
                    .is_ok_and(|(s, _)| s == 200);
            if healthy {
                return;
            }
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "jaeger exited ({status}) before it was ready:\n{}",
                    self.log()
                );
            }
            assert!(
                start.elapsed() < START_TIMEOUT,
                "jaeger did not become ready within {START_TIMEOUT:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `http://127.0.0.1:PORT`: the OTLP/HTTP endpoint (the exporter appends `/v1/traces`).
    pub fn otlp_http_url(&self) -> String {
        format!("http://{}", self.otlp_http)
    }

    /// `http://127.0.0.1:PORT`: the OTLP/gRPC endpoint.
    pub fn otlp_grpc_url(&self) -> String {
        format!("http://{}", self.otlp_grpc)
    }

    /// The trace `trace_id` (hex), or `None` while Jaeger has no span of it.
    pub async fn trace(&self, trace_id: &str) -> Option<Trace> {
        let (status, body) = get(self.query, &format!("/api/traces/{trace_id}"))
            .await
            .unwrap_or_else(|e| panic!("jaeger's query API: {e}\n{}", self.log()));
        if status == 404 {
            return None;
        }
        assert_eq!(status, 200, "GET /api/traces/{trace_id}: {body}");
        let mut traces = parse_traces(&body);
        assert!(traces.len() <= 1, "one id, one trace: {body}");
        traces.pop()
    }

    /// Waits (at most `timeout`) until Jaeger has the trace `trace_id` and `done` holds for
    /// it (e.g. it has three spans): exporters batch, and Jaeger's own `batch` processor
    /// stores a span up to 200 ms after it arrived. Panics with the last state seen.
    pub async fn wait_trace(
        &self,
        trace_id: &str,
        timeout: Duration,
        done: impl Fn(&Trace) -> bool,
    ) -> Trace {
        let start = Instant::now();
        loop {
            let trace = self.trace(trace_id).await;
            if let Some(trace) = &trace
                && done(trace)
            {
                return trace.clone();
            }
            assert!(
                start.elapsed() < timeout,
                "trace {trace_id} not complete in jaeger within {timeout:?}; last seen: {trace:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The traces of `service` Jaeger has (its search API: at most `limit`, newest first).
    pub async fn traces(&self, service: &str, limit: usize) -> Vec<Trace> {
        let (status, body) = get(
            self.query,
            &format!("/api/traces?service={service}&limit={limit}&lookback=1h"),
        )
        .await
        .unwrap_or_else(|e| panic!("jaeger's query API: {e}\n{}", self.log()));
        assert_eq!(status, 200, "GET /api/traces?service={service}: {body}");
        parse_traces(&body)
    }

    /// The service names Jaeger has spans of.
    pub async fn services(&self) -> Vec<String> {
        let (status, body) = get(self.query, "/api/services")
            .await
            .unwrap_or_else(|e| panic!("jaeger's query API: {e}\n{}", self.log()));
        assert_eq!(status, 200, "GET /api/services: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("services JSON");
        v["data"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The process id (to watch it, or to stop it with a signal).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops Jaeger (SIGKILL): a collector that went away.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// What Jaeger has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("jaeger.log")).unwrap_or_default()
    }
}

impl Drop for Jaeger {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Jaeger's trace JSON (`{"data": [{"traceID", "spans": [...], "processes": {...}}]}`) as
/// [`Trace`]s.
fn parse_traces(body: &str) -> Vec<Trace> {
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("jaeger's JSON: {e}: {body}"));
    let Some(data) = v["data"].as_array() else {
        return Vec::new();
    };
    data.iter()
        .map(|t| {
            let processes = &t["processes"];
            let spans = t["spans"]
                .as_array()
                .map(|spans| spans.iter().map(|s| parse_span(s, processes)).collect())
                .unwrap_or_default();
            Trace {
                trace_id: pad(t["traceID"].as_str().unwrap_or_default(), 32),
                spans,
            }
        })
        .collect()
}

fn parse_span(s: &serde_json::Value, processes: &serde_json::Value) -> Span {
    let tags = key_values(&s["tags"]);
    let process = &processes[s["processID"].as_str().unwrap_or_default()];
    let parent = s["references"].as_array().and_then(|refs| {
        refs.iter()
            .find(|r| r["refType"] == "CHILD_OF")
            .and_then(|r| r["spanID"].as_str())
            .map(|id| pad(id, 16))
    });
    Span {
        trace_id: pad(s["traceID"].as_str().unwrap_or_default(), 32),
        span_id: pad(s["spanID"].as_str().unwrap_or_default(), 16),
        parent_span_id: parent,
        name: s["operationName"].as_str().unwrap_or_default().to_owned(),
        kind: tags
            .get("span.kind")
            .and_then(|k| k.as_str())
            .map(str::to_owned),
        service: process["serviceName"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        start_us: s["startTime"].as_u64().unwrap_or_default(),
        duration_us: s["duration"].as_u64().unwrap_or_default(),
        tags,
        process_tags: key_values(&process["tags"]),
    }
}

/// Jaeger's `[{"key", "type", "value"}]` as a map.
fn key_values(list: &serde_json::Value) -> BTreeMap<String, serde_json::Value> {
    list.as_array()
        .map(|kvs| {
            kvs.iter()
                .filter_map(|kv| Some((kv["key"].as_str()?.to_owned(), kv["value"].clone())))
                .collect()
        })
        .unwrap_or_default()
}

/// Jaeger prints ids without their leading zeros; W3C and the gateway print all of them.
fn pad(id: &str, width: usize) -> String {
    format!("{:0>width$}", id.to_ascii_lowercase())
}

/// `GET path` over a fresh connection: the status and the body.
pub async fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    request(addr, "GET", path, "", b"").await
}

/// `POST path` with `body` of `content_type` over a fresh connection: the status and the
/// body (e.g. an OTLP/JSON export to [`Jaeger::otlp_http`]'s `/v1/traces`).
pub async fn post(
    addr: SocketAddr,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    request(addr, "POST", path, content_type, body).await
}

/// One HTTP/1.0 exchange (the server closes after the answer, so the body is what follows
/// the head up to the close: no chunked framing to undo), bounded by 10 s.
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let mut head = format!("{method} {path} HTTP/1.0\r\nHost: {addr}\r\n");
        if !content_type.is_empty() {
            head.push_str(&format!("Content-Type: {content_type}\r\n"));
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| std::io::Error::other(format!("no response head: {text:?}")))?;
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no status: {head:?}")))?;
        Ok((status, body.to_owned()))
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| std::io::Error::other(format!("{method} {path}: no answer within 10 s")))?
}

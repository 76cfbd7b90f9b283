//! The collector a scenario's traced conditions export to: Jaeger v2 as a child process, with
//! its all-in-one defaults (memory storage, the `batch` processor, OTLP over gRPC and HTTP)
//! on free ports, started once for the run.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::LabError;
use crate::procs::{ChildGuard, pinned_command, to_file, which};

/// Where the gateway sends spans: what `{otlp_http}`, `{otlp_grpc}` and `{collector_down}`
/// stand for in a condition's `config`.
#[derive(Debug, Clone)]
pub(crate) struct Endpoints {
    /// `http://127.0.0.1:PORT`, OTLP over HTTP.
    pub(crate) otlp_http: String,
    /// `http://127.0.0.1:PORT`, OTLP over gRPC.
    pub(crate) otlp_grpc: String,
    /// `http://127.0.0.1:PORT` where nothing listens: a collector that is down.
    pub(crate) down: String,
    /// The query API (for the summary: which services sent spans).
    pub(crate) query: SocketAddr,
}

impl Endpoints {
    /// `text` with the endpoints in place of their placeholders.
    pub(crate) fn expand(&self, text: &str) -> String {
        text.replace("{otlp_http}", &self.otlp_http)
            .replace("{otlp_grpc}", &self.otlp_grpc)
            .replace("{collector_down}", &self.down)
    }

    /// The service names Jaeger has spans of (its `/api/services` answer), or why not.
    pub(crate) fn services(&self) -> String {
        match get(self.query, "/api/services") {
            Ok((200, body)) => body,
            Ok((status, body)) => format!("status {status}: {body}"),
            Err(e) => e.to_string(),
        }
    }
}

/// A port that is free now. The lab's other children bind `:0` the same way: the kernel does
/// not hand a just-released port out again at once.
fn free_port() -> Result<u16, LabError> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The `jaeger` to run: the scenario's, else `$HOME/go/bin/jaeger`, else `jaeger` on `PATH`.
fn executable(configured: Option<&Path>) -> Result<PathBuf, LabError> {
    let home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join("go/bin/jaeger"));
    configured
        .map(Path::to_path_buf)
        .or_else(|| home.filter(|p| p.is_file()))
        .or_else(|| which("jaeger"))
        .filter(|p| p.is_file())
        .ok_or_else(|| LabError::Child {
            name: "collector".into(),
            why: "jaeger is not installed ($HOME/go/bin/jaeger): run scripts/install-tools".into(),
        })
}

/// Starts Jaeger pinned to `cpus` and waits (at most 60 s) until it is ready.
pub(crate) fn start(
    configured: Option<&Path>,
    out: &Path,
    cpus: &[usize],
    nice: Option<i32>,
) -> Result<(ChildGuard, Endpoints), LabError> {
    let exe = executable(configured)?;
    let (grpc, http, query, query_grpc, health) = (
        free_port()?,
        free_port()?,
        free_port()?,
        free_port()?,
        free_port()?,
    );
    let config = out.join("jaeger.yaml");
    std::fs::write(&config, config_yaml(grpc, http, query, query_grpc, health))?;
    let (mut cmd, _) = pinned_command(&exe, cpus, nice);
    cmd.arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(to_file(&out.join("jaeger.log"))?);
    let mut child = ChildGuard::spawn("collector", &mut cmd)?;
    let health = SocketAddr::from(([127, 0, 0, 1], health));
    let query = SocketAddr::from(([127, 0, 0, 1], query));
    let start = Instant::now();
    // healthcheckv2 answers 200 on /status once every pipeline component runs; the query API
    // is an extension of its own.
    while !(get(health, "/status").is_ok_and(|(s, _)| s == 200)
        && get(query, "/api/services").is_ok_and(|(s, _)| s == 200))
    {
        if let Some(status) = child.exited() {
            return Err(LabError::Child {
                name: "collector".into(),
                why: format!(
                    "jaeger exited ({status}); see {}",
                    out.join("jaeger.log").display()
                ),
            });
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err(LabError::Child {
                name: "collector".into(),
                why: "jaeger not ready within 60 s".into(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let endpoints = Endpoints {
        otlp_http: format!("http://127.0.0.1:{http}"),
        otlp_grpc: format!("http://127.0.0.1:{grpc}"),
        down: format!("http://127.0.0.1:{}", free_port()?),
        query,
    };
    println!(
        "  collector: jaeger ({}) on OTLP/gRPC {}, OTLP/HTTP {}",
        exe.display(),
        endpoints.otlp_grpc,
        endpoints.otlp_http
    );
    Ok((child, endpoints))
}

/// Jaeger's all-in-one config (`cmd/jaeger/internal/all-in-one.yaml`) on these ports, with
/// what the lab does not use left out (Jaeger's and Zipkin's receivers, remote sampling, and
/// the collector's own metrics, which would take the fixed port 8888).
fn config_yaml(grpc: u16, http: u16, query: u16, query_grpc: u16, health: u16) -> String {
    format!(
        "service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
extensions:
  jaeger_query:
    storage:
      traces: some_storage
    enable_tracing: false
    http:
      endpoint: \"127.0.0.1:{query}\"
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
      endpoint: \"127.0.0.1:{health}\"
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: \"127.0.0.1:{grpc}\"
      http:
        endpoint: \"127.0.0.1:{http}\"
processors:
  batch:
exporters:
  jaeger_storage_exporter:
    trace_storage: some_storage
"
    )
}

/// One HTTP/1.0 `GET` (the answer ends at the close): status and body.
fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line: {head:?}")))?;
    Ok((status, body.to_string()))
}

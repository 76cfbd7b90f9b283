//! The axum example's app (`examples/axum/app.rs`, the same file) served on 127.0.0.1:0 with
//! real log files: after a graceful shutdown and the writers' shutdown, lines written ==
//! requests answered, in both logs, with what each request was.

#[path = "../examples/axum/app.rs"]
mod app;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;

use tailguard_access_log::{AccessLog, Config, FormatName, Output};

/// Sends one request on its own connection and reads the whole response.
fn request(addr: SocketAddr, method: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: t\r\nuser-agent: probe/1.0\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// A log whose flush interval outlasts the test: its lines reach the file through the
/// shutdown's drain, not a timer.
fn config(path: &Path, format: Option<FormatName>) -> Config {
    Config {
        path: Output::File(path.to_owned()),
        format,
        flush_ms: 3_600_000,
        ..Config::default()
    }
}

#[test]
fn example_app_writes_one_line_per_request_by_graceful_shutdown() {
    const N: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let (access_path, audit_path) = (dir.path().join("access.log"), dir.path().join("audit.log"));
    let (access, access_writer) = AccessLog::start(&config(&access_path, None)).unwrap();
    let (audit, audit_writer) =
        AccessLog::start(&config(&audit_path, Some(FormatName::Json))).unwrap();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = runtime.spawn(
        axum::serve(
            listener,
            app::app(access, audit).into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async {
            let _ = stopped.await;
        })
        .into_future(),
    );

    for id in 0..N {
        let res = request(addr, "GET", &format!("/users/{id}?x=1"));
        assert!(res.starts_with("HTTP/1.1 200"), "{res}");
    }
    assert!(request(addr, "GET", "/nowhere").starts_with("HTTP/1.1 404"));
    assert!(request(addr, "POST", "/admin/reload").starts_with("HTTP/1.1 200"));

    // The example's order: the server drains, then each log writes, fsyncs and stops.
    stop.send(()).unwrap();
    runtime.block_on(server).unwrap().unwrap();
    let access_stats = access_writer.shutdown();
    let audit_stats = audit_writer.shutdown();

    let access_text = std::fs::read_to_string(&access_path).unwrap();
    let lines: Vec<&str> = access_text.lines().collect();
    assert_eq!(lines.len(), N + 2, "{access_text}");
    assert_eq!(access_stats.lines_written, (N + 2) as u64);
    assert_eq!(access_stats.dropped_lines, 0);
    // One line per request, in no particular order: each serving thread has its own
    // buffer, and the writer writes the buffers as they come.
    let mut expected: Vec<String> = (0..N)
        .map(|id| {
            let body = format!("user {id}\n").len();
            format!("\"GET /users/{id}?x=1 HTTP/1.1\" 200 {body} \"-\" \"probe/1.0\"")
        })
        .collect();
    expected.push("\"GET /nowhere HTTP/1.1\" 404 0 \"-\" \"probe/1.0\"".to_owned());
    expected.push("\"POST /admin/reload HTTP/1.1\" 200 9 \"-\" \"probe/1.0\"".to_owned());
    for want in &expected {
        let found: Vec<&&str> = lines
            .iter()
            .filter(|l| l.ends_with(want.as_str()))
            .collect();
        assert_eq!(found.len(), 1, "{want:?} in\n{access_text}");
        assert!(found[0].starts_with("127.0.0.1 - - ["), "{}", found[0]);
    }

    let audit_text = std::fs::read_to_string(&audit_path).unwrap();
    assert_eq!(audit_stats.lines_written, 1, "{audit_text}");
    let audit: serde_json::Value = serde_json::from_str(audit_text.trim_end()).unwrap();
    assert_eq!(audit["request_method"], "POST", "{audit}");
    assert_eq!(audit["request_uri"], "/admin/reload", "{audit}");
    assert_eq!(audit["status"], 200, "{audit}");
    assert_eq!(audit["remote_addr"], "127.0.0.1", "{audit}");
}

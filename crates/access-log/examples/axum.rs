//! tailguard-access-log in an axum 0.8 app: lines formatted into per-thread buffers on the
//! serving threads, written by the writer thread; on Ctrl-C the server drains, then the log
//! is flushed and fsynced, so lines written == requests answered.
//!
//! ```text
//! cargo run -p tailguard-access-log --example axum [APP_ADDR [LOG_DIR]]
//! curl http://<app>/users/7; tail -f <dir>/access.log
//! ```
//!
//! The app listens on `127.0.0.1:0` (a free port) unless told otherwise and prints where;
//! the logs go to `access.log` (nginx `combined`) and `audit.log` (JSON lines) in `LOG_DIR`
//! (default: the system's temporary directory).

#[path = "axum/app.rs"]
mod app;

use std::error::Error;
use std::net::SocketAddr;
use std::path::PathBuf;

use tailguard_access_log::{AccessLog, Config, FormatName};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let app_addr = args.next().unwrap_or_else(|| "127.0.0.1:0".into());
    let dir = args.next().map_or_else(std::env::temp_dir, PathBuf::from);
    let access_path = dir.join("access.log");
    let audit_path = dir.join("audit.log");

    // Each log starts its own writer thread; `AccessLog` is the cheap handle the layers
    // hold, `Writer` the control handle that flushes and stops it.
    let (access, access_writer) = AccessLog::start(&Config::to(&access_path.to_string_lossy()))?;
    let (audit, audit_writer) = AccessLog::start(&Config {
        format: Some(FormatName::Json),
        ..Config::to(&audit_path.to_string_lossy())
    })?;

    let listener = tokio::net::TcpListener::bind(&app_addr).await?;
    println!("app listening on http://{}", listener.local_addr()?);
    println!("access log: {}", access_path.display());
    println!("audit log: {}", audit_path.display());
    axum::serve(
        listener,
        app::app(access, audit).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    // Every connection is closed and every response body ended (each logged its line):
    // write what the buffers hold, fsync, stop the writer threads.
    let access = access_writer.shutdown();
    let audit = audit_writer.shutdown();
    println!(
        "wrote {} access lines and {} audit lines",
        access.lines_written, audit.lines_written
    );
    Ok(())
}

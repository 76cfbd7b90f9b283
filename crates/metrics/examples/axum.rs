//! tailguard-metrics in an axum 0.8 app: request metrics by matched path, the exporter on a
//! thread and listener of its own, graceful shutdown.
//!
//! ```text
//! cargo run -p tailguard-metrics --example axum [APP_ADDR [METRICS_ADDR]]
//! curl http://<app>/users/7; curl http://<metrics>/metrics
//! ```
//!
//! Both addresses default to `127.0.0.1:0` (a free port); the example prints where it
//! listens. Ctrl-C stops it: the server finishes the requests it has, then the exporter
//! stops.

#[path = "axum/app.rs"]
mod app;

use std::error::Error;

use tailguard_metrics::{Exporter, ExporterConfig, Registry, register_process_metrics};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let app_addr = args.next().unwrap_or_else(|| "127.0.0.1:0".into());
    let metrics_addr = args.next().unwrap_or_else(|| "127.0.0.1:0".into());

    let registry = Registry::new();
    register_process_metrics(&registry)?;
    let router = app::app(&registry)?;

    // The exposition is rendered on the exporter's own thread (nice 19), never on the
    // runtime serving the app: a scrape of a large registry cannot stall a request.
    let exporter = Exporter::spawn(
        registry,
        ExporterConfig {
            listen: metrics_addr.parse()?,
            ..ExporterConfig::default()
        },
    )?;

    let listener = tokio::net::TcpListener::bind(&app_addr).await?;
    println!("app listening on http://{}", listener.local_addr()?);
    println!("metrics on http://{}/metrics", exporter.local_addr());
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    exporter.shutdown();
    Ok(())
}

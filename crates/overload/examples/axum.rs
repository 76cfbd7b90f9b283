//! tailguard-overload in an axum 0.8 app: the adaptive shedder on the API routes, a
//! critical route, `/healthz` never shed, the CPU sampler on its own OS thread, graceful
//! shutdown.
//!
//! ```text
//! cargo run -p tailguard-overload --example axum [APP_ADDR]
//! curl -i http://<app>/users/7
//! ```
//!
//! The app listens on `127.0.0.1:0` (a free port) unless told otherwise and prints where.
//! Under a load above what the process's CPU allows, the API routes answer `503` with
//! `Retry-After` while `/checkout` and `/healthz` still answer. Ctrl-C stops it.

#[path = "axum/app.rs"]
mod app;

use std::error::Error;
use std::time::Duration;

use tailguard_overload::{
    CpuReader, MonotonicClock, SamplerHandle, Shedder, ShedderConfig, Smoothing,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let app_addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".into());

    // The route groups of this process, sharing one CPU signal.
    let shedder = Shedder::new(ShedderConfig::adaptive())?;
    let api = shedder.group("api");
    // The CPU this process may use (its cgroup's quota, else its cores), read every 250 ms
    // on an OS thread of its own: a task on the runtime would starve exactly when the
    // runtime is overloaded. Dropping the handle stops the thread.
    let _sampler = SamplerHandle::spawn(
        shedder,
        CpuReader::system(),
        MonotonicClock,
        Smoothing::adaptive(),
        Duration::from_millis(250),
    )?;

    let listener = tokio::net::TcpListener::bind(&app_addr).await?;
    println!("app listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app::app(api, MonotonicClock))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

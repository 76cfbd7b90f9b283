//! A hyper service whose one route burns a fixed amount of CPU per request, protected by
//! `ShedderLayer`: go-zero's field-report setup (a 3.6 ms-CPU handler in-process), for
//! measuring shedding off vs go-zero parity vs adaptive without the gateway.
//!
//! ```text
//! cargo run --release -p tailguard-overload --example burn -- \
//!     --listen 127.0.0.1:8090 --cpu-ms 3.6 --mode adaptive
//! ```
//!
//! `/healthz` is critical (never shed). Prints `listening on ADDR` when ready; the metrics
//! of the shedder are printed once per second on stderr (`--quiet` to stop them).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tailguard_overload::{
    Class, Clock, CpuReader, MonotonicClock, OverloadConfig, OverloadMode, SamplerHandle, Shed,
    Shedder, ShedderLayer,
};
use tower_layer::Layer;
use tower_service::Service;

#[derive(Clone)]
struct Burn {
    cpu: Duration,
}

fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Burns `d` of CPU time (this thread's CPU clock, so time spent descheduled does not
/// count) in 100 us slices, yielding between slices: like a Go handler under goroutine
/// preemption, many requests are in flight at once and share the core. A handler that
/// burned without yielding would keep in-flight at 1 on one worker thread: the queue would
/// sit in the sockets where no admission controller can see it.
async fn burn(d: Duration) {
    let slice = Duration::from_micros(100);
    let mut used = Duration::ZERO;
    let mut x = 0u64;
    while used < d {
        let start = thread_cpu();
        let end = start + slice.min(d - used);
        while thread_cpu() < end {
            for i in 0..100u64 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
            }
        }
        used += thread_cpu().saturating_sub(start);
        tokio::task::yield_now().await;
    }
    std::hint::black_box(x);
}

impl<B> Service<Request<B>> for Burn {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let cpu = self.cpu;
        let health = req.uri().path() == "/healthz";
        Box::pin(async move {
            if !health {
                burn(cpu).await;
            }
            Ok(Response::new(Full::from("ok\n")))
        })
    }
}

/// Marks `/healthz` critical before the shedder sees it.
#[derive(Clone)]
struct Classify<S>(S);

impl<S, B> Service<Request<B>> for Classify<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }
    fn call(&mut self, mut req: Request<B>) -> S::Future {
        if req.uri().path() == "/healthz" {
            req.extensions_mut().insert(Class::Critical);
        }
        self.0.call(req)
    }
}

struct Args {
    listen: SocketAddr,
    cpu: Duration,
    mode: OverloadMode,
    threads: usize,
    quiet: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        listen: "127.0.0.1:8090".parse().map_err(|_| "address")?,
        cpu: Duration::from_micros(3600),
        mode: OverloadMode::Adaptive,
        threads: 1,
        quiet: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => a.listen = value()?.parse().map_err(|e| format!("--listen: {e}"))?,
            "--cpu-ms" => {
                let ms: f64 = value()?.parse().map_err(|e| format!("--cpu-ms: {e}"))?;
                a.cpu = Duration::from_secs_f64(ms / 1e3);
            }
            "--mode" => a.mode = OverloadMode::parse(&value()?).map_err(|e| e.to_string())?,
            "--threads" => a.threads = value()?.parse().map_err(|e| format!("--threads: {e}"))?,
            "--quiet" => a.quiet = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

async fn serve<S>(listen: SocketAddr, svc: S) -> std::io::Result<()>
where
    S: Service<
            Request<hyper::body::Incoming>,
            Response = Response<Full<Bytes>>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("listening on {}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let svc = TowerToHyperService::new(svc.clone());
        tokio::spawn(async move {
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn run_with<S: Shed>(args: &Args, layer: ShedderLayer<S>) -> std::io::Result<()> {
    let svc = Classify(layer.layer(Burn { cpu: args.cpu }));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?
        .block_on(serve(args.listen, svc))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let config = OverloadConfig {
        mode: args.mode,
        ..OverloadConfig::default()
    };
    let Some(shedder_config) = config.shedder_config() else {
        eprintln!("shedding off");
        return Ok(run_with(&args, ShedderLayer::disabled())?);
    };
    let shedder = Shedder::new(shedder_config)?;
    let group = shedder.group("burn");
    let reader = CpuReader::system();
    eprintln!("cpu source: {:?}", reader.kind());
    let _sampler = SamplerHandle::spawn(
        shedder.clone(),
        reader,
        MonotonicClock,
        config.smoothing(),
        Duration::from_millis(250),
    )?;
    if !args.quiet {
        let g = Arc::clone(&group);
        std::thread::spawn(move || {
            loop {
                std::thread::park_timeout(Duration::from_secs(1));
                let s = g.snapshot(MonotonicClock.now());
                eprintln!(
                    "cpu {} inflight {} C {:.2} L {:.2} hot {} admitted {} shed {:?}",
                    s.cpu, s.inflight, s.capacity, s.limit, s.hot, s.admitted, s.shed
                );
            }
        });
    }
    Ok(run_with(&args, ShedderLayer::new(group))?)
}

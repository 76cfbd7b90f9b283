//! The tower layers on a real hyper server on 127.0.0.1:0 (shedding, no body read,
//! `Connection: close` when severe), and the breaker layer's accounting.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tailguard_overload::{
    Breaker, BreakerConfig, BreakerLayer, Class, Controller, FakeClock, Outcome, Overloaded,
    ShedderConfig, ShedderLayer,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tower_layer::Layer;
use tower_service::Service;

type BoxFut<T> = Pin<Box<dyn Future<Output = Result<T, Infallible>> + Send>>;

/// A handler: `/hold` waits for a permit from `gate`; everything answers 200 "ok".
#[derive(Clone)]
struct App {
    gate: Arc<Semaphore>,
    calls: Arc<AtomicUsize>,
    status: StatusCode,
}

impl<B> Service<Request<B>> for App {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = BoxFut<Self::Response>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: Request<B>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let (gate, status) = (self.gate.clone(), self.status);
        let hold = req.uri().path() == "/hold";
        Box::pin(async move {
            if hold {
                gate.acquire().await.expect("never closed").forget();
            }
            let mut res = Response::new(Full::from("ok"));
            *res.status_mut() = status;
            Ok(res)
        })
    }
}

fn app(status: StatusCode) -> App {
    App {
        gate: Arc::new(Semaphore::new(0)),
        calls: Arc::new(AtomicUsize::new(0)),
        status,
    }
}

async fn serve<S>(svc: S) -> SocketAddr
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
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let svc = TowerToHyperService::new(svc.clone());
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// Sends a raw request head and returns the connection.
async fn send(addr: SocketAddr, head: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    s
}

/// Reads until the end of the response head; lower-cased.
async fn read_head(s: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut byte))
            .await
            .expect("a response within 10 s")
            .unwrap();
        assert_eq!(n, 1, "connection closed before the response head");
        buf.push(byte[0]);
    }
    String::from_utf8(buf).unwrap().to_ascii_lowercase()
}

async fn wait_inflight(ctl: &Controller, n: i64) {
    for _ in 0..1000 {
        if ctl.inflight() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("in-flight never reached {n} (is {})", ctl.inflight());
}

/// C = 5, CPU 95 %, 1 core: L = 5 x 0.5 + 1 = 3.5.
fn hot_controller(clock: &FakeClock) -> Arc<Controller> {
    let ms = Duration::from_millis;
    let ctl = Arc::new(Controller::new("api", ShedderConfig::adaptive()).unwrap());
    ctl.tick(ms(0), 0);
    for _ in 0..50 {
        ctl.admit(ms(0), Class::Normal)
            .unwrap()
            .complete(ms(10), Outcome::Served);
    }
    ctl.tick(ms(100), 950);
    clock.set(ms(100));
    ctl
}

#[tokio::test]
async fn shedder_layer_rejects_above_the_limit_without_reading_the_body() {
    let clock = FakeClock::default();
    let ctl = hot_controller(&clock);
    let app = app(StatusCode::OK);
    let svc = ShedderLayer::new(ctl.clone())
        .clock(clock.clone())
        .layer(app.clone());
    let addr = serve(svc).await;

    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(send(addr, "GET /hold HTTP/1.1\r\nhost: t\r\n\r\n").await);
    }
    wait_inflight(&ctl, 4).await;

    // A 1 MB upload whose body never comes: the 503 must not wait for it.
    let mut s = send(
        addr,
        "POST /upload HTTP/1.1\r\nhost: t\r\ncontent-length: 1000000\r\n\r\n",
    )
    .await;
    let head = read_head(&mut s).await;
    assert!(head.starts_with("http/1.1 503"), "{head}");
    assert!(
        head.contains("retry-after: 1\r\n") || head.contains("retry-after: 2\r\n"),
        "{head}"
    );
    assert!(head.contains("x-overloaded: 1\r\n"), "{head}");
    assert_eq!(app.calls.load(Ordering::SeqCst), 4, "the app never saw it");

    // 4 in flight is not above 2 x L: the connection may be kept.
    let mut s = send(addr, "GET / HTTP/1.1\r\nhost: t\r\n\r\n").await;
    let head = read_head(&mut s).await;
    assert!(head.starts_with("http/1.1 503"), "{head}");
    assert!(!head.contains("connection: close"), "{head}");

    // Severe: above 2 x L = 7 in flight, the connection is closed.
    let extra: Vec<_> = (0..4)
        .map(|_| {
            ctl.admit(Duration::from_millis(100), Class::Critical)
                .unwrap()
        })
        .collect();
    let mut s = send(addr, "GET / HTTP/1.1\r\nhost: t\r\n\r\n").await;
    let head = read_head(&mut s).await;
    assert!(head.starts_with("http/1.1 503"), "{head}");
    assert!(head.contains("connection: close\r\n"), "{head}");
    drop(extra);

    // Release the held requests: they complete as served.
    app.gate.add_permits(4);
    for s in &mut held {
        assert!(read_head(s).await.starts_with("http/1.1 200"));
    }
    wait_inflight(&ctl, 0).await;
    let snap = ctl.snapshot(Duration::from_millis(100));
    assert_eq!(snap.served, 50 + 4);
    assert_eq!(snap.shed[Class::Normal.index()], 3);
}

#[tokio::test]
async fn disabled_layer_passes_everything() {
    let app = app(StatusCode::OK);
    let addr = serve(ShedderLayer::disabled().layer(app.clone())).await;
    let mut s = send(addr, "GET / HTTP/1.1\r\nhost: t\r\n\r\n").await;
    assert!(read_head(&mut s).await.starts_with("http/1.1 200"));
}

async fn call<S: Service<Request<()>>>(svc: &mut S, path: &str) -> Result<S::Response, S::Error> {
    std::future::poll_fn(|cx| svc.poll_ready(cx)).await?;
    svc.call(Request::get(path).body(()).unwrap()).await
}

#[tokio::test]
async fn breaker_layer_opens_on_upstream_failures() {
    let clock = FakeClock::default();
    let breaker = Arc::new(Breaker::new("up/route", BreakerConfig::adaptive()).unwrap());
    let upstream = app(StatusCode::BAD_GATEWAY);
    let mut svc = BreakerLayer::new(breaker.clone())
        .clock(clock.clone())
        .layer(upstream.clone());
    let mut open = 0;
    for _ in 0..1000 {
        let res = call(&mut svc, "/").await.unwrap();
        if res.status() == StatusCode::SERVICE_UNAVAILABLE {
            open += 1;
        }
    }
    let dispatched = upstream.calls.load(Ordering::SeqCst);
    assert_eq!(dispatched + open, 1000);
    // Rejection is capped at 0.8: about 200 of 1000 still reach the upstream.
    assert!((100..400).contains(&dispatched), "dispatched {dispatched}");
    assert_eq!(breaker.rejected() as usize, open);
}

#[tokio::test]
async fn shed_responses_never_count_against_the_upstream() {
    let clock = FakeClock::default();
    let ctl = hot_controller(&clock);
    let held: Vec<_> = (0..10)
        .map(|_| {
            ctl.admit(Duration::from_millis(100), Class::Critical)
                .unwrap()
        })
        .collect();
    let breaker = Arc::new(Breaker::new("up/route", BreakerConfig::adaptive()).unwrap());
    let upstream = app(StatusCode::OK);
    let shedder = ShedderLayer::new(ctl.clone()).clock(clock.clone());
    let mut svc = BreakerLayer::new(breaker.clone())
        .clock(clock.clone())
        .layer(shedder.layer(upstream.clone()));
    for _ in 0..500 {
        let res = call(&mut svc, "/").await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(res.extensions().get::<Overloaded>().is_some());
    }
    assert_eq!(upstream.calls.load(Ordering::SeqCst), 0);
    let h = breaker.history(Duration::from_millis(100));
    assert_eq!((h.total, h.accepts), (0, 0), "forgotten, not failures");
    assert_eq!(breaker.rejected(), 0);
    drop(held);
}

//! Servers the tests measure: a timestamping sink and the servers each test writes, each on
//! its own runtime thread (`tailguard_test_support::blocking`) so the generator's blocking
//! `run` can drive them.

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tailguard_test_support::blocking::{Server, start};
use tokio::net::TcpListener;

/// Serves HTTP/1.1 with `handler` on every connection.
pub(crate) async fn serve_http1<H, Fut>(listener: TcpListener, handler: H)
where
    H: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |_req: Request<Incoming>| {
                let handler = handler.clone();
                async move {
                    handler().await;
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Serves HTTP/1.1, answering each request with what `respond` makes of it and of the
/// number of the connection it came on (1, 2, ... in the order accepted).
pub(crate) async fn serve_requests<R, Fut>(listener: TcpListener, respond: R)
where
    R: Fn(Request<Incoming>, usize) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let mut connection = 0;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        connection += 1;
        let respond = respond.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let response = respond(req, connection);
                async move { Ok::<_, Infallible>(response.await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// A sink that records the monotonic arrival time of every request.
pub(crate) fn sink() -> (Server, Arc<Mutex<Vec<u64>>>) {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let a = arrivals.clone();
    let server = start(move |l| {
        serve_http1(l, move || {
            let a = a.clone();
            async move {
                a.lock().unwrap().push(tailguard_loadgen::clock::now_ns());
            }
        })
    });
    (server, arrivals)
}

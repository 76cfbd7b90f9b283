//! The tower layer on a real hyper server: requests by route, method and status, duration,
//! in-flight.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tailguard_metrics::{Format, Registry, RequestMetrics};
use tower::ServiceBuilder;

use crate::support::get;

async fn app(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let status = match req.uri().path() {
        "/missing" => StatusCode::NOT_FOUND,
        "/teapot" => StatusCode::IM_A_TEAPOT,
        _ => StatusCode::OK,
    };
    let mut response = Response::new(Full::new(Bytes::from_static(b"hi")));
    *response.status_mut() = status;
    Ok(response)
}

#[test]
fn layer_counts_requests_by_route_method_and_status() {
    let registry = Registry::builder()
        .self_metrics_prefix(None)
        .build()
        .unwrap();
    let metrics = RequestMetrics::register(&registry, "app").unwrap();
    let route = metrics.route("/users/{id}").unwrap();
    assert!(std::ptr::eq(route, metrics.route("/users/{id}").unwrap()));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let addr: SocketAddr = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let service = ServiceBuilder::new()
                    .layer(route.layer())
                    .service(tower::service_fn(app));
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service)),
                );
            }
        });
        addr
    });
    for _ in 0..3 {
        assert_eq!(get(addr, "/users/1", &[]).status, 200);
    }
    assert_eq!(get(addr, "/missing", &[]).status, 404);
    assert_eq!(get(addr, "/teapot", &[]).status, 418);

    let text = String::from_utf8(registry.render(Format::Text)).unwrap();
    for line in [
        "app_requests_total{route=\"/users/{id}\",method=\"GET\",status=\"200\"} 3\n",
        "app_requests_total{route=\"/users/{id}\",method=\"GET\",status=\"404\"} 1\n",
        // 418 has no dense slot: counted through the cold path, still exact.
        "app_requests_total{route=\"/users/{id}\",method=\"GET\",status=\"418\"} 1\n",
        "app_request_duration_seconds_count{route=\"/users/{id}\"} 5\n",
        "app_requests_in_flight{route=\"/users/{id}\"} 0\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    drop(runtime);
}

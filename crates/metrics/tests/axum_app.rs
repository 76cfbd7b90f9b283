//! The axum example's app (`examples/axum/app.rs`, the same file) served on 127.0.0.1:0 with
//! the exporter on a port of its own, driven through real sockets: the exposition after N
//! requests has `/users/{id}` as one series with N counted, and passes `promtool`.

#[path = "../examples/axum/app.rs"]
mod app;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use tailguard_metrics::{Exporter, ExporterConfig, Format, Registry, RequestMetrics};
use tailguard_test_support::promtool_check;

use crate::support::get as http_get;

/// Serves `router` on 127.0.0.1:0 from a runtime of its own; the runtime lives as long as
/// the returned guard.
fn serve(router: Router) -> (tokio::runtime::Runtime, SocketAddr) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    runtime.spawn(async move { axum::serve(listener, router).await.unwrap() });
    (runtime, addr)
}

fn registry() -> Registry {
    Registry::builder()
        .self_metrics_prefix(None)
        .build()
        .unwrap()
}

#[test]
fn example_app_counts_users_id_as_one_series_by_matched_path() {
    const N: u64 = 25;
    let registry = registry();
    let (_runtime, addr) = serve(app::app(&registry).unwrap());
    let exporter = Exporter::spawn(
        registry,
        ExporterConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..ExporterConfig::default()
        },
    )
    .unwrap();

    for id in 0..N {
        let res = http_get(addr, &format!("/users/{id}"), &[]);
        assert_eq!(res.status, 200);
        assert!(String::from_utf8_lossy(&res.body).contains(&format!("\"id\":{id}")));
    }
    assert_eq!(http_get(addr, "/no/such/page", &[]).status, 404);
    assert_eq!(http_get(addr, "/admin/reload", &[]).status, 405);

    let scrape = http_get(exporter.local_addr(), "/metrics", &[]);
    assert_eq!(scrape.status, 200);
    let text = String::from_utf8(scrape.body.clone()).unwrap();
    for line in [
        format!(
            "app_requests_total{{route=\"/users/{{id}}\",method=\"GET\",status=\"200\"}} {N}\n"
        ),
        format!("app_request_duration_seconds_count{{route=\"/users/{{id}}\"}} {N}\n"),
        "app_requests_in_flight{route=\"/users/{id}\"} 0\n".to_owned(),
        "app_requests_total{route=\"unmatched\",method=\"GET\",status=\"404\"} 1\n".to_owned(),
        // axum's 405 for a known path with the wrong method carries the matched path.
        "app_requests_total{route=\"/admin/reload\",method=\"GET\",status=\"405\"} 1\n".to_owned(),
        format!("user_lookups_total {N}\n"),
    ] {
        assert!(text.contains(&line), "missing {line:?} in\n{text}");
    }
    // No series per id: the raw paths never became label values.
    assert!(
        !text.contains("/users/1"),
        "a raw path became a label:\n{text}"
    );
    let (ok, output) = promtool_check(&scrape.body);
    assert!(ok, "promtool check metrics failed:\n{output}\n{text}");
    exporter.shutdown();
}

#[test]
fn route_level_layer_records_under_its_fixed_route() {
    let registry = registry();
    let (_runtime, addr) = serve(app::app(&registry).unwrap());
    let post = |path: &str| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    for _ in 0..3 {
        assert!(post("/admin/reload").starts_with("HTTP/1.1 200"));
    }
    let text = String::from_utf8(registry.render(Format::Text)).unwrap();
    for line in [
        // The route's own layer, inside the router's.
        "admin_requests_total{route=\"reload\",method=\"POST\",status=\"200\"} 3\n",
        "app_requests_total{route=\"/admin/reload\",method=\"POST\",status=\"200\"} 3\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}

/// One wrapped service that serves two routes (a nested service: the router's layer wraps
/// it once) records each request under its own route, not under the first one it saw.
#[test]
fn matched_layer_on_a_service_serving_several_routes_keeps_them_apart() {
    let registry = registry();
    let metrics = Arc::new(RequestMetrics::register(&registry, "app").unwrap());
    let inner = Router::new()
        .route("/a/{x}", get(|| async { "a" }))
        .route("/b", get(|| async { "b" }));
    // The layer wraps the whole inner router as one service; the route comes from the
    // inner router's `MatchedPath`... which only the inner router sets, after the layer.
    // So the layer reads an extension this outer middleware sets from the request path.
    let router = Router::new().fallback_service(
        tower::ServiceBuilder::new()
            .map_request(|mut req: http::Request<axum::body::Body>| {
                let route: &'static str = if req.uri().path().starts_with("/a/") {
                    "/a/{x}"
                } else {
                    "/b"
                };
                req.extensions_mut().insert(RouteName(route));
                req
            })
            .layer(metrics.layer(|ext| ext.get::<RouteName>().map(|r| r.0)))
            .service(inner),
    );
    let (_runtime, addr) = serve(router);
    for path in ["/a/1", "/b", "/a/2", "/b", "/b"] {
        assert_eq!(http_get(addr, path, &[]).status, 200);
    }
    let text = String::from_utf8(registry.render(Format::Text)).unwrap();
    for line in [
        "app_requests_total{route=\"/a/{x}\",method=\"GET\",status=\"200\"} 2\n",
        "app_requests_total{route=\"/b\",method=\"GET\",status=\"200\"} 3\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}

#[derive(Clone, Copy)]
struct RouteName(&'static str);

//! Route precedence: the Kubernetes Gateway API HTTPRoute rules, with priority first.

use http::{HeaderMap, HeaderValue, Method};
use tailguard_policy::route::{Route, Router};
use tailguard_test_support::{Upstream, http1_client};

use crate::support;

const ROUTES: &str = r#"
[[upstreams]]
name = "u"
endpoints = [{ address = "127.0.0.1:1" }]

[[routes]]
id = "catchall"
upstream = "u"

[[routes]]
id = "prefix-api"
upstream = "u"
path = { prefix = "/api" }

[[routes]]
id = "prefix-api-v1"
upstream = "u"
path = { prefix = "/api/v1/" }

[[routes]]
id = "exact-users"
upstream = "u"
path = { exact = "/api/v1/users" }

[[routes]]
id = "v1-post"
upstream = "u"
path = { prefix = "/api/v1" }
method = "POST"

[[routes]]
id = "v1-canary"
upstream = "u"
path = { prefix = "/api/v1" }
headers = [{ name = "x-canary", value = "1" }]

[[routes]]
id = "v1-canary-beta"
upstream = "u"
path = { prefix = "/api/v1" }
headers = [{ name = "x-canary", value = "1" }, { name = "X-Beta", value = "yes" }]

[[routes]]
id = "host-exact"
upstream = "u"
host = "shop.example.com"

[[routes]]
id = "host-wildcard"
upstream = "u"
host = "*.example.com"

[[routes]]
id = "legacy-priority"
upstream = "u"
path = { prefix = "/legacy" }
priority = 10

[[routes]]
id = "legacy-exact"
upstream = "u"
path = { exact = "/legacy/x" }

[[routes]]
id = "first-of-equals"
upstream = "u"
path = { prefix = "/same" }

[[routes]]
id = "second-of-equals"
upstream = "u"
path = { prefix = "/same" }
"#;

/// host, method, path, headers => winning route id.
type Case = (
    &'static str,
    Method,
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
);

fn router() -> Router {
    let config = support::with_listener(ROUTES);
    Router::new(config.routes.iter().map(|r| Route::build(r, 0)).collect())
}

#[test]
fn precedence_table() {
    let router = router();
    #[rustfmt::skip]
    let table: &[Case] = &[
        // host, method, path, headers => winner
        ("a.test", Method::GET, "/", &[], "catchall"),
        ("a.test", Method::GET, "/apix", &[], "catchall"),              // prefix on segment boundary
        ("a.test", Method::GET, "/api", &[], "prefix-api"),
        ("a.test", Method::GET, "/api/v2", &[], "prefix-api"),
        ("a.test", Method::GET, "/api/v1", &[], "prefix-api-v1"),         // "/api/v1/" covers "/api/v1"
        ("a.test", Method::GET, "/api/v1/things", &[], "prefix-api-v1"),  // longest prefix
        ("a.test", Method::GET, "/api/v1/users", &[], "exact-users"),     // exact beats any prefix
        ("a.test", Method::POST, "/api/v1/users", &[], "exact-users"),    // exact beats a method match
        ("a.test", Method::POST, "/api/v1/x", &[], "v1-post"),            // method beats none
        ("a.test", Method::POST, "/api/v1/x", &[("x-canary", "1")], "v1-post"), // method beats headers
        ("a.test", Method::GET, "/api/v1/x", &[("x-canary", "1")], "v1-canary"),
        ("a.test", Method::GET, "/api/v1/x", &[("x-canary", "1"), ("x-beta", "yes")], "v1-canary-beta"), // more headers
        ("a.test", Method::GET, "/api/v1/x", &[("x-canary", "2")], "prefix-api-v1"), // value must be exact
        ("shop.example.com", Method::GET, "/api/v1/users", &[], "host-exact"), // host before path
        ("SHOP.example.com", Method::GET, "/", &[], "host-exact"),       // hosts compare case-insensitively
        ("a.example.com", Method::GET, "/", &[], "host-wildcard"),
        ("a.b.example.com", Method::GET, "/", &[], "host-wildcard"),
        ("example.com", Method::GET, "/", &[], "catchall"),               // a wildcard does not match the apex
        ("a.test", Method::GET, "/legacy/x", &[], "legacy-priority"),     // priority beats exact
        ("a.test", Method::GET, "/same/1", &[], "first-of-equals"),       // file order breaks ties
    ];
    for (host, method, path, headers, want) in table {
        let mut map = HeaderMap::new();
        for (k, v) in *headers {
            map.append(*k, HeaderValue::from_static(v));
        }
        let got = router
            .find(host, path, method, &map)
            .map(|i| &*router.get(i).id);
        assert_eq!(got, Some(*want), "{method} {host}{path} {headers:?}");
    }
}

#[test]
fn no_match_without_catchall() {
    let config = support::with_listener(
        "[[upstreams]]\nname = \"u\"\nendpoints = [{ address = \"127.0.0.1:1\" }]\n\n[[routes]]\nid = \"r\"\nupstream = \"u\"\npath = { exact = \"/only\" }\n",
    );
    let router = Router::new(config.routes.iter().map(|r| Route::build(r, 0)).collect());
    assert_eq!(
        router.find("h", "/only/", &Method::GET, &HeaderMap::new()),
        None
    );
    assert_eq!(
        router.find("h", "/only", &Method::GET, &HeaderMap::new()),
        Some(0)
    );
}

#[tokio::test]
async fn host_with_port_routes_by_host_end_to_end() {
    let default = Upstream::builder().body("default").start().await;
    let shop = Upstream::builder().body("shop").start().await;
    let config = support::with_listener(&format!(
        r#"
[[upstreams]]
name = "default"
endpoints = [{{ address = "{}" }}]

[[upstreams]]
name = "shop"
endpoints = [{{ address = "{}" }}]

[[routes]]
id = "default"
upstream = "default"

[[routes]]
id = "shop"
upstream = "shop"
host = "shop.example.com"
"#,
        default.addr, shop.addr
    ));
    let (_server, url) = support::start(config);
    let client = http1_client();
    let mut req = support::get(&format!("{url}/"));
    req.headers_mut()
        .insert("host", HeaderValue::from_static("shop.example.com:8080"));
    let resp = client.request(req).await.unwrap();
    assert_eq!(support::text(resp).await, "shop");
    let resp = client
        .request(support::get(&format!("{url}/")))
        .await
        .unwrap();
    assert_eq!(support::text(resp).await, "default");
}

//! What the page and its JSON show as a gateway's endpoints fail, and who may read them.

use base64::Engine as _;
use tailguard_test_support::SwitchableUpstream;

use crate::{Harness, request, wait_for};

const CHECKS: &str = "path = \"/health\"\ninterval_ms = 20\ntimeout_ms = 500\nhealthy = 2\n\
                      unhealthy = 2\nconsecutive_failures = 0";

fn two_endpoints(a: &SwitchableUpstream, b: &SwitchableUpstream, extra: &str) -> String {
    format!(
        "[[upstreams]]\nname = \"api\"\nendpoints = [{{ address = \"{}\" }}, {{ address = \"{}\" }}]\n\
         [upstreams.health]\n{CHECKS}\n\n[[routes]]\nid = \"all\"\nupstream = \"api\"\n\n{extra}",
        a.addr, b.addr
    )
}

fn endpoint<'a>(doc: &'a serde_json::Value, addr: &str) -> &'a serde_json::Value {
    doc["upstreams"][0]["endpoints"]
        .as_array()
        .and_then(|eps| eps.iter().find(|e| e["address"] == addr))
        .unwrap_or(&serde_json::Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_fails_its_checks_shows_down_with_why_and_an_alert() {
    let (a, b) = (
        SwitchableUpstream::start().await,
        SwitchableUpstream::start().await,
    );
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::start(&two_endpoints(&a, &b, ""), dir.path());
    h.json(&[]).await;
    for _ in 0..20 {
        assert_eq!(request(h.gateway_addr(), "/x", &[]).await.status, 200);
    }
    let doc = wait_for(&h, "the requests' rate", &[], |d| {
        d["routes"][0]["requests_per_s"].as_f64() > Some(0.0)
            && d["upstreams"][0]["endpoints"][1]["last_check"]["ok"] == true
    })
    .await;
    assert_eq!(doc["routes"][0]["upstream"], "api");
    assert_eq!(doc["upstreams"][0]["endpoints_up"], 2);
    assert_eq!(doc["alerts"], serde_json::json!([]));
    assert!(doc["gateway"]["requests_per_s"].as_f64() > Some(0.0));
    assert!(doc["upstreams"][0]["p99_ms"].as_f64() > Some(0.0));

    b.set_health_status(500);
    let b_addr = b.addr.to_string();
    let doc = wait_for(&h, "the endpoint down", &[], |d| {
        endpoint(d, &b_addr)["state"] == "down"
    })
    .await;
    let down = endpoint(&doc, &b_addr);
    assert_eq!(down["last_check"]["ok"], false);
    assert_eq!(down["last_check"]["result"], "status 500");
    assert!(
        down["reason"]
            .as_str()
            .is_some_and(|r| r.contains("consecutive failed checks, last: status 500")),
        "{down}"
    );
    assert_eq!(endpoint(&doc, &a.addr.to_string())["state"], "up");
    assert_eq!(doc["upstreams"][0]["endpoints_up"], 1);
    let alert = &doc["alerts"][0];
    assert_eq!(
        (&alert["severity"], &alert["kind"], &alert["subject"]),
        (
            &serde_json::json!("red"),
            &serde_json::json!("endpoint_down"),
            &serde_json::json!(format!("api/{b_addr}"))
        )
    );

    // The other one too: the upstream itself is down.
    a.set_health_status(503);
    let doc = wait_for(&h, "the upstream down", &[], |d| {
        d["alerts"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a["kind"] == "upstream_down"))
    })
    .await;
    assert_eq!(doc["upstreams"][0]["endpoints_up"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_reload_stands_out_with_its_error() {
    let (a, b) = (
        SwitchableUpstream::start().await,
        SwitchableUpstream::start().await,
    );
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::start(&two_endpoints(&a, &b, ""), dir.path());
    let gateway = h.server.gateway();
    gateway.reloads().record(
        "gw.toml",
        Err("gw.toml:3:1: routes[0]: unknown field `bogus`".into()),
    );
    gateway.metrics().reloaded(false);
    let doc = wait_for(&h, "the failed reload", &[], |d| {
        d["gateway"]["last_reload_ok"] == false
    })
    .await;
    assert_eq!(doc["alerts"][0]["kind"], "reload_failed");
    assert!(
        doc["alerts"][0]["message"]
            .as_str()
            .unwrap()
            .contains("unknown field `bogus`")
    );
    assert_eq!(doc["gateway"]["reloads"][0]["ok"], false);
    assert_eq!(doc["gateway"]["config"]["kind"], "file");
    assert_eq!(doc["gateway"]["config"]["name"], "gw.toml");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_the_data_and_a_wrong_one_is_refused() {
    let (a, b) = (
        SwitchableUpstream::start().await,
        SwitchableUpstream::start().await,
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("status.token"), "s3cret-token\n").unwrap();
    let h = Harness::start(
        &two_endpoints(&a, &b, "[status]\ntoken_file = \"status.token\"\n"),
        dir.path(),
    );
    for headers in [
        &[][..],
        &[("Authorization", "Bearer wrong")][..],
        &[("Authorization", "Bearer s3cret-token-and-more")][..],
    ] {
        let r = h.get("/status.json", headers).await;
        assert_eq!(r.status, 401, "{headers:?}");
        assert!(
            r.head
                .contains("www-authenticate: bearer realm=\"tailguard status\"")
        );
        assert!(!r.body.contains("upstreams"));
    }
    let good = [("Authorization", "Bearer s3cret-token")];
    let ok = h.get("/status.json", &good).await;
    assert_eq!(ok.status, 200);
    assert!(ok.head.contains("cache-control: no-store"));
    assert!(
        !ok.body.contains("s3cret"),
        "the token is never in the data"
    );
    let zipped = h
        .get("/status.json", &[good[0], ("Accept-Encoding", "gzip")])
        .await;
    assert!(zipped.head.contains("content-encoding: gzip"));
    // The page holds no data: it is served, and asks for the token itself.
    let page = h.get("/status", &[]).await;
    assert_eq!(page.status, 200);
    assert!(page.head.contains("content-type: text/html"));
    assert!(
        page.head
            .contains("content-security-policy: default-src 'none'")
    );
    assert!(page.body.contains("<title>tailguard status</title>"));
    assert!(!page.body.contains("s3cret"));
    // The exposition beside it is untouched.
    assert_eq!(h.get("/metrics", &[]).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn htpasswd_guards_the_page_and_its_data() {
    let (a, b) = (
        SwitchableUpstream::start().await,
        SwitchableUpstream::start().await,
    );
    let dir = tempfile::tempdir().unwrap();
    let hash = bcrypt::hash("correct horse", 4).unwrap();
    std::fs::write(dir.path().join("htpasswd"), format!("ops:{hash}\n")).unwrap();
    let h = Harness::start(
        &two_endpoints(&a, &b, "[status]\nhtpasswd = \"htpasswd\"\n"),
        dir.path(),
    );
    let basic = |creds: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(creds)
        )
    };
    for path in ["/status", "/status.json"] {
        let r = h.get(path, &[]).await;
        assert_eq!(r.status, 401, "{path}");
        assert!(
            r.head
                .contains("www-authenticate: basic realm=\"tailguard status\"")
        );
        let wrong = basic("ops:battery staple");
        assert_eq!(h.get(path, &[("Authorization", &wrong)]).await.status, 401);
        let right = basic("ops:correct horse");
        assert_eq!(
            h.get(path, &[("Authorization", &right)]).await.status,
            200,
            "{path}"
        );
    }
}

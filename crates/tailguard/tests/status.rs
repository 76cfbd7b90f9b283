//! The status page of the built binary in a real headless Chromium ([`Browser`]): an
//! endpoint that starts failing its checks turns red in the open page, without a reload;
//! and a page whose data needs a token shows none without it.
//!
//! `TAILGUARD_STATUS_SCREENSHOT=FILE` saves the first test's page as a PNG (how
//! `docs/status.png` was made).

use std::net::SocketAddr;
use std::time::Duration;

use tailguard_test_support::SwitchableUpstream;

use crate::browser::Browser;
use crate::support::Gateway;

/// A state change must show within this: the checks take the endpoint down within ~0.3 s,
/// the page ticks every second and polls every second, so a working page needs ~2-3 s.
const SHOWS_WITHIN: Duration = Duration::from_secs(15);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A config with upstream `api` over `a` and `b`, checked every 100 ms, plus `extra`.
fn config(a: SocketAddr, b: SocketAddr, extra: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"api\"\nendpoints = [{{ address = \"{a}\" }}, {{ address = \"{b}\" }}]\n\
         [upstreams.health]\npath = \"/health\"\ninterval_ms = 100\nhealthy = 2\nunhealthy = 2\n\n\
         [[routes]]\nid = \"api\"\nupstream = \"api\"\npath = {{ prefix = \"/\" }}\n\n{extra}"
    )
}

/// Runs the binary on `config` with its exporter on a free port; the status page's URL.
fn start(config: &str, dir: &std::path::Path) -> (Gateway, String) {
    let path = dir.join("gw.toml");
    std::fs::write(&path, config).expect("write config");
    let gateway = Gateway::run(&[
        "--config",
        path.to_str().expect("a UTF-8 path"),
        "--metrics-listen",
        "127.0.0.1:0",
        "--threads",
        "1",
    ]);
    gateway.wait_for_log("status page on http://", Duration::from_secs(10));
    let log = gateway.log();
    let url = log
        .split("status page on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the status page's URL")
        .to_owned();
    (gateway, url)
}

fn badge(upstream: &str, addr: SocketAddr) -> String {
    format!("document.querySelector('[data-endpoint=\"{upstream}/{addr}\"]')")
}

#[test]
fn an_endpoint_failing_its_checks_turns_red_in_the_open_page_without_a_reload() {
    let rt = runtime();
    let (a, b) = rt.block_on(async {
        (
            SwitchableUpstream::start().await,
            SwitchableUpstream::start().await,
        )
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let (gateway, url) = start(&config(a.addr, b.addr, ""), dir.path());
    for _ in 0..20 {
        assert_eq!(crate::metrics_get(gateway.addr, "/x").0, 200);
    }
    let browser = Browser::start(1280, 1500);
    browser.open(&url);
    browser.wait_for(
        "both endpoints up",
        &format!(
            "const a = {}, b = {}; return !!a && !!b && a.dataset.state === 'up' && b.dataset.state === 'up'",
            badge("api", a.addr),
            badge("api", b.addr)
        ),
        SHOWS_WITHIN,
    );
    assert_eq!(
        browser.eval("return document.querySelectorAll('#alerts li').length"),
        0
    );
    // A mark a reload would wipe out.
    browser.eval("window.noReload = 48; return window.tailguardStatus.updates");

    b.set_health_status(500);
    let took = browser.wait_for(
        "the endpoint down",
        &format!(
            "const b = {}; return !!b && b.dataset.state === 'down'",
            badge("api", b.addr)
        ),
        SHOWS_WITHIN,
    );
    eprintln!("the endpoint showed down {took:?} after it started failing");
    assert_eq!(
        browser.eval("return window.noReload"),
        48,
        "the page reloaded"
    );
    let alert = browser.eval(
        "const li = document.querySelector('#alerts li.red[data-kind=\"endpoint_down\"]'); \
         return li ? li.dataset.subject + ' | ' + li.textContent : null",
    );
    let alert = alert
        .as_str()
        .expect("a red endpoint_down alert at the top");
    assert!(alert.starts_with(&format!("api/{}", b.addr)), "{alert}");
    assert!(alert.contains("status 500"), "{alert}");
    assert_eq!(
        browser.eval(&format!("return {}.dataset.state", badge("api", a.addr))),
        "up"
    );
    // The page is the first thing in the document order: the alert list comes before the
    // tables.
    assert_eq!(
        browser.eval(
            "return document.getElementById('alerts').compareDocumentPosition(\
             document.getElementById('routes')) & Node.DOCUMENT_POSITION_FOLLOWING ? true : false"
        ),
        true
    );
    if let Some(file) = std::env::var_os("TAILGUARD_STATUS_SCREENSHOT") {
        // Some traffic for the charts first.
        let end = std::time::Instant::now() + Duration::from_secs(40);
        while std::time::Instant::now() < end {
            crate::metrics_get(gateway.addr, "/x");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::write(file, browser.screenshot()).expect("write the screenshot");
    }
    drop(gateway);
}

#[test]
fn without_its_token_the_page_shows_no_data_and_with_it_shows_the_gateway() {
    let rt = runtime();
    let (a, b) = rt.block_on(async {
        (
            SwitchableUpstream::start().await,
            SwitchableUpstream::start().await,
        )
    });
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("status.token"), "tok-48\n").expect("token file");
    let (gateway, url) = start(
        &config(a.addr, b.addr, "[status]\ntoken_file = \"status.token\"\n"),
        dir.path(),
    );
    let metrics: SocketAddr = url
        .trim_start_matches("http://")
        .trim_end_matches("/status")
        .parse()
        .expect("the exporter's address");
    let (status, _) = crate::metrics_get(metrics, "/status.json");
    assert_eq!(status, 401);

    let browser = Browser::start(800, 900);
    browser.open(&url);
    browser.wait_for(
        "the token form",
        "return document.getElementById('login').classList.contains('show')",
        SHOWS_WITHIN,
    );
    assert_eq!(
        browser.eval(
            "return [window.tailguardStatus.updates, document.querySelectorAll('[data-endpoint]').length]"
        ),
        serde_json::json!([0, 0]),
        "no data without the token"
    );
    // A wrong token is refused too.
    browser.eval(
        "document.getElementById('token').value = 'nope'; \
         document.getElementById('login').requestSubmit(); return true",
    );
    browser.wait_for(
        "the refusal",
        "return document.getElementById('login-error').textContent.includes('refused')",
        SHOWS_WITHIN,
    );
    browser.open(&format!("{url}#token=tok-48"));
    browser.wait_for(
        "the endpoints",
        &format!("return !!{}", badge("api", a.addr)),
        SHOWS_WITHIN,
    );
    assert_eq!(
        browser.eval("return location.hash"),
        "",
        "the token left the address bar"
    );
    drop(gateway);
}

//! CORS in a real headless Chromium ([`Browser`]): a page on one origin
//! (`http://127.0.0.1:P`, served by a few lines here) `fetch`es with credentials from the
//! gateway on another (`http://127.0.0.1:G`, another port, so another origin), and the
//! test reads what the page could read from its DOM. Allowed: the browser's preflight is
//! answered by the gateway, the `PUT` goes through with the page's cookie, and the page
//! reads the answer. Refused: the preflight gets no CORS fields, so the browser never sends
//! the `PUT`; and a simple `GET` that needs no preflight reaches the upstream, but the page
//! cannot read its answer.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use tailguard_test_support::Upstream;

use crate::browser::Browser;
use crate::support::Gateway;

/// The page: three `fetch`es in turn, each one's outcome written into its own element, then
/// the title set to `done`.
const PAGE: &str = r#"<!doctype html>
<title>cors</title>
<pre id="allowed">pending</pre>
<pre id="refused">pending</pre>
<pre id="simple">pending</pre>
<script>
async function run(id, path, init) {
  try {
    const r = await fetch(GATEWAY + path, init);
    document.getElementById(id).textContent = 'status ' + r.status + '\n' + await r.text();
  } catch (e) {
    document.getElementById(id).textContent = 'failed: ' + e;
  }
}
(async () => {
  const put = { method: 'PUT', credentials: 'include', headers: { 'x-token': 't-1' } };
  await run('allowed', '/echo/allowed', put);
  await run('refused', '/echo/refused', put);
  await run('simple', '/echo/refused', { credentials: 'include' });
  document.title = 'done';
})();
</script>
"#;

/// Serves the page on `listener` from a thread, with a cookie, which the browser then sends
/// to the gateway (cookies are per host, not per port).
fn serve_page(listener: TcpListener, gateway: SocketAddr) {
    let page = PAGE.replace("GATEWAY", &format!("'http://{gateway}'"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            // The request head; its content does not matter, every path gets the page.
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\
                 Set-Cookie: session=s-42; Path=/\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
}

#[test]
fn a_page_on_another_origin_reads_an_allowed_route_with_credentials_and_not_a_refused_one() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let upstream = rt.block_on(Upstream::start());
    // The page's socket first: the gateway's config names its origin, and the page names
    // the gateway's address, known once it runs.
    let page_listener = TcpListener::bind("127.0.0.1:0").expect("bind the page's server");
    let page_origin = format!("http://{}", page_listener.local_addr().expect("addr"));
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(
        r#"[[listeners]]
address = "127.0.0.1:0"

[[upstreams]]
name = "up"
endpoints = [{{ address = "{}" }}]

[[routes]]
id = "allowed"
upstream = "up"
path = {{ prefix = "/echo/allowed" }}
cors = {{ origins = ["{page_origin}"], methods = ["PUT"], headers = ["x-token"], credentials = true }}

[[routes]]
id = "refused"
upstream = "up"
path = {{ prefix = "/echo/refused" }}
cors = {{ origins = ["https://app.example"], methods = ["PUT"], headers = ["x-token"], credentials = true }}
"#,
        upstream.addr
    );
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, config).expect("write config");
    let gateway = Gateway::run(&[
        "--config",
        path.to_str().expect("a UTF-8 path"),
        "--threads",
        "1",
    ]);
    serve_page(page_listener, gateway.addr);

    let browser = Browser::start(800, 600);
    browser.open(&format!("{page_origin}/"));
    browser.wait_for(
        "the three fetches' outcomes",
        "return document.title === 'done'",
        Duration::from_secs(30),
    );
    let text = |id: &str| {
        browser
            .eval(&format!(
                "return document.getElementById('{id}').textContent"
            ))
            .as_str()
            .expect("text")
            .to_owned()
    };
    let allowed = text("allowed");
    assert!(
        allowed.starts_with("status 200\nPUT /echo/allowed "),
        "{allowed}"
    );
    let fields = allowed.to_ascii_lowercase();
    assert!(
        fields.contains("\ncookie: session=s-42\n"),
        "the credentials went: {allowed}"
    );
    assert!(fields.contains("\nx-token: t-1\n"), "{allowed}");
    assert!(
        fields.contains(&format!("\norigin: {page_origin}\n")),
        "{allowed}"
    );

    let refused = text("refused");
    assert!(refused.starts_with("failed: TypeError"), "{refused}");
    let simple = text("simple");
    assert!(simple.starts_with("failed: TypeError"), "{simple}");
    // The allowed PUT and the simple GET reached the upstream; the refused preflight kept
    // the browser from sending its PUT, and no preflight ever left the gateway.
    assert_eq!(upstream.requests(), 2);
    drop(browser);
    drop(gateway);
}

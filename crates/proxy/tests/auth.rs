//! Authentication through the real gateway: `type = "api_key"` from a header and from the
//! query, a route with two authenticators, the client's copies of the key removed before
//! the upstream, a keys file re-read when it changes, a key removed by a reload refused at
//! once, a rate limit per consumer, `$consumer` and `$auth_result` in the access log, the
//! metrics, and the config's errors. Key hashes are made by the `sha256sum` tool, as
//! docs/auth.md tells operators to.

use std::time::{Duration, Instant};

use http::Request;
use tailguard_test_support::{Upstream, http1_client};

use crate::support::{self, config, config_errors, config_errors_in, empty, metrics_text, within};

const ACME_KEY: &str = "acme-3f9a1c-secret";
const BETA_KEY: &str = "beta-77e0d2-secret";

/// `printf %s KEY | sha256sum`, as `sha256:HEX`.
fn sha256(key: &str) -> String {
    use std::io::Write as _;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sha256sum (coreutils) runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(key.as_bytes())
        .expect("write the key");
    let out = child.wait_with_output().expect("sha256sum ends");
    let text = String::from_utf8(out.stdout).expect("hex");
    format!(
        "sha256:{}",
        text.split_whitespace().next().expect("a digest")
    )
}

/// Sends `GET url` with `headers`: status, response headers, body.
pub(crate) async fn get(url: &str, headers: &[(&str, &str)]) -> (u16, http::HeaderMap, String) {
    let mut req = Request::get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = within(http1_client().request(req.body(empty()).expect("request")))
        .await
        .expect("an answer");
    let status = resp.status().as_u16();
    let head = resp.headers().clone();
    (status, head, support::text(resp).await)
}

fn gateway(upstream: std::net::SocketAddr, rest: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{upstream}\" }}]\n\n{rest}"
    )
}

fn partners(extra: &str) -> String {
    format!(
        "[[auth]]\nname = \"partners\"\ntype = \"api_key\"\n{extra}\n\
         consumers = [{{ name = \"acme\", keys = [\"{}\"] }}, {{ name = \"beta\", keys = [\"{}\"] }}]\n\n",
        sha256(ACME_KEY),
        sha256(BETA_KEY)
    )
}

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

#[tokio::test]
async fn an_api_key_in_a_header_lets_its_consumer_through_and_never_reaches_the_upstream() {
    let upstream = Upstream::start().await;
    let (server, url) = support::start(config(&gateway(
        upstream.addr,
        &format!(
            "{}[[routes]]\nid = \"orders\"\nupstream = \"up\"\nauth = \"partners\"\n\n\
             [[routes]]\nid = \"open\"\nupstream = \"up\"\npath = {{ prefix = \"/open\" }}\n",
            partners("")
        ),
    )));

    // No key: 401 with a challenge; nothing reached the upstream.
    let (status, head, body) = get(&format!("{url}/echo"), &[]).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(head["www-authenticate"], "ApiKey realm=\"partners\"");
    assert_eq!(upstream.requests(), 0);
    // A wrong key, and a right key with one character changed.
    for wrong in ["nope", "acme-3f9a1c-secreT"] {
        let (status, _, body) = get(&format!("{url}/echo"), &[("x-api-key", wrong)]).await;
        assert_eq!(status, 401, "{wrong}: {body}");
        assert!(!body.contains(wrong), "the key is not echoed: {body}");
    }
    assert_eq!(upstream.requests(), 0);
    // The right key: through, without the key.
    let (status, _, echoed) = get(&format!("{url}/echo"), &[("x-api-key", ACME_KEY)]).await;
    assert_eq!(status, 200, "{echoed}");
    assert!(
        !echoed.to_ascii_lowercase().contains("x-api-key"),
        "{echoed}"
    );
    assert!(!echoed.contains(ACME_KEY), "{echoed}");
    // An open route stays open.
    let (status, _, _) = get(&format!("{url}/open"), &[]).await;
    assert_eq!(status, 200);

    let text = metrics_text(&server);
    for line in [
        "tailguard_auth_requests_total{route=\"orders\",auth=\"partners\",result=\"ok\"} 1",
        "tailguard_auth_requests_total{route=\"orders\",auth=\"partners\",result=\"missing\"} 1",
        "tailguard_auth_requests_total{route=\"orders\",auth=\"partners\",result=\"invalid\"} 2",
    ] {
        assert!(has_line(&text, line), "no `{line}` in:\n{text}");
    }
    assert!(
        !text.contains("route=\"open\",auth="),
        "an open route has no auth series"
    );
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_key_in_the_query_is_taken_out_of_the_target_sent_upstream_and_logged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    let upstream = Upstream::start().await;
    let (server, url) = support::start(config(&gateway(
        upstream.addr,
        &format!(
            "[access_log]\npath = \"{}\"\ntemplate = \"$request_uri $status $consumer $auth_result\"\n\n\
             {}[[routes]]\nid = \"orders\"\nupstream = \"up\"\nauth = \"partners\"\n",
            log.display(),
            partners("from = [\"header:x-api-key\", \"query:api_key\"]")
        ),
    )));
    let (status, _, echoed) = get(&format!("{url}/echo?a=1&api_key={BETA_KEY}&b=2"), &[]).await;
    assert_eq!(status, 200, "{echoed}");
    assert!(echoed.starts_with("GET /echo?a=1&b=2 "), "{echoed}");
    let (status, _, _) = get(&format!("{url}/echo?api_key=wrong"), &[]).await;
    assert_eq!(status, 401);
    let (status, _, _) = get(&format!("{url}/echo"), &[]).await;
    assert_eq!(status, 401);
    assert!(server.shutdown(Duration::from_secs(5)).await);
    let logged = std::fs::read_to_string(&log).expect("the access log");
    // Each serving thread writes its own buffer: the lines' order is not the requests'.
    let mut lines: Vec<&str> = logged.lines().collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "/echo 401 - invalid",
            "/echo 401 - missing",
            "/echo?a=1&b=2 200 beta ok",
        ],
        "neither key is written to the log"
    );
}

#[tokio::test]
async fn any_one_of_a_routes_authenticators_lets_a_request_through() {
    let upstream = Upstream::start().await;
    let (server, url) = support::start(config(&gateway(
        upstream.addr,
        &format!(
            "{}[[auth]]\nname = \"internal\"\ntype = \"api_key\"\nfrom = \"header:x-internal-key\"\n\
             consumers = [{{ name = \"batch\", keys = [\"{}\"] }}]\n\n\
             [[routes]]\nid = \"orders\"\nupstream = \"up\"\nauth = [\"partners\", \"internal\"]\n",
            partners(""),
            sha256("internal-key")
        ),
    )));
    let (status, _, _) = get(&format!("{url}/x"), &[("x-api-key", ACME_KEY)]).await;
    assert_eq!(status, 200);
    let (status, _, _) = get(&format!("{url}/x"), &[("x-internal-key", "internal-key")]).await;
    assert_eq!(status, 200);
    // Nothing presented: the first authenticator's refusal.
    let (status, head, _) = get(&format!("{url}/x"), &[]).await;
    assert_eq!(status, 401);
    assert_eq!(head["www-authenticate"], "ApiKey realm=\"partners\"");
    // A wrong key for the second: its refusal, which says more than the first's "missing".
    let (status, head, _) = get(&format!("{url}/x"), &[("x-internal-key", "guess")]).await;
    assert_eq!(status, 401);
    assert_eq!(head["www-authenticate"], "ApiKey realm=\"internal\"");
    let text = metrics_text(&server);
    for line in [
        "tailguard_auth_requests_total{route=\"orders\",auth=\"partners\",result=\"ok\"} 1",
        "tailguard_auth_requests_total{route=\"orders\",auth=\"internal\",result=\"ok\"} 1",
        "tailguard_auth_requests_total{route=\"orders\",auth=\"partners\",result=\"missing\"} 1",
        "tailguard_auth_requests_total{route=\"orders\",auth=\"internal\",result=\"invalid\"} 1",
        "tailguard_auth_requests_total{route=\"orders\",auth=\"internal\",result=\"missing\"} 0",
    ] {
        assert!(has_line(&text, line), "no `{line}` in:\n{text}");
    }
    server.shutdown(Duration::from_secs(5)).await;
}

/// Polls `f` until it returns true, for at most 15 s (the watcher looks every 500 ms).
pub(crate) async fn eventually(mut f: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn a_keys_file_is_re_read_when_it_changes_and_a_reload_refuses_a_removed_key_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let keys = dir.path().join("keys.txt");
    std::fs::write(&keys, format!("# partners\nacme {}\n", sha256(ACME_KEY))).expect("write");
    let upstream = Upstream::start().await;
    let text = |inline: bool| {
        gateway(
            upstream.addr,
            &format!(
                "[[auth]]\nname = \"partners\"\ntype = \"api_key\"\nkeys_file = \"keys.txt\"\n{}\n\
                 [[routes]]\nid = \"orders\"\nupstream = \"up\"\nauth = \"partners\"\n",
                if inline {
                    format!(
                        "consumers = [{{ name = \"beta\", keys = [\"{}\"] }}]\n",
                        sha256(BETA_KEY)
                    )
                } else {
                    String::new()
                }
            ),
        )
    };
    let parse = |t: &str| tailguard_proxy::Config::parse(t, "gw.toml", dir.path()).expect("valid");
    let (server, url) = support::start(parse(&text(true)));
    let with = |key: &'static str| {
        let url = url.clone();
        async move { get(&format!("{url}/x"), &[("x-api-key", key)]).await.0 }
    };
    assert_eq!(with(ACME_KEY).await, 200);
    assert_eq!(with(BETA_KEY).await, 200);

    // beta's key added to the file, acme's removed: the watcher swaps the keys in.
    std::fs::write(&keys, format!("acme2 {}\n", sha256("acme-rotated"))).expect("rewrite");
    assert!(
        eventually(async || with(ACME_KEY).await == 401).await,
        "the removed key is refused once the file is re-read"
    );
    assert_eq!(with("acme-rotated").await, 200);
    assert_eq!(with(BETA_KEY).await, 200, "inline consumers stay");

    // A file that no longer parses leaves the last good keys in force.
    std::fs::write(&keys, "acme2 sha256:not-hex\n").expect("garble");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(with("acme-rotated").await, 200);

    // A reload without beta: refused by the very next request.
    std::fs::write(&keys, format!("acme2 {}\n", sha256("acme-rotated"))).expect("repair");
    server.reload(parse(&text(false))).expect("reload");
    assert_eq!(with(BETA_KEY).await, 401);
    assert_eq!(with("acme-rotated").await, 200);
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_rate_limit_per_consumer_counts_each_consumer_apart() {
    let upstream = Upstream::start().await;
    let (server, url) = support::start(config(&gateway(
        upstream.addr,
        &format!(
            "{}[[routes]]\nid = \"orders\"\nupstream = \"up\"\nauth = \"partners\"\n\
             rate_limit = {{ rate = 1, per = \"hour\", key = \"consumer\" }}\n",
            partners("")
        ),
    )));
    let (status, _, _) = get(&format!("{url}/x"), &[("x-api-key", ACME_KEY)]).await;
    assert_eq!(status, 200);
    let (status, head, _) = get(&format!("{url}/x"), &[("x-api-key", ACME_KEY)]).await;
    assert_eq!(status, 429);
    assert!(head.contains_key("retry-after"));
    // Another consumer from the same address has its own bucket.
    let (status, _, _) = get(&format!("{url}/x"), &[("x-api-key", BETA_KEY)]).await;
    assert_eq!(status, 200);
    // A refused request is refused by auth, not counted against a consumer.
    let (status, _, _) = get(&format!("{url}/x"), &[("x-api-key", "nope")]).await;
    assert_eq!(status, 401);
    server.shutdown(Duration::from_secs(5)).await;
}

#[test]
fn auth_config_errors_name_the_file_the_line_and_the_field() {
    let acme = sha256(ACME_KEY);
    let beta = sha256(BETA_KEY);
    let text = format!(
        r#"[[listeners]]
address = "127.0.0.1:0"
rate_limit = {{ rate = 5, key = "consumer" }}

[[upstreams]]
name = "up"
endpoints = [{{ address = "127.0.0.1:1" }}]

[[auth]]
name = "partners"
type = "api_key"
consumers = [{{ name = "acme", keys = ["{acme}", "sha256:abc"] }}]

[[auth]]
name = "partners"
type = "api_key"
from = ["cookie:k"]
consumers = [{{ name = "beta", keys = ["{beta}"] }}, {{ name = "gamma", keys = ["{beta}"] }}]

[[auth]]
name = "idp"
type = "saml"

[[auth]]
name = "other"
type = "api_key"
jwks = "x"

[[routes]]
id = "a"
upstream = "up"
auth = ["partners", "nobody", "partners"]

[[routes]]
id = "b"
upstream = "up"
rate_limit = {{ rate = 1, key = "consumer" }}

[[routes]]
id = "c"
upstream = "up"
auth = []
"#
    );
    let errors = config_errors(&text);
    let expected = [
        "gw.toml:3:32: listeners[0].rate_limit.key: `consumer` is a route's key: a listener's limit is checked before authentication",
        "gw.toml:12:114: auth[0].consumers[0].keys[1]: `sha256:` needs 64 hex digits, found 3 characters",
        "gw.toml:15:8: auth[1].name: duplicate auth name `partners`",
        "gw.toml:17:9: auth[1].from: `cookie:` is not a source here; expected `header:NAME` or `query:NAME`",
        "gw.toml:18:143: auth[1].consumers[1].keys[0]: the same key as one of `beta`'s",
        "gw.toml:22:8: auth[2].type: unknown type `saml`, expected one of `api_key`, `basic`, `forward`, `jwt`",
        "gw.toml:27:1: auth[3]: unknown field `jwks`, expected one of `name`, `type`, `from`, `consumers`, `keys_file`, `forward_key`",
        "gw.toml:32:21: routes[0].auth: unknown auth `nobody` (no `[[auth]]` with that name)",
        "gw.toml:32:31: routes[0].auth: `partners` is listed twice",
        "gw.toml:37:32: routes[1].rate_limit.key: `consumer` needs the route's `auth` (an open route has no consumer)",
        "gw.toml:42:8: routes[2].auth: lists no authenticator; remove `auth` for an open route",
    ];
    assert_eq!(errors, expected, "{errors:#?}");
}

#[test]
fn a_keys_file_that_does_not_parse_is_named_with_its_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("keys.txt"), "acme sha256:zz\n").expect("write");
    let errors = config_errors_in(
        dir.path(),
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[auth]]\nname = \"p\"\ntype = \"api_key\"\nkeys_file = \"keys.txt\"\n",
    );
    let file = dir.path().join("keys.txt");
    assert_eq!(
        errors,
        [format!(
            "gw.toml:7:13: auth[0].keys_file: {}:1: `sha256:` needs 64 hex digits, found 2 characters",
            file.display()
        )]
    );
}

//! `type = "basic"` through the real gateway, against htpasswd files written by Apache's own
//! `htpasswd` in each format it writes (bcrypt `-B`, apr1 `-m`, SHA-1 `-s`): the challenge,
//! each format accepted and wrong passwords refused, the credentials kept from the upstream,
//! a changed file read again (and what was remembered of the old one forgotten), the
//! metrics, and the config's errors.

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use http::Request;
use tailguard_test_support::{Upstream, http1_client};

use crate::auth::eventually;
use crate::support::{self, config, config_errors, empty, metrics_text, within};
use tailguard_test_support::credentials::htpasswd_add;

fn basic(user: &str, password: &str) -> String {
    let pair = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {pair}")
}

/// `GET url` with `Authorization` if given: status, response headers, body.
async fn get(url: &str, authorization: Option<&str>) -> (u16, http::HeaderMap, String) {
    let mut req = Request::get(url);
    if let Some(a) = authorization {
        req = req.header("authorization", a);
    }
    let resp = within(http1_client().request(req.body(empty()).expect("request")))
        .await
        .expect("an answer");
    let status = resp.status().as_u16();
    let head = resp.headers().clone();
    (status, head, support::text(resp).await)
}

/// A gateway config: `/echo/private` (the echo upstream answers with the request it got)
/// behind `staff`, everything else open.
fn gateway(upstream: std::net::SocketAddr, htpasswd: &Path, extra: &str) -> String {
    format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{upstream}\" }}]\n\n\
         [[auth]]\nname = \"staff\"\ntype = \"basic\"\nhtpasswd = \"{}\"\nrealm = \"Staff only\"\n{extra}\n\
         [[routes]]\nid = \"private\"\nupstream = \"up\"\npath = {{ prefix = \"/echo/private\" }}\nauth = \"staff\"\n\n\
         [[routes]]\nid = \"open\"\nupstream = \"up\"\n",
        htpasswd.display()
    )
}

fn count(metrics: &str, route: &str, result: &str) -> u64 {
    metrics
        .lines()
        .find(|l| {
            l.starts_with("tailguard_auth_requests_total{")
                && l.contains(&format!("route=\"{route}\""))
                && l.contains("auth=\"staff\"")
                && l.contains(&format!("result=\"{result}\""))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {route}/{result} series in:\n{metrics}"))
}

#[tokio::test]
async fn each_format_htpasswd_writes_is_accepted_and_nothing_else_is() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("staff.htpasswd");
    htpasswd_add(&file, "-B", "bea", "bcrypt pass");
    htpasswd_add(&file, "-m", "abe", "apr1 pass, longer than sixteen bytes");
    htpasswd_add(&file, "-s", "sha", "sha pass");
    let text = std::fs::read_to_string(&file).expect("the file");
    for prefix in ["bea:$2y$04$", "abe:$apr1$", "sha:{SHA}"] {
        assert!(text.contains(prefix), "{prefix} in {text}");
    }
    let upstream = Upstream::start().await;
    let (server, url) = support::start(config(&gateway(upstream.addr, &file, "")));
    let private = format!("{url}/echo/private");

    let (status, head, _) = get(&private, None).await;
    assert_eq!(status, 401);
    assert_eq!(
        head["www-authenticate"],
        "Basic realm=\"Staff only\", charset=\"UTF-8\""
    );
    for (user, password) in [
        ("bea", "bcrypt pass"),
        ("abe", "apr1 pass, longer than sixteen bytes"),
        ("sha", "sha pass"),
    ] {
        // Twice: the second is the remembered success.
        for _ in 0..2 {
            let (status, _, body) = get(&private, Some(&basic(user, password))).await;
            assert_eq!(status, 200, "{user}: {body}");
            assert!(body.starts_with("GET /echo/private HTTP/1.1"), "{body}");
            // The credentials stop at the gateway.
            assert!(
                !body.to_ascii_lowercase().contains("authorization"),
                "{body}"
            );
        }
        for wrong in [
            format!("{password}x"),
            String::new(),
            password.to_uppercase(),
        ] {
            let (status, head, _) = get(&private, Some(&basic(user, &wrong))).await;
            assert_eq!(status, 401, "{user} with {wrong:?}");
            assert!(head.contains_key("www-authenticate"));
        }
    }
    for bad in [
        basic("nobody", "bcrypt pass"),
        "Basic not-base64!".to_owned(),
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("no colon")
        ),
    ] {
        assert_eq!(get(&private, Some(&bad)).await.0, 401, "{bad}");
    }
    // Another scheme is no basic credential: missing, as with none.
    assert_eq!(get(&private, Some("Bearer abc")).await.0, 401);
    // The open route asks for nothing.
    assert_eq!(get(&format!("{url}/"), None).await.0, 200);
    let metrics = metrics_text(&server);
    assert_eq!(count(&metrics, "private", "ok"), 6);
    assert_eq!(count(&metrics, "private", "missing"), 2);
    assert_eq!(count(&metrics, "private", "invalid"), 12);
    assert_eq!(count(&metrics, "private", "busy"), 0);
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn forward_credentials_lets_the_upstream_see_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("h");
    htpasswd_add(&file, "-s", "sha", "pw");
    let upstream = Upstream::start().await;
    let (server, url) = support::start(config(&gateway(
        upstream.addr,
        &file,
        "forward_credentials = true\n",
    )));
    let (status, _, body) = get(&format!("{url}/echo/private"), Some(&basic("sha", "pw"))).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.lines()
            .any(|l| l.eq_ignore_ascii_case(&format!("authorization: {}", basic("sha", "pw")))),
        "{body}"
    );
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_changed_file_is_read_again_and_what_the_old_one_let_in_is_forgotten() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("staff.htpasswd");
    htpasswd_add(&file, "-B", "ann", "first");
    let upstream = Upstream::start().await;
    let (server, url) = support::start(config(&gateway(
        upstream.addr,
        &file,
        "remember_s = 3600\n",
    )));
    let private = format!("{url}/echo/private");
    // Remembered on whichever serving thread answered, for an hour.
    for _ in 0..4 {
        assert_eq!(get(&private, Some(&basic("ann", "first"))).await.0, 200);
    }
    // ann's password changes and bob is added, in one new version of the file.
    let next = dir.path().join("next.htpasswd");
    htpasswd_add(&next, "-B", "ann", "second");
    htpasswd_add(&next, "-m", "bob", "bobs");
    std::fs::rename(&next, &file).expect("replace the file");
    let bob = basic("bob", "bobs");
    assert!(
        eventually(async || get(&private, Some(&bob)).await.0 == 200).await,
        "the new file was not read"
    );
    // The old password is refused on every thread, remembered or not.
    for _ in 0..4 {
        assert_eq!(get(&private, Some(&basic("ann", "first"))).await.0, 401);
    }
    assert_eq!(get(&private, Some(&basic("ann", "second"))).await.0, 200);
    // A version that does not parse leaves the last good one in force.
    std::fs::write(&file, "ann:plain-text\n").expect("write");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(get(&private, Some(&basic("ann", "second"))).await.0, 200);
    server.shutdown(Duration::from_secs(5)).await;
}

#[test]
fn basic_config_errors_name_the_file_the_line_and_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("good.htpasswd");
    htpasswd_add(&good, "-B", "bea", "x");
    let bad = dir.path().join("bad.htpasswd");
    htpasswd_add(&bad, "-m", "abe", "x");
    htpasswd_add(&bad, "-d", "des", "x");
    let text = format!(
        r#"[[listeners]]
address = "127.0.0.1:0"

[[upstreams]]
name = "up"
endpoints = [{{ address = "127.0.0.1:1" }}]

[[auth]]
name = "a"
type = "basic"
htpasswd = "{bad}"

[[auth]]
name = "b"
type = "basic"
htpasswd = "{good}"
realm = "say \"hi\""
workers = 9
queue = 0
remember_s = 7200

[[auth]]
name = "c"
type = "basic"
htpasswd = "{good}"
jwks = "x"

[[routes]]
id = "r"
upstream = "up"
auth = ["a", "b"]
"#,
        bad = bad.display(),
        good = good.display()
    );
    let errors = config_errors(&text);
    let expected = [
        format!(
            "gw.toml:11:12: auth[0].htpasswd: {}:2: user `des`: not a hash this gateway reads \
             (bcrypt `$2y$`, `$apr1$` or `{{SHA}}`); crypt DES (`-d`) and plain text (`-p`) are \
             refused; use `htpasswd -B`",
            bad.display()
        ),
        "gw.toml:17:9: auth[1].realm: no `\"`, `\\` or control characters (it is quoted in `WWW-Authenticate`)".to_owned(),
        "gw.toml:18:11: auth[1].workers: 1..=4".to_owned(),
        "gw.toml:19:9: auth[1].queue: 1..=4096".to_owned(),
        "gw.toml:20:14: auth[1].remember_s: at most 3600 (an hour)".to_owned(),
        "gw.toml:26:1: auth[2]: unknown field `jwks`, expected one of `name`, `type`, `htpasswd`, `realm`, `remember_s`, `workers`, `queue`, `forward_credentials`".to_owned(),
    ];
    assert_eq!(errors, expected, "{errors:#?}");
}

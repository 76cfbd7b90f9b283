//! `type = "basic"` on its own: which checks go to the pool, what is remembered, and the
//! answer of a full pool; htpasswd files written by the real `htpasswd`.

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use tailguard_auth::{
    AuthRequest, AuthResult, Authenticate, Basic, BasicSettings, Outcome, Verdict,
};
use tailguard_test_support::credentials::htpasswd_add;

fn basic(file: &Path, remember_s: u64, queue: usize) -> Basic {
    Basic::build(BasicSettings {
        name: "staff".into(),
        htpasswd: file.to_owned(),
        realm: "staff".into(),
        remember: Duration::from_secs(remember_s),
        workers: 1,
        queue,
        forward_credentials: false,
    })
    .expect("the authenticator builds")
}

/// Asks `auth` about a request with `Authorization: Basic user:password`.
async fn ask(auth: &Basic, user: &str, password: &str) -> Outcome {
    let mut headers = HeaderMap::new();
    let pair = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    headers.insert(
        "authorization",
        HeaderValue::from_str(&format!("Basic {pair}")).expect("base64 is a header value"),
    );
    let uri = Uri::from_static("/x");
    let req = AuthRequest {
        method: &Method::GET,
        uri: &uri,
        headers: &headers,
        peer: "127.0.0.1:1".parse().expect("an address"),
        client: "127.0.0.1".parse().expect("an address"),
        tls: false,
        route: "r",
    };
    match auth.check(&req) {
        Verdict::Ready(o) => o,
        Verdict::Pending(p) => p.await,
    }
}

fn accepted(o: &Outcome) -> Option<&str> {
    match o {
        Outcome::Accepted(a) => a.consumer.as_deref(),
        Outcome::Refused(_) => None,
    }
}

#[tokio::test(flavor = "current_thread")]
async fn slow_hashes_go_to_the_pool_once_and_successes_are_remembered() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("h");
    htpasswd_add(&file, "-B", "bea", "b-pass");
    htpasswd_add(&file, "-m", "abe", "a-pass");
    htpasswd_add(&file, "-s", "sha", "s-pass");
    let auth = basic(&file, 60, 8);
    assert_eq!(auth.user_count(), 3);
    for (user, password, pooled) in [
        ("bea", "b-pass", 1),
        ("abe", "a-pass", 2),
        ("sha", "s-pass", 2),
    ] {
        for _ in 0..3 {
            assert_eq!(accepted(&ask(&auth, user, password).await), Some(user));
        }
        // The first check of a slow hash went to the pool; the next two were remembered. A
        // `{SHA}` check never goes there.
        assert_eq!(auth.pooled_checks(), pooled, "{user}");
    }
    // Wrong passwords are never remembered: each is a check.
    for i in 0..3 {
        let o = ask(&auth, "bea", &format!("wrong-{i}")).await;
        match o {
            Outcome::Refused(r) => {
                assert_eq!(
                    (r.status, r.result),
                    (StatusCode::UNAUTHORIZED, AuthResult::Invalid)
                );
                assert_eq!(
                    r.headers["www-authenticate"],
                    "Basic realm=\"staff\", charset=\"UTF-8\""
                );
            }
            Outcome::Accepted(_) => panic!("a wrong password passed"),
        }
    }
    assert_eq!(auth.pooled_checks(), 5);
    // An unknown user is refused without a check.
    assert!(accepted(&ask(&auth, "nobody", "b-pass").await).is_none());
    assert_eq!(auth.pooled_checks(), 5);

    // `remember_s = 0`: every request is a check.
    let forgetful = basic(&file, 0, 8);
    for _ in 0..3 {
        assert_eq!(
            accepted(&ask(&forgetful, "bea", "b-pass").await),
            Some("bea")
        );
    }
    assert_eq!(forgetful.pooled_checks(), 3);
}

#[tokio::test(flavor = "current_thread")]
async fn a_full_pool_answers_503_busy_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("h");
    htpasswd_add(&file, "-B", "bea", "b-pass");
    htpasswd_add(&file, "-s", "sha", "s-pass");
    let auth = basic(&file, 60, 1);
    // The pool's one thread takes a job that waits until told; one more fills the queue.
    let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
    let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
    let held = auth
        .pool()
        .try_run(move || {
            started_tx.send(()).unwrap();
            hold_rx.recv().is_ok()
        })
        .unwrap();
    started_rx.recv().unwrap();
    let queued = auth.pool().try_run(|| true).unwrap();
    match ask(&auth, "bea", "b-pass").await {
        Outcome::Refused(r) => {
            assert_eq!(
                (r.status, r.result),
                (StatusCode::SERVICE_UNAVAILABLE, AuthResult::Busy)
            );
            assert_eq!(r.headers["retry-after"], "1");
        }
        Outcome::Accepted(_) => panic!("checked without the pool"),
    }
    // A `{SHA}` user needs no pool: still served.
    assert_eq!(accepted(&ask(&auth, "sha", "s-pass").await), Some("sha"));
    hold_tx.send(()).unwrap();
    assert!(held.await.unwrap());
    assert!(queued.await.unwrap());
    assert_eq!(accepted(&ask(&auth, "bea", "b-pass").await), Some("bea"));
}

#[test]
fn a_file_with_a_hash_it_cannot_read_is_refused_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("h");
    htpasswd_add(&file, "-B", "bea", "b-pass");
    htpasswd_add(&file, "-5", "six", "x");
    htpasswd_add(&file, "-p", "plain", "x");
    let err = tailguard_auth::basic::read_htpasswd(&file).unwrap_err();
    assert!(
        err.starts_with(&format!(
            "{}:2: user `six`: SHA-256/512-crypt",
            file.display()
        )),
        "{err}"
    );
}

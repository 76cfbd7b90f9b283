//! Config from etcd over TLS and with etcd's authentication, through the binary, against a
//! real etcd (`tailguard_test_support::etcd`): one requiring client certificates
//! (`--client-cert-auth --trusted-ca-file --cert-file --key-file`) and one with
//! `auth enable` and short-lived tokens. `run`, `config push` and `config get` over mutual
//! TLS and with a password; each refusal (no client certificate, an untrusted server, a
//! wrong or missing password) exits 69 from `run` and `get` naming its cause, and `push`
//! writes nothing; an expired token is renewed without re-opening the watch; a rotated
//! password is read from its file on SIGHUP.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use tailguard_etcd::{Client, ConnectOptions, Tls};
use tailguard_test_support::etcd::{EtcdPki, EtcdServer};
use tailguard_test_support::{TestCa, Upstream};

use crate::support::Gateway;

const KEY: &str = "/tailguard/config";
const PASSWORD: &str = "gateway-password";

fn tailguard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tailguard"))
        .args(args)
        .output()
        .expect("run tailguard")
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write file");
    path
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A config routing everything to `upstream`, with a route `/{extra}` when given.
fn document(upstream: SocketAddr, extra: Option<&str>) -> String {
    let mut doc = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[[upstreams]]\nname = \"up\"\n\
         endpoints = [{{ address = \"{upstream}\" }}]\n\n"
    );
    if let Some(extra) = extra {
        doc.push_str(&format!(
            "[[routes]]\nid = \"{extra}\"\nupstream = \"up\"\npath = {{ prefix = \"/{extra}\" }}\n\n"
        ));
    }
    doc.push_str("[[routes]]\nid = \"all\"\nupstream = \"up\"\npath = { prefix = \"/\" }\n");
    doc
}

/// Runs one etcd call on a runtime of its own.
fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// The stored revision of the key (0 if it does not exist), read with `options` (TLS,
/// credentials) by the test's own client.
fn stored_revision(etcd: &EtcdServer, options: &ConnectOptions) -> i64 {
    block_on(async {
        let mut c = Client::connect(&[etcd.url()], options)
            .await
            .expect("etcd client");
        c.get(KEY)
            .await
            .expect("etcd get")
            .into_first()
            .map_or(0, |kv| kv.mod_revision)
    })
}

fn mutual_tls(pki: &EtcdPki) -> Tls {
    let read = |p: &Path| std::fs::read(p).expect("read pem");
    Tls::system_roots()
        .with_ca_pem(&read(&pki.ca))
        .expect("ca")
        .with_client_cert_pem(&read(&pki.client_cert), &read(&pki.client_key))
        .expect("client cert")
}

/// `run` with `etcd_args` must exit 69 naming `cause`, without waiting out its timeout;
/// `config get` likewise; `config push` must fail and leave the stored revision as it was.
fn refused_everywhere(
    etcd_args: &[&str],
    cause: &str,
    file: &Path,
    stored: &mut dyn FnMut() -> i64,
) {
    let before = stored();
    // A long timeout: a refusal ends the start at once instead of being retried until then.
    let mut run = vec![
        "run",
        "--metrics-listen",
        "off",
        "--etcd-timeout-ms",
        "60000",
    ];
    run.extend_from_slice(etcd_args);
    let out = tailguard(&run);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "run: {stderr}");
    assert!(
        stderr.contains(cause),
        "run names the cause {cause:?}: {stderr}"
    );
    assert!(
        !stderr.contains("within 60000 ms"),
        "a refusal is not retried until the timeout: {stderr}"
    );

    let mut get = vec!["config", "get"];
    get.extend_from_slice(etcd_args);
    let out = tailguard(&get);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "get: {stderr}");
    assert!(
        stderr.contains(cause),
        "get names the cause {cause:?}: {stderr}"
    );
    assert!(out.stdout.is_empty());

    let mut push = vec!["config", "push", path(file)];
    push.extend_from_slice(etcd_args);
    let out = tailguard(&push);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "push: {stderr}");
    assert!(
        stderr.contains(cause),
        "push names the cause {cause:?}: {stderr}"
    );
    assert!(stderr.contains("nothing written"), "{stderr}");
    assert_eq!(stored(), before, "push wrote nothing");
}

#[test]
fn over_mutual_tls_push_get_and_run_follow_the_key() {
    let Some(etcd) = EtcdServer::builder().client_cert_auth().start() else {
        return;
    };
    let pki = etcd.pki().expect("tls").clone();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let up = rt.block_on(Upstream::builder().body("up").start());
    let dir = tempfile::tempdir().unwrap();
    // The bootstrap file names its certificates relative to itself.
    for (from, to) in [
        (&pki.ca, "ca.pem"),
        (&pki.client_cert, "client.pem"),
        (&pki.client_key, "client.key"),
    ] {
        std::fs::copy(from, dir.path().join(to)).expect("copy pem");
    }
    let bootstrap = write(
        dir.path(),
        "bootstrap.toml",
        &format!(
            "[etcd]\nendpoints = [\"{}\"]\nkey = \"{KEY}\"\n\
             tls = {{ ca = \"ca.pem\", cert = \"client.pem\", key = \"client.key\" }}\n",
            etcd.url()
        ),
    );
    let first = write(dir.path(), "first.toml", &document(up.addr, None));
    let out = tailguard(&[
        "config",
        "push",
        path(&first),
        "--bootstrap",
        path(&bootstrap),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r1: i64 = text(&out.stdout).trim().parse().expect("revision");

    // The same with flags.
    let url = etcd.url();
    let flags = [
        "--etcd",
        &url,
        "--etcd-key",
        KEY,
        "--etcd-ca",
        path(&pki.ca),
        "--etcd-cert",
        path(&pki.client_cert),
        "--etcd-cert-key",
        path(&pki.client_key),
    ];
    let mut get = vec!["config", "get"];
    get.extend_from_slice(&flags);
    let out = tailguard(&get);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), document(up.addr, None));
    assert!(text(&out.stderr).contains(&format!("etcd:{KEY}@{r1}")));

    let mut args = vec!["--threads", "1", "--metrics-listen", "off"];
    args.extend_from_slice(&flags);
    let from_flags = Gateway::run(&args);
    let from_file = Gateway::run(&[
        "--bootstrap",
        path(&bootstrap),
        "--threads",
        "1",
        "--metrics-listen",
        "off",
    ]);
    let second = write(dir.path(), "second.toml", &document(up.addr, Some("two")));
    let out = tailguard(&[
        "config",
        "push",
        path(&second),
        "--bootstrap",
        path(&bootstrap),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r2: i64 = text(&out.stdout).trim().parse().expect("revision");
    for gw in [&from_flags, &from_file] {
        gw.wait_for_log(
            &format!("reloaded etcd:{KEY}@{r2}"),
            Duration::from_secs(10),
        );
    }
}

#[test]
fn no_client_certificate_or_an_untrusted_server_exits_69_naming_the_cause() {
    let Some(etcd) = EtcdServer::builder().client_cert_auth().start() else {
        return;
    };
    let pki = etcd.pki().expect("tls").clone();
    let admin = ConnectOptions::new().with_tls(mutual_tls(&pki));
    let mut stored = || stored_revision(&etcd, &admin);
    let dir = tempfile::tempdir().unwrap();
    let up: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let file = write(dir.path(), "config.toml", &document(up, None));
    block_on(async {
        let mut c = Client::connect(&[etcd.url()], &admin)
            .await
            .expect("client");
        c.put(KEY, document(up, None)).await.expect("put");
    });
    let url = etcd.url();

    // No client certificate.
    refused_everywhere(
        &[
            "--etcd",
            &url,
            "--etcd-key",
            KEY,
            "--etcd-ca",
            path(&pki.ca),
        ],
        "etcd requires a client certificate and none is configured",
        &file,
        &mut stored,
    );

    // A server certificate not signed by the CA given.
    let other = dir.path().join("other-ca.pem");
    TestCa::new("unrelated").write(&other);
    let untrusted = [
        "--etcd",
        &url,
        "--etcd-key",
        KEY,
        "--etcd-ca",
        path(&other),
        "--etcd-cert",
        path(&pki.client_cert),
        "--etcd-cert-key",
        path(&pki.client_key),
    ];
    refused_everywhere(
        &untrusted,
        "the etcd server's certificate is not trusted by the configured CA",
        &file,
        &mut stored,
    );

    // From a bootstrap file, with no CA: the system's roots do not know the test CA.
    let bootstrap = write(
        dir.path(),
        "bootstrap.toml",
        &format!(
            "[etcd]\nendpoints = [\"{url}\"]\nkey = \"{KEY}\"\ntls = {{ cert = \"{}\", key = \"{}\" }}\n",
            path(&pki.client_cert),
            path(&pki.client_key)
        ),
    );
    refused_everywhere(
        &["--bootstrap", path(&bootstrap)],
        "the etcd server's certificate is not trusted by the system's root certificates",
        &file,
        &mut stored,
    );
}

/// A bootstrap file in `dir` for etcd at `url` as user `root`, its password in `dir/password`.
fn password_bootstrap(dir: &Path, url: &str) -> PathBuf {
    write(
        dir,
        "bootstrap.toml",
        &format!(
            "[etcd]\nendpoints = [\"{url}\"]\nkey = \"{KEY}\"\nusername = \"root\"\n\
             password_file = \"password\"\n"
        ),
    )
}

/// `tailguard config push FILE --bootstrap BOOTSTRAP`, which must succeed: the revision.
fn push_with(bootstrap: &Path, file: &Path) -> i64 {
    let out = tailguard(&["config", "push", path(file), "--bootstrap", path(bootstrap)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).trim().parse().expect("revision")
}

/// A `root` user with `password`, then `auth enable`.
fn enable_auth(etcd: &EtcdServer, password: &str) {
    block_on(async {
        let mut c = Client::connect(&[etcd.url()], &ConnectOptions::new())
            .await
            .expect("client");
        c.user_add("root", password).await.expect("user add");
        c.user_grant_role("root", "root").await.expect("grant");
        c.auth_enable().await.expect("auth enable");
    });
}

#[test]
fn with_etcd_auth_a_wrong_or_missing_password_exits_69_and_a_token_expiry_keeps_the_watch() {
    let Some(etcd) = EtcdServer::builder()
        .arg("--auth-token=simple")
        .arg("--auth-token-ttl=1")
        .start()
    else {
        return;
    };
    enable_auth(&etcd, PASSWORD);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let up = rt.block_on(Upstream::builder().body("up").start());
    let dir = tempfile::tempdir().unwrap();
    // Named relative to the bootstrap file below.
    write(dir.path(), "password", &format!("{PASSWORD}\n"));
    let wrong_file = write(dir.path(), "wrong", "not-the-password\n");
    let admin = ConnectOptions::new().with_credentials("root", PASSWORD);
    let mut stored = || stored_revision(&etcd, &admin);
    let first = write(dir.path(), "first.toml", &document(up.addr, None));
    let url = etcd.url();

    refused_everywhere(
        &[
            "--etcd",
            &url,
            "--etcd-key",
            KEY,
            "--etcd-username",
            "root",
            "--etcd-password-file",
            path(&wrong_file),
        ],
        "etcd authentication failed: wrong user name or password",
        &first,
        &mut stored,
    );
    refused_everywhere(
        &["--etcd", &url, "--etcd-key", KEY],
        "etcd requires authentication (a user name and password) and none is configured",
        &first,
        &mut stored,
    );

    // With the password (in the bootstrap file): push, then a gateway follows the key.
    let bootstrap = password_bootstrap(dir.path(), &url);
    let push = |file: &Path| push_with(&bootstrap, file);
    let r1 = push(&first);
    let gw = Gateway::run(&[
        "--bootstrap",
        path(&bootstrap),
        "--threads",
        "1",
        "--metrics-listen",
        "off",
    ]);
    gw.wait_for_log("watching etcd:", Duration::from_secs(10));

    // The gateway's token expires while its watch is open (a simple token's TTL, 1 s here,
    // restarts at each use, and etcd drops expired tokens on a 1 s tick: the wait is
    // retried rather than trusted). A SIGHUP's read then needs a new one.
    let mut reloads = 0;
    for attempt in 1..=5u64 {
        std::thread::sleep(Duration::from_secs(2 + attempt));
        gw.signal("HUP");
        reloads += 1;
        let needle = format!("reloaded etcd:{KEY}@{r1}");
        let start = std::time::Instant::now();
        while gw.log().matches(&needle).count() < reloads {
            assert!(start.elapsed() < Duration::from_secs(10), "{}", gw.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        if gw.log().contains("auth token expired and was renewed") {
            break;
        }
    }
    let log = gw.log();
    assert!(log.contains("auth token expired and was renewed"), "{log}");

    // The watch opened with the expired token still delivers a change.
    let second = write(dir.path(), "second.toml", &document(up.addr, Some("two")));
    let r2 = push(&second);
    gw.wait_for_log(
        &format!("reloaded etcd:{KEY}@{r2}"),
        Duration::from_secs(10),
    );
    let log = gw.log();
    assert_eq!(
        log.matches("watching etcd:").count(),
        1,
        "the watch was never re-opened: {log}"
    );
    assert!(!log.contains("lost"), "{log}");
}

/// Waits until `needle` is in the gateway's log `count` times.
fn wait_for_count(gw: &Gateway, needle: &str, count: usize) {
    let start = std::time::Instant::now();
    while gw.log().matches(needle).count() < count {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{needle} x{count}: {}",
            gw.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A password rotation without a restart: the password changed in etcd (which invalidates
/// the gateway's token), then in the password file, then SIGHUP: the gateway reconnects with
/// the new one and follows the key again. A password file that is empty at a SIGHUP is
/// reported and the password in use stays.
#[test]
fn sighup_reads_the_etcd_password_file_again_and_a_rotated_password_keeps_the_watch_going() {
    const ROTATED: &str = "rotated-password";
    let Some(etcd) = EtcdServer::builder().arg("--auth-token=simple").start() else {
        return;
    };
    enable_auth(&etcd, PASSWORD);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let up = rt.block_on(Upstream::builder().body("up").start());
    let dir = tempfile::tempdir().unwrap();
    let password_file = write(dir.path(), "password", &format!("{PASSWORD}\n"));
    let url = etcd.url();
    let bootstrap = password_bootstrap(dir.path(), &url);
    // `config push` reads the password file as it is at the time.
    let push = |file: &Path| push_with(&bootstrap, file);
    let r1 = push(&write(dir.path(), "first.toml", &document(up.addr, None)));
    let gw = Gateway::run(&[
        "--bootstrap",
        path(&bootstrap),
        "--threads",
        "1",
        "--metrics-listen",
        "off",
    ]);
    gw.wait_for_log("watching etcd:", Duration::from_secs(10));
    let reloaded_r1 = format!("reloaded etcd:{KEY}@{r1}");

    // An empty file at a SIGHUP: the password in use stays, and the key is read with it.
    std::fs::write(&password_file, "").expect("empty the password file");
    gw.signal("HUP");
    wait_for_count(&gw, &reloaded_r1, 1);
    let log = gw.log();
    assert!(
        log.contains("the file is empty; the password read before stays in use"),
        "{log}"
    );

    // The rotation: etcd first (the gateway's token dies with the old password), then the
    // file, then SIGHUP.
    block_on(async {
        let admin = ConnectOptions::new().with_credentials("root", PASSWORD);
        let mut c = Client::connect(&[etcd.url()], &admin)
            .await
            .expect("client");
        c.user_change_password("root", ROTATED)
            .await
            .expect("change the password");
    });
    std::fs::write(&password_file, format!("{ROTATED}\n")).expect("write the password file");
    gw.signal("HUP");
    // A new connection, authenticated with the new password, reads the key.
    wait_for_count(&gw, &reloaded_r1, 2);
    let log = gw.log();
    assert!(log.contains("the etcd password in"), "{log}");
    assert!(log.contains("changed; reconnecting with it"), "{log}");
    assert_eq!(log.matches("watching etcd:").count(), 2, "{log}");

    // And its watch delivers the next change (pushed with the new password).
    let r2 = push(&write(
        dir.path(),
        "second.toml",
        &document(up.addr, Some("two")),
    ));
    gw.wait_for_log(
        &format!("reloaded etcd:{KEY}@{r2}"),
        Duration::from_secs(10),
    );
    assert!(
        !gw.log().contains("wrong user name or password"),
        "{}",
        gw.log()
    );
}

#[test]
fn bad_tls_or_auth_settings_are_reported_with_their_position_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let run = |bootstrap: &Path| {
        let out = tailguard(&[
            "run",
            "--metrics-listen",
            "off",
            "--bootstrap",
            path(bootstrap),
        ]);
        assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
        text(&out.stderr)
    };
    let first = write(
        dir.path(),
        "first.toml",
        "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\nkey = \"/k\"\n\
         tls = { ca = \"missing.pem\" }\nusername = \"u\"\n",
    );
    let stderr = run(&first);
    let name = first.display();
    for expected in [
        format!(
            "{name}:2:14: etcd.endpoints[0]: `http://127.0.0.1:2379` is plain text but TLS \
             settings are given: use https://"
        ),
        format!(
            "{name}:4:14: etcd.tls.ca: cannot read {}",
            dir.path().join("missing.pem").display()
        ),
        format!("{name}:5:12: etcd.username: needs password_file"),
    ] {
        assert!(stderr.contains(&expected), "{expected:?} in {stderr}");
    }

    write(dir.path(), "junk.pem", "not a certificate\n");
    write(dir.path(), "empty", "");
    let second = write(
        dir.path(),
        "second.toml",
        "[etcd]\nendpoints = [\"https://127.0.0.1:2379\"]\nkey = \"/k\"\n\
         tls = { ca = \"junk.pem\" }\nusername = \"u\"\npassword_file = \"empty\"\n",
    );
    let stderr = run(&second);
    let name = second.display();
    for expected in [
        format!(
            "{name}:4:14: etcd.tls.ca: {}: no certificate found",
            dir.path().join("junk.pem").display()
        ),
        format!(
            "{name}:6:17: etcd.password_file: {}: the file is empty",
            dir.path().join("empty").display()
        ),
    ] {
        assert!(stderr.contains(&expected), "{expected:?} in {stderr}");
    }

    let third = write(
        dir.path(),
        "third.toml",
        "[etcd]\nendpoints = [\"https://127.0.0.1:2379\"]\nkey = \"/k\"\ntls = { cert = \"c.pem\" }\n",
    );
    let stderr = run(&third);
    let expected = format!(
        "{}:4:7: etcd.tls.key: a client certificate needs its key too",
        third.display()
    );
    assert!(stderr.contains(&expected), "{expected:?} in {stderr}");
}

//! h2spec, the HTTP/2 conformance suite (RFC 7540 and 7541), against an h2c and a TLS
//! listener: every case passes but the known deviations listed here and in `docs/http2.md`.
//!
//! h2spec is a real tool, installed by `scripts/install-tools` (`go install`, into
//! `$HOME/go/bin`); like promtool, a missing h2spec fails the test with a message saying so.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tailguard_proxy::Server;
use tailguard_test_support::{TestCert, Upstream};

use crate::support;

/// A case h2spec fails, on the listeners named, and why. Keep in step with `docs/http2.md`.
struct Deviation {
    /// h2spec's case id.
    id: &'static str,
    /// `h2c`, `tls`.
    listeners: &'static [&'static str],
    why: &'static str,
}

const KNOWN_DEVIATIONS: &[Deviation] = &[Deviation {
    id: "http2/3.5/2",
    listeners: &["h2c"],
    why: "A plain listener serves HTTP/1.1 and h2c on one port: bytes that do not start \
          with the HTTP/2 preface are an HTTP/1.1 request, so `INVALID CONNECTION \
          PREFACE` is answered `400 Bad Request` before the close h2spec expects. Over TLS \
          (ALPN h2) the connection closes without an answer, and the case passes.",
}];

/// The known deviations of `listener`.
fn deviations(listener: &str) -> impl Iterator<Item = &'static Deviation> + '_ {
    KNOWN_DEVIATIONS
        .iter()
        .filter(move |d| d.listeners.contains(&listener))
}

/// The whole run is bounded: h2spec waits at most 2 s per case (`-o 2`) and there are 146
/// of them, but a conforming server answers each at once (a run takes under a second).
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The h2spec binary: `$H2SPEC`, else `h2spec` on `PATH`, else where `scripts/install-tools`
/// puts it.
fn h2spec() -> PathBuf {
    if let Some(path) = std::env::var_os("H2SPEC") {
        return path.into();
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("h2spec"))
        .find(|p| p.is_file());
    let installed = std::env::var_os("HOME").map(|h| PathBuf::from(h).join("go/bin/h2spec"));
    on_path
        .or(installed.filter(|p| p.is_file()))
        .expect("h2spec is installed: run scripts/install-tools (go install, into $HOME/go/bin)")
}

/// How one case ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Passed,
    Failed,
    Skipped,
}

/// The outcome of each case of h2spec's text report, by h2spec's own case id
/// (`http2/6.5.3/2`, the form `h2spec http2/6.5.3/2` runs alone), and its summary line.
///
/// The report nests: a spec title at no indent (`Hypertext Transfer Protocol Version 2
/// (HTTP/2)`), sections (`6.5.3. Settings Synchronization`), then cases: `✔ 1: ...`,
/// `× 1: ...`, or `1: ...` when skipped. A failure's details follow it, indented further;
/// after the listing, a `Failures:` section repeats the failed cases.
fn parse_report(text: &str) -> (BTreeMap<String, Outcome>, String) {
    let mut cases = BTreeMap::new();
    let mut spec = "";
    let mut section = String::new();
    let mut summary = String::new();
    let mut listing = true;
    for line in text.lines() {
        // A case prints its title, then `\r` and its outcome over it on the same line.
        let line = line.rsplit('\r').next().unwrap_or(line);
        let trimmed = line.trim();
        if trimmed.ends_with(" failed") && trimmed.contains(" tests, ") {
            summary = trimmed.to_owned();
        }
        if trimmed.starts_with("Failures:") {
            listing = false;
        }
        if !listing || trimmed.is_empty() {
            continue;
        }
        if !line.starts_with(' ') {
            spec = if trimmed.starts_with("Generic") {
                "generic"
            } else if trimmed.starts_with("HPACK") {
                "hpack"
            } else if trimmed.starts_with("Hypertext") {
                "http2"
            } else {
                spec
            };
            continue;
        }
        let (outcome, rest) = match trimmed.split_once(' ') {
            Some(("✔", rest)) => (Outcome::Passed, rest),
            Some(("×", rest)) => (Outcome::Failed, rest),
            _ => (Outcome::Skipped, trimmed),
        };
        let Some((head, _)) = rest.split_once(' ') else {
            continue;
        };
        if let Some(n) = head.strip_suffix(':').filter(|n| n.parse::<u32>().is_ok()) {
            cases.insert(format!("{spec}/{section}/{n}"), outcome);
        } else if let Some(s) = head
            .strip_suffix('.')
            .filter(|s| s.split('.').all(|p| p.parse::<u32>().is_ok()))
        {
            section = s.to_owned();
        }
    }
    (cases, summary)
}

/// Runs h2spec against `port`, returning its report (stdout and stderr).
async fn run_h2spec(port: u16, tls: bool) -> String {
    let mut cmd = tokio::process::Command::new(h2spec());
    // -S: the strict cases too (RFC "SHOULD"s); -o 2: each case waits at most 2 s.
    // -P /echo: the upstream answers only once it has read the whole request, as a service
    // that reads the body does. A route answered at once (the default answer) may end its
    // stream before h2spec sends the frame a case is about (8.1/1: a second HEADERS without
    // END_STREAM); a stream already closed then ignores that frame instead of answering it
    // with the error the case waits for, and the case fails by chance, not by conformance.
    cmd.args([
        "-S",
        "-o",
        "2",
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-P",
        "/echo",
    ]);
    if tls {
        // -k: the test certificate is self-signed.
        cmd.args(["-t", "-k"]);
    }
    cmd.kill_on_drop(true);
    let out = tokio::time::timeout(RUN_TIMEOUT, cmd.output())
        .await
        .expect("h2spec finished within its bound")
        .expect("h2spec runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every case passed, or failed and is a known deviation; none was skipped; and every known
/// deviation still fails (one that passes now is taken off the list and out of the docs).
fn assert_conforms(listener: &str, report: &str) {
    let (cases, summary) = parse_report(report);
    assert!(
        cases.len() >= 140 && !summary.is_empty(),
        "{listener}: h2spec's report did not parse ({} cases):\n{report}",
        cases.len()
    );
    println!("h2spec over {listener}: {summary}");
    let failed: Vec<&str> = cases
        .iter()
        .filter(|(_, o)| **o == Outcome::Failed)
        .map(|(id, _)| id.as_str())
        .collect();
    let unexpected: Vec<&str> = failed
        .iter()
        .copied()
        .filter(|id| !deviations(listener).any(|d| d.id == *id))
        .collect();
    assert!(
        unexpected.is_empty(),
        "{listener}: h2spec cases failed that are not known deviations: {unexpected:?}\n{report}"
    );
    for d in deviations(listener) {
        println!("  known deviation {}: {}", d.id, d.why);
    }
    let skipped: Vec<&str> = cases
        .iter()
        .filter(|(_, o)| **o == Outcome::Skipped)
        .map(|(id, _)| id.as_str())
        .collect();
    assert!(
        skipped.is_empty(),
        "{listener}: h2spec skipped cases: {skipped:?}\n{report}"
    );
    let fixed: Vec<&str> = deviations(listener)
        .map(|d| d.id)
        .filter(|id| cases.get(*id) == Some(&Outcome::Passed))
        .collect();
    assert!(
        fixed.is_empty(),
        "{listener}: known deviations now pass; remove them here and in docs/http2.md: {fixed:?}"
    );
}

#[test]
fn the_report_parser_reads_ids_outcomes_and_the_summary() {
    let report = "\
Hypertext Transfer Protocol Version 2 (HTTP/2)
  6. Frame Definitions
    6.5. SETTINGS
        1: Sends a SETTINGS frame with ACK flag and payload\r      ✔ 1: Sends a SETTINGS frame with ACK flag and payload
      6.5.3. Settings Synchronization
        × 2: Sends multiple values of SETTINGS_INITIAL_WINDOW_SIZE
          -> The endpoint MUST ...
             Expected: DATA Frame (length:1, flags:0x00, stream_id:1)
               Actual: Timeout
HPACK: Header Compression for HTTP/2
  2. Compression Process Overview
    2.3. Indexing Tables
      2.3.3. Index Address Space
        1: Sends a indexed header field representation with invalid index

Failures:

Hypertext Transfer Protocol Version 2 (HTTP/2)
  6. Frame Definitions
    6.5.3. Settings Synchronization
      × 9: repeated, not counted

Finished in 1.0000 seconds
3 tests, 1 passed, 1 skipped, 1 failed
";
    let (cases, summary) = parse_report(report);
    let expected: BTreeMap<String, Outcome> = [
        ("http2/6.5/1", Outcome::Passed),
        ("http2/6.5.3/2", Outcome::Failed),
        ("hpack/2.3.3/1", Outcome::Skipped),
    ]
    .into_iter()
    .map(|(id, o)| (id.to_owned(), o))
    .collect();
    assert_eq!(cases, expected);
    assert_eq!(summary, "3 tests, 1 passed, 1 skipped, 1 failed");
}

/// A gateway with an h2c (plain; HTTP/2 by its preface) and a TLS listener, both routed to a
/// test upstream (h2spec asks for `/echo`: the request echoed once it has ended).
async fn gateway(dir: &std::path::Path) -> (Server, Upstream) {
    // h2spec skips its negative-window case (6.9.2/2) for a response body under 5 bytes.
    let upstream = Upstream::builder()
        .body("a body long enough for every flow-control case")
        .start()
        .await;
    let cert = TestCert::generate(dir);
    let config = support::config(&format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[listeners]]\naddress = \"127.0.0.1:0\"\ntls = {{ cert = \"{}\", key = \"{}\" }}\n\n\
         [[upstreams]]\nname = \"up\"\nendpoints = [{{ address = \"{}\" }}]\n\n\
         [[routes]]\nid = \"all\"\nupstream = \"up\"\n",
        cert.cert_path.display(),
        cert.key_path.display(),
        upstream.addr
    ));
    (Server::start(config, 1).expect("gateway starts"), upstream)
}

#[tokio::test]
async fn h2spec_passes_over_h2c_and_tls_but_for_known_deviations() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, _upstream) = gateway(dir.path()).await;
    let addrs = server.local_addrs();
    let (h2c, tls) = (addrs[0].port(), addrs[1].port());
    // One after the other: the machine has two cores, and h2spec's timeouts are real time.
    let h2c_report = run_h2spec(h2c, false).await;
    let tls_report = run_h2spec(tls, true).await;
    assert_conforms("h2c", &h2c_report);
    assert_conforms("tls", &tls_report);
}

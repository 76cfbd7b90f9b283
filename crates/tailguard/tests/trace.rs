//! `[tracing]` through the binary: `tailguard check` names each error with its position
//! (a TLS file that is not there included, and an `OTEL_*` variable's error by the
//! variable), and a clean stop (SIGTERM) exports the spans still waiting in the queue.

use std::process::Command;
use std::time::Duration;

use tailguard_test_support::otlp::OtlpReceiver;
use tailguard_test_support::{Upstream, http1_client};

use crate::support::{Gateway, check, proxy_config};

#[test]
fn check_reports_tracing_errors_with_positions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("gw.toml");
    let text = proxy_config(
        &["127.0.0.1:9".parse().expect("addr")],
        "[tracing]\nendpoint = \"127.0.0.1:4318\"\nsample_ratio = 2.0\nprotocol = \"http\"\n",
    );
    std::fs::write(&cfg, &text).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_tailguard"))
        .args(["check", "--config"])
        .arg(&cfg)
        .env("OTEL_TRACES_SAMPLER", "sometimes")
        .output()
        .expect("run tailguard check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    let file = cfg.display();
    // Lines 13-15 of the file: the [tracing] table follows the proxy config's 12 lines.
    for expected in [
        format!(
            "{file}:13:12: tracing.endpoint: `127.0.0.1:4318` is not an http:// or https:// URL"
        ),
        format!("{file}:14:16: tracing.sample_ratio: 2 is not between 0.0 and 1.0"),
        format!("{file}:15:12: tracing.protocol: `http` is not one of \"http/protobuf\", \"grpc\""),
    ] {
        assert!(
            stderr.contains(&expected),
            "missing {expected:?} in:\n{stderr}"
        );
    }
    // The file sets sample_ratio, so OTEL_TRACES_SAMPLER is not read (the file wins).
    assert!(!stderr.contains("OTEL_TRACES_SAMPLER"), "{stderr}");

    std::fs::write(
        &cfg,
        proxy_config(&["127.0.0.1:9".parse().expect("addr")], ""),
    )
    .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_tailguard"))
        .args(["check", "--config"])
        .arg(&cfg)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
        .env("OTEL_TRACES_SAMPLER", "sometimes")
        .output()
        .expect("run tailguard check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("environment: OTEL_TRACES_SAMPLER: `sometimes` is not one of"),
        "{stderr}"
    );
}

#[test]
fn check_reports_each_tracing_error_with_its_position_tls_files_included() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("gw.toml");
    // The client certificate is there; the CA file is not, and `key` is missing.
    std::fs::write(dir.path().join("client.pem"), "not checked by `check`").expect("write");
    let text = proxy_config(
        &["127.0.0.1:9".parse().expect("addr")],
        "[tracing]\n\
         endpoint = \"https://127.0.0.1:4318\"\n\
         protocol = \"zipkin\"\n\
         sample_ratio = 1.5\n\
         tls = { ca = \"missing-ca.pem\", cert = \"client.pem\" }\n",
    );
    std::fs::write(&cfg, &text).expect("write");
    let (code, _, stderr) = check(&cfg);
    assert_eq!(code, 64, "{stderr}");
    let file = cfg.display();
    let missing = dir.path().join("missing-ca.pem");
    // Lines 14-16 of the file: the [tracing] table follows the proxy config's 12 lines.
    let expected = [
        format!(
            "{file}:14:12: tracing.protocol: `zipkin` is not one of \"http/protobuf\", \"grpc\""
        ),
        format!("{file}:15:16: tracing.sample_ratio: 1.5 is not between 0.0 and 1.0"),
        format!(
            "{file}:16:14: tracing.tls.ca: cannot read `{}`",
            missing.display()
        ),
        format!("{file}:16:7: tracing.tls: `cert` and `key` go together"),
    ];
    for line in &expected {
        assert!(
            stderr.lines().any(|l| l == line),
            "missing {line:?} in:\n{stderr}"
        );
    }
    assert!(
        !stderr.contains("tracing.tls.cert"),
        "the certificate file is there: {stderr}"
    );
}

#[test]
fn a_clean_stop_exports_the_spans_still_queued() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let receiver = rt.block_on(OtlpReceiver::http());
    let upstream = rt.block_on(Upstream::start());
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("gw.toml");
    // An hour between batches: only the shutdown's flush can export the span.
    let text = proxy_config(
        &[upstream.addr],
        &format!(
            "[tracing]\nendpoint = \"{}\"\nbatch_interval_ms = 3600000\n",
            receiver.endpoint()
        ),
    );
    std::fs::write(&cfg, text).expect("write");
    let mut gw = Gateway::run(&["--config", cfg.to_str().expect("utf-8 path")]);
    let url = gw.url();
    let status = rt.block_on(async {
        let client = http1_client();
        tailguard_test_support::get(&client, &format!("{url}/"))
            .await
            .0
    });
    assert_eq!(status, 200);
    assert!(
        receiver.spans().is_empty(),
        "nothing exported before the stop"
    );
    gw.signal("TERM");
    assert!(
        gw.wait_exit(Duration::from_secs(20)).success(),
        "{}",
        gw.log()
    );
    let spans = receiver.spans();
    assert_eq!(spans.len(), 2, "the server and the client span: {spans:?}");
    let received = receiver.received();
    let resource = received[0].request.resource_spans[0]
        .resource
        .as_ref()
        .expect("a resource");
    assert!(
        resource
            .attributes
            .iter()
            .any(|kv| kv.key == "service.name" && format!("{:?}", kv.value).contains("tailguard")),
        "{resource:?}"
    );
}

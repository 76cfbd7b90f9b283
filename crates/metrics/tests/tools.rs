//! The exposition checked by independent tools: `promtool check metrics` and Python's
//! `prometheus_client` text and OpenMetrics parsers.

use std::io::Write;
use std::process::{Command, Stdio};

use tailguard_metrics::{Format, Registry, register_process_metrics};

use tailguard_test_support::promtool_check;

use crate::support::every_type;

#[test]
fn promtool_accepts_every_type() {
    let (ok, output) = promtool_check(&every_type().render(Format::Text));
    assert!(ok, "promtool check metrics failed:\n{output}");
}

#[test]
fn promtool_accepts_self_and_process_metrics() {
    let registry = Registry::new();
    register_process_metrics(&registry).unwrap();
    registry
        .counter("app_jobs", "Jobs done.", &["queue"])
        .unwrap()
        .get_or_create(&["q1"])
        .unwrap()
        .inc();
    let text = registry.render(Format::Text);
    let (ok, output) = promtool_check(&text);
    assert!(
        ok,
        "promtool check metrics failed:\n{output}\n{}",
        String::from_utf8_lossy(&text)
    );
}

#[test]
fn promtool_rejects_a_broken_exposition() {
    // The check above must be able to fail: a TYPE after samples of its family is invalid.
    let broken = b"# TYPE a_total counter\na_total 1\n# TYPE a_total counter\na_total 2\n";
    assert!(!promtool_check(broken).0);
}

/// Parses `exposition` with prometheus_client's parser for `format` and returns one line per
/// sample: `name labels value`, labels sorted, as Python prints them.
fn python_parse(format: Format, exposition: &[u8]) -> Vec<String> {
    let parser = match format {
        Format::Text => "prometheus_client.parser",
        Format::OpenMetrics => "prometheus_client.openmetrics.parser",
    };
    let script = format!(
        "import sys, math\n\
         from {parser} import text_string_to_metric_families\n\
         text = sys.stdin.read()\n\
         for family in text_string_to_metric_families(text):\n\
         \x20   print('family', family.name, family.type, repr(family.documentation))\n\
         \x20   for s in family.samples:\n\
         \x20       labels = ','.join(f'{{k}}={{v!r}}' for k, v in sorted(s.labels.items()))\n\
         \x20       print('sample', s.name, labels, repr(float(s.value)))\n"
    );
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("/usr/bin/python3 with prometheus_client is installed (scripts/install-tools)");
    child.stdin.take().unwrap().write_all(exposition).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "python {parser} rejected the exposition: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(exposition)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn assert_parsed(format: Format) {
    let lines = python_parse(format, &every_type().render(format));
    let has = |line: &str| {
        assert!(
            lines.iter().any(|l| l == line),
            "{format:?}: missing {line:?} in\n{}",
            lines.join("\n")
        )
    };
    has("sample requests_total route='/a',status='200' 3.0");
    has("sample requests_total route='back\\\\slash \"quoted\"\\nnext line',status='200' 7.0");
    has("sample temperature_celsius  -12.0");
    has("sample ratio case='nan' nan");
    has("sample ratio case='pos_inf' inf");
    has("sample ratio case='neg_inf' -inf");
    has("sample ratio case='half' 0.5");
    has("sample cpu_seconds_total  1.5");
    has("sample latency_seconds_bucket le='0.1',route='/a' 3.0");
    has("sample latency_seconds_bucket le='+Inf',route='/a' 4.0");
    has("sample latency_seconds_count route='/a' 4.0");
    has("sample latency_seconds_sum route='/a' 5.105");
    has("sample size_bytes_count  0.0");
    has(
        "family temperature_celsius gauge 'Help with a back\\\\slash, \"quotes\" and a\\nnewline.'",
    );
    // Families without series still come through with their type.
    has("family empty_things counter 'A family with no series yet.'");
    has("family unused_seconds histogram 'A histogram family with no series.'");
}

#[test]
fn python_text_parser_reads_every_type() {
    assert_parsed(Format::Text);
}

#[test]
fn python_openmetrics_parser_reads_every_type() {
    assert_parsed(Format::OpenMetrics);
}

#[test]
fn python_openmetrics_parser_rejects_missing_eof() {
    // The OpenMetrics check above must be able to fail.
    let mut text = every_type().render(Format::OpenMetrics);
    text.truncate(text.len() - "# EOF\n".len());
    let script = "import sys\nfrom prometheus_client.openmetrics.parser import text_string_to_metric_families\nlist(text_string_to_metric_families(sys.stdin.read()))\n";
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&text).unwrap();
    assert!(!child.wait().unwrap().success());
}

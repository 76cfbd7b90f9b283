//! Golden expositions: every metric type in both formats, byte for byte.
//!
//! The files under `tests/golden/` were checked by hand against the format specs (and are
//! also fed to promtool and the Python parsers in `tools.rs`). Regenerate after an intended
//! change with `UPDATE_GOLDEN=1 cargo test -p tailguard-metrics golden` and review the diff.

use std::path::PathBuf;

use tailguard_metrics::Format;

use crate::support::every_type;

fn check(format: Format, file: &str) {
    let rendered = String::from_utf8(every_type().render(format)).unwrap();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(file);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &rendered).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap();
    assert_eq!(rendered, expected, "{file} differs from the rendering");
}

#[test]
fn text_0_0_4_matches_golden_file() {
    check(Format::Text, "every_type.prom");
}

#[test]
fn openmetrics_1_0_0_matches_golden_file() {
    check(Format::OpenMetrics, "every_type.om");
}

#[test]
fn empty_registry_renders_only_eof_in_openmetrics() {
    let registry = tailguard_metrics::Registry::builder()
        .self_metrics_prefix(None)
        .build()
        .unwrap();
    assert_eq!(registry.render(Format::Text), b"");
    assert_eq!(registry.render(Format::OpenMetrics), b"# EOF\n");
}

//! Bad report JSON and a bad `.hgrm` line fail with errors that say what is wrong.

use tailguard_loadgen::LoadError;
use tailguard_loadgen::hgrm;
use tailguard_loadgen::report::Report;

#[test]
fn bad_json_is_a_clear_error() {
    match Report::from_json("{\"url\": 3}") {
        Err(LoadError::Report(why)) => {
            assert!(why.contains("url") || why.contains("invalid type"), "{why}")
        }
        other => panic!("expected a report error, got {other:?}"),
    }
}

#[test]
fn hgrm_parse_names_the_bad_line() {
    let err =
        hgrm::parse("       Value   Percentile\n\n 1.000 0.5 3 2.0\n oops here\n").unwrap_err();
    assert!(matches!(err, LoadError::Hgrm { line: 4, .. }), "{err}");
}

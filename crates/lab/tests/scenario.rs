//! Scenario files parse, and bad ones fail with an error that names the problem.

use std::path::{Path, PathBuf};

use tailguard_lab::LabError;
use tailguard_lab::scenario::Scenario;

fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../lab/scenarios")
}

const GOOD: &str = r#"
name = "t"
description = "test"
[load]
rate = 100
duration = "2s"
connections = 4
[[condition]]
name = "direct"
target = "upstream"
"#;

fn err_of(text: &str) -> String {
    match Scenario::parse(text, Path::new("t.toml")) {
        Err(e @ LabError::Scenario { .. }) => e.to_string(),
        other => panic!("expected a scenario error, got {other:?}"),
    }
}

#[test]
fn every_shipped_scenario_parses() {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(scenarios_dir()).unwrap() {
        let dir = entry.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let (mut s, _) = Scenario::load(&name, &scenarios_dir()).unwrap();
        assert_eq!(s.name, name);
        s.make_quick();
        assert!(
            s.load.duration.as_secs_f64() <= 5.0,
            "{name}: --quick must take seconds"
        );
        names.push(name);
    }
    names.sort();
    assert_eq!(
        names,
        [
            "log",
            "nginx",
            "scrape",
            "scrape-1m-paired",
            "scrape-half-max",
            "shed"
        ]
    );
}

#[test]
fn minimal_scenario_parses_with_defaults() {
    let s = Scenario::parse(GOOD, Path::new("t.toml")).unwrap();
    assert_eq!(s.load.threads, 1);
    assert_eq!(s.load.path, "/");
    assert_eq!(s.load.seeds, [1]);
    assert_eq!(s.conditions.len(), 1);
}

#[test]
fn unknown_field_is_named_with_its_line() {
    let e = err_of(&GOOD.replace("connections = 4", "connections = 4\nconections = 5"));
    assert!(
        e.contains("t.toml") && e.contains("conections") && e.contains("line 8"),
        "{e}"
    );
}

#[test]
fn bad_duration_says_what_a_duration_looks_like() {
    let e = err_of(&GOOD.replace("\"2s\"", "\"2 parsecs\""));
    assert!(e.contains("duration") && e.contains("unit"), "{e}");
}

#[test]
fn rate_factor_needs_a_capacity_section() {
    let e = err_of(&format!("{GOOD}rate_factor = 3.0\n"));
    assert!(e.contains("rate_factor") && e.contains("[capacity]"), "{e}");
}

#[test]
fn missing_scenario_names_where_scenarios_live() {
    let e = Scenario::load("no-such-scenario", &scenarios_dir())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no-such-scenario") && e.contains("cannot read"),
        "{e}"
    );
}

#[test]
fn wrong_type_and_bad_values_are_rejected() {
    assert!(err_of(&GOOD.replace("rate = 100", "rate = \"fast\"")).contains("rate"));
    assert!(err_of(&GOOD.replace("rate = 100", "rate = -5")).contains("positive"));
    assert!(
        err_of(&GOOD.replace("target = \"upstream\"", "target = \"apache\"")).contains("apache")
    );
}

//! Scenario files parse, and bad ones fail with an error that names the problem.

use std::path::{Path, PathBuf};
use std::time::Duration;

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
        // `lab routes` has its own runner and data file.
        if name == "routes" {
            let text = std::fs::read_to_string(dir.join("routes.toml")).unwrap();
            let r: tailguard_lab::routes::RoutesScenario = toml::from_str(&text).unwrap();
            assert!(r.quick_seconds <= 2.0 && r.quick_sizes.iter().all(|&n| n <= 1000));
            names.push(name);
            continue;
        }
        let (mut s, _) = Scenario::load(&name, &scenarios_dir()).unwrap();
        assert_eq!(s.name, name);
        s.make_quick();
        assert!(
            s.load.duration.as_secs_f64() <= 5.0,
            "{name}: --quick must take seconds"
        );
        for c in &s.conditions {
            let stepped: Duration = c.phases.iter().map(|p| p.duration).sum();
            assert!(stepped <= s.load.duration, "{name}: --quick fits the steps");
        }
        names.push(name);
    }
    names.sort();
    assert_eq!(
        names,
        [
            "axum-scrape",
            "axum-scrape-1m",
            "log",
            "nginx",
            "routes",
            "scrape",
            "scrape-1m-paired",
            "scrape-half-max",
            "scrape-shared-core",
            "scrape-shared-core-100k",
            "shed",
            "shed-remote",
            "shed-remote-io",
            "shed-two-upstreams",
            "trace"
        ]
    );
    // Issue 26's case scrapes the whole uncompressed text; scrapes ask for gzip by default.
    let (shared, _) = Scenario::load("scrape-shared-core", &scenarios_dir()).unwrap();
    let gzip: Vec<bool> = shared.conditions.iter().map(|c| c.scrape_gzip).collect();
    assert_eq!(gzip, [true, false]);
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

const STEPPED: &str = r#"
name = "t"
description = "test"
[load]
rate = 100
duration = "2s"
connections = 4
[quick]
duration = "2s"
[capacity]
probe_rate = 1000
duration = "1s"
[[condition]]
name = "step"
phases = [
  { rate_factor = 0.5, duration = "10s" },
  { rate_factor = 10.0, duration = "20s" },
  { rate = 50, duration = "15s" },
]
"#;

#[test]
fn phases_parse_and_quick_keeps_their_shape_in_seconds() {
    let mut s = Scenario::parse(STEPPED, Path::new("t.toml")).unwrap();
    let c = &s.conditions[0];
    assert_eq!(c.phases.len(), 3);
    assert_eq!(c.phases[1].rate_factor, Some(10.0));
    assert_eq!(c.phases[2].rate, Some(50.0));
    assert_eq!(c.phases[2].duration, Duration::from_secs(15));
    s.make_quick();
    let ms: Vec<u128> = s.conditions[0]
        .phases
        .iter()
        .map(|p| p.duration.as_millis())
        .collect();
    assert_eq!(ms, [444, 889, 667]);
    let mut s = Scenario::parse(STEPPED, Path::new("t.toml")).unwrap();
    s.fit_phases(Duration::from_secs(90), false);
    assert_eq!(s.conditions[0].phases[1].duration, Duration::from_secs(40));
}

#[test]
fn bad_phases_are_named() {
    let e = err_of(&STEPPED.replace(
        "{ rate = 50, duration = \"15s\" }",
        "{ duration = \"15s\" }",
    ));
    assert!(e.contains("phase 3") && e.contains("rate"), "{e}");
    let e = err_of(&STEPPED.replace("phases = [", "rate = 10\nphases = ["));
    assert!(e.contains("phases and a rate"), "{e}");
    let e = err_of(&STEPPED.replace("duration = \"20s\"", "duration = \"0s\""));
    assert!(e.contains("phase 2") && e.contains("above 0"), "{e}");
    let no_capacity = STEPPED.replace("[capacity]\nprobe_rate = 1000\nduration = \"1s\"\n", "");
    assert!(err_of(&no_capacity).contains("[capacity]"));
}

const STREAMS: &str = r#"
name = "t"
description = "test"
[load]
rate = 100
duration = "2s"
connections = 4
[[load.streams]]
name = "a"
path = "/a"
connections = 32
[[load.streams]]
name = "b"
path = "/b"
rate = 20
[capacity]
probe_rate = 1000
duration = "1s"
[upstream_b]
args = ["--workers", "8", "--delay-ms", "20"]
[pin]
upstream_b = [0]
[[condition]]
name = "b alone"
streams = { b = { rate_factor = 0.5 } }
[[condition]]
name = "both"
streams = { a = { rate_factor = 10.0 } }
"#;

#[test]
fn streams_and_a_second_upstream_parse() {
    let s = Scenario::parse(STREAMS, Path::new("t.toml")).unwrap();
    assert_eq!(s.load.streams.len(), 2);
    assert_eq!(s.load.streams[0].connections, Some(32));
    assert_eq!(s.upstream_b.as_ref().unwrap().args[0], "--workers");
    assert_eq!(s.pin.upstream_b, Some(vec![0]));
    // A stream a condition does not name gets its own default (b: 20 req/s; a: none).
    let both = &s.conditions[1];
    assert_eq!(s.stream_rate(both, &s.load.streams[1]).rate, Some(20.0));
    let alone = &s.conditions[0];
    let a = s.stream_rate(alone, &s.load.streams[0]);
    assert_eq!((a.rate, a.rate_factor), (None, None));
}

#[test]
fn bad_streams_are_named() {
    let e = err_of(&STREAMS.replace("streams = { a = {", "streams = { c = {"));
    assert!(e.contains("no stream named `c`"), "{e}");
    let e = err_of(&STREAMS.replace("name = \"both\"", "name = \"both\"\nrate = 5"));
    assert!(e.contains("[condition.streams.NAME]"), "{e}");
    let e = err_of(&STREAMS.replace("{ b = { rate_factor = 0.5 } }", "{ b = { rate = 0.0 } }"));
    assert!(e.contains("every stream's rate is 0"), "{e}");
    let e = err_of(&STREAMS.replace("name = \"b\"\npath", "name = \"a\"\npath"));
    assert!(e.contains("name of its own"), "{e}");
    let single = GOOD.replace("[[condition]]", "[upstream_b]\nargs = []\n[[condition]]");
    assert!(err_of(&single).contains("[[load.streams]]"));
}

#[test]
fn quick_may_keep_only_some_conditions_and_names_them_right() {
    let two = GOOD.replace(
        "[[condition]]",
        "[quick]\nconditions = [\"second\"]\n[[condition]]\nname = \"second\"\n[[condition]]",
    );
    let mut s = Scenario::parse(&two, Path::new("t.toml")).unwrap();
    assert_eq!(s.conditions.len(), 2);
    s.make_quick();
    assert_eq!(s.conditions.len(), 1);
    assert_eq!(s.conditions[0].name, "second");
    let e = err_of(&two.replace("conditions = [\"second\"]", "conditions = [\"third\"]"));
    assert!(e.contains("`third`"), "{e}");
}

#[test]
fn a_command_condition_needs_its_command_and_only_it_takes_one() {
    let base = |condition: &str| {
        format!(
            "name = \"t\"\ndescription = \"d\"\n[load]\nrate = 10\nduration = \"1s\"\nconnections = 1\n\n[[condition]]\nname = \"c\"\n{condition}\n"
        )
    };
    assert!(
        err_of(&base("target = \"command\""))
            .contains("`command` goes with `target = \"command\"`")
    );
    assert!(err_of(&base("command = [\"x\"]")).contains("`command` goes with"));
    assert!(
        err_of(&base("metrics_url = \"http://x/\"\ntarget = \"upstream\""))
            .contains("`metrics_url` is for")
    );
    let ok = Scenario::parse(
        &base("target = \"command\"\ncommand = [\"{exe_dir}/app\", \"--listen\", \"{listen}\"]\nmetrics_url = \"http://{listen}/metrics\""),
        Path::new("t.toml"),
    )
    .unwrap();
    assert_eq!(ok.conditions[0].command[2], "{listen}");
}

#[test]
fn a_condition_config_that_names_the_collector_needs_one() {
    let with = |collector: &str| {
        format!(
            "{GOOD}{collector}\n[[condition]]\nname = \"traced\"\n\
             config = \"[tracing]\\nendpoint = \\\"{{otlp_http}}\\\"\"\n"
        )
    };
    let e = err_of(&with(""));
    assert!(
        e.contains("condition `traced`") && e.contains("[collector]"),
        "{e}"
    );
    let s = Scenario::parse(&with("[collector]"), Path::new("t.toml")).unwrap();
    assert!(s.collector.is_some());
    assert!(
        s.conditions[1]
            .config
            .as_deref()
            .is_some_and(|c| c.contains("endpoint = \"{otlp_http}\"")),
        "{:?}",
        s.conditions[1].config
    );
}

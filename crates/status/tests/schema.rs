//! `/status.json` against its schema (`schema/status.schema.json`), checked by an
//! independent validator, Python's `jsonschema` (Debian's `python3-jsonschema`, installed by
//! `scripts/install-tools`); and every field of the schema described in `docs/status.md`.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use tailguard_test_support::SwitchableUpstream;

use crate::{Harness, request, wait_for};

fn schema_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("schema/status.schema.json")
}

/// Validates `doc` with Python's jsonschema; `Err` with its message when invalid.
fn validate(doc: &serde_json::Value) -> Result<(), String> {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("status.json");
    let json = serde_json::to_vec(doc).expect("a JSON value serializes");
    std::fs::write(&file, json).expect("write the document");
    let out = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import json, sys, jsonschema\n\
             schema = json.load(open(sys.argv[1]))\n\
             jsonschema.Draft202012Validator.check_schema(schema)\n\
             jsonschema.Draft202012Validator(schema).validate(json.load(open(sys.argv[2])))",
        ])
        .arg(schema_path())
        .arg(&file)
        .output()
        .expect("python3 runs (scripts/install-tools installs python3-jsonschema)");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_matches_its_schema_in_an_independent_validator() {
    let (a, b) = (
        SwitchableUpstream::start().await,
        SwitchableUpstream::start().await,
    );
    let dir = tempfile::tempdir().unwrap();
    // Every kind of object the document can hold: a checked round-robin upstream, a
    // p2c-EWMA one with the adaptive shedder's limits and breakers, a local answer, a rate
    // limit, a failed reload.
    let config = format!(
        "[[upstreams]]\nname = \"api\"\nendpoints = [{{ address = \"{}\" }}]\n\
         [upstreams.health]\npath = \"/health\"\ninterval_ms = 20\n\n\
         [[upstreams]]\nname = \"p2c\"\nbalance = \"p2c_ewma\"\nendpoints = [{{ address = \"{}\" }}]\n\n\
         [[routes]]\nid = \"api\"\nupstream = \"api\"\npath = {{ prefix = \"/api\" }}\n\
         rate_limit = {{ rate = 1000, burst = 1000 }}\n\n\
         [[routes]]\nid = \"p2c\"\nupstream = \"p2c\"\npath = {{ prefix = \"/p2c\" }}\n\n\
         [[routes]]\nid = \"teapot\"\npath = {{ exact = \"/tea\" }}\nrespond = {{ status = 418 }}\n\n\
         [overload]\nmode = \"adaptive\"\n",
        a.addr, b.addr
    );
    let h = Harness::start(&config, dir.path());
    // Rates count what arrives after the first tick, which the first document waits for.
    h.json(&[]).await;
    for path in ["/api/x", "/p2c/x", "/tea", "/none"] {
        request(h.gateway_addr(), path, &[]).await;
    }
    h.server
        .gateway()
        .reloads()
        .record("gw.toml", Err("gw.toml:1:1: bad".into()));
    let doc = wait_for(&h, "traffic on every route and a check", &[], |d| {
        d["routes"]
            .as_array()
            .is_some_and(|r| r.iter().all(|r| r["requests_per_s"].as_f64() > Some(0.0)))
            && d["upstreams"][0]["endpoints"][0]["last_check"].is_object()
    })
    .await;
    assert_eq!(doc["upstreams"][1]["balance"], "p2c_ewma");
    assert!(doc["upstreams"][1]["endpoints"][0]["ewma_ms"].is_number());
    assert!(doc["upstreams"][0]["concurrency"].is_object());
    // Precedence order: the exact path first.
    assert_eq!(doc["routes"][0]["id"], "teapot");
    assert_eq!(doc["routes"][0]["upstream"], serde_json::Value::Null);
    validate(&doc).unwrap_or_else(|e| panic!("{e}\n{doc:#}"));

    // The validator is not vacuous: a field the schema does not know, one it requires
    // missing, or a wrong type is refused.
    let mut extra = doc.clone();
    extra["gateway"]["password"] = "x".into();
    assert!(validate(&extra).is_err());
    let mut missing = doc.clone();
    missing["upstreams"][0]["endpoints"][0]
        .as_object_mut()
        .unwrap()
        .remove("state");
    assert!(validate(&missing).is_err());
    let mut wrong = doc;
    wrong["routes"][0]["requests_per_s"] = "fast".into();
    assert!(validate(&wrong).is_err());
}

/// Every property name under `value` (a JSON schema), recursively.
fn properties(value: &serde_json::Value, into: &mut BTreeSet<String>) {
    match value {
        serde_json::Value::Object(map) => {
            if let Some(serde_json::Value::Object(props)) = map.get("properties") {
                into.extend(props.keys().cloned());
            }
            map.values().for_each(|v| properties(v, into));
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| properties(v, into)),
        _ => {}
    }
}

#[test]
fn every_field_of_the_schema_is_described_in_docs_status_md() {
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(schema_path()).unwrap()).unwrap();
    let mut names = BTreeSet::new();
    properties(&schema, &mut names);
    assert!(names.len() > 80, "{names:?}");
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/status.md"))
            .unwrap();
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !docs.contains(&format!("`{n}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/status.md does not describe {missing:?}"
    );
}

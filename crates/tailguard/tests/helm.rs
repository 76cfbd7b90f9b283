//! The Helm chart of `deploy/helm/tailguard`, checked by the tools that consume it: `helm lint
//! --strict`; every manifest it renders (defaults, autoscaling, etcd with TLS as a DaemonSet
//! with the monitoring objects) against the Kubernetes JSON schemas of a current release
//! (`kubernetes-validate --strict`) and by a security linter (checkov, with the findings left
//! open listed and explained in `deploy/helm/checkov.yaml`); the config it renders by
//! `tailguard check`, its etcd bootstrap by a real etcd over mutual TLS; and the autoscaler's
//! CPU target refused at or above the shedder's CPU threshold.
//!
//! helm comes from the Go module proxy (`go install`, into `$HOME/go/bin`), kubernetes-validate
//! and checkov from PyPI (into `$HOME/.local/share/tailguard-tools/venv`), by
//! `scripts/install-tools`; each is also found on PATH.

use std::path::{Path, PathBuf};
use std::process::Command;

use tailguard_test_support::etcd::EtcdServer;

use crate::support::{output, workspace_root};

/// The Kubernetes release whose schemas the manifests are checked against: the newest that
/// kubernetes-validate 1.37.0 ships.
const KUBERNETES: &str = "1.37.0";

fn chart() -> PathBuf {
    workspace_root().join("deploy/helm/tailguard")
}

/// A tool on PATH, else where `scripts/install-tools` puts it.
fn tool(name: &str) -> PathBuf {
    let home = PathBuf::from(std::env::var_os("HOME").unwrap_or_default());
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([
            home.join("go/bin"),
            home.join(".local/share/tailguard-tools/venv/bin"),
        ])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is not installed (scripts/install-tools installs it)"))
}

/// `helm template` of the chart with `--set` values: Ok(manifests) or Err(helm's message).
fn template(sets: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new(tool("helm"));
    cmd.args(["template", "gw"]).arg(chart());
    cmd.args(["--namespace", "edge"]);
    for set in sets {
        cmd.args(["--set", set]);
    }
    let out = cmd.output().expect("run helm");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn rendered(sets: &[&str]) -> String {
    template(sets).unwrap_or_else(|e| panic!("helm template {sets:?}:\n{e}"))
}

/// The value sets every manifest check runs over: together they render every template.
const VALUE_SETS: &[(&str, &[&str])] = &[
    ("defaults", &[]),
    (
        "autoscaling",
        &["autoscaling.enabled=true", "image.digest=sha256:0123"],
    ),
    (
        "etcd-daemonset-monitoring",
        &[
            "kind=DaemonSet",
            "etcd.enabled=true",
            "etcd.endpoints={https://etcd-0.etcd:2379,https://etcd-1.etcd:2379}",
            "etcd.tls.secretName=etcd-client",
            "etcd.auth.username=gateway",
            "etcd.auth.passwordSecret=etcd-password",
            "metrics.serviceMonitor.enabled=true",
            "metrics.rules.enabled=true",
            "metrics.dashboard.enabled=true",
        ],
    ),
];

/// The text of a block scalar `key: |` in a rendered manifest (its indentation removed).
fn block(manifests: &str, key: &str) -> String {
    let mut lines = manifests.lines();
    let head = lines
        .by_ref()
        .find(|l| l.trim_start() == format!("{key}: |"))
        .unwrap_or_else(|| panic!("no {key} in:\n{manifests}"));
    let indent = head.len() - head.trim_start().len() + 2;
    let mut text = String::new();
    for line in lines {
        if !line.trim().is_empty() && line.len() - line.trim_start().len() < indent {
            break;
        }
        text.push_str(line.get(indent..).unwrap_or(""));
        text.push('\n');
    }
    text
}

/// The integer after `key: ` in the manifests (first occurrence).
fn number(manifests: &str, key: &str) -> u64 {
    manifests
        .lines()
        .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix(": "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in:\n{manifests}"))
}

#[test]
fn the_chart_passes_helm_lint_strict() {
    for set in VALUE_SETS.iter().map(|(_, s)| *s) {
        let mut cmd = Command::new(tool("helm"));
        cmd.args(["lint", "--strict"]).arg(chart());
        for s in set {
            cmd.args(["--set", s]);
        }
        let (ok, out) = output(&mut cmd);
        assert!(
            ok && out.contains("1 chart(s) linted, 0 chart(s) failed"),
            "helm lint --strict {set:?}:\n{out}"
        );
    }
}

#[test]
fn every_rendered_manifest_passes_kubernetes_validate_strict_and_checkov() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, sets) in VALUE_SETS {
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, rendered(sets)).expect("write manifests");
        let (ok, out) = output(
            Command::new(tool("kubernetes-validate"))
                .args(["--strict", "--kubernetes-version", KUBERNETES])
                .arg(&file),
        );
        assert!(ok, "kubernetes-validate --strict {name}:\n{out}");
        // The one kind it has no schema for: prometheus-operator's CRD, outside Kubernetes.
        for line in out.lines().filter(|l| !l.starts_with("INFO ")) {
            assert!(
                line.contains("Couldn't find schema for kind ServiceMonitor"),
                "{name}: {line}\n{out}"
            );
        }
        if *name == "defaults" {
            assert!(
                out.contains("passed for resource deployment/gw-tailguard"),
                "{out}"
            );
        }
    }
    // --strict is what it says: a field Kubernetes does not have fails.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        rendered(&[
            "extraVolumeMounts[0].name=x",
            "extraVolumeMounts[0].mountPath=/x",
            "extraVolumeMounts[0].readOnlyy=true",
        ]),
    )
    .expect("write");
    let (ok, out) = output(
        Command::new(tool("kubernetes-validate"))
            .args(["--strict", "--kubernetes-version", KUBERNETES])
            .arg(&bad),
    );
    assert!(!ok && out.contains("readOnlyy"), "{out}");
    std::fs::remove_file(&bad).expect("rm");

    // checkov over all of them, offline (--skip-download: it would fetch guidelines from its
    // vendor's API), with the explained exceptions of deploy/helm/checkov.yaml.
    // Each file by name: checkov skips directories whose name starts with a dot, as
    // tempfile's do.
    let config = workspace_root().join("deploy/helm/checkov.yaml");
    let mut checkov = Command::new(tool("checkov"));
    checkov
        .args(["--framework", "kubernetes", "--compact", "--quiet"])
        .args(["--skip-download", "--config-file"])
        .arg(&config);
    for (name, _) in VALUE_SETS {
        checkov
            .arg("--file")
            .arg(dir.path().join(format!("{name}.yaml")));
    }
    let (ok, out) = output(&mut checkov);
    assert!(ok && out.contains("Failed checks: 0"), "checkov:\n{out}");
    let passed: u32 = out
        .split("Passed checks: ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .expect("checkov's summary");
    assert!(passed > 100, "checkov ran its Kubernetes checks:\n{out}");
    // Every exception says why: a comment before each skipped check.
    let text = std::fs::read_to_string(&config).expect("checkov.yaml");
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("- CKV") {
            assert!(
                i > 0 && lines[i - 1].trim_start().starts_with('#'),
                "{line} has no reason above it"
            );
        }
    }
}

#[test]
fn the_rendered_config_passes_tailguard_check_with_the_shedders_threshold() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (threshold, sets) in [
        ("0.9", vec![]),
        (
            "0.75",
            vec![
                "overload.cpuThreshold=0.75",
                "gateway.timeouts.connect_ms=2000",
            ],
        ),
    ] {
        let config = block(&rendered(&sets), "tailguard.toml");
        let file = dir.path().join("tailguard.toml");
        std::fs::write(&file, &config).expect("write config");
        let (code, out, err) = crate::support::check(&file);
        assert_eq!(code, 0, "{out}{err}\n{config}");
        let parsed: toml::Value = toml::from_str(&config).expect("toml");
        assert_eq!(
            parsed["overload"]["threshold"].as_float(),
            threshold.parse().ok(),
            "{config}"
        );
        assert_eq!(parsed["overload"]["mode"].as_str(), Some("adaptive"));
        assert_eq!(
            parsed["listeners"][0]["address"].as_str(),
            Some("0.0.0.0:8080")
        );
        assert_eq!(parsed["metrics"]["listen"].as_str(), Some("0.0.0.0:9091"));
    }
    // A table the chart writes, repeated in `config`, is refused with the reason.
    let err = template(&["config=[timeouts]\nconnect_ms = 1\n"]).expect_err("refused");
    assert!(err.contains("written by the chart"), "{err}");
}

#[test]
fn helm_template_refuses_an_autoscaler_cpu_target_at_or_above_the_shedders_threshold() {
    for (target, threshold) in [(90, "0.9"), (95, "0.9"), (85, "0.9"), (70, "0.75")] {
        let err = template(&[
            "autoscaling.enabled=true",
            &format!("autoscaling.targetCPUUtilizationPercentage={target}"),
            &format!("overload.cpuThreshold={threshold}"),
        ])
        .expect_err("a target the autoscaler never reaches while the gateway sheds");
        assert!(
            err.contains(&format!(
                "autoscaling.targetCPUUtilizationPercentage ({target})"
            )) && err.contains(&format!("overload.cpuThreshold ({threshold}")),
            "the message names both values: {err}"
        );
    }
    // The defaults: go-zero's 80 % under shedding at 90 %.
    let hpa = rendered(&["autoscaling.enabled=true"]);
    assert!(hpa.contains("kind: HorizontalPodAutoscaler"), "{hpa}");
    assert_eq!(number(&hpa, "averageUtilization"), 80);
    assert!(block(&hpa, "tailguard.toml").contains("threshold = 0.9\n"));
    assert!(!hpa.contains("replicas:"), "the autoscaler owns replicas");
    let ok = rendered(&[
        "autoscaling.enabled=true",
        "autoscaling.targetCPUUtilizationPercentage=65",
        "overload.cpuThreshold=0.75",
    ]);
    assert_eq!(number(&ok, "averageUtilization"), 65);
    // No shedder, no conflict.
    let off = rendered(&[
        "autoscaling.enabled=true",
        "autoscaling.targetCPUUtilizationPercentage=95",
        "overload.mode=off",
    ]);
    assert_eq!(number(&off, "averageUtilization"), 95);
    let err = template(&["autoscaling.enabled=true", "kind=DaemonSet"]).expect_err("refused");
    assert!(err.contains("DaemonSet"), "{err}");
}

#[test]
fn the_grace_period_outlasts_the_prestop_sleep_and_the_drain() {
    let defaults = rendered(&[]);
    assert_eq!(
        number(&defaults, "terminationGracePeriodSeconds"),
        5 + 10 + 5
    );
    assert_eq!(number(&defaults, "seconds"), 5, "preStop sleep");
    let long = rendered(&["gateway.shutdownMs=29500", "gateway.preStopSeconds=8"]);
    assert_eq!(number(&long, "terminationGracePeriodSeconds"), 8 + 30 + 5);
    assert!(block(&long, "tailguard.toml").contains("shutdown_ms = 29500\n"));
    // Probes on /healthz, the pod locked down, a budget for node drains.
    assert_eq!(defaults.matches("path: /healthz").count(), 2, "{defaults}");
    for line in [
        "readOnlyRootFilesystem: true",
        "allowPrivilegeEscalation: false",
        "runAsNonRoot: true",
        "- ALL",
        "kind: PodDisruptionBudget",
        "maxUnavailable: 0",
    ] {
        assert!(defaults.contains(line), "{line} missing:\n{defaults}");
    }
    let daemonset = rendered(&["kind=DaemonSet"]);
    assert!(daemonset.contains("kind: DaemonSet"));
    assert!(!daemonset.contains("kind: PodDisruptionBudget"));
}

#[test]
fn the_monitoring_configmaps_carry_the_rules_and_dashboard_of_deploy() {
    let manifests = rendered(&[
        "metrics.rules.enabled=true",
        "metrics.dashboard.enabled=true",
    ]);
    let rules =
        std::fs::read_to_string(workspace_root().join("deploy/prometheus/tailguard-rules.yml"))
            .expect("rules");
    let dashboard = std::fs::read_to_string(workspace_root().join("deploy/grafana/tailguard.json"))
        .expect("dashboard");
    assert_eq!(
        block(&manifests, "tailguard-rules.yml").trim_end(),
        rules.trim_end()
    );
    assert_eq!(
        block(&manifests, "tailguard.json").trim_end(),
        dashboard.trim_end()
    );
    assert!(
        manifests.contains("grafana_dashboard: \"1\""),
        "{manifests}"
    );
}

/// The bootstrap file the chart renders for etcd with TLS reads the config from a real etcd
/// over mutual TLS, once the Secret's mount paths are this test's certificate files.
#[test]
fn the_etcd_bootstrap_the_chart_renders_reads_a_real_etcd_over_mutual_tls() {
    let Some(etcd) = EtcdServer::builder().tls().client_cert_auth().start() else {
        return;
    };
    let pki = etcd.pki().expect("tls");
    let manifests = rendered(&[
        "etcd.enabled=true",
        &format!("etcd.endpoints={{{}}}", etcd.url()),
        "etcd.key=/tailguard/helm",
        "etcd.tls.secretName=etcd-client",
    ]);
    let mounts = [
        ("/etc/tailguard-etcd/tls/ca.crt", &pki.ca),
        ("/etc/tailguard-etcd/tls/tls.crt", &pki.client_cert),
        ("/etc/tailguard-etcd/tls/tls.key", &pki.client_key),
    ];
    // The Secret is mounted where the bootstrap names its files.
    assert!(
        manifests.contains("mountPath: /etc/tailguard-etcd/tls"),
        "{manifests}"
    );
    assert!(manifests.contains("secretName: etcd-client"), "{manifests}");
    let mut bootstrap = block(&manifests, "bootstrap.toml");
    for (mounted, file) in mounts {
        assert!(bootstrap.contains(mounted), "{bootstrap}");
        bootstrap = bootstrap.replace(mounted, path(file));
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("bootstrap.toml");
    std::fs::write(&file, &bootstrap).expect("write bootstrap");
    let config = dir.path().join("gw.toml");
    std::fs::write(&config, block(&rendered(&[]), "tailguard.toml")).expect("write config");
    let bin = env!("CARGO_BIN_EXE_tailguard");
    let (ok, out) = output(
        Command::new(bin)
            .args(["config", "push"])
            .arg(&config)
            .arg("--bootstrap")
            .arg(&file),
    );
    assert!(
        ok,
        "config push --bootstrap (rendered):\n{out}\n{bootstrap}"
    );
    let got = Command::new(bin)
        .args(["config", "get", "--bootstrap"])
        .arg(&file)
        .output()
        .expect("config get");
    assert!(
        got.status.success(),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&got.stdout),
        std::fs::read_to_string(&config).expect("config")
    );
    // The pod runs it with --bootstrap and its cache in the emptyDir.
    assert!(manifests.contains("- --bootstrap\n            - /etc/tailguard/bootstrap.toml"));
    assert!(bootstrap.contains("cache = \"/var/lib/tailguard/etcd-config.toml\""));
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

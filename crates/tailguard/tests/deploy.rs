//! The files of `deploy/` checked by the tools that consume them: the alert rules by
//! `promtool` and by a real Prometheus evaluating them against a real gateway, every query of
//! the Grafana dashboard against that same Prometheus, the systemd unit by
//! `systemd-analyze verify`, and the logrotate snippet by a real rotation of a running
//! gateway's access log.
//!
//! The Prometheus test runs its gateway from a real etcd (`tailguard_test_support::etcd`),
//! so the etcd panels have data: without an `etcd` binary it fails, unless
//! `TAILGUARD_SKIP_ETCD_TESTS=1` says skipping is allowed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tailguard_test_support::etcd::EtcdServer;
use tailguard_test_support::grpc::{GrpcClient, GrpcUpstream, Msg};
use tailguard_test_support::{Upstream, http1_client};

use crate::support::Gateway;

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(path)
}

/// A tool on PATH, or in the sbin directories a non-root PATH may lack.
fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().expect("run the tool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Kills the child process on drop.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let rules = deploy("prometheus/tailguard-rules.yml");
    let (ok, out) = run(Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&rules));
    assert!(ok, "promtool check rules:\n{out}");
    // The unit tests name the rules file relative to themselves.
    let (ok, out) = run(Command::new("promtool")
        .args(["test", "rules", "tailguard-rules.test.yml"])
        .current_dir(deploy("prometheus")));
    assert!(ok, "promtool test rules:\n{out}");
}

#[test]
fn every_alert_has_a_firing_and_a_quiet_unit_test() {
    let rules = std::fs::read_to_string(deploy("prometheus/tailguard-rules.yml")).expect("rules");
    let tests =
        std::fs::read_to_string(deploy("prometheus/tailguard-rules.test.yml")).expect("tests");
    let names: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(names.len() >= 10, "{names:?}");
    for name in names {
        // Each `alertname: X` case is followed by `exp_alerts: []` (quiet) or by a list.
        let cases: Vec<&str> = tests
            .split("alertname: ")
            .skip(1)
            .filter(|case| case.split_whitespace().next() == Some(name))
            .collect();
        let quiet = cases
            .iter()
            .filter(|c| c.contains("exp_alerts: []"))
            .count();
        assert!(
            quiet >= 1 && cases.len() > quiet,
            "{name}: {} cases, {quiet} quiet",
            cases.len()
        );
    }
}

/// GETs a Prometheus API path with query parameters (URL-encoded by curl); the JSON answer,
/// or why there is none (Prometheus not listening yet, an answer that is not JSON).
fn prometheus_api(
    prometheus: SocketAddr,
    path: &str,
    params: &[(&str, &str)],
) -> Result<serde_json::Value, String> {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "5", "--get"]);
    for (k, v) in params {
        cmd.arg("--data-urlencode").arg(format!("{k}={v}"));
    }
    let out = cmd
        .arg(format!("http://{prometheus}{path}"))
        .output()
        .expect("curl (installed by scripts/install-tools)");
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "{path} {params:?}: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Runs an instant query; Err with Prometheus's error, or Ok with the result list.
fn query(prometheus: SocketAddr, promql: &str) -> Result<Vec<serde_json::Value>, String> {
    let answer = prometheus_api(prometheus, "/api/v1/query", &[("query", promql)])?;
    if answer["status"] != "success" {
        return Err(answer.to_string());
    }
    let data = &answer["data"];
    Ok(match data["resultType"].as_str() {
        // A scalar is one value, never empty.
        Some("scalar") | Some("string") => vec![data["result"].clone()],
        _ => data["result"].as_array().cloned().unwrap_or_default(),
    })
}

/// Every string under an `expr` key, with its JSON path (panel title where there is one).
fn exprs(value: &serde_json::Value, at: &str, out: &mut Vec<(String, String)>) {
    match value {
        serde_json::Value::Object(map) => {
            let here = map
                .get("title")
                .or_else(|| map.get("name"))
                .and_then(|t| t.as_str())
                .map_or_else(|| at.to_owned(), |t| format!("{at}/{t}"));
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push((here.clone(), e.clone())),
                    _ => exprs(v, &here, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| exprs(v, at, out)),
        _ => {}
    }
}

/// The dashboard: valid JSON with the shape Grafana imports.
fn dashboard() -> serde_json::Value {
    let text = std::fs::read_to_string(deploy("grafana/tailguard.json")).expect("dashboard");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

#[test]
fn dashboard_panels_use_the_datasource_variable_and_fit_the_grid() {
    let d = dashboard();
    assert_eq!(d["uid"], "tailguard");
    assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 36));
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(vars, ["datasource", "job", "instance", "route"]);
    let panels = d["panels"].as_array().expect("panels");
    let mut ids = std::collections::HashSet::new();
    for p in panels {
        let title = p["title"].as_str().expect("every panel has a title");
        assert!(
            ids.insert(p["id"].as_u64().expect("id")),
            "{title}: id twice"
        );
        let pos = &p["gridPos"];
        let (x, w) = (pos["x"].as_u64().expect("x"), pos["w"].as_u64().expect("w"));
        assert!(x + w <= 24 && pos["h"].as_u64().is_some(), "{title}: {pos}");
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        assert!(
            p["description"].as_str().is_some_and(|s| !s.is_empty()),
            "{title}: say what it shows"
        );
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
            assert!(t["refId"].as_str().is_some(), "{title}");
        }
    }
}

/// Stored in etcd, where a relative path would resolve against the test's working
/// directory: `ACCESS_LOG` becomes a path in the test's temporary directory.
const GATEWAY_CONFIG: &str = r#"
[[listeners]]
address = "127.0.0.1:0"

[access_log]
path = "ACCESS_LOG"
flush_ms = 100

[overload]
mode = "adaptive"

# By name, so the DNS series exist: `localhost` is 127.0.0.1 (the upstream) and ::1 (down).
[[upstreams]]
name = "api"
dns_refresh_ms = 1000
endpoints = [{ address = "localhost:API_PORT" }]
health = { path = "/echo", interval_ms = 200 }

[[upstreams]]
name = "dead"
endpoints = [{ address = "127.0.0.1:1" }]
health = { path = "/", interval_ms = 200 }

[[upstreams]]
name = "grpc"
protocol = "h2c"
endpoints = [{ address = "127.0.0.1:GRPC_PORT" }]

[[routes]]
id = "echo"
upstream = "api"
path = { prefix = "/echo" }

[[routes]]
id = "status"
upstream = "api"
path = { prefix = "/status" }

[[routes]]
id = "dead"
upstream = "dead"
path = { prefix = "/dead" }

# One request a second: the traffic's others get 429.
[[routes]]
id = "limited"
upstream = "api"
path = { prefix = "/limited" }
rate_limit = { rate = 1, burst = 1, key = "route" }

# Every 503 is tried again (within the upstream's retry budget).
[[routes]]
id = "retried"
upstream = "api"
path = { prefix = "/status/503" }
retry = { attempts = 2, on = ["503"], backoff_ms = 0 }

[[routes]]
id = "grpc"
upstream = "grpc"
path = { prefix = "/test.Echo" }

# A limit for the fleet, so the Redis sync's series exist (issue 49).
[[routes]]
id = "global"
upstream = "api"
path = { prefix = "/global" }
rate_limit = { rate = 100, per = "minute", key = "route", scope = "global" }

# Authentication (issue 47): a key set read from a file and a consumer's key, so the auth
# panels have their series; the traffic presents no credential, so it is refused.
[[auth]]
name = "idp"
type = "jwt"
jwks = "JWKS_FILE"

[[auth]]
name = "partners"
type = "api_key"
consumers = [{ name = "acme", keys = ["sha256:640574f1f4e283be31cf43430d416e90e57af9f5e0ac5524ead6908856fe749e"] }]

[[routes]]
id = "authed"
upstream = "api"
path = { prefix = "/authed" }
auth = ["idp", "partners"]

[redis]
url = "REDIS_URL"
"#;

/// The key set of the `idp` authenticator: the Ed25519 public key of RFC 8037 appendix A.
const JWKS: &str = r#"{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"rfc8037",
"x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#;

/// The etcd key the Prometheus test's gateway reads its config from.
const ETCD_KEY: &str = "/tailguard/config";

/// The exporter address the gateway logged.
fn metrics_addr(gateway: &Gateway) -> SocketAddr {
    gateway.wait_for_log("/metrics", Duration::from_secs(20));
    gateway
        .log()
        .split("tailguard: metrics on http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|a| a.parse().ok())
        .expect("metrics address in the log")
}

/// Traffic of every kind the dashboard shows, until `stop`: 200s, upstream 500s, 503s of an
/// upstream with no endpoint up, 404s of no route, 429s of a rate limit, retried 503s, gRPC
/// calls.
async fn traffic(url: String, stop: Arc<AtomicBool>) {
    let client = http1_client();
    let mut grpc = GrpcClient::connect(&url).await;
    while !stop.load(Ordering::Relaxed) {
        for path in [
            "/echo/x",
            "/echo/y",
            "/status/500",
            "/dead/x",
            "/nowhere",
            "/limited",
            "/global",
            "/status/503",
            "/authed/x",
        ] {
            let _ = tailguard_test_support::get(&client, &format!("{url}{path}")).await;
        }
        let _ = grpc.unary(Msg::new("hello", 1), None).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `check` every 250 ms until it returns Some, at most `limit`.
fn wait_for<T>(limit: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(start.elapsed() < limit, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn dashboard_queries_and_alert_rules_work_in_a_real_prometheus_scraping_a_real_gateway() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let Some(redis) = tailguard_test_support::redis::RedisServer::start() else {
        return;
    };
    let (api, grpc) = rt.block_on(async { (Upstream::start().await, GrpcUpstream::start().await) });
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("gw.toml");
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, JWKS).expect("write jwks");
    std::fs::write(
        &config,
        GATEWAY_CONFIG
            .replace("JWKS_FILE", jwks.to_str().expect("utf-8 path"))
            .replace("API_PORT", &api.addr.port().to_string())
            .replace("GRPC_PORT", &grpc.addr.port().to_string())
            .replace("REDIS_URL", &redis.url())
            .replace(
                "ACCESS_LOG",
                dir.path().join("access.log").to_str().expect("utf-8 path"),
            ),
    )
    .expect("write config");
    // The config goes to etcd as an operator puts it there, and the gateway follows the key.
    let etcd_url = etcd.url();
    let (pushed, out) = run(Command::new(env!("CARGO_BIN_EXE_tailguard")).args([
        "config",
        "push",
        config.to_str().expect("utf-8 path"),
        "--etcd",
        &etcd_url,
        "--etcd-key",
        ETCD_KEY,
    ]));
    assert!(pushed, "tailguard config push:\n{out}");
    let gateway = Gateway::run(&[
        "--etcd",
        &etcd_url,
        "--etcd-key",
        ETCD_KEY,
        "--metrics-listen",
        "127.0.0.1:0",
        "--threads",
        "2",
    ]);
    let metrics = metrics_addr(&gateway);
    let stop = Arc::new(AtomicBool::new(false));
    let load = rt.spawn(traffic(gateway.url(), Arc::clone(&stop)));

    let prometheus_yml = dir.path().join("prometheus.yml");
    std::fs::write(
        &prometheus_yml,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files: ['{}']\n\
             scrape_configs:\n  - job_name: tailguard\n    static_configs:\n      - targets: ['{metrics}']\n",
            deploy("prometheus/tailguard-rules.yml").display()
        ),
    )
    .expect("write prometheus.yml");
    // Free when we look; Prometheus binds it a moment later (a race that can only make the
    // test fail loudly, never pass wrongly).
    let prometheus = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let prometheus_log = dir.path().join("prometheus.log");
    let _prometheus = KillOnDrop(
        Command::new("prometheus")
            .arg(format!("--config.file={}", prometheus_yml.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={prometheus}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&prometheus_log).expect("log file"))
            .spawn()
            .expect("prometheus is installed (scripts/install-tools)"),
    );
    let log = || std::fs::read_to_string(&prometheus_log).unwrap_or_default();

    // A reload after the first scrape, so the reload annotation's `changes(...) > 0` sees one
    // (from etcd, SIGHUP reads the key afresh and applies it through the same reload).
    wait_for(Duration::from_secs(30), "the first scrape", || {
        let up = query(prometheus, r#"up{job="tailguard"} == 1"#).ok()?;
        (!up.is_empty()).then_some(())
    });
    gateway.signal("HUP");
    gateway.wait_for_log("reloaded", Duration::from_secs(20));
    wait_for(
        Duration::from_secs(60),
        "ten scrapes with the reload in them",
        || {
            let n = query(
                prometheus,
                r#"count_over_time(up{job="tailguard"}[1m]) >= 10"#,
            )
            .ok()?;
            let reloaded = query(
                prometheus,
                r#"tailguard_config_reloads_total{result="ok"} == 1"#,
            )
            .ok()?;
            // What the new panels show, counted for real (a panel's rate of 0 is data too).
            let counted = [
                r#"tailguard_rate_limited_total{route="limited",listener=""} > 0"#,
                r#"tailguard_upstream_retries_total{route="retried",reason="503"} > 0"#,
                "tailguard_config_etcd_revision > 0",
                "tailguard_config_etcd_connected == 1",
                "tailguard_config_etcd_last_apply_ok == 1",
                r#"tailguard_auth_requests_total{route="authed",result="missing"} > 0"#,
                r#"tailguard_auth_jwks_last_success_timestamp_seconds{auth="idp"} > 0"#,
            ]
            .iter()
            .all(|q| query(prometheus, q).is_ok_and(|r| !r.is_empty()));
            (!n.is_empty() && !reloaded.is_empty() && counted).then_some(())
        },
    );

    // Every query of the dashboard, with Grafana's variables as a user selecting all routes
    // of this gateway would have them: each must parse and return data.
    let instance = metrics.to_string();
    let substitute = |e: &str| {
        e.replace("$__rate_interval", "10s")
            .replace("$job", "tailguard")
            .replace("$instance", &instance)
            .replace("$route", ".*")
    };
    let mut all = Vec::new();
    exprs(&dashboard(), "", &mut all);
    assert!(all.len() >= 50, "{} queries", all.len());
    let mut failures = Vec::new();
    for (panel, expr) in &all {
        let promql = substitute(expr);
        assert!(
            !promql.replace("${1}", "").contains('$'),
            "{panel}: a variable the test does not know: {expr}"
        );
        match query(prometheus, &promql) {
            Err(e) => failures.push(format!("{panel}: {promql}\n  error: {e}")),
            Ok(r) if r.is_empty() => failures.push(format!("{panel}: {promql}\n  no data")),
            Ok(_) => {}
        }
    }
    // The template variables: `label_values(METRIC{...}, LABEL)` is Grafana's, not PromQL;
    // its selector must find series carrying the label.
    for var in dashboard()["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        let Some(def) = var["definition"].as_str() else {
            continue;
        };
        let (selector, label) = def
            .strip_prefix("label_values(")
            .and_then(|d| d.strip_suffix(')'))
            .and_then(|d| d.rsplit_once(", "))
            .unwrap_or_else(|| panic!("variable {}: {def}", var["name"]));
        let promql = format!("group by ({label}) ({})", substitute(selector));
        match query(prometheus, &promql) {
            Ok(r) if r.iter().any(|s| s["metric"][label].is_string()) => {}
            other => failures.push(format!("variable {def}: {promql}\n  {other:?}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} dashboard queries failed:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );

    // The alert rules, loaded by this Prometheus: every rule evaluates without error
    // against the gateway's real series.
    let rules = wait_for(Duration::from_secs(20), "every rule evaluated", || {
        let answer = prometheus_api(prometheus, "/api/v1/rules", &[]).ok()?;
        let rules: Vec<serde_json::Value> = answer["data"]["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let evaluated = rules.iter().all(|r| {
            r["lastEvaluation"]
                .as_str()
                .is_some_and(|t| !t.starts_with("0001"))
        });
        (rules.len() >= 10 && evaluated).then_some(rules)
    });
    for r in &rules {
        assert_eq!(r["health"], "ok", "rule {}: {r}\n{}", r["name"], log());
    }
    // And the ones this traffic must set off are pending (their `for:` has not elapsed):
    // route `dead` answers only 503s; its upstream's one endpoint never passes a check.
    let active = |name: &str, label: &str, value: &str| {
        let Ok(answer) = prometheus_api(prometheus, "/api/v1/alerts", &[]) else {
            return false;
        };
        answer["data"]["alerts"].as_array().is_some_and(|alerts| {
            alerts
                .iter()
                .any(|a| a["labels"]["alertname"] == name && a["labels"][label] == value)
        })
    };
    wait_for(Duration::from_secs(20), "the alerts of route dead", || {
        (active("TailguardRouteHighErrorRatio", "route", "dead")
            && active("TailguardUpstreamEndpointDown", "endpoint", "127.0.0.1:1")
            && active("TailguardUpstreamAllEndpointsDown", "upstream", "dead"))
        .then_some(())
    });
    assert!(!active("TailguardRouteHighErrorRatio", "route", "echo"));
    assert!(!active("TailguardConfigReloadFailing", "job", "tailguard"));
    assert!(!active("TailguardEtcdDisconnected", "job", "tailguard"));

    stop.store(true, Ordering::Relaxed);
    let finished = rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), load).await });
    assert!(
        matches!(finished, Ok(Ok(()))),
        "the traffic stopped with {finished:?}"
    );
}

#[test]
fn systemd_unit_passes_systemd_analyze_verify() {
    let Some(analyze) = tool("systemd-analyze") else {
        eprintln!("skipped: systemd-analyze is not installed (package systemd)");
        return;
    };
    let unit = std::fs::read_to_string(deploy("systemd/tailguard.service")).expect("unit");
    // verify checks that ExecStart's binary exists: point a copy at the built one.
    let installed = "/usr/local/bin/tailguard";
    assert!(unit.contains(&format!("ExecStart={installed} run --config ")));
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("tailguard.service");
    std::fs::write(
        &copy,
        unit.replace(installed, env!("CARGO_BIN_EXE_tailguard")),
    )
    .expect("write unit");
    let (ok, out) = run(Command::new(analyze).arg("verify").arg(&copy));
    // verify exits 0 on unknown keys and bad values too, so anything it says is a failure.
    assert!(
        ok && out.trim().is_empty(),
        "systemd-analyze verify:\n{out}"
    );
}

#[test]
fn systemd_unit_gives_the_etcd_cache_its_state_directory() {
    // The gateway's default etcd cache is in $STATE_DIRECTORY (else /var/lib/tailguard, which
    // ProtectSystem=strict leaves read-only without StateDirectory=): etcd.rs's tests show
    // a gateway writing it there.
    let unit = std::fs::read_to_string(deploy("systemd/tailguard.service")).expect("unit");
    assert!(
        unit.lines().any(|l| l == "StateDirectory=tailguard"),
        "the unit has no StateDirectory=tailguard"
    );
}

#[test]
fn systemd_stop_timeout_outlasts_the_default_drain() {
    let unit = std::fs::read_to_string(deploy("systemd/tailguard.service")).expect("unit");
    let stop_s: u64 = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .and_then(|v| v.trim_end_matches('s').parse().ok())
        .expect("TimeoutStopSec=Ns");
    let drain_ms = tailguard_proxy::Config::embedded_default()
        .timeouts
        .shutdown_ms;
    assert!(
        stop_s * 1000 > drain_ms,
        "TimeoutStopSec={stop_s}s kills a gateway still draining for up to {drain_ms} ms"
    );
    assert!(unit.contains("ExecReload=/bin/kill -HUP $MAINPID"));
    assert!(unit.contains("KillSignal=SIGTERM"));
}

#[test]
fn logrotate_rotates_a_running_gateways_log_and_sigusr1_reopens_it() {
    let logrotate = tool("logrotate").expect("logrotate is installed (scripts/install-tools)");
    let dir = tempfile::tempdir().expect("tempdir");
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).expect("logs dir");
    let config = dir.path().join("gw.toml");
    std::fs::write(
        &config,
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[access_log]\npath = \"logs/access.log\"\n\
         flush_ms = 50\n\n[[upstreams]]\nname = \"hello\"\nbuiltin = { status = 200, body = \"hi\" }\n\n\
         [[routes]]\nid = \"hello\"\nupstream = \"hello\"\n",
    )
    .expect("write config");
    let gateway = Gateway::run(&[
        "--config",
        config.to_str().expect("utf-8 path"),
        "--metrics-listen",
        "off",
    ]);
    let get = |path: &str| {
        let (ok, out) = run(Command::new("curl").args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("{}{path}", gateway.url()),
        ]));
        assert!(ok && out == "200", "{path}: {out}");
    };
    let log = logs.join("access.log");
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    get("/before-rotation");
    wait_for(Duration::from_secs(10), "the first line", || {
        read(&log).contains("/before-rotation").then_some(())
    });

    // The shipped snippet, for this directory and this process (no systemd here: the
    // postrotate's `systemctl kill` becomes a kill of the gateway's pid, same signal).
    let snippet = std::fs::read_to_string(deploy("logrotate/tailguard")).expect("snippet");
    assert!(!snippet.contains("\n    copytruncate"));
    let signal_line = snippet
        .lines()
        .find(|l| l.trim_start().starts_with("systemctl kill"))
        .expect("postrotate signals the service");
    assert!(signal_line.contains("--signal=SIGUSR1") && signal_line.contains("--kill-whom=main"));
    let snippet = snippet
        .replace("/var/log/tailguard/", &format!("{}/", logs.display()))
        .replace(
            signal_line.trim(),
            &format!("kill -USR1 {}", gateway.child.id()),
        );
    let conf = dir.path().join("logrotate.conf");
    std::fs::write(&conf, snippet).expect("write logrotate.conf");
    let (ok, out) = run(Command::new(&logrotate)
        .arg("--force")
        .arg("--state")
        .arg(dir.path().join("logrotate.state"))
        .arg(&conf));
    assert!(ok, "logrotate:\n{out}");

    gateway.wait_for_log("access log reopened", Duration::from_secs(10));
    get("/after-rotation");
    wait_for(
        Duration::from_secs(10),
        "the line after the rotation",
        || read(&log).contains("/after-rotation").then_some(()),
    );
    let rotated = read(&logs.join("access.log.1"));
    assert!(rotated.contains("/before-rotation"), "{rotated}");
    assert!(!rotated.contains("/after-rotation"), "{rotated}");
    assert!(!read(&log).contains("/before-rotation"));
}

//! The container image of `deploy/container`: built by `deploy/container/build-image` with
//! podman (FROM scratch, so no registry is needed), then run the way a user runs it, as a
//! non-root user on a read-only root filesystem with every capability dropped: it serves a
//! request through a published port on its default config, `/metrics` is scraped, and the
//! image's stop signal drains a request in flight and exits 0.
//!
//! Needs podman and runc (`scripts/install-tools` installs both). Two settings make podman
//! run on these VMs and change nothing elsewhere: the `runc` runtime, because Debian 12's
//! crun (1.8) refuses a hybrid cgroup hierarchy (cgroup v1 controllers with a v2 mount that
//! has a controller, `hugetlb` here: "cgroups in hybrid mode not supported"), and explicit
//! `--ulimit`s, because podman's defaults raise RLIMIT_NOFILE to 1048576, which root
//! without CAP_SYS_RESOURCE (as here) may not do.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{check, curl_get, output, package_binary, workspace_root};

/// `podman --runtime runc ARGS`.
fn podman(args: &[&str]) -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(["--runtime", "runc"]).args(args);
    cmd
}

/// `podman ARGS` that must succeed: its stdout and stderr.
fn podman_ok(args: &[&str]) -> String {
    let (ok, out) = output(&mut podman(args));
    assert!(ok, "podman {args:?}:\n{out}");
    out
}

/// What `podman run` gets besides the image: the way the chart and docs/deploy.md run it.
const LOCKED_DOWN: &[&str] = &[
    "--read-only",
    "--cap-drop=all",
    "--security-opt=no-new-privileges",
    // At or under any hard limit a test machine has (see the module doc).
    "--ulimit=nofile=4096:4096",
    "--ulimit=nproc=4096:4096",
];

/// The image and the containers of one test, removed on drop.
struct Podman {
    image: String,
    containers: Vec<String>,
}

impl Podman {
    fn build() -> Podman {
        let image = format!("localhost/tailguard-test:{}", std::process::id());
        let (ok, out) = output(
            Command::new(workspace_root().join("deploy/container/build-image"))
                .arg("--binary")
                .arg(package_binary())
                .args(["--tag", &image]),
        );
        assert!(ok, "build-image:\n{out}");
        Podman {
            image,
            containers: Vec::new(),
        }
    }

    /// `podman run -d` with [`LOCKED_DOWN`], `extra` options, the image and `cmd` (empty:
    /// the image's own CMD); the container's id.
    fn run(&mut self, extra: &[&str], cmd: &[&str]) -> String {
        let mut args = vec!["run", "-d"];
        args.extend_from_slice(LOCKED_DOWN);
        args.extend_from_slice(extra);
        args.push(&self.image);
        args.extend_from_slice(cmd);
        let id = podman_ok(&args).trim().to_owned();
        self.containers.push(id.clone());
        id
    }

    fn inspect(&self, what: &str, format: &str) -> String {
        podman_ok(&["inspect", "--format", format, what])
            .trim()
            .to_owned()
    }

    /// The host address a container port is published on.
    fn port(&self, container: &str, port: &str) -> String {
        podman_ok(&["port", container, port]).trim().to_owned()
    }

    fn logs(&self, container: &str) -> String {
        podman_ok(&["logs", container])
    }

    fn wait_for_log(&self, container: &str, needle: &str) {
        let start = Instant::now();
        while !self.logs(container).contains(needle) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no {needle:?} in the log of {container}:\n{}",
                self.logs(container)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // Newest first: a container sharing another's network must go before it.
        for id in self.containers.iter().rev() {
            let _ = podman(&["rm", "-f", "-t", "0", id]).output();
        }
        let _ = podman(&["rmi", "-f", &self.image]).output();
    }
}

/// The value of a sample line `name{labels} value` in an exposition.
fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn the_container_config_passes_check() {
    let path = workspace_root().join("deploy/container/tailguard.toml");
    let (code, out, err) = check(&path);
    assert_eq!(code, 0, "{out}{err}");
    // The whole point of the image's own config: reachable from outside the container.
    let text = std::fs::read_to_string(&path).expect("config");
    assert!(text.contains("address = \"0.0.0.0:8080\""), "{text}");
    assert!(text.contains("listen = \"0.0.0.0:9091\""), "{text}");
}

#[test]
fn the_image_serves_is_scraped_and_drains_on_its_stop_signal_non_root_and_read_only() {
    let mut pm = Podman::build();
    let image = pm.image.clone();

    // What the image says about itself.
    assert_eq!(pm.inspect(&image, "{{.Config.User}}"), "65532:65532");
    assert_eq!(pm.inspect(&image, "{{.Config.StopSignal}}"), "SIGTERM");
    assert_eq!(
        pm.inspect(&image, "{{json .Config.Entrypoint}}"),
        r#"["/usr/bin/tailguard"]"#
    );
    let ports = pm.inspect(&image, "{{json .Config.ExposedPorts}}");
    assert!(
        ports.contains("8080/tcp") && ports.contains("9091/tcp"),
        "{ports}"
    );
    let labels: serde_json::Value =
        serde_json::from_str(&pm.inspect(&image, "{{json .Config.Labels}}")).expect("labels");
    let version = output(Command::new(package_binary()).arg("--version")).1;
    let label = |key: &str| {
        labels[format!("org.opencontainers.image.{key}")]
            .as_str()
            .unwrap_or_else(|| panic!("no label {key}: {labels}"))
            .to_owned()
    };
    assert_eq!(label("title"), "tailguard");
    assert_eq!(
        format!("tailguard {}", label("version")),
        version.trim(),
        "{labels}"
    );
    assert_eq!(label("licenses"), "Apache-2.0");
    assert_eq!(label("revision").len(), 40, "a commit id: {labels}");
    assert!(label("created").ends_with('Z'), "{labels}");
    assert_the_image_holds_only_the_gateway_and_what_it_links(&pm);

    // The config inside the image, checked by the binary inside the image.
    let (ok, out) = output(&mut podman(&[
        "run",
        "--rm",
        "--read-only",
        "--ulimit=nofile=4096:4096",
        "--ulimit=nproc=4096:4096",
        &image,
        "check",
        "--config",
        "/etc/tailguard/tailguard.toml",
    ]));
    assert!(ok && out.contains(": ok ("), "{out}");

    // 1. The image as it is: its CMD, its config on 0.0.0.0, reached through published ports.
    let gw = pm.run(&["-p", "127.0.0.1::8080", "-p", "127.0.0.1::9091"], &[]);
    pm.wait_for_log(&gw, "tailguard: listening on 0.0.0.0:8080");
    let pid = pm.inspect(&gw, "{{.State.Pid}}");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let uids = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .expect("Uid line");
    assert_eq!(
        uids.split_whitespace().collect::<Vec<_>>(),
        ["65532"; 4],
        "the gateway runs as 65532 (real, effective, saved, fs)"
    );
    let (code, body) = curl_get(&format!("http://{}/", pm.port(&gw, "8080/tcp")));
    assert_eq!(code, 200, "{body}\n{}", pm.logs(&gw));
    assert!(body.contains("Hello from tailguard!"), "{body}");
    let metrics = format!("http://{}/metrics", pm.port(&gw, "9091/tcp"));
    let (code, scrape) = curl_get(&metrics);
    assert_eq!(code, 200, "{scrape}");
    assert_eq!(
        sample(
            &scrape,
            r#"tailguard_requests_total{route="demo",method="GET",status="200"}"#
        ),
        Some(1.0),
        "{scrape}"
    );
    podman_ok(&["stop", "-t", "30", &gw]);
    assert_eq!(
        pm.inspect(&gw, "{{.State.ExitCode}}"),
        "0",
        "{}",
        pm.logs(&gw)
    );

    // 2. A request in flight when the container is stopped. `tailguard upstream` (the same
    // image) answers after 1.5 s on the loopback of a network namespace the gateway joins.
    let up = pm.run(
        &["-p", "127.0.0.1::8080", "-p", "127.0.0.1::9091"],
        &[
            "upstream",
            "--listen",
            "127.0.0.1:3000",
            "--latency",
            "1500",
        ],
    );
    let gw = pm.run(
        &[&format!("--network=container:{up}")],
        &[
            "run",
            "--config",
            "/etc/tailguard/tailguard.toml",
            "--upstream",
            "demo=127.0.0.1:3000",
        ],
    );
    pm.wait_for_log(&gw, "tailguard: listening on 0.0.0.0:8080");
    let url = format!("http://{}/slow", pm.port(&up, "8080/tcp"));
    let metrics = format!("http://{}/metrics", pm.port(&up, "9091/tcp"));
    let in_flight = std::thread::spawn(move || curl_get(&url));
    let start = Instant::now();
    while curl_get(&metrics)
        .1
        .lines()
        .all(|l| l != "tailguard_requests_in_flight 1")
    {
        assert!(start.elapsed() < Duration::from_secs(10), "never in flight");
        std::thread::sleep(Duration::from_millis(20));
    }
    // `podman stop` sends the image's STOPSIGNAL and waits (here up to 30 s).
    podman_ok(&["stop", "-t", "30", &gw]);
    let (code, body) = in_flight.join().expect("client thread");
    let log = pm.logs(&gw);
    assert_eq!(code, 200, "the request in flight: {body}\n{log}");
    assert!(
        log.contains("tailguard: shutting down, draining") && log.contains("drained, exiting"),
        "{log}"
    );
    assert_eq!(pm.inspect(&gw, "{{.State.ExitCode}}"), "0", "{log}");
}

/// The image's root filesystem holds what the Containerfile says and nothing else: the
/// binary, its loader and libraries, the user database, the config, CA certificates.
fn assert_the_image_holds_only_the_gateway_and_what_it_links(pm: &Podman) {
    let mount = podman_ok(&["image", "mount", &pm.image]);
    let root = PathBuf::from(mount.trim());
    let mut files = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read the image's rootfs") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let rel = path.strip_prefix(&root).expect("under root");
                files.push(format!("/{}", rel.display()));
            }
        }
    }
    let _ = podman(&["image", "unmount", &pm.image]).output();
    files.sort();
    for must in [
        "/usr/bin/tailguard",
        "/etc/tailguard/tailguard.toml",
        "/etc/passwd",
        "/etc/group",
    ] {
        assert!(files.iter().any(|f| f == must), "{must} missing: {files:?}");
    }
    for f in &files {
        let allowed = f == "/usr/bin/tailguard"
            || f.starts_with("/etc/")
            || f.starts_with("/lib/")
            || f.starts_with("/lib64/")
            || f.starts_with("/usr/lib/");
        assert!(allowed, "unexpected {f} in the image: {files:?}");
    }
}

//! The targets a condition's load goes to, each a child process that is ready when it
//! answers: the built-in upstreams (started once per run), the gateway and nginx (started per
//! condition); with the gateway config for two upstreams, the flags a gateway build knows,
//! and why a child exited before it was ready.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::LabError;
use crate::context::{Ctx, RunOptions, slug};
use crate::procs::{ChildGuard, pinned_command, to_file, wait_for_line, which};
use crate::scenario::{Condition, TargetKind};

/// A started target: its URL, metrics URL, and the process guard (None for the upstream).
pub(crate) struct Target {
    pub(crate) url: String,
    /// Where paths under `/b` go when that is not `url` (the second upstream, direct).
    pub(crate) url_b: Option<String>,
    pub(crate) metrics: Option<String>,
    /// The process whose CPU per request is measured (a command target).
    pub(crate) cpu_pid: Option<u32>,
    pub(crate) _guard: Option<ChildGuard>,
}

impl Target {
    /// The URL of `path` on this target.
    pub(crate) fn url_for(&self, path: &str) -> String {
        let to_b = path == "/b" || path.starts_with("/b/") || path.starts_with("/b?");
        match (&self.url_b, to_b) {
            (Some(b), true) => format!("{b}{path}"),
            _ => format!("{}{path}", self.url),
        }
    }
}

fn free_addr() -> Result<SocketAddr, LabError> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// Starts one built-in upstream (`tailguard upstream --listen 127.0.0.1:0 ARGS`) and waits for
/// its address.
pub(crate) fn start_upstream(
    opts: &RunOptions,
    name: &str,
    args: &[String],
    cpus: &[usize],
) -> Result<(ChildGuard, String), LabError> {
    let (mut cmd, _) = pinned_command(&opts.exe, cpus, opts.nice);
    cmd.arg("upstream")
        .arg("--listen")
        .arg("127.0.0.1:0")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(to_file(&opts.out.join(format!("{name}.log")))?);
    let mut child = ChildGuard::spawn(name, &mut cmd)?;
    let addr = wait_for_line(&mut child, "listening on ", Duration::from_secs(20))?;
    println!(
        "  {}: tailguard upstream {} on {addr}",
        name.replace('_', " "),
        args.join(" ")
    );
    Ok((child, addr))
}

/// The gateway config of a scenario with two upstreams: upstream `a` (the scenario's
/// `[upstream]`) behind route `a` on `/a`, upstream `b` behind route `b` on `/b`. The route
/// ids are the shedder's groups, the upstream names the limit's `upstream` label. Everything
/// else is the embedded default's (its listener is replaced by `--listen`).
pub fn two_upstreams_config(a: &str, b: &str) -> String {
    format!(
        "# Written by `tailguard lab` for a scenario with two upstreams.\n\
         [[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"a\"\nendpoints = [{{ address = \"{a}\" }}]\n\n\
         [[upstreams]]\nname = \"b\"\nendpoints = [{{ address = \"{b}\" }}]\n\n\
         [[routes]]\nid = \"a\"\nupstream = \"a\"\npath = {{ prefix = \"/a\" }}\n\n\
         [[routes]]\nid = \"b\"\nupstream = \"b\"\npath = {{ prefix = \"/b\" }}\n"
    )
}

/// The gateway config of a condition with its own `config`: upstream `demo` (the built-in
/// one) behind route `demo` on `/`, as `--upstream demo=ADDR` would give, then the
/// condition's TOML (e.g. a `[tracing]` table).
pub fn one_upstream_config(upstream: &str, extra: &str) -> String {
    format!(
        "# Written by `tailguard lab` for one condition.\n\
         [[listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[upstreams]]\nname = \"demo\"\nendpoints = [{{ address = \"{upstream}\" }}]\n\n\
         [[routes]]\nid = \"demo\"\nupstream = \"demo\"\npath = {{ prefix = \"/\" }}\n\n\
         {extra}\n"
    )
}

impl Ctx<'_> {
    pub(crate) fn start_target(&self, cond: &Condition) -> Result<Target, String> {
        match cond.target {
            TargetKind::Upstream => Ok(Target {
                url: format!("http://{}", self.upstream_addr),
                url_b: self.upstream_b_addr.as_ref().map(|b| format!("http://{b}")),
                metrics: None,
                cpu_pid: None,
                _guard: None,
            }),
            TargetKind::Gateway => self.start_gateway(cond),
            TargetKind::Nginx => self.start_nginx(cond),
            TargetKind::Command => self.start_command(cond),
        }
    }

    /// Whether `tailguard run` lists `flag` (assumed yes when help could not be read).
    fn knows(&self, flag: &str) -> bool {
        self.gateway_flags
            .as_ref()
            .is_none_or(|known| known.iter().any(|k| k == flag))
    }

    /// Replaces `{out}` in gateway arguments with the output directory.
    fn expand(&self, args: &[String]) -> Vec<String> {
        let out = self.opts.out.display().to_string();
        args.iter().map(|a| a.replace("{out}", &out)).collect()
    }

    fn start_gateway(&self, cond: &Condition) -> Result<Target, String> {
        let listen = free_addr().map_err(|e| e.to_string())?;
        let metrics = free_addr().map_err(|e| e.to_string())?;
        let log = self
            .opts
            .out
            .join(format!("{}.gateway.log", slug(&cond.name)));
        let mut args = vec![
            "run".to_string(),
            "--listen".to_string(),
            listen.to_string(),
        ];
        match (&self.gateway_config, &cond.config) {
            (Some(config), _) => {
                args.push("--config".into());
                args.push(config.display().to_string());
            }
            (None, Some(extra)) => {
                let path = self
                    .opts
                    .out
                    .join(format!("{}.gateway.toml", slug(&cond.name)));
                let mut extra = self.expand(std::slice::from_ref(extra)).remove(0);
                if let Some(collector) = &self.collector {
                    extra = collector.expand(&extra);
                }
                std::fs::write(&path, one_upstream_config(&self.upstream_addr, &extra))
                    .map_err(|e| e.to_string())?;
                args.push("--config".into());
                args.push(path.display().to_string());
            }
            (None, None) => {
                args.push("--upstream".into());
                args.push(format!("demo={}", self.upstream_addr));
            }
        }
        let wants_metrics = cond.scrape_every.is_some() || self.scenario.timeline.is_some();
        if wants_metrics || self.knows("--metrics-listen") {
            args.push("--metrics-listen".into());
            args.push(metrics.to_string());
        }
        args.extend(self.expand(&self.scenario.gateway.args));
        args.extend(self.expand(&cond.gateway));
        // Say which feature is missing before starting anything, when help lists the flags.
        if let Some(known) = &self.gateway_flags {
            let missing: Vec<&str> = args
                .iter()
                .filter(|a| a.starts_with("--"))
                .map(|a| a.split('=').next().unwrap_or(a))
                .filter(|a| !known.iter().any(|k| k == a))
                .collect();
            if !missing.is_empty() {
                return Err(format!(
                    "feature missing: this gateway build does not accept `{}` (the feature behind it has not landed)",
                    missing.join("`, `")
                ));
            }
        }
        // The exact command, for reproducing a condition by hand.
        let _ = std::fs::write(
            self.opts
                .out
                .join(format!("{}.gateway.cmd", slug(&cond.name))),
            format!("{} {}\n", self.opts.exe.display(), args.join(" ")),
        );
        let (mut cmd, _) = pinned_command(&self.opts.exe, &self.gateway_cpus, self.opts.nice);
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(
                to_file(
                    &self
                        .opts
                        .out
                        .join(format!("{}.gateway.out", slug(&cond.name))),
                )
                .map_err(|e| e.to_string())?,
            )
            .stderr(to_file(&log).map_err(|e| e.to_string())?);
        let mut guard = ChildGuard::spawn("gateway", &mut cmd).map_err(|e| e.to_string())?;
        wait_ready(&mut guard, listen, &log)?;
        Ok(Target {
            url: format!("http://{listen}"),
            url_b: None,
            metrics: Some(format!("http://{metrics}/metrics")),
            cpu_pid: None,
            _guard: Some(guard),
        })
    }

    fn start_nginx(&self, cond: &Condition) -> Result<Target, String> {
        let Some(nginx) = which("nginx").or_else(|| {
            let p = PathBuf::from("/usr/sbin/nginx");
            p.is_file().then_some(p)
        }) else {
            return Err("nginx is not installed (apt-get install nginx-light); skipped".into());
        };
        let listen = free_addr().map_err(|e| e.to_string())?;
        let dir = self.opts.out.join(format!("{}.nginx", slug(&cond.name)));
        std::fs::create_dir_all(dir.join("tmp")).map_err(|e| e.to_string())?;
        // The proxy helper's config (lab/nginx/proxy.conf, also used by lab/compare-nginx.sh)
        // when present, so both benchmarks measure the same nginx; else a built-in equivalent.
        let template = self
            .opts
            .scenarios_dir
            .parent()
            .map(|lab| lab.join("nginx/proxy.conf"))
            .filter(|p| p.is_file());
        let conf = match &template {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("{}: {e}", path.display()))?
                .replace("@DIR@", &dir.display().to_string())
                .replace("@LISTEN@", &listen.to_string())
                .replace("@UPSTREAM@", &self.upstream_addr),
            None => nginx_config(&dir, listen, &self.upstream_addr),
        };
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf).map_err(|e| e.to_string())?;
        let log = dir.join("stderr.log");
        let (mut cmd, _) = pinned_command(&nginx, &self.gateway_cpus, self.opts.nice);
        cmd.arg("-e")
            .arg(dir.join("error.log"))
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&conf_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(to_file(&log).map_err(|e| e.to_string())?);
        let mut guard = ChildGuard::spawn("nginx", &mut cmd).map_err(|e| e.to_string())?;
        wait_ready(&mut guard, listen, &log)?;
        Ok(Target {
            url: format!("http://{listen}"),
            url_b: None,
            metrics: None,
            cpu_pid: None,
            _guard: Some(guard),
        })
    }

    /// A condition's own server: `cond.command` with its placeholders filled, pinned like the
    /// gateway, ready when it answers on `{listen}`.
    fn start_command(&self, cond: &Condition) -> Result<Target, String> {
        let listen = free_addr().map_err(|e| e.to_string())?;
        let metrics = free_addr().map_err(|e| e.to_string())?;
        let out = self.opts.out.display().to_string();
        let exe_dir = self
            .opts
            .exe
            .parent()
            .map(|d| d.display().to_string())
            .unwrap_or_else(|| ".".into());
        let fill = |a: &str| {
            a.replace("{exe_dir}", &exe_dir)
                .replace("{listen}", &listen.to_string())
                .replace("{metrics}", &metrics.to_string())
                .replace("{out}", &out)
        };
        let argv: Vec<String> = cond.command.iter().map(|a| fill(a)).collect();
        let Some((program, args)) = argv.split_first() else {
            return Err(format!("condition `{}` has no command", cond.name));
        };
        let program = PathBuf::from(program);
        if program.components().count() > 1 && !program.is_file() {
            return Err(format!(
                "{} is not built (condition `{}`)",
                program.display(),
                cond.name
            ));
        }
        let stem = slug(&cond.name);
        let log = self.opts.out.join(format!("{stem}.command.log"));
        let _ = std::fs::write(
            self.opts.out.join(format!("{stem}.command.cmd")),
            format!("{}\n", argv.join(" ")),
        );
        let (mut cmd, _) = pinned_command(&program, &self.gateway_cpus, self.opts.nice);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(
                to_file(&self.opts.out.join(format!("{stem}.command.out")))
                    .map_err(|e| e.to_string())?,
            )
            .stderr(to_file(&log).map_err(|e| e.to_string())?);
        let mut guard = ChildGuard::spawn("command", &mut cmd).map_err(|e| e.to_string())?;
        wait_ready(&mut guard, listen, &log)?;
        Ok(Target {
            url: format!("http://{listen}"),
            url_b: None,
            metrics: cond.metrics_url.as_deref().map(fill),
            cpu_pid: Some(guard.id()),
            _guard: Some(guard),
        })
    }
}

/// The `--flags` that `exe run --help` lists, or `None` if it cannot be run.
pub fn gateway_flags(exe: &Path) -> Option<Vec<String>> {
    let out = std::process::Command::new(exe)
        .args(["run", "--help"])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let flags: Vec<String> = text
        .split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '[' || c == '<')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(str::to_string)
        .collect();
    (!flags.is_empty()).then_some(flags)
}

/// nginx as a plain reverse proxy with upstream keep-alive, one worker, no access log.
pub fn nginx_config(dir: &Path, listen: SocketAddr, upstream: &str) -> String {
    let d = dir.display();
    format!(
        "worker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
events {{ worker_connections 4096; }}\n\
http {{\n  access_log off;\n  client_body_temp_path {d}/tmp/body;\n  proxy_temp_path {d}/tmp/proxy;\n\
  fastcgi_temp_path {d}/tmp/fastcgi;\n  uwsgi_temp_path {d}/tmp/uwsgi;\n  scgi_temp_path {d}/tmp/scgi;\n\
  upstream backend {{ server {upstream}; keepalive 64; }}\n\
  server {{\n    listen {listen};\n    location = /healthz {{ return 200 \"ok\\n\"; }}\n\
    location / {{ proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\"; }}\n  }}\n}}\n"
    )
}

/// Waits until `addr` accepts and answers; if the process exits first, says why, naming a
/// flag the gateway rejected as a missing feature.
fn wait_ready(guard: &mut ChildGuard, addr: SocketAddr, log: &Path) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = guard.exited() {
            let stderr = std::fs::read_to_string(log).unwrap_or_default();
            return Err(explain_exit(guard.name(), status, &stderr));
        }
        if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n");
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).unwrap_or(0);
            if n > 0 {
                let head = String::from_utf8_lossy(&buf[..n]);
                if !head.starts_with("HTTP/1.1 200") {
                    println!(
                        "    note: {} answered GET /healthz with `{}`",
                        guard.name(),
                        head.lines().next().unwrap_or("")
                    );
                }
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} did not accept on {addr} within 30 s",
                guard.name()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Turns a gateway's early exit into a sentence; clap's "unexpected argument '--x'" means
/// the feature behind `--x` has not landed in this build.
pub fn explain_exit(name: &str, status: std::process::ExitStatus, stderr: &str) -> String {
    if let Some(rest) = stderr.split("unexpected argument '").nth(1)
        && let Some(flag) = rest.split('\'').next()
    {
        return format!(
            "feature missing: this {name} build does not accept `{flag}` (the feature behind it has not landed)"
        );
    }
    if stderr.contains("not built yet") {
        return format!("feature missing: `tailguard run` is not built yet in this {name} build");
    }
    // clap and most programs put the reason on an `error:` line; otherwise the last line.
    let last = stderr
        .lines()
        .find(|l| l.trim_start().to_ascii_lowercase().starts_with("error"))
        .or_else(|| stderr.lines().rev().find(|l| !l.trim().is_empty()))
        .unwrap_or("no output");
    format!("{name} exited ({status}) before it was ready: {last}")
}

#[cfg(test)]
mod tests {

    #[test]
    fn paths_under_b_go_to_the_second_upstream_when_direct() {
        let target = super::Target {
            url: "http://A".into(),
            url_b: Some("http://B".into()),
            metrics: None,
            cpu_pid: None,
            _guard: None,
        };
        assert_eq!(target.url_for("/a"), "http://A/a");
        assert_eq!(target.url_for("/b"), "http://B/b");
        assert_eq!(target.url_for("/b/x"), "http://B/b/x");
        assert_eq!(target.url_for("/bx"), "http://A/bx");
        let config = super::two_upstreams_config("127.0.0.1:1", "127.0.0.1:2");
        assert!(config.contains("name = \"b\"\nendpoints = [{ address = \"127.0.0.1:2\" }]"));
        assert!(config.contains("id = \"a\"\nupstream = \"a\"\npath = { prefix = \"/a\" }"));
    }
}

//! `tailguard lab routes`: what the size of the route table costs, tailguard beside nginx
//! serving the same table (issue 46's table): CPU per request at a fixed rate to a prefix
//! route in the middle of the table, memory, the time from the start to the first answer,
//! and a SIGHUP reload's time with the slowest request that overlapped it.
//!
//! The table (`lab/scenarios/routes/routes.toml` says the sizes, the rate and the rounds):
//! `n` path routes, half prefixes (`/t{i}/api`) and half exact paths (`/t{i}/x`), and
//! `n / 10` host routes (`h{j}.example.com`); nginx gets them as `location /t{i}/api/`,
//! `location = /t{i}/x` and one `server` per host. Rounds interleave the proxies and the
//! sizes; each figure is the median of the rounds with their range beside it.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::LabError;
use crate::procs::{ChildGuard, pinned_command, process_cpu, to_file, wait_for_line, which};

/// The scenario's data (`lab/scenarios/routes/routes.toml`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutesScenario {
    /// Path routes per table (host routes are a tenth of it on top).
    pub sizes: Vec<usize>,
    /// Requests per second to the route in the middle of the table.
    pub rate: f64,
    /// Seconds of load whose CPU is measured (after one second of warm-up).
    pub seconds: f64,
    /// Rounds over every proxy and size, interleaved.
    pub rounds: usize,
    /// Keep-alive connections of the load.
    pub connections: usize,
    /// Cores of the proxy under test and of the upstream and the load.
    pub proxy_cpus: Vec<usize>,
    /// Cores of the upstream and the load generator.
    pub load_cpus: Vec<usize>,
    /// `--quick` (CI): these sizes, one round of this many seconds.
    pub quick_sizes: Vec<usize>,
    /// `--quick` seconds.
    pub quick_seconds: f64,
}

/// One proxy's run on one table.
#[derive(Debug, Clone, Copy, Default)]
struct Cell {
    cpu_us: f64,
    pss_kb: u64,
    start: Duration,
    reload: Option<Duration>,
    /// P99 and P100 (ms) of the load that overlapped the reload.
    reload_p99_ms: f64,
    reload_p100_ms: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proxy {
    Tailguard,
    Nginx,
}

impl Proxy {
    fn name(self) -> &'static str {
        match self {
            Proxy::Tailguard => "tailguard",
            Proxy::Nginx => "nginx",
        }
    }
}

/// Runs the scenario and prints its table (also written to `out/summary.md`).
pub fn run(
    exe: &Path,
    scenario_file: &Path,
    out: &Path,
    quick: bool,
    nice: Option<i32>,
) -> Result<(), LabError> {
    let text = std::fs::read_to_string(scenario_file)?;
    let mut s: RoutesScenario = toml::from_str(&text).map_err(|e| LabError::Scenario {
        path: scenario_file.display().to_string(),
        why: e.to_string(),
    })?;
    if quick {
        s.sizes = s.quick_sizes.clone();
        s.seconds = s.quick_seconds;
        s.rounds = 1;
    }
    std::fs::create_dir_all(out)?;
    crate::procs::install_signal_handler()?;
    let nginx = which("nginx").or_else(|| {
        let p = PathBuf::from("/usr/sbin/nginx");
        p.is_file().then_some(p)
    });
    if nginx.is_none() {
        println!(
            "nginx is not installed (TAILGUARD_LAB_TOOLS=1 scripts/install-tools); tailguard only"
        );
    }
    let (mut upstream_guard, upstream) = start_upstream(exe, out, &s.load_cpus, nice)?;
    let mut cells: Vec<(Proxy, usize, Vec<Cell>)> = Vec::new();
    for round in 0..s.rounds {
        for &n in &s.sizes {
            for proxy in [Proxy::Tailguard, Proxy::Nginx] {
                let program = match proxy {
                    Proxy::Tailguard => exe.to_path_buf(),
                    Proxy::Nginx => match &nginx {
                        Some(p) => p.clone(),
                        None => continue,
                    },
                };
                println!("round {}: {} with {n} routes", round + 1, proxy.name());
                let cell =
                    run_cell(&s, proxy, &program, n, &upstream, out, nice).map_err(|why| {
                        LabError::Child {
                            name: format!("{} with {n} routes", proxy.name()),
                            why,
                        }
                    })?;
                println!(
                    "  {:.1} us/request, {} MB, start {:.2} s, reload {}",
                    cell.cpu_us,
                    cell.pss_kb / 1024,
                    cell.start.as_secs_f64(),
                    cell.reload
                        .map_or("-".to_string(), |d| format!("{:.2} s", d.as_secs_f64()))
                );
                match cells
                    .iter_mut()
                    .find(|(p, size, _)| *p == proxy && *size == n)
                {
                    Some((_, _, runs)) => runs.push(cell),
                    None => cells.push((proxy, n, vec![cell])),
                }
            }
        }
    }
    upstream_guard.stop(Duration::from_secs(2));
    let table = render(&s, &cells);
    print!("{table}");
    std::fs::write(out.join("summary.md"), &table)?;
    Ok(())
}

/// The built-in upstream, on the load's cores.
fn start_upstream(
    exe: &Path,
    out: &Path,
    cpus: &[usize],
    nice: Option<i32>,
) -> Result<(ChildGuard, String), LabError> {
    let (mut cmd, _) = pinned_command(exe, cpus, nice);
    cmd.args(["upstream", "--listen", "127.0.0.1:0", "--threads", "1"])
        .args(["--body-bytes", "100"])
        .stdout(Stdio::piped())
        .stderr(to_file(&out.join("upstream.log"))?);
    let mut child = ChildGuard::spawn("upstream", &mut cmd)?;
    let addr = wait_for_line(&mut child, "listening on ", Duration::from_secs(20))?;
    Ok((child, addr))
}

/// The path of the prefix route in the middle of a table of `n`.
fn target_path(n: usize) -> String {
    format!("/t{}/api/items", (n / 2) & !1)
}

/// The tailguard config of a table of `n` path routes and `n / 10` host routes.
pub fn tailguard_config(n: usize, listen: SocketAddr, upstream: &str) -> String {
    let mut c = format!(
        "[[listeners]]\naddress = \"{listen}\"\n\n[[upstreams]]\nname = \"u\"\n\
         endpoints = [{{ address = \"{upstream}\" }}]\n"
    );
    for i in 0..n {
        let path = if i % 2 == 0 {
            format!("prefix = \"/t{i}/api\"")
        } else {
            format!("exact = \"/t{i}/x\"")
        };
        c.push_str(&format!(
            "\n[[routes]]\nid = \"r{i}\"\nupstream = \"u\"\npath = {{ {path} }}\n"
        ));
    }
    for j in 0..n / 10 {
        c.push_str(&format!(
            "\n[[routes]]\nid = \"h{j}\"\nupstream = \"u\"\nhost = \"h{j}.example.com\"\n"
        ));
    }
    c
}

/// The same table for nginx: one worker, upstream keep-alive, no access log.
pub fn nginx_config(dir: &Path, n: usize, listen: SocketAddr, upstream: &str) -> String {
    let d = dir.display();
    let mut c = format!(
        "worker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 4096; }}\nhttp {{\n  access_log off;\n\
         client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         keepalive_requests 1000000;\n  server_names_hash_max_size 262144;\n\
         server_names_hash_bucket_size 128;\n  proxy_http_version 1.1;\n\
         proxy_set_header Connection \"\";\n\
         upstream backend {{ server {upstream}; keepalive 64; keepalive_requests 1000000; }}\n\
         server {{\n    listen {listen} default_server;\n\
         location = /healthz {{ return 200 \"ok\\n\"; }}\n"
    );
    for i in 0..n {
        if i % 2 == 0 {
            c.push_str(&format!(
                "    location /t{i}/api/ {{ proxy_pass http://backend; }}\n"
            ));
        } else {
            c.push_str(&format!(
                "    location = /t{i}/x {{ proxy_pass http://backend; }}\n"
            ));
        }
    }
    c.push_str("  }\n");
    for j in 0..n / 10 {
        c.push_str(&format!(
            "  server {{ listen {listen}; server_name h{j}.example.com; \
             location / {{ proxy_pass http://backend; }} }}\n"
        ));
    }
    c.push_str("}\n");
    c
}

fn free_addr() -> Result<SocketAddr, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())
}

/// Starts `proxy` on a table of `n`, then measures it.
fn run_cell(
    s: &RoutesScenario,
    proxy: Proxy,
    program: &Path,
    n: usize,
    upstream: &str,
    out: &Path,
    nice: Option<i32>,
) -> Result<Cell, String> {
    let listen = free_addr()?;
    let dir = out.join(format!("{}-{n}", proxy.name()));
    let _ = std::fs::create_dir_all(&dir);
    let (mut cmd, _) = pinned_command(program, &s.proxy_cpus, nice);
    match proxy {
        Proxy::Tailguard => {
            let conf = dir.join("gateway.toml");
            std::fs::write(&conf, tailguard_config(n, listen, upstream))
                .map_err(|e| e.to_string())?;
            let metrics = free_addr()?;
            cmd.arg("run").arg("--config").arg(&conf).args([
                "--threads",
                "1",
                "--metrics-listen",
                &metrics.to_string(),
            ]);
        }
        Proxy::Nginx => {
            let conf = dir.join("nginx.conf");
            std::fs::write(&conf, nginx_config(&dir, n, listen, upstream))
                .map_err(|e| e.to_string())?;
            cmd.arg("-c").arg(&conf).arg("-p").arg(&dir);
        }
    }
    cmd.stdin(Stdio::null())
        .stdout(to_file(&dir.join("stdout.log")).map_err(|e| e.to_string())?)
        .stderr(to_file(&dir.join("stderr.log")).map_err(|e| e.to_string())?);
    let path = target_path(n);
    let started = Instant::now();
    let mut guard = ChildGuard::spawn(proxy.name(), &mut cmd).map_err(|e| e.to_string())?;
    // The start: until the route in the middle of the table answers.
    loop {
        if let Some(status) = guard.exited() {
            return Err(format!(
                "exited ({status}) before it answered; see {}",
                dir.display()
            ));
        }
        if get(listen, &path) == Some(200) {
            break;
        }
        if started.elapsed() > Duration::from_secs(300) {
            return Err(format!("{path} did not answer 200 within 300 s"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let start = started.elapsed();
    // taskset and nice exec into the proxy, so the child's pid is the proxy's.
    let pid = guard.id();
    let url = format!("http://{listen}{path}");
    let load = |seconds: f64| {
        let mut config = tailguard_loadgen::load::LoadConfig::new(
            &url,
            s.rate,
            Duration::from_secs_f64(seconds),
            s.connections,
        );
        config.pin = s.load_cpus.clone();
        config.nice = nice;
        config.progress = false;
        tailguard_loadgen::load::run(&config).map_err(|e| format!("load: {e}"))
    };
    load(1.0)?;
    let cpu_before = group_cpu(pid);
    let report = load(s.seconds)?;
    let cpu = group_cpu(pid).saturating_sub(cpu_before);
    if report.ok_count() < report.completed || report.completed == 0 {
        return Err(format!(
            "{} of {} requests to {path} were not answered 2xx",
            report.completed - report.ok_count(),
            report.completed
        ));
    }
    let cpu_us = cpu.as_secs_f64() * 1e6 / report.completed as f64;
    let pss_kb = group_pids(pid).iter().map(|&p| pss_kb(p)).sum();
    // A SIGHUP with the same file, under the same load: how long until the new table
    // serves, and the slowest request that overlapped it.
    let workers_before = group_pids(pid);
    let log = dir.join("stderr.log");
    let reloads_before = count_lines(&log, "tailguard: reloaded");
    let (reload, report) = std::thread::scope(|scope| {
        let loaded = scope.spawn(|| load(s.seconds.max(2.0)));
        std::thread::sleep(Duration::from_secs_f64(s.seconds.max(2.0) / 4.0));
        let sent = Instant::now();
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid as i32).expect("a child's pid is positive"),
            rustix::process::Signal::HUP,
        );
        let mut reload = None;
        while sent.elapsed() < Duration::from_secs(60) {
            let done = match proxy {
                // The line it logs once the new snapshot is swapped in.
                Proxy::Tailguard => count_lines(&log, "tailguard: reloaded") > reloads_before,
                // A new worker: it forked from the master after the new config was parsed.
                Proxy::Nginx => group_pids(pid).iter().any(|p| !workers_before.contains(p)),
            };
            if done {
                reload = Some(sent.elapsed());
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        (
            reload,
            loaded.join().map_err(|_| "load panicked".to_string()),
        )
    });
    let report = report??;
    guard.stop(Duration::from_secs(5));
    Ok(Cell {
        cpu_us,
        pss_kb,
        start,
        reload,
        reload_p99_ms: report.percentile_ms(99.0),
        reload_p100_ms: report.percentile_ms(100.0),
    })
}

/// `GET path` on a fresh connection; the status, or `None` when nothing answers.
fn get(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .ok()?;
    let mut buf = [0u8; 32];
    let n = s.read(&mut buf).ok()?;
    let head = std::str::from_utf8(&buf[..n]).ok()?;
    head.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// A process and its children (nginx's workers), from `/proc/PID/task/PID/children`.
fn group_pids(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    if let Ok(children) = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")) {
        pids.extend(
            children
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    pids
}

/// CPU time of a process and its children so far.
fn group_cpu(pid: u32) -> Duration {
    group_pids(pid).iter().filter_map(|&p| process_cpu(p)).sum()
}

/// Proportional set size: resident memory with each shared page split between the
/// processes that map it (nginx's master and worker share the table they both hold).
fn pss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn count_lines(log: &Path, needle: &str) -> usize {
    std::fs::read_to_string(log)
        .map(|t| t.matches(needle).count())
        .unwrap_or(0)
}

/// The median of some figures and their range, e.g. `31 (29-33)`.
fn spread(mut v: Vec<f64>, digits: usize) -> String {
    v.sort_by(f64::total_cmp);
    let Some((lo, hi)) = v.first().zip(v.last()) else {
        return "-".into();
    };
    let mid = v[v.len() / 2];
    if v.len() == 1 {
        format!("{mid:.digits$}")
    } else {
        format!("{mid:.digits$} ({lo:.digits$}-{hi:.digits$})")
    }
}

/// The comparison table, in Markdown.
fn render(s: &RoutesScenario, cells: &[(Proxy, usize, Vec<Cell>)]) -> String {
    let mut t = format!(
        "\n## tailguard lab routes: {} req/s for {} s to a prefix route in the middle of the \
         table, one serving thread / one worker, {} round(s) interleaved (median (range))\n\n\
         | proxy | path routes (+ host routes) | CPU per request (us) | vs 1 route | memory (PSS, MB) \
         | start to first answer (s) | SIGHUP reload (s) | P99 / P100 during the reload (ms) |\n\
         |---|---|---|---|---|---|---|---|\n",
        s.rate, s.seconds, s.rounds
    );
    for (proxy, n, runs) in cells {
        let base = cells
            .iter()
            .find(|(p, size, _)| p == proxy && *size == s.sizes[0])
            .map(|(_, _, r)| median(r.iter().map(|c| c.cpu_us).collect()));
        let growth = base.map_or("-".into(), |b| {
            format!(
                "{:.2}x",
                median(runs.iter().map(|c| c.cpu_us).collect()) / b
            )
        });
        let reloads: Vec<f64> = runs
            .iter()
            .filter_map(|c| c.reload.map(|d| d.as_secs_f64()))
            .collect();
        t.push_str(&format!(
            "| {} | {n} (+{}) | {} | {growth} | {} | {} | {} | {} / {} |\n",
            proxy.name(),
            n / 10,
            spread(runs.iter().map(|c| c.cpu_us).collect(), 1),
            spread(runs.iter().map(|c| c.pss_kb as f64 / 1024.0).collect(), 0),
            spread(runs.iter().map(|c| c.start.as_secs_f64()).collect(), 2),
            spread(reloads, 2),
            spread(runs.iter().map(|c| c.reload_p99_ms).collect(), 2),
            spread(runs.iter().map(|c| c.reload_p100_ms).collect(), 2),
        ));
    }
    t
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_proxies_get_the_same_table() {
        let addr: SocketAddr = "127.0.0.1:8080".parse().expect("an address");
        let tg = tailguard_config(10, addr, "127.0.0.1:9");
        let nx = nginx_config(Path::new("/tmp/x"), 10, addr, "127.0.0.1:9");
        assert_eq!(tg.matches("[[routes]]").count(), 11);
        assert_eq!(tg.matches("prefix = ").count(), 5);
        assert_eq!(nx.matches("location /t").count(), 5);
        assert_eq!(nx.matches("location = /t").count(), 5);
        assert_eq!(nx.matches("server_name h").count(), 1);
        // The route in the middle is a prefix route both serve.
        assert_eq!(target_path(10), "/t4/api/items");
        assert!(tg.contains("prefix = \"/t4/api\""));
        assert!(nx.contains("location /t4/api/ "));
        assert_eq!(target_path(1), "/t0/api/items");
    }
}

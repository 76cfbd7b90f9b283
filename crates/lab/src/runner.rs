//! The scenario runner: starts the upstream and the gateway (or nginx) as separate, pinned
//! processes, runs each condition's load, and prints one comparison table with P100 plus an
//! overlaid SVG plot; every child it started is stopped on the way out, whatever the way out.

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::LabError;
use crate::latency::{Latency, format_us};
use crate::load::LoadConfig;
use crate::plot::Series;
use crate::procs::{ChildGuard, pinned_command, to_file, wait_for_line, which};
use crate::report::Report;
use crate::scenario::{Condition, Scenario, TargetKind};
use crate::scrape::ScrapeConfig;

/// How to run a scenario.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Scenario name or path.
    pub scenario: String,
    /// Directory of scenarios.
    pub scenarios_dir: PathBuf,
    /// Short CI run.
    pub quick: bool,
    /// Output directory.
    pub out: PathBuf,
    /// The `tailguard` executable (`run` and `upstream` subcommands).
    pub exe: PathBuf,
    /// Nice value for every process of the run.
    pub nice: Option<i32>,
    /// Overrides the scenario's measured duration.
    pub duration: Option<Duration>,
}

/// One row of the comparison table.
#[derive(Debug, Clone)]
pub struct Row {
    /// Condition name.
    pub name: String,
    /// Requested rate.
    pub rate: f64,
    /// Merged report over the seeds, or why the condition was skipped.
    pub result: Result<Report, String>,
    /// wrk's closed-loop maximum, when measured.
    pub max_rate: Option<f64>,
    /// Health probes during the runs (overload scenarios only).
    pub health: Option<Health>,
}

/// `GET /healthz` probes sent to the target while the load ran: each on a new connection,
/// every [`HEALTH_EVERY`], answered when a `200` came within [`HEALTH_TIMEOUT`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Health {
    /// Probes sent.
    pub sent: u64,
    /// Probes answered `200` in time.
    pub ok: u64,
    /// Slowest answered probe, microseconds.
    pub max_us: u64,
}

impl Health {
    fn add(&mut self, other: Health) {
        self.sent += other.sent;
        self.ok += other.ok;
        self.max_us = self.max_us.max(other.max_us);
    }
}

/// How often the health prober asks (a Kubernetes readiness probe asks every few seconds;
/// this is denser, so a stall shows).
pub const HEALTH_EVERY: Duration = Duration::from_millis(100);
/// A probe not answered within this counts as failed (kubelet's default timeout is 1 s).
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);

/// Probes `GET /healthz` on `addr` every [`HEALTH_EVERY`] until `stop` is set.
fn probe_health(addr: std::net::SocketAddr, stop: &std::sync::atomic::AtomicBool) -> Health {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    let mut health = Health::default();
    while !stop.load(Ordering::Relaxed) {
        let started = std::time::Instant::now();
        health.sent += 1;
        let answered = std::net::TcpStream::connect_timeout(&addr, HEALTH_TIMEOUT)
            .and_then(|mut s| {
                s.set_read_timeout(Some(HEALTH_TIMEOUT))?;
                s.write_all(b"GET /healthz HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")?;
                let mut head = [0u8; 12];
                s.read_exact(&mut head)?;
                Ok(head.starts_with(b"HTTP/1.1 200"))
            })
            .unwrap_or(false);
        let took = started.elapsed();
        if answered && took <= HEALTH_TIMEOUT {
            health.ok += 1;
            health.max_us = health.max_us.max(took.as_micros() as u64);
        }
        std::thread::sleep(HEALTH_EVERY.saturating_sub(took));
    }
    health
}

/// What a scenario run produced.
#[derive(Debug)]
pub struct Outcome {
    /// Rows in condition order.
    pub rows: Vec<Row>,
    /// The printed table.
    pub table: String,
    /// What was pinned where.
    pub pinning: String,
}

fn free_addr() -> Result<SocketAddr, LabError> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

fn slug(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let mut out = String::new();
    for part in s.split('-').filter(|p| !p.is_empty()) {
        if !out.is_empty() {
            out.push('-');
        }
        out.push_str(part);
    }
    out
}

/// Runs one scenario end to end.
pub fn run(opts: &RunOptions) -> Result<Outcome, LabError> {
    crate::procs::install_signal_handler()?;
    let (mut scenario, path) = Scenario::load(&opts.scenario, &opts.scenarios_dir)?;
    if opts.quick {
        scenario.make_quick();
    }
    if let Some(d) = opts.duration {
        scenario.load.duration = d;
    }
    std::fs::create_dir_all(&opts.out)?;
    // Absolute, because nginx resolves paths against its own prefix.
    let opts = &RunOptions {
        out: opts.out.canonicalize()?,
        ..opts.clone()
    };
    println!(
        "scenario {}: {}",
        scenario.name,
        scenario.description.trim()
    );
    println!("  file {}, output {}", path.display(), opts.out.display());

    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pin = &scenario.pin;
    let wanted = pin
        .gateway
        .iter()
        .chain(&pin.upstream)
        .chain(&pin.load)
        .copied()
        .max();
    let can_pin = wanted.is_some_and(|m| m < cores) && which("taskset").is_some();
    let pinning = if can_pin {
        format!(
            "pinned: gateway/nginx to cpu {:?}, upstream to cpu {:?}, load generator to cpu {:?} (taskset / sched_setaffinity)",
            pin.gateway, pin.upstream, pin.load
        )
    } else if wanted.is_none() {
        "not pinned: the scenario names no cores".to_string()
    } else {
        format!(
            "not pinned: the scenario wants cpu {wanted:?} but this machine has {cores} (or no taskset)"
        )
    };
    let restore_autogroup = opts.nice.and_then(crate::procs::set_autogroup_nice);
    let pinning = match (opts.nice, restore_autogroup) {
        (Some(n), Some(_)) => {
            format!("{pinning}; every process at nice {n}, and this session's autogroup too")
        }
        (Some(n), None) => format!("{pinning}; every process at nice {n}"),
        (None, _) => pinning,
    };
    println!("  {pinning}");
    let pins = |cpus: &[usize]| if can_pin { cpus.to_vec() } else { Vec::new() };

    // The upstream, shared by every condition.
    let (mut cmd, _) = pinned_command(&opts.exe, &pins(&pin.upstream), opts.nice);
    cmd.arg("upstream")
        .arg("--listen")
        .arg("127.0.0.1:0")
        .args(&scenario.upstream.args)
        .stdout(Stdio::piped())
        .stderr(to_file(&opts.out.join("upstream.log"))?);
    let mut upstream = ChildGuard::spawn("upstream", &mut cmd)?;
    let upstream_addr = wait_for_line(&mut upstream, "listening on ", Duration::from_secs(20))?;
    println!(
        "  upstream: tailguard upstream {} on {upstream_addr}",
        scenario.upstream.args.join(" ")
    );

    let ctx = Ctx {
        opts,
        scenario: &scenario,
        upstream_addr: upstream_addr.clone(),
        gateway_cpus: pins(&pin.gateway),
        load_cpus: pins(&pin.load),
        gateway_flags: gateway_flags(&opts.exe),
    };

    let capacity = match &scenario.capacity {
        Some(cap) => {
            let probe = Condition {
                name: "capacity probe".into(),
                target: TargetKind::Gateway,
                gateway: cap.gateway.clone(),
                scrape_every: None,
                rate_factor: None,
                rate: Some(cap.probe_rate),
                max_rate: false,
            };
            let mut load = ctx.load_config("http://0/", cap.probe_rate, 1);
            load.duration = cap.duration;
            load.warmup = Duration::ZERO;
            load.connections = cap.connections.max(1);
            load.threads = 1;
            load.timeout = Duration::from_secs(30);
            match ctx.run_condition(&probe, Some(load)) {
                Ok((r, _)) => {
                    // Responses completed inside the window: what the target sustained.
                    let ok_share = r.ok_count() as f64 / r.completed.max(1) as f64;
                    let ok_rate = r.achieved_rate * ok_share;
                    println!(
                        "  capacity: {ok_rate:.0} req/s answered below 400 at an offered {} req/s",
                        cap.probe_rate
                    );
                    Some(ok_rate)
                }
                Err(why) => {
                    println!("  capacity probe skipped: {why}");
                    None
                }
            }
        }
        None => None,
    };

    // Each condition's rate (or why it has none), then its runs: condition by condition, or
    // seed by seed when the scenario interleaves them.
    let rates: Vec<Result<f64, String>> = scenario
        .conditions
        .iter()
        .map(|cond| match (cond.rate, cond.rate_factor, capacity) {
            (Some(r), _, _) => Ok(r),
            (None, Some(f), Some(cap)) => Ok((f * cap).max(1.0)),
            (None, Some(_), None) => Err("no capacity measured, so no rate".to_string()),
            (None, None, _) => Ok(scenario.load.rate),
        })
        .collect();
    let mut runs: Vec<Runs> = rates
        .iter()
        .map(|rate| Runs {
            merged: None,
            health: None,
            result: rate.clone().map(|_| ()),
            per_seed: Vec::new(),
        })
        .collect();
    let order: Vec<(usize, u64)> = if scenario.load.interleave {
        scenario
            .load
            .seeds
            .iter()
            .flat_map(|&seed| (0..scenario.conditions.len()).map(move |c| (c, seed)))
            .collect()
    } else {
        (0..scenario.conditions.len())
            .flat_map(|c| scenario.load.seeds.iter().map(move |&seed| (c, seed)))
            .collect()
    };
    for (c, seed) in order {
        let (cond, acc) = (&scenario.conditions[c], &mut runs[c]);
        let Ok(rate) = rates[c] else { continue };
        if acc.result.is_err() {
            continue;
        }
        println!(
            "  condition `{}` at {rate:.0} req/s, seed {seed} ...",
            cond.name
        );
        let load = ctx.load_config("http://0/", rate, seed);
        match ctx.run_condition(cond, Some(load)) {
            Ok((r, h)) => {
                if let Some(h) = h {
                    acc.health.get_or_insert_with(Health::default).add(h);
                }
                let file = opts
                    .out
                    .join(format!("{}-seed{seed}.json", slug(&cond.name)));
                std::fs::write(&file, r.to_json())?;
                acc.per_seed.push((seed, SeedLine::of(&r)));
                acc.merged = Some(match acc.merged.take() {
                    None => r,
                    Some(m) => merge(m, &r),
                });
            }
            Err(why) => acc.result = Err(why),
        }
    }

    let mut rows = Vec::new();
    let mut seed_lines = Vec::new();
    for ((cond, rate), acc) in scenario.conditions.iter().zip(&rates).zip(runs) {
        let rate = *rate.as_ref().unwrap_or(&0.0);
        let max_rate = if cond.max_rate && acc.result.is_ok() {
            ctx.max_rate(cond)
        } else {
            None
        };
        let result = match (acc.result, acc.merged) {
            (Ok(()), Some(m)) => {
                std::fs::write(
                    opts.out.join(format!("{}.hgrm", slug(&cond.name))),
                    crate::hgrm::render(&m.latency),
                )?;
                println!(
                    "    {}: P50 {}  P99 {}  P100 {}  achieved {:.0} req/s",
                    cond.name,
                    format_us(m.latency.percentile_us(50.0) as f64),
                    format_us(m.latency.percentile_us(99.0) as f64),
                    format_us(m.latency.max_us() as f64),
                    m.achieved_rate
                );
                Ok(m)
            }
            (Err(why), _) => {
                println!("    {}: skipped: {why}", cond.name);
                Err(why)
            }
            (Ok(()), None) => Err("no run".to_string()),
        };
        seed_lines.push((cond.name.clone(), acc.per_seed));
        rows.push(Row {
            name: cond.name.clone(),
            rate,
            result,
            max_rate,
            health: acc.health,
        });
    }
    drop(upstream);
    if let Some(old) = restore_autogroup {
        let _ = crate::procs::set_autogroup_nice(old);
    }

    let table = render_table(&scenario, &rows);
    println!("\n{table}");
    let series: Vec<Series> = rows
        .iter()
        .filter_map(|r| {
            r.result.as_ref().ok().map(|rep| Series {
                label: r.name.clone(),
                points: crate::hgrm::points(&rep.latency),
            })
        })
        .collect();
    if !series.is_empty() {
        let svg = crate::plot::render(&format!("tailguard lab {}", scenario.name), &series);
        std::fs::write(opts.out.join("plot.svg"), svg)?;
    }
    let mut summary = String::new();
    let _ = writeln!(summary, "# tailguard lab {}\n", scenario.name);
    let _ = writeln!(summary, "{}\n", scenario.description.trim());
    let _ = writeln!(
        summary,
        "- command: `tailguard lab {}{}{}{}`",
        scenario.name,
        if opts.quick { " --quick" } else { "" },
        opts.duration
            .map(|d| format!(" --duration {}s", d.as_secs_f64()))
            .unwrap_or_default(),
        opts.nice
            .map(|n| format!(" --nice {n}"))
            .unwrap_or_default()
    );
    let _ = writeln!(summary, "- machine: {}", machine());
    let _ = writeln!(summary, "- {pinning}");
    let _ = writeln!(
        summary,
        "- load: {} connections, {} thread(s), {} schedule, {:?} measured after {:?} warmup, seeds {:?}",
        scenario.load.connections,
        scenario.load.threads,
        if scenario.load.poisson {
            "poisson"
        } else {
            "constant-rate"
        },
        scenario.load.duration,
        scenario.load.warmup,
        scenario.load.seeds
    );
    let _ = writeln!(
        summary,
        "- upstream: `tailguard upstream {}`\n",
        scenario.upstream.args.join(" ")
    );
    let _ = writeln!(summary, "{table}");
    if scenario.load.seeds.len() > 1 {
        let _ = writeln!(summary, "\n{}", per_seed_table(&seed_lines));
    }
    std::fs::write(opts.out.join("summary.md"), summary)?;
    println!(
        "  wrote {}/summary.md, plot.svg, <condition>.hgrm and <condition>-seed<N>.json",
        opts.out.display()
    );
    Ok(Outcome {
        rows,
        table,
        pinning,
    })
}

/// One condition's runs so far.
#[derive(Debug)]
struct Runs {
    merged: Option<Report>,
    health: Option<Health>,
    /// `Err` once a run failed (or the condition has no rate): its other runs are skipped.
    result: Result<(), String>,
    per_seed: Vec<(u64, SeedLine)>,
}

/// One run's percentiles, in ms.
#[derive(Debug, Clone, Copy, PartialEq)]
struct SeedLine {
    p50: f64,
    p99: f64,
    p999: f64,
    p100: f64,
}

impl SeedLine {
    fn of(r: &Report) -> SeedLine {
        let ms = |p: f64| r.latency.percentile_us(p) as f64 / 1000.0;
        SeedLine {
            p50: ms(50.0),
            p99: ms(99.0),
            p999: ms(99.9),
            p100: r.latency.max_us() as f64 / 1000.0,
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Every condition's percentiles per seed, their median over seeds, and (from the second
/// condition on) the median over seeds of the ratio to the first condition's run with the
/// same seed: the paired comparison, which the spread between seeds does not blur.
fn per_seed_table(lines: &[(String, Vec<(u64, SeedLine)>)]) -> String {
    let mut out = String::from(
        "Per seed (P50 / P99 / P99.9 / P100, ms), the median over seeds, and the median of the per-seed ratios to the first condition (same seed):\n\n| condition | seed | P50 | P99 | P99.9 | P100 |\n|---|---|---|---|---|---|\n",
    );
    let base: std::collections::HashMap<u64, SeedLine> = lines
        .first()
        .map(|(_, l)| l.iter().copied().collect())
        .unwrap_or_default();
    // One table row: the four percentiles that `value` gives for each field of a line.
    let mut row = |name: &str, label: &str, value: &dyn Fn(fn(&SeedLine) -> f64) -> f64| {
        let _ = writeln!(
            out,
            "| {name} | {label} | {:.2} | {:.2} | {:.2} | {:.2} |",
            value(|l| l.p50),
            value(|l| l.p99),
            value(|l| l.p999),
            value(|l| l.p100)
        );
    };
    for (i, (name, seeds)) in lines.iter().enumerate() {
        for (seed, l) in seeds {
            row(name, &seed.to_string(), &|f| f(l));
        }
        if seeds.is_empty() {
            continue;
        }
        row(name, "**median**", &|f| {
            median(seeds.iter().map(|(_, l)| f(l)).collect())
        });
        if i > 0 {
            row(name, "**ratio to first**", &|f| {
                median(
                    seeds
                        .iter()
                        .filter_map(|(seed, l)| base.get(seed).map(|b| f(l) / f(b)))
                        .collect(),
                )
            });
        }
    }
    out
}

/// One line about this machine for benchmark summaries.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown cpu".into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!("{cpu}, {cores} cores, load average {}", load.join(" "))
}

fn merge(mut a: Report, b: &Report) -> Report {
    let runs = (a.duration_s + b.duration_s) / a.duration_s.max(1e-9);
    a.latency.add(&b.latency);
    a.latency_ok.add(&b.latency_ok);
    a.generator_lag.add(&b.generator_lag);
    a.latency_from_release.add(&b.latency_from_release);
    a.latency_during_scrape.add(&b.latency_during_scrape);
    for (k, v) in &b.status {
        *a.status.entry(*k).or_default() += v;
    }
    for (k, v) in &b.errors {
        *a.errors.entry(k.clone()).or_default() += v;
    }
    a.achieved_rate = (a.achieved_rate * a.duration_s + b.achieved_rate * b.duration_s)
        / (a.duration_s + b.duration_s);
    let _ = runs;
    a.duration_s += b.duration_s;
    a.sent += b.sent;
    a.completed += b.completed;
    a.bytes_read += b.bytes_read;
    a.queued += b.queued;
    a.max_queue = a.max_queue.max(b.max_queue);
    a.scrapes.extend(b.scrapes.iter().cloned());
    a
}

struct Ctx<'a> {
    opts: &'a RunOptions,
    scenario: &'a Scenario,
    upstream_addr: String,
    gateway_cpus: Vec<usize>,
    load_cpus: Vec<usize>,
    /// Flags `tailguard run --help` lists; `None` when help could not be read.
    gateway_flags: Option<Vec<String>>,
}

/// A started target: its URL, metrics URL, and the process guard (None for the upstream).
struct Target {
    url: String,
    metrics: Option<String>,
    _guard: Option<ChildGuard>,
}

impl Ctx<'_> {
    fn load_config(&self, url: &str, rate: f64, seed: u64) -> LoadConfig {
        let l = &self.scenario.load;
        LoadConfig {
            threads: l.threads,
            poisson: l.poisson,
            seed,
            timeout: l.timeout,
            warmup: l.warmup,
            pin: self.load_cpus.clone(),
            nice: self.opts.nice,
            ..LoadConfig::new(url, rate, l.duration, l.connections)
        }
    }

    /// Runs one condition; in an overload scenario (one with `[capacity]`), a thread probes
    /// the target's `/healthz` meanwhile (the "health probes 100 % answered").
    fn run_condition(
        &self,
        cond: &Condition,
        load: Option<LoadConfig>,
    ) -> Result<(Report, Option<Health>), String> {
        let target = self.start_target(cond)?;
        let mut load =
            load.unwrap_or_else(|| self.load_config("http://0/", self.scenario.load.rate, 1));
        load.url = format!("{}{}", target.url, self.scenario.load.path);
        if let (Some(every), Some(metrics)) = (cond.scrape_every, &target.metrics) {
            load.scrape = Some(ScrapeConfig {
                url: metrics.clone(),
                every,
            });
        }
        let probe_addr = (self.scenario.capacity.is_some() && cond.target != TargetKind::Upstream)
            .then(|| {
                target
                    .url
                    .strip_prefix("http://")?
                    .parse::<std::net::SocketAddr>()
                    .ok()
            })
            .flatten();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let (report, health) = std::thread::scope(|scope| {
            let stop = &stop;
            let prober = probe_addr.map(|addr| scope.spawn(move || probe_health(addr, stop)));
            let report = crate::load::run(&load);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            (report, prober.and_then(|p| p.join().ok()))
        });
        let report = report.map_err(|e| format!("load failed: {e}"))?;
        drop(target);
        Ok((report, health))
    }

    fn start_target(&self, cond: &Condition) -> Result<Target, String> {
        match cond.target {
            TargetKind::Upstream => Ok(Target {
                url: format!("http://{}", self.upstream_addr),
                metrics: None,
                _guard: None,
            }),
            TargetKind::Gateway => self.start_gateway(cond),
            TargetKind::Nginx => self.start_nginx(cond),
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
            "--upstream".to_string(),
            format!("demo={}", self.upstream_addr),
        ];
        let wants_metrics = cond.scrape_every.is_some();
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
            metrics: Some(format!("http://{metrics}/metrics")),
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
            metrics: None,
            _guard: Some(guard),
        })
    }

    /// wrk's closed-loop maximum through the condition's target, when wrk is installed.
    fn max_rate(&self, cond: &Condition) -> Option<f64> {
        let wrk = which("wrk")?;
        let target = self.start_target(cond).ok()?;
        let secs = self.scenario.load.duration.as_secs().clamp(1, 30);
        let (mut cmd, _) = pinned_command(&wrk, &self.load_cpus, self.opts.nice);
        let out = cmd
            .arg("-t1")
            .arg(format!("-c{}", self.scenario.load.connections))
            .arg(format!("-d{secs}s"))
            .arg(format!("{}{}", target.url, self.scenario.load.path))
            .stdin(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let rate = text
            .lines()
            .find_map(|l| l.strip_prefix("Requests/sec:"))
            .and_then(|v| v.trim().parse().ok());
        if let Some(r) = rate {
            println!("    wrk max rate: {r:.0} req/s");
        }
        rate
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

fn render_table(scenario: &Scenario, rows: &[Row]) -> String {
    let shed = scenario.capacity.is_some();
    let mut o = String::new();
    let _ = writeln!(
        o,
        "tailguard lab {}: latency from the intended send time (constant rate, HdrHistogram)",
        scenario.name
    );
    let _ = writeln!(
        o,
        "| condition | rate | achieved | P50 | P99 | P99.9 | P99.99 | P100 | non-2xx | errors | {} |",
        if shed {
            "goodput / admitted P99"
        } else {
            "notes"
        }
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        match &row.result {
            Err(why) => {
                let _ = writeln!(
                    o,
                    "| {} | {:.0} | - | - | - | - | - | - | - | - | skipped: {} |",
                    row.name, row.rate, why
                );
            }
            Ok(r) => {
                let p = |q: f64| format_ms(r.latency.percentile_us(q));
                let non2xx: u64 = r
                    .status
                    .iter()
                    .filter(|(c, _)| !(200..300).contains(*c))
                    .map(|(_, n)| n)
                    .sum();
                let mut notes = Vec::new();
                if shed {
                    notes.push(format!(
                        "{:.0} req/s ok, admitted P99 {}",
                        r.ok_count() as f64 / r.duration_s,
                        format_ms(r.latency_ok.percentile_us(99.0))
                    ));
                }
                if !r.scrapes.is_empty() {
                    let mut d = Latency::new();
                    for s in &r.scrapes {
                        d.record_us((s.duration_ms * 1000.0) as u64);
                    }
                    let bytes = r.scrapes.iter().map(|s| s.bytes).max().unwrap_or(0);
                    notes.push(format!(
                        "{} scrapes, longest {}, {} B; overlapping requests P99 {} P100 {}",
                        r.scrapes.len(),
                        format_ms(d.max_us()),
                        bytes,
                        format_ms(r.latency_during_scrape.percentile_us(99.0)),
                        format_ms(r.latency_during_scrape.max_us())
                    ));
                }
                if let Some(m) = row.max_rate {
                    notes.push(format!("wrk max {m:.0} req/s"));
                }
                if let Some(h) = row.health {
                    notes.push(format!(
                        "health {}/{} answered, slowest {}",
                        h.ok,
                        h.sent,
                        format_ms(h.max_us)
                    ));
                }
                if r.queued > 0 {
                    notes.push(format!("{} waited for a connection", r.queued));
                }
                let _ = writeln!(
                    o,
                    "| {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    row.name,
                    row.rate,
                    r.achieved_rate,
                    p(50.0),
                    p(99.0),
                    p(99.9),
                    p(99.99),
                    p(100.0),
                    non2xx,
                    r.error_count(),
                    notes.join("; ")
                );
            }
        }
    }
    o
}

fn format_ms(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::probe_health;

    /// A listener on 127.0.0.1:0 that answers each connection with `status` (or never).
    fn server(status: Option<&'static str>) -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for mut conn in listener.incoming().flatten() {
                let mut buf = [0u8; 512];
                let _ = conn.read(&mut buf);
                match status {
                    Some(s) => {
                        let _ = write!(conn, "HTTP/1.1 {s}\r\ncontent-length: 0\r\n\r\n");
                    }
                    None => held.push(conn), // accepted, never answered
                }
            }
        });
        addr
    }

    fn probe_for(addr: std::net::SocketAddr, run: Duration) -> super::Health {
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let prober = s.spawn(|| probe_health(addr, &stop));
            std::thread::sleep(run);
            stop.store(true, Ordering::Relaxed);
            prober.join().unwrap()
        })
    }

    #[test]
    fn health_probes_count_answered_200s_only() {
        let ok = probe_for(server(Some("200 OK")), Duration::from_millis(350));
        assert!(ok.sent >= 3, "{ok:?}");
        assert_eq!(ok.ok, ok.sent);
        let refused = probe_for(
            server(Some("503 Service Unavailable")),
            Duration::from_millis(250),
        );
        assert!(refused.sent >= 2 && refused.ok == 0, "{refused:?}");
    }

    #[test]
    fn a_health_probe_that_gets_no_answer_fails_after_the_timeout() {
        let silent = probe_for(server(None), Duration::from_millis(50));
        assert_eq!((silent.sent, silent.ok), (1, 0));
    }

    #[test]
    fn per_seed_table_pairs_each_seed_with_the_first_conditions_same_seed() {
        let line = |p99: f64| super::SeedLine {
            p50: 0.1,
            p99,
            p999: 2.0 * p99,
            p100: 4.0 * p99,
        };
        // Seeds differ by 2x between them; the second condition is 10 % slower on each.
        let lines = vec![
            (
                "base".to_string(),
                vec![(1, line(1.0)), (2, line(2.0)), (3, line(1.5))],
            ),
            (
                "scraped".to_string(),
                vec![(2, line(2.2)), (1, line(1.1)), (3, line(1.65))],
            ),
        ];
        let table = super::per_seed_table(&lines);
        assert!(
            table.contains("| base | **median** | 0.10 | 1.50 | 3.00 | 6.00 |"),
            "{table}"
        );
        assert!(
            table.contains("| scraped | **median** | 0.10 | 1.65 | 3.30 | 6.60 |"),
            "{table}"
        );
        assert!(
            table.contains("| scraped | **ratio to first** | 1.00 | 1.10 | 1.10 | 1.10 |"),
            "{table}"
        );
        assert!(!table.contains("| base | **ratio"), "{table}");
        assert_eq!(super::median(vec![3.0, 1.0, 2.0, 10.0]), 2.5);
    }
}

//! The scenario runner: starts the upstream and the gateway (or nginx) as separate, pinned
//! processes, runs each condition's load, and prints one comparison table with P100 plus an
//! overlaid SVG plot; every child it started is stopped on the way out, whatever the way out.

use std::collections::BTreeMap;
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
use crate::scenario::{Condition, PhaseSpec, Scenario, TargetKind};
use crate::schedule::Phase;
use crate::scrape::{ScrapeConfig, WatchConfig};
use crate::timeline::Timeline;

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
    /// Requested rate (the mean over the window of a stepped load, summed over streams).
    pub rate: f64,
    /// The requested rate as the table shows it: `270`, `135 / 2700 / 135 (10+20+15 s)`,
    /// `a 2700 + b 195`.
    pub schedule: String,
    /// Merged report over the seeds (and streams), or why the condition was skipped.
    pub result: Result<Report, String>,
    /// wrk's closed-loop maximum, when measured.
    pub max_rate: Option<f64>,
    /// Health probes during the runs (overload scenarios only).
    pub health: Option<Health>,
    /// Each stream's report merged over the seeds (scenarios with `[[load.streams]]`).
    pub streams: Vec<(String, Report)>,
    /// The first seed's timeline.
    pub timeline: Option<Timelines>,
}

/// One run's timelines: the total, each stream's, and the files they were written to.
#[derive(Debug, Clone)]
pub struct Timelines {
    /// Every stream added up, with the gateway's gauges.
    pub total: Timeline,
    /// Each stream's own (empty names for a scenario without streams).
    pub streams: Vec<(String, Timeline)>,
    /// File stem: `<stem>.timeline.csv`, `.json` and `.svg`.
    pub files: String,
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
        // A stepped load keeps its shape and lasts the given duration.
        scenario.fit_phases(d, false);
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
    let pin_b: &[usize] = pin.upstream_b.as_deref().unwrap_or(&pin.upstream);
    let wanted = pin
        .gateway
        .iter()
        .chain(&pin.upstream)
        .chain(if scenario.upstream_b.is_some() {
            pin_b
        } else {
            &[]
        })
        .chain(&pin.load)
        .copied()
        .max();
    let can_pin = wanted.is_some_and(|m| m < cores) && which("taskset").is_some();
    let pinning = if can_pin {
        format!(
            "pinned: gateway/nginx to cpu {:?}, upstream{} to cpu {:?}{}, load generator to cpu {:?} (taskset / sched_setaffinity)",
            pin.gateway,
            if scenario.upstream_b.is_some() {
                " a"
            } else {
                ""
            },
            pin.upstream,
            if scenario.upstream_b.is_some() {
                format!(", upstream b to cpu {pin_b:?}")
            } else {
                String::new()
            },
            pin.load
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

    // The upstreams, shared by every condition.
    let (upstream, upstream_addr) = start_upstream(
        opts,
        "upstream",
        &scenario.upstream.args,
        &pins(&pin.upstream),
    )?;
    let upstream_b = match &scenario.upstream_b {
        Some(b) => Some(start_upstream(opts, "upstream_b", &b.args, &pins(pin_b))?),
        None => None,
    };
    let gateway_config = match &upstream_b {
        Some((_, b)) => {
            let path = opts.out.join("gateway.toml");
            std::fs::write(&path, two_upstreams_config(&upstream_addr, b))?;
            println!(
                "  gateway config {}: /a to upstream a, /b to upstream b",
                path.display()
            );
            Some(path)
        }
        None => None,
    };

    let ctx = Ctx {
        opts,
        scenario: &scenario,
        upstream_addr: upstream_addr.clone(),
        upstream_b_addr: upstream_b.as_ref().map(|(_, a)| a.clone()),
        gateway_config,
        gateway_cpus: pins(&pin.gateway),
        load_cpus: pins(&pin.load),
        gateway_flags: gateway_flags(&opts.exe),
    };

    // Each stream's capacity (one stream, named "", without [[load.streams]]).
    let mut capacities: BTreeMap<String, f64> = BTreeMap::new();
    if let Some(cap) = &scenario.capacity {
        let probes: Vec<(String, String, f64)> = if scenario.load.streams.is_empty() {
            vec![(String::new(), scenario.load.path.clone(), cap.probe_rate)]
        } else {
            scenario
                .load
                .streams
                .iter()
                .map(|st| {
                    (
                        st.name.clone(),
                        st.path.clone(),
                        st.probe_rate.unwrap_or(cap.probe_rate),
                    )
                })
                .collect()
        };
        for (name, path, probe_rate) in probes {
            let probe = Condition {
                name: "capacity probe".into(),
                target: TargetKind::Gateway,
                gateway: cap.gateway.clone(),
                scrape_every: None,
                rate_factor: None,
                rate: Some(probe_rate),
                max_rate: false,
                phases: Vec::new(),
                streams: BTreeMap::new(),
            };
            let mut load = ctx.load_config("http://0/", probe_rate, 1);
            load.duration = cap.duration;
            load.warmup = Duration::ZERO;
            load.connections = cap.connections.max(1);
            load.threads = 1;
            load.timeout = Duration::from_secs(30);
            let of = if name.is_empty() {
                String::new()
            } else {
                format!(" of stream {name} ({path})")
            };
            match ctx.run_condition(&probe, vec![StreamLoad { path, config: load }]) {
                Ok((r, _)) => {
                    let r = &r[0];
                    // Responses completed inside the window: what the target sustained.
                    let ok_share = r.ok_count() as f64 / r.completed.max(1) as f64;
                    let ok_rate = r.achieved_rate * ok_share;
                    println!(
                        "  capacity{of}: {ok_rate:.0} req/s answered below 400 at an offered {probe_rate} req/s"
                    );
                    capacities.insert(name, ok_rate);
                }
                Err(why) => println!("  capacity probe{of} skipped: {why}"),
            }
        }
    }

    // Each condition's streams and rates (or why it has none), then its runs: condition by
    // condition, or seed by seed when the scenario interleaves them.
    let plans: Vec<Result<Plan, String>> = scenario
        .conditions
        .iter()
        .map(|cond| plan(&scenario, cond, &capacities))
        .collect();
    let mut runs: Vec<Runs> = plans
        .iter()
        .map(|plan| Runs {
            merged: None,
            streams: Vec::new(),
            timeline: None,
            health: None,
            result: plan.as_ref().map(|_| ()).map_err(Clone::clone),
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
        let Ok(plan) = &plans[c] else { continue };
        if acc.result.is_err() {
            continue;
        }
        println!(
            "  condition `{}` at {} req/s, seed {seed} ...",
            cond.name,
            plan.describe()
        );
        let loads = plan
            .streams
            .iter()
            .map(|st| ctx.stream_load(st, plan.duration, seed))
            .collect();
        match ctx.run_condition(cond, loads) {
            Ok((reports, h)) => {
                if let Some(h) = h {
                    acc.health.get_or_insert_with(Health::default).add(h);
                }
                let stem = format!("{}-seed{seed}", slug(&cond.name));
                let r = combine(&reports);
                std::fs::write(opts.out.join(format!("{stem}.json")), r.to_json())?;
                let named: Vec<(String, &Timeline)> = plan
                    .streams
                    .iter()
                    .zip(&reports)
                    .map(|(st, r)| (st.name.clone(), &r.timeline))
                    .collect();
                if reports.len() > 1 {
                    for (st, part) in plan.streams.iter().zip(&reports) {
                        std::fs::write(
                            opts.out.join(format!("{stem}-{}.json", slug(&st.name))),
                            part.to_json(),
                        )?;
                    }
                }
                write_timeline(
                    &opts.out.join(&stem),
                    &format!("{}: {}", scenario.name, cond.name),
                    &r.timeline,
                    &named,
                )?;
                for line in step_lines(&r.timeline, &named) {
                    println!("    {line}");
                }
                if acc.timeline.is_none() {
                    acc.timeline = Some(Timelines {
                        total: r.timeline.clone(),
                        streams: named
                            .iter()
                            .map(|(n, t)| (n.clone(), (*t).clone()))
                            .collect(),
                        files: stem.clone(),
                    });
                }
                acc.per_seed.push((seed, SeedLine::of(&r)));
                for (st, part) in plan.streams.iter().zip(reports) {
                    match acc.streams.iter_mut().find(|(n, _)| *n == st.name) {
                        Some((_, m)) => *m = merge(m.clone(), &part),
                        None => acc.streams.push((st.name.clone(), part)),
                    }
                }
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
    for ((cond, plan), acc) in scenario.conditions.iter().zip(&plans).zip(runs) {
        let (rate, schedule) = match plan {
            Ok(p) => (p.mean_rate(), p.describe()),
            Err(_) => (0.0, "-".to_string()),
        };
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
            schedule,
            result,
            max_rate,
            health: acc.health,
            streams: acc.streams,
            timeline: acc.timeline,
        });
    }
    drop(upstream_b);
    drop(upstream);
    if let Some(old) = restore_autogroup {
        let _ = crate::procs::set_autogroup_nice(old);
    }

    let table = render_table(&scenario, &rows);
    println!("\n{table}");
    if rows.iter().any(|r| r.streams.len() > 1) {
        println!("{}", stream_table(&rows));
        for line in stream_notes(&rows) {
            println!("- {line}");
        }
    }
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
    if rows.iter().any(|r| r.streams.len() > 1) {
        let _ = writeln!(summary, "\n{}", stream_table(&rows));
        for line in stream_notes(&rows) {
            let _ = writeln!(summary, "- {line}");
        }
    }
    let _ = writeln!(summary, "\n{}", timeline_section(&rows));
    if scenario.load.seeds.len() > 1 {
        let _ = writeln!(summary, "\n{}", per_seed_table(&seed_lines));
    }
    std::fs::write(opts.out.join("summary.md"), summary)?;
    println!(
        "  wrote {}/summary.md, plot.svg, <condition>.hgrm, <condition>-seed<N>.json and <condition>-seed<N>.timeline.{{csv,json,svg}}",
        opts.out.display()
    );
    Ok(Outcome {
        rows,
        table,
        pinning,
    })
}

/// Starts one built-in upstream (`tailguard upstream --listen 127.0.0.1:0 ARGS`) and waits for
/// its address.
fn start_upstream(
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

/// One stream of a condition, resolved: its path, connections and rate over time.
#[derive(Debug, Clone)]
struct StreamPlan {
    /// Empty for a scenario without `[[load.streams]]`.
    name: String,
    path: String,
    connections: usize,
    /// The rate, or the first phase's.
    rate: f64,
    /// Empty: `rate` throughout.
    phases: Vec<Phase>,
}

/// A condition's streams and measured window.
#[derive(Debug, Clone)]
struct Plan {
    streams: Vec<StreamPlan>,
    duration: Duration,
}

impl StreamPlan {
    fn mean_rate(&self, window: Duration) -> f64 {
        if self.phases.is_empty() {
            return self.rate;
        }
        let t = Timeline::new(&self.phases, self.rate, window.as_secs_f64());
        t.phases
            .iter()
            .map(|p| p.rate * (p.end_s - p.start_s).max(0.0))
            .sum::<f64>()
            / window.as_secs_f64().max(1e-9)
    }

    fn describe(&self) -> String {
        if self.phases.is_empty() {
            return format!("{:.0}", self.rate);
        }
        let rates: Vec<String> = self
            .phases
            .iter()
            .map(|p| format!("{:.0}", p.rate))
            .collect();
        let secs: Vec<String> = self
            .phases
            .iter()
            .map(|p| {
                let s = p.duration.as_secs_f64();
                if s.fract() == 0.0 {
                    format!("{s:.0}")
                } else {
                    format!("{s:.1}")
                }
            })
            .collect();
        format!("{} ({} s)", rates.join(" / "), secs.join("+"))
    }
}

impl Plan {
    fn mean_rate(&self) -> f64 {
        self.streams
            .iter()
            .map(|s| s.mean_rate(self.duration))
            .sum()
    }

    fn describe(&self) -> String {
        match &self.streams[..] {
            [one] if one.name.is_empty() => one.describe(),
            streams => {
                let parts: Vec<String> = streams
                    .iter()
                    .map(|s| format!("{} {}", s.name, s.describe()))
                    .collect();
                parts.join(" + ")
            }
        }
    }
}

/// The rate (or phases) of one stream from a rate, a factor of `capacity`, or phases.
fn resolve_rate(
    rate: Option<f64>,
    factor: Option<f64>,
    phases: &[PhaseSpec],
    capacity: Option<f64>,
    default: f64,
) -> Result<(f64, Vec<Phase>), String> {
    let one = |rate: Option<f64>, factor: Option<f64>| match (rate, factor, capacity) {
        (Some(r), _, _) => Ok(r),
        (None, Some(0.0), _) => Ok(0.0),
        (None, Some(f), Some(cap)) => Ok((f * cap).max(1.0)),
        (None, Some(_), None) => Err("no capacity measured, so no rate".to_string()),
        (None, None, _) => Ok(default),
    };
    if phases.is_empty() {
        return Ok((one(rate, factor)?, Vec::new()));
    }
    let phases = phases
        .iter()
        .map(|p| {
            Ok(Phase {
                rate: one(p.rate, p.rate_factor)?,
                duration: p.duration,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok((phases[0].rate, phases))
}

/// A condition's streams (streams at rate 0 are left out) and window.
fn plan(
    scenario: &Scenario,
    cond: &Condition,
    capacities: &BTreeMap<String, f64>,
) -> Result<Plan, String> {
    let l = &scenario.load;
    let mut streams = Vec::new();
    if l.streams.is_empty() {
        let (rate, phases) = resolve_rate(
            cond.rate,
            cond.rate_factor,
            &cond.phases,
            capacities.get("").copied(),
            l.rate,
        )?;
        streams.push(StreamPlan {
            name: String::new(),
            path: l.path.clone(),
            connections: l.connections,
            rate,
            phases,
        });
    } else {
        for st in &l.streams {
            let r = scenario.stream_rate(cond, st);
            let (rate, phases) = resolve_rate(
                r.rate,
                r.rate_factor,
                &r.phases,
                capacities.get(&st.name).copied(),
                0.0,
            )?;
            if rate == 0.0 && phases.iter().all(|p| p.rate == 0.0) {
                continue;
            }
            streams.push(StreamPlan {
                name: st.name.clone(),
                path: st.path.clone(),
                connections: st.connections.unwrap_or(l.connections),
                rate,
                phases,
            });
        }
    }
    let stepped = streams
        .iter()
        .map(|s| s.phases.iter().map(|p| p.duration).sum::<Duration>())
        .max()
        .unwrap_or_default();
    Ok(Plan {
        duration: if stepped.is_zero() {
            l.duration
        } else {
            stepped
        },
        streams,
    })
}

/// A stream's load and the path it goes to on the condition's target.
struct StreamLoad {
    path: String,
    config: LoadConfig,
}

/// Several streams' reports of one run as one: counts and distributions added, rates summed.
fn combine(parts: &[Report]) -> Report {
    let mut total = parts[0].clone();
    for p in &parts[1..] {
        total.latency.add(&p.latency);
        total.latency_ok.add(&p.latency_ok);
        total.generator_lag.add(&p.generator_lag);
        total.latency_from_release.add(&p.latency_from_release);
        total.latency_during_scrape.add(&p.latency_during_scrape);
        for (k, v) in &p.status {
            *total.status.entry(*k).or_default() += v;
        }
        for (k, v) in &p.errors {
            *total.errors.entry(k.clone()).or_default() += v;
        }
        total.requested_rate += p.requested_rate;
        total.achieved_rate += p.achieved_rate;
        total.connections += p.connections;
        total.threads += p.threads;
        total.sent += p.sent;
        total.completed += p.completed;
        total.bytes_read += p.bytes_read;
        total.queued += p.queued;
        total.max_queue = total.max_queue.max(p.max_queue);
        total.scrapes.extend(p.scrapes.iter().cloned());
        total.timeline.add_stream(&p.timeline);
    }
    total
}

/// Writes `<stem>.timeline.csv`, `.json` and `.svg`.
fn write_timeline(
    stem: &Path,
    title: &str,
    total: &Timeline,
    streams: &[(String, &Timeline)],
) -> Result<(), LabError> {
    let per_stream: Vec<(String, &Timeline)> = if streams.len() > 1 {
        streams.to_vec()
    } else {
        Vec::new()
    };
    let with = |ext: &str| {
        let mut p = stem.as_os_str().to_owned();
        p.push(ext);
        PathBuf::from(p)
    };
    std::fs::write(
        with(".timeline.csv"),
        crate::timeline::csv(total, &per_stream),
    )?;
    std::fs::write(
        with(".timeline.json"),
        crate::timeline::json(total, &per_stream).to_string(),
    )?;
    std::fs::write(
        with(".timeline.svg"),
        crate::timeline::plot(title, total, &per_stream),
    )?;
    Ok(())
}

/// The step lines of a run: of the total with one stream, else of each stepped stream.
fn step_lines(total: &Timeline, streams: &[(String, &Timeline)]) -> Vec<String> {
    if streams.len() <= 1 {
        return crate::timeline::step_lines(total);
    }
    streams
        .iter()
        .flat_map(|(name, t)| {
            crate::timeline::step_lines(t)
                .into_iter()
                .map(move |l| format!("stream {name}: {l}"))
        })
        .collect()
}

/// One condition's runs so far.
#[derive(Debug)]
struct Runs {
    merged: Option<Report>,
    streams: Vec<(String, Report)>,
    timeline: Option<Timelines>,
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
    /// The second upstream, when the scenario has one.
    upstream_b_addr: Option<String>,
    /// The generated config with both upstreams, when the scenario has two.
    gateway_config: Option<PathBuf>,
    gateway_cpus: Vec<usize>,
    load_cpus: Vec<usize>,
    /// Flags `tailguard run --help` lists; `None` when help could not be read.
    gateway_flags: Option<Vec<String>>,
}

/// A started target: its URL, metrics URL, and the process guard (None for the upstream).
struct Target {
    url: String,
    /// Where paths under `/b` go when that is not `url` (the second upstream, direct).
    url_b: Option<String>,
    metrics: Option<String>,
    _guard: Option<ChildGuard>,
}

impl Target {
    /// The URL of `path` on this target.
    fn url_for(&self, path: &str) -> String {
        let to_b = path == "/b" || path.starts_with("/b/") || path.starts_with("/b?");
        match (&self.url_b, to_b) {
            (Some(b), true) => format!("{b}{path}"),
            _ => format!("{}{path}", self.url),
        }
    }
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

    /// A stream's load for one run of a condition.
    fn stream_load(&self, st: &StreamPlan, duration: Duration, seed: u64) -> StreamLoad {
        let mut config = self.load_config("http://0/", st.rate.max(f64::MIN_POSITIVE), seed);
        config.connections = st.connections;
        config.duration = duration;
        config.phases = st.phases.clone();
        StreamLoad {
            path: st.path.clone(),
            config,
        }
    }

    /// Runs one condition's streams on one clock; in an overload scenario (one with
    /// `[capacity]`), a thread probes the target's `/healthz` meanwhile (the issue's "health
    /// probes 100 % answered"). With `[timeline]`, the first stream reads the gateway's
    /// metrics every second.
    fn run_condition(
        &self,
        cond: &Condition,
        loads: Vec<StreamLoad>,
    ) -> Result<(Vec<Report>, Option<Health>), String> {
        let target = self.start_target(cond)?;
        let mut configs = Vec::new();
        for (i, StreamLoad { path, mut config }) in loads.into_iter().enumerate() {
            config.url = target.url_for(&path);
            if i == 0
                && let Some(metrics) = &target.metrics
            {
                if let Some(every) = cond.scrape_every {
                    config.scrape = Some(ScrapeConfig {
                        url: metrics.clone(),
                        every,
                    });
                }
                if let Some(t) = &self.scenario.timeline {
                    config.watch = Some(WatchConfig {
                        url: metrics.clone(),
                        every: t.every,
                        metrics: t.metrics.clone(),
                    });
                }
            }
            configs.push(config);
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
        let (reports, health) = std::thread::scope(|scope| {
            let stop = &stop;
            let prober = probe_addr.map(|addr| scope.spawn(move || probe_health(addr, stop)));
            let reports = crate::load::run_streams(&configs);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            (reports, prober.and_then(|p| p.join().ok()))
        });
        let reports = reports.map_err(|e| format!("load failed: {e}"))?;
        drop(target);
        Ok((reports, health))
    }

    fn start_target(&self, cond: &Condition) -> Result<Target, String> {
        match cond.target {
            TargetKind::Upstream => Ok(Target {
                url: format!("http://{}", self.upstream_addr),
                url_b: self.upstream_b_addr.as_ref().map(|b| format!("http://{b}")),
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
        ];
        match &self.gateway_config {
            Some(config) => {
                args.push("--config".into());
                args.push(config.display().to_string());
            }
            None => {
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
                    "| {} | {} | - | - | - | - | - | - | - | - | skipped: {} |",
                    row.name, row.schedule, why
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
                if let Some(t) = &row.timeline {
                    notes.extend(limit_notes(&t.total));
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
                    "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    row.name,
                    row.schedule,
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

/// `limit a 12 (8-16)`: the median of each upstream's limit over the run's seconds, with its
/// range; nothing when the gateway does not export the limit.
fn limit_notes(t: &Timeline) -> Vec<String> {
    t.gauge_columns("upstream_limit")
        .into_iter()
        .filter_map(|col| {
            let mut v: Vec<f64> = t.gauges[col].iter().flatten().copied().collect();
            if v.is_empty() {
                return None;
            }
            v.sort_by(f64::total_cmp);
            let label = col
                .split_once('[')
                .map_or("", |(_, l)| l.trim_end_matches(']'));
            Some(format!(
                "limit {label} {:.0} ({:.0}-{:.0})",
                median(v.clone()),
                v[0],
                v[v.len() - 1]
            ))
        })
        .collect()
}

/// Each stream of each condition: goodput, 503s, errors and the admitted percentiles.
fn stream_table(rows: &[Row]) -> String {
    let mut o = String::from(
        "Per stream (goodput: responses below 400 per second of the window; admitted: their latency from the intended send time):\n\n| condition | stream | rate | goodput | 503 | errors | admitted P50 | P99 | P100 |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        for (name, r) in &row.streams {
            let _ = writeln!(
                o,
                "| {} | {} | {:.0} | {:.0} | {} | {} | {} | {} | {} |",
                row.name,
                name,
                r.requested_rate,
                r.ok_count() as f64 / r.duration_s.max(1e-9),
                r.status.get(&503).copied().unwrap_or(0),
                r.error_count()
                    + r.status
                        .iter()
                        .filter(|(c, _)| **c >= 400 && **c != 503)
                        .map(|(_, n)| n)
                        .sum::<u64>(),
                format_ms(r.latency_ok.percentile_us(50.0)),
                format_ms(r.latency_ok.percentile_us(99.0)),
                format_ms(r.latency_ok.max_us())
            );
        }
    }
    o
}

/// For each stream, its admitted P99 and 503s in every condition that sends it at the rate it
/// had where it ran alone (the first such condition), against that baseline: issue 14's
/// "B's P99 within 10 % of B alone, and no rejection of B".
fn stream_notes(rows: &[Row]) -> Vec<String> {
    let mut notes = Vec::new();
    let names: Vec<String> = {
        let mut n: Vec<String> = rows
            .iter()
            .flat_map(|r| r.streams.iter().map(|(n, _)| n.clone()))
            .collect();
        n.sort();
        n.dedup();
        n
    };
    for name in names {
        let Some((base_row, base)) = rows.iter().find_map(|row| {
            (row.streams.len() == 1)
                .then(|| ran(row, &name).map(|r| (row, r)))
                .flatten()
        }) else {
            continue;
        };
        let base_p99 = base.latency_ok.percentile_us(99.0) as f64;
        for row in rows {
            if std::ptr::eq(row, base_row) || row.streams.len() < 2 {
                continue;
            }
            let Some(r) = ran(row, &name) else { continue };
            if (r.requested_rate - base.requested_rate).abs() > base.requested_rate * 0.01 {
                continue;
            }
            let p99 = r.latency_ok.percentile_us(99.0) as f64;
            let change = (p99 / base_p99.max(1.0) - 1.0) * 100.0;
            let rejected = r.status.get(&503).copied().unwrap_or(0);
            notes.push(format!(
                "stream {name} in `{}`: admitted P99 {} vs {} alone (`{}`), {change:+.1} % ({}); {} 503s{}",
                row.name,
                format_ms(p99 as u64),
                format_ms(base_p99 as u64),
                base_row.name,
                if change.abs() <= 10.0 {
                    "within 10 %"
                } else {
                    "NOT within 10 %"
                },
                rejected,
                if rejected == 0 {
                    ", none rejected"
                } else {
                    ""
                }
            ));
        }
    }
    notes
}

/// The report of stream `name` in `row`, if it was sent there.
fn ran<'r>(row: &'r Row, name: &str) -> Option<&'r Report> {
    row.streams.iter().find(|(n, _)| n == name).map(|(_, r)| r)
}

/// The timelines: where each condition's files are, and for every stepped condition its
/// step timings, its phases and its seconds.
fn timeline_section(rows: &[Row]) -> String {
    let mut o = String::from(
        "Timelines (first seed; per second: offered and admitted latency by intended send time, goodput, 503s and errors by when they happened, gauges read from the gateway each second):\n\n",
    );
    for row in rows {
        if let Some(t) = &row.timeline {
            let _ = writeln!(
                o,
                "- {}: `{f}.timeline.csv`, `{f}.timeline.json`, `{f}.timeline.svg`",
                row.name,
                f = t.files
            );
        }
    }
    for row in rows {
        let Some(t) = &row.timeline else { continue };
        if t.total.phases.len() < 2 && t.streams.iter().all(|(_, s)| s.phases.len() < 2) {
            continue;
        }
        let named: Vec<(String, &Timeline)> =
            t.streams.iter().map(|(n, s)| (n.clone(), s)).collect();
        let _ = writeln!(o, "\n### {}\n", row.name);
        for line in step_lines(&t.total, &named) {
            let _ = writeln!(o, "- {line}");
        }
        if t.streams.len() > 1 {
            for (name, st) in t.streams.iter().filter(|(_, st)| st.phases.len() > 1) {
                let _ = writeln!(
                    o,
                    "\nStream {name}:\n\n{}",
                    crate::timeline::phase_table(st)
                );
            }
        } else {
            let _ = writeln!(o, "\n{}", crate::timeline::phase_table(&t.total));
        }
        let _ = writeln!(o, "{}", crate::timeline::second_table(&t.total));
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

    const STREAMS: &str = r#"
name = "t"
description = "d"
[load]
rate = 100
duration = "3s"
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
args = []
[[condition]]
name = "b alone"
streams = { b = { rate_factor = 0.5 } }
[[condition]]
name = "a steps, b default"
streams = { a = { phases = [{ rate_factor = 1.0, duration = "2s" }, { rate_factor = 10.0, duration = "4s" }] } }
"#;

    #[test]
    fn each_condition_plans_its_streams_from_their_own_capacities() {
        let s = crate::scenario::Scenario::parse(STREAMS, std::path::Path::new("t")).unwrap();
        let caps = [("a".to_string(), 270.0), ("b".to_string(), 400.0)].into();
        let alone = super::plan(&s, &s.conditions[0], &caps).unwrap();
        // a is not named and has no default: not sent.
        assert_eq!(alone.streams.len(), 1);
        assert_eq!(
            (alone.streams[0].name.as_str(), alone.streams[0].rate),
            ("b", 200.0)
        );
        assert_eq!(alone.duration, Duration::from_secs(3));
        assert_eq!(alone.describe(), "b 200");
        let both = super::plan(&s, &s.conditions[1], &caps).unwrap();
        let a = &both.streams[0];
        assert_eq!((a.connections, a.phases.len()), (32, 2));
        assert_eq!((a.phases[0].rate, a.phases[1].rate), (270.0, 2700.0));
        assert_eq!(both.streams[1].rate, 20.0);
        // The stepped stream sets the window; the other one runs through it.
        assert_eq!(both.duration, Duration::from_secs(6));
        assert_eq!(both.describe(), "a 270 / 2700 (2+4 s) + b 20");
        assert!((both.mean_rate() - (270.0 * 2.0 + 2700.0 * 4.0) / 6.0 - 20.0).abs() < 1e-9);
        let none = super::plan(&s, &s.conditions[1], &Default::default()).unwrap_err();
        assert!(none.contains("no capacity"), "{none}");
    }

    #[test]
    fn paths_under_b_go_to_the_second_upstream_when_direct() {
        let target = super::Target {
            url: "http://A".into(),
            url_b: Some("http://B".into()),
            metrics: None,
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

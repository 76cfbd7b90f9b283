//! The scenario runner: starts the upstream and the gateway (or nginx) as separate, pinned
//! processes, runs each condition's load, and prints one comparison table with P100 plus an
//! overlaid SVG plot; every child it started is stopped on the way out, whatever the way out.
//!
//! [`run`] ties together the modules below it, each with one job: `context` (what every
//! condition of a run shares), `health` (the `/healthz` prober), `plan` (each condition's
//! streams and rates), `targets` (the child processes a load goes to), `conditions` (one
//! condition's run), `results` (reports merged over seeds and streams, timelines),
//! `tables` (what is printed and written to `summary.md`) and `slowest` (where each run's
//! slowest requests fell relative to the scrapes).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use tailguard_loadgen::latency::format_us;
use tailguard_loadgen::plot::Series;
use tailguard_loadgen::report::Report;
use tailguard_loadgen::timeline::Timeline;

use crate::LabError;
use crate::conditions::StreamLoad;
use crate::context::{Ctx, slug};
use crate::plan::{Plan, plan};
use crate::procs::which;
use crate::results::{SeedLine, combine, merge, write_timeline};
use crate::scenario::{Condition, Scenario, TargetKind};
use crate::slowest::SlowRun;
use crate::tables::{
    per_seed_table, ratio_table, render_table, step_lines, stream_notes, stream_table,
    timeline_section,
};
use crate::targets::start_upstream;

pub use crate::context::RunOptions;
pub use crate::health::{HEALTH_EVERY, HEALTH_TIMEOUT, Health};
pub use crate::results::{Row, Timelines};
pub use crate::tables::machine;
pub use crate::targets::{
    explain_exit, gateway_flags, nginx_config, one_upstream_config, two_upstreams_config,
};

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

    // The collector, shared by every condition (on the upstream's cores unless it has its own).
    let collector = match &scenario.collector {
        Some(spec) => Some(crate::collector::start(
            spec.command.as_deref(),
            &opts.out,
            &pins(pin.collector.as_deref().unwrap_or(&pin.upstream)),
            opts.nice,
        )?),
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
        collector: collector.as_ref().map(|(_, e)| e.clone()),
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
                target: if cap.command.is_empty() {
                    TargetKind::Gateway
                } else {
                    TargetKind::Command
                },
                command: cap.command.clone(),
                metrics_url: None,
                gateway: cap.gateway.clone(),
                scrape_every: None,
                scrape_gzip: true,
                rate_factor: None,
                rate: Some(probe_rate),
                max_rate: false,
                config: None,
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
    // Each run's slowest requests and scrapes, for where the tail fell relative to them.
    let mut slow_runs: Vec<SlowRun> = Vec::new();
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
                slow_runs.push(SlowRun::of(c, &cond.name, seed, cond.scrape_every, &r));
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
                    tailguard_loadgen::hgrm::render(&m.latency),
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
    if let Some((guard, endpoints)) = collector {
        // Proof that traced conditions exported: the services the collector has spans of.
        let services = endpoints.services();
        println!("  collector has spans of: {services}");
        let _ = std::fs::write(opts.out.join("collector-services.json"), services);
        drop(guard);
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
                points: tailguard_loadgen::hgrm::points(&rep.latency),
            })
        })
        .collect();
    if !series.is_empty() {
        let svg =
            tailguard_loadgen::plot::render(&format!("tailguard lab {}", scenario.name), &series);
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
        let per_seed = per_seed_table(&seed_lines);
        let ratios = ratio_table(&seed_lines);
        println!("\n{per_seed}\n{ratios}");
        let _ = writeln!(summary, "\n{per_seed}\n{ratios}");
    }
    if let Some(slowest) = crate::slowest::section(&slow_runs) {
        println!("\n{slowest}");
        let _ = writeln!(summary, "\n{slowest}");
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

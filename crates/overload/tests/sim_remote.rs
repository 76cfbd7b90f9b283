//! A seeded discrete-event simulation of remote upstreams: open-loop arrivals (Poisson or
//! constant rate) through the real [`UpstreamLimit`] and [`Controller`] (fed a low CPU
//! reading: the gateway's own core is idle) to upstreams with a fixed number of workers and
//! a FIFO queue, whose work a client timeout does not cancel (the upstream never learns the
//! client left). Scenarios are data: `tests/scenarios/remote/*.toml`, with `[min, max]`
//! expectations per window and upstream. Its results are a model, not measurements.

use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::sim::{T, check_range};
use tailguard_overload::{
    Class, Controller, LimitConfig, Outcome, OwnedLimitPermit, OwnedPermit, ShedderConfig,
    UpstreamLimit,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    description: String,
    /// "off" or "adaptive" (the upstream limit and the CPU shedder's in-flight triggers).
    mode: String,
    seed: u64,
    duration_s: f64,
    #[serde(default = "thousand")]
    timeout_ms: f64,
    /// "poisson" (default) or "constant".
    #[serde(default = "poisson")]
    arrivals: String,
    /// The gateway's and the network's share of each response time.
    #[serde(default = "overhead")]
    overhead_ms: f64,
    upstreams: Vec<Upstream>,
    checks: Vec<Check>,
}

fn thousand() -> f64 {
    1000.0
}
fn poisson() -> String {
    "poisson".into()
}
fn overhead() -> f64 {
    0.1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Upstream {
    name: String,
    workers: usize,
    service_ms: f64,
    /// Offered load as a multiple of capacity (`workers / service`), from `from_s`.
    phases: Vec<Phase>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Phase {
    from_s: f64,
    load: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Check {
    upstream: String,
    from_s: f64,
    to_s: f64,
    goodput_pct: Option<[f64; 2]>,
    reject_pct: Option<[f64; 2]>,
    p99_ms: Option<[f64; 2]>,
    /// Seconds from `from_s` to the first rejection in the window.
    first_reject_s: Option<[f64; 2]>,
    /// Seconds from `from_s` to the last rejection in the window (0 when none).
    last_reject_s: Option<[f64; 2]>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Tick,
    Arrival(usize),
    /// Upstream, worker.
    Done(usize, usize),
}

struct Job {
    arrival: f64,
    permits: Option<(OwnedLimitPermit, OwnedPermit)>,
}

#[derive(Debug, Default)]
struct Window {
    offered: u64,
    rejected: u64,
    good: u64,
    latencies: Vec<f64>,
    first_reject: Option<f64>,
    last_reject: Option<f64>,
}

fn secs(t: f64) -> Duration {
    Duration::from_secs_f64(t.max(0.0))
}

fn run(sc: &Scenario) -> Vec<Vec<Window>> {
    let adaptive = match sc.mode.as_str() {
        "adaptive" => true,
        "off" => false,
        other => panic!("unknown mode {other}"),
    };
    let mut rng = fastrand::Rng::with_seed(sc.seed);
    let timeout = sc.timeout_ms / 1e3;
    let overhead = sc.overhead_ms / 1e3;
    let n = sc.upstreams.len();
    let limits: Vec<Arc<UpstreamLimit>> = sc
        .upstreams
        .iter()
        .map(|u| Arc::new(UpstreamLimit::new(&u.name, LimitConfig::default()).unwrap()))
        .collect();
    let groups: Vec<Arc<Controller>> = sc
        .upstreams
        .iter()
        .map(|u| {
            let c = Arc::new(Controller::new(&u.name, ShedderConfig::adaptive()).unwrap());
            c.set_cores(2.0);
            c
        })
        .collect();
    let capacity: Vec<f64> = sc
        .upstreams
        .iter()
        .map(|u| u.workers as f64 / (u.service_ms / 1e3))
        .collect();
    let rate_at = |u: usize, t: f64| {
        sc.upstreams[u]
            .phases
            .iter()
            .rev()
            .find(|p| t >= p.from_s)
            .map_or(0.0, |p| p.load * capacity[u])
    };

    let mut windows: Vec<Vec<Window>> = Vec::new();
    // Per upstream: (arrival, latency, or None when rejected), windowed at the end.
    let mut records: Vec<Vec<(f64, Option<f64>)>> = vec![Vec::new(); n];

    let mut heap: BinaryHeap<(T, u64, Event)> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<(T, u64, Event)>, t: f64, e: Event| {
        seq += 1;
        heap.push((T(t), seq, e));
    };
    push(&mut heap, 0.1, Event::Tick);
    let next_arrival = |rng: &mut fastrand::Rng, u: usize, t: f64| -> f64 {
        // Rates change only at phase boundaries; a gap crossing one is redrawn there.
        let rate = rate_at(u, t);
        let next_change = sc.upstreams[u]
            .phases
            .iter()
            .map(|p| p.from_s)
            .filter(|&f| f > t)
            .fold(f64::INFINITY, f64::min);
        if rate <= 0.0 {
            return next_change;
        }
        let gap = if sc.arrivals == "constant" {
            1.0 / rate
        } else {
            -(1.0 - rng.f64()).ln() / rate
        };
        if t + gap > next_change {
            next_change
        } else {
            t + gap
        }
    };
    for u in 0..n {
        let t = next_arrival(&mut rng, u, 0.0);
        push(&mut heap, t, Event::Arrival(u));
    }
    let mut queues: Vec<VecDeque<Job>> = (0..n).map(|_| VecDeque::new()).collect();
    let mut busy: Vec<Vec<Option<Job>>> = sc
        .upstreams
        .iter()
        .map(|u| (0..u.workers).map(|_| None).collect())
        .collect();

    while let Some((T(t), _, e)) = heap.pop() {
        if t > sc.duration_s {
            break;
        }
        match e {
            Event::Tick => {
                if adaptive {
                    for u in 0..n {
                        limits[u].tick(secs(t));
                        groups[u].tick(secs(t), 100);
                    }
                }
                push(&mut heap, t + 0.1, Event::Tick);
            }
            Event::Arrival(u) => {
                let next = next_arrival(&mut rng, u, t);
                push(&mut heap, next, Event::Arrival(u));
                if rate_at(u, t) <= 0.0 {
                    continue;
                }
                let permits = if adaptive {
                    let limit = match limits[u].acquire_owned(secs(t), Class::Normal) {
                        Ok(p) => p,
                        Err(_) => {
                            records[u].push((t, None));
                            continue;
                        }
                    };
                    match groups[u].admit_owned(secs(t), Class::Normal) {
                        Ok(p) => Some((limit, p)),
                        Err(_) => {
                            records[u].push((t, None));
                            continue;
                        }
                    }
                } else {
                    None
                };
                let job = Job {
                    arrival: t,
                    permits,
                };
                if let Some(w) = busy[u].iter().position(Option::is_none) {
                    busy[u][w] = Some(job);
                    let done = t + overhead + sc.upstreams[u].service_ms / 1e3;
                    push(&mut heap, done, Event::Done(u, w));
                } else {
                    queues[u].push_back(job);
                }
            }
            Event::Done(u, w) => {
                let job = busy[u][w].take().expect("a worker finishing holds a job");
                let latency = t - job.arrival;
                // The client gave up at the timeout; the upstream's work went on anyway.
                let seen = latency.min(timeout);
                if let Some((mut limit, permit)) = job.permits {
                    limit.record(secs(job.arrival + seen));
                    permit.complete(secs(job.arrival + seen), Outcome::Served);
                }
                records[u].push((job.arrival, Some(latency)));
                if let Some(next) = queues[u].pop_front() {
                    busy[u][w] = Some(next);
                    push(
                        &mut heap,
                        t + sc.upstreams[u].service_ms / 1e3,
                        Event::Done(u, w),
                    );
                }
            }
        }
    }

    for check in &sc.checks {
        let u = sc
            .upstreams
            .iter()
            .position(|x| x.name == check.upstream)
            .unwrap_or_else(|| panic!("check names unknown upstream {}", check.upstream));
        let mut w = Window::default();
        for &(arrival, latency) in &records[u] {
            if arrival < check.from_s || arrival >= check.to_s {
                continue;
            }
            w.offered += 1;
            match latency {
                None => {
                    w.rejected += 1;
                    w.first_reject.get_or_insert(arrival);
                    w.last_reject = Some(arrival);
                }
                Some(l) if l <= timeout => {
                    w.good += 1;
                    w.latencies.push(l);
                }
                Some(_) => {}
            }
        }
        windows.push(vec![w]);
    }
    windows
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn run_file(name: &str) {
    let path = format!(
        "{}/tests/scenarios/remote/{name}.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let sc: Scenario = toml::from_str(&text).unwrap();
    let windows = run(&sc);
    let mut errors = Vec::new();
    let mut report = format!("{name}: {}\n", sc.description);
    for (check, ws) in sc.checks.iter().zip(&windows) {
        let w = &ws[0];
        let u = sc
            .upstreams
            .iter()
            .find(|x| x.name == check.upstream)
            .unwrap();
        let capacity = u.workers as f64 / (u.service_ms / 1e3);
        let span = check.to_s - check.from_s;
        let goodput = w.good as f64 / span / capacity * 100.0;
        let reject = w.rejected as f64 / w.offered.max(1) as f64 * 100.0;
        let mut lat = w.latencies.clone();
        lat.sort_by(f64::total_cmp);
        let p99 = pct(&lat, 0.99) * 1e3;
        let first = w.first_reject.map_or(f64::INFINITY, |t| t - check.from_s);
        let last = w.last_reject.map_or(0.0, |t| t - check.from_s);
        let at = format!("{} [{}, {})", check.upstream, check.from_s, check.to_s);
        report.push_str(&format!(
            "  {at}: goodput {goodput:.1} %, rejected {reject:.1} %, admitted P50 {:.2} ms P99 {p99:.2} ms P100 {:.2} ms, first reject +{first:.3} s, last reject +{last:.3} s\n",
            pct(&lat, 0.5) * 1e3,
            pct(&lat, 1.0) * 1e3,
        ));
        check_range(
            &mut errors,
            &format!("{at} goodput %"),
            goodput,
            check.goodput_pct,
        );
        check_range(
            &mut errors,
            &format!("{at} reject %"),
            reject,
            check.reject_pct,
        );
        check_range(&mut errors, &format!("{at} P99 ms"), p99, check.p99_ms);
        check_range(
            &mut errors,
            &format!("{at} first reject s"),
            first,
            check.first_reject_s,
        );
        check_range(
            &mut errors,
            &format!("{at} last reject s"),
            last,
            check.last_reject_s,
        );
    }
    println!("{report}");
    assert!(errors.is_empty(), "{report}{}", errors.join("\n"));
}

macro_rules! scenarios {
    ($($name:ident => $file:literal),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                run_file($file);
            }
        )*

        #[test]
        fn every_remote_scenario_file_has_a_test() {
            let dir = format!("{}/tests/scenarios/remote", env!("CARGO_MANIFEST_DIR"));
            let known = [$($file),*];
            for entry in std::fs::read_dir(dir).unwrap() {
                let name = entry.unwrap().file_name().into_string().unwrap();
                if let Some(stem) = name.strip_suffix(".toml") {
                    assert!(known.contains(&stem), "no test runs tests/scenarios/remote/{name}");
                }
            }
        }
    };
}

scenarios! {
    remote_cpu_step_10x => "cpu-step-10x",
    remote_io_step_10x => "io-step-10x",
    remote_cpu_3x => "cpu-3x",
    remote_io_3x => "io-3x",
    remote_io_below_capacity => "io-below-capacity",
    remote_two_upstreams => "two-upstreams",
    remote_cpu_off_10x => "cpu-off-10x",
    remote_cpu_start_10x => "cpu-start-10x",
    remote_io_recovery => "io-recovery",
}

//! A seeded discrete-event simulation that drives the real controller: open-loop Poisson
//! arrivals against a processor-sharing server with N cores, a CPU cost per rejection, a
//! client timeout that cancels abandoned work (a dropped Rust future), and the CPU signal
//! read through the real [`CpuSampler`]. Scenarios are data: `tests/scenarios/*.toml`, each
//! with `[min, max]` expectations per measurement window (the shape of Vector's ARC tests).
//! The model follows `research/shedding-sim.py`; its results are a model, not measurements.

use std::cmp::Ordering as CmpOrdering;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tailguard_overload::{
    Class, Controller, CpuSampler, CpuTotals, Error, Outcome, OwnedPermit, ShedderConfig, Smoothing,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    description: String,
    /// "adaptive" or "gozero"
    mode: String,
    seed: u64,
    #[serde(default = "two")]
    cores: f64,
    duration_s: f64,
    #[serde(default = "thousand")]
    timeout_ms: f64,
    #[serde(default = "twenty")]
    reject_cost_us: f64,
    #[serde(default)]
    routes: Vec<Route>,
    phases: Vec<Phase>,
    /// Another tenant takes this fraction of the cores from `from_s`.
    #[serde(default)]
    steal: Option<Steal>,
    /// The CPU reader fails in [from, to).
    #[serde(default)]
    cpu_fail: Option<[f64; 2]>,
    checks: Vec<Check>,
}

fn two() -> f64 {
    2.0
}
fn thousand() -> f64 {
    1000.0
}
fn twenty() -> f64 {
    20.0
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Route {
    name: String,
    share: f64,
    service_ms: f64,
    #[serde(default)]
    class: Class,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Phase {
    from_s: f64,
    /// Offered load as a multiple of capacity.
    load: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Steal {
    from_s: f64,
    fraction: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Check {
    from_s: f64,
    to_s: f64,
    /// Limit latency and reject checks to one route.
    route: Option<String>,
    goodput_pct: Option<[f64; 2]>,
    reject_pct: Option<[f64; 2]>,
    p50_ms: Option<[f64; 2]>,
    p99_ms: Option<[f64; 2]>,
    /// Seconds from `from_s` to the first rejection in the window.
    first_reject_s: Option<[f64; 2]>,
}

/// f64 with a total order, for the heaps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct T(pub(crate) f64);
impl Eq for T {}
impl PartialOrd for T {
    fn partial_cmp(&self, o: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}
impl Ord for T {
    fn cmp(&self, o: &Self) -> CmpOrdering {
        o.0.total_cmp(&self.0) // reversed: BinaryHeap becomes a min-heap
    }
}

struct Job {
    arrival: f64,
    route: usize,
    permit: Option<OwnedPermit>,
}

#[derive(Debug, Default, Clone)]
struct WindowStats {
    offered: u64,
    rejected: u64,
    /// CPU-seconds of requests served within the timeout (goodput as work, so routes of
    /// different cost add up).
    good_work: f64,
    latencies: Vec<f64>,
    first_reject: Option<f64>,
}

struct Outcome2 {
    capacity: f64,
    windows: Vec<WindowStats>,
}

/// An exponential inter-arrival time at rate `lambda`.
fn exp(rng: &mut fastrand::Rng, lambda: f64) -> f64 {
    if lambda <= 0.0 {
        f64::INFINITY
    } else {
        -(1.0 - rng.f64()).ln() / lambda
    }
}

fn secs(t: f64) -> Duration {
    Duration::from_secs_f64(t.max(0.0))
}

fn run(sc: &Scenario) -> Outcome2 {
    let routes: Vec<Route> = if sc.routes.is_empty() {
        vec![Route {
            name: "default".into(),
            share: 1.0,
            service_ms: 3.6,
            class: Class::Normal,
        }]
    } else {
        sc.routes
            .iter()
            .map(|r| Route {
                name: r.name.clone(),
                share: r.share,
                service_ms: r.service_ms,
                class: r.class,
            })
            .collect()
    };
    let total_share: f64 = routes.iter().map(|r| r.share).sum();
    let mean_service = routes
        .iter()
        .map(|r| r.share / total_share * r.service_ms / 1e3)
        .sum::<f64>();
    let capacity = sc.cores / mean_service;
    let (cfg, smoothing) = match sc.mode.as_str() {
        "adaptive" => (ShedderConfig::adaptive(), Smoothing::adaptive()),
        "gozero" => (ShedderConfig::gozero(), Smoothing::GoZero),
        other => panic!("unknown mode {other}"),
    };
    let ctls: Vec<Arc<Controller>> = routes
        .iter()
        .map(|r| {
            let c = Arc::new(Controller::new(&r.name, cfg.clone()).unwrap());
            c.set_cores(sc.cores);
            c
        })
        .collect();

    let mut rng = fastrand::Rng::with_seed(sc.seed);
    let timeout = sc.timeout_ms / 1e3;
    let reject_cost = sc.reject_cost_us / 1e6;
    let load_at = |t: f64| {
        sc.phases
            .iter()
            .rev()
            .find(|p| t >= p.from_s)
            .map_or(0.0, |p| p.load)
    };
    let steal_at = |t: f64| {
        sc.steal
            .as_ref()
            .map_or(0.0, |s| if t >= s.from_s { s.fraction } else { 0.0 })
    };
    let rate_at = |t: f64| load_at(t) * capacity;

    let mut sampler = CpuSampler::new(smoothing);
    let mut windows = vec![WindowStats::default(); sc.checks.len()];
    let (mut t, mut v) = (0.0f64, 0.0f64);
    let mut finish: BinaryHeap<(T, u64)> = BinaryHeap::new();
    let mut deadlines: BinaryHeap<(T, u64)> = BinaryHeap::new();
    let mut jobs: HashMap<u64, Job> = HashMap::new();
    let mut n_active = 0usize;
    let mut next_id = 0u64;
    let mut busy = 0.0f64; // our core-seconds of CPU so far
    let mut next_arrival = exp(&mut rng, rate_at(0.0));
    let (tick, cpu_every) = (0.1, 0.25);
    let (mut next_tick, mut next_cpu) = (0.0, 0.0);
    let mut cpu = 0u32;

    while t < sc.duration_s {
        while finish.peek().is_some_and(|(_, id)| !jobs.contains_key(id)) {
            finish.pop();
        }
        let cores_eff = sc.cores * (1.0 - steal_at(t));
        let rate = if n_active > 0 {
            (cores_eff / n_active as f64).min(1.0)
        } else {
            0.0
        };
        let t_done = finish
            .peek()
            .map_or(f64::INFINITY, |(fv, _)| t + (fv.0 - v) / rate);
        let t_timeout = deadlines.peek().map_or(f64::INFINITY, |(d, _)| d.0);
        let t_next = next_arrival
            .min(next_tick)
            .min(next_cpu)
            .min(t_done)
            .min(t_timeout);
        let dt = t_next - t;
        busy += (n_active as f64).min(cores_eff) * dt;
        v += rate * dt;
        t = t_next;
        let now = secs(t);

        if t == t_done {
            let (_, id) = finish.pop().expect("peeked");
            n_active -= 1;
            let job = jobs.remove(&id).expect("live job");
            let rt = t - job.arrival;
            if let Some(p) = job.permit {
                p.complete(now, Outcome::Served);
            }
            if rt <= timeout {
                for (c, w) in sc.checks.iter().zip(windows.iter_mut()) {
                    if c.from_s <= job.arrival && job.arrival < c.to_s {
                        if c.route
                            .as_ref()
                            .is_none_or(|r| *r == routes[job.route].name)
                        {
                            w.latencies.push(rt);
                        }
                        w.good_work += routes[job.route].service_ms / 1e3;
                    }
                }
            }
        } else if t == t_timeout {
            let (_, id) = deadlines.pop().expect("peeked");
            if jobs.remove(&id).is_some() {
                // The client gave up: the request future is dropped (permit: Cancelled).
                n_active -= 1;
            }
        } else if t == next_cpu {
            let reading = match sc.cpu_fail {
                Some([a, b]) if a <= t && t < b => Err(Error::Config("injected".into())),
                _ => Ok(CpuTotals {
                    usage: secs(busy),
                    throttled: None,
                    cores: sc.cores,
                }),
            };
            cpu = sampler.update(now, reading);
            next_cpu += cpu_every;
        } else if t == next_tick {
            for c in &ctls {
                c.tick(now, cpu);
            }
            next_tick += tick;
        } else {
            next_arrival = t + exp(&mut rng, rate_at(t));
            let mut pick = rng.f64() * total_share;
            let route = routes
                .iter()
                .position(|r| {
                    pick -= r.share;
                    pick < 0.0
                })
                .unwrap_or(routes.len() - 1);
            let counts = |c: &Check| {
                c.from_s <= t
                    && t < c.to_s
                    && c.route.as_ref().is_none_or(|r| *r == routes[route].name)
            };
            for (c, w) in sc.checks.iter().zip(windows.iter_mut()) {
                if counts(c) {
                    w.offered += 1;
                }
            }
            match ctls[route].admit_owned(now, routes[route].class) {
                Ok(permit) => {
                    next_id += 1;
                    n_active += 1;
                    jobs.insert(
                        next_id,
                        Job {
                            arrival: t,
                            route,
                            permit: Some(permit),
                        },
                    );
                    finish.push((T(v + routes[route].service_ms / 1e3), next_id));
                    deadlines.push((T(t + timeout), next_id));
                }
                Err(_) => {
                    // A rejection burns `reject_cost` of one core at once: a free core absorbs
                    // it, otherwise it is taken from every running request's share.
                    busy += reject_cost;
                    if n_active as f64 >= cores_eff && n_active > 0 {
                        v -= reject_cost / n_active as f64;
                    }
                    for (c, w) in sc.checks.iter().zip(windows.iter_mut()) {
                        if counts(c) {
                            w.rejected += 1;
                            w.first_reject.get_or_insert(t);
                        }
                    }
                }
            }
        }
    }
    Outcome2 { capacity, windows }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((p * sorted.len() as f64) as usize).min(sorted.len() - 1)] * 1e3
}

pub(crate) fn check_range(errors: &mut Vec<String>, what: &str, got: f64, range: Option<[f64; 2]>) {
    if let Some([lo, hi]) = range
        && !(lo <= got && got <= hi)
    {
        errors.push(format!("{what} = {got:.2}, expected [{lo}, {hi}]"));
    }
}

fn run_file(name: &str) {
    let path = format!("{}/tests/scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let sc: Scenario = toml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    let out = run(&sc);
    let mut errors = Vec::new();
    let mut report = format!(
        "{name}: {} (capacity {:.0}/s)\n",
        sc.description, out.capacity
    );
    for (c, w) in sc.checks.iter().zip(&out.windows) {
        let mut lat = w.latencies.clone();
        lat.sort_by(f64::total_cmp);
        let span = c.to_s - c.from_s;
        let goodput = 100.0 * w.good_work / (span * sc.cores);
        let reject = 100.0 * w.rejected as f64 / (w.offered.max(1)) as f64;
        let (p50, p99) = (pct(&lat, 0.5), pct(&lat, 0.99));
        let first = w.first_reject.map_or(f64::INFINITY, |t| t - c.from_s);
        let label = format!(
            "{}-{}s{}",
            c.from_s,
            c.to_s,
            c.route
                .as_ref()
                .map(|r| format!(" {r}"))
                .unwrap_or_default()
        );
        report.push_str(&format!(
            "  {label}: goodput {goodput:.1}% reject {reject:.2}% p50 {p50:.1} ms p99 {p99:.1} ms first reject {first:.2} s\n"
        ));
        check_range(
            &mut errors,
            &format!("{label} goodput_pct"),
            goodput,
            c.goodput_pct,
        );
        check_range(
            &mut errors,
            &format!("{label} reject_pct"),
            reject,
            c.reject_pct,
        );
        check_range(&mut errors, &format!("{label} p50_ms"), p50, c.p50_ms);
        check_range(&mut errors, &format!("{label} p99_ms"), p99, c.p99_ms);
        check_range(
            &mut errors,
            &format!("{label} first_reject_s"),
            first,
            c.first_reject_s,
        );
    }
    println!("{report}");
    assert!(errors.is_empty(), "{report}{}", errors.join("\n"));
}

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                run_file(&stringify!($name).replace('_', "-"));
            }
        )*

        #[test]
        fn every_scenario_file_has_a_test() {
            let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scenarios");
            let mut files: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|name| name.ends_with(".toml"))
                .collect();
            files.sort();
            let mut known: Vec<String> =
                vec![$(format!("{}.toml", stringify!($name).replace('_', "-"))),*];
            known.sort();
            assert_eq!(files, known);
        }
    };
}

scenarios!(
    step_1_5x,
    step_3x,
    step_10x,
    spike_1s,
    recovery,
    below_capacity,
    near_capacity,
    bimodal_routes,
    noisy_neighbour,
    failing_cpu_reader,
    gozero_step_10x,
);

//! One condition's run: its streams' loads on one clock against a target started for it,
//! with the `/healthz` prober beside them; and wrk's closed-loop maximum through a target.

use std::process::Stdio;
use std::time::Duration;

use tailguard_loadgen::load::LoadConfig;
use tailguard_loadgen::report::Report;
use tailguard_loadgen::scrape::{ScrapeConfig, WatchConfig};

use crate::context::Ctx;
use crate::health::{Health, probe_health};
use crate::plan::StreamPlan;
use crate::procs::{pinned_command, process_cpu, which};
use crate::scenario::{Condition, TargetKind};

/// A stream's load and the path it goes to on the condition's target.
pub(crate) struct StreamLoad {
    pub(crate) path: String,
    pub(crate) config: LoadConfig,
}

impl Ctx<'_> {
    pub(crate) fn load_config(&self, url: &str, rate: f64, seed: u64) -> LoadConfig {
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
    pub(crate) fn stream_load(&self, st: &StreamPlan, duration: Duration, seed: u64) -> StreamLoad {
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
    pub(crate) fn run_condition(
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
                        gzip: cond.scrape_gzip,
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
        let warmup = configs.first().map(|c| c.warmup).unwrap_or_default();
        let (reports, health, cpu) = std::thread::scope(|scope| {
            let stop = &stop;
            let prober = probe_addr.map(|addr| scope.spawn(move || probe_health(addr, stop)));
            // The target's CPU when the measured window opens (after the warmup) ...
            let cpu_start = target.cpu_pid.map(|pid| {
                scope.spawn(move || {
                    std::thread::sleep(warmup);
                    process_cpu(pid)
                })
            });
            let reports = tailguard_loadgen::load::run_streams(&configs);
            // ... and when it closes.
            let cpu_end = target.cpu_pid.and_then(process_cpu);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let cpu_start = cpu_start.and_then(|t| t.join().ok().flatten());
            let cpu = cpu_start.zip(cpu_end).map(|(a, b)| b.saturating_sub(a));
            (reports, prober.and_then(|p| p.join().ok()), cpu)
        });
        let reports = reports.map_err(|e| format!("load failed: {e}"))?;
        if let Some(cpu) = cpu {
            self.report_cpu(cond, configs.first().map_or(0, |c| c.seed), cpu, &reports);
        }
        drop(target);
        Ok((reports, health))
    }

    /// Prints a command target's CPU per request over the measured window and appends it to
    /// `cpu.tsv` (condition, seed, CPU seconds, requests, microseconds per request).
    fn report_cpu(&self, cond: &Condition, seed: u64, cpu: Duration, reports: &[Report]) {
        let requests: u64 = reports.iter().map(|r| r.completed).sum();
        let per_request_us = cpu.as_secs_f64() * 1e6 / requests.max(1) as f64;
        println!(
            "    target cpu: {per_request_us:.2} us/request (utime+stime {:.3} s over {requests} requests)",
            cpu.as_secs_f64()
        );
        let path = self.opts.out.join("cpu.tsv");
        let header = !path.exists();
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            use std::io::Write as _;
            if header {
                let _ = writeln!(f, "condition\tseed\tcpu_s\trequests\tus_per_request");
            }
            let _ = writeln!(
                f,
                "{}\t{seed}\t{:.6}\t{requests}\t{per_request_us:.3}",
                cond.name,
                cpu.as_secs_f64()
            );
        }
    }

    /// wrk's closed-loop maximum through the condition's target, when wrk is installed.
    pub(crate) fn max_rate(&self, cond: &Condition) -> Option<f64> {
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

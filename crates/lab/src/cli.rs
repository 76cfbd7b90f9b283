//! Command-line entry points of the lab: `load`, `lab` and `upstream`.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};

use tailguard_loadgen::clock::parse_duration;
use tailguard_loadgen::load::LoadConfig;
use tailguard_loadgen::plot::Series;
use tailguard_loadgen::scrape::ScrapeConfig;

/// Arguments of `tailguard load`.
#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    /// Target URL (http://host:port/path).
    pub url: String,
    /// Requests per second (the schedule, not a ceiling).
    #[arg(long, short = 'R')]
    pub rate: f64,
    /// Measured duration, e.g. 30s, 2m.
    #[arg(long, short = 'd', default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Keep-alive connections.
    #[arg(long, short = 'c', default_value_t = 16)]
    pub connections: usize,
    /// Generator threads (each a current-thread runtime with its share of connections).
    #[arg(long, short = 't', default_value_t = 1)]
    pub threads: usize,
    /// Pin the generator threads to these cores (comma-separated), e.g. `--pin 0`.
    #[arg(long, value_delimiter = ',')]
    pub pin: Vec<usize>,
    /// Nice value of the generator threads, e.g. -10 to run ahead of builds on a shared
    /// machine (negative needs root).
    #[arg(long, allow_hyphen_values = true)]
    pub nice: Option<i32>,
    /// What each request carries.
    #[command(flatten)]
    pub request: Box<RequestArgs>,
    /// Where the results go.
    #[command(flatten)]
    pub output: Box<OutputArgs>,
    /// Run at the same rate for this long before measuring.
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Poisson arrivals (exponential gaps) of the same mean rate instead of a fixed interval.
    #[arg(long)]
    pub poisson: bool,
    /// Seed of the Poisson schedule.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Per-request timeout from the moment it is written.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Scrape this metrics URL during the run.
    #[arg(long)]
    pub scrape: Option<String>,
    /// Interval between scrapes.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub every: Duration,
}

/// The request `tailguard load` sends.
#[derive(Debug, clap::Args)]
pub struct RequestArgs {
    /// HTTP method.
    #[arg(long, short = 'm', default_value = "GET")]
    pub method: String,
    /// Extra header, `Name: value` (repeatable).
    #[arg(long, short = 'H')]
    pub header: Vec<String>,
    /// A header whose value changes per request, `Name: FILE`: each request carries the
    /// next line of FILE (blank lines skipped), round and round, e.g. 1,000 distinct tokens.
    #[arg(long)]
    pub header_file: Option<String>,
    /// With `--header-file`: count the answers per value and per wall-clock window of this
    /// length, e.g. `60s` (printed, and in the `--json` report's `keys`): a per-key rate
    /// limit checked key by key.
    #[arg(long, value_name = "WINDOW", value_parser = parse_duration)]
    pub count_per_value: Option<Duration>,
    /// File whose contents are sent as the request body.
    #[arg(long)]
    pub body: Option<PathBuf>,
}

/// Where `tailguard load` writes its results.
#[derive(Debug, clap::Args)]
pub struct OutputArgs {
    /// Write the full report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the percentile distribution (.hgrm, milliseconds) here.
    #[arg(long)]
    pub hgrm: Option<PathBuf>,
    /// Write an SVG percentile plot here.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Overlay earlier runs on the plot: `.hgrm` or report `.json` files (repeatable).
    #[arg(long)]
    pub compare: Vec<PathBuf>,
    /// Legend label of this run on the plot.
    #[arg(long)]
    pub label: Option<String>,
    /// Write the per-second timeline (offered, goodput, 503s, errors, admitted P50/P99) as
    /// CSV here.
    #[arg(long)]
    pub timeline: Option<PathBuf>,
    /// Skip the detailed percentile spectrum in the printed report.
    #[arg(long)]
    pub brief: bool,
}

impl LoadArgs {
    /// The generator's configuration from these arguments.
    pub fn to_config(&self) -> anyhow::Result<LoadConfig> {
        let method = Method::from_bytes(self.request.method.as_bytes())
            .with_context(|| format!("--method `{}` is not an HTTP method", self.request.method))?;
        let mut headers = Vec::new();
        for h in &self.request.header {
            let (name, value) = h
                .split_once(':')
                .with_context(|| format!("--header `{h}` must be `Name: value`"))?;
            headers.push((
                HeaderName::from_bytes(name.trim().as_bytes())
                    .with_context(|| format!("--header `{h}`: bad name"))?,
                HeaderValue::from_str(value.trim())
                    .with_context(|| format!("--header `{h}`: bad value"))?,
            ));
        }
        let rotate = match &self.request.header_file {
            Some(spec) => Some(header_file(spec)?),
            None => None,
        };
        if let Some(window) = self.request.count_per_value {
            anyhow::ensure!(rotate.is_some(), "--count-per-value needs --header-file");
            anyhow::ensure!(!window.is_zero(), "--count-per-value must be above 0");
        }
        let body = match &self.request.body {
            Some(path) => Bytes::from(
                std::fs::read(path).with_context(|| format!("--body {}", path.display()))?,
            ),
            None => Bytes::new(),
        };
        Ok(LoadConfig {
            url: self.url.clone(),
            method,
            headers,
            rotate,
            count_values: self.request.count_per_value,
            body,
            rate: self.rate,
            duration: self.duration,
            warmup: self.warmup,
            connections: self.connections,
            threads: self.threads,
            poisson: self.poisson,
            seed: self.seed,
            timeout: self.timeout,
            scrape: self.scrape.as_ref().map(|url| ScrapeConfig {
                url: url.clone(),
                every: self.every,
                gzip: true,
            }),
            progress: std::io::stdout().is_terminal(),
            pin: self.pin.clone(),
            nice: self.nice,
            phases: Vec::new(),
            watch: None,
        })
    }
}

/// `--header-file Name: FILE`: the header's name and FILE's non-blank lines as its values.
fn header_file(spec: &str) -> anyhow::Result<(HeaderName, std::sync::Arc<[HeaderValue]>)> {
    let (name, path) = spec
        .split_once(':')
        .with_context(|| format!("--header-file `{spec}` must be `Name: FILE`"))?;
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .with_context(|| format!("--header-file `{spec}`: bad name"))?;
    let path = path.trim();
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--header-file: reading {path}"))?;
    let mut values = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        values.push(
            HeaderValue::from_str(line.trim())
                .with_context(|| format!("--header-file {path}:{}: not a header value", n + 1))?,
        );
    }
    anyhow::ensure!(!values.is_empty(), "--header-file {path}: no values");
    Ok((name, values.into()))
}

/// Arguments of `tailguard lab`.
#[derive(Debug, clap::Args)]
pub struct LabArgs {
    /// Scenario name (a directory under lab/scenarios) or path to a scenario.toml.
    pub scenario: String,
    /// Run every condition for seconds only (CI).
    #[arg(long)]
    pub quick: bool,
    /// Where to write reports, hgrm files and the plot (default: `target/lab/<scenario>`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Directory holding the scenarios.
    #[arg(long, default_value = "lab/scenarios")]
    pub scenarios: PathBuf,
    /// Override the scenario's measured duration per run (e.g. 30s).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Nice value for every process of the run (upstream, gateway, nginx, generator threads),
    /// e.g. -10 so a shared machine's other work does not decide the tail (needs root).
    #[arg(long, allow_hyphen_values = true)]
    pub nice: Option<i32>,
}

/// Arguments of `tailguard upstream`.
#[derive(Debug, clap::Args)]
pub struct UpstreamArgs {
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub listen: String,
    /// Response body size in bytes.
    #[arg(long, default_value_t = 13)]
    pub body_bytes: usize,
    /// Serve this file's bytes as the body instead (e.g. `lab/compress/8k.json`).
    #[arg(long, value_name = "PATH")]
    pub body_file: Option<std::path::PathBuf>,
    /// The responses' `Content-Type` (default `text/plain`).
    #[arg(long, value_name = "TYPE")]
    pub content_type: Option<String>,
    /// Delay before each response, milliseconds.
    #[arg(long, default_value_t = 0.0)]
    pub latency: f64,
    /// Uniform random extra delay up to this many milliseconds.
    #[arg(long, default_value_t = 0.0)]
    pub jitter: f64,
    /// CPU to burn per request, milliseconds of the serving thread's CPU time.
    #[arg(long, default_value_t = 0.0)]
    pub cpu_ms: f64,
    /// Fraction (0..1) of requests answered with 500.
    #[arg(long, default_value_t = 0.0)]
    pub error_rate: f64,
    /// Worker threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Serve at most N requests at once (a database-bound service's pool); the others wait
    /// in arrival order.
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// Milliseconds each request holds its worker (a sleep, not CPU); needs --workers.
    #[arg(long, value_name = "MS", default_value_t = 0.0)]
    pub delay_ms: f64,
}

/// Runs `tailguard load`.
pub fn load(args: LoadArgs) -> anyhow::Result<ExitCode> {
    let config = args.to_config()?;
    let report = tailguard_loadgen::load::run(&config)?;
    let mut text = report.render();
    if args.output.brief {
        text = brief(&text);
    }
    print!("{text}");
    if let Some(path) = &args.output.json {
        std::fs::write(path, report.to_json())
            .with_context(|| format!("--json {}", path.display()))?;
    }
    if let Some(path) = &args.output.timeline {
        std::fs::write(
            path,
            tailguard_loadgen::timeline::csv(&report.timeline, &[]),
        )
        .with_context(|| format!("--timeline {}", path.display()))?;
    }
    if let Some(path) = &args.output.hgrm {
        std::fs::write(path, tailguard_loadgen::hgrm::render(&report.latency))
            .with_context(|| format!("--hgrm {}", path.display()))?;
    }
    if let Some(path) = &args.output.plot {
        let mut series = Vec::new();
        for other in &args.output.compare {
            series.push(read_series(other)?);
        }
        series.push(Series {
            label: args
                .output
                .label
                .clone()
                .unwrap_or_else(|| format!("{} req/s, {}", report.requested_rate, report.url)),
            points: tailguard_loadgen::hgrm::points(&report.latency),
        });
        if report.latency_during_scrape.count() > 0 {
            series.push(Series {
                label: "requests that overlapped a scrape".to_string(),
                points: tailguard_loadgen::hgrm::points(&report.latency_during_scrape),
            });
        }
        std::fs::write(
            path,
            tailguard_loadgen::plot::render("Latency by percentile", &series),
        )
        .with_context(|| format!("--plot {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Drops the detailed spectrum from a rendered report.
fn brief(text: &str) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for line in text.lines() {
        if line.starts_with("  Detailed Percentile spectrum") {
            skipping = true;
        } else if line.starts_with("-----") {
            skipping = false;
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// A plot series from a `.hgrm` or a report `.json` file, labelled by its file name.
pub fn read_series(path: &std::path::Path) -> anyhow::Result<Series> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let points = if path.extension().is_some_and(|e| e == "json") {
        tailguard_loadgen::hgrm::points(
            &tailguard_loadgen::report::Report::from_json(&text)?.latency,
        )
    } else {
        tailguard_loadgen::hgrm::parse(&text)?
    };
    let label = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(Series { label, points })
}

/// Runs `tailguard lab`.
pub fn lab(args: LabArgs) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find the tailguard executable")?;
    let out = args.out.clone().unwrap_or_else(|| {
        let name = std::path::Path::new(&args.scenario)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| args.scenario.clone());
        PathBuf::from("target/lab").join(name)
    });
    let names: Vec<String> = if args.scenario == "all" {
        let mut names: Vec<String> = std::fs::read_dir(&args.scenarios)
            .with_context(|| format!("--scenarios {}", args.scenarios.display()))?
            .filter_map(Result::ok)
            .filter(|e| e.path().join("scenario.toml").is_file())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    } else {
        vec![args.scenario.clone()]
    };
    for name in names {
        // The route table's scenario measures starts, memory and reloads, not one load's
        // percentiles: its own runner, over its own data file.
        if name == "routes" {
            crate::routes::run(
                &exe,
                &args.scenarios.join("routes/routes.toml"),
                &out,
                args.quick,
                args.nice,
            )?;
            continue;
        }
        let opts = crate::runner::RunOptions {
            scenario: name.clone(),
            scenarios_dir: args.scenarios.clone(),
            quick: args.quick,
            out: if args.scenario == "all" {
                out.join(&name)
            } else {
                out.clone()
            },
            exe: exe.clone(),
            nice: args.nice,
            duration: args.duration,
        };
        crate::runner::run(&opts)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `tailguard upstream`.
pub fn upstream(args: UpstreamArgs) -> anyhow::Result<ExitCode> {
    use std::io::Write as _;
    if !(0.0..=1.0).contains(&args.error_rate) {
        anyhow::bail!("--error-rate must be between 0 and 1");
    }
    for (name, v) in [
        ("--latency", args.latency),
        ("--jitter", args.jitter),
        ("--cpu-ms", args.cpu_ms),
        ("--delay-ms", args.delay_ms),
    ] {
        if !(v >= 0.0 && v.is_finite()) {
            anyhow::bail!("{name} must be a non-negative number of milliseconds");
        }
    }
    if args.workers == Some(0) {
        anyhow::bail!("--workers must be at least 1");
    }
    if args.delay_ms > 0.0 && args.workers.is_none() {
        anyhow::bail!(
            "--delay-ms is how long a request holds one of --workers N; without a worker limit use --latency"
        );
    }
    let body = match &args.body_file {
        Some(path) => {
            Some(bytes::Bytes::from(std::fs::read(path).map_err(|e| {
                anyhow::anyhow!("--body-file {}: {e}", path.display())
            })?))
        }
        None => None,
    };
    let content_type = match &args.content_type {
        Some(t) => Some(
            hyper::header::HeaderValue::from_str(t)
                .map_err(|_| anyhow::anyhow!("--content-type {t:?} is not a header value"))?,
        ),
        None => None,
    };
    let config = crate::upstream::UpstreamConfig {
        body_bytes: args.body_bytes,
        body,
        content_type,
        latency: Duration::from_secs_f64(args.latency / 1e3),
        jitter: Duration::from_secs_f64(args.jitter / 1e3),
        cpu_ns: (args.cpu_ms * 1e6) as u64,
        error_rate: args.error_rate,
        workers: args.workers,
        hold: Duration::from_secs_f64(args.delay_ms / 1e3),
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(n) = args.threads {
        builder.worker_threads(n.max(1));
    }
    let rt = builder.build()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("--listen {}", args.listen))?;
        let addr = listener.local_addr()?;
        println!("listening on {addr}");
        std::io::stdout().flush()?;
        crate::upstream::serve(listener, config).await?;
        Ok(ExitCode::SUCCESS)
    })
}

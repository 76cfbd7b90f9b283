//! `tailguard run` and `tailguard check`: build the gateway's runtimes from a config and wait
//! for shutdown.
//!
//! The serving runtime's workers only serve traffic. Signals are handled on the main thread
//! (`block_on` runs its future on the calling thread), so a SIGHUP reload reads and parses
//! the file there, off the serving threads, binds any new listener address there too, and
//! swaps the result in with pointer stores (the snapshot, each listener's settings). A config
//! from etcd (`--etcd`, `--bootstrap`) arrives from the watcher thread (`etcd.rs`) and is
//! applied on the main thread through that same path.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tailguard_config::Config;
use tailguard_metrics::{
    Exporter, ExporterConfig, Listen, MetricsConfig, Page, Pages, Priority, Registry,
};
use tailguard_proxy::{Error, GatewayMetrics, Server};
use tailguard_status::StatusPage;
use tokio::signal::unix::{SignalKind, signal};

use crate::apply::apply;
use crate::etcd::{EtcdSource, StartDocument};
use crate::etcd_cache::CacheSetting;

/// Exit status for a config the user must fix (sysexits.h `EX_USAGE`).
pub(crate) const EX_USAGE: u8 = 64;
/// Exit status when the config's etcd cannot be read at start, or refuses this node (TLS,
/// authentication), for `run` and `config get`/`push` (sysexits.h `EX_UNAVAILABLE`).
pub(crate) const EX_UNAVAILABLE: u8 = 69;

/// Arguments of `tailguard run`.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// Config file (TOML). Without it (and without etcd) the embedded default config is used.
    #[arg(long, short, conflicts_with_all = ["endpoints", "bootstrap"])]
    config: Option<PathBuf>,
    /// The config from etcd instead of a file, watched and applied as it changes.
    #[command(flatten)]
    etcd: crate::bootstrap::EtcdArgs,
    /// With a config from etcd: the file each applied revision is kept in, served by a start
    /// that cannot reach etcd (`""`: no cache; overrides `[etcd] cache`). Default: a file
    /// named after the key in $STATE_DIRECTORY, else /var/lib/tailguard.
    // A String, not a PathBuf: clap refuses an empty path, and `""` is meaningful here.
    #[arg(long, value_name = "PATH")]
    etcd_cache: Option<String>,
    /// Replace the first listener's address (e.g. 127.0.0.1:0 for any free port).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Serving threads, each with its own runtime and listening socket (default: number of
    /// cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Replace the endpoints of upstream NAME: NAME=ADDR[,ADDR...] (repeatable).
    #[arg(long, value_name = "NAME=ADDR[,ADDR...]", value_parser = parse_upstream)]
    upstream: Vec<(String, Vec<SocketAddr>)>,
    /// Write an access log to FILE (`-` for stdout), for every listener.
    // Repeating an access-log flag is allowed; the last one wins (scripts append flags).
    #[arg(long, value_name = "FILE|-", overrides_with = "access_log")]
    access_log: Option<String>,
    /// Access log format.
    #[arg(
        long,
        value_name = "combined|json",
        value_parser = parse_log_format,
        overrides_with = "access_log_format"
    )]
    access_log_format: Option<tailguard_access_log::FormatName>,
    /// Access log buffer per serving thread, in bytes (default 65536).
    #[arg(long, value_name = "BYTES", overrides_with = "access_log_buffer")]
    access_log_buffer: Option<usize>,
    /// Address of the metrics exporter (path /metrics), or `off` (overrides
    /// `[metrics] listen`). Default 127.0.0.1:9091; if that is taken, the gateway runs
    /// without an exporter and says so.
    #[arg(long, value_name = "ADDR|off")]
    metrics_listen: Option<String>,
    /// Scheduling priority of the exporter thread: normal, idle (SCHED_IDLE) or nice:N;
    /// default idle (overrides `[metrics] priority`).
    #[arg(long, value_parser = parse_priority)]
    metrics_priority: Option<Priority>,
    /// CPUs the exporter thread may run on, e.g. `0` or `0,2` (overrides `[metrics] cpus`;
    /// default: any). A core without a serving thread keeps scrapes off the serving caches.
    #[arg(long, value_delimiter = ',')]
    metrics_cpus: Option<Vec<usize>>,
    /// Register N extra series shaped like APISIX's metrics (counters and histograms in
    /// its proportion), updated by every request, so scrapes carry that many series
    /// (overrides `[metrics] synthetic_series`).
    #[arg(long, value_name = "N")]
    synthetic_series: Option<usize>,
    /// Overload protection: off, adaptive, or gozero (go-zero's formulas, for A/B runs);
    /// overrides `[overload] mode`.
    #[arg(long, value_name = "off|adaptive|gozero", value_parser = parse_overload_mode)]
    overload: Option<tailguard_overload::OverloadMode>,
    /// In-flight requests per client address, 0 for no limit; overrides `[limits]
    /// client_requests` (a load generator stands for many clients from one address).
    #[arg(long, value_name = "N")]
    client_requests: Option<u32>,
}

/// `--overload off|adaptive|gozero`.
fn parse_overload_mode(s: &str) -> Result<tailguard_overload::OverloadMode, String> {
    tailguard_overload::OverloadMode::parse(s).map_err(|e| e.to_string())
}

fn parse_priority(s: &str) -> Result<Priority, String> {
    s.parse()
}

fn parse_log_format(s: &str) -> Result<tailguard_access_log::FormatName, String> {
    match s {
        "combined" => Ok(tailguard_access_log::FormatName::Combined),
        "json" => Ok(tailguard_access_log::FormatName::Json),
        _ => Err("expected `combined` or `json`".into()),
    }
}

/// Arguments of `tailguard check`.
#[derive(Debug, clap::Args)]
pub(crate) struct CheckArgs {
    /// Config file (TOML) to validate.
    #[arg(long, short)]
    config: PathBuf,
}

fn parse_upstream(s: &str) -> Result<(String, Vec<SocketAddr>), String> {
    let (name, addrs) = s.split_once('=').ok_or("expected NAME=ADDR[,ADDR...]")?;
    let addrs = addrs
        .split(',')
        .map(|a| {
            a.trim()
                .parse::<SocketAddr>()
                .map_err(|_| format!("`{a}` is not an IP:PORT address"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if name.is_empty() || addrs.is_empty() {
        return Err("expected NAME=ADDR[,ADDR...]".into());
    }
    Ok((name.to_owned(), addrs))
}

/// Sets up the gateway's own log (stderr). Lines are handed to a writer thread
/// (tracing-appender's non-blocking writer), so a serving thread that logs an error never
/// waits on a slow terminal or pipe (request-path rule 4); when that writer falls behind, lines
/// are dropped rather than stalling requests. The guard flushes what is queued when dropped.
fn init_logging() -> tracing_appender::non_blocking::WorkerGuard {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (writer, guard) = tracing_appender::non_blocking(std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    guard
}

/// Loads the config the run arguments name and applies the command-line overrides.
fn load(args: &RunArgs) -> Result<Config, Error> {
    let config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::embedded_default(),
    };
    with_overrides(config, args)
}

/// Applies the command-line overrides to a config, from a file or from etcd alike.
fn with_overrides(mut config: Config, args: &RunArgs) -> Result<Config, Error> {
    if let Some(addr) = args.listen {
        config.override_listen(addr);
    }
    for (name, addrs) in &args.upstream {
        config.override_upstream(name, addrs)?;
    }
    config.override_access_log(
        args.access_log.as_deref(),
        args.access_log_format,
        args.access_log_buffer,
    )?;
    if let Some(mode) = args.overload {
        config.override_overload(mode);
    }
    if let Some(n) = args.client_requests {
        config.limits.client_requests = n;
    }
    Ok(config)
}

pub(crate) fn print_errors(err: &Error) {
    match err {
        Error::Config(diags) => {
            for d in diags {
                eprintln!("{d}");
            }
            eprintln!(
                "{} error{} in config",
                diags.len(),
                if diags.len() == 1 { "" } else { "s" }
            );
        }
        other => eprintln!("{other}"),
    }
}

pub(crate) fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let _log_writer = init_logging();
    let registry = Registry::builder()
        .self_metrics_prefix(Some("tailguard_metrics"))
        .build()?;
    let (config, mut etcd) = match start_etcd(&args, &registry) {
        Ok(Some((source, config))) => (Ok(config), Some(source)),
        Ok(None) => (load(&args), None),
        Err(code) => return Ok(code),
    };
    let config = match config {
        Ok(c) => c,
        Err(e) => {
            print_errors(&e);
            return Ok(ExitCode::from(EX_USAGE));
        }
    };
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
        .max(1);
    // The main thread's own small runtime: signals, reloads and the drain wait. The serving
    // threads (each with its own runtime) are started by `Server::start`.
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the control runtime")?;
    let metrics = GatewayMetrics::register(&registry)?;
    let synthetic = args
        .synthetic_series
        .unwrap_or(config.metrics.synthetic_series);
    if synthetic > 0 {
        let n = metrics.add_synthetic_series(synthetic)?;
        tracing::info!("tailguard: registered {n} synthetic series");
    }
    let status = status_page(&config, &registry, threads)?;
    let _exporter = start_exporter(&args, &config.metrics, registry, status.clone())?;
    control.block_on(async {
        // Handlers first: a SIGHUP that arrives once the listening line is out must reload,
        // not kill the process.
        let signals = Signals::register()?;
        let server = Server::start_with_metrics(config, metrics, threads)?;
        if let Some(page) = &status {
            page.attach(server.gateway());
        }
        if let Some(source) = &mut etcd {
            source.started();
        }
        wait_for_signals(server, signals, &args, etcd).await
    })?;
    Ok(ExitCode::SUCCESS)
}

/// With `--etcd` or `--bootstrap`: starts the watcher and parses the key's current document
/// (`Ok(None)` without them; `Err` is the exit status after the reason was printed).
fn start_etcd(
    args: &RunArgs,
    registry: &Registry,
) -> Result<Option<(EtcdSource, Config)>, ExitCode> {
    let mut settings = match args.etcd.settings() {
        Ok(Some(s)) => s,
        Ok(None) if args.etcd_cache.is_some() => {
            eprintln!("command line: --etcd-cache: needs --etcd and --etcd-key, or --bootstrap");
            return Err(ExitCode::from(EX_USAGE));
        }
        Ok(None) => return Ok(None),
        Err(e) => {
            print_errors(&e);
            return Err(ExitCode::from(EX_USAGE));
        }
    };
    if let Some(path) = &args.etcd_cache {
        settings.cache = CacheSetting::from_path(PathBuf::from(path));
    }
    let (source, document) = match EtcdSource::start(settings, registry) {
        Ok(started) => started,
        Err(e) => {
            eprintln!("tailguard: {e:#}");
            return Err(ExitCode::from(EX_UNAVAILABLE));
        }
    };
    let name = source.source_name(source.revision());
    let (parsed, loaded) = match document {
        StartDocument::Etcd(Ok(text)) => (
            Config::parse(&text, &name, source.base_dir()),
            format!("loaded {name}"),
        ),
        StartDocument::Etcd(Err(e)) => {
            eprintln!("{name}: (document): not UTF-8 text: {e}");
            return Err(ExitCode::from(EX_USAGE));
        }
        // Its errors name the cache file, whose lines they number.
        StartDocument::Cached { path, text, why } => (
            Config::parse(&text, &path.display().to_string(), source.base_dir()),
            format!(
                "loaded {name} (cached) from {}; {why}; following etcd once it answers",
                path.display()
            ),
        ),
    };
    match parsed
        .map_err(Error::from)
        .and_then(|c| with_overrides(c, args))
    {
        Ok(config) => {
            tracing::info!("tailguard: {loaded}");
            Ok(Some((source, config)))
        }
        Err(e) => {
            print_errors(&e);
            Err(ExitCode::from(EX_USAGE))
        }
    }
}

/// The status page (`[status]`), served by the exporter; `None` when disabled. Its token or
/// htpasswd file is read here (the config's check read it too, so a failure now means the
/// file changed since).
fn status_page(
    config: &Config,
    registry: &Registry,
    threads: usize,
) -> anyhow::Result<Option<Arc<StatusPage>>> {
    if !config.status.enabled {
        return Ok(None);
    }
    let access = config
        .status
        .access()
        .map_err(|(_, field, message)| anyhow::anyhow!("{field}: {message}"))?;
    let info = tailguard_status::Info {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        threads,
        started: std::time::Instant::now(),
    };
    Ok(Some(StatusPage::new(registry.clone(), info, access)))
}

/// Starts the metrics exporter on its own thread (never on the serving runtime), with the
/// status page if there is one.
fn start_exporter(
    args: &RunArgs,
    section: &MetricsConfig,
    registry: Registry,
    status: Option<Arc<StatusPage>>,
) -> anyhow::Result<Option<Exporter>> {
    // The command line wins over the config file; the config was validated at load.
    let from_config = section.listen().ok().flatten();
    let explicit = match args.metrics_listen.as_deref() {
        Some("off") => Some(Listen::Off),
        Some(addr) => Some(Listen::At(addr.parse().with_context(|| {
            format!("--metrics-listen {addr:?}: expected IP:PORT or off")
        })?)),
        None => from_config,
    };
    let listen = match explicit {
        Some(Listen::Off) => return Ok(None),
        Some(Listen::At(addr)) => addr,
        None => ExporterConfig::default().listen,
    };
    let with_status = status.is_some();
    let config = ExporterConfig {
        listen,
        priority: args
            .metrics_priority
            .or_else(|| section.priority().ok().flatten())
            .unwrap_or_default(),
        cpus: args
            .metrics_cpus
            .clone()
            .unwrap_or_else(|| section.cpus.clone()),
        pages: Pages(
            status
                .into_iter()
                .map(|page| -> Arc<dyn Page> { page })
                .collect(),
        ),
        ..ExporterConfig::default()
    };
    match Exporter::spawn(registry, config) {
        Ok(exporter) => {
            tracing::info!(
                "tailguard: metrics on http://{}/metrics",
                exporter.local_addr()
            );
            if with_status {
                tracing::info!(
                    "tailguard: status page on http://{}/status",
                    exporter.local_addr()
                );
            }
            Ok(Some(exporter))
        }
        // The default port may be taken (another gateway, a test): serve traffic anyway.
        Err(e) if explicit.is_none() => {
            tracing::warn!("tailguard: {e}; running without a metrics exporter");
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

struct Signals {
    hup: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
}

impl Signals {
    fn register() -> anyhow::Result<Signals> {
        Ok(Signals {
            hup: signal(SignalKind::hangup()).context("SIGHUP handler")?,
            term: signal(SignalKind::terminate()).context("SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("SIGINT handler")?,
            usr1: signal(SignalKind::user_defined1()).context("SIGUSR1 handler")?,
        })
    }
}

async fn wait_for_signals(
    server: Server,
    signals: Signals,
    args: &RunArgs,
    mut etcd: Option<EtcdSource>,
) -> anyhow::Result<()> {
    let Signals {
        mut hup,
        mut term,
        mut int,
        mut usr1,
    } = signals;
    loop {
        tokio::select! {
            _ = hup.recv() => match &mut etcd {
                Some(source) => source.resync(),
                None => reload(&server, args),
            },
            update = next_update(&mut etcd) => if let Some(source) = &mut etcd {
                source.apply(&server, update, |text, name, base| {
                    Config::parse(text, name, base)
                        .map_err(Error::from)
                        .and_then(|c| with_overrides(c, args))
                });
            },
            _ = usr1.recv() => server.reopen_access_logs(),
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    let deadline = server.gateway().snapshot().config.timeouts.shutdown_ms;
    tracing::info!("tailguard: shutting down, draining in-flight requests for up to {deadline} ms");
    if server.shutdown(Duration::from_millis(deadline)).await {
        tracing::info!("tailguard: drained, exiting");
    } else {
        tracing::warn!("tailguard: drain deadline reached with requests in flight, exiting");
    }
    Ok(())
}

/// The etcd source's next update; never resolves without one.
async fn next_update(etcd: &mut Option<EtcdSource>) -> crate::etcd::Update {
    match etcd {
        Some(source) => source.next().await,
        None => std::future::pending().await,
    }
}

fn reload(server: &Server, args: &RunArgs) {
    let name = args.config.as_deref().map_or_else(
        || "<embedded default config>".to_owned(),
        |p| p.display().to_string(),
    );
    apply(server, &name, "the running config", load(args));
}

pub(crate) fn check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    match Config::load(&args.config).map_err(Error::from) {
        Ok(config) => {
            println!(
                "{}: ok ({} listeners, {} upstreams, {} routes)",
                display(&args.config),
                config.listeners.len(),
                config.upstreams.len(),
                config.routes.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            print_errors(&e);
            Ok(ExitCode::from(EX_USAGE))
        }
    }
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

//! The gateway's access log: one log per listener, started with the server, fed from the
//! finish seam, reopened on SIGUSR1, drained at shutdown.
//!
//! The logs live outside the config snapshot: like listeners, they are set up once when the
//! server starts (a reload that changes `[access_log]` is reported and needs a restart), so a
//! reload never restarts a writer thread or loses a buffered line. Each connection holds its
//! listener's [`AccessLog`] handle, so logging a request touches no reference count shared by
//! serving threads.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderValue, Version};
use tailguard_access_log::{
    AccessLog, Config as LogConfig, FormatName, LogMetrics, Metrics, Output, Record, Reopener,
    Stats, Writer,
};

use crate::config::{Config, Diagnostic};
use crate::error::Error;
use crate::gateway::Snapshot;
use crate::record::RequestRecord;

/// How long a stop waits for the writers to write and fsync: 5 s covers a healthy disk with
/// every buffer full (32 x 64 KiB) many times over; past it the disk is stalled, and the
/// process exits rather than hang (the lines still held are reported).
const DRAIN_DEADLINE: Duration = Duration::from_secs(5);

/// The running access logs of a server: one handle per listener (listeners with the same
/// settings share one log and one writer thread).
#[derive(Debug)]
pub struct AccessLogs {
    per_listener: Vec<AccessLog>,
    configs: Vec<LogConfig>,
    writers: Vec<Writer>,
}

/// The settings a listener logs with: its own `access_log` table, else the top-level one.
fn effective(config: &Config) -> Vec<&LogConfig> {
    config
        .listeners
        .iter()
        .map(|l| l.access_log.as_ref().unwrap_or(&config.access_log))
        .collect()
}

/// Config checks, as `(field, message)` pairs for the config's diagnostics.
pub(crate) fn check(config: &Config) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    if let Err(e) = config.access_log.validate() {
        problems.push(("access_log".to_owned(), e.to_string()));
    }
    for (i, l) in config.listeners.iter().enumerate() {
        if let Some(own) = &l.access_log
            && let Err(e) = own.validate()
        {
            problems.push((format!("listeners[{i}].access_log"), e.to_string()));
        }
    }
    // One file, one writer: two listeners may share a path only with the same settings.
    let logs = effective(config);
    for (i, a) in logs.iter().enumerate() {
        if let Output::File(path) = &a.path
            && let Some(j) = logs[..i].iter().position(|b| b.path == a.path && b != a)
        {
            problems.push((
                format!("listeners[{i}].access_log"),
                format!(
                    "{} is also the access log of listeners[{j}], with different settings",
                    path.display()
                ),
            ));
        }
    }
    problems
}

impl Config {
    /// Applies `tailguard run --access-log FILE|- [--access-log-format F]
    /// [--access-log-buffer BYTES]`: sets the top-level `[access_log]` and makes every
    /// listener use it.
    pub fn override_access_log(
        &mut self,
        path: Option<&str>,
        format: Option<FormatName>,
        buffer_size: Option<usize>,
    ) -> Result<(), Error> {
        if path.is_none() && format.is_none() && buffer_size.is_none() {
            return Ok(());
        }
        let log = &mut self.access_log;
        if let Some(p) = path {
            log.path = Output::parse(p);
        }
        if let Some(f) = format {
            log.format = Some(f);
            log.template = None;
        }
        if let Some(b) = buffer_size {
            log.buffer_size = b;
        }
        log.validate().map_err(|e| cli_error("--access-log", e))?;
        for l in &mut self.listeners {
            l.access_log = None;
        }
        Ok(())
    }
}

fn cli_error(field: &str, e: impl std::fmt::Display) -> Error {
    Error::Config(vec![Diagnostic {
        file: "command line".to_owned(),
        position: None,
        field: field.to_owned(),
        message: e.to_string(),
    }])
}

impl AccessLogs {
    /// Opens every configured log and starts its writer; with `metrics`, each log counts
    /// into series labelled by its path (`-` for stdout).
    pub fn start(config: &Config, metrics: Option<&Metrics>) -> Result<AccessLogs, Error> {
        let mut configs: Vec<LogConfig> = Vec::new();
        let mut logs: Vec<AccessLog> = Vec::new();
        let mut writers = Vec::new();
        let mut per_listener = Vec::new();
        for (i, c) in effective(config).into_iter().enumerate() {
            if let Some(k) = configs.iter().position(|known| known == c) {
                per_listener.push(logs[k].clone());
                continue;
            }
            let name = match &c.path {
                Output::Off => "off".to_owned(),
                Output::Stdout => "-".to_owned(),
                Output::File(p) => resolve(config, p).display().to_string(),
            };
            let exported = match metrics {
                Some(m) if !matches!(c.path, Output::Off) => {
                    Some(m.log(&name).map_err(|e| cli_error("access_log", e))?)
                }
                _ => None::<LogMetrics>,
            };
            let mut resolved = c.clone();
            if let Output::File(p) = &c.path {
                resolved.path = Output::File(resolve(config, p));
            }
            let field = match config.listeners[i].access_log {
                Some(_) => format!("listeners[{i}].access_log"),
                None => "access_log".to_owned(),
            };
            let (log, writer) = AccessLog::start_with_metrics(&resolved, exported)
                .map_err(|e| Error::Config(vec![diag(config, field, e)]))?;
            if !matches!(c.path, Output::Off) {
                tracing::info!("tailguard: access log {name}");
            }
            configs.push(c.clone());
            logs.push(log.clone());
            writers.push(writer);
            per_listener.push(log);
        }
        Ok(AccessLogs {
            per_listener,
            configs,
            writers,
        })
    }

    /// The log of listener `i` (in config order).
    pub fn for_listener(&self, i: usize) -> AccessLog {
        self.per_listener
            .get(i)
            .cloned()
            .unwrap_or_else(AccessLog::off)
    }

    /// Handles that reopen every log file (for SIGUSR1).
    pub fn reopeners(&self) -> Vec<Reopener> {
        self.writers.iter().map(Writer::reopener).collect()
    }

    /// Reports a reload whose access log settings differ: they apply after a restart.
    pub fn warn_if_changed(&self, config: &Config) {
        let wanted: Vec<&LogConfig> = effective(config);
        let changed = wanted.iter().any(|w| !self.configs.iter().any(|c| c == *w));
        if changed {
            tracing::warn!("reload: access log changes need a restart; keeping the running logs");
        }
    }

    /// Writes every buffered line of every log and fsyncs; call after the last request.
    pub fn shutdown(self) -> Vec<Stats> {
        self.writers
            .into_iter()
            .map(|w| {
                let stats = w.shutdown_within(DRAIN_DEADLINE);
                if stats.lines_written + stats.dropped_lines + stats.write_errors > 0 {
                    tracing::info!(
                        lines = stats.lines_written,
                        dropped = stats.dropped_lines,
                        lost = stats.lost_lines,
                        write_errors = stats.write_errors,
                        "tailguard: access log flushed"
                    );
                }
                stats
            })
            .collect()
    }
}

/// Relative log paths are relative to the config file, like certificate paths.
fn resolve(config: &Config, path: &std::path::Path) -> PathBuf {
    if path.is_absolute() {
        path.to_owned()
    } else {
        config.base_dir.join(path)
    }
}

fn diag(config: &Config, field: String, e: impl std::fmt::Display) -> Diagnostic {
    Diagnostic {
        file: config.source.clone(),
        position: None,
        field,
        message: e.to_string(),
    }
}

fn protocol(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP/1.1",
    }
}

/// Appends the finished request to `log` (nothing at all when the log is off).
pub(crate) fn log(log: &AccessLog, r: &RequestRecord, snapshot: &Snapshot, end: Instant) {
    log.log_with(|| Record {
        time: SystemTime::now(),
        remote_addr: Some(r.remote.ip()),
        remote_user: None,
        method: r.method.as_str().as_bytes(),
        target: r
            .uri
            .path_and_query()
            .map_or(b"/".as_slice(), |pq| pq.as_str().as_bytes()),
        protocol: protocol(r.version),
        status: r.status,
        body_bytes_sent: r.bytes_out,
        // The response head is not counted yet; see docs/access-log.md.
        bytes_sent: r.bytes_out,
        request_time: end.duration_since(r.start),
        upstream_addr: r
            .endpoint
            .and_then(|(u, e)| Some(snapshot.upstreams.get(u)?.endpoints.get(e)?.addr)),
        upstream_status: r.upstream_status,
        upstream_response_time: r.upstream_time,
        referer: r.referer.as_ref().map(HeaderValue::as_bytes),
        user_agent: r.user_agent.as_ref().map(HeaderValue::as_bytes),
        route: r.route.map(|i| &*snapshot.router.get(i).id),
        request_id: r.request_id.as_ref().map(HeaderValue::as_bytes),
        error: r.error,
        headers: None,
    });
}

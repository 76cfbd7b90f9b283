//! The gateway's access log: one log per listener, started with the server, fed from the
//! finished request's record, reopened on SIGUSR1, drained at shutdown.
//!
//! The logs live outside the config snapshot, in the server: a reload keeps every running
//! log whose settings did not change (never restarting a writer thread or losing a buffered
//! line), starts one for settings no running log has (a listener added with its own file),
//! and keeps the running writer of a file whose settings changed (reported: two writers must
//! not interleave one file, so those need a restart). Each connection holds its listener's
//! [`AccessLog`] handle, so logging a request touches no reference count shared by serving
//! threads.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderValue, Version};
use tailguard_access_log::{
    AccessLog, Config as LogConfig, LogMetrics, Metrics, Output, Record, Reopener, Stats, Writer,
};
use tailguard_config::{Config, Diagnostic};
use tailguard_http::error::Error;
use tailguard_policy::route::Router;
use tailguard_upstream::upstream::Upstream;

use crate::record::RequestRecord;

/// How long a stop waits for the writers to write and fsync: 5 s covers a healthy disk with
/// every buffer full (32 x 64 KiB) many times over; past it the disk is stalled, and the
/// process exits rather than hang (the lines still held are reported).
const DRAIN_DEADLINE: Duration = Duration::from_secs(5);

/// The running access logs of a server: one writer per distinct log settings, shared by
/// every listener that logs with those settings.
#[derive(Debug, Default)]
pub struct AccessLogs {
    /// Each running log with the settings it was started with (paths as written).
    running: Vec<(LogConfig, AccessLog)>,
    /// The writer of each entry of `running`, same order.
    writers: Vec<Writer>,
}

/// The logs of a config's listeners, as [`AccessLogs::attach`] found or started them.
#[derive(Debug)]
pub struct Attached {
    /// The log of each listener, in config order.
    pub per_listener: Vec<AccessLog>,
    /// How many logs were started for it (undone by [`AccessLogs::undo`]).
    pub started: usize,
}

/// The settings a listener logs with: its own `access_log` table, else the top-level one.
fn effective(config: &Config) -> Vec<&LogConfig> {
    tailguard_config::access_log::effective(&config.access_log, &config.listeners)
}

impl AccessLogs {
    /// Opens every configured log and starts its writer; with `metrics`, each log counts
    /// into series labelled by its path (`-` for stdout). Returns the running logs and the
    /// log of each listener.
    pub fn start(
        config: &Config,
        metrics: Option<&Metrics>,
    ) -> Result<(AccessLogs, Vec<AccessLog>), Error> {
        let mut logs = AccessLogs::default();
        let attached = logs.attach(config, metrics)?;
        Ok((logs, attached.per_listener))
    }

    /// The log of each listener of `config` (a startup or a reload): the running log with
    /// the same settings; else, when a running log already writes to the same file (or
    /// stdout) with other settings, that one, with a warning (two writers must not
    /// interleave one file; the new settings need a restart); else a newly started log.
    /// A failure stops what this call started, so nothing is left half-applied.
    pub fn attach(
        &mut self,
        config: &Config,
        metrics: Option<&Metrics>,
    ) -> Result<Attached, Error> {
        let mut per_listener = Vec::new();
        let mut started = 0;
        for (i, c) in effective(config).into_iter().enumerate() {
            let same = self.running.iter().position(|(known, _)| known == c);
            let same_output = || {
                self.running
                    .iter()
                    .position(|(known, _)| known.path == c.path && !matches!(c.path, Output::Off))
            };
            if let Some(k) = same {
                per_listener.push(self.running[k].1.clone());
                continue;
            }
            if let Some(k) = same_output() {
                tracing::warn!(
                    "reload: access log settings of {} changed; they apply after a restart",
                    output_name(config, &c.path)
                );
                per_listener.push(self.running[k].1.clone());
                continue;
            }
            match start_one(config, i, c, metrics) {
                Ok((log, writer)) => {
                    self.running.push((c.clone(), log.clone()));
                    self.writers.push(writer);
                    started += 1;
                    per_listener.push(log);
                }
                Err(e) => {
                    self.undo(started);
                    return Err(e);
                }
            }
        }
        Ok(Attached {
            per_listener,
            started,
        })
    }

    /// Stops the `started` logs the last [`AccessLogs::attach`] started (its reload failed
    /// later): nothing was logged to them yet.
    pub fn undo(&mut self, started: usize) {
        for _ in 0..started {
            self.running.pop();
            if let Some(w) = self.writers.pop() {
                let _ = w.shutdown_within(DRAIN_DEADLINE);
            }
        }
    }

    /// Handles that reopen every log file (for SIGUSR1).
    pub fn reopeners(&self) -> Vec<Reopener> {
        self.writers.iter().map(Writer::reopener).collect()
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

/// How a log is named in messages and metric labels: its resolved path, `-` or `off`.
fn cli_error(field: &str, e: impl std::fmt::Display) -> Error {
    Error::Config(vec![tailguard_config::diagnostic::command_line(
        field,
        e.to_string(),
    )])
}

fn output_name(config: &Config, path: &Output) -> String {
    match path {
        Output::Off => "off".to_owned(),
        Output::Stdout => "-".to_owned(),
        Output::File(p) => resolve(config, p).display().to_string(),
    }
}

/// Opens listener `i`'s log `c` and starts its writer.
fn start_one(
    config: &Config,
    i: usize,
    c: &LogConfig,
    metrics: Option<&Metrics>,
) -> Result<(AccessLog, Writer), Error> {
    let name = output_name(config, &c.path);
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
    let started = AccessLog::start_with_metrics(&resolved, exported)
        .map_err(|e| Error::Config(vec![diag(config, field, e)]))?;
    if !matches!(c.path, Output::Off) {
        tracing::info!("tailguard: access log {name}");
    }
    Ok(started)
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

/// Appends the finished request to `log` (nothing at all when the log is off); its route
/// and endpoint are looked up by index in the snapshot's `router` and `upstreams`.
pub(crate) fn log<B>(
    log: &AccessLog,
    r: &RequestRecord,
    router: &Router,
    upstreams: &[Upstream<B>],
    end: Instant,
) {
    log.log_with(|| {
        let ids = r.trace_ids();
        Record {
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
                .and_then(|(u, e)| Some(upstreams.get(u)?.endpoints.get(e)?.addr)),
            earlier_tries: &r.earlier_tries,
            upstream_status: r.upstream_status,
            upstream_response_time: r.upstream_time,
            referer: r.referer.as_ref().map(HeaderValue::as_bytes),
            user_agent: r.user_agent.as_ref().map(HeaderValue::as_bytes),
            route: r.route.map(|i| &*router.get(i).id),
            request_id: r.request_id.as_ref().map(HeaderValue::as_bytes),
            error: r.error,
            headers: None,
            grpc_status: r.grpc_status,
            trace_id: ids.map(|(trace, _)| trace),
            span_id: ids.map(|(_, span)| span),
            consumer: r.consumer.as_deref(),
            auth_result: r.auth_result.map(tailguard_auth::AuthResult::as_str),
        }
    });
}

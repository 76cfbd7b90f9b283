//! The whole config as loaded ([`Config`]), and what the command line may change in it
//! (`tailguard run --listen`, `--upstream`, `--overload`, `--access-log`).

use std::net::SocketAddr;
use std::path::PathBuf;

use tailguard_access_log::{FormatName, Output};
use toml::Spanned;

use crate::cidr::Cidr;
use crate::diagnostic::{self, Diagnostic};
use crate::dns::DnsConfig;
use crate::error::Error;
use crate::limits::{Limits, Timeouts};
use crate::listener::ListenerConfig;
use crate::route::RouteConfig;
use crate::trace::{Tracing, TracingConfig};
use crate::upstream::{self, EndpointConfig, UpstreamConfig};

/// A validated config. Only [`Config::parse`] and [`Config::load`] make one, so every
/// `Config` has passed every check.
#[derive(Debug, Clone)]
pub struct Config {
    /// Name used in messages (the file path).
    pub source: String,
    /// Directory relative paths (certificates) are resolved against.
    pub base_dir: PathBuf,
    /// Listening sockets (at least one).
    pub listeners: Vec<ListenerConfig>,
    /// Upstreams.
    pub upstreams: Vec<UpstreamConfig>,
    /// Routes, in file order.
    pub routes: Vec<RouteConfig>,
    /// Authenticators (`[[auth]]`), in file order.
    pub auth: Vec<crate::auth::AuthConfig>,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// Limits.
    pub limits: Limits,
    /// The access log of every listener without its own (`[access_log]`; off by default).
    pub access_log: tailguard_access_log::Config,
    /// The metrics exporter (`[metrics]`; read at startup, a reload does not move it).
    pub metrics: tailguard_metrics::MetricsConfig,
    /// The status page on the metrics listener (`[status]`; read at startup like
    /// `[metrics]`).
    pub status: crate::status::StatusConfig,
    /// Overload protection (`[overload]`).
    pub overload: tailguard_overload::OverloadConfig,
    /// Peers whose `X-Forwarded-For`, `Forwarded` and `X-Real-IP` are kept (the gateway's
    /// own values appended); from anyone else they are dropped (`trusted_proxies`).
    pub trusted_proxies: Vec<Cidr>,
    /// How endpoint names are resolved (`[dns]`).
    pub dns: DnsConfig,
    /// The Redis that `scope = "global"` rate limits are shared through (`[redis]`).
    pub redis: Option<crate::redis::RedisConfig>,
    /// `[tracing]` as written.
    pub tracing_file: TracingConfig,
    /// Tracing as it runs (`[tracing]` with the `OTEL_*` variables); `None`: off.
    pub tracing: Option<Tracing>,
    /// Where each listener's address came from, for errors found after parsing (a reload
    /// that cannot bind): its line and column in the file, or the `--listen` override.
    pub(crate) listen_origins: Vec<ListenOrigin>,
}

/// Where a listener's address was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListenOrigin {
    /// In the file, at this line and column.
    File(Option<(usize, usize)>),
    /// `tailguard run --listen`.
    CommandLine,
}

impl Config {
    /// Sets the overload mode (`tailguard run --overload off|adaptive|gozero`).
    pub fn override_overload(&mut self, mode: tailguard_overload::OverloadMode) {
        self.overload.mode = mode;
    }

    /// Replaces the first listener's address (`tailguard run --listen`).
    pub fn override_listen(&mut self, addr: SocketAddr) {
        if let Some(first) = self.listeners.first_mut() {
            first.address = Spanned::new(0..0, addr.to_string());
        }
        if let Some(first) = self.listen_origins.first_mut() {
            *first = ListenOrigin::CommandLine;
        }
    }

    /// A problem with listener `i`'s address found after parsing (it cannot be bound),
    /// reported like the parser's own: file, line and column, field; or `command line`,
    /// `--listen` when the address came from there.
    pub fn listener_diagnostic(&self, i: usize, message: impl Into<String>) -> Diagnostic {
        match self.listen_origins.get(i) {
            Some(ListenOrigin::CommandLine) => diagnostic::command_line("--listen", message),
            other => Diagnostic {
                file: self.source.clone(),
                position: match other {
                    Some(ListenOrigin::File(p)) => *p,
                    _ => None,
                },
                field: format!("listeners[{i}].address"),
                message: message.into(),
            },
        }
    }

    /// Replaces the endpoints of upstream `name` (`tailguard run --upstream NAME=ADDR,...`),
    /// each with weight 1.
    pub fn override_upstream(&mut self, name: &str, addrs: &[SocketAddr]) -> Result<(), Error> {
        let Some(u) = self.upstreams.iter_mut().find(|u| u.name.get_ref() == name) else {
            return Err(Error::Config(vec![diagnostic::command_line(
                "--upstream",
                format!("no upstream named `{name}` in {}", self.source),
            )]));
        };
        u.builtin = None;
        u.endpoints = addrs
            .iter()
            .map(|a| EndpointConfig {
                address: Spanned::new(0..0, a.to_string()),
                weight: upstream::default_weight(),
            })
            .collect();
        Ok(())
    }

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
        log.validate().map_err(|e| {
            Error::Config(vec![diagnostic::command_line(
                "--access-log",
                e.to_string(),
            )])
        })?;
        for l in &mut self.listeners {
            l.access_log = None;
        }
        Ok(())
    }
}

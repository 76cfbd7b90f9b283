//! The `[metrics]` section of a config file: where the exporter listens, at which priority,
//! and how many synthetic series to add.

use std::net::SocketAddr;

use crate::Priority;

/// `[metrics]`: every field optional.
///
/// ```toml
/// [metrics]
/// listen = "127.0.0.1:9091"   # or "off"
/// priority = "idle"           # normal | idle | nice:N
/// cpus = [0]                  # CPUs the exporter thread may use (default: any)
/// synthetic_series = 100000   # extra APISIX-shaped series, for scrape benchmarks
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Exporter address (`IP:PORT`) or `off`; unset means `127.0.0.1:9091`.
    pub listen: Option<String>,
    /// Exporter thread priority: `normal`, `idle` or `nice:N`; unset means `idle`
    /// (`SCHED_IDLE`).
    pub priority: Option<String>,
    /// Extra synthetic series to register (0: none).
    pub synthetic_series: usize,
    /// CPUs the exporter thread may run on; empty: any the process may use.
    pub cpus: Vec<usize>,
}

/// Where the exporter should listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    /// Not at all.
    Off,
    /// At this address.
    At(SocketAddr),
}

impl MetricsConfig {
    /// The listen setting, parsed; `None` when unset.
    pub fn listen(&self) -> Result<Option<Listen>, String> {
        match self.listen.as_deref() {
            None => Ok(None),
            Some("off") => Ok(Some(Listen::Off)),
            Some(addr) => addr
                .parse()
                .map(|a| Some(Listen::At(a)))
                .map_err(|_| format!("`{addr}` is not an IP:PORT address or `off`")),
        }
    }

    /// The priority setting, parsed; `None` when unset.
    pub fn priority(&self) -> Result<Option<Priority>, String> {
        self.priority.as_deref().map(str::parse).transpose()
    }

    /// Every problem, as (field, message) pairs.
    pub fn check(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        if let Err(e) = self.listen() {
            problems.push(("metrics.listen".to_owned(), e));
        }
        if let Err(e) = self.priority() {
            problems.push(("metrics.priority".to_owned(), e));
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_checks() {
        let ok = MetricsConfig {
            listen: Some("127.0.0.1:9100".into()),
            priority: Some("nice:10".into()),
            synthetic_series: 5,
            cpus: vec![0],
        };
        assert!(ok.check().is_empty());
        assert_eq!(
            ok.listen().unwrap(),
            Some(Listen::At("127.0.0.1:9100".parse().unwrap()))
        );
        assert_eq!(ok.priority().unwrap(), Some(Priority::Nice(10)));
        let bad = MetricsConfig {
            listen: Some("localhost".into()),
            priority: Some("high".into()),
            synthetic_series: 0,
            cpus: Vec::new(),
        };
        let fields: Vec<String> = bad.check().into_iter().map(|(f, _)| f).collect();
        assert_eq!(fields, ["metrics.listen", "metrics.priority"]);
        assert_eq!(MetricsConfig::default().listen().unwrap(), None);
    }
}

//! Where a node finds its config in etcd: the `--etcd`/`--etcd-key` flags or the small
//! bootstrap file (`--bootstrap FILE`) that says the same, checked with `file:line:col`
//! errors like the config itself.
//!
//! ```toml
//! [etcd]
//! endpoints = ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
//! key = "/tailguard/config"
//! timeout_ms = 5000
//! cache = "/var/lib/tailguard/etcd-config.toml"   # optional; "" turns the cache off
//! ```

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tailguard_proxy::Error;
use tailguard_proxy::config::Diagnostic;
use toml::Spanned;

use crate::etcd_cache::CacheSetting;

/// 5 s: long enough for a loaded etcd to answer across a data centre, short enough that a
/// node that cannot reach it says so before an operator gives up on the start.
const DEFAULT_TIMEOUT_MS: u64 = 5000;

/// Where the config lives in etcd, and how long to wait for it.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Client URLs (`http://host:port`), any of which may answer.
    pub(crate) endpoints: Vec<String>,
    /// The key whose value is the config document (TOML).
    pub(crate) key: String,
    /// Timeout of each connection attempt and request; also how long a start waits for etcd.
    pub(crate) timeout: Duration,
    /// Directory relative certificate paths in the stored config resolve against: the
    /// bootstrap file's, else the working directory. Each node reads them from its own disk.
    pub(crate) base_dir: PathBuf,
    /// Where the last applied revision is kept, for a start while etcd is unreachable.
    pub(crate) cache: CacheSetting,
}

impl Settings {
    /// The "file" a stored document's errors name: `etcd:KEY@REVISION`.
    pub(crate) fn source_name(&self, revision: i64) -> String {
        format!("etcd:{}@{revision}", self.key)
    }
}

/// The etcd flags shared by `run`, `config push` and `config get`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct EtcdArgs {
    /// etcd client URL where the config is stored (e.g. http://127.0.0.1:2379; repeatable or
    /// comma-separated for a cluster); needs --etcd-key.
    #[arg(
        long = "etcd",
        value_name = "URL",
        value_delimiter = ',',
        requires = "etcd_key"
    )]
    pub(crate) endpoints: Vec<String>,
    /// The etcd key whose value is the config document (TOML).
    #[arg(long, value_name = "KEY", requires = "endpoints")]
    pub(crate) etcd_key: Option<String>,
    /// Timeout of each etcd connection attempt and request, in ms (default 5000).
    #[arg(long, value_name = "MS")]
    pub(crate) etcd_timeout_ms: Option<u64>,
    /// Bootstrap file (TOML) naming the etcd endpoints and key, instead of --etcd and
    /// --etcd-key: `[etcd] endpoints = [..], key = "..", timeout_ms = 5000`.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["endpoints", "etcd_key"])]
    pub(crate) bootstrap: Option<PathBuf>,
}

impl EtcdArgs {
    /// The settings these flags name, or `None` when no etcd flag is given.
    pub(crate) fn settings(&self) -> Result<Option<Settings>, Error> {
        if let Some(path) = &self.bootstrap {
            let mut settings = load(path)?;
            if let Some(ms) = self.etcd_timeout_ms {
                settings.timeout = Duration::from_millis(ms);
            }
            return Ok(Some(settings));
        }
        let Some(key) = &self.etcd_key else {
            return Ok(None);
        };
        let mut diags = Vec::new();
        for e in &self.endpoints {
            if let Err(message) = check_endpoint(e) {
                diags.push(command_line("--etcd", message));
            }
        }
        if let Err(message) = check_key(key) {
            diags.push(command_line("--etcd-key", message));
        }
        if !diags.is_empty() {
            return Err(Error::Config(diags));
        }
        Ok(Some(Settings {
            endpoints: self.endpoints.clone(),
            key: key.clone(),
            timeout: Duration::from_millis(self.etcd_timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)),
            base_dir: PathBuf::new(),
            cache: CacheSetting::Default,
        }))
    }
}

fn command_line(flag: &str, message: String) -> Diagnostic {
    Diagnostic {
        file: "command line".to_owned(),
        position: None,
        field: flag.to_owned(),
        message,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    etcd: Spanned<EtcdSection>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EtcdSection {
    endpoints: Spanned<Vec<Spanned<String>>>,
    key: Spanned<String>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    /// The etcd cache file (relative: to the bootstrap file's directory); `""`: none.
    #[serde(default)]
    cache: Option<PathBuf>,
}

/// Reads and checks a bootstrap file.
pub(crate) fn load(path: &Path) -> Result<Settings, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    let name = path.display().to_string();
    let at = |span: Option<Range<usize>>, field: &str, message: String| Diagnostic {
        file: name.clone(),
        position: span.map(|s| line_col(&text, s.start)),
        field: field.to_owned(),
        message,
    };
    let file: File = toml::from_str(&text).map_err(|e| {
        Error::Config(vec![at(
            e.span(),
            "etcd",
            e.message().trim_end().replace('\n', " "),
        )])
    })?;
    let etcd = file.etcd.into_inner();
    let mut diags = Vec::new();
    if etcd.endpoints.get_ref().is_empty() {
        diags.push(at(
            Some(etcd.endpoints.span()),
            "etcd.endpoints",
            "at least one endpoint is required".to_owned(),
        ));
    }
    for (i, e) in etcd.endpoints.get_ref().iter().enumerate() {
        if let Err(message) = check_endpoint(e.get_ref()) {
            diags.push(at(Some(e.span()), &format!("etcd.endpoints[{i}]"), message));
        }
    }
    if let Err(message) = check_key(etcd.key.get_ref()) {
        diags.push(at(Some(etcd.key.span()), "etcd.key", message));
    }
    if !diags.is_empty() {
        return Err(Error::Config(diags));
    }
    let base_dir = path.parent().map(Path::to_owned).unwrap_or_default();
    Ok(Settings {
        endpoints: etcd
            .endpoints
            .into_inner()
            .into_iter()
            .map(Spanned::into_inner)
            .collect(),
        key: etcd.key.into_inner(),
        timeout: Duration::from_millis(etcd.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)),
        cache: etcd.cache.map_or(CacheSetting::Default, |p| {
            CacheSetting::from_path(if p.as_os_str().is_empty() {
                p
            } else {
                base_dir.join(p)
            })
        }),
        base_dir,
    })
}

fn check_endpoint(e: &str) -> Result<(), String> {
    // The client is built without TLS: say so here rather than at the first connection.
    match e.strip_prefix("http://") {
        Some(rest) if !rest.is_empty() => Ok(()),
        _ if e.starts_with("https://") => Err(format!(
            "`{e}`: https endpoints are not supported yet; use http:// (e.g. on a private network)"
        )),
        _ => Err(format!(
            "`{e}` is not an etcd client URL like http://127.0.0.1:2379"
        )),
    }
}

fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        Err("the key must not be empty".to_owned())
    } else {
        Ok(())
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[start..].chars().count() + 1)
}

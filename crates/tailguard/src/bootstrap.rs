//! Where a node finds its config in etcd: the `--etcd`/`--etcd-key` flags or the small
//! bootstrap file (`--bootstrap FILE`) that says the same, checked with `file:line:col`
//! errors like the config itself.
//!
//! ```toml
//! [etcd]
//! endpoints = ["https://10.0.0.1:2379", "https://10.0.0.2:2379"]
//! key = "/tailguard/config"
//! timeout_ms = 5000
//! tls = { ca = "etcd-ca.pem", cert = "gateway.pem", key = "gateway.key" }
//! username = "gateway"
//! password_file = "etcd-password"
//! cache = "/var/lib/tailguard/etcd-config.toml"   # optional; "" turns the cache off
//! ```
//!
//! The TLS files and the password are read (and the PEM checked) when the settings are
//! loaded, so a bad path or file is reported with its position before anything connects.
//! The password file is read again on SIGHUP ([`Settings::reread_password`]).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tailguard_config::Diagnostic;
use tailguard_etcd::Tls;
use tailguard_proxy::Error;
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
    /// TLS settings for `https://` endpoints (`None` there: the system's roots, no client
    /// certificate).
    pub(crate) tls: Option<Tls>,
    /// etcd's user/password authentication.
    pub(crate) credentials: Option<Credentials>,
    /// Where the last applied revision is kept, for a start while etcd is unreachable.
    pub(crate) cache: CacheSetting,
}

/// A user name and the password read from its file.
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) username: String,
    pub(crate) password: String,
    /// The file, read again on SIGHUP (a rotated password needs no restart).
    pub(crate) password_file: PathBuf,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// The "file" a stored document's errors name: `etcd:KEY@REVISION`.
    pub(crate) fn source_name(&self, revision: i64) -> String {
        format!("etcd:{}@{revision}", self.key)
    }

    /// SIGHUP: reads the password file again, as the config's certificate files are read
    /// again. A changed password replaces the one in use and is returned, for the watcher to
    /// reconnect with; a file that cannot be read (or is empty) keeps the password in use, as
    /// a config with an error keeps the running one.
    pub(crate) fn reread_password(&mut self) -> Option<Credentials> {
        let current = self.credentials.as_mut()?;
        match read_password(&current.password_file) {
            Ok(password) if password == current.password => None,
            Ok(password) => {
                tracing::info!(
                    "tailguard: SIGHUP: the etcd password in {} changed; reconnecting with it",
                    current.password_file.display()
                );
                current.password = password;
                Some(current.clone())
            }
            Err(e) => {
                tracing::error!(
                    "tailguard: SIGHUP: etcd password_file: {e}; the password read before \
                     stays in use"
                );
                None
            }
        }
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
    /// CA certificate (PEM) the etcd server's certificate must be signed by (https://
    /// endpoints; default: the system's root certificates).
    #[arg(long, value_name = "FILE", requires = "endpoints")]
    pub(crate) etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) to present to etcd (its `--client-cert-auth`); needs
    /// --etcd-cert-key.
    #[arg(long, value_name = "FILE", requires_all = ["endpoints", "etcd_cert_key"])]
    pub(crate) etcd_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM); needs --etcd-cert.
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    pub(crate) etcd_cert_key: Option<PathBuf>,
    /// etcd user name (etcd's `auth enable`); needs --etcd-password-file.
    #[arg(long, value_name = "NAME", requires_all = ["endpoints", "etcd_password_file"])]
    pub(crate) etcd_username: Option<String>,
    /// File holding the etcd user's password (one line; a final newline is ignored).
    #[arg(long, value_name = "FILE", requires = "etcd_username")]
    pub(crate) etcd_password_file: Option<PathBuf>,
    /// Bootstrap file (TOML) naming the etcd endpoints and key, instead of --etcd and
    /// --etcd-key: `[etcd] endpoints = [..], key = "..", timeout_ms = 5000`, and optionally
    /// `tls = { ca = "..", cert = "..", key = ".." }`, `username`, `password_file`.
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
        let tls_given = self.etcd_ca.is_some() || self.etcd_cert.is_some();
        for e in &self.endpoints {
            if let Err(message) = check_endpoint(e, tls_given) {
                diags.push(command_line("--etcd", message));
            }
        }
        if let Err(message) = check_key(key) {
            diags.push(command_line("--etcd-key", message));
        }
        let files = TlsFiles {
            ca: self.etcd_ca.as_deref(),
            cert: self.etcd_cert.as_deref(),
            key: self.etcd_cert_key.as_deref(),
        };
        let tls = match files.load(Path::new("")) {
            Ok(tls) => tls,
            Err((field, message)) => {
                let flag = match field {
                    TlsField::Ca => "--etcd-ca",
                    TlsField::Cert => "--etcd-cert",
                    TlsField::Key => "--etcd-cert-key",
                };
                diags.push(command_line(flag, message));
                None
            }
        };
        let credentials = match (&self.etcd_username, &self.etcd_password_file) {
            (Some(username), Some(file)) => match read_password(file) {
                Ok(password) => Some(Credentials {
                    username: username.clone(),
                    password,
                    password_file: file.clone(),
                }),
                Err(message) => {
                    diags.push(command_line("--etcd-password-file", message));
                    None
                }
            },
            // clap's `requires` makes each need the other.
            _ => None,
        };
        if !diags.is_empty() {
            return Err(Error::Config(diags));
        }
        Ok(Some(Settings {
            endpoints: self.endpoints.clone(),
            key: key.clone(),
            timeout: Duration::from_millis(self.etcd_timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)),
            base_dir: PathBuf::new(),
            tls,
            credentials,
            cache: CacheSetting::Default,
        }))
    }
}

/// The TLS files named by the flags or the bootstrap file.
struct TlsFiles<'a> {
    ca: Option<&'a Path>,
    cert: Option<&'a Path>,
    key: Option<&'a Path>,
}

/// Which of them an error is about.
#[derive(Debug, Clone, Copy)]
enum TlsField {
    Ca,
    Cert,
    Key,
}

impl TlsFiles<'_> {
    /// Reads and checks the files (relative paths against `base`): `None` if none is named.
    fn load(&self, base: &Path) -> Result<Option<Tls>, (TlsField, String)> {
        if self.ca.is_none() && self.cert.is_none() && self.key.is_none() {
            return Ok(None);
        }
        let mut tls = Tls::system_roots();
        if let Some(ca) = self.ca {
            let path = base.join(ca);
            let pem = read_file(&path).map_err(|m| (TlsField::Ca, m))?;
            tls = tls
                .with_ca_pem(&pem)
                .map_err(|m| (TlsField::Ca, format!("{}: {m}", path.display())))?;
        }
        match (self.cert, self.key) {
            (Some(cert), Some(key)) => {
                let (cert, key) = (base.join(cert), base.join(key));
                let cert_pem = read_file(&cert).map_err(|m| (TlsField::Cert, m))?;
                let key_pem = read_file(&key).map_err(|m| (TlsField::Key, m))?;
                tls = tls.with_client_cert_pem(&cert_pem, &key_pem).map_err(|m| {
                    (
                        TlsField::Cert,
                        format!("{} with {}: {m}", cert.display(), key.display()),
                    )
                })?;
            }
            (Some(_), None) => {
                return Err((
                    TlsField::Key,
                    "a client certificate needs its key too".to_owned(),
                ));
            }
            (None, Some(_)) => {
                return Err((
                    TlsField::Cert,
                    "a client key needs its certificate too".to_owned(),
                ));
            }
            (None, None) => {}
        }
        Ok(Some(tls))
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// The password in `path`: its text without a final line break.
fn read_password(path: &Path) -> Result<String, String> {
    let bytes = read_file(path)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("{}: the password is not UTF-8 text", path.display()))?;
    let password = text
        .strip_suffix('\n')
        .map_or(text.as_str(), |t| t.strip_suffix('\r').unwrap_or(t));
    if password.is_empty() {
        return Err(format!("{}: the file is empty", path.display()));
    }
    Ok(password.to_owned())
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
    #[serde(default)]
    tls: Option<Spanned<TlsSection>>,
    #[serde(default)]
    username: Option<Spanned<String>>,
    #[serde(default)]
    password_file: Option<Spanned<PathBuf>>,
    /// The etcd cache file (relative: to the bootstrap file's directory); `""`: none.
    #[serde(default)]
    cache: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsSection {
    #[serde(default)]
    ca: Option<Spanned<PathBuf>>,
    #[serde(default)]
    cert: Option<Spanned<PathBuf>>,
    #[serde(default)]
    key: Option<Spanned<PathBuf>>,
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
    let base_dir = path.parent().map(Path::to_owned).unwrap_or_default();
    let mut diags = Vec::new();
    if etcd.endpoints.get_ref().is_empty() {
        diags.push(at(
            Some(etcd.endpoints.span()),
            "etcd.endpoints",
            "at least one endpoint is required".to_owned(),
        ));
    }
    for (i, e) in etcd.endpoints.get_ref().iter().enumerate() {
        if let Err(message) = check_endpoint(e.get_ref(), etcd.tls.is_some()) {
            diags.push(at(Some(e.span()), &format!("etcd.endpoints[{i}]"), message));
        }
    }
    if let Err(message) = check_key(etcd.key.get_ref()) {
        diags.push(at(Some(etcd.key.span()), "etcd.key", message));
    }
    let tls = match &etcd.tls {
        None => None,
        Some(section) => {
            let t = section.get_ref();
            let files = TlsFiles {
                ca: t.ca.as_ref().map(|p| p.get_ref().as_path()),
                cert: t.cert.as_ref().map(|p| p.get_ref().as_path()),
                key: t.key.as_ref().map(|p| p.get_ref().as_path()),
            };
            match files.load(&base_dir) {
                Ok(Some(tls)) => Some(tls),
                // `tls = {}`: https with the system's roots, said explicitly.
                Ok(None) => Some(Tls::system_roots()),
                Err((field, message)) => {
                    let (name, span) = match field {
                        TlsField::Ca => ("etcd.tls.ca", t.ca.as_ref().map(Spanned::span)),
                        TlsField::Cert => ("etcd.tls.cert", t.cert.as_ref().map(Spanned::span)),
                        TlsField::Key => ("etcd.tls.key", t.key.as_ref().map(Spanned::span)),
                    };
                    diags.push(at(span.or(Some(section.span())), name, message));
                    None
                }
            }
        }
    };
    let credentials = match (&etcd.username, &etcd.password_file) {
        (Some(username), Some(file)) => match read_password(&base_dir.join(file.get_ref())) {
            Ok(password) => Some(Credentials {
                username: username.get_ref().clone(),
                password,
                password_file: base_dir.join(file.get_ref()),
            }),
            Err(message) => {
                diags.push(at(Some(file.span()), "etcd.password_file", message));
                None
            }
        },
        (Some(username), None) => {
            diags.push(at(
                Some(username.span()),
                "etcd.username",
                "needs password_file, the file holding its password".to_owned(),
            ));
            None
        }
        (None, Some(file)) => {
            diags.push(at(
                Some(file.span()),
                "etcd.password_file",
                "needs username".to_owned(),
            ));
            None
        }
        (None, None) => None,
    };
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
        tls,
        credentials,
    })
}

/// An endpoint must say its scheme; with TLS settings, it must be https.
fn check_endpoint(e: &str, tls_given: bool) -> Result<(), String> {
    if let Some(rest) = e.strip_prefix("https://") {
        if !rest.is_empty() {
            return Ok(());
        }
    } else if let Some(rest) = e.strip_prefix("http://") {
        if tls_given {
            return Err(format!(
                "`{e}` is plain text but TLS settings are given: use https://"
            ));
        }
        if !rest.is_empty() {
            return Ok(());
        }
    }
    Err(format!(
        "`{e}` is not an etcd client URL like https://127.0.0.1:2379 or http://127.0.0.1:2379"
    ))
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

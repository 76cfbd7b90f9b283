//! `[status]`: whether the metrics listener serves the status page (`/status`,
//! `/status.json`), and who may read it (a bearer token, or users of an htpasswd file).

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

/// `[status]`: every field optional.
///
/// ```toml
/// [status]
/// enabled = true                      # the default
/// token_file = "/etc/tailguard/status.token"   # or:
/// htpasswd = "/etc/tailguard/status.htpasswd"  # bcrypt entries (htpasswd -B)
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusConfig {
    /// Serve `/status` and `/status.json` on the metrics listener.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// A file holding the bearer token `/status.json` requires (`Authorization: Bearer`),
    /// relative to the config file.
    #[serde(default)]
    pub token_file: Option<Spanned<String>>,
    /// An htpasswd file of `user:bcrypt-hash` lines: HTTP Basic authentication for the page
    /// and its JSON, relative to the config file.
    #[serde(default)]
    pub htpasswd: Option<Spanned<String>>,
    /// The config file's directory, which the paths are relative to ([`StatusConfig::locate`]).
    #[serde(skip)]
    base_dir: PathBuf,
}

fn yes() -> bool {
    true
}

impl Default for StatusConfig {
    fn default() -> StatusConfig {
        StatusConfig {
            enabled: true,
            token_file: None,
            htpasswd: None,
            base_dir: PathBuf::new(),
        }
    }
}

/// Who may read the status page, loaded from the files `[status]` names.
#[derive(Clone, PartialEq, Eq)]
pub enum StatusAccess {
    /// Anyone who reaches the metrics listener.
    Open,
    /// Requests with `Authorization: Bearer` and this token.
    Token(Vec<u8>),
    /// HTTP Basic authentication against these (user, bcrypt hash) pairs.
    Htpasswd(Vec<(String, String)>),
}

impl fmt::Debug for StatusAccess {
    /// Never prints the token or a hash.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatusAccess::Open => f.write_str("Open"),
            StatusAccess::Token(_) => f.write_str("Token(..)"),
            StatusAccess::Htpasswd(users) => write!(f, "Htpasswd({} users)", users.len()),
        }
    }
}

impl StatusConfig {
    /// Resolves the files against `base_dir`, the config file's directory.
    pub(crate) fn locate(&mut self, base_dir: &Path) {
        self.base_dir = base_dir.to_owned();
    }

    /// Reads the token or the htpasswd file. Errors are `(span, field, message)`.
    pub fn access(&self) -> Result<StatusAccess, (Option<std::ops::Range<usize>>, String, String)> {
        match (&self.token_file, &self.htpasswd) {
            (Some(_), Some(h)) => Err((
                Some(h.span()),
                "status.htpasswd".into(),
                "set `token_file` or `htpasswd`, not both".into(),
            )),
            (Some(t), None) => {
                let path = self.base_dir.join(t.get_ref());
                let error = |m: String| (Some(t.span()), "status.token_file".to_owned(), m);
                let text = std::fs::read(&path)
                    .map_err(|e| error(format!("cannot read {}: {e}", path.display())))?;
                let token = text.trim_ascii();
                if token.is_empty() {
                    return Err(error(format!("{} is empty", path.display())));
                }
                if token.iter().any(|b| !b.is_ascii_graphic()) {
                    return Err(error(format!(
                        "{}: a token is printable ASCII without spaces (it is sent in a header)",
                        path.display()
                    )));
                }
                Ok(StatusAccess::Token(token.to_vec()))
            }
            (None, Some(h)) => {
                let path = self.base_dir.join(h.get_ref());
                let error = |m: String| (Some(h.span()), "status.htpasswd".to_owned(), m);
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| error(format!("cannot read {}: {e}", path.display())))?;
                let users =
                    parse_htpasswd(&text).map_err(|m| error(format!("{}: {m}", path.display())))?;
                Ok(StatusAccess::Htpasswd(users))
            }
            (None, None) => Ok(StatusAccess::Open),
        }
    }
}

/// `user:hash` lines (blank lines and `#` comments skipped); only bcrypt hashes (`$2a$`,
/// `$2b$`, `$2y$`: `htpasswd -B`), the one scheme htpasswd offers that is still a good
/// password hash (its MD5, SHA-1 and crypt schemes are fast to brute-force).
fn parse_htpasswd(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut users = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((user, hash)) = line.split_once(':') else {
            return Err(format!("line {}: expected `user:hash`", n + 1));
        };
        let bcrypt = ["$2a$", "$2b$", "$2y$"].iter().any(|p| hash.starts_with(p));
        if user.is_empty() || !bcrypt || hash.len() != 60 {
            return Err(format!(
                "line {}: user `{user}`: only bcrypt entries are supported (make them with \
                 `htpasswd -B`)",
                n + 1
            ));
        }
        users.push((user.to_owned(), hash.to_owned()));
    }
    if users.is_empty() {
        return Err("no users".into());
    }
    Ok(users)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn htpasswd_takes_bcrypt_lines_only() {
        let hash = "$2y$05$abcdefghijklmnopqrstuuQ5Hn0wQAB0NVEmV3n2O/6WUkhUOdNR6";
        assert_eq!(hash.len(), 60);
        let ok = parse_htpasswd(&format!("# ops\n\nalice:{hash}\n")).unwrap();
        assert_eq!(ok, [("alice".to_owned(), hash.to_owned())]);
        let md5 = parse_htpasswd("bob:$apr1$x$y\n").unwrap_err();
        assert!(md5.contains("line 1: user `bob`: only bcrypt"), "{md5}");
        assert_eq!(parse_htpasswd("\n").unwrap_err(), "no users");
        assert!(parse_htpasswd("nocolon").unwrap_err().contains("user:hash"));
        assert_eq!(
            format!("{:?}", StatusAccess::Token(b"secret".to_vec())),
            "Token(..)"
        );
    }
}

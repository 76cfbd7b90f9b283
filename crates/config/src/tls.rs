//! A listener's `tls`: one certificate, or several picked by SNI; `tls_min_version`; the
//! loading of a certificate chain and its key (read, parsed and matched, the form the
//! runtime serves from); and the checks `tailguard check` runs on them.
//!
//! Every certificate chain and key is read, parsed and matched when the config loads (and
//! again on each reload, which is how a renewed certificate is picked up).

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, de::value};
use toml::Spanned;

use crate::sni::{Names, ServerName};

/// Certificate chain and private key for a TLS listener, PEM files.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Certificate chain (PEM); relative paths are relative to the config file.
    pub cert: Spanned<PathBuf>,
    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: Spanned<PathBuf>,
    /// SNI names this certificate is served for (`a.example`, `*.b.example`); an entry
    /// without any is the listener's default (see [`ListenerTls`]).
    #[serde(default)]
    pub server_names: Vec<Spanned<String>>,
}

/// A listener's `tls`: one table, or a list of tables whose certificates are picked by SNI.
#[derive(Debug, Clone)]
pub enum ListenerTls {
    /// `tls = { cert, key }`: one certificate for every client.
    One(TlsConfig),
    /// `tls = [{ cert, key, server_names }, ...]` (or `[[listeners.tls]]` tables): never
    /// empty.
    List(Vec<TlsConfig>),
}

impl ListenerTls {
    /// The certificate entries, in file order.
    pub fn entries(&self) -> &[TlsConfig] {
        match self {
            ListenerTls::One(one) => std::slice::from_ref(one),
            ListenerTls::List(list) => list,
        }
    }

    /// The entry served to a client whose SNI no entry claims, or that sends none: the one
    /// entry without `server_names`, else the first.
    pub fn default_entry(&self) -> usize {
        self.entries()
            .iter()
            .position(|e| e.server_names.is_empty())
            .unwrap_or(0)
    }

    /// The field name of entry `k` of listener `i`'s `tls`, as errors name it.
    fn field(&self, i: usize, k: usize) -> String {
        match self {
            ListenerTls::One(_) => format!("listeners[{i}].tls"),
            ListenerTls::List(_) => format!("listeners[{i}].tls[{k}]"),
        }
    }
}

// By hand rather than `#[serde(untagged)]`: untagged buffers the value and loses the
// positions `Spanned` fields need for `file:line:col` errors; this passes the table or the
// list on to the derived code as it is.
impl<'de> Deserialize<'de> for ListenerTls {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Forms;
        impl<'de> Visitor<'de> for Forms {
            type Value = ListenerTls;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a table `{ cert, key }` or a list of them `[{ cert, key, server_names }, ...]`",
                )
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ListenerTls, A::Error> {
                TlsConfig::deserialize(value::MapAccessDeserializer::new(map)).map(ListenerTls::One)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<ListenerTls, A::Error> {
                let list = Vec::<TlsConfig>::deserialize(value::SeqAccessDeserializer::new(seq))?;
                if list.is_empty() {
                    return Err(de::Error::invalid_length(0, &"at least one certificate"));
                }
                Ok(ListenerTls::List(list))
            }
        }
        deserializer.deserialize_any(Forms)
    }
}

/// The oldest TLS version a listener accepts (`tls_min_version`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum TlsVersion {
    /// TLS 1.2 and 1.3.
    #[default]
    #[serde(rename = "1.2")]
    Tls12,
    /// TLS 1.3 only: a client that cannot speak it fails the handshake.
    #[serde(rename = "1.3")]
    Tls13,
}

/// Reads one entry's chain and key (paths relative to `base_dir`) and checks that they
/// belong together. The error says which file and why (`tls: ` is the caller's to add).
pub fn load_entry(
    base_dir: &Path,
    tls: &TlsConfig,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, String> {
    let cert_path = base_dir.join(tls.cert.get_ref());
    let key_path = base_dir.join(tls.key.get_ref());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("certificate {}: {e}", cert_path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "certificate {}: no certificate in file",
            cert_path.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&key_path)
        .map_err(|e| format!("key {}: {e}", key_path.display()))?;
    let key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| format!("key {}: {e}", key_path.display()))?;
    let certified = CertifiedKey::new(certs, key);
    match certified.keys_match() {
        // A key whose public half rustls cannot derive cannot be compared; the handshake
        // is then the test, as with rustls' own `with_single_cert`.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(certified)
        }
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(format!(
                "certificate and key do not fit: {} is not the key of {}",
                key_path.display(),
                cert_path.display()
            ))
        }
        Err(e) => Err(format!("certificate and key do not fit: {e}")),
    }
}

/// One problem with a listener's TLS config.
#[derive(Debug)]
pub struct Problem {
    /// Where it is in the file.
    pub span: Option<Range<usize>>,
    /// The full field name (`listeners[0].tls[1].server_names[0]`).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// Checks listener `i`'s TLS config (`tls`, `tls_min_version`): every file reads and
/// parses, each key fits its certificate, each server name is well formed, claimed once on
/// the listener and covered by its certificate, at most one entry is the default, and
/// `tls_min_version` comes with `tls`.
pub fn check(
    base_dir: &Path,
    i: usize,
    tls: Option<&ListenerTls>,
    min_version: Option<&Spanned<TlsVersion>>,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut push = |span: Range<usize>, field: String, message: String| {
        problems.push(Problem {
            span: Some(span),
            field,
            message,
        });
    };
    let Some(tls) = tls else {
        if let Some(version) = min_version {
            push(
                version.span(),
                format!("listeners[{i}].tls_min_version"),
                "needs `tls`: a plain listener has no TLS version".into(),
            );
        }
        return problems;
    };
    let provider = rustls::crypto::ring::default_provider();
    let mut claimed = Names::default();
    let mut default = None;
    for (k, entry) in tls.entries().iter().enumerate() {
        let field = tls.field(i, k);
        let mut readable = true;
        for (what, path) in [("cert", &entry.cert), ("key", &entry.key)] {
            let full = base_dir.join(path.get_ref());
            if let Err(e) = std::fs::read(&full) {
                readable = false;
                push(
                    path.span(),
                    format!("{field}.{what}"),
                    format!("cannot read {}: {e}", full.display()),
                );
            }
        }
        let loaded = if readable {
            match load_entry(base_dir, entry, &provider) {
                Ok(key) => Some(key),
                Err(e) => {
                    // `tls: `, as the listener's start reports the same failure.
                    push(entry.cert.span(), field.clone(), format!("tls: {e}"));
                    None
                }
            }
        } else {
            None
        };
        if entry.server_names.is_empty() {
            match default {
                None => default = Some(k),
                Some(first) => push(
                    entry.cert.span(),
                    field.clone(),
                    format!(
                        "a second entry without `server_names`: only one entry can be the \
                         default certificate, and {} already is",
                        tls.field(i, first)
                    ),
                ),
            }
        }
        for (n, name) in entry.server_names.iter().enumerate() {
            let name_field = format!("{field}.server_names[{n}]");
            let parsed = match ServerName::parse(name.get_ref()) {
                Ok(parsed) => parsed,
                Err(message) => {
                    push(name.span(), name_field, message);
                    continue;
                }
            };
            if let Some(cert) = loaded.as_ref().and_then(|key| key.cert.first())
                && let Err(message) = parsed.covered_by(cert)
            {
                push(name.span(), name_field.clone(), message);
            }
            if let Err(&holder) = claimed.claim(parsed, k) {
                push(
                    name.span(),
                    name_field,
                    format!(
                        "`{}` is claimed twice on this listener (names compare \
                         case-insensitively): {} lists it too",
                        name.get_ref(),
                        tls.field(i, holder)
                    ),
                );
            }
        }
    }
    problems
}

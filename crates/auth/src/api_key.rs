//! `type = "api_key"`: a key from a header or a query parameter, looked up among the
//! consumers' stored hashes (inline, and a keys file re-read when it changes).

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::HeaderValue;

use crate::authenticate::{AuthRequest, Authenticate};
use crate::keys::{Consumer, KeyTable, parse_keys_file};
use crate::outcome::{Accepted, Outcome, Refusal, Verdict};
use crate::result::AuthResult;
use crate::source::Source;

/// An API-key authenticator.
#[derive(Debug)]
pub struct ApiKey {
    sources: Vec<Source>,
    keys: Arc<ArcSwap<KeyTable>>,
    forward_key: bool,
    challenge: HeaderValue,
}

/// What an [`ApiKey`] is built from.
#[derive(Debug, Clone)]
pub struct ApiKeySettings {
    /// The authenticator's name (the realm of its challenge).
    pub name: String,
    /// Where the key is looked for, in order (`header:x-api-key` when empty).
    pub from: Vec<Source>,
    /// Consumers written in the config.
    pub consumers: Vec<Consumer>,
    /// A keys file (`NAME sha256:HEX` lines), read now and again when it changes.
    pub keys_file: Option<PathBuf>,
    /// Whether the upstream sees the key (default: removed).
    pub forward_key: bool,
}

impl ApiKey {
    /// Builds it, reading the keys file (if any) now, on the caller's thread (a config
    /// load, never a serving thread), and watching it from then on.
    pub fn build(settings: ApiKeySettings) -> Result<ApiKey, String> {
        let inline = settings.consumers;
        let file_consumers = match &settings.keys_file {
            Some(path) => read_keys_file(path)?,
            None => Vec::new(),
        };
        let keys = Arc::new(ArcSwap::from_pointee(KeyTable::new(
            inline.iter().chain(&file_consumers),
        )));
        if let Some(path) = settings.keys_file {
            crate::watch::watch(path, &keys, move |text| {
                let from_file =
                    parse_keys_file(text).map_err(|e| format!("line {}: {}", e.line, e.message))?;
                Ok(KeyTable::new(inline.iter().chain(&from_file)))
            });
        }
        let from = if settings.from.is_empty() {
            vec![Source::Header(http::HeaderName::from_static("x-api-key"))]
        } else {
            settings.from
        };
        let challenge = format!("ApiKey realm=\"{}\"", settings.name.replace('"', ""));
        Ok(ApiKey {
            sources: from,
            keys,
            forward_key: settings.forward_key,
            challenge: HeaderValue::from_str(&challenge)
                .unwrap_or_else(|_| HeaderValue::from_static("ApiKey")),
        })
    }

    /// How many keys it knows now.
    pub fn key_count(&self) -> usize {
        self.keys.load().len()
    }
}

/// Reads and parses a keys file, its errors naming the file and the line.
pub fn read_keys_file(path: &std::path::Path) -> Result<Vec<Consumer>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read keys file {}: {e}", path.display()))?;
    parse_keys_file(&text).map_err(|e| format!("{}:{}: {}", path.display(), e.line, e.message))
}

impl Authenticate for ApiKey {
    fn check(&self, req: &AuthRequest<'_>) -> Verdict {
        let found = self
            .sources
            .iter()
            .find_map(|s| s.find(req.uri, req.headers).map(|c| (s, c)));
        let Some((source, key)) = found else {
            return Verdict::Ready(Outcome::Refused(Refusal::unauthorized(
                AuthResult::Missing,
                self.challenge.clone(),
            )));
        };
        let keys = self.keys.load();
        match keys.find(key.as_bytes()) {
            Some(name) => Verdict::Ready(Outcome::Accepted(Accepted {
                consumer: Some(Arc::clone(name)),
                headers: Vec::new(),
                strip: (!self.forward_key).then(|| source.clone()),
            })),
            None => Verdict::Ready(Outcome::Refused(Refusal::unauthorized(
                AuthResult::Invalid,
                self.challenge.clone(),
            ))),
        }
    }

    fn sources(&self) -> &[Source] {
        &self.sources
    }
}

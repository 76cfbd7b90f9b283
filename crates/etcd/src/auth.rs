//! etcd's user/password authentication on the client side: the credentials, the token
//! `Authenticate` returned (sent in every request's `token` metadata), and its renewal when
//! etcd says it is no longer valid (a simple token expires after `--auth-token-ttl` seconds
//! unused; a JWT after its TTL; any token after the auth store changes).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tonic::metadata::{AsciiMetadataValue, MetadataMap};

/// A user name and password, and the token they were last exchanged for. Shared by a
/// client's clones, so one renewal serves them all.
pub(crate) struct Auth {
    pub(crate) name: String,
    pub(crate) password: String,
    /// `None` before the first `Authenticate`, or after etcd said it has authentication
    /// disabled (requests then go without a token, as etcd's own client does).
    token: Mutex<Option<Token>>,
    authentications: AtomicU64,
}

/// A token as sent: `None` means "authenticated, but etcd wants no token".
#[derive(Clone)]
pub(crate) struct Token(Option<AsciiMetadataValue>);

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password or the token.
        f.debug_struct("Auth")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Auth {
    pub(crate) fn new(name: String, password: String) -> Arc<Auth> {
        Arc::new(Auth {
            name,
            password,
            token: Mutex::new(None),
            authentications: AtomicU64::new(0),
        })
    }

    /// The current token, if one was fetched.
    pub(crate) fn current(&self) -> Option<Token> {
        self.token.lock().expect("token lock poisoned").clone()
    }

    /// Records a token `Authenticate` returned (`None`: etcd has authentication disabled).
    pub(crate) fn store(&self, token: Option<String>) -> Result<Token, String> {
        let value = token
            .map(|t| {
                let mut v = AsciiMetadataValue::try_from(t)
                    .map_err(|_| "etcd returned an auth token that is not ASCII".to_owned())?;
                v.set_sensitive(true);
                Ok::<_, String>(v)
            })
            .transpose()?;
        let token = Token(value);
        *self.token.lock().expect("token lock poisoned") = Some(token.clone());
        self.authentications.fetch_add(1, Ordering::Relaxed);
        Ok(token)
    }

    /// How many times a token was fetched (the first time included).
    pub(crate) fn authentications(&self) -> u64 {
        self.authentications.load(Ordering::Relaxed)
    }
}

impl Token {
    /// Adds the token to a request's metadata.
    pub(crate) fn attach(&self, metadata: &mut MetadataMap) {
        if let Some(v) = &self.0 {
            metadata.insert("token", v.clone());
        }
    }
}

//! htpasswd files as Apache's `htpasswd` writes them: `user:hash` lines, each hash in one of
//! the formats it makes (bcrypt `$2y$` from `-B`, MD5 `$apr1$` from `-m` and by default,
//! SHA-1 `{SHA}` from `-s`), and the check of a password against one.
//!
//! bcrypt is the `bcrypt` crate's, SHA-1 is `ring`'s. `$apr1$` is Apache's variant of
//! Poul-Henning Kamp's MD5-crypt (FreeBSD `crypt(3)` `$1$` with another magic string): no
//! maintained crate implements it (`pwhash` 1.0 has `$1$` but not `$apr1$`, and its
//! dependencies are years old), so [`apr1`] follows the published algorithm (Apache's
//! `apr_md5.c`, `apr_md5_encode`) over the MD5 of RustCrypto's `md-5`; it is no new
//! primitive, only the documented composition, and the tests check it against hashes
//! written by the real `htpasswd`. Other formats (`crypt` DES from `-d`, plain text from
//! `-p`, SHA-256/512-crypt from `-2`/`-5`) are refused when the file is read, at their line.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;
use md5::{Digest as _, Md5};
use subtle::ConstantTimeEq as _;

/// One user's stored hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hash {
    /// `$2y$` (also `$2a$`, `$2b$`): milliseconds a check by design.
    Bcrypt(String),
    /// `$apr1$SALT$CHECKSUM`: 1,000 rounds of MD5, ~0.2 ms a check.
    Apr1 {
        /// Up to 8 characters.
        salt: String,
        /// 22 characters of crypt's base-64.
        checksum: String,
    },
    /// `{SHA}` and the base64 of the password's SHA-1: one hash, no salt.
    Sha1([u8; 20]),
}

impl Hash {
    /// Reads a stored hash; `Err` says which format it is and why it is not taken.
    pub fn parse(text: &str) -> Result<Hash, String> {
        if text.starts_with("$2y$") || text.starts_with("$2a$") || text.starts_with("$2b$") {
            // Checked by the crate on each verify; its cost field read now so a broken one
            // is refused at load.
            let cost = text
                .get(4..6)
                .and_then(|c| c.parse::<u32>().ok())
                .filter(|c| (4..=31).contains(c));
            return match cost {
                Some(_) if text.len() == 60 => Ok(Hash::Bcrypt(text.to_owned())),
                _ => Err("a malformed bcrypt hash".to_owned()),
            };
        }
        if let Some(rest) = text.strip_prefix("$apr1$") {
            let (salt, checksum) = rest
                .split_once('$')
                .ok_or("a malformed $apr1$ hash: no `$` after the salt")?;
            if salt.len() > 8 || checksum.len() != 22 {
                return Err("a malformed $apr1$ hash".to_owned());
            }
            return Ok(Hash::Apr1 {
                salt: salt.to_owned(),
                checksum: checksum.to_owned(),
            });
        }
        if let Some(b64) = text.strip_prefix("{SHA}") {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| "a malformed {SHA} hash: not base64")?;
            return <[u8; 20]>::try_from(bytes.as_slice())
                .map(Hash::Sha1)
                .map_err(|_| "a malformed {SHA} hash: not 20 bytes".to_owned());
        }
        Err(match text {
            t if t.starts_with("$5$") || t.starts_with("$6$") => {
                "SHA-256/512-crypt (`htpasswd -2`/`-5`) is not supported; use `htpasswd -B` \
                 (bcrypt)"
            }
            t if t.starts_with("$1$") => "MD5-crypt `$1$` is not supported; use `htpasswd -B`",
            _ => {
                "not a hash this gateway reads (bcrypt `$2y$`, `$apr1$` or `{SHA}`); crypt DES \
                 (`-d`) and plain text (`-p`) are refused; use `htpasswd -B`"
            }
        }
        .to_owned())
    }

    /// Whether a check of this hash costs enough to go to the pool off the serving threads
    /// (bcrypt: milliseconds; apr1: ~0.2 ms). A `{SHA}` check is one SHA-1 (under a
    /// microsecond) and runs where it is asked.
    pub fn is_slow(&self) -> bool {
        !matches!(self, Hash::Sha1(_))
    }

    /// Whether `password` is the one this hash was made from. Slow for bcrypt and apr1
    /// ([`Hash::is_slow`]): never on a serving thread.
    pub fn verify(&self, password: &[u8]) -> bool {
        match self {
            Hash::Bcrypt(hash) => bcrypt::verify(password, hash).unwrap_or(false),
            Hash::Apr1 { salt, checksum } => bool::from(
                apr1(password, salt.as_bytes())
                    .as_slice()
                    .ct_eq(checksum.as_bytes()),
            ),
            Hash::Sha1(stored) => {
                let d = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, password);
                bool::from(d.as_ref().ct_eq(stored))
            }
        }
    }
}

/// The 22-character checksum of `$apr1$SALT$` for `password`: MD5-crypt as Apache's
/// `apr_md5_encode` computes it, with the magic string `$apr1$`.
pub fn apr1(password: &[u8], salt: &[u8]) -> [u8; 22] {
    const MAGIC: &[u8] = b"$apr1$";
    let salt = &salt[..salt.len().min(8)];
    let mut alternate = Md5::new();
    alternate.update(password);
    alternate.update(salt);
    alternate.update(password);
    let alternate = alternate.finalize();
    let mut ctx = Md5::new();
    ctx.update(password);
    ctx.update(MAGIC);
    ctx.update(salt);
    let mut left = password.len();
    while left > 0 {
        let n = left.min(16);
        ctx.update(&alternate[..n]);
        left -= n;
    }
    // The original's quirk: a zero byte for each set bit of the length, the password's first
    // byte for each clear one.
    let mut i = password.len();
    while i != 0 {
        if i & 1 == 1 {
            ctx.update([0u8]);
        } else {
            ctx.update(&password[..1]);
        }
        i >>= 1;
    }
    let mut last: [u8; 16] = ctx.finalize().into();
    // 1,000 rounds, "to make things run slower" (the original's comment).
    for round in 0..1000 {
        let mut c = Md5::new();
        if round & 1 == 1 {
            c.update(password);
        } else {
            c.update(last);
        }
        if round % 3 != 0 {
            c.update(salt);
        }
        if round % 7 != 0 {
            c.update(password);
        }
        if round & 1 == 1 {
            c.update(last);
        } else {
            c.update(password);
        }
        last = c.finalize().into();
    }
    const ITOA64: &[u8; 64] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut out = [0u8; 22];
    let mut at = 0;
    let mut put = |mut v: u32, n: usize| {
        for _ in 0..n {
            out[at] = ITOA64[(v & 0x3f) as usize];
            v >>= 6;
            at += 1;
        }
    };
    let b = |i: usize| u32::from(last[i]);
    for (x, y, z) in [(0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15), (4, 10, 5)] {
        put((b(x) << 16) | (b(y) << 8) | b(z), 4);
    }
    put(b(11), 2);
    out
}

/// A problem in an htpasswd file: its 1-based line and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    /// 1-based.
    pub line: usize,
    /// What is wrong (never the hash itself).
    pub message: String,
}

/// Every version of every file read gets a new number, so a remembered success of an older
/// version is never taken for the current one.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// The users of one version of an htpasswd file.
#[derive(Debug)]
pub struct Users {
    by_name: HashMap<String, (Arc<str>, Arc<Hash>)>,
    generation: u64,
}

impl Users {
    /// Parses a file's text: `user:hash` lines; empty lines and `#` comments skipped. A
    /// user named twice is an error (Apache takes the first line; whoever added the second
    /// probably meant it).
    pub fn parse(text: &str) -> Result<Users, LineError> {
        let mut by_name = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let err = |message: String| LineError {
                line: i + 1,
                message,
            };
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let (user, hash) = line
                .split_once(':')
                .ok_or_else(|| err("expected `user:hash`".to_owned()))?;
            if user.is_empty() {
                return Err(err("an empty user name".to_owned()));
            }
            let hash = Hash::parse(hash.trim()).map_err(|m| err(format!("user `{user}`: {m}")))?;
            if by_name
                .insert(user.to_owned(), (Arc::from(user), Arc::new(hash)))
                .is_some()
            {
                return Err(err(format!("user `{user}` is named twice")));
            }
        }
        Ok(Users {
            by_name,
            generation: GENERATION.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// A user's name (shared, for `$consumer`) and hash.
    pub fn find(&self, user: &[u8]) -> Option<&(Arc<str>, Arc<Hash>)> {
        std::str::from_utf8(user)
            .ok()
            .and_then(|u| self.by_name.get(u))
    }

    /// How many users.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// This version's number: every version of every file read gets a new one.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apr1_matches_a_published_hash() {
        // The example of FreeBSD's and Apache's documentation of the format.
        assert_eq!(&apr1(b"password", b"63JlJ2NH"), b"smE0mnB5h3tDri0zkpWXt1");
        let h = Hash::parse("$apr1$63JlJ2NH$smE0mnB5h3tDri0zkpWXt1").unwrap();
        assert!(h.verify(b"password"));
        assert!(!h.verify(b"passwore"));
        assert!(!h.verify(b""));
    }

    #[test]
    fn sha1_is_the_base64_of_the_digest() {
        // `htpasswd -nbs u password`
        let h = Hash::parse("{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=").unwrap();
        assert!(h.verify(b"password"));
        assert!(!h.verify(b"Password"));
        assert!(!h.is_slow());
    }

    #[test]
    fn other_formats_are_refused_at_their_line() {
        let err =
            Users::parse("# users\nann:$apr1$63JlJ2NH$smE0mnB5h3tDri0zkpWXt1\nbob:password\n")
                .unwrap_err();
        assert_eq!(err.line, 3);
        assert!(
            err.message.starts_with("user `bob`: not a hash"),
            "{}",
            err.message
        );
        let err = Users::parse("x:$6$abc$def").unwrap_err();
        assert!(err.message.contains("-2"), "{}", err.message);
        let err = Users::parse("nocolon").unwrap_err();
        assert_eq!(err.message, "expected `user:hash`");
        let err = Users::parse(
            "a:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\na:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=",
        )
        .unwrap_err();
        assert_eq!(
            (err.line, err.message.as_str()),
            (2, "user `a` is named twice")
        );
    }
}

//! API keys as they are stored: SHA-256 hashes (`sha256:HEX`), the table of consumers they
//! belong to, a keys file's lines (`NAME sha256:HEX`), and the lookup of a presented key:
//! its hash found by a hash-table index, then compared in constant time.

use std::collections::HashMap;
use std::sync::Arc;

use subtle::ConstantTimeEq;

/// A key's SHA-256, as stored (the key itself is never kept).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyHash(pub [u8; 32]);

impl std::fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A hash is not the key, but it is a credential's fingerprint: not printed whole.
        write!(f, "KeyHash(sha256:{:02x}{:02x}..)", self.0[0], self.0[1])
    }
}

impl KeyHash {
    /// Parses `sha256:` followed by 64 hex digits.
    pub fn parse(text: &str) -> Result<KeyHash, String> {
        let Some(hex) = text.strip_prefix("sha256:") else {
            return Err(
                "expected `sha256:` and 64 hex digits (`printf %s KEY | sha256sum`)".to_owned(),
            );
        };
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "`sha256:` needs 64 hex digits, found {} characters",
                hex.len()
            ));
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                .map_err(|_| "not a hex digit".to_owned())?;
        }
        Ok(KeyHash(out))
    }

    /// The hash of a presented key.
    pub fn of(key: &[u8]) -> KeyHash {
        let digest = ring::digest::digest(&ring::digest::SHA256, key);
        let mut out = [0u8; 32];
        out.copy_from_slice(digest.as_ref());
        KeyHash(out)
    }

    fn index(&self) -> u64 {
        let mut first = [0u8; 8];
        first.copy_from_slice(&self.0[..8]);
        u64::from_le_bytes(first)
    }
}

/// One consumer: a name and the hashes of its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumer {
    /// The name (`$consumer`).
    pub name: Arc<str>,
    /// Its keys' hashes.
    pub keys: Vec<KeyHash>,
}

/// Every consumer's keys, indexed for a lookup per request that costs the same whatever
/// the table's size (design.md §2 rule 7).
#[derive(Debug, Default)]
pub struct KeyTable {
    by_index: HashMap<u64, Vec<(KeyHash, Arc<str>)>>,
    len: usize,
}

impl KeyTable {
    /// A table of `consumers`. A hash listed twice is a mistake the config check reports;
    /// here the first consumer keeps it.
    pub fn new<'a>(consumers: impl IntoIterator<Item = &'a Consumer>) -> KeyTable {
        let mut table = KeyTable::default();
        for c in consumers {
            for k in &c.keys {
                let bucket = table.by_index.entry(k.index()).or_default();
                if !bucket.iter().any(|(h, _)| h == k) {
                    bucket.push((*k, Arc::clone(&c.name)));
                    table.len += 1;
                }
            }
        }
        table
    }

    /// The consumer a presented key belongs to. The stored hash is compared in constant
    /// time (the hash-table index only narrows the candidates, by 8 bytes of a SHA-256 that
    /// a caller cannot steer without a preimage).
    pub fn find(&self, key: &[u8]) -> Option<&Arc<str>> {
        let hash = KeyHash::of(key);
        let bucket = self.by_index.get(&hash.index())?;
        let mut found = None;
        for (stored, name) in bucket {
            if bool::from(stored.0.ct_eq(&hash.0)) {
                found = Some(name);
            }
        }
        found
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A problem on one line of a keys file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Parses a keys file: one `NAME sha256:HEX` per line; blank lines and lines starting with
/// `#` are skipped. A name may appear on several lines (one key each).
pub fn parse_keys_file(text: &str) -> Result<Vec<Consumer>, LineError> {
    let mut out: Vec<Consumer> = Vec::new();
    let mut seen = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(name), Some(hash), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(LineError {
                line: line_no,
                message: "expected `NAME sha256:HEX`".to_owned(),
            });
        };
        let hash = KeyHash::parse(hash).map_err(|message| LineError {
            line: line_no,
            message,
        })?;
        if let Some(first) = seen.insert(hash, line_no) {
            return Err(LineError {
                line: line_no,
                message: format!("the same key as line {first}"),
            });
        }
        match out.iter_mut().find(|c| &*c.name == name) {
            Some(c) => c.keys.push(hash),
            None => out.push(Consumer {
                name: Arc::from(name),
                keys: vec![hash],
            }),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACME_KEY: &str = "acme-secret";

    fn hash_hex(key: &str) -> String {
        let h = KeyHash::of(key.as_bytes());
        let hex: String = h.0.iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    }

    #[test]
    fn a_key_is_found_by_its_hash_and_nothing_else_is() {
        let consumers = parse_keys_file(&format!(
            "# partners\nacme {}\n\nbeta {}\nacme {}\n",
            hash_hex(ACME_KEY),
            hash_hex("beta-secret"),
            hash_hex("acme-second")
        ))
        .unwrap();
        assert_eq!(consumers.len(), 2);
        let table = KeyTable::new(&consumers);
        assert_eq!(table.len(), 3);
        assert_eq!(table.find(ACME_KEY.as_bytes()).map(|n| &**n), Some("acme"));
        assert_eq!(table.find(b"acme-second").map(|n| &**n), Some("acme"));
        assert_eq!(table.find(b"beta-secret").map(|n| &**n), Some("beta"));
        assert_eq!(table.find(b"acme-secreT"), None);
        assert_eq!(table.find(b""), None);
    }

    #[test]
    fn sha256_matches_the_sha256sum_tool_vector() {
        // `printf %s abc | sha256sum`
        assert_eq!(
            hash_hex("abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn bad_lines_are_named() {
        let e = parse_keys_file("acme\n").unwrap_err();
        assert_eq!(e.line, 1);
        let e = parse_keys_file(&format!("a {}\nb sha256:zz\n", hash_hex("x"))).unwrap_err();
        assert_eq!(e.line, 2);
        let dup = hash_hex("x");
        let e = parse_keys_file(&format!("a {dup}\nb {dup}\n")).unwrap_err();
        assert_eq!(
            e,
            LineError {
                line: 2,
                message: "the same key as line 1".into()
            }
        );
        assert!(KeyHash::parse("md5:00").is_err());
    }
}

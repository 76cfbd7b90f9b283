//! The node's own copy of the last etcd revision it applied, so a gateway started while
//! etcd is unreachable (a reboot, a restart after a crash) serves that revision instead of
//! staying down until etcd returns.
//!
//! The file is the document with a two-line comment header that names the key, the
//! revision and the document's length and FNV-1a hash:
//!
//! ```toml
//! # tailguard etcd cache: the last revision of an etcd key this node applied. Written by the gateway; do not edit.
//! # etcd = { key = "/tailguard/config", revision = 42, bytes = 1234, fnv1a64 = "af63bd4c8601b7df" }
//! [[listeners]]
//! ...
//! ```
//!
//! The header is TOML comments, so the whole file parses as the config it holds, and the
//! errors of a cached document name the file with line numbers that match it. Each write
//! goes to a temporary file beside it, is fsynced and renamed over the old one (then the
//! directory is fsynced): a crash leaves the old revision or the new one, never a mix. The
//! temporary file is the writer's own (a name `tempfile` makes unique, created exclusively):
//! several gateways on one host following one key share the default cache file, and with
//! one temporary name for all, one writer's rename took another's file away mid-write
//! (`No such file or directory`), or renamed another's half-written file into place. Each
//! rename is atomic, so the file always holds one writer's whole revision (the last to
//! rename wins). A file whose header is missing, whose length or hash does not match (cut
//! short, edited) or that holds another key is never served.

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Where systemd's `StateDirectory=` puts a service's state when it does not say
/// (`$STATE_DIRECTORY` wins).
const DEFAULT_STATE_DIR: &str = "/var/lib/tailguard";

const HEADER: &str = "# tailguard etcd cache: the last revision of an etcd key this node \
                      applied. Written by the gateway; do not edit.";

/// Where the cache lives, as the bootstrap file or `--etcd-cache` said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CacheSetting {
    /// A file named after the key in the state directory (`$STATE_DIRECTORY`, else
    /// `/var/lib/tailguard`); if that directory cannot be made, no cache.
    Default,
    /// This file.
    At(PathBuf),
    /// `cache = ""`: no cache.
    Off,
}

impl CacheSetting {
    /// The setting a configured path names: `""` turns the cache off.
    pub(crate) fn from_path(path: PathBuf) -> CacheSetting {
        if path.as_os_str().is_empty() {
            CacheSetting::Off
        } else {
            CacheSetting::At(path)
        }
    }

    /// The cache of `key` this setting names; `None` without one. The default's directory
    /// is created here; when that fails the start goes on without a cache and says so.
    pub(crate) fn resolve(&self, key: &str) -> Option<Cache> {
        match self {
            CacheSetting::Off => None,
            CacheSetting::At(path) => Some(Cache {
                path: path.clone(),
                key: key.to_owned(),
                explicit: true,
            }),
            CacheSetting::Default => {
                let dir = default_dir();
                if let Err(e) = std::fs::create_dir_all(&dir) {
                    tracing::warn!(
                        "tailguard: cannot create {} for the etcd cache ({e}); running without \
                         one (set `[etcd] cache` or --etcd-cache, or `cache = \"\"` to say so)",
                        dir.display()
                    );
                    return None;
                }
                Some(Cache {
                    path: dir.join(default_file_name(key)),
                    key: key.to_owned(),
                    explicit: false,
                })
            }
        }
    }
}

/// `$STATE_DIRECTORY` (systemd's `StateDirectory=`; the first if it lists several), else
/// `/var/lib/tailguard`.
fn default_dir() -> PathBuf {
    std::env::var_os("STATE_DIRECTORY")
        .and_then(|dirs| {
            let first = dirs.to_str()?.split(':').next()?.to_owned();
            (!first.is_empty()).then(|| PathBuf::from(first))
        })
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR))
}

/// `etcd-<the key's characters that are safe in a file name>-<hash of the key>.toml`: readable,
/// and two keys never share a file (`/a/b` and `/a_b` differ in their hash).
fn default_file_name(key: &str) -> String {
    let readable: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    let readable = readable.trim_matches('_');
    format!(
        "etcd-{readable}-{:08x}.toml",
        fnv1a64(key.as_bytes()) as u32
    )
}

/// A revision read back from the cache.
#[derive(Debug)]
pub(crate) struct Cached {
    /// The key's mod revision the document had in etcd.
    pub(crate) revision: i64,
    /// The whole file, header included (TOML comments), so errors point at its lines.
    pub(crate) text: String,
}

/// The cache file of one key.
#[derive(Debug, Clone)]
pub(crate) struct Cache {
    path: PathBuf,
    key: String,
    /// Named in the settings (a failed write is an error each time), not the default (whose
    /// first failed write turns the cache off with one warning).
    explicit: bool,
}

/// The header's second line, as TOML.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    etcd: Meta,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Meta {
    key: String,
    revision: i64,
    bytes: usize,
    fnv1a64: String,
}

impl Cache {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn explicit(&self) -> bool {
        self.explicit
    }

    /// Replaces the cache with `document` at `revision`: written to a temporary file of this
    /// write's own, fsynced, renamed over the cache, and the directory fsynced.
    pub(crate) fn store(&self, revision: i64, document: &str) -> std::io::Result<()> {
        let mut text = String::with_capacity(document.len() + 256);
        text.push_str(HEADER);
        let _ = write!(
            text,
            "\n# etcd = {{ key = {}, revision = {revision}, bytes = {}, fnv1a64 = \"{:016x}\" }}\n",
            one_line_toml_string(&self.key),
            document.len(),
            fnv1a64(document.as_bytes())
        );
        text.push_str(document);
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = self
            .path
            .file_name()
            .map_or_else(|| "etcd-cache".into(), |n| n.to_string_lossy().into_owned());
        // `.NAME.XXXXXX.tmp`, created with O_EXCL (removed again if the write fails), and
        // the mode `File::create` gives (0666 less the umask), as before.
        let mut tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .permissions(std::fs::Permissions::from_mode(0o666))
            .tempfile_in(dir)?;
        tmp.write_all(text.as_bytes())?;
        tmp.as_file().sync_all()?;
        tmp.persist(&self.path).map_err(|e| e.error)?;
        // The rename itself is durable only once the directory is.
        std::fs::File::open(dir)?.sync_all()
    }

    /// The cached revision: `Ok(None)` without a file, `Err` (naming the file) for a file
    /// that cannot be read or must not be served.
    pub(crate) fn load(&self) -> Result<Option<Cached>, String> {
        let name = self.path.display();
        let text = match std::fs::read(&self.path) {
            Ok(bytes) => String::from_utf8(bytes)
                .map_err(|e| format!("{name}: the etcd cache is not UTF-8 text: {e}"))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{name}: cannot read the etcd cache: {e}")),
        };
        let corrupt = |line: usize, why: &str| format!("{name}:{line}: corrupt etcd cache: {why}");
        let mut lines = text.splitn(3, '\n');
        if lines.next() != Some(HEADER) {
            return Err(corrupt(1, "no tailguard etcd cache header"));
        }
        let meta = lines
            .next()
            .and_then(|l| l.strip_prefix("# "))
            .ok_or_else(|| corrupt(2, "no `# etcd = {...}` line"))?;
        let meta = toml::from_str::<Header>(meta)
            .map_err(|e| corrupt(2, e.message().trim_end()))?
            .etcd;
        let document = lines.next().unwrap_or("");
        if document.len() != meta.bytes {
            return Err(corrupt(
                3,
                &format!(
                    "the document is {} bytes, the header says {}",
                    document.len(),
                    meta.bytes
                ),
            ));
        }
        if format!("{:016x}", fnv1a64(document.as_bytes())) != meta.fnv1a64 {
            return Err(corrupt(
                3,
                "the document does not match the header's hash (edited or damaged)",
            ));
        }
        if meta.key != self.key {
            return Err(format!(
                "{name}: the etcd cache holds key {}, not {}",
                meta.key, self.key
            ));
        }
        Ok(Some(Cached {
            revision: meta.revision,
            text,
        }))
    }
}

/// `s` as a TOML basic string on one line (a key may hold newlines; `toml`'s own writer
/// would make them a multi-line string, which a comment line cannot hold).
fn one_line_toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// FNV-1a, 64 bits: a checksum against a damaged file (not against tampering: whoever can
/// write the file can write a matching hash), and a short stable name for a key.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(dir: &Path, key: &str) -> Cache {
        Cache {
            path: dir.join("cache.toml"),
            key: key.to_owned(),
            explicit: true,
        }
    }

    #[test]
    fn a_stored_revision_reads_back_and_parses_as_the_document_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let key = "/tailguard/\"quoted\"\nkey";
        let c = cache(dir.path(), key);
        assert!(c.load().unwrap().is_none());
        let doc = "[[listeners]]\naddress = \"127.0.0.1:0\"\n";
        c.store(41, "old").unwrap();
        c.store(42, doc).unwrap();
        let cached = c.load().unwrap().unwrap();
        assert_eq!(cached.revision, 42);
        assert!(cached.text.ends_with(doc));
        // The header is comments: the file is the same TOML as the document.
        let whole: toml::Table = toml::from_str(&cached.text).unwrap();
        let bare: toml::Table = toml::from_str(doc).unwrap();
        assert_eq!(whole, bare);
        // No temporary file left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// Regression (issue 44): writers of one cache file (gateways on one host, one key)
    /// shared one temporary name, so one's rename took away the file another was writing.
    /// Eight writers at once, each from its own `Cache` as a process would: every write
    /// succeeds, the file holds one writer's whole revision, and no temporary file is left.
    #[test]
    fn writers_of_one_cache_at_once_never_fail_and_leave_one_whole_revision() {
        let dir = tempfile::tempdir().unwrap();
        let start = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            for writer in 0..8_i64 {
                let (dir, start) = (dir.path(), &start);
                s.spawn(move || {
                    let c = cache(dir, "/k");
                    start.wait();
                    for round in 0..50 {
                        let doc = format!("writer = {writer}\nround = {round}\n");
                        c.store(writer * 1000 + round, &doc)
                            .unwrap_or_else(|e| panic!("writer {writer}, round {round}: {e}"));
                    }
                });
            }
        });
        let cached = cache(dir.path(), "/k").load().unwrap().unwrap();
        let (writer, round) = (cached.revision / 1000, cached.revision % 1000);
        assert!(
            cached
                .text
                .ends_with(&format!("writer = {writer}\nround = {round}\n")),
            "{}",
            cached.text
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_cut_short_edited_or_headerless_file_or_another_keys_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path(), "/k");
        let name = c.path().display().to_string();
        c.store(7, "a = 1\nb = 2\n").unwrap();
        let good = std::fs::read_to_string(c.path()).unwrap();

        std::fs::write(c.path(), &good[..good.len() - 3]).unwrap();
        let e = c.load().unwrap_err();
        assert!(
            e.starts_with(&format!("{name}:3: corrupt etcd cache: the document is")),
            "{e}"
        );

        std::fs::write(c.path(), good.replace("b = 2", "b = 3")).unwrap();
        let e = c.load().unwrap_err();
        assert!(e.contains("does not match the header's hash"), "{e}");

        std::fs::write(c.path(), "a = 1\n").unwrap();
        let e = c.load().unwrap_err();
        assert_eq!(
            e,
            format!("{name}:1: corrupt etcd cache: no tailguard etcd cache header")
        );

        std::fs::write(c.path(), format!("{HEADER}\n# etcd = {{ key = 1 }}\n")).unwrap();
        let e = c.load().unwrap_err();
        assert!(
            e.starts_with(&format!("{name}:2: corrupt etcd cache: ")),
            "{e}"
        );

        std::fs::write(c.path(), &good).unwrap();
        let e = cache(dir.path(), "/other").load().unwrap_err();
        assert_eq!(
            e,
            format!("{name}: the etcd cache holds key /k, not /other")
        );
    }

    #[test]
    fn default_file_names_are_readable_and_differ_per_key() {
        let a = default_file_name("/tailguard/config");
        assert!(
            a.starts_with("etcd-tailguard_config-") && a.ends_with(".toml"),
            "{a}"
        );
        assert_ne!(default_file_name("/a/b"), default_file_name("/a_b"));
        assert!(!default_file_name("/../x").contains('/'));
    }

    #[test]
    fn an_empty_path_turns_the_cache_off() {
        assert_eq!(CacheSetting::from_path(PathBuf::new()), CacheSetting::Off);
        assert!(CacheSetting::Off.resolve("/k").is_none());
    }
}

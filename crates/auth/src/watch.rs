//! A file re-read when it changes, off the request path: a thread of its own looks at the
//! file's metadata every [`POLL`], and on a change reads and parses it and swaps the new
//! value in. The serving threads only load the current value (one atomic pointer load).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;

/// How often the file's metadata is looked at: 500 ms, so a revoked key stops working
/// within a second of the file's change, for one `stat` a half-second.
pub const POLL: Duration = Duration::from_millis(500);

/// What identifies a version of a file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp {
        modified: m.modified().ok(),
        len: m.len(),
        inode: m.ino(),
    })
}

/// Starts watching `path`: each new version is read and parsed by `parse` and, if it
/// parses, stored in `value`. A version that cannot be read or parsed leaves the last good
/// value in force and is logged once (a half-written file is read again at its next
/// change). The thread ends once `value` has no other owner (its config was replaced).
pub fn watch<T, F>(path: PathBuf, value: &Arc<ArcSwap<T>>, parse: F)
where
    T: Send + Sync + 'static,
    F: Fn(&str) -> Result<T, String> + Send + 'static,
{
    let weak: Weak<ArcSwap<T>> = Arc::downgrade(value);
    let mut last = stamp(&path);
    let spawned = std::thread::Builder::new()
        .name("tailguard-auth-watch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(POLL);
                let Some(value) = weak.upgrade() else {
                    return;
                };
                let now = stamp(&path);
                if now == last {
                    continue;
                }
                last = now;
                let read = std::fs::read_to_string(&path)
                    .map_err(|e| e.to_string())
                    .and_then(|text| parse(&text));
                match read {
                    Ok(v) => {
                        value.store(Arc::new(v));
                        tracing::info!(target: "tailguard::auth", file = %path.display(), "re-read");
                    }
                    Err(e) => tracing::warn!(
                        target: "tailguard::auth",
                        file = %path.display(),
                        "not re-read, the last good version stays: {e}"
                    ),
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!(target: "tailguard::auth", "no thread to watch a file: {e}");
    }
}

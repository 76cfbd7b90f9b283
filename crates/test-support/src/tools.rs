//! What the helpers that start a real server (etcd, Redis) share: whether its binary is
//! installed, and a fresh directory for its data.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// `true` when `program --version` runs. When it does not, the test fails with `install`
/// (how to install it), unless the environment variable `skip_var` is `1`: then it says so and
/// returns `false`, and the caller skips (CI installs every tool, so there nothing skips).
pub(crate) fn installed_or_skipped(program: &str, skip_var: &str, install: &str) -> bool {
    let present = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !present {
        assert!(
            std::env::var(skip_var).as_deref() == Ok("1"),
            "{program} is not installed: run scripts/install-tools ({install}), or set \
             {skip_var}=1 to skip the tests that need it"
        );
        eprintln!("{program} not installed and {skip_var}=1: skipping");
    }
    present
}

/// An empty directory of its own under the temporary directory (`tailguard-NAME-PID-N`).
pub(crate) fn fresh_dir(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tailguard-{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}

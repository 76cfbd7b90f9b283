//! The crate's one error type: what can go wrong reading CPU accounting or building a config.

use std::path::PathBuf;

/// Errors from the CPU readers and configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file under /proc or the cgroup tree could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file was read but did not have the expected shape.
    #[error("parsing {path}: {what}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was expected.
        what: &'static str,
    },
    /// A configuration value is out of range.
    #[error("invalid overload config: {0}")]
    Config(String),
}

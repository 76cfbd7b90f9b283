//! The one error type of this crate: everything that can go wrong before the first line.

use std::path::PathBuf;

/// Why an access log could not be configured or started.
///
/// Once a log runs, nothing fails towards the caller: write errors are counted and
/// reported by the writer thread (see [`crate::Stats`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A template names a variable this crate does not know.
    #[error("unknown access log variable `${name}` (known: {known})")]
    UnknownVariable {
        /// The variable as written, without the `$`.
        name: String,
        /// The list of known variables, for the message.
        known: &'static str,
    },
    /// A template is malformed (for example an unclosed `${`).
    #[error("invalid access log template at byte {offset}: {reason}")]
    Template {
        /// Byte offset in the template.
        offset: usize,
        /// What is wrong there.
        reason: &'static str,
    },
    /// A configuration value is out of range or contradicts another.
    #[error("invalid access log config: {0}")]
    Config(String),
    /// The log file could not be opened.
    #[error("cannot open access log file {path}: {source}")]
    Open {
        /// The path from the configuration.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The metric families could not be registered.
    #[error("access log metrics: {0}")]
    Metrics(#[from] tailguard_metrics::MetricsError),
    /// The writer thread could not be started.
    #[error("cannot start the access log writer thread: {0}")]
    Spawn(std::io::Error),
}

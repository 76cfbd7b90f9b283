//! The lab's one error type.

/// Everything the lab can fail with, each with what to fix.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A scenario file that does not parse or validate.
    #[error("scenario {path}: {why}")]
    Scenario {
        /// The file.
        path: String,
        /// What is wrong, with line and column when the parser knows them.
        why: String,
    },
    /// A child process (upstream, gateway, nginx) that failed to start or to become ready.
    #[error("{name}: {why}")]
    Child {
        /// Which child.
        name: String,
        /// What happened.
        why: String,
    },
    /// An I/O error from the OS.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

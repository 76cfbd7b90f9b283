//! The lab's one error type.

/// Everything the lab can fail with, each with what to fix.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A target or scrape URL the generator cannot use.
    #[error("bad URL `{url}`: {why}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// An invalid option or combination of options.
    #[error("{0}")]
    Config(String),
    /// A scenario file that does not parse or validate.
    #[error("scenario {path}: {why}")]
    Scenario {
        /// The file.
        path: String,
        /// What is wrong, with line and column when the parser knows them.
        why: String,
    },
    /// A report JSON that does not parse.
    #[error("report JSON: {0}")]
    Report(String),
    /// A `.hgrm` line that is not `value percentile ...`.
    #[error(".hgrm line {line}: cannot read `{text}`")]
    Hgrm {
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
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

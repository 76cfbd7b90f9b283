//! The load generator's one error type.

/// Everything the load generator can fail with, each with what to fix.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
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
    /// An I/O error from the OS.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

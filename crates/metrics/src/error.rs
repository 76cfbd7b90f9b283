//! The crate's one error type.

/// Everything that can go wrong when registering metrics, creating series or starting the
/// exporter. Recording on a handle never fails.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// A metric family name that the exposition formats cannot carry.
    #[error("invalid metric name {0:?}: must match [a-zA-Z_:][a-zA-Z0-9_:]*")]
    InvalidName(String),
    /// A label name that the exposition formats cannot carry, or one they reserve.
    #[error(
        "invalid label name {0:?}: must match [a-zA-Z_][a-zA-Z0-9_]* and not start with __ (histograms also reserve `le`)"
    )]
    InvalidLabelName(String),
    /// The same label name twice in one family.
    #[error("duplicate label name {0:?}")]
    DuplicateLabelName(String),
    /// Two families with the same name in one registry.
    #[error("metric family {0:?} is already registered")]
    DuplicateFamily(String),
    /// `get_or_create` was given a different number of label values than the family has names.
    #[error("family {family:?} has {expected} label names but {got} values were given")]
    LabelCount {
        /// The family's name.
        family: String,
        /// How many label names the family declares.
        expected: usize,
        /// How many values the caller passed.
        got: usize,
    },
    /// Histogram bucket bounds that are empty, unsorted, repeated or not finite.
    #[error("invalid histogram buckets {0:?}: need at least one finite bound, strictly ascending")]
    InvalidBuckets(Vec<f64>),
    /// The exporter could not bind its listener or start its thread.
    #[error("metrics exporter on {addr}: {source}")]
    Exporter {
        /// The address the exporter tried to listen on.
        addr: std::net::SocketAddr,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
}

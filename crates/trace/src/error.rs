//! The one error type of this crate: what can go wrong before the exporter runs.
//!
//! Once it runs nothing fails towards the caller: a failed export is retried, then its
//! spans are dropped and counted ([`crate::TraceMetrics`]).

/// Why tracing could not be configured or started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The collector endpoint is not an `http://` or `https://` URL.
    #[error("invalid OTLP endpoint `{endpoint}`: {reason}")]
    Endpoint {
        /// As given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A TLS file could not be read or does not hold what it should.
    #[error("OTLP TLS: {0}")]
    Tls(String),
    /// An extra header is not a valid HTTP header.
    #[error("invalid OTLP header `{0}`")]
    Header(String),
    /// The metric families could not be registered.
    #[error("trace metrics: {0}")]
    Metrics(#[from] tailguard_metrics::MetricsError),
    /// The exporter thread could not be started.
    #[error("cannot start the trace exporter thread: {0}")]
    Spawn(std::io::Error),
}

//! Integration tests of tailguard-metrics against real parts: real sockets, and the real
//! tools the exposition format is about (promtool, a prometheus server, Python's
//! prometheus_client parsers).

// Test helpers outside #[test] functions fail loudly too (clippy's allow-unwrap-in-tests only
// covers the test functions themselves).
#![allow(clippy::unwrap_used)]

mod axum_app;
mod cardinality;
mod concurrency;
mod exporter;
mod golden;
mod layer;
mod prometheus_server;
mod support;
mod tools;

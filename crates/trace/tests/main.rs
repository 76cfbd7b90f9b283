//! Integration tests of tailguard-trace: the exporter against real OTLP receivers on
//! 127.0.0.1 (HTTP and gRPC; accepting, failing, stalled, dead; over TLS), and the tower
//! layer.

mod export;
mod export_tls;
mod layer;

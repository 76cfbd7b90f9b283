//! Integration tests of tailguard-trace: the exporter against real OTLP receivers on
//! 127.0.0.1 (HTTP and gRPC; accepting, failing, stalled, dead), and the tower layer.

mod export;
mod layer;

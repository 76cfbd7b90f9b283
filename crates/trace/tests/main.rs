//! Integration tests of tailguard-trace: the exporter against real OTLP receivers on 127.0.0.1.

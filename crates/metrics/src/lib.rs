//! Prometheus metrics recorded in nanoseconds on per-thread shards, rendered and served off the request path.

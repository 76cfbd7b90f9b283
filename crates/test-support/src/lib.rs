//! Real upstreams and clients on 127.0.0.1:0 for tests.

//! Integration tests of the gateway: real listeners, upstreams and clients on 127.0.0.1:0.

mod access;
mod client_bounds;
mod config;
mod conformance;
mod cors;
mod dns;
mod downstream_http1;
mod downstream_http2;
mod errors;
mod forwarding;
mod h2spec;
mod health;
mod lifecycle;
mod listeners;
mod overload;
mod policy;
mod pool;
mod rate_limit;
mod retry;
mod routing;
mod sni;
mod support;
mod trace_propagation;
mod upstream_h2;
mod upstream_http1;
mod upstream_tls;

//! Integration tests of tailguard-overload: one binary, one module per concern.

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

mod axum_app;
mod balance;
mod breaker;
mod cgroup;
mod layers;
mod metrics;
mod props;
mod scripted;
mod sim;
mod sim_remote;

//! The integration tests of tailguard-auth.

// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

mod axum_app;
mod basic;
mod jwt_pool;

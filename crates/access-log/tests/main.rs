//! Integration tests of the access log against real files, FIFOs and devices.

// Test helpers outside `#[test]` functions panic on purpose: that is the failure report.
#![allow(clippy::unwrap_used)]

mod axum_app;
mod formats;
mod support;
mod writer;

//! Tests of the built `tailguard` binary: run as a separate process, driven by signals.

mod gateway;
mod support;

//! Integration tests of the lab: real servers on 127.0.0.1:0, real sockets, real processes.

// Test helpers outside `#[test]` functions panic on a failed setup too; that is the point.
#![allow(clippy::unwrap_used)]

mod children;
mod h2_attack;
mod report;
mod scenario;
mod support;
mod upstream;

//! Integration tests of the load generator: real servers on 127.0.0.1:0, real sockets.

// Test helpers outside `#[test]` functions panic on a failed setup too; that is the point.
#![allow(clippy::unwrap_used)]

mod coordinated_omission;
mod report;
mod rotate;
mod schedule;
mod scrape;
mod slowest;
mod support;
mod timeline;

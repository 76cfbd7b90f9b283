//! Tests of the test harnesses themselves, against the real tools they run.

mod jaeger;

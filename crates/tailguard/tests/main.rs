//! Tests of the built `tailguard` binary: run as a separate process, driven by signals.

mod access_log;
mod deploy;
mod etcd;
mod etcd_tls;
mod gateway;
mod listeners;
mod metrics;
mod support;

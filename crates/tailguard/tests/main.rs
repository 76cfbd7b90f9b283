//! Tests of the built `tailguard` binary, run as a separate process and driven by signals,
//! and of the scripts that install its tools.

mod access_log;
mod container;
mod debian;
mod deploy;
mod etcd;
mod etcd_tls;
mod gateway;
mod helm;
mod install_tools;
mod listeners;
mod load;
mod metrics;
mod support;
mod trace;
mod trace_jaeger;
mod valgrind;

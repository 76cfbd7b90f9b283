//! The client against a real etcd (Debian's `etcd-server`, started on free 127.0.0.1 ports
//! by `tailguard_test_support::etcd`): every call tailguard makes, on the wire.

mod auth;
mod kv;
mod tls;
mod watch;

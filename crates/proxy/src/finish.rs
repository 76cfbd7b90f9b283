//! The end of a request: the [`Finish`] its response body carries, and the one place a
//! finished request is reported (metrics, the access log, its spans, the trace line), once
//! per request.

use std::time::Instant;

use tailguard_http1::client::Connection;
use tailguard_policy::admission::AdmitGuard;

use crate::conn::Held;
use crate::record::RequestRecord;
use crate::snapshot::Snapshot;

/// Carried by a response body; when the body ends or is dropped, the request is finished.
#[derive(Debug)]
pub struct Finish {
    pub(crate) record: Box<RequestRecord>,
    pub(crate) held: Held,
    /// The upstream connection the response came on: back to its pool if the body was read
    /// to the end, else closed.
    pub(crate) upstream_conn: Option<Box<Connection>>,
    pub(crate) _admitted: Option<AdmitGuard>,
}

impl Drop for Finish {
    fn drop(&mut self) {
        let end = Instant::now();
        if let (Some(conn), true, Some((u, e))) = (
            self.upstream_conn.take(),
            self.record.completed,
            self.record.endpoint,
        ) {
            self.held.snapshot().upstreams[u].endpoints[e]
                .pool
                .release(conn, end);
        }
        let snapshot = self.held.snapshot();
        let r = &mut *self.record;
        if let Some(trace) = r.trace.as_mut() {
            let ended = crate::trace::Ended {
                start: r.start,
                end,
                method: &r.method,
                uri: &r.uri,
                version: r.version,
                remote: r.remote,
                route: r.route.map(|i| &*snapshot.router.get(i).id),
                upstreams: &snapshot.upstreams,
                status: r.status,
                error: r.error,
                upstream_status: r.upstream_status,
                grpc: r.grpc,
                grpc_status: r.grpc_status,
                consumer: r.consumer.as_deref(),
                auth_result: r.auth_result.map(tailguard_auth::AuthResult::as_str),
            };
            crate::trace::finish(&snapshot.tracing, trace, &ended);
        }
        finish(&self.record, snapshot, end);
        crate::access_log::log(
            self.held.access_log(),
            &self.record,
            &snapshot.router,
            &snapshot.upstreams,
            end,
        );
    }
}

/// Seam: THE place a finished request is reported, once per request, after the last
/// response byte was handed to the connection (or the response was abandoned). Metrics
/// (status, durations, bytes) and the access-log line are recorded here, through handles
/// held by the route and endpoint (`snapshot.router.get(route)`,
/// `snapshot.upstreams[u].endpoints[e]`), never looked up by name.
pub fn finish(record: &RequestRecord, snapshot: &Snapshot, end: Instant) {
    crate::metrics::finish(record, &snapshot.metrics, end);
    let route = record.route.map(|r| &*snapshot.router.get(r).id);
    let upstream_addr = record
        .endpoint
        .map(|(u, e)| snapshot.upstreams[u].endpoints[e].addr);
    tracing::trace!(
        target: "tailguard::request",
        remote = %record.remote,
        method = %record.method,
        uri = %record.uri,
        status = record.status,
        route,
        upstream = ?upstream_addr,
        upstream_status = record.upstream_status,
        upstream_us = record.upstream_time.map(|d| d.as_micros() as u64),
        bytes_in = record.bytes_in(),
        bytes_out = record.bytes_out,
        duration_us = end.duration_since(record.start).as_micros() as u64,
        completed = record.completed,
        "request finished"
    );
}

//! The exchanges that retry a failed try on another endpoint (HTTP/1.1 and HTTP/2
//! upstreams) under a route's `retry`, as [`tailguard_policy::retry_policy`] built it from
//! the config (`timeouts = { connect_ms, request_ms, read_ms }` and `retry = { attempts,
//! on, backoff_ms, buffer_bytes }`; [`tailguard_config::retry`] has them and their checks).
//!
//! What a route pays: a route without `timeouts` and `retry` reads three `None`s and one
//! more on the request path (the plain exchange of `forward.rs`, unchanged, with its one
//! connect retry). A route with `retry` takes the loop here, boxed so the plain exchange's
//! future does not grow by it. A try that is retried pays what a retry costs anyway (a pick,
//! a budget withdrawal, a backoff on the connection's own timer). On HTTP/1.1 a bodiless
//! request's head is reused (`client::send` gives a bodiless request back with its answer),
//! except when `timeout` is a condition: a try cut by its timeout takes the request with
//! it, so such a route copies the head before each try that may be retried (a `HeaderMap`
//! clone into a recycled box); so does a request with a body, which its send keeps. An
//! HTTP/2 send always consumes the request: a retrying route to an HTTP/2 upstream copies
//! the head before each try that may be retried.
//!
//! The rules, for both protocols:
//! - `attempts` counts tries, the first included (nginx `proxy_next_upstream_tries`, gRPC
//!   `maxAttempts`): `attempts = 3` is Envoy's `num_retries = 2`.
//! - Only an idempotent method (GET, HEAD, OPTIONS, PUT, DELETE) is retried, and every
//!   retry takes one from the upstream's retry budget
//!   ([`tailguard_policy::overload::Overload::may_retry`]).
//! - A request body of at most `buffer_bytes` is kept while a try that may be retried is in
//!   flight (`tailguard_http::replay`: it still streams to the first try as it arrives),
//!   within a byte budget per serving thread
//!   ([`tailguard_http::replay::THREAD_BUDGET_BYTES`]); a larger one, or one the budget has
//!   no room for, is forwarded all the same and not retried. A route
//!   that retries only `connect` keeps no body: a failed connect gives the request back
//!   unsent.
//! - The keep-alive race (HTTP/1.1): a request sent on a reused connection that closed
//!   before any byte of an answer came goes once more on a new connection, within its try
//!   (no retry counted, no budget taken): a bodiless idempotent one as in the plain
//!   exchange, and one with a body still kept whole, whatever its method: the upstream
//!   closed the connection as the request went out and never answered it. A non-idempotent
//!   request's body is kept for that alone (`Resend::Unanswered`); no condition retries it.
//! - A try that met a condition and is not retried for its method, its body or the budget
//!   is counted by why (`tailguard_upstream_retries_skipped_total`, [`Skip`]).
//! - A `502`/`503`/`504` answer is looked at before any byte of it goes to the client; a
//!   retried one is discarded (HTTP/1.1: read from what already arrived and its connection
//!   pooled if that is the whole body and the request body went whole, else closed; HTTP/2:
//!   its stream reset). The last try's answer, or one that is not retried, goes to the client
//!   as it is.
//! - `request_ms` bounds each try, from its dispatch to its response head.
//! - Every pick is completed once with its outcome, and every try's outcome is recorded for
//!   passive ejection; the breaker of the route sees the request once, with its final
//!   outcome.

use std::time::{Duration, Instant};

use futures_util::FutureExt as _;
use http::{HeaderMap, Method, Request, Response, Uri, Version};
use http_body::Body as _;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use tailguard_access_log::UpstreamTry;
use tailguard_http::body::{IncomingBody, RequestBody};
use tailguard_http::error::Error;
use tailguard_http::replay::{self, Kept};
use tailguard_http1::client::{self, SendError};
use tailguard_http1::timer::LazyTimer;
use tailguard_policy::retry_policy::{Reason, RetryPolicy, Skip};
use tailguard_policy::route::Route;
use tailguard_upstream::balance::Outcome;
use tailguard_upstream::h2::{H2Pool, StreamGuard};
use tailguard_upstream::pool::EndpointPool;
use tailguard_upstream::upstream::Upstream;

use crate::record::RequestRecord;
use crate::snapshot::Snapshot;

/// How an exchange that got no answer ended, for the balancer and ejection.
fn outcome_of(e: &Error) -> Outcome {
    match e {
        Error::UpstreamConnect { .. } | Error::UpstreamTls { .. } => Outcome::ConnectFailed,
        Error::UpstreamTimeout { .. } => Outcome::Timeout,
        Error::UpstreamBroken { .. } => Outcome::Broken,
        _ => Outcome::Aborted,
    }
}

/// The endpoint for the next try: the balancer's pick, asked once more if it offers the
/// endpoint that just failed (that pick is released unused); if it offers that one again,
/// it is all the balancer has up, and it is tried again.
fn next_endpoint(snap: &Snapshot, upstream_index: usize, failed: usize) -> Option<usize> {
    let upstream = &snap.upstreams[upstream_index];
    let pick = upstream.pick()?;
    snap.metrics.picked(upstream_index, pick);
    if pick != failed || upstream.endpoints.len() < 2 {
        return Some(pick);
    }
    match upstream.pick() {
        Some(again) => {
            snap.metrics.picked(upstream_index, again);
            upstream
                .balance
                .complete(pick, Outcome::Aborted, Duration::ZERO);
            Some(again)
        }
        None => Some(pick),
    }
}

/// How a request can be sent again, decided before its first try.
enum Resend {
    /// No body: its head is all a later try needs.
    Bodiless,
    /// Its body is kept for later tries (while it can be: [`Kept::unkept`]).
    Kept(Kept<RequestBody>),
    /// Its body is not kept, as the route retries only a failed connect: it goes again
    /// only when a try gives it back unsent.
    Unsent,
    /// Not idempotent, with a body kept all the same (HTTP/1.1): sent again only after the
    /// keep-alive race, when a reused connection closed before any byte of an answer (the
    /// upstream closed it as the request went out, so never read it). No retry condition
    /// sends it again.
    Unanswered(Kept<RequestBody>),
    /// Never sent again.
    Never(Skip),
}

impl Resend {
    /// Decides for `req` under `policy`; a body kept is replaced by its first try's reader.
    /// `h1`: the upstream speaks HTTP/1.1, where a non-idempotent request's body is kept for
    /// the keep-alive race ([`Resend::Unanswered`]).
    fn prepare(req: &mut Request<RequestBody>, policy: &RetryPolicy, h1: bool) -> Resend {
        let idempotent = tailguard_policy::overload::idempotent(req.method());
        let bodiless = req.body().is_end_stream();
        if !idempotent && (bodiless || !h1 || !policy.retries_after_sending()) {
            return Resend::Never(Skip::Method);
        }
        if bodiless {
            return Resend::Bodiless;
        }
        if !policy.retries_after_sending() {
            return Resend::Unsent;
        }
        let body = std::mem::replace(req.body_mut(), RequestBody::unlimited(IncomingBody::Empty));
        match Kept::new(body, policy.buffer_bytes, replay::thread_budget()) {
            Ok((kept, first)) => {
                *req.body_mut() = RequestBody::unlimited(IncomingBody::Kept(first));
                if idempotent {
                    Resend::Kept(kept)
                } else {
                    Resend::Unanswered(kept)
                }
            }
            Err((body, why)) => {
                *req.body_mut() = body;
                Resend::Never(if idempotent { why.into() } else { Skip::Method })
            }
        }
    }

    /// Whether a later try could still send the request (a body can stop being kept).
    fn possible(&self) -> bool {
        match self {
            Resend::Bodiless | Resend::Unsent => true,
            Resend::Kept(kept) => kept.unkept().is_none(),
            Resend::Unanswered(_) | Resend::Never(_) => false,
        }
    }

    /// The kept body, while it can still be sent again: what a try on a reused connection
    /// resends after the keep-alive race.
    fn kept_whole(&self) -> Option<&Kept<RequestBody>> {
        match self {
            Resend::Kept(kept) | Resend::Unanswered(kept) if kept.unkept().is_none() => Some(kept),
            _ => None,
        }
    }

    /// Whether a try that may be retried needs a copy of the head made before it, the send
    /// not giving the request back: an HTTP/2 send (`h2`), a try cut by its timeout, a send
    /// with a body.
    fn needs_copy(&self, h2: bool, policy: &RetryPolicy) -> bool {
        match self {
            Resend::Bodiless => h2 || policy.retries_on(Reason::Timeout),
            Resend::Kept(_) => true,
            Resend::Unsent | Resend::Unanswered(_) | Resend::Never(_) => false,
        }
    }

    /// Whether a try that met a retry condition may be sent again (`unsent`: the try gave
    /// the request back untouched); if not, why, when that is worth counting.
    fn may_resend(&self, unsent: bool) -> Result<(), Option<Skip>> {
        match self {
            Resend::Bodiless => Ok(()),
            Resend::Kept(kept) => kept.unkept().map_or(Ok(()), |why| Err(Some(why.into()))),
            Resend::Unsent if unsent => Ok(()),
            Resend::Unsent => Err(None),
            Resend::Unanswered(_) => Err(Some(Skip::Method)),
            Resend::Never(skip) => Err(Some(*skip)),
        }
    }

    /// No try follows the next one: a kept body is released as it goes out.
    fn stop(&self) {
        if let Resend::Kept(kept) | Resend::Unanswered(kept) = self {
            kept.stop();
        }
    }

    /// Gives the next try its body: the kept one, from its start. (The try before gets no
    /// more of it.)
    fn rearm(&self, body: &mut RequestBody) {
        if let Resend::Kept(kept) | Resend::Unanswered(kept) = self {
            *body = RequestBody::unlimited(IncomingBody::Kept(kept.next_try()));
        }
    }
}

/// A try that ended, as the retry decision sees it: where and when it went, what it ended
/// with, and what is left to send again. Both protocols' loops build one.
struct TryEnd<'e> {
    endpoint: usize,
    started: Instant,
    /// The answer's status, if the try had one.
    status: Option<u16>,
    /// Why it got no answer, if it did not.
    failure: Option<&'e Error>,
    /// The try gave the request back untouched.
    unsent: bool,
    /// A request for the next try is at hand (given back, or copied before the try).
    at_hand: bool,
}

/// Decides whether a try that met retry condition `reason` is retried: counts why not if it
/// is not, else hands over to [`retry_after`] if a request for the next try is at hand.
fn decide_retry(
    snap: &Snapshot,
    route: &Route,
    resend: &Resend,
    reason: Reason,
    end: &TryEnd<'_>,
    record: &mut RequestRecord,
) -> Option<usize> {
    match resend.may_resend(end.unsent) {
        Err(skip) => {
            if let Some(skip) = skip {
                route
                    .tries
                    .count_skipped(snap.metrics.gateway.retries_skipped(), &route.id, skip);
            }
            None
        }
        Ok(()) if !end.at_hand => None,
        Ok(()) => retry_after(snap, route, reason, end, record),
    }
}

/// A copy of a request's head, for a try that may not give the request back.
fn copy_head<B>(req: &Request<B>) -> Box<Request<RequestBody>> {
    HeadRef::of(req).copy()
}

/// A request's head, borrowed without its body: a try holds it across its awaits, which a
/// borrowed request cannot be (its body is not `Sync`, so the future would not be `Send`).
#[derive(Clone, Copy)]
struct HeadRef<'r> {
    method: &'r Method,
    uri: &'r Uri,
    version: Version,
    headers: &'r HeaderMap,
}

impl<'r> HeadRef<'r> {
    fn of<B>(req: &'r Request<B>) -> HeadRef<'r> {
        HeadRef {
            method: req.method(),
            uri: req.uri(),
            version: req.version(),
            headers: req.headers(),
        }
    }

    /// The head again, in a recycled request with no body.
    fn copy(self) -> Box<Request<RequestBody>> {
        let mut copy = tailguard_http::recycle::request(self.headers.len());
        *copy.method_mut() = self.method.clone();
        *copy.uri_mut() = self.uri.clone();
        *copy.version_mut() = self.version;
        copy.headers_mut().clone_from(self.headers);
        copy
    }
}

/// What one try ended with.
enum Ended<R> {
    Answer(R),
    Failed(Error),
}

impl<R> Ended<R> {
    /// The answer's status (read by `status_of`) or the failure: what the try's span, the
    /// retry condition and the retry decision are told.
    fn outcome(&self, status_of: impl FnOnce(&R) -> u16) -> (Option<u16>, Option<&Error>) {
        match self {
            Ended::Answer(answer) => (Some(status_of(answer)), None),
            Ended::Failed(e) => (None, Some(e)),
        }
    }
}

/// The retry condition a try's outcome meets, if any.
fn condition_met(
    policy: &RetryPolicy,
    status: Option<u16>,
    failure: Option<&Error>,
) -> Option<Reason> {
    match (status, failure) {
        (Some(status), _) => policy.reason_of_status(status),
        (None, Some(e)) => policy.reason_of_error(e),
        (None, None) => None,
    }
}

/// Decides whether a try that ended is retried, and if so does the bookkeeping of the try
/// it leaves (its pick completed, its outcome recorded, the retry counted and logged) and
/// returns the endpoint of the next one.
fn retry_after(
    snap: &Snapshot,
    route: &Route,
    reason: Reason,
    end: &TryEnd<'_>,
    record: &mut RequestRecord,
) -> Option<usize> {
    let TryEnd {
        endpoint,
        started,
        status,
        failure,
        ..
    } = *end;
    let upstream: &Upstream<RequestBody> = &snap.upstreams[route.upstream];
    // The budget is asked last: a `true` takes a retry from it. (Method and body were
    // checked by the caller; `may_retry` checks them again, cheaply.)
    if !snap
        .overload
        .may_retry(route.upstream, &record.method, false)
    {
        route.tries.count_skipped(
            snap.metrics.gateway.retries_skipped(),
            &route.id,
            Skip::RetryBudget,
        );
        return None;
    }
    let next = next_endpoint(snap, route.upstream, endpoint)?;
    let outcome = match (status, failure) {
        (Some(s), _) => Outcome::Status(s),
        (None, Some(e)) => outcome_of(e),
        (None, None) => Outcome::Aborted,
    };
    upstream
        .balance
        .complete(endpoint, outcome, started.elapsed());
    upstream.record(endpoint, outcome);
    let addr = upstream.endpoints[endpoint].addr;
    let shown = status.unwrap_or_else(|| failure.map_or(502, |e| e.status().as_u16()));
    record.earlier_tries.push(UpstreamTry {
        addr,
        status: shown,
    });
    record.trace_retrying(reason.as_str());
    route
        .tries
        .count(snap.metrics.gateway.retries(), &route.id, reason);
    tracing::debug!(
        target: "tailguard::request",
        route = %route.id,
        upstream = %upstream.name,
        failed = %addr,
        retry = %upstream.endpoints[next].addr,
        reason = reason.as_str(),
        "retrying on {}",
        upstream.endpoints[next].addr
    );
    Some(next)
}

/// Shows the one connect retry of a route without `retry` (the plain exchange's) like any
/// other: the failed endpoint in the request's tries, the retry counted.
pub(crate) fn note_connect_retry(
    snap: &Snapshot,
    route: &Route,
    failed: usize,
    err: &Error,
    record: &mut RequestRecord,
) {
    record.earlier_tries.push(UpstreamTry {
        addr: snap.upstreams[route.upstream].endpoints[failed].addr,
        status: err.status().as_u16(),
    });
    record.trace_retrying(Reason::Connect.as_str());
    route
        .tries
        .count(snap.metrics.gateway.retries(), &route.id, Reason::Connect);
}

/// The error of a try whose `request_ms` ran out: the upstream's, unless the client was
/// still sending its body (then the client is the slow one; never for a gRPC call, whose
/// streams are the upstream's to answer).
fn timed_out(record: &RequestRecord, addr: std::net::SocketAddr) -> Error {
    match &record.bytes_in {
        Some(count) if !tailguard_http::body::body_ended(count) && !record.grpc => {
            Error::DownstreamTimeout { phase: "request" }
        }
        _ => Error::UpstreamTimeout {
            addr,
            phase: "request",
        },
    }
}

/// An HTTP/1.1 upstream response whose body streams from its connection.
type UpstreamBody = client::UpstreamBody<RequestBody>;

/// A try's result: the answer and the request back (if it was sent whole), or the error and
/// the request back (if it was not consumed).
type TryResult = Result<
    (Response<UpstreamBody>, Option<Box<Request<RequestBody>>>),
    (Error, Option<Box<Request<RequestBody>>>),
>;

/// What a try on an HTTP/1.1 endpoint can send again after the keep-alive race when its
/// request has a body (a bodiless one comes back from the send itself).
struct RaceResend<'r> {
    resend: &'r Resend,
    /// The head copied before the try for a later one, if it was.
    spare: Option<HeadRef<'r>>,
    /// No retry can follow the try: a kept body is released once nothing can resend it.
    last: bool,
}

/// One try on an HTTP/1.1 endpoint: a pooled or new connection (connect within `connect`),
/// the request (with the `extra` field lines), the response head. A connection the upstream
/// had closed as it was taken (the keep-alive race: no byte of an answer came on a reused
/// connection) gets the request once more on a new one: a bodiless idempotent one as in the
/// plain exchange, one with a body if that body is still kept whole (`race`), which
/// `retry.buffer_bytes` allows for any method, the upstream having read none of it.
async fn send_try(
    pool: &EndpointPool,
    now: Instant,
    connect: Option<Duration>,
    req: Box<Request<RequestBody>>,
    extra: &[&[u8]],
    race: RaceResend<'_>,
) -> TryResult {
    let (conn, reused) = match pool.checkout_within(now, connect).await {
        Ok(c) => c,
        Err(e) => return Err((e.into(), Some(req))),
    };
    // A new connection meets no race: on the last try nothing needs the body kept.
    if !reused && race.last {
        race.resend.stop();
    }
    // The send takes the request: the head for a resend is copied now if the try made no
    // copy of it (only a kept body on a reused connection can need one).
    let own_copy = (reused && race.spare.is_none() && race.resend.kept_whole().is_some())
        .then(|| copy_head(&req));
    let stale = match client::send(conn, req, reused, extra).await {
        Ok(sent) => {
            if let Some(unused) = own_copy {
                tailguard_http::recycle::give_request(unused);
            }
            return Ok(sent);
        }
        Err(SendError::Failed(e)) => return Err((e.into(), None)),
        Err(SendError::Stale(req)) => req,
        Err(SendError::StaleSent(e)) => {
            let head = own_copy.or_else(|| race.spare.map(HeadRef::copy));
            match head {
                // The body may have stopped being kept while the try sent it.
                Some(mut head) if race.resend.kept_whole().is_some() => {
                    race.resend.rearm(head.body_mut());
                    if race.last {
                        race.resend.stop();
                    }
                    head
                }
                head => {
                    if let Some(unused) = head {
                        tailguard_http::recycle::give_request(unused);
                    }
                    return Err((e.into(), None));
                }
            }
        }
    };
    // Boxed: only the rare resend pays for its future's size.
    Box::pin(resend_stale(pool, connect, stale, extra)).await
}

/// Sends a request again on a new connection after the keep-alive race.
async fn resend_stale(
    pool: &EndpointPool,
    connect: Option<Duration>,
    req: Box<Request<RequestBody>>,
    extra: &[&[u8]],
) -> TryResult {
    let conn = match pool.connect_within(connect).await {
        Ok(c) => c,
        Err(e) => return Err((e.into(), Some(req))),
    };
    match client::send(conn, req, false, extra).await {
        Ok(sent) => Ok(sent),
        Err(SendError::Failed(e) | SendError::StaleSent(e)) => Err((e.into(), None)),
        Err(SendError::Stale(_)) => Err((
            Error::UpstreamBroken {
                addr: pool.addr(),
                reason: "connection closed before a response".to_string(),
            },
            None,
        )),
    }
}

/// Throws away an answer that is retried. A small one usually arrived whole with its head:
/// its body is read from what is already buffered (no wait) and, if that was all of it, the
/// connection goes back to the pool. Anything else closes the connection: waiting for a body
/// nobody reads would hold the retry back.
fn discard(mut resp: Response<UpstreamBody>, pool: &EndpointPool) {
    let body = resp.body_mut();
    // A bound on frames taken without waiting: a chunked body of many small chunks is not
    // worth walking for one connection.
    for _ in 0..16 {
        match body.frame().now_or_never() {
            Some(Some(Ok(_))) => {}
            Some(None) => {
                if let Some(conn) = body.take_reusable() {
                    pool.release(conn, Instant::now());
                }
                return;
            }
            Some(Some(Err(_))) | None => return,
        }
    }
}

/// Sends a request to an HTTP/1.1 upstream under route `route`'s `retry` (the route's
/// timeouts given: `request` per try, `connect` per connect), starting on endpoint `first`
/// picked at `dispatched`. Returns the last try's result, its endpoint and when it started.
/// The caller completes the last pick and records its outcome, as for a request tried once.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn exchange_http1(
    snap: &Snapshot,
    route: &Route,
    policy: &RetryPolicy,
    first: usize,
    req: Box<Request<RequestBody>>,
    dispatched: Instant,
    timer: &mut LazyTimer,
    record: &mut RequestRecord,
    request: Option<Duration>,
    connect: Option<Duration>,
    gateway_lines: &[&[u8]; 3],
) -> (Result<Response<UpstreamBody>, Error>, usize, Instant) {
    let upstream = &snap.upstreams[route.upstream];
    let mut req = req;
    let resend = Resend::prepare(&mut req, policy, true);
    let mut endpoint = first;
    let mut started = dispatched;
    let mut tries = 1;
    loop {
        let more = tries < policy.attempts;
        let may_retry = more && resend.possible();
        // (A body kept for the keep-alive race is stopped by `send_try`, once it knows.)
        // Cut by its timeout, a try drops the request with it; sent with a body, it keeps it.
        let mut spare = (may_retry && resend.needs_copy(false, policy)).then(|| copy_head(&req));
        let pool = &upstream.endpoints[endpoint].pool;
        let traceparent =
            record.trace_try_started_h1(req.headers_mut(), (route.upstream, endpoint), started);
        let extra = crate::record::head_lines(gateway_lines, &traceparent);
        let race = RaceResend {
            resend: &resend,
            spare: spare.as_deref().map(HeadRef::of),
            last: !may_retry,
        };
        let result = {
            let sent = std::pin::pin!(send_try(pool, started, connect, req, &extra, race));
            match request {
                Some(limit) => {
                    let deadline = tokio::time::Instant::from_std(started + limit);
                    timer.limit(deadline, sent).await
                }
                None => Some(sent.await),
            }
        };
        let result = result.unwrap_or_else(|| Err((timed_out(record, pool.addr()), spare.take())));
        let (ended, back) = match result {
            Ok((resp, back)) => (Ended::Answer(resp), back),
            Err((e, back)) => (Ended::Failed(e), back),
        };
        let at = Instant::now();
        let (status, failure) = ended.outcome(|resp| resp.status().as_u16());
        record.trace_try_ended(status, failure.map(Error::kind), at);
        let reason = if more {
            condition_met(policy, status, failure)
        } else {
            None
        };
        let unsent = back.is_some();
        let again = match (back, spare) {
            (Some(back), spare) => {
                if let Some(unused) = spare {
                    tailguard_http::recycle::give_request(unused);
                }
                Some(back)
            }
            (None, spare) => spare,
        };
        let end = TryEnd {
            endpoint,
            started,
            status,
            failure,
            unsent,
            at_hand: again.is_some(),
        };
        let next =
            reason.and_then(|reason| decide_retry(snap, route, &resend, reason, &end, record));
        let (next, mut again) = match (next, again) {
            (Some(next), Some(again)) => (next, again),
            (_, again) => {
                if let Some(req) = again {
                    tailguard_http::recycle::give_request(req);
                }
                let result = match ended {
                    Ended::Answer(resp) => Ok(resp),
                    Ended::Failed(e) => Err(e),
                };
                return (result, endpoint, started);
            }
        };
        // Before the discard: the retried try's body writer gets no more of the body.
        resend.rearm(again.body_mut());
        if let Ended::Answer(resp) = ended {
            discard(resp, pool);
        }
        let wait = policy.backoff(tries);
        if !wait.is_zero() {
            // On the connection's own timer: a backoff registers no timer of its own.
            let until = tokio::time::Instant::now() + wait;
            timer.limit(until, std::future::pending::<()>()).await;
        }
        req = again;
        endpoint = next;
        started = Instant::now();
        tries += 1;
    }
}

/// A stream on an HTTP/2 endpoint's connections, waiting at most `connect` for one when the
/// route sets its own `connect_ms` (connections are shared by every route to the endpoint,
/// so a route's own connect timeout bounds its wait; the connection itself opens under the
/// global one).
pub(crate) async fn h2_stream(
    pool: &H2Pool<RequestBody>,
    connect: Option<Option<Duration>>,
) -> Result<
    (
        hyper::client::conn::http2::SendRequest<RequestBody>,
        StreamGuard,
    ),
    Error,
> {
    match connect {
        Some(Some(limit)) => match tokio::time::timeout(limit, pool.stream()).await {
            Ok(r) => r.map_err(Error::from),
            Err(_) => Err(Error::UpstreamTimeout {
                addr: pool.addr(),
                phase: "connect",
            }),
        },
        _ => pool.stream().await.map_err(Error::from),
    }
}

/// An HTTP/2 request's head again, for the next try (an HTTP/2 send consumes it); its body
/// is given by [`Resend::rearm`].
fn copy_h2(req: &Request<RequestBody>) -> Request<RequestBody> {
    let mut copy = Request::new(RequestBody::unlimited(IncomingBody::Empty));
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    copy.headers_mut().clone_from(req.headers());
    copy
}

/// The HTTP/2 counterpart of [`exchange_http1`]: each try a stream on the endpoint's
/// connections; a retried answer's stream is reset (dropped), its connection stays.
/// `deadline` (a gRPC call's) bounds every try and ends the retries: a try it cuts is not
/// retried.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn exchange_h2(
    snap: &Snapshot,
    route: &Route,
    policy: &RetryPolicy,
    first: usize,
    req: Request<RequestBody>,
    dispatched: Instant,
    record: &mut RequestRecord,
    request: Option<Duration>,
    deadline: Option<Instant>,
) -> (
    Result<(Response<Incoming>, StreamGuard), Error>,
    usize,
    Instant,
) {
    let upstream = &snap.upstreams[route.upstream];
    let mut req = req;
    let resend = Resend::prepare(&mut req, policy, false);
    let mut endpoint = first;
    let mut started = dispatched;
    let mut tries = 1;
    loop {
        let more = tries < policy.attempts;
        let may_retry = more && resend.possible();
        if !may_retry {
            resend.stop();
        }
        // The send consumes the request: the next try needs a copy.
        let spare = (may_retry && resend.needs_copy(true, policy)).then(|| copy_h2(&req));
        let pool = upstream.endpoints[endpoint]
            .h2
            .as_ref()
            .expect("an HTTP/2 upstream's endpoints have HTTP/2 pools");
        let connect = route.tries.h2_connect();
        record.trace_try_started(
            req.headers_mut(),
            (route.upstream, endpoint),
            Instant::now(),
        );
        let sent = async {
            // A failed connect sent nothing: the request comes back.
            let (send, stream) = match h2_stream(pool, connect).await {
                Ok(s) => s,
                Err(e) => return (Err(e), Some(req)),
            };
            (
                pool.send(send, stream, req).await.map_err(Error::from),
                None,
            )
        };
        let limit = match (request.map(|l| started + l), deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let (result, back) = match limit {
            Some(limit) => match tokio::time::timeout_at(limit.into(), sent).await {
                Ok(r) => r,
                Err(_) => (Err(timed_out(record, pool.addr())), None),
            },
            None => sent.await,
        };
        let last = !more || deadline.is_some_and(|d| Instant::now() >= d);
        let ended = match result {
            Ok(answer) => Ended::Answer(answer),
            Err(e) => Ended::Failed(e),
        };
        let at = Instant::now();
        let (status, failure) = ended.outcome(|(resp, _)| resp.status().as_u16());
        record.trace_try_ended(status, failure.map(Error::kind), at);
        let reason = if last {
            None
        } else {
            condition_met(policy, status, failure)
        };
        let unsent = back.is_some();
        let again = back.or(spare);
        let end = TryEnd {
            endpoint,
            started,
            status,
            failure,
            unsent,
            at_hand: again.is_some(),
        };
        let next =
            reason.and_then(|reason| decide_retry(snap, route, &resend, reason, &end, record));
        let (Some(next), Some(mut again)) = (next, again) else {
            let result = match ended {
                Ended::Answer(answer) => Ok(answer),
                Ended::Failed(e) => Err(e),
            };
            return (result, endpoint, started);
        };
        resend.rearm(again.body_mut());
        // A retried answer: dropping it resets its stream.
        drop(ended);
        let wait = policy.backoff(tries);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        req = again;
        endpoint = next;
        started = Instant::now();
        tries += 1;
    }
}

/// The endpoint to retry a failed connect on, if the request may be retried: the
/// balancer's next pick that is not `failed` (never a down endpoint: the balancer skips
/// those).
pub(crate) fn retry_endpoint<B: http_body::Body>(
    snap: &Snapshot,
    upstream_index: usize,
    failed: usize,
    req: &Request<B>,
    err: &Error,
) -> Option<usize> {
    let upstream = &snap.upstreams[upstream_index];
    let n = upstream.endpoints.len();
    let connect_failed = matches!(
        err,
        Error::UpstreamConnect { .. }
            | Error::UpstreamTls { .. }
            | Error::UpstreamTimeout {
                phase: "connect",
                ..
            }
    );
    if n < 2
        || !connect_failed
        || !snap
            .overload
            .may_retry(upstream_index, req.method(), !req.body().is_end_stream())
    {
        return None;
    }
    // Every pick is completed exactly once (the balancer counts in-flight requests): a pick
    // of the failed endpoint is released unused, and after two such picks there is no retry.
    for _ in 0..2 {
        let pick = upstream.pick()?;
        snap.metrics.picked(upstream_index, pick);
        if pick != failed {
            return Some(pick);
        }
        upstream
            .balance
            .complete(pick, Outcome::Aborted, Duration::ZERO);
    }
    None
}

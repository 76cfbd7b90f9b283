//! One downstream connection's protocols: plain or TLS (the handshake, ALPN), HTTP/1.1
//! (the engine's server, parked when idle) or HTTP/2 (hyper), and its drain.

use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use http::Request;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tailguard_http::body::{IncomingBody, RequestBody};
use tailguard_http1::server::{self as downstream, Reader};
use tailguard_http1::timer::LazyTimer;
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::OwnedSemaphorePermit;
use tokio_rustls::TlsAcceptor;

use super::send_watch::{SendWatch, Watched};
use super::settings::Settings;
use crate::conn::ConnCtx;
use crate::drain::Watch;
use crate::handler::Http1Handler;
use crate::metrics::{ConnectionGuard, ParkedGuard};
use crate::park::{Parker, Parking};

/// A TLS handshake gets this long; a client that stalls it holds a connection slot.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a connection keeps from its accept to its close, served or parked.
pub(super) struct Admitted {
    /// The listener's settings at the accept.
    pub(super) settings: Arc<Settings>,
    pub(super) remote: SocketAddr,
    /// Its place under the listener's connection limit.
    pub(super) _permit: OwnedSemaphorePermit,
    /// Counts it in `tailguard_downstream_connections_active`.
    pub(super) _counted: ConnectionGuard,
}

/// What a parked connection keeps: its [`Admitted`], and its count as parked.
pub(super) struct Parked {
    pub(super) admitted: Admitted,
    pub(super) gauge: ParkedGuard,
}

/// Serves one connection, plain or TLS: HTTP/2 when ALPN chose it or (plain) the client
/// opened with the HTTP/2 preface (h2c with prior knowledge), else HTTP/1.1.
pub(super) async fn serve_connection(
    stream: TcpStream,
    admitted: Admitted,
    ctx: Arc<ConnCtx>,
    shutdown: Watch,
    parker: Arc<Parker<Parked>>,
) {
    if let Some(acceptor) = admitted.settings.tls.clone() {
        // Boxed: as a part of the connection's task, the TLS path's state (the TLS stream,
        // 1.2 KB, beside the HTTP/1.1 connection's future) sized every connection's task,
        // plain HTTP/1.1 ones included: 2.7 KB, where a plain connection's needs ~1 KB.
        let settings = Arc::clone(&admitted.settings);
        Box::pin(serve_tls_connection(
            stream, acceptor, settings, ctx, shutdown,
        ))
        .await;
        return;
    }
    serve_plain(
        stream,
        admitted,
        ctx,
        shutdown,
        parker,
        downstream::Start::New { sniff_h2: true },
    )
    .await;
}

/// A plain connection: HTTP/1.1 (parked when idle for `timeouts.park_ms`), or HTTP/2 when
/// it opens with the preface.
pub(super) async fn serve_plain(
    mut stream: TcpStream,
    mut admitted: Admitted,
    ctx: Arc<ConnCtx>,
    mut shutdown: Watch,
    parker: Arc<Parker<Parked>>,
    mut start: downstream::Start,
) {
    loop {
        let (read, write) = stream.into_split();
        let reader = Reader::new(Box::new(read), BytesMut::new());
        let served = downstream::serve(
            reader,
            Box::new(write),
            Http1Handler(Arc::clone(&ctx)),
            admitted.settings.http1,
            &mut shutdown,
            start,
        )
        .await;
        let halves = match served {
            downstream::Served::Closed => return,
            downstream::Served::Http2(joined) => {
                let settings = Arc::clone(&admitted.settings);
                Box::pin(serve_http2(joined, ctx, &settings, shutdown)).await;
                return;
            }
            downstream::Served::Parked(halves) => halves,
        };
        // The halves this function made: taken back as their own types, and joined.
        let reader: Box<dyn Any> = halves.reader;
        let writer: Box<dyn Any> = halves.writer;
        let (Ok(reader), Ok(writer)) = (
            reader.downcast::<OwnedReadHalf>(),
            writer.downcast::<OwnedWriteHalf>(),
        ) else {
            return;
        };
        let Ok(idle) = reader.reunite(*writer) else {
            return;
        };
        let limits = admitted.settings.http1;
        // The rest of the idle timeout: the engine parks after `park_after` of it.
        let deadline = limits.idle.map(|idle| {
            tokio::time::Instant::now() + idle.saturating_sub(limits.park_after.unwrap_or_default())
        });
        let parked = Parked {
            gauge: ctx.snapshot.metrics.gateway.connection_parked(),
            admitted,
        };
        match parker.park(idle, parked, deadline) {
            Parking::Parked | Parking::Closed => return,
            // Readable already, the listener drains, or the parker cannot take it: served
            // on, on this task.
            Parking::ServeNow(again, parked) => {
                stream = again;
                admitted = parked.admitted;
                start = downstream::Start::Resumed;
            }
        }
    }
}

/// A connection to a TLS listener: the handshake, then HTTP/2 (ALPN `h2`) or HTTP/1.1.
async fn serve_tls_connection(
    stream: TcpStream,
    acceptor: Arc<TlsAcceptor>,
    settings: Arc<Settings>,
    ctx: Arc<ConnCtx>,
    mut shutdown: Watch,
) {
    let remote = ctx.remote;
    // The TLS stream (1.2 KB) lives in this block only: moved into the split halves' shared
    // allocation, it would otherwise keep its slot in this future while HTTP/1.1 is served
    // (the compiler keeps a moved-from local's storage to the end of its scope).
    let (read, write) = {
        // The handshake's and HTTP/2's states are boxed: they would size this future for
        // them while it serves HTTP/1.1.
        let accept = Box::pin(acceptor.accept(stream));
        let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, accept).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                tracing::debug!(%remote, "tls handshake failed: {e}");
                return;
            }
            Err(_) => {
                tracing::debug!(%remote, "tls handshake timed out");
                return;
            }
        };
        if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
            Box::pin(serve_http2(stream, ctx, &settings, shutdown)).await;
            return;
        }
        tokio::io::split(stream)
    };
    let reader = Reader::new(Box::new(read), BytesMut::new());
    // Over TLS without ALPN h2 the client speaks HTTP/1.1 (a preface is a bad request). It
    // never parks: a TLS listener's settings have no `park_after` (`settings`).
    let _ = downstream::serve(
        reader,
        Box::new(write),
        Http1Handler(ctx),
        settings.http1,
        &mut shutdown,
        downstream::Start::New { sniff_h2: false },
    )
    .await;
}

/// Serves HTTP/2 on a connection until it closes; when the server drains, sends GOAWAY and
/// lets the open streams finish. Closed when its responses wait on the client for
/// `timeouts.send_ms` ([`SendWatch`]).
async fn serve_http2<I>(io: I, ctx: Arc<ConnCtx>, settings: &Settings, mut shutdown: Watch)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let remote = ctx.remote;
    let client = Arc::clone(&ctx.in_flight);
    let watch = Arc::new(SendWatch::default());
    let metrics = Arc::clone(&ctx.snapshot.metrics.gateway);
    let service = service_fn({
        let watch = Arc::clone(&watch);
        move |req: Request<Incoming>| {
            let req = Box::new(req.map(|body| RequestBody::unlimited(IncomingBody::Http2(body))));
            let ctx = Arc::clone(&ctx);
            let watch = Arc::clone(&watch);
            // An HTTP/2 stream is a task of hyper's, with a timer of its own. A request over its
            // client's limit is refused as a stream: hyper resets it with the reason it finds in
            // the error (`REFUSED_STREAM`: nothing was processed, the client may try again).
            async move {
                match crate::data_path::serve(&ctx, req, &mut LazyTimer::new()).await {
                    Ok(resp) => Ok(resp.map(|body| Watched::new(body, &watch))),
                    Err(_refused) => Err(h2::Error::from(h2::Reason::REFUSED_STREAM)),
                }
            }
        }
    });
    let conn = settings.http2.serve_connection(TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    let draining = std::future::poll_fn(|cx| shutdown.poll_draining(cx));
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = draining => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        () = watch.stalled(settings.send) => {
            // Its streams would never finish: dropped with the connection, each one's
            // upstream exchange ends (and its request is finished and logged).
            metrics.refused(crate::metrics::Refusal::SendTimeout);
            tracing::debug!(%remote, "closed: responses waited on the client for timeouts.send_ms");
            if let Some(count) = crate::log_every::note(
                crate::log_every::Cause::SendTimeout,
                std::time::Instant::now(),
            ) {
                tracing::info!(
                    count,
                    last_remote = %remote,
                    "{count} HTTP/2 connections closed in the last {} s: their responses \
                     waited on the client for timeouts.send_ms",
                    crate::log_every::INTERVAL.as_secs()
                );
            }
            return;
        }
    };
    if let Err(e) = result {
        if closed_for_abuse(&e) {
            if let Some(holdoff) = settings.holdoff {
                client.hold_off(std::time::Instant::now() + holdoff);
            }
            if let Some(count) =
                crate::log_every::note(crate::log_every::Cause::Abuse, std::time::Instant::now())
            {
                tracing::info!(
                    count,
                    last_remote = %remote,
                    "{count} HTTP/2 connections closed for abuse in the last {} s \
                     (GOAWAY ENHANCE_YOUR_CALM: streams reset faster than served); their \
                     addresses are held off for limits.abuse_holdoff_ms unless it is 0",
                    crate::log_every::INTERVAL.as_secs()
                );
            }
        }
        tracing::debug!(%remote, "connection ended: {e}");
    }
}

/// Whether HTTP/2 closed the connection for abuse: `h2` sends `GOAWAY(ENHANCE_YOUR_CALM)`
/// when a client resets streams faster than they are served (CVE-2023-44487) or makes the
/// server reset too many of its streams. A client's own GOAWAY does not count.
fn closed_for_abuse(e: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(h2) = s.downcast_ref::<h2::Error>() {
            return h2.is_go_away()
                && !h2.is_remote()
                && h2.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM);
        }
        source = s.source();
    }
    false
}

//! Listeners: bind, accept (up to the connection limit), TLS with ALPN, HTTP/1.1 and
//! HTTP/2 on each connection, reload and graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tailguard_access_log::AccessLog;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::access_log::AccessLogs;
use crate::config::{Config, Limits, Timeouts};
use crate::error::Error;
use crate::gateway::{self, ConnCtx, Gateway};

/// Backlog of each listening socket: connections over the limit wait here.
const BACKLOG: u32 = 4096;
/// A TLS handshake gets this long; a client that stalls it holds a connection slot.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

type Builder = auto::Builder<TokioExecutor>;

/// A running gateway: its listeners, and the handle to reload or stop it.
#[derive(Debug)]
pub struct Server {
    gateway: Arc<Gateway>,
    addrs: Vec<SocketAddr>,
    listen_config: Vec<String>,
    stop: watch::Sender<bool>,
    accept_tasks: Vec<JoinHandle<()>>,
    graceful: Arc<GracefulShutdown>,
    access_logs: AccessLogs,
}

fn millis(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

fn builder(limits: &Limits, timeouts: &Timeouts) -> Builder {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(millis(timeouts.idle_ms))
        // hyper answers 431 itself past its buffer; below it the gateway checks the limit,
        // so the usual case goes through Error::status like every other error.
        .max_buf_size((limits.header_bytes + 4096).max(64 * 1024));
    b.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.header_bytes).unwrap_or(u32::MAX));
    b
}

fn bind(addr: SocketAddr) -> Result<TcpListener, Error> {
    let err = |source| Error::Bind { addr, source };
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(err)?;
    socket.set_reuseaddr(true).map_err(err)?;
    socket.bind(addr).map_err(err)?;
    socket.listen(BACKLOG).map_err(err)
}

impl Server {
    /// Binds every listener and starts serving on the current tokio runtime.
    pub fn start(config: Config) -> Result<Server, Error> {
        let metrics = crate::GatewayMetrics::register(&tailguard_metrics::Registry::new())?;
        Self::start_with_metrics(config, metrics)
    }

    /// [`Server::start`], recording into `metrics` (whose registry an exporter serves).
    pub fn start_with_metrics(
        config: Config,
        metrics: Arc<crate::GatewayMetrics>,
    ) -> Result<Server, Error> {
        let listen_config: Vec<String> = config
            .listeners
            .iter()
            .map(|l| l.address.get_ref().clone())
            .collect();
        let mut listeners = Vec::new();
        for l in &config.listeners {
            let addr: SocketAddr = l.address.get_ref().parse().map_err(|_| {
                Error::Internal(format!("unvalidated address {}", l.address.get_ref()))
            })?;
            let tls = match &l.tls {
                Some(t) => Some(TlsAcceptor::from(crate::tls::server_config(
                    &config.base_dir,
                    t,
                )?)),
                None => None,
            };
            listeners.push((bind(addr)?, tls));
        }
        let limits = config.limits.clone();
        let log_metrics = tailguard_access_log::Metrics::register(metrics.registry())
            .map_err(|e| Error::Internal(e.to_string()))?;
        let access_logs = AccessLogs::start(&config, Some(&log_metrics))?;
        let builder = Arc::new(builder(&config.limits, &config.timeouts));
        let gateway = Gateway::with_metrics(config, metrics)?;
        let (stop, _) = watch::channel(false);
        let graceful = GracefulShutdown::new();
        let shared = Arc::new(graceful);
        let mut addrs = Vec::new();
        let mut accept_tasks = Vec::new();
        for (i, (listener, tls)) in listeners.into_iter().enumerate() {
            let addr = listener
                .local_addr()
                .map_err(|source| Error::Internal(format!("local_addr: {source}")))?;
            tracing::info!(
                "tailguard: listening on {addr}{}",
                if tls.is_some() { " (tls)" } else { "" }
            );
            addrs.push(addr);
            let acceptor = Acceptor {
                listener,
                tls,
                gateway: Arc::clone(&gateway),
                builder: Arc::clone(&builder),
                graceful: Arc::clone(&shared),
                permits: Arc::new(Semaphore::new(limits.connections)),
                access_log: access_logs.for_listener(i),
            };
            accept_tasks.push(tokio::spawn(acceptor.run(stop.subscribe())));
        }
        let graceful = shared;
        Ok(Server {
            gateway,
            addrs,
            listen_config,
            stop,
            accept_tasks,
            graceful,
            access_logs,
        })
    }

    /// The bound address of each listener, in config order.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The gateway (current snapshot, reload).
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    /// Swaps in a new config: routes, upstreams, timeouts of the upstream side and limits
    /// checked per request. Listeners are bound once; a changed listener list is logged and
    /// needs a restart.
    pub fn reload(&self, config: Config) -> Result<(), Error> {
        let listen: Vec<String> = config
            .listeners
            .iter()
            .map(|l| l.address.get_ref().clone())
            .collect();
        if listen != self.listen_config {
            tracing::warn!(
                "reload: listener changes need a restart; keeping {:?}",
                self.listen_config
            );
        }
        self.access_logs.warn_if_changed(&config);
        self.gateway.reload(config)
    }

    /// Reopens every access log file (SIGUSR1, after logrotate renamed it).
    pub fn reopen_access_logs(&self) {
        for r in self.access_logs.reopeners() {
            r.reopen();
        }
    }

    /// Stops accepting, lets in-flight requests finish for up to `deadline` (idle keep-alive
    /// connections close at once, HTTP/2 connections get GOAWAY), and returns whether every
    /// connection finished in time.
    pub async fn shutdown(self, deadline: Duration) -> bool {
        let _ = self.stop.send(true);
        for task in self.accept_tasks {
            let _ = task.await;
        }
        // The accept tasks (the only other holders) have ended.
        let drained = match Arc::try_unwrap(self.graceful) {
            Ok(graceful) => tokio::time::timeout(deadline, graceful.shutdown())
                .await
                .is_ok(),
            Err(_) => false,
        };
        // Every answered request has logged by now: write and fsync every buffered line.
        self.access_logs.shutdown();
        drained
    }
}

struct Acceptor {
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    gateway: Arc<Gateway>,
    builder: Arc<Builder>,
    graceful: Arc<GracefulShutdown>,
    permits: Arc<Semaphore>,
    access_log: AccessLog,
}

impl Acceptor {
    async fn run(self, mut stop: watch::Receiver<bool>) {
        loop {
            let permit = tokio::select! {
                _ = stop.changed() => return,
                p = Arc::clone(&self.permits).acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            let (stream, remote) = tokio::select! {
                _ = stop.changed() => return,
                r = self.listener.accept() => match r {
                    Ok(pair) => pair,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                },
            };
            let _ = stream.set_nodelay(true);
            let counted = self.gateway.metrics().connection_opened();
            let watcher = self.graceful.watcher();
            let ctx = Arc::new(ConnCtx {
                snapshot: self.gateway.snapshot(),
                gateway: Arc::clone(&self.gateway),
                remote,
                tls: self.tls.is_some(),
                access_log: self.access_log.clone(),
            });
            let builder = Arc::clone(&self.builder);
            let tls = self.tls.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let _counted = counted;
                serve_connection(stream, tls, ctx, builder, watcher).await;
            });
        }
    }
}

async fn serve_connection(
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    ctx: Arc<ConnCtx>,
    builder: Arc<Builder>,
    watcher: hyper_util::server::graceful::Watcher,
) {
    let remote = ctx.remote;
    let service = service_fn(move |req| gateway::serve(Arc::clone(&ctx), req));
    let result = match tls {
        Some(acceptor) => {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => {
                    watcher
                        .watch(
                            builder
                                .serve_connection(TokioIo::new(stream), service)
                                .into_owned(),
                        )
                        .await
                }
                Ok(Err(e)) => {
                    tracing::debug!(%remote, "tls handshake failed: {e}");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%remote, "tls handshake timed out");
                    return;
                }
            }
        }
        None => {
            watcher
                .watch(
                    builder
                        .serve_connection(TokioIo::new(stream), service)
                        .into_owned(),
                )
                .await
        }
    };
    if let Err(e) = result {
        // hyper answered a malformed or oversized head itself (400/431) before the gateway
        // saw a request; this is that request's one log line.
        match e.downcast_ref::<hyper::Error>() {
            Some(h) if h.is_parse_too_large() => tracing::info!(
                target: "tailguard::request", status = 431u16, kind = "headers_too_large",
                blame = "downstream", retryable = false, %remote, "request head too large: {h}"
            ),
            Some(h) if h.is_parse() => tracing::info!(
                target: "tailguard::request", status = 400u16, kind = "bad_request",
                blame = "downstream", retryable = false, %remote, "malformed request: {h}"
            ),
            _ => tracing::debug!(%remote, "connection ended: {e}"),
        }
    }
}

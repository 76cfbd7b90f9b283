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
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use arc_swap::ArcSwapOption;

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
    listeners: Vec<Arc<ListenerShared>>,
    serving: Vec<ServingThread>,
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

/// A nonblocking listening socket with `SO_REUSEPORT`, so each serving thread can bind its
/// own socket on the same address and the kernel spreads connections over them.
fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, Error> {
    use socket2::{Domain, Protocol, Socket, Type};
    let err = |source| Error::Bind { addr, source };
    let socket =
        Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(err)?;
    socket.set_reuse_address(true).map_err(err)?;
    socket.set_reuse_port(true).map_err(err)?;
    socket.set_nonblocking(true).map_err(err)?;
    socket.bind(&addr.into()).map_err(err)?;
    socket.listen(BACKLOG as i32).map_err(err)?;
    Ok(socket.into())
}

/// One configured listener, as every serving thread shares it.
struct ListenerShared {
    /// Swapped by a reload (certificate rotation); each connection loads it once.
    tls: ArcSwapOption<TlsAcceptor>,
    permits: Arc<Semaphore>,
    access_log: AccessLog,
}

impl std::fmt::Debug for ListenerShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerShared")
            .field("tls", &self.tls.load().is_some())
            .finish_non_exhaustive()
    }
}

/// The TLS acceptor of a listener's config (`None` for plain TCP).
fn tls_acceptor(
    config: &Config,
    listener: &crate::config::ListenerConfig,
) -> Result<Option<Arc<TlsAcceptor>>, Error> {
    listener
        .tls
        .as_ref()
        .map(|t| {
            crate::tls::server_config(&config.base_dir, t).map(|c| Arc::new(TlsAcceptor::from(c)))
        })
        .transpose()
}

/// A serving thread: its own current-thread tokio runtime, kept until shutdown.
#[derive(Debug)]
struct ServingThread {
    exit: Option<tokio::sync::oneshot::Sender<()>>,
    join: Option<std::thread::JoinHandle<()>>,
}

impl ServingThread {
    fn stop(&mut self) {
        if let Some(exit) = self.exit.take() {
            let _ = exit.send(());
        }
        if let Some(join) = self.join.take() {
            let _ = join.join();
        }
    }
}

impl Drop for ServingThread {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Server {
    /// Binds every listener and starts `threads` serving threads (at least one), recording
    /// into a private metrics registry.
    pub fn start(config: Config, threads: usize) -> Result<Server, Error> {
        let metrics = crate::GatewayMetrics::register(&tailguard_metrics::Registry::new())?;
        Self::start_with_metrics(config, metrics, threads)
    }

    /// [`Server::start`], recording into `metrics` (whose registry an exporter serves).
    ///
    /// Each serving thread runs its own current-thread tokio runtime with its own
    /// `SO_REUSEPORT` socket per listener: a connection lives on one thread from accept to
    /// close, with its upstream pool on the same thread, so nothing on the request path
    /// crosses threads (Pingora's no-steal mode, nginx's workers).
    pub fn start_with_metrics(
        config: Config,
        metrics: Arc<crate::GatewayMetrics>,
        threads: usize,
    ) -> Result<Server, Error> {
        let threads = threads.max(1);
        let listen_config: Vec<String> = config
            .listeners
            .iter()
            .map(|l| l.address.get_ref().clone())
            .collect();
        // Bind the first socket of each listener here, so a bind error is reported before
        // anything starts and port 0 resolves to one port that every thread then shares.
        let mut sockets: Vec<Vec<std::net::TcpListener>> =
            (0..threads).map(|_| Vec::new()).collect();
        let mut addrs = Vec::new();
        for l in &config.listeners {
            let wanted: SocketAddr = l.address.get_ref().parse().map_err(|_| {
                Error::Internal(format!("unvalidated address {}", l.address.get_ref()))
            })?;
            let first = bind(wanted)?;
            let addr = first.local_addr().map_err(|source| Error::Bind {
                addr: wanted,
                source,
            })?;
            sockets[0].push(first);
            for per_thread in sockets.iter_mut().skip(1) {
                per_thread.push(bind(addr)?);
            }
            addrs.push(addr);
        }
        let log_metrics = tailguard_access_log::Metrics::register(metrics.registry())
            .map_err(|e| Error::Internal(e.to_string()))?;
        let access_logs = AccessLogs::start(&config, Some(&log_metrics))?;
        let mut shared = Vec::new();
        for (i, l) in config.listeners.iter().enumerate() {
            let tls = tls_acceptor(&config, l)?;
            shared.push(Arc::new(ListenerShared {
                tls: ArcSwapOption::new(tls),
                permits: Arc::new(Semaphore::new(config.limits.connections)),
                access_log: access_logs.for_listener(i),
            }));
        }
        let builder = Arc::new(builder(&config.limits, &config.timeouts));
        let gateway = Gateway::with_metrics(config, metrics)?;
        let (stop, _) = watch::channel(false);
        let graceful = Arc::new(GracefulShutdown::new());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let mut serving = Vec::new();
        for (index, sockets) in sockets.into_iter().enumerate() {
            let acceptors: Vec<(std::net::TcpListener, Acceptor)> = sockets
                .into_iter()
                .zip(&shared)
                .map(|(socket, listener)| {
                    (
                        socket,
                        Acceptor {
                            listener: Arc::clone(listener),
                            gateway: Arc::clone(&gateway),
                            builder: Arc::clone(&builder),
                            graceful: Arc::clone(&graceful),
                        },
                    )
                })
                .collect();
            let (exit, exit_rx) = tokio::sync::oneshot::channel::<()>();
            let stop_rx = stop.subscribe();
            let ready_tx = ready_tx.clone();
            let gateway = Arc::clone(&gateway);
            let join = std::thread::Builder::new()
                .name(format!("tailguard-serve-{index}"))
                .spawn(move || serve_thread(gateway, acceptors, stop_rx, exit_rx, ready_tx))
                .map_err(|e| Error::Internal(format!("spawning a serving thread: {e}")))?;
            serving.push(ServingThread {
                exit: Some(exit),
                join: Some(join),
            });
        }
        drop(ready_tx);
        let mut accept_tasks = Vec::new();
        for _ in 0..threads {
            match ready_rx.recv() {
                Ok(Ok(tasks)) => accept_tasks.extend(tasks),
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(Error::Internal("a serving thread died at start".into())),
            }
        }
        for (addr, l) in addrs.iter().zip(&shared) {
            tracing::info!(
                "tailguard: listening on {addr}{}",
                if l.tls.load().is_some() { " (tls)" } else { "" }
            );
        }
        Ok(Server {
            gateway,
            addrs,
            listen_config,
            stop,
            accept_tasks,
            graceful,
            access_logs,
            listeners: shared,
            serving,
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
    /// checked per request, and the certificates of TLS listeners (a renewed certificate is
    /// served to every connection accepted after the reload). Listeners are bound once: a
    /// changed listener list is logged and needs a restart. Nothing changes unless the whole
    /// config (certificates included) loads.
    pub fn reload(&self, config: Config) -> Result<(), Error> {
        let listen: Vec<String> = config
            .listeners
            .iter()
            .map(|l| l.address.get_ref().clone())
            .collect();
        let same_listeners = listen == self.listen_config;
        if !same_listeners {
            tracing::warn!(
                "reload: listener changes need a restart; keeping {:?}",
                self.listen_config
            );
        }
        let tls: Vec<Option<Arc<TlsAcceptor>>> = if same_listeners {
            let loaded: Result<Vec<_>, Error> = config
                .listeners
                .iter()
                .map(|l| tls_acceptor(&config, l))
                .collect();
            if loaded.is_err() {
                self.gateway.metrics().reloaded(false);
            }
            loaded?
        } else {
            Vec::new()
        };
        self.access_logs.warn_if_changed(&config);
        self.gateway.reload(config)?;
        for (listener, acceptor) in self.listeners.iter().zip(tls) {
            listener.tls.store(acceptor);
        }
        Ok(())
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
        // Drained (or out of time): stop the serving runtimes, dropping whatever is left.
        let mut serving = self.serving;
        for thread in &mut serving {
            thread.stop();
        }
        // Every answered request has logged by now: write and fsync every buffered line.
        self.access_logs.shutdown();
        drained
    }
}

type Ready = std::sync::mpsc::Sender<Result<Vec<JoinHandle<()>>, Error>>;

/// How often a serving thread closes its idle upstream connections past the idle timeout.
const EVICT_EVERY: Duration = Duration::from_secs(1);

/// A serving thread's life: build its runtime, start an accept loop per listener and the
/// idle-connection reaper of its pool slots, report ready, then keep serving until the
/// server says exit.
fn serve_thread(
    gateway: Arc<Gateway>,
    acceptors: Vec<(std::net::TcpListener, Acceptor)>,
    stop: watch::Receiver<bool>,
    exit: tokio::sync::oneshot::Receiver<()>,
    ready: Ready,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(Error::Internal(format!("serving runtime: {e}"))));
            return;
        }
    };
    runtime.block_on(async move {
        let mut tasks = Vec::new();
        for (socket, acceptor) in acceptors {
            let addr = socket.local_addr().ok();
            match TcpListener::from_std(socket) {
                Ok(listener) => tasks.push(tokio::spawn(acceptor.run(listener, stop.clone()))),
                Err(source) => {
                    let addr = addr.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
                    let _ = ready.send(Err(Error::Bind { addr, source }));
                    return;
                }
            }
        }
        let _ = ready.send(Ok(tasks));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(EVICT_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let now = std::time::Instant::now();
                for pool in gateway.snapshot().endpoint_pools() {
                    pool.evict(now);
                }
            }
        });
        let _ = exit.await;
    });
}

struct Acceptor {
    listener: Arc<ListenerShared>,
    gateway: Arc<Gateway>,
    builder: Arc<Builder>,
    graceful: Arc<GracefulShutdown>,
}

impl Acceptor {
    async fn run(self, listener: TcpListener, mut stop: watch::Receiver<bool>) {
        let shared = Arc::clone(&self.listener);
        loop {
            let permit = tokio::select! {
                _ = stop.changed() => return,
                p = Arc::clone(&shared.permits).acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            let (stream, remote) = tokio::select! {
                _ = stop.changed() => return,
                r = listener.accept() => match r {
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
            let tls = shared.tls.load_full();
            let counted = self.gateway.metrics().connection_opened();
            let watcher = self.graceful.watcher();
            let ctx = Arc::new(ConnCtx {
                snapshot: self.gateway.snapshot(),
                gateway: Arc::clone(&self.gateway),
                remote,
                remote_ip: crate::headers::client_address(remote.ip()),
                tls: tls.is_some(),
                access_log: shared.access_log.clone(),
            });
            let builder = Arc::clone(&self.builder);
            tokio::spawn(async move {
                let _permit = permit;
                let _counted = counted;
                serve_connection(stream, tls, ctx, builder, watcher).await;
            });
        }
    }
}

/// Serves HTTP/1.1 (with upgrades) or HTTP/2 on one connection, plain or TLS, watched by
/// the graceful shutdown.
async fn serve_io<I>(
    io: I,
    ctx: Arc<ConnCtx>,
    builder: &Builder,
    watcher: hyper_util::server::graceful::Watcher,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = service_fn(move |req| gateway::serve(Arc::clone(&ctx), req));
    watcher
        .watch(
            builder
                .serve_connection_with_upgrades(io, service)
                .into_owned(),
        )
        .await
}

async fn serve_connection(
    stream: TcpStream,
    tls: Option<Arc<TlsAcceptor>>,
    ctx: Arc<ConnCtx>,
    builder: Arc<Builder>,
    watcher: hyper_util::server::graceful::Watcher,
) {
    let remote = ctx.remote;
    let result = match tls {
        Some(acceptor) => {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => serve_io(TokioIo::new(stream), ctx, &builder, watcher).await,
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
        None => serve_io(TokioIo::new(stream), ctx, &builder, watcher).await,
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

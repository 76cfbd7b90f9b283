//! Listeners: bind, accept (up to the connection limit), TLS with ALPN, HTTP/1.1 (own) and
//! HTTP/2 on each connection, listeners that follow a reload, and graceful shutdown.

use std::any::Any;
use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::BytesMut;
use http::Request;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tailguard_access_log::AccessLog;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::access_log::AccessLogs;
use crate::body::{IncomingBody, RequestBody};
use crate::config::{Config, Limits, Timeouts};
use crate::conn::ConnCtx;
use crate::drain::{Drain, Watch};
use crate::error::Error;
use crate::gateway::Gateway;
use crate::handler::Http1Handler;
use crate::headers::Client;
use crate::metrics::{ConnectionGuard, ParkedGuard};
use crate::park::{Parker, Parking};
use tailguard_http1::server::{self as downstream, Reader};
use tailguard_http1::timer::LazyTimer;

/// Backlog of each listening socket: connections over the limit wait here.
const BACKLOG: u32 = 4096;
/// A TLS handshake gets this long; a client that stalls it holds a connection slot.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// HTTP/2 connections are hyper's; HTTP/1.1 ones are served by [`downstream`].
type Http2 = hyper::server::conn::http2::Builder<TokioExecutor>;

/// A running gateway: its listeners, and the handle to reload or stop it.
///
/// The listener table and the access logs sit behind mutexes that only the control side
/// takes (reload, shutdown, [`Server::local_addrs`]); a serving thread never does. It sees a
/// reload through its listener's watch channel, read once per accepted connection.
#[derive(Debug)]
pub struct Server {
    gateway: Arc<Gateway>,
    /// The runtime of each serving thread, where its listening sockets are registered and
    /// its accept loops run.
    threads: Vec<Handle>,
    listeners: Mutex<Listeners>,
    access_logs: Mutex<AccessLogs>,
    log_metrics: tailguard_access_log::Metrics,
    serving: Vec<ServingThread>,
}

/// The listeners of the running config, and those a reload removed that still drain.
#[derive(Debug)]
struct Listeners {
    active: Vec<Listener>,
    /// Accept loops of removed listeners, draining their connections (awaited at shutdown).
    draining: Vec<JoinHandle<()>>,
    /// `limits.connections` the permits of every active listener add up to.
    connections: usize,
}

/// One listening address, with a socket and an accept loop on every serving thread.
#[derive(Debug)]
struct Listener {
    /// The address as configured (port 0 included): what a reload matches listeners on.
    wanted: SocketAddr,
    /// The bound address.
    addr: SocketAddr,
    /// `Some(settings)` to serve with, `None` to stop accepting and drain.
    control: watch::Sender<Option<Arc<Settings>>>,
    /// Open downstream connections (all serving threads together).
    permits: Arc<Semaphore>,
    tasks: Vec<JoinHandle<()>>,
    /// The listening sockets (duplicated descriptors; the accept loops own the others).
    sockets: Vec<std::net::TcpListener>,
}

impl Listener {
    /// Stops accepting at once: tells the accept loops (which then drain their
    /// connections), and shuts the listening sockets down. On Linux that takes a listening
    /// socket out of service immediately (HAProxy pauses listeners this way): a connect is
    /// refused as soon as this returns, connections still in the backlog are reset as a
    /// close would, and the address can be bound again (by the next reload) while the loops
    /// drain, with no old socket left to take a share of its connections.
    fn stop(&self) {
        self.control.send_replace(None);
        for socket in &self.sockets {
            if let Err(e) = socket2::SockRef::from(socket).shutdown(std::net::Shutdown::Read) {
                // The accept loop closes the socket when it ends anyway.
                tracing::debug!(addr = %self.addr, "shutting a listening socket down: {e}");
            }
        }
    }
}

/// What a listener serves new connections with; a reload replaces it whole. A connection
/// keeps the settings it was accepted with.
struct Settings {
    /// Plain TCP when `None`; a reload may switch TLS on or off, or renew the certificate.
    tls: Option<Arc<TlsAcceptor>>,
    /// HTTP/2 settings from `[limits]` (header size).
    http2: Arc<Http2>,
    /// HTTP/1.1 settings from `[limits]` and `[timeouts]` (idle, header, body).
    http1: downstream::Limits,
    access_log: AccessLog,
    /// The listener's rate limit (kept by a reload that leaves it unchanged).
    rate_limit: Option<Arc<crate::rate_limit::Limiter>>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

fn millis(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

fn http2(limits: &Limits) -> Http2 {
    let mut b = Http2::new(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.header_bytes).unwrap_or(u32::MAX));
    b
}

fn http1(limits: &Limits, timeouts: &Timeouts) -> downstream::Limits {
    downstream::Limits {
        header_bytes: limits.header_bytes,
        body_bytes: limits.body_bytes,
        idle: millis(timeouts.idle_ms),
        header: millis(timeouts.header_ms),
        body: millis(timeouts.body_ms),
        park_after: millis(timeouts.park_ms),
        linger: downstream::Linger::DEFAULT,
    }
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

/// One socket per serving thread on `wanted`. The first resolves port 0 to the one port
/// the others then share.
fn bind_per_thread(
    wanted: SocketAddr,
    threads: usize,
) -> Result<(SocketAddr, Vec<std::net::TcpListener>), Error> {
    let first = bind(wanted)?;
    let addr = first.local_addr().map_err(|source| Error::Bind {
        addr: wanted,
        source,
    })?;
    let mut sockets = vec![first];
    for _ in 1..threads {
        sockets.push(bind(addr)?);
    }
    Ok((addr, sockets))
}

/// A listening socket registered with its serving thread's runtime, and a duplicate of its
/// descriptor that the control side keeps to stop it ([`Listener::stop`]).
struct Registered {
    socket: TcpListener,
    control: std::net::TcpListener,
}

/// Registers each socket with its serving thread's runtime (from this thread: only the
/// registration needs the runtime's context, the accept loop is spawned onto it later).
fn register(
    addr: SocketAddr,
    sockets: Vec<std::net::TcpListener>,
    threads: &[Handle],
) -> Result<Vec<Registered>, Error> {
    let err = |source| Error::Bind { addr, source };
    sockets
        .into_iter()
        .zip(threads)
        .map(|(socket, runtime)| {
            let control = socket.try_clone().map_err(err)?;
            let _entered = runtime.enter();
            let socket = TcpListener::from_std(socket).map_err(err)?;
            Ok(Registered { socket, control })
        })
        .collect()
}

/// The TLS acceptor of a listener's config (`None` for plain TCP).
fn tls_acceptor(
    config: &Config,
    listener: &crate::config::ListenerConfig,
) -> Result<Option<Arc<TlsAcceptor>>, Error> {
    crate::tls::server_config(&config.base_dir, listener)
        .map(|c| c.map(|c| Arc::new(TlsAcceptor::from(c))))
}

/// The address a validated listener asks for.
fn wanted(listener: &crate::config::ListenerConfig) -> Result<SocketAddr, Error> {
    listener.address.get_ref().parse().map_err(|_| {
        Error::Internal(format!(
            "unvalidated address {}",
            listener.address.get_ref()
        ))
    })
}

/// The TLS acceptor of each listener of `config`, in order: a certificate that does not
/// load fails the caller before anything changes.
fn tls_acceptors(config: &Config) -> Result<Vec<Option<Arc<TlsAcceptor>>>, Error> {
    config
        .listeners
        .iter()
        .map(|l| tls_acceptor(config, l))
        .collect()
}

/// The settings of each listener of `config`, in order.
fn settings(
    config: &Config,
    tls: Vec<Option<Arc<TlsAcceptor>>>,
    logs: Vec<AccessLog>,
    rate_limits: Vec<Option<Arc<crate::rate_limit::Limiter>>>,
) -> Vec<Arc<Settings>> {
    let http2 = Arc::new(http2(&config.limits));
    let http1 = http1(&config.limits, &config.timeouts);
    tls.into_iter()
        .zip(logs)
        .zip(rate_limits)
        .map(|((tls, access_log), rate_limit)| {
            // A TLS connection does not park: its TLS state (~10 KB) would stay with it, so
            // its task is the lesser part of what it holds.
            let park_after = if tls.is_some() {
                None
            } else {
                http1.park_after
            };
            Arc::new(Settings {
                tls,
                http2: Arc::clone(&http2),
                http1: downstream::Limits {
                    park_after,
                    ..http1
                },
                access_log,
                rate_limit,
            })
        })
        .collect()
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

/// Where a listener of a new config comes from.
enum Slot {
    /// The running listener at this index of `active`, on the same address.
    Keep(usize),
    /// A new address, bound on every serving thread and not yet accepting.
    New {
        wanted: SocketAddr,
        addr: SocketAddr,
        sockets: Vec<Registered>,
    },
}

/// A reload that passed every fallible step: applying it cannot fail.
struct Plan {
    slots: Vec<(Slot, Arc<Settings>)>,
    connections: usize,
    started_logs: usize,
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
        // Bind every socket first, so a bind error is reported before anything starts.
        let mut bound = Vec::new();
        for l in &config.listeners {
            let wanted = wanted(l)?;
            let (addr, sockets) = bind_per_thread(wanted, threads)?;
            bound.push((wanted, addr, sockets));
        }
        let log_metrics = tailguard_access_log::Metrics::register(metrics.registry())
            .map_err(|e| Error::Internal(e.to_string()))?;
        let tls = tls_acceptors(&config)?;
        let (access_logs, logs) = AccessLogs::start(&config, Some(&log_metrics))?;
        let limits =
            crate::rate_limit::listener_limits(&config.listeners, |_| None, metrics.rate_limit())?;
        let settings = settings(&config, tls, logs, limits);
        let connections = config.limits.connections;
        let gateway = Gateway::with_metrics(config, metrics)?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let mut serving = Vec::new();
        for index in 0..threads {
            let (exit, exit_rx) = tokio::sync::oneshot::channel::<()>();
            let ready_tx = ready_tx.clone();
            let gateway = Arc::clone(&gateway);
            let join = std::thread::Builder::new()
                .name(format!("tailguard-serve-{index}"))
                .spawn(move || serve_thread(gateway, exit_rx, ready_tx))
                .map_err(|e| Error::Internal(format!("spawning a serving thread: {e}")))?;
            serving.push(ServingThread {
                exit: Some(exit),
                join: Some(join),
            });
        }
        drop(ready_tx);
        let mut handles = Vec::new();
        for _ in 0..threads {
            match ready_rx.recv() {
                Ok(Ok(handle)) => handles.push(handle),
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(Error::Internal("a serving thread died at start".into())),
            }
        }
        let server = Server {
            gateway,
            threads: handles,
            listeners: Mutex::new(Listeners {
                active: Vec::new(),
                draining: Vec::new(),
                connections,
            }),
            access_logs: Mutex::new(access_logs),
            log_metrics,
            serving,
        };
        let mut slots = Vec::new();
        for ((wanted, addr, sockets), settings) in bound.into_iter().zip(settings) {
            let sockets = register(addr, sockets, &server.threads)?;
            slots.push((
                Slot::New {
                    wanted,
                    addr,
                    sockets,
                },
                settings,
            ));
        }
        server.apply(
            &mut lock(&server.listeners),
            Plan {
                slots,
                connections,
                started_logs: 0,
            },
        );
        Ok(server)
    }

    /// The bound address of each listener, in config order.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        lock(&self.listeners)
            .active
            .iter()
            .map(|l| l.addr)
            .collect()
    }

    /// The gateway (current snapshot, reload).
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    /// Swaps in a new config: routes, upstreams, timeouts and limits, and the listeners.
    ///
    /// Listeners are matched to the running ones by address (as configured, so a listener
    /// on port 0 keeps its port): a listener on the same address keeps its sockets (no
    /// connection is refused during the reload) and serves every connection accepted after
    /// the reload with the new settings (TLS on or off, a renewed certificate, header limit,
    /// idle timeout, access log; `limits.connections` is resized in place). A new address is
    /// bound on every serving thread before anything changes, and an address that cannot be
    /// bound fails the whole reload with a diagnostic naming the listener's field. A removed
    /// listener stops accepting and closes its sockets; its open connections finish their
    /// requests and close as in a graceful shutdown. Nothing changes unless the whole config
    /// (certificates and binds included) loads.
    pub fn reload(&self, config: Config) -> Result<(), Error> {
        let mut listeners = lock(&self.listeners);
        let mut logs = lock(&self.access_logs);
        let plan = match self.prepare(&listeners, &mut logs, &config) {
            Ok(plan) => plan,
            Err(e) => {
                self.gateway.metrics().reloaded(false);
                return Err(e);
            }
        };
        // Counts the reload as applied or failed itself.
        if let Err(e) = self.gateway.reload(config) {
            logs.undo(plan.started_logs);
            // The new sockets of `plan` close as it drops.
            return Err(e);
        }
        self.apply(&mut listeners, plan);
        Ok(())
    }

    /// Every fallible step of a reload: match listeners, bind new addresses, load
    /// certificates, open new access logs.
    fn prepare(
        &self,
        listeners: &Listeners,
        logs: &mut AccessLogs,
        config: &Config,
    ) -> Result<Plan, Error> {
        let mut claimed = vec![false; listeners.active.len()];
        let mut slots = Vec::new();
        let mut bind_errors = Vec::new();
        for (i, l) in config.listeners.iter().enumerate() {
            let wanted = wanted(l)?;
            let running = listeners
                .active
                .iter()
                .enumerate()
                .position(|(j, r)| !claimed[j] && r.wanted == wanted);
            if let Some(j) = running {
                claimed[j] = true;
                slots.push(Slot::Keep(j));
                continue;
            }
            let bound = bind_per_thread(wanted, self.threads.len())
                .and_then(|(addr, sockets)| Ok((addr, register(addr, sockets, &self.threads)?)));
            match bound {
                Ok((addr, sockets)) => slots.push(Slot::New {
                    wanted,
                    addr,
                    sockets,
                }),
                Err(e) => bind_errors.push(config.listener_diagnostic(i, e.to_string())),
            }
        }
        if !bind_errors.is_empty() {
            return Err(Error::Config(bind_errors));
        }
        let tls = tls_acceptors(config)?;
        // A listener on the same address keeps its limit's state if its config is the same.
        let running_limit = |i: usize| match slots.get(i) {
            Some(Slot::Keep(j)) => listeners.active[*j]
                .control
                .borrow()
                .as_ref()
                .and_then(|s| s.rate_limit.clone()),
            _ => None,
        };
        let limits = crate::rate_limit::listener_limits(
            &config.listeners,
            running_limit,
            self.gateway.metrics().rate_limit(),
        )?;
        // Last, as it is the one step that leaves a trace (a created log file) if a later
        // step fails: only the gateway's own snapshot build comes after it.
        let attached = logs.attach(config, Some(&self.log_metrics))?;
        let started_logs = attached.started;
        let settings = settings(config, tls, attached.per_listener, limits);
        Ok(Plan {
            slots: slots.into_iter().zip(settings).collect(),
            connections: config.limits.connections,
            started_logs,
        })
    }

    /// Applies a prepared plan; nothing here can fail. New listeners start accepting before
    /// removed ones stop, so a listener that moves is never down.
    fn apply(&self, listeners: &mut Listeners, plan: Plan) {
        let mut old: Vec<Option<Listener>> = listeners.active.drain(..).map(Some).collect();
        let mut active = Vec::new();
        for (slot, settings) in plan.slots {
            match slot {
                Slot::Keep(j) => {
                    let l = old[j]
                        .take()
                        .expect("a running listener is matched at most once");
                    self.resize(&l.permits, listeners.connections, plan.connections);
                    l.control.send_replace(Some(settings));
                    active.push(l);
                }
                Slot::New {
                    wanted,
                    addr,
                    sockets,
                } => {
                    let tls = settings.tls.is_some();
                    let (control, _) = watch::channel(Some(settings));
                    let permits = Arc::new(Semaphore::new(plan.connections));
                    let mut controls = Vec::new();
                    let tasks = sockets
                        .into_iter()
                        .zip(&self.threads)
                        .map(|(registered, runtime)| {
                            controls.push(registered.control);
                            let acceptor = Acceptor {
                                gateway: Arc::clone(&self.gateway),
                                permits: Arc::clone(&permits),
                                control: control.subscribe(),
                            };
                            runtime.spawn(acceptor.run(registered.socket))
                        })
                        .collect();
                    tracing::info!(
                        "tailguard: listening on {addr}{}",
                        if tls { " (tls)" } else { "" }
                    );
                    active.push(Listener {
                        wanted,
                        addr,
                        control,
                        permits,
                        tasks,
                        sockets: controls,
                    });
                }
            }
        }
        for removed in old.into_iter().flatten() {
            removed.stop();
            tracing::info!("tailguard: stopped listening on {}", removed.addr);
            listeners.draining.extend(removed.tasks);
        }
        listeners.draining.retain(|t| !t.is_finished());
        listeners.active = active;
        listeners.connections = plan.connections;
    }

    /// Moves a running listener's connection limit from `from` to `to`. Raising adds
    /// permits now; lowering takes the difference out as connections close (the semaphore
    /// is fair, so no connection is accepted until the open ones are under the new limit).
    fn resize(&self, permits: &Arc<Semaphore>, from: usize, to: usize) {
        if to > from {
            permits.add_permits(to - from);
        } else if from > to {
            let permits = Arc::clone(permits);
            let mut left = from - to;
            self.threads[0].spawn(async move {
                while left > 0 {
                    let chunk = u32::try_from(left).unwrap_or(u32::MAX);
                    match permits.acquire_many(chunk).await {
                        Ok(p) => p.forget(),
                        Err(_) => return,
                    }
                    left -= chunk as usize;
                }
            });
        }
    }

    /// Reopens every access log file (SIGUSR1, after logrotate renamed it).
    pub fn reopen_access_logs(&self) {
        for r in lock(&self.access_logs).reopeners() {
            r.reopen();
        }
    }

    /// Stops accepting, lets in-flight requests finish for up to `deadline` (idle keep-alive
    /// connections close at once, HTTP/2 connections get GOAWAY), and returns whether every
    /// connection finished in time.
    pub async fn shutdown(self, deadline: Duration) -> bool {
        let tasks: Vec<JoinHandle<()>> = {
            let mut listeners = lock(&self.listeners);
            let listeners = &mut *listeners;
            for l in &listeners.active {
                l.stop();
            }
            let mut tasks: Vec<JoinHandle<()>> = listeners.draining.drain(..).collect();
            for l in &mut listeners.active {
                tasks.append(&mut l.tasks);
            }
            tasks
        };
        // Each accept loop closes its socket, then waits for its connections to finish.
        let drained = tokio::time::timeout(deadline, async {
            for task in tasks {
                let _ = task.await;
            }
        })
        .await
        .is_ok();
        // Drained (or out of time): stop the serving runtimes, dropping whatever is left.
        let Server {
            mut serving,
            access_logs,
            gateway,
            ..
        } = self;
        for thread in &mut serving {
            thread.stop();
        }
        // Every answered request has logged by now: write and fsync every buffered line.
        access_logs
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
            .shutdown();
        // Every finished request has recorded its spans: export what is left, within the
        // exporter's own shutdown deadline, off this runtime's thread.
        if let Some(exporter) = gateway.take_trace_exporter() {
            let _ = tokio::task::spawn_blocking(move || exporter.shutdown()).await;
        }
        drained
    }
}

/// Locks a control-side mutex (reload, shutdown); a panic in another reload leaves the
/// table consistent (it is only written by `apply`, which cannot fail), so a poisoned lock
/// is used as is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

type Ready = std::sync::mpsc::Sender<Result<Handle, Error>>;

/// How often a serving thread closes its idle upstream connections past the idle timeout,
/// and runs the process's [`set_serving_thread_housekeeping`].
const EVICT_EVERY: Duration = Duration::from_secs(1);

/// What each serving thread runs once a second beside its own upkeep (set by the binary).
static HOUSEKEEPING: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Sets what each serving thread runs once a second, on that thread: the `tailguard` binary
/// has its allocator (mimalloc) collect the thread's freed memory there, which mimalloc
/// gives back to the system only when the thread that owns it allocates or collects, and an
/// idle serving thread does neither (the memory of connections closed or parked stayed
/// resident). The first call wins; a library user of the gateway needs none.
pub fn set_serving_thread_housekeeping(task: fn()) {
    let _ = HOUSEKEEPING.set(task);
}

/// A serving thread's life: build its runtime, start the idle-connection reaper of its pool
/// slots, report ready (with the runtime's handle, onto which the server spawns an accept
/// loop per listener, at start and on reload), then keep serving until the server says exit.
fn serve_thread(gateway: Arc<Gateway>, exit: tokio::sync::oneshot::Receiver<()>, ready: Ready) {
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
    let _ = ready.send(Ok(runtime.handle().clone()));
    runtime.block_on(async move {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(EVICT_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let now = std::time::Instant::now();
                let snapshot = gateway.snapshot();
                for pool in snapshot.endpoint_pools() {
                    pool.evict(now);
                }
                for pool in snapshot.h2_pools() {
                    pool.evict(now);
                }
                if let Some(task) = HOUSEKEEPING.get() {
                    task();
                }
            }
        });
        let _ = exit.await;
    });
}

/// One listener's accept loop on one serving thread.
struct Acceptor {
    gateway: Arc<Gateway>,
    permits: Arc<Semaphore>,
    control: watch::Receiver<Option<Arc<Settings>>>,
}

impl Acceptor {
    /// Accepts until told to stop, then closes the socket and drains this loop's
    /// connections (in-flight requests finish, idle ones close, HTTP/2 gets GOAWAY).
    async fn run(self, listener: TcpListener) {
        let Acceptor {
            gateway,
            permits,
            mut control,
        } = self;
        // Per accept loop, so a removed listener drains its own connections only.
        let drain = Drain::default();
        // Its idle connections parked, and the task that hands them back to be served.
        let parker = Arc::new(Parker::new());
        tokio::spawn({
            let parker = Arc::clone(&parker);
            let gateway = Arc::clone(&gateway);
            let drain = drain.clone();
            async move {
                parker
                    .run(|stream, parked: Parked| {
                        let Parked { admitted, gauge } = parked;
                        drop(gauge);
                        let ctx = conn_ctx(&gateway, &admitted.settings, admitted.remote);
                        let shutdown = drain.watch();
                        let parker = Arc::clone(&parker);
                        tokio::spawn(serve_plain(
                            stream,
                            admitted,
                            ctx,
                            shutdown,
                            parker,
                            downstream::Start::Resumed,
                        ));
                    })
                    .await;
            }
        });
        loop {
            // One read of the watch per accepted connection: a brief read lock that a
            // reload's store takes for a pointer swap, never a request's.
            let Some(settings) = control.borrow_and_update().clone() else {
                break;
            };
            // `biased`: a reload that is already visible wins over a ready permit or
            // connection, so every connection accepted after `reload` returns gets the new
            // settings.
            let permit = tokio::select! {
                biased;
                changed = control.changed() => match changed {
                    Ok(()) => continue,
                    Err(_) => break,
                },
                p = Arc::clone(&permits).acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let (stream, remote) = tokio::select! {
                biased;
                // `accept` is cancel-safe: a connection not yet taken stays queued.
                changed = control.changed() => match changed {
                    Ok(()) => continue,
                    Err(_) => break,
                },
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
            let admitted = Admitted {
                _counted: gateway.metrics().connection_opened(),
                _permit: permit,
                settings,
                remote,
            };
            let shutdown = drain.watch();
            let ctx = conn_ctx(&gateway, &admitted.settings, remote);
            tokio::spawn(serve_connection(
                stream,
                admitted,
                ctx,
                shutdown,
                Arc::clone(&parker),
            ));
        }
        // Refuse new connections at once, close the parked ones, while the busy ones finish.
        drop(listener);
        parker.close();
        drain.finish().await;
    }
}

/// What a connection keeps from its accept to its close, served or parked.
struct Admitted {
    /// The listener's settings at the accept.
    settings: Arc<Settings>,
    remote: SocketAddr,
    /// Its place under the listener's connection limit.
    _permit: OwnedSemaphorePermit,
    /// Counts it in `tailguard_downstream_connections_active`.
    _counted: ConnectionGuard,
}

/// What a parked connection keeps: its [`Admitted`], and its count as parked.
struct Parked {
    admitted: Admitted,
    gauge: ParkedGuard,
}

/// The state a connection's requests are served with: made at the accept, and again when a
/// parked connection is served again (with the snapshot current then).
fn conn_ctx(gateway: &Gateway, settings: &Settings, remote: SocketAddr) -> Arc<ConnCtx> {
    let tls = settings.tls.is_some();
    Arc::new(ConnCtx {
        snapshot: gateway.snapshot(),
        current: Arc::clone(gateway.current()),
        remote,
        client: client_fields(remote.ip(), tls, gateway.is_trusted(remote.ip())),
        tls,
        access_log: settings.access_log.clone(),
        rate_limit: settings.rate_limit.clone(),
    })
}

thread_local! {
    /// The forwarding fields this thread made last, with what they were made from.
    static LAST_CLIENT: RefCell<Option<(IpAddr, bool, bool, Client)>> = const { RefCell::new(None) };
}

/// The forwarding fields of a connection from `ip`: the thread's last ones again (three
/// reference counts) when they were made for the same peer, else made (three `format!`-like
/// writes, ~2,000 instructions in callgrind). Connections come from few addresses in a row
/// (behind a load balancer, one), and a parked connection served again needs its own again.
fn client_fields(ip: IpAddr, tls: bool, trusted: bool) -> Client {
    LAST_CLIENT.with_borrow_mut(|last| match last {
        Some((last_ip, last_tls, last_trusted, client))
            if (*last_ip, *last_tls, *last_trusted) == (ip, tls, trusted) =>
        {
            client.clone()
        }
        _ => {
            let client = Client::new(ip, tls, trusted);
            *last = Some((ip, tls, trusted, client.clone()));
            client
        }
    })
}

/// Serves one connection, plain or TLS: HTTP/2 when ALPN chose it or (plain) the client
/// opened with the HTTP/2 preface (h2c with prior knowledge), else HTTP/1.1.
async fn serve_connection(
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
async fn serve_plain(
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
                Box::pin(serve_http2(joined, ctx, &settings.http2, shutdown)).await;
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
            Box::pin(serve_http2(stream, ctx, &settings.http2, shutdown)).await;
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
/// lets the open streams finish.
async fn serve_http2<I>(io: I, ctx: Arc<ConnCtx>, http2: &Http2, mut shutdown: Watch)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let remote = ctx.remote;
    let service = service_fn(move |req: Request<Incoming>| {
        let req = Box::new(req.map(|body| RequestBody::unlimited(IncomingBody::Http2(body))));
        let ctx = Arc::clone(&ctx);
        // An HTTP/2 stream is a task of hyper's, with a timer of its own.
        async move { crate::data_path::serve(&ctx, req, &mut LazyTimer::new()).await }
    });
    let conn = http2.serve_connection(TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    let draining = std::future::poll_fn(|cx| shutdown.poll_draining(cx));
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = draining => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(%remote, "connection ended: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::client_fields;
    use crate::headers::Client;

    /// The fields served from the thread's last ones are those `Client::new` makes, and a
    /// change of address, scheme or trust makes new ones.
    #[test]
    fn forwarding_fields_follow_the_peer_they_were_made_for() {
        let same = |a: &Client, b: &Client| {
            (&a.ip, &a.forwarded, a.trusted, a.tls, &a.lines)
                == (&b.ip, &b.forwarded, b.trusted, b.tls, &b.lines)
        };
        for (ip, tls, trusted) in [
            ("10.0.0.1", false, false),
            ("10.0.0.1", false, false),
            ("10.0.0.1", true, false),
            ("10.0.0.1", true, true),
            ("2001:db8::1", true, true),
            ("10.0.0.1", false, false),
        ] {
            let ip = ip.parse().expect("an address");
            let got = client_fields(ip, tls, trusted);
            assert!(
                same(&got, &Client::new(ip, tls, trusted)),
                "{ip} {tls} {trusted}"
            );
        }
    }
}

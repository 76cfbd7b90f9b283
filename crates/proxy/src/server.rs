//! The running gateway: its serving threads (a current-thread runtime each), its listeners
//! started, reloaded and stopped, and graceful shutdown. Beneath it, bottom-up: the
//! listeners' settings (`settings.rs`), a connection's protocols (`connection.rs`), the
//! accept loop (`accept.rs`), the listeners and a reload's plan (`listener.rs`).

mod accept;
mod connection;
#[cfg(test)]
mod idle_http2_buffers;
mod listener;
mod send_watch;
mod settings;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tailguard_config::Config;
use tailguard_http::error::Error;
use tokio::runtime::Handle;

use crate::access_log::AccessLogs;
use crate::gateway::Gateway;
use listener::{Bound, Listeners};
use settings::{settings, tls_acceptors};

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
        // Bind every socket first, so a bind error is reported before anything starts.
        let bound = Bound::bind(&config, threads)?;
        let log_metrics = tailguard_access_log::Metrics::register(metrics.registry())
            .map_err(|e| Error::Internal(e.to_string()))?;
        let tls = tls_acceptors(&config)?;
        let (access_logs, logs) = AccessLogs::start(&config, Some(&log_metrics))?;
        let limits = tailguard_policy::rate_limit::listener_limits(
            &config.listeners,
            |_| None,
            metrics.rate_limit(),
        )?;
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
            listeners: Mutex::new(Listeners::new(connections)),
            access_logs: Mutex::new(access_logs),
            log_metrics,
            serving,
        };
        let plan = bound.plan(settings, &server.threads, connections)?;
        lock(&server.listeners).apply(plan, &server.threads, &server.gateway);
        Ok(server)
    }

    /// The bound address of each listener, in config order.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        lock(&self.listeners).addrs()
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
        let prepared = listeners.prepare(
            &config,
            &self.threads,
            &self.gateway,
            &mut logs,
            &self.log_metrics,
        );
        let plan = match prepared {
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
        listeners.apply(plan, &self.threads, &self.gateway);
        Ok(())
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
        let tasks = lock(&self.listeners).stop();
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

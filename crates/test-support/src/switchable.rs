//! An upstream whose answers and availability a test changes while it runs: for health
//! checks and ejection (an endpoint that starts failing, stops, and comes back).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use crate::{TestBody, free_port, full};

/// The path whose answers [`SwitchableUpstream::set_health_status`] sets; every other path
/// gets [`SwitchableUpstream::set_status`]'s.
pub const HEALTH_PATH: &str = "/health";

#[derive(Debug)]
struct State {
    status: AtomicU16,
    health_status: AtomicU16,
    requests: AtomicUsize,
    checks: AtomicUsize,
}

/// An HTTP/1.1 + h2c upstream on 127.0.0.1 whose statuses can be changed, and which can
/// stop (its listener and every connection closed: connects are refused) and come back on
/// the same address.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use tailguard_test_support::{SwitchableUpstream, get, http1_client};
/// let up = SwitchableUpstream::start().await;
/// let client = http1_client();
/// up.set_status(503);
/// assert_eq!(get(&client, &format!("http://{}/x", up.addr)).await.0, 503);
/// assert_eq!(get(&client, &format!("http://{}/health", up.addr)).await.0, 200);
/// assert_eq!((up.requests(), up.checks()), (1, 1));
/// up.stop().await;
/// assert!(tokio::net::TcpStream::connect(up.addr).await.is_err());
/// up.resume().await;
/// assert_eq!(get(&http1_client(), &format!("http://{}/x", up.addr)).await.0, 503);
/// # });
/// ```
#[derive(Debug)]
pub struct SwitchableUpstream {
    /// Where it listens (the same after [`resume`](Self::resume)).
    pub addr: SocketAddr,
    state: Arc<State>,
    serving: Mutex<Option<JoinHandle<()>>>,
}

impl SwitchableUpstream {
    /// Binds a port of 127.0.0.1 that stays free while it is stopped ([`free_port`]: a port
    /// from `:0` could be taken meanwhile, and [`resume`](Self::resume) would fail); every
    /// path answers 200 until told otherwise.
    pub async fn start() -> SwitchableUpstream {
        let listener = TcpListener::bind(("127.0.0.1", free_port()))
            .await
            .expect("bind a free port of 127.0.0.1");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(State {
            status: AtomicU16::new(200),
            health_status: AtomicU16::new(200),
            requests: AtomicUsize::new(0),
            checks: AtomicUsize::new(0),
        });
        let serving = tokio::spawn(serve(listener, Arc::clone(&state)));
        SwitchableUpstream {
            addr,
            state,
            serving: Mutex::new(Some(serving)),
        }
    }

    /// The status of every answer except [`HEALTH_PATH`]'s.
    pub fn set_status(&self, status: u16) {
        self.state.status.store(status, Ordering::SeqCst);
    }

    /// The status of answers to [`HEALTH_PATH`].
    pub fn set_health_status(&self, status: u16) {
        self.state.health_status.store(status, Ordering::SeqCst);
    }

    /// Requests served, [`HEALTH_PATH`] not counted.
    pub fn requests(&self) -> usize {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// Requests for [`HEALTH_PATH`] served.
    pub fn checks(&self) -> usize {
        self.state.checks.load(Ordering::SeqCst)
    }

    /// Stops listening and closes every open connection; returns once the listener is
    /// closed, so a connect from then on is refused.
    pub async fn stop(&self) {
        let serving = self
            .serving
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(task) = serving {
            task.abort();
            let _ = task.await;
        }
    }

    /// Listens again on the same address (after [`stop`](Self::stop)).
    pub async fn resume(&self) {
        let listener = TcpListener::bind(self.addr)
            .await
            .expect("rebind the upstream's address");
        let task = tokio::spawn(serve(listener, Arc::clone(&self.state)));
        let old = self
            .serving
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .replace(task);
        if let Some(old) = old {
            old.abort();
        }
    }
}

impl Drop for SwitchableUpstream {
    fn drop(&mut self) {
        if let Some(task) = self
            .serving
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }
}

/// Accepts until aborted; the connections live in a `JoinSet` this task owns, so aborting
/// it closes them all.
async fn serve(listener: TcpListener, state: Arc<State>) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let state = Arc::clone(&state);
        connections.spawn(async move {
            let service = service_fn(move |req| answer(Arc::clone(&state), req));
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        // Reap finished connections so the set does not grow with every one ever served.
        while connections.try_join_next().is_some() {}
    }
}

async fn answer(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<TestBody>, Infallible> {
    let status = if req.uri().path() == HEALTH_PATH {
        state.checks.fetch_add(1, Ordering::SeqCst);
        state.health_status.load(Ordering::SeqCst)
    } else {
        state.requests.fetch_add(1, Ordering::SeqCst);
        state.status.load(Ordering::SeqCst)
    };
    let mut resp = Response::new(full(Bytes::from(format!("status {status}"))));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    Ok(resp)
}

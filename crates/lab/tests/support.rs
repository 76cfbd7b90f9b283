//! The servers the tests measure: the lab's own upstream on its own runtime thread, so the
//! generator's blocking `run` can drive it.

use std::future::Future;
use std::net::SocketAddr;

use tokio::net::TcpListener;

/// A server running on its own runtime; stops when dropped.
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    _rt: tokio::runtime::Runtime,
}

impl Server {
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

/// Starts `serve(listener)` on a fresh single-worker runtime.
pub(crate) fn start<F, Fut>(serve: F) -> Server
where
    F: FnOnce(TcpListener) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(serve(listener));
    Server { addr, _rt: rt }
}

/// The lab's own upstream.
pub(crate) fn upstream(config: tailguard_lab::upstream::UpstreamConfig) -> Server {
    start(move |l| async move {
        let _ = tailguard_lab::upstream::serve(l, config).await;
    })
}

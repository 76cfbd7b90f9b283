//! A server on a runtime of its own, for tests whose client blocks the calling thread (the
//! load generator's `run`, the lab's scenarios): the server keeps serving while the test's
//! thread waits.

use std::future::Future;
use std::net::SocketAddr;

use tokio::net::TcpListener;

/// A server running on its own runtime; stops when dropped.
#[derive(Debug)]
pub struct Server {
    /// Where it listens (127.0.0.1, an ephemeral port).
    pub addr: SocketAddr,
    _rt: tokio::runtime::Runtime,
}

impl Server {
    /// `http://ADDR{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

/// Starts `serve(listener)`, the listener on 127.0.0.1:0, on a fresh single-worker runtime.
pub fn start<F, Fut>(serve: F) -> Server
where
    F: FnOnce(TcpListener) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a test server's runtime");
    let listener = rt
        .block_on(TcpListener::bind("127.0.0.1:0"))
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("the listener's address");
    rt.spawn(serve(listener));
    Server { addr, _rt: rt }
}

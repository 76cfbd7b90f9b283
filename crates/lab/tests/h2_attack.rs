//! `tailguard h2-attack` against a real HTTP/2 server (hyper, h2c) that answers nothing:
//! every stream it opens arrives, from the source address it was told to bind.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tailguard_lab::h2_attack::{AttackArgs, Kind, attack};

/// Each request's method and peer address, as the server saw them.
type Seen = Arc<Mutex<Vec<(String, SocketAddr)>>>;

/// A server that records each request's method and peer address, and never answers.
fn silent_server() -> (SocketAddr, Seen) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr");
    let record = Arc::clone(&seen);
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            while let Ok((stream, peer)) = listener.accept().await {
                let record = Arc::clone(&record);
                tokio::spawn(async move {
                    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        record
                            .lock()
                            .expect("record")
                            .push((req.method().to_string(), peer));
                        async {
                            std::future::pending::<()>().await;
                            Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
                        }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
    });
    (addr, seen)
}

#[test]
fn held_streams_open_every_stream_from_the_source_address() {
    let (addr, seen) = silent_server();
    let counts = attack(&AttackArgs {
        kind: Kind::HeldStreams,
        target: addr,
        source: "127.0.0.2".parse().expect("ip"),
        connections: 2,
        streams: 3,
        path: "/up".into(),
        seconds: 1,
    })
    .expect("attack");
    assert_eq!(counts.connections.load(Ordering::Relaxed), 2);
    assert_eq!(counts.streams.load(Ordering::Relaxed), 6);
    let seen = seen.lock().expect("seen").clone();
    assert_eq!(seen.len(), 6, "{seen:?}");
    assert!(
        seen.iter()
            .all(|(m, peer)| m == "POST" && peer.ip().to_string() == "127.0.0.2"),
        "{seen:?}"
    );
}

#[test]
fn a_target_off_loopback_is_refused() {
    let args = AttackArgs {
        kind: Kind::SlowRead,
        target: "192.0.2.1:80".parse().expect("addr"),
        source: "127.0.0.2".parse().expect("ip"),
        connections: 1,
        streams: 1,
        path: "/big".into(),
        seconds: 1,
    };
    assert!(attack(&args).is_err());
}

#[test]
fn rapid_reset_opens_and_cancels_streams_in_a_loop() {
    let (addr, _seen) = silent_server();
    let counts = attack(&AttackArgs {
        kind: Kind::RapidReset,
        target: addr,
        source: "127.0.0.2".parse().expect("ip"),
        connections: 1,
        streams: 100,
        path: "/".into(),
        seconds: 1,
    })
    .expect("attack");
    // Cancelled at once, they never wait for a slot: far more than the 100 in flight.
    assert!(counts.streams.load(Ordering::Relaxed) > 100);
    assert_eq!(counts.answered.load(Ordering::Relaxed), 0);
}

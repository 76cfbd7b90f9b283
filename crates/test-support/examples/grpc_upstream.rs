//! The test gRPC service (`test.Echo`, h2c) as a process of its own, for the lab's gRPC
//! comparison (`lab/compare-grpc.sh`): `grpc_upstream 127.0.0.1:PORT`, one thread.

use std::net::SocketAddr;

fn main() {
    let addr: SocketAddr = match std::env::args().nth(1).map(|a| a.parse()) {
        Some(Ok(addr)) => addr,
        _ => {
            eprintln!("usage: grpc_upstream IP:PORT");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let upstream = match tailguard_test_support::grpc::GrpcUpstream::start_on(addr).await {
            Ok(u) => u,
            Err(e) => {
                eprintln!("grpc_upstream: cannot listen on {addr}: {e}");
                std::process::exit(1);
            }
        };
        eprintln!("grpc_upstream: test.Echo on {}", upstream.addr);
        std::future::pending::<()>().await;
    });
}

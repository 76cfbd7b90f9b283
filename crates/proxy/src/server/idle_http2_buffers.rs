//! Idle HTTP/2 connections hold no codec buffer: counted by the patched `h2`'s
//! `held_buffers` (`vendor/h2/TAILGUARD-PATCH.md`; feature `tailguard-held-buffers`, on in
//! this crate's tests only). A unit test, so that it counts in a process where no other test
//! runs HTTP/2 connections at the same time: the count is process-wide. The client writes
//! raw frames (`h2_frames`, no `h2` of its own), so every buffer counted is the gateway's.

use std::path::Path;
use std::time::Duration;

use tailguard_config::Config;
use tailguard_test_support::Upstream;
use tailguard_test_support::h2_frames::{H2Client, StreamEnd, headers_frame};

use crate::Server;

/// Waits until the gateway's connections hold exactly `n` codec buffers. Every exchange
/// that leads here has finished on the client's side; the gateway gets there on its own, at
/// its next poll of each connection (the wait has a generous bound, never a tight one).
async fn held_buffers_reach(n: usize) {
    let wait = async {
        while h2::held_buffers() != n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .is_err()
    {
        panic!(
            "the gateway holds {} codec buffers, not {n}",
            h2::held_buffers()
        );
    }
}

fn get(stream: u32) -> Vec<u8> {
    headers_frame(
        stream,
        &[
            (":method", "GET"),
            (":scheme", "http"),
            (":authority", "gateway.test"),
            (":path", "/"),
        ],
        true,
    )
}

#[tokio::test]
async fn idle_http2_connections_hold_no_codec_buffer() {
    let upstream = Upstream::start().await;
    let text = format!(
        "[[listeners]]\naddress = \"127.0.0.1:0\"\n\n[[upstreams]]\nname = \"up\"\n\
         endpoints = [{{ address = \"{}\" }}]\n\n[[routes]]\nid = \"all\"\nupstream = \"up\"\n",
        upstream.addr
    );
    let config = Config::parse(&text, "test.toml", Path::new(".")).expect("valid config");
    let server = Server::start(config, 1).expect("gateway starts");
    let addr = server.local_addrs()[0];

    // 16 connections, one request each: once answered, each is idle and holds nothing. An
    // unpatched `h2` keeps two buffers (16 KiB and 8 KiB) per connection: 32 here.
    let mut clients = Vec::new();
    for _ in 0..16 {
        let mut client = H2Client::connect(addr).await;
        client.send(&get(1)).await;
        assert_eq!(client.end_of(1).await, StreamEnd::Status(200));
        clients.push(client);
    }
    held_buffers_reach(0).await;

    // Half a frame header: the read buffer keeps it (the partial frame is not lost), the
    // write buffer stays free; the rest of the frame is then read and answered.
    let request = get(3);
    clients[0].send(&request[..5]).await;
    held_buffers_reach(1).await;
    clients[0].send(&request[5..]).await;
    assert_eq!(clients[0].end_of(3).await, StreamEnd::Status(200));
    held_buffers_reach(0).await;

    // Every connection serves again with buffers taken back, and lets them go again.
    for client in &mut clients {
        client.send(&get(5)).await;
        assert_eq!(client.end_of(5).await, StreamEnd::Status(200));
    }
    held_buffers_reach(0).await;

    drop(clients);
    server.shutdown(Duration::from_secs(5)).await;
}

//! The TCP socket of an upstream connection, its receive buffer bounded before it connects.
//!
//! A response whose client reads slowly waits in this socket's receive buffer once the
//! gateway stops reading it. Left to the kernel, that buffer autotunes up to
//! `net.ipv4.tcp_rmem`'s maximum (32 MiB on the project's machine), so a few hundred stalled
//! streams held gigabytes of kernel memory and put the whole host under TCP memory pressure
//! (issue 45). Set before `connect`, `SO_RCVBUF` also fixes the window the handshake
//! announces and turns autotuning off for the socket.

use std::net::SocketAddr;

use tokio::net::{TcpSocket, TcpStream};

/// Connects to `addr`; `receive_buffer` (`limits.upstream_receive_buffer_bytes`, `None`: the
/// kernel's default and autotuning) is set as `SO_RCVBUF` first.
pub(crate) async fn connect(
    addr: SocketAddr,
    receive_buffer: Option<u32>,
) -> std::io::Result<TcpStream> {
    let Some(bytes) = receive_buffer else {
        return TcpStream::connect(addr).await;
    };
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_recv_buffer_size(bytes)?;
    socket.connect(addr).await
}

//! HTTP/1.1 for a proxy: request and response heads, message-body framing, the downstream
//! server and the upstream client, with no other tailguard crate beneath it.
//!
//! The gateway reaches the engine through a small interface: a [`server::Handler`] is what
//! a downstream connection hands each parsed request to (and tells of each head it refused),
//! and [`client::send`] writes a request on a [`client::Connection`] and returns the
//! response with its body streaming from the same socket. Metrics, the access log and the
//! request record live above, in the gateway; nothing here logs or counts.
//!
//! ```text
//!   server (downstream connection)          client (upstream connection)
//!        │ request::parse                        │ write_head (the one rule)
//!        ▼                                       ▼
//!   framing (length, chunked, until close) ◄─── both sides
//!   fields (hop-by-hop, Connection, framing names)
//!   timer, last_waker, recycle (per-thread reuse)
//! ```
//!
//! # Why hand-written
//!
//! hyper's server and client connections were most of the gateway's user CPU per proxied
//! request: its client is a task of its own reached through channels, its server a dispatch
//! state machine with a boxed timer per head. With this engine the gateway spends 16.3k
//! instructions per proxied request against nginx's 18.0k (callgrind; 18.7k with hyper's
//! client replaced but its server kept, more before: `docs/benchmarks/2026-11-22-*`), and
//! its throughput went from 0.73 of nginx's to 1.05-1.10. Parsing is httparse (hyper's own
//! parser), buffers are `bytes`, I/O is tokio: only the message handling is ours.
//!
//! # Invariants
//!
//! - **Nothing ambiguous crosses.** A request head is refused (and its connection closed)
//!   unless its framing is exactly one of: none, one `Content-Length` (equal repeated values
//!   count as one), `Transfer-Encoding: chunked` alone; its target is origin-form,
//!   absolute-form (`http`/`https`, no userinfo) or `*` for `OPTIONS`; it has exactly one
//!   valid `Host` (HTTP/1.1); its version is 1.x. `CONNECT` is refused with `501` and the
//!   connection closed: the bytes after it are never read as requests.
//! - **The forwarded head is built, not copied** ([`client::send`]): framing fields are
//!   never taken from a peer; the gateway writes exactly one, `content-length` or
//!   `transfer-encoding: chunked`, from the body it sends; hop-by-hop fields never cross;
//!   `Upgrade` crosses only as `websocket`, never `h2c`.
//! - **A connection reads its next request only after the previous body ended** (read or
//!   discarded to the end of its framing); a body cut short or malformed ends the
//!   connection. An upstream connection is reusable only after its response body was read
//!   to its end, with keep-alive, and the request body sent whole.
//! - **Every wait is bounded**: a request head by `header` (408), each wait for body bytes
//!   by `body`, the wait for a next request and every write by `idle`, each wait for an
//!   upstream body by its read timeout, a lingering close by its [`server::Linger`].

pub mod client;
pub mod error;
pub mod fields;
pub mod framing;
mod last_waker;
pub mod recycle;
pub mod request;
pub mod server;
pub mod stream;
pub mod timer;

pub use error::{BodyError, RequestError, UpstreamError};
pub use last_waker::LastWaker;

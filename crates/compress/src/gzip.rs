//! gzip streams on deflate states that each thread keeps and resets for its next response,
//! instead of setting one up afresh per response.
//!
//! Setting up a deflate state allocates about 370 KiB and zeroes most of it (the hash heads
//! twice); for an 8 KiB response that was a quarter of what gzip level 1 cost here (a `perf`
//! profile of the gateway: `zlib_rs::deflate::init`'s `memset`, the 2026-12-02 compress
//! note). A reset zeroes only the hash heads and the symbol buffer. A thread keeps at most
//! [`IDLE_PER_THREAD`] idle states; a stream takes one of its shape (else makes one), and
//! gives it back when it ends or is dropped, mid-stream or not: the next stream resets it
//! before its first byte, so nothing of one response reaches the next.
//!
//! As nginx's gzip filter does, a known length shrinks the window and the symbol buffer
//! (zlib's `memLevel`) to fit the body: an 8 KiB body gets a 16 KiB window and 8 Ki
//! symbols, which hold all of it, so its output is the same bytes as with the full window.

use std::cell::RefCell;
use std::io;

use bytes::Bytes;
use zlib_rs::{Deflate, DeflateConfig, DeflateFlush, Status};

use crate::End;

/// The most idle deflate states a thread keeps (the oldest is dropped past it): at most
/// this many times [`STATE_BYTES`] held per serving thread between responses.
pub const IDLE_PER_THREAD: usize = 4;

/// The largest window: 2^15 = 32 KiB, gzip's (and nginx's) default.
const MAX_WINDOW_BITS: u8 = 15;
/// The largest memory level: zlib's default 8, 16 Ki symbols per block.
const MAX_MEM_LEVEL: u8 = 8;

/// The bytes a state copies its output through before it goes out (kept with the state).
const SCRATCH: usize = 16 * 1024;

/// One deflate state's memory at the largest shape, zlib-rs's layout: a window of twice
/// 32 KiB, 32 Ki chain links and 64 Ki hash heads of 2 bytes, a pending buffer of 4 bytes
/// and a symbol buffer of 3 bytes per symbol (16 Ki), plus the output scratch. The state's
/// own fields (trees and counters, about 6 KiB) come on top.
pub const STATE_BYTES: usize =
    2 * (1 << 15) + 2 * (1 << 15) + 2 * (1 << 16) + 7 * (1 << 14) + SCRATCH;

/// What a deflate state is set up for; only a state of the same shape is reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    /// zlib-rs's level.
    level: i32,
    window_bits: u8,
    mem_level: u8,
}

impl Shape {
    /// The shape for a configured `level` and, when known, the body's length.
    fn new(level: i32, length: Option<u64>) -> Shape {
        // Level 1 is zlib's (and so nginx's): deflate_fast without lazy matches, which
        // zlib-rs (like zlib-ng) runs as its level 2. zlib-rs's own level 1 is deflate_quick
        // (static Huffman codes only): about 3x less CPU here but 20 % more bytes than
        // nginx's level 1 (benches/encode.rs). The other levels are zlib-rs's own (3 to 6
        // deflate_medium: within 0.3 % of zlib's sizes).
        let level = match level.clamp(1, 9) {
            1 => 2,
            n => n,
        };
        let (mut window_bits, mut mem_level) = (MAX_WINDOW_BITS, MAX_MEM_LEVEL);
        // nginx's rule (ngx_http_gzip_filter_memory): halve the window and the symbol buffer
        // while the body fits in half the window.
        if let Some(n) = length.filter(|&n| n > 0) {
            while n < 1 << (window_bits - 1) && window_bits > 9 {
                window_bits -= 1;
                mem_level -= 1;
            }
        }
        Shape {
            level,
            window_bits,
            mem_level: mem_level.max(1),
        }
    }

    fn deflate(self) -> Deflate {
        Deflate::new_with_config(DeflateConfig {
            level: self.level,
            // 16 + bits: a gzip header and trailer around the deflate stream.
            window_bits: 16 + i32::from(self.window_bits),
            mem_level: i32::from(self.mem_level),
            ..DeflateConfig::default()
        })
    }
}

/// An idle state, kept for the thread's next stream of its shape.
struct Idle {
    shape: Shape,
    deflate: Deflate,
    scratch: Vec<u8>,
}

thread_local! {
    /// This thread's idle states, the most recently given back last.
    static IDLE: RefCell<Vec<Idle>> = const { RefCell::new(Vec::new()) };
}

/// One gzip stream.
pub(crate) struct Gzip {
    /// `None` only while being given back (in `drop`).
    state: Option<Idle>,
}

impl Gzip {
    /// A stream at `level` (configured: 1 to 9), on an idle state of this thread's when one
    /// of its shape is kept, else on a new one.
    pub(crate) fn new(level: i32, length: Option<u64>) -> Gzip {
        let shape = Shape::new(level, length);
        let reused = IDLE
            .try_with(|idle| {
                let mut idle = idle.borrow_mut();
                let at = idle.iter().rposition(|s| s.shape == shape)?;
                Some(idle.remove(at))
            })
            .ok()
            .flatten();
        let state = match reused {
            Some(mut s) => {
                s.deflate.reset();
                s
            }
            None => Idle {
                shape,
                deflate: shape.deflate(),
                scratch: vec![0; SCRATCH],
            },
        };
        Gzip { state: Some(state) }
    }

    /// Compresses `data`, then flushes or finishes as `end` says; the bytes that came out.
    pub(crate) fn encode(&mut self, mut data: &[u8], end: End) -> io::Result<Bytes> {
        let state = self.state.as_mut().expect("taken only in drop");
        let flush = match end {
            End::No => DeflateFlush::NoFlush,
            End::Flush => DeflateFlush::SyncFlush,
            End::Finish => DeflateFlush::Finish,
        };
        let mut out = Vec::new();
        loop {
            let (in_before, out_before) = (state.deflate.total_in(), state.deflate.total_out());
            let status = state
                .deflate
                .compress(data, &mut state.scratch, flush)
                .map_err(|e| io::Error::other(e.as_str()))?;
            let read = usize::try_from(state.deflate.total_in() - in_before)
                .expect("at most the input's length");
            let wrote = usize::try_from(state.deflate.total_out() - out_before)
                .expect("at most the scratch's length");
            data = &data[read..];
            out.extend_from_slice(&state.scratch[..wrote]);
            // Done when the input is in and the scratch was not filled (zlib's rule: a full
            // output buffer may mean more is waiting), or, finishing, when the stream ended.
            let done = match end {
                End::Finish => status == Status::StreamEnd,
                End::No | End::Flush => data.is_empty() && wrote < state.scratch.len(),
            };
            if done {
                break;
            }
            if status == Status::BufError && read == 0 && wrote == 0 {
                return Err(io::Error::other("deflate made no progress"));
            }
        }
        Ok(Bytes::from(out))
    }
}

impl Drop for Gzip {
    fn drop(&mut self) {
        let Some(state) = self.state.take() else {
            return;
        };
        // A thread being torn down keeps nothing: the state is freed with it.
        let _ = IDLE.try_with(|idle| {
            let mut idle = idle.borrow_mut();
            if idle.len() == IDLE_PER_THREAD {
                idle.remove(0);
            }
            idle.push(state);
        });
    }
}

/// Frees this thread's idle states: its next gzip stream sets one up afresh (for stating
/// a fresh stream's memory and cost; the gateway never needs it).
pub fn drop_idle() {
    let _ = IDLE.try_with(|idle| idle.borrow_mut().clear());
}

/// How many idle states this thread keeps now (for tests).
#[cfg(test)]
fn idle_here() -> usize {
    IDLE.with(|idle| idle.borrow().len())
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn json(n: usize, seed: usize) -> Vec<u8> {
        let mut out = b"[".to_vec();
        let mut i = seed;
        while out.len() < n {
            out.extend_from_slice(format!(r#"{{"id":{i},"name":"item {i}"}},"#).as_bytes());
            i += 1;
        }
        out.truncate(n);
        out
    }

    fn gunzip(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(data)
            .read_to_end(&mut out)
            .expect("gzip");
        out
    }

    fn whole(level: i32, body: &[u8], length: Option<u64>) -> Vec<u8> {
        let mut g = Gzip::new(level, length);
        let mut out = Vec::new();
        for piece in body.chunks(5_000) {
            out.extend_from_slice(&g.encode(piece, End::No).expect("write"));
        }
        out.extend_from_slice(&g.encode(&[], End::Finish).expect("finish"));
        out
    }

    #[test]
    fn a_reused_state_gives_the_same_bytes_as_a_fresh_one() {
        let a = json(8192, 0);
        let b = json(8192, 1000);
        // The first response sets a state up; the second and third reuse it.
        let first = whole(1, &a, Some(8192));
        assert_eq!(idle_here(), 1);
        let second = whole(1, &b, Some(8192));
        let third = whole(1, &a, Some(8192));
        assert_eq!(idle_here(), 1, "the same state each time");
        assert_eq!(gunzip(&first), a);
        assert_eq!(gunzip(&second), b);
        assert_eq!(third, first, "a reset state compresses as a fresh one does");
    }

    #[test]
    fn a_stream_dropped_mid_way_leaves_nothing_in_the_next() {
        let a = json(200_000, 0);
        let b = json(200_000, 5_000);
        let fresh = whole(6, &b, None);
        let mut g = Gzip::new(6, None);
        let mut partial = g.encode(&a[..150_000], End::No).expect("write");
        partial.truncate(0);
        drop(g);
        assert_eq!(idle_here(), 1);
        let after = whole(6, &b, None);
        assert_eq!(idle_here(), 1);
        assert_eq!(gunzip(&after), b);
        assert_eq!(after, fresh);
    }

    #[test]
    fn a_thread_keeps_a_bounded_number_of_states() {
        let streams: Vec<Gzip> = (0..IDLE_PER_THREAD + 3)
            .map(|_| Gzip::new(1, None))
            .collect();
        assert_eq!(idle_here(), 0, "all in use");
        drop(streams);
        assert_eq!(idle_here(), IDLE_PER_THREAD);
        // Another shape takes no state of the first's, and pushes the oldest out.
        let body = json(3000, 0);
        assert_eq!(gunzip(&whole(6, &body, Some(3000))), body);
        assert_eq!(idle_here(), IDLE_PER_THREAD);
        drop_idle();
        assert_eq!(idle_here(), 0);
    }

    #[test]
    fn a_known_length_fits_the_window_as_nginx_does() {
        let full = Shape::new(1, None);
        assert_eq!((full.level, full.window_bits, full.mem_level), (2, 15, 8));
        assert_eq!(Shape::new(6, Some(100_000)).window_bits, 15);
        let s = Shape::new(6, Some(8192));
        assert_eq!((s.level, s.window_bits, s.mem_level), (6, 14, 7));
        let s = Shape::new(6, Some(1));
        assert_eq!((s.window_bits, s.mem_level), (9, 2));
        // A fitted window gives the same bytes for a body it holds.
        let body = json(8192, 0);
        assert_eq!(whole(1, &body, Some(8192)), whole(1, &body, None));
    }

    #[test]
    fn a_flush_after_every_piece_keeps_each_readable() {
        let mut g = Gzip::new(1, None);
        let mut out = g
            .encode(b"data: one\n\n", End::Flush)
            .expect("flush")
            .to_vec();
        let mut first = [0u8; 11];
        flate2::read::GzDecoder::new(&out[..])
            .read_exact(&mut first)
            .expect("the first event");
        assert_eq!(&first, b"data: one\n\n");
        out.extend_from_slice(&g.encode(b"data: two\n\n", End::Finish).expect("end"));
        assert_eq!(gunzip(&out), b"data: one\n\ndata: two\n\n");
    }
}

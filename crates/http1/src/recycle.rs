//! Per-thread free lists of header maps and of a connection's buffers, so that a request on
//! a warm connection allocates none of them anew, and an idle connection holds none of them.
//!
//! A map that served a response goes back to its serving thread's list when the head was
//! written, and the next response takes it from there, already sized. A downstream
//! connection's read buffer goes back when the connection waits for its next request with
//! nothing buffered, and its response-head buffer when a response was written: an idle
//! keep-alive connection holds no buffer (as nginx frees its buffers between keep-alive
//! requests), and the next request on any connection of the thread takes one from here.
//! Lists are short and per thread (no lock, nothing shared), and anything grown unusually
//! large is dropped rather than kept.

use std::cell::RefCell;

use bytes::BytesMut;
use http::HeaderMap;

use crate::framing::MIN_READ;

/// How many maps a serving thread keeps: enough for the requests in flight on a busy
/// thread; beyond it, maps are freed.
const KEEP: usize = 256;
/// A header map with room for more fields than this is freed, not kept.
pub const LARGEST_KEPT: usize = 64;

/// How many buffers of each kind a serving thread keeps: as many as its connections
/// busy at once usually need. Beyond it, buffers are freed, so after a storm of
/// connections a thread keeps at most this many (8 KiB read buffers and small head
/// buffers: well under 1 MiB).
const KEEP_BUFFERS: usize = 64;
/// A read buffer with room for more than this is freed, not kept (one that grew for a
/// large request body).
const LARGEST_READ_KEPT: usize = 2 * MIN_READ;
/// A response-head buffer with room for more than this is freed, not kept (one that grew
/// while small body frames were copied behind a head).
const LARGEST_OUT_KEPT: usize = 4 * 1024;
/// Room a new response-head buffer starts with: a typical head and a small body.
const OUT_START: usize = 1024;

thread_local! {
    static HEADER_MAPS: RefCell<Vec<HeaderMap>> = const { RefCell::new(Vec::new()) };
    static READ_BUFS: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
    static OUT_BUFS: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// An empty read buffer with room for at least `MIN_READ / 2` bytes (one of the thread's
/// kept ones if there is one).
pub fn read_buf() -> BytesMut {
    READ_BUFS
        .with_borrow_mut(Vec::pop)
        .unwrap_or_else(|| BytesMut::with_capacity(MIN_READ))
}

/// Takes back an empty read buffer: kept for the next request if it has (or, no head
/// split from it being alive any more, gets back without allocating) the room a read wants
/// and is not oversized, else freed.
pub fn give_read_buf(mut buf: BytesMut) {
    debug_assert!(buf.is_empty(), "a read buffer goes back empty");
    if !buf.is_empty() || buf.capacity() > LARGEST_READ_KEPT {
        return;
    }
    if buf.capacity() < MIN_READ / 2 && !buf.try_reclaim(MIN_READ) {
        return;
    }
    READ_BUFS.with_borrow_mut(|kept| {
        if kept.len() < KEEP_BUFFERS {
            kept.push(buf);
        }
    });
}

/// An empty buffer for a response head (one of the thread's kept ones if there is one).
pub fn out_buf() -> Vec<u8> {
    OUT_BUFS
        .with_borrow_mut(Vec::pop)
        .unwrap_or_else(|| Vec::with_capacity(OUT_START))
}

/// Takes back a response-head buffer that is done with: kept if not oversized.
pub fn give_out_buf(mut buf: Vec<u8>) {
    if buf.capacity() == 0 || buf.capacity() > LARGEST_OUT_KEPT {
        return;
    }
    buf.clear();
    OUT_BUFS.with_borrow_mut(|kept| {
        if kept.len() < KEEP_BUFFERS {
            kept.push(buf);
        }
    });
}

/// An empty header map with room for at least `fields` entries.
pub fn header_map(fields: usize) -> HeaderMap {
    match HEADER_MAPS.with_borrow_mut(Vec::pop) {
        Some(mut map) => {
            map.reserve(fields);
            map
        }
        None => HeaderMap::with_capacity(fields),
    }
}

/// Takes back a header map that is done with; its values are dropped now.
pub fn give_header_map(mut map: HeaderMap) {
    if map.capacity() > LARGEST_KEPT {
        return;
    }
    map.clear();
    HEADER_MAPS.with_borrow_mut(|kept| {
        if kept.len() < KEEP {
            kept.push(map);
        }
    });
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn header_maps_come_back_cleared_and_large_ones_are_not_kept() {
        let mut map = header_map(4);
        map.insert("x-b", HeaderValue::from_static("2"));
        give_header_map(map);
        let again = header_map(2);
        assert!(again.is_empty());
        assert!(again.capacity() >= 4);
        let big = HeaderMap::with_capacity(LARGEST_KEPT * 4);
        give_header_map(big);
        assert!(header_map(1).capacity() <= LARGEST_KEPT);
    }

    #[test]
    fn buffers_come_back_empty_and_oversized_or_spent_ones_are_freed() {
        let buf = read_buf();
        assert!(buf.is_empty());
        assert!(buf.capacity() >= MIN_READ / 2);
        let at = buf.as_ptr();
        give_read_buf(buf);
        assert_eq!(
            read_buf().as_ptr(),
            at,
            "the kept buffer is handed out again"
        );
        give_read_buf(BytesMut::with_capacity(LARGEST_READ_KEPT * 4));
        give_read_buf(BytesMut::with_capacity(16));
        let next = read_buf();
        assert!((MIN_READ / 2..=LARGEST_READ_KEPT).contains(&next.capacity()));

        let mut out = out_buf();
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        give_out_buf(out);
        let again = out_buf();
        assert!(again.is_empty());
        give_out_buf(Vec::with_capacity(LARGEST_OUT_KEPT * 4));
        assert!(out_buf().capacity() <= LARGEST_OUT_KEPT);
    }
}

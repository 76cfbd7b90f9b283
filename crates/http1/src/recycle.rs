//! Per-thread free lists of header maps, so that a response head on a warm connection does
//! not allocate its map anew: a map that served a response goes back to its serving
//! thread's list when the head was written, and the next response takes it from there,
//! already sized. Lists are short and per thread (no lock, nothing shared), and a map grown
//! unusually large is dropped rather than kept.

use std::cell::RefCell;

use http::HeaderMap;

/// How many maps a serving thread keeps: enough for the requests in flight on a busy
/// thread; beyond it, maps are freed.
const KEEP: usize = 256;
/// A header map with room for more fields than this is freed, not kept.
pub const LARGEST_KEPT: usize = 64;

thread_local! {
    static HEADER_MAPS: RefCell<Vec<HeaderMap>> = const { RefCell::new(Vec::new()) };
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
}

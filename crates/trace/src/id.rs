//! Trace and span ids: their hex forms and their generation from a per-thread RNG.
//!
//! Ids come from `fastrand`'s thread-local wyrand generator: a `Cell<u64>` per thread,
//! seeded once, so an id costs a few multiplications, no lock and no syscall. W3C Trace
//! Context asks for ids that are random enough to be unique, not for cryptographic ones.

use std::fmt;

/// A 16-byte trace id. All zeros is invalid (W3C Trace Context §3.2.2.3).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TraceId(pub [u8; 16]);

/// An 8-byte span id. All zeros is invalid, and stands for "no parent" inside a span.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SpanId(pub [u8; 8]);

impl TraceId {
    /// The invalid id.
    pub const INVALID: TraceId = TraceId([0; 16]);

    /// A new random, valid id.
    pub fn random() -> TraceId {
        loop {
            let id = fastrand::u128(..).to_be_bytes();
            if id != [0; 16] {
                return TraceId(id);
            }
        }
    }

    /// Whether it is not all zeros.
    pub fn is_valid(&self) -> bool {
        self.0 != [0; 16]
    }

    /// The 32 lowercase hex digits.
    pub fn to_hex(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        hex_into(&self.0, &mut out);
        out
    }

    /// Parses 32 lowercase hex digits (uppercase is invalid in `traceparent`).
    pub fn from_hex(hex: &[u8]) -> Option<TraceId> {
        let mut out = [0u8; 16];
        (hex.len() == 32 && parse_hex(hex, &mut out)).then_some(TraceId(out))
    }
}

impl SpanId {
    /// The invalid id (no parent).
    pub const INVALID: SpanId = SpanId([0; 8]);

    /// A new random, valid id.
    pub fn random() -> SpanId {
        loop {
            let id = fastrand::u64(..).to_be_bytes();
            if id != [0; 8] {
                return SpanId(id);
            }
        }
    }

    /// Whether it is not all zeros.
    pub fn is_valid(&self) -> bool {
        self.0 != [0; 8]
    }

    /// The 16 lowercase hex digits.
    pub fn to_hex(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        hex_into(&self.0, &mut out);
        out
    }

    /// Parses 16 lowercase hex digits.
    pub fn from_hex(hex: &[u8]) -> Option<SpanId> {
        let mut out = [0u8; 8];
        (hex.len() == 16 && parse_hex(hex, &mut out)).then_some(SpanId(out))
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(std::str::from_utf8(&self.to_hex()).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(std::str::from_utf8(&self.to_hex()).map_err(|_| fmt::Error)?)
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Writes `bytes` as lowercase hex into `out` (twice as long).
pub(crate) fn hex_into(bytes: &[u8], out: &mut [u8]) {
    // Both digits of a byte in one lookup, and no index to check: every traced request
    // writes 48 digits for its `traceparent` (130 instructions a request with two lookups
    // a byte).
    for (pair, &b) in out.chunks_exact_mut(2).zip(bytes) {
        pair.copy_from_slice(&HEX_PAIRS[usize::from(b)]);
    }
}

/// The two lowercase hex digits of every byte. (`tailguard_access_log::hex_into` has the
/// same table; this library depends on no other tailguard library but the metrics one, so
/// that a service can take tracing alone.)
static HEX_PAIRS: [[u8; 2]; 256] = {
    let mut pairs = [[0u8; 2]; 256];
    let mut b = 0;
    while b < 256 {
        pairs[b] = [HEX[b >> 4], HEX[b & 0xf]];
        b += 1;
    }
    pairs
};

/// Lowercase hex digits into `out` (half as long); false on any other byte.
pub(crate) fn parse_hex(hex: &[u8], out: &mut [u8]) -> bool {
    if hex.len() != 2 * out.len() {
        return false;
    }
    for (i, pair) in hex.chunks_exact(2).enumerate() {
        match (nibble(pair[0]), nibble(pair[1])) {
            (Some(h), Some(l)) => out[i] = h << 4 | l,
            _ => return false,
        }
    }
    true
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_uppercase() {
        let id = TraceId::from_hex(b"4bf92f3577b34da6a3ce929d0e0e4736").expect("valid");
        assert_eq!(&id.to_hex(), b"4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(TraceId::from_hex(b"4BF92F3577B34DA6A3CE929D0E0E4736").is_none());
        assert!(SpanId::from_hex(b"00f067aa0ba902b7").is_some());
        assert!(SpanId::from_hex(b"00f067aa0ba902b").is_none());
        assert!(SpanId::from_hex(b"00f067aa0ba902bz").is_none());
    }

    #[test]
    fn random_ids_are_valid_and_differ() {
        let a = TraceId::random();
        let b = TraceId::random();
        assert!(a.is_valid() && b.is_valid());
        assert_ne!(a, b);
        assert_ne!(SpanId::random(), SpanId::random());
    }
}

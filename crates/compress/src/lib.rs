//! Streaming response encoders: a body is fed in as it arrives and comes out compressed, a
//! piece at a time, never held whole; each stream's memory is bounded by the window and
//! buffer sizes set here.
//!
//! An [`Encoder`] takes the body's pieces ([`Encoder::write`]), hands back whatever
//! compressed bytes are ready (often none: the coder keeps a block until it is worth
//! sending), can be made to send everything it has so far ([`Encoder::flush`], for a
//! stream of events) and ends the stream ([`Encoder::finish`]). It knows nothing of HTTP:
//! the gateway decides when to compress (`tailguard_policy::compress`) and drives the
//! encoder from its response body.
//!
//! Memory per stream, by coding (the window is what the decoder needs too):
//! - gzip: zlib-rs's deflate state for a 32 KiB window at memory level 8 (the zlib
//!   defaults, which nginx uses): 2 x 32 KiB window + 64 KiB chains + 128 KiB hash heads +
//!   64 KiB pending + 48 KiB symbols, and a 16 KiB output scratch: [`GZIP_BYTES`], less for
//!   a body whose length is known to be under 16 KiB (the window fits it). Each thread also
//!   keeps up to [`gzip::IDLE_PER_THREAD`] idle states between responses, to reset instead of
//!   setting one up per response ([`gzip`]).
//!
//! ```
//! use std::io::Read;
//! use tailguard_compress::{Algorithm, Encoder};
//!
//! let mut encoder = Encoder::new(Algorithm::Gzip, 1, None).expect("an encoder");
//! let mut out = Vec::new();
//! for piece in [&b"{\"a\":1,"[..], b"\"b\":2}"] {
//!     out.extend_from_slice(&encoder.write(piece).expect("compresses"));
//! }
//! out.extend_from_slice(&encoder.finish().expect("ends"));
//! let mut text = String::new();
//! flate2::read::GzDecoder::new(&out[..]).read_to_string(&mut text).expect("gzip");
//! assert_eq!(text, r#"{"a":1,"b":2}"#);
//! ```
//!
//! The gzip backend is zlib-rs (the one flate2 runs on here), used directly for its
//! reset: which backend was chosen by measuring them here (`benches/encode.rs`, the
//! crate's `Cargo.toml` says the choice and its figures).

pub mod gzip;

use std::io::{self, Write};

use bytes::Bytes;

/// A stream's gzip memory at most, stated: [`gzip::STATE_BYTES`] (zlib-rs's layout of a
/// 32 KiB window at memory level 8, and the output scratch).
pub const GZIP_BYTES: usize = gzip::STATE_BYTES;

/// zstd's window: 2^19 = 512 KiB at most (zstd's own level 3 would take 2 MiB and more,
/// RFC 8878 allows a decoder to refuse over 8 MiB). Set when the body's length is not
/// known; a known length shrinks the window and tables to fit it (zstd does so itself when
/// told the length).
pub const ZSTD_WINDOW_LOG: u32 = 19;
/// zstd's hash and chain tables: 2^16 entries of 4 bytes, 256 KiB each at most (level 3's
/// own, 2^17 for the hash, would be 512 KiB).
pub const ZSTD_TABLE_LOG: u32 = 16;
/// Brotli's window: 2^18 = 256 KiB (brotli's own 4 MiB default is sized for files, not for
/// responses).
pub const BROTLI_WINDOW_LOG: u32 = 18;
/// The output buffers of the brotli and zstd writers.
const OUT_BUFFER: usize = 16 * 1024;

/// A content coding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// gzip (RFC 1952): deflate with a 32 KiB window.
    Gzip,
    /// Brotli (RFC 7932), window [`BROTLI_WINDOW_LOG`].
    Br,
    /// zstd (RFC 8878), window [`ZSTD_WINDOW_LOG`] at most.
    Zstd,
}

/// What [`Encoder::encode`] does after compressing what it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Nothing: the coder sends what it decides to.
    No,
    /// A sync flush: everything given so far can be decoded from what came out.
    Flush,
    /// The end of the stream: the coding's last bytes and trailer.
    Finish,
}

/// One response body's encoder.
pub struct Encoder {
    inner: Inner,
}

enum Inner {
    Gzip(gzip::Gzip),
    Br(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
    /// Finished: nothing more can be written.
    Done,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let coding = match &self.inner {
            Inner::Gzip(_) => "gzip",
            Inner::Br(_) => "br",
            Inner::Zstd(_) => "zstd",
            Inner::Done => "done",
        };
        f.debug_struct("Encoder").field("coding", &coding).finish()
    }
}

impl Encoder {
    /// An encoder for `algorithm` at `level` (a level outside the coding's range is
    /// clamped into it; the config refuses one before it gets here). `length` is the body's
    /// length when known: each coding sizes its window and tables to it.
    pub fn new(algorithm: Algorithm, level: i32, length: Option<u64>) -> io::Result<Encoder> {
        let inner = match algorithm {
            Algorithm::Gzip => Inner::Gzip(gzip::Gzip::new(level, length)),
            Algorithm::Br => {
                let quality = level.clamp(0, 11);
                let params = brotli::enc::BrotliEncoderParams {
                    quality,
                    lgwin: brotli_window_log(quality, length) as i32,
                    size_hint: length.map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX)),
                    ..Default::default()
                };
                Inner::Br(Box::new(brotli::CompressorWriter::with_params(
                    Vec::new(),
                    OUT_BUFFER,
                    &params,
                )))
            }
            Algorithm::Zstd => {
                let mut raw = zstd::stream::raw::Encoder::new(level.clamp(1, 19))?;
                if let Some(n) = length {
                    raw.set_pledged_src_size(Some(n))?;
                }
                for p in zstd_bounds(length) {
                    raw.set_parameter(p)?;
                }
                let writer =
                    zstd::stream::zio::Writer::new_with_capacity(Vec::new(), raw, OUT_BUFFER);
                Inner::Zstd(zstd::stream::write::Encoder::with_writer(writer))
            }
        };
        Ok(Encoder { inner })
    }

    /// Compresses `data`, then flushes or finishes as `end` says; returns the compressed
    /// bytes ready so far (possibly none: the coder keeps a block until it is worth
    /// sending, unless told to flush or finish).
    pub fn encode(&mut self, data: &[u8], end: End) -> io::Result<Bytes> {
        let out = match &mut self.inner {
            Inner::Gzip(e) => e.encode(data, end)?,
            Inner::Br(e) => {
                e.write_all(data)?;
                match end {
                    End::No => take(e.get_mut()),
                    End::Flush => {
                        e.flush()?;
                        take(e.get_mut())
                    }
                    End::Finish => {
                        let Inner::Br(e) = std::mem::replace(&mut self.inner, Inner::Done) else {
                            unreachable!("matched above")
                        };
                        Bytes::from(e.into_inner())
                    }
                }
            }
            Inner::Zstd(e) => {
                e.write_all(data)?;
                match end {
                    End::No => {}
                    End::Flush => e.flush()?,
                    End::Finish => e.do_finish()?,
                }
                take(e.get_mut())
            }
            Inner::Done => return Err(finished()),
        };
        if end == End::Finish {
            self.inner = Inner::Done;
        }
        Ok(out)
    }

    /// Compresses `data`; returns the compressed bytes ready so far (possibly none).
    pub fn write(&mut self, data: &[u8]) -> io::Result<Bytes> {
        self.encode(data, End::No)
    }

    /// Sends everything written so far (a sync flush: the decoder can read it all now),
    /// at some cost in ratio; for a stream whose pieces must arrive as they come.
    pub fn flush(&mut self) -> io::Result<Bytes> {
        self.encode(&[], End::Flush)
    }

    /// Ends the stream: the last compressed bytes, with the coding's trailer.
    pub fn finish(&mut self) -> io::Result<Bytes> {
        self.encode(&[], End::Finish)
    }

    /// Whether [`Encoder::finish`] was called.
    pub fn is_finished(&self) -> bool {
        matches!(self.inner, Inner::Done)
    }
}

/// zstd's parameters beyond its level. Told the length, zstd fits its window and tables to
/// it (and writes it in the frame's header); else, or past the bound, they are set to the
/// bound.
fn zstd_bounds(length: Option<u64>) -> Vec<zstd::zstd_safe::CParameter> {
    use zstd::zstd_safe::CParameter;
    if length.is_none_or(|n| n > 1 << ZSTD_WINDOW_LOG) {
        vec![
            CParameter::WindowLog(ZSTD_WINDOW_LOG),
            CParameter::HashLog(ZSTD_TABLE_LOG),
            CParameter::ChainLog(ZSTD_TABLE_LOG),
        ]
    } else {
        Vec::new()
    }
}

/// The memory of a zstd stream's context (C's heap, which a Rust allocator does not see)
/// once it has compressed `body` at `level`, told its length or not, as [`Encoder`] sets
/// it up: for stating a stream's memory (the crate's bench prints it).
pub fn zstd_context_bytes(level: i32, body: &[u8], length_known: bool) -> io::Result<usize> {
    use zstd::zstd_safe::zstd_sys::ZSTD_EndDirective::ZSTD_e_end;
    use zstd::zstd_safe::{CCtx, CParameter, InBuffer, OutBuffer};
    let err = |code| io::Error::other(zstd::zstd_safe::get_error_name(code));
    let mut cctx = CCtx::create();
    cctx.set_parameter(CParameter::CompressionLevel(level.clamp(1, 19)))
        .map_err(err)?;
    let length = length_known.then_some(body.len() as u64);
    if length.is_some() {
        cctx.set_pledged_src_size(length).map_err(err)?;
    }
    for p in zstd_bounds(length) {
        cctx.set_parameter(p).map_err(err)?;
    }
    let mut out = vec![0u8; zstd::zstd_safe::compress_bound(body.len()) + 1024];
    let mut input = InBuffer::around(body);
    let mut output = OutBuffer::around(&mut out[..]);
    while cctx
        .compress_stream2(&mut output, &mut input, ZSTD_e_end)
        .map_err(err)?
        > 0
    {}
    Ok(cctx.sizeof())
}

/// The smallest brotli window at or above which rust-brotli picks a hasher of its own for
/// qualities 5 to 8 (C brotli's H5, 2^14 buckets of 2^(quality - 1) entries).
const BROTLI_H5_WINDOW_LOG: u32 = 17;

/// Brotli's window for a stream at `quality`: fitted to a known length (and the ring buffer
/// with it), else [`BROTLI_WINDOW_LOG`]. At qualities 5 to 8 never under
/// [`BROTLI_H5_WINDOW_LOG`]: for a smaller window C brotli uses its forgetful-chain hashers
/// (H40 to H42), which rust-brotli does not have, so it fell back to H6 with its default
/// tables, 2^15 buckets of 2^8 entries of 4 bytes: 32 MiB zeroed per stream (level 5 cost
/// 10x level 4 per response, the 2026-12-02 compress run).
fn brotli_window_log(quality: i32, length: Option<u64>) -> u32 {
    let fitted = length.map_or(BROTLI_WINDOW_LOG, window_log_for);
    if (5..=8).contains(&quality) {
        fitted.max(BROTLI_H5_WINDOW_LOG)
    } else {
        fitted
    }
}

/// The smallest brotli window (2^10 to 2^[`BROTLI_WINDOW_LOG`]) that holds `n` bytes.
fn window_log_for(n: u64) -> u32 {
    let bits = u64::BITS - n.saturating_sub(1).leading_zeros();
    bits.clamp(10, BROTLI_WINDOW_LOG)
}

/// The bytes an encoder wrote into its output, leaving it empty.
fn take(out: &mut Vec<u8>) -> Bytes {
    if out.is_empty() {
        Bytes::new()
    } else {
        Bytes::from(std::mem::take(out))
    }
}

fn finished() -> io::Error {
    io::Error::other("the encoder was finished")
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn json(n: usize) -> Vec<u8> {
        let mut out = b"[".to_vec();
        let mut i = 0;
        while out.len() < n {
            out.extend_from_slice(
                format!(
                    r#"{{"id":{i},"name":"item {i}","tags":["a","b"],"price":{}.5}},"#,
                    i * 7
                )
                .as_bytes(),
            );
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

    fn decode(algorithm: Algorithm, data: &[u8]) -> Vec<u8> {
        match algorithm {
            Algorithm::Gzip => gunzip(data),
            Algorithm::Br => {
                let mut out = Vec::new();
                brotli::Decompressor::new(data, 4096)
                    .read_to_end(&mut out)
                    .expect("br");
                out
            }
            Algorithm::Zstd => zstd::stream::decode_all(data).expect("zstd"),
        }
    }

    const ALL: [(Algorithm, i32); 3] = [
        (Algorithm::Gzip, 6),
        (Algorithm::Br, 4),
        (Algorithm::Zstd, 3),
    ];

    #[test]
    fn a_body_fed_in_pieces_comes_back_whole() {
        let body = json(700_000);
        for (algorithm, level) in ALL {
            for length in [None, Some(body.len() as u64)] {
                let mut enc = Encoder::new(algorithm, level, length).expect("an encoder");
                let mut out = Vec::new();
                for piece in body.chunks(7_000) {
                    out.extend_from_slice(&enc.write(piece).expect("write"));
                }
                out.extend_from_slice(&enc.finish().expect("finish"));
                assert!(
                    out.len() < body.len() / 4,
                    "{algorithm:?}: {} of {}",
                    out.len(),
                    body.len()
                );
                assert_eq!(decode(algorithm, &out), body, "{algorithm:?} {length:?}");
                assert!(enc.is_finished());
                assert!(enc.write(b"x").is_err());
            }
        }
    }

    #[test]
    fn a_window_fits_a_known_length() {
        assert_eq!(window_log_for(0), 10);
        assert_eq!(window_log_for(1024), 10);
        assert_eq!(window_log_for(1025), 11);
        assert_eq!(window_log_for(8192), 13);
        assert_eq!(window_log_for(65_536), 16);
        assert_eq!(window_log_for(u64::MAX), BROTLI_WINDOW_LOG);
    }

    #[test]
    fn brotli_5_to_8_keep_a_window_with_a_hasher_of_their_own() {
        for quality in 5..=8 {
            assert_eq!(brotli_window_log(quality, Some(8192)), BROTLI_H5_WINDOW_LOG);
            assert_eq!(brotli_window_log(quality, None), BROTLI_WINDOW_LOG);
        }
        for quality in [0, 4, 9, 11] {
            assert_eq!(brotli_window_log(quality, Some(8192)), 13);
        }
        // And it compresses as before.
        let body = json(8192);
        let mut enc = Encoder::new(Algorithm::Br, 5, Some(8192)).expect("an encoder");
        let out = enc.encode(&body, End::Finish).expect("encodes");
        assert!(out.len() < body.len() / 3);
        assert_eq!(decode(Algorithm::Br, &out), body);
    }

    #[test]
    fn the_last_piece_and_the_end_come_out_together() {
        for (algorithm, level) in ALL {
            let mut enc = Encoder::new(algorithm, level, Some(4)).expect("an encoder");
            let out = enc.encode(b"last", End::Finish).expect("encodes");
            assert_eq!(decode(algorithm, &out), b"last", "{algorithm:?}");
        }
    }

    #[test]
    fn a_flush_makes_everything_so_far_readable() {
        for (algorithm, level) in ALL {
            let mut enc = Encoder::new(algorithm, level, None).expect("an encoder");
            let out = enc.encode(b"data: one\n\n", End::Flush).expect("flush");
            let mut first = [0u8; 11];
            match algorithm {
                Algorithm::Gzip => flate2::read::GzDecoder::new(&out[..]).read_exact(&mut first),
                Algorithm::Br => brotli::Decompressor::new(&out[..], 4096).read_exact(&mut first),
                Algorithm::Zstd => zstd::stream::read::Decoder::new(&out[..])
                    .expect("a decoder")
                    .read_exact(&mut first),
            }
            .expect("the first event");
            assert_eq!(&first, b"data: one\n\n", "{algorithm:?}");
        }
    }
}

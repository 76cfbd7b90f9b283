//! The chunked decoder on any bytes, fed in any pieces: the same data and the same end
//! however the reads fall, and what it accepts is what a strict decoder written apart
//! accepts, with the same data.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use tailguard_http1::framing::{Chunk, Framing, Step, step};
use tailguard_http1_fuzz::{Dechunked, dechunk};

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The data, and the bytes the body took.
    Done(Vec<u8>, usize),
    Error,
    Partial,
}

fn decode(wire: &[u8], piece: usize) -> Outcome {
    let mut framing = Framing::Chunked(Chunk::Size);
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let mut data = Vec::new();
    loop {
        match step(&mut framing, &mut buf) {
            Err(_) => return Outcome::Error,
            Ok(Step::Frame(frame)) => {
                if let Ok(d) = frame.into_data() {
                    data.extend_from_slice(&d);
                }
            }
            Ok(Step::Again) if matches!(framing, Framing::Done) => {
                return Outcome::Done(data, fed - buf.len());
            }
            Ok(Step::Again) => {}
            Ok(Step::NeedMore) => {
                if fed == wire.len() {
                    return Outcome::Partial;
                }
                let next = (fed + piece).min(wire.len());
                buf.extend_from_slice(&wire[fed..next]);
                fed = next;
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let [piece, wire @ ..] = data else {
        return;
    };
    let whole = decode(wire, wire.len().max(1));
    let pieces = decode(wire, usize::from(*piece).max(1));
    assert_eq!(
        whole, pieces,
        "the outcome depends on how the bytes were read"
    );
    match (&whole, dechunk(wire, true)) {
        (Outcome::Done(d, used), Dechunked::Whole(d2, used2)) => {
            assert_eq!((d, *used), (&d2, used2), "decoded differently");
        }
        (Outcome::Done(..), other) => panic!("accepted what a strict decoder does not: {other:?}"),
        (Outcome::Error, Dechunked::Whole(..)) => panic!("refused a well-formed body"),
        _ => {}
    }
});

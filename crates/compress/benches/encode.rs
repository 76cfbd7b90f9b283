//! CPU per response of each coding at its common web levels, for the JSON bodies the lab's
//! `compress` scenario serves (`lab/compress/8k.json`, `64k.json`): an encoder per response
//! (told the body's length, as the gateway is when the upstream sends `Content-Length`), the
//! body fed in 16 KiB pieces as an upstream's frames would come, and the stream finished.
//! gzip reuses the thread's idle deflate state as the gateway does (`src/gzip.rs`);
//! `gzip_N_fresh` sets one up per response instead (as before the reuse), for comparison. The baseline is a plain copy of the body into `Bytes` (what an
//! uncompressed response costs here). Each compressed size is printed beside the bench's
//! name, and the heap a stream holds at its peak (Rust allocations: gzip and brotli; zstd's
//! context is C's, stated in the crate's doc).
//!
//! The gzip backend is flate2's feature: to compare backends, run the gzip benches once per
//! backend, `cargo bench -p tailguard-compress --bench encode -- gzip` with the workspace's
//! backend, then with `--features flate2/zlib-ng` (zlib-ng, C) and so on.

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tailguard_compress::{Algorithm, Encoder};

/// Counts the heap in use and its peak, to state a stream's memory.
struct Counting;

static IN_USE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now =
            IN_USE.fetch_add(layout.size() as isize, Ordering::Relaxed) + layout.size() as isize;
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        IN_USE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: allocated by `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const BODIES: [(&str, &[u8]); 2] = [
    ("8k", include_bytes!("../../../lab/compress/8k.json")),
    ("64k", include_bytes!("../../../lab/compress/64k.json")),
];

/// The codings at the levels worth comparing: gzip 1 (nginx's default), 3 and 6, brotli 4
/// (the gateway's default) and 5, zstd 3 (the default) and 1.
const CASES: [(&str, Algorithm, i32); 7] = [
    ("gzip_1", Algorithm::Gzip, 1),
    ("gzip_3", Algorithm::Gzip, 3),
    ("gzip_6", Algorithm::Gzip, 6),
    ("br_4", Algorithm::Br, 4),
    ("br_5", Algorithm::Br, 5),
    ("zstd_1", Algorithm::Zstd, 1),
    ("zstd_3", Algorithm::Zstd, 3),
];

/// One response: the body through a fresh encoder, in 16 KiB pieces; the compressed size.
fn encode(algorithm: Algorithm, level: i32, body: &[u8], length: Option<u64>) -> usize {
    let mut enc = Encoder::new(algorithm, level, length).expect("an encoder");
    let mut n = 0;
    for piece in body.chunks(16 * 1024) {
        n += enc.write(piece).expect("compresses").len();
    }
    n + enc.finish().expect("ends").len()
}

fn bench(c: &mut Criterion) {
    for (name, body) in BODIES {
        let mut g = c.benchmark_group(format!("encode/{name}"));
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function("copy", |b| {
            b.iter(|| bytes::Bytes::copy_from_slice(black_box(body)));
        });
        for (case, algorithm, level) in CASES {
            let length = Some(body.len() as u64);
            // A fresh stream's memory: no idle gzip state to reuse.
            tailguard_compress::gzip::drop_idle();
            let base = IN_USE.load(Ordering::Relaxed);
            PEAK.store(base, Ordering::Relaxed);
            let size = encode(algorithm, level, body, length);
            let peak = PEAK.load(Ordering::Relaxed) - base;
            let unknown = {
                tailguard_compress::gzip::drop_idle();
                let base = IN_USE.load(Ordering::Relaxed);
                PEAK.store(base, Ordering::Relaxed);
                encode(algorithm, level, body, None);
                PEAK.load(Ordering::Relaxed) - base
            };
            let zstd = if algorithm == Algorithm::Zstd {
                let known = tailguard_compress::zstd_context_bytes(level, body, true)
                    .expect("zstd compresses");
                let unknown = tailguard_compress::zstd_context_bytes(level, body, false)
                    .expect("zstd compresses");
                format!(
                    "; zstd context (C heap) {} KiB known, {} KiB not",
                    known / 1024,
                    unknown / 1024
                )
            } else {
                String::new()
            };
            eprintln!(
                "encode/{name}/{case}: {size} bytes of {} (ratio {:.2}); Rust heap peak {} KiB \
                 with the length known, {} KiB without{zstd}",
                body.len(),
                body.len() as f64 / size as f64,
                peak / 1024,
                unknown / 1024
            );
            g.bench_function(case, |b| {
                b.iter(|| encode(algorithm, level, black_box(body), length));
            });
            if algorithm == Algorithm::Gzip {
                g.bench_function(format!("{case}_fresh"), |b| {
                    b.iter(|| {
                        tailguard_compress::gzip::drop_idle();
                        encode(algorithm, level, black_box(body), length)
                    });
                });
            }
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! Warming the next span's window before it is written: a prefetch for writing, the only
//! `unsafe` in the crate.
//!
//! A request's spans are written into its thread's buffer, each after the last. The lines a
//! span writes were last touched when the exporter copied the buffer's previous spans out,
//! milliseconds and many requests before, and are no longer in the core's caches. The
//! stores into them waited for their lines in the store buffer, and the next locked
//! instruction (the slot's unlock, an atomic add) and any load the store buffer could not
//! forward waited for all of them: `perf annotate` put more than half of the recording's
//! samples on such waits, not on the writing itself. A prefetch for writing of the next
//! span's lines, issued when a request's spans are done, has them owned and cached when the
//! next request writes them. A prefetch neither faults nor changes memory, and is not
//! ordered with locked instructions, so it delays nothing here. It asks for the lines to
//! write (`_MM_HINT_ET0`); on the x86-64 baseline, which lacks `PREFETCHW`, LLVM emits
//! `prefetcht0`, a read prefetch, whose line arrives exclusive when no other core holds it
//! and is then written without another wait (`objdump` of the release build).
//!
//! The standard library has no safe prefetch: `_mm_prefetch` is safe to call only from a
//! function compiled for SSE, and calling such a function is `unsafe` even where SSE is the
//! target's baseline (all of x86-64). Elsewhere this is a no-op.
#![allow(unsafe_code)]

/// Cache lines on the CPUs tailguard runs on.
const LINE: usize = 64;

/// Asks for the cache lines of `bytes` in a state that can be written (x86-64), without
/// waiting for them.
pub(crate) fn for_writing(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(LINE) {
        // SAFETY: SSE is in the x86-64 baseline, so the instruction exists on every CPU this
        // code runs on; a prefetch reads and writes no memory and never faults, and the
        // pointer is into a live slice in any case.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_ET0 }>(
                line.as_ptr().cast(),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

//! Time sources of the lab: the monotonic clock every timestamp is taken on, and the
//! calling thread's CPU clock the upstream burns CPU against.

use rustix::time::{ClockId, Timespec, clock_gettime};

/// Nanoseconds on `CLOCK_MONOTONIC`, the clock `timerfd` deadlines are set on, so an intended
/// send time and the timer that fires for it are the same number.
pub fn now_ns() -> u64 {
    to_ns(clock_gettime(ClockId::Monotonic))
}

/// CPU time consumed by the calling thread, in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`).
///
/// The upstream's `--cpu-ms` burns against this clock rather than wall time, so a burn that is
/// preempted still costs the full amount of CPU, as go-zero's 3.6 ms handler did.
pub fn thread_cpu_ns() -> u64 {
    to_ns(clock_gettime(ClockId::ThreadCPUTime))
}

/// Converts a kernel timespec to nanoseconds (monotonic clocks never go negative).
pub(crate) fn to_ns(ts: Timespec) -> u64 {
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs * 1_000_000_000 + nanos
}

/// Converts nanoseconds to a kernel timespec.
pub(crate) fn from_ns(ns: u64) -> Timespec {
    Timespec {
        tv_sec: i64::try_from(ns / 1_000_000_000).unwrap_or(i64::MAX),
        tv_nsec: i64::try_from(ns % 1_000_000_000).unwrap_or(0),
    }
}

/// Burns CPU on the calling thread until it has consumed `ns` nanoseconds of its own CPU time.
pub fn burn_cpu(ns: u64) {
    let start = thread_cpu_ns();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while thread_cpu_ns().saturating_sub(start) < ns {
        // A little arithmetic between clock reads so the loop is mostly work, not syscalls.
        for _ in 0..64 {
            x = x.rotate_left(5) ^ x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        }
        std::hint::black_box(x);
    }
}

/// Parses a duration such as `30s`, `500ms`, `2m`, `1.5s`, `250us` or `0`.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let t = text.trim();
    if t == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("duration `{text}` needs a unit: us, ms, s, m or h (e.g. 30s)"))?;
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("duration `{text}`: `{num}` is not a number"))?;
    let secs = match unit {
        "us" => value / 1e6,
        "ms" => value / 1e3,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "duration `{text}`: unknown unit `{unit}` (use us, ms, s, m or h)"
            ));
        }
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("duration `{text}` is out of range"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

//! Events a client can cause by the thousand (requests refused over its limits, bodies that
//! never came, responses it never read, bodies it broke off, request heads refused) logged
//! once per [`INTERVAL`] per cause and serving thread, with how many there were; each one
//! still has its `debug` line and its metric. A flood of them costs a counter, not the log.
//!
//! Per thread (a `thread_local`), so counting writes no cache line another serving thread
//! writes and takes no lock.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// 10 s: a flood shows up within seconds, at six lines a minute per cause and thread.
pub(crate) const INTERVAL: Duration = Duration::from_secs(10);

/// What an aggregated line counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// Requests refused over `limits.client_requests`.
    ClientRequests = 0,
    /// Requests whose body did not start within `timeouts.body_ms`, or that were still
    /// sending it when a timeout ran out.
    DownstreamTimeout = 1,
    /// Requests whose client broke off its body.
    DownstreamBody = 2,
    /// HTTP/2 connections closed after `timeouts.send_ms` waiting on their client.
    SendTimeout = 3,
    /// HTTP/1.1 request heads refused (malformed, too large, too slow: `timeouts.header_ms`).
    RefusedHead = 4,
    /// Connections closed at the accept, their address held off after abuse.
    HeldOff = 5,
    /// HTTP/2 connections closed for abuse (`GOAWAY(ENHANCE_YOUR_CALM)`).
    Abuse = 6,
}

const CAUSES: usize = 7;

thread_local! {
    /// Per cause: events since the last line, and when the next line may be written.
    static SEEN: [Cell<(u64, Option<Instant>)>; CAUSES] =
        const { [const { Cell::new((0, None)) }; CAUSES] };
}

/// Counts one event of `cause` at `now`; `Some(n)` when a line is due: the `n` events (this
/// one included) since this thread's last line for the cause. The first event of a quiet
/// period gets its line at once.
pub(crate) fn note(cause: Cause, now: Instant) -> Option<u64> {
    SEEN.with(|seen| {
        let cell = &seen[cause as usize];
        let (count, next) = cell.get();
        let count = count + 1;
        match next {
            Some(at) if now < at => {
                cell.set((count, next));
                None
            }
            _ => {
                cell.set((0, Some(now + INTERVAL)));
                Some(count)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{Cause, INTERVAL, note};

    /// The first event is logged; the next within the interval only counted; the first
    /// after it is logged with all of them; each cause on its own.
    #[test]
    fn a_flood_is_one_line_per_interval_with_its_count() {
        let t = Instant::now();
        assert_eq!(note(Cause::SendTimeout, t), Some(1));
        for i in 1..1000 {
            assert_eq!(note(Cause::SendTimeout, t + Duration::from_millis(i)), None);
        }
        assert_eq!(note(Cause::ClientRequests, t), Some(1), "its own count");
        assert_eq!(note(Cause::SendTimeout, t + INTERVAL), Some(1000));
        assert_eq!(note(Cause::SendTimeout, t + INTERVAL), None);
    }
}

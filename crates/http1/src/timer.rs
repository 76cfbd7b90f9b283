//! Timers kept across waits, whose deadline moves lazily ([`LazyTimer`]), and the timeout of
//! each wait built on one ([`WaitTimeout`]): a downstream connection's idle timeout, its
//! requests' timeout, and an upstream body's read timeout use them instead of a timer per
//! request or per read.
//!
//! tokio takes its timer driver's lock to register, move or drop a timer. A timer per
//! request paid that two or three times per request. Here a wait only states its deadline;
//! the timer, still set for an earlier (sooner) deadline, fires early once, is moved then,
//! and so takes the lock about once per timeout period instead of once per request.
//!
//! Polling a tokio `Sleep` re-registers the waker every time: two compare-exchanges and a
//! waker clone and drop, four atomic read-modify-writes per wait. A timer here is polled
//! only when it may have fired, or when it is not yet armed for the waiting task.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use crate::last_waker::LastWaker;

/// One reusable timer (see the module doc).
#[derive(Debug)]
pub struct LazyTimer {
    sleep: Pin<Box<Sleep>>,
    /// The waker the pending timer was last polled with: while the timer has not fired and
    /// the waiting task's waker is this one, the timer will wake it without another poll.
    armed_for: LastWaker,
}

impl Default for LazyTimer {
    fn default() -> LazyTimer {
        LazyTimer::new()
    }
}

impl LazyTimer {
    /// A timer not yet set for any deadline.
    pub fn new() -> LazyTimer {
        LazyTimer {
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed_for: LastWaker::default(),
        }
    }

    /// Whether `deadline` has passed; if not, the task is woken when it does (or, once,
    /// earlier, when the timer still set for an earlier deadline fires and is moved).
    pub fn poll_expired(&mut self, cx: &mut Context<'_>, deadline: Instant) -> bool {
        // Set later than this deadline (a reload shortened the timeout): pulled in.
        if self.sleep.deadline() > deadline {
            self.sleep.as_mut().reset(deadline);
            self.armed_for.forget();
        }
        // Armed for this task and not fired: it wakes the task when it fires, and a timer
        // that has not fired has not reached its deadline, so neither this one.
        if !self.sleep.is_elapsed() && self.armed_for.is_current(cx) {
            return false;
        }
        while self.sleep.as_mut().poll(cx).is_ready() {
            if self.sleep.deadline() >= deadline {
                self.armed_for.forget();
                return true;
            }
            self.sleep.as_mut().reset(deadline);
        }
        // Pending, registered with this task's waker.
        self.armed_for.remember(cx);
        false
    }

    /// Runs `fut` until `deadline`; `None` if the deadline came first.
    ///
    /// `fut` is `Unpin`: a caller pins a large future in its own state (`pin!`) and passes
    /// the pinned reference, so the future is stored once. Taken by value and pinned here,
    /// it was stored twice in this function's state (argument and pinned local): ~740 bytes
    /// more for every request's exchange, copied when the request's future was boxed.
    pub async fn limit<F: Future + Unpin>(
        &mut self,
        deadline: Instant,
        mut fut: F,
    ) -> Option<F::Output> {
        poll_fn(|cx| {
            if let Poll::Ready(out) = Pin::new(&mut fut).poll(cx) {
                return Poll::Ready(Some(out));
            }
            if self.poll_expired(cx, deadline) {
                return Poll::Ready(None);
            }
            Poll::Pending
        })
        .await
    }
}

/// A limit on each wait (for a request head, for a write to be taken, for the next bytes of
/// a body), counted from when the wait first blocks: a wait that never blocks reads no clock
/// and makes no timer, and the timer is made by the first wait that does.
#[derive(Debug, Default)]
pub struct WaitTimeout {
    /// `None`: waits are not limited.
    limit: Option<Duration>,
    pub(crate) timer: Option<LazyTimer>,
    /// When the current wait ends, once it has blocked.
    deadline: Option<Instant>,
}

impl WaitTimeout {
    /// A limit of `limit` on each wait (`None`: none).
    pub fn new(limit: Option<Duration>) -> WaitTimeout {
        WaitTimeout {
            limit,
            ..WaitTimeout::default()
        }
    }

    /// Changes the limit for the waits to come.
    pub fn set_limit(&mut self, limit: Option<Duration>) {
        self.limit = limit;
    }

    /// A new wait begins (or the current one made progress): its clock starts again when it
    /// next blocks.
    pub fn restart(&mut self) {
        self.deadline = None;
    }

    /// Whether the current wait has lasted the limit. Call only when the wait is pending;
    /// the first call of a wait starts its clock.
    pub fn poll_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(limit) = self.limit else {
            return false;
        };
        let deadline = *self.deadline.get_or_insert_with(|| Instant::now() + limit);
        self.timer
            .get_or_insert_with(LazyTimer::new)
            .poll_expired(cx, deadline)
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;

    use super::*;

    #[tokio::test]
    async fn a_timer_polled_again_by_its_task_still_fires_at_its_deadline() {
        let mut timer = LazyTimer::new();
        let start = Instant::now();
        let deadline = start + Duration::from_millis(100);
        let mut polls = 0;
        poll_fn(|cx| {
            polls += 1;
            if timer.poll_expired(cx, deadline) {
                return Poll::Ready(());
            }
            // Woken early by something else (as a connection is by its socket): the armed
            // timer is not polled again, and must still wake the task at the deadline.
            if polls < 50 {
                cx.waker().wake_by_ref();
            }
            Poll::Pending
        })
        .await;
        assert!(start.elapsed() >= Duration::from_millis(100));
        assert!(polls > 50, "{polls} polls");
    }

    #[tokio::test]
    async fn a_later_deadline_is_honoured_after_an_earlier_one_set_the_timer() {
        let mut timer = LazyTimer::new();
        let start = Instant::now();
        // The first wait sets the timer for 50 ms and ends at once.
        assert_eq!(
            timer
                .limit(start + Duration::from_millis(50), pin!(async { 1 }))
                .await,
            Some(1)
        );
        // The second has until 300 ms: the timer fires at 50 ms, is moved, and the future
        // that finishes at 150 ms still wins.
        let late = timer
            .limit(
                start + Duration::from_millis(300),
                pin!(tokio::time::sleep(Duration::from_millis(150))),
            )
            .await;
        assert_eq!(late, Some(()));
        // And a deadline does end a future that outlives it.
        let cut = timer
            .limit(
                Instant::now() + Duration::from_millis(50),
                pin!(tokio::time::sleep(Duration::from_secs(30))),
            )
            .await;
        assert_eq!(cut, None);
    }
}

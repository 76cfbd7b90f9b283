//! A timer kept for a connection's life, whose deadline moves lazily: the connection's idle
//! timeout and its requests' timeout each use one instead of a timer per request.
//!
//! tokio takes its timer driver's lock to register, move or drop a timer. A timer per
//! request paid that two or three times per request. Here a wait only states its deadline;
//! the timer, still set for an earlier (sooner) deadline, fires early once, is moved then,
//! and so takes the lock about once per timeout period instead of once per request.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// One reusable timer (see the module doc).
#[derive(Debug)]
pub(crate) struct LazyTimer {
    sleep: Pin<Box<Sleep>>,
}

impl LazyTimer {
    pub(crate) fn new() -> LazyTimer {
        LazyTimer {
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
        }
    }

    /// Whether `deadline` has passed; if not, the task is woken when it does (or, once,
    /// earlier, when the timer still set for an earlier deadline fires and is moved).
    pub(crate) fn poll_expired(&mut self, cx: &mut Context<'_>, deadline: Instant) -> bool {
        // Set later than this deadline (a reload shortened the timeout): pulled in.
        if self.sleep.deadline() > deadline {
            self.sleep.as_mut().reset(deadline);
        }
        while self.sleep.as_mut().poll(cx).is_ready() {
            if self.sleep.deadline() >= deadline {
                return true;
            }
            self.sleep.as_mut().reset(deadline);
        }
        false
    }

    /// Runs `fut` until `deadline`; `None` if the deadline came first.
    pub(crate) async fn limit<F: Future>(
        &mut self,
        deadline: Instant,
        fut: F,
    ) -> Option<F::Output> {
        let mut fut = pin!(fut);
        poll_fn(|cx| {
            if let Poll::Ready(out) = fut.as_mut().poll(cx) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_later_deadline_is_honoured_after_an_earlier_one_set_the_timer() {
        let mut timer = LazyTimer::new();
        let start = Instant::now();
        // The first wait sets the timer for 50 ms and ends at once.
        assert_eq!(
            timer
                .limit(start + Duration::from_millis(50), async { 1 })
                .await,
            Some(1)
        );
        // The second has until 300 ms: the timer fires at 50 ms, is moved, and the future
        // that finishes at 150 ms still wins.
        let late = timer
            .limit(
                start + Duration::from_millis(300),
                tokio::time::sleep(Duration::from_millis(150)),
            )
            .await;
        assert_eq!(late, Some(()));
        // And a deadline does end a future that outlives it.
        let cut = timer
            .limit(
                Instant::now() + Duration::from_millis(50),
                tokio::time::sleep(Duration::from_secs(30)),
            )
            .await;
        assert_eq!(cut, None);
    }
}

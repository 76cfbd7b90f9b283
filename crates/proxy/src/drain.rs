//! Graceful drain of one accept loop's connections: tells every open connection to finish,
//! and waits until the last one has.
//!
//! A connection checks for the drain each time it waits for a request head, once per
//! request, so that check must cost next to nothing: a flag read, and an `AtomicWaker`
//! registration only when the waiting task's waker is not the one registered already (so
//! once per connection: no lock, no allocation, and no atomic read-modify-write per wait). tokio's `watch`/`Notify` took a lock to join and leave a waiter list
//! on every wait (~1.5 % of the gateway's CPU per request in a profile). The lock here is
//! taken once per connection to join the list, tried once as it leaves (to sweep the
//! list's dead slots, when they are half of it), and once per drain.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use tokio::sync::Notify;

use tailguard_http1::LastWaker;

/// The accept loop's side: starts the drain and waits for it to finish. A clone gives
/// watches too (the parker's, for the connections it hands back).
#[derive(Debug, Default, Clone)]
pub(crate) struct Drain {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    draining: AtomicBool,
    /// Connections not yet ended.
    open: AtomicUsize,
    /// Each connection's waker slot; dead entries are swept as new ones join.
    slots: Mutex<Vec<Weak<AtomicWaker>>>,
    /// Woken when the last connection ends during a drain.
    ended: Notify,
}

/// A connection's side: whether the server drains, and (dropped) that the connection ended.
#[derive(Debug)]
pub(crate) struct Watch {
    shared: Arc<Shared>,
    waker: Arc<AtomicWaker>,
    /// The waker last registered in `waker`: it stays there until the drain wakes it.
    registered: LastWaker,
}

impl Drain {
    /// A connection joins: it is waited for by [`Drain::finish`].
    pub(crate) fn watch(&self) -> Watch {
        let waker = Arc::new(AtomicWaker::new());
        self.shared.open.fetch_add(1, Ordering::AcqRel);
        {
            let mut slots = self
                .shared
                .slots
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            sweep(&mut slots, self.shared.open.load(Ordering::Acquire));
            slots.push(Arc::downgrade(&waker));
        }
        Watch {
            shared: Arc::clone(&self.shared),
            waker,
            registered: LastWaker::default(),
        }
    }

    /// Tells every connection to finish (idle ones close at once, busy ones after their
    /// response), then waits until all have ended.
    pub(crate) async fn finish(self) {
        self.shared.draining.store(true, Ordering::Release);
        let slots = std::mem::take(
            &mut *self
                .shared
                .slots
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for waker in slots.iter().filter_map(Weak::upgrade) {
            waker.wake();
        }
        loop {
            let ended = self.shared.ended.notified();
            if self.shared.open.load(Ordering::Acquire) == 0 {
                return;
            }
            ended.await;
        }
    }
}

impl Watch {
    /// Whether the server drains; if not yet, the task is woken when it starts.
    pub(crate) fn poll_draining(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.is_draining() {
            return Poll::Ready(());
        }
        // Only a drain takes the registered waker out, and it sets the flag first: while
        // the flag is clear, a waker registered before is still there.
        if self.registered.is_current(cx) {
            return Poll::Pending;
        }
        self.waker.register(cx.waker());
        self.registered.remember(cx);
        // Checked again: a drain that started between the check and the registration has
        // already woken the slots it found.
        if self.is_draining() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Whether the server drains (no registration).
    pub(crate) fn is_draining(&self) -> bool {
        self.shared.draining.load(Ordering::Acquire)
    }
}

impl tailguard_http1::server::Shutdown for Watch {
    fn poll_draining(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        Watch::poll_draining(self, cx)
    }

    fn is_draining(&self) -> bool {
        Watch::is_draining(self)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let open = self.shared.open.fetch_sub(1, Ordering::AcqRel) - 1;
        if open == 0 {
            self.shared.ended.notify_waiters();
        }
        // A connection that parks or closes leaves a dead slot, whose waker's memory its
        // `Weak` keeps. Swept here too, not only when another joins: connections parked
        // after a burst, with nothing accepted since, each kept 56 bytes. Never waits: a
        // busy list is swept by a later drop or join.
        if let Ok(mut slots) = self.shared.slots.try_lock() {
            sweep(&mut slots, open);
        }
    }
}

/// Drops the slots of ended connections once the list has grown to twice what is `open`,
/// so that it stays O(open).
fn sweep(slots: &mut Vec<Weak<AtomicWaker>>, open: usize) {
    if slots.len() >= 2 * open.max(16) {
        slots.retain(|w| w.strong_count() > 0);
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_connection_polled_again_between_drains_checks_is_still_woken() {
        let drain = Drain::default();
        let mut watch = drain.watch();
        let waiting = tokio::spawn(async move {
            let mut polls = 0;
            poll_fn(|cx| {
                polls += 1;
                if watch.poll_draining(cx).is_ready() {
                    return Poll::Ready(polls);
                }
                // Woken by something else, as a connection is by its socket: polled again
                // with the same waker, which is then not registered again.
                if polls < 5 {
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            })
            .await
        });
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished());
        let finishing = tokio::spawn(drain.finish());
        let polls = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the drain wakes the connection")
            .expect("no panic");
        assert_eq!(
            polls, 6,
            "five waits without a drain, then the one that sees it"
        );
        tokio::time::timeout(Duration::from_secs(10), finishing)
            .await
            .expect("the drain ends with the connection")
            .expect("no panic");
    }

    #[test]
    fn the_slots_of_ended_connections_are_swept_as_they_end() {
        let drain = Drain::default();
        let watches: Vec<Watch> = (0..1000).map(|_| drain.watch()).collect();
        let slots = || drain.shared.slots.lock().expect("not poisoned").len();
        assert_eq!(slots(), 1000);
        // All end, and none joins after them (connections parked after a burst).
        drop(watches);
        assert!(slots() <= 32, "{} slots of ended connections kept", slots());
        let survivor = drain.watch();
        assert!(!survivor.is_draining());
        assert_eq!(drain.shared.open.load(Ordering::Acquire), 1);
    }

    #[tokio::test]
    async fn a_drain_wakes_waiting_connections_and_waits_for_all_of_them() {
        let drain = Drain::default();
        let mut idle = drain.watch();
        let busy = drain.watch();
        let waiting = tokio::spawn(async move {
            poll_fn(|cx| idle.poll_draining(cx)).await;
            // `idle` is dropped here: the connection ended.
        });
        tokio::task::yield_now().await;
        assert!(!busy.is_draining());
        let finishing = tokio::spawn(drain.finish());
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the waiting connection is woken")
            .expect("no panic");
        assert!(busy.is_draining());
        tokio::task::yield_now().await;
        assert!(!finishing.is_finished(), "one connection is still open");
        drop(busy);
        tokio::time::timeout(Duration::from_secs(10), finishing)
            .await
            .expect("the drain ends with the last connection")
            .expect("no panic");
    }

    #[tokio::test]
    async fn a_drain_with_no_connections_ends_at_once() {
        let drain = Drain::default();
        drop(drain.watch());
        tokio::time::timeout(Duration::from_secs(10), drain.finish())
            .await
            .expect("nothing to wait for");
    }
}

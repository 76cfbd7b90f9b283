//! The waker a registration was last made with, so that a wait polled again by the same
//! task skips registering again (each registration with tokio or `AtomicWaker` costs atomic
//! read-modify-writes; a connection's task polls the same waits once per request).

use std::task::{Context, Waker};

/// The last waker a wait registered, if it is still registered.
#[derive(Debug, Default)]
pub struct LastWaker(Option<Waker>);

impl LastWaker {
    /// Whether `cx`'s waker wakes the same task as the one registered.
    pub fn is_current(&self, cx: &Context<'_>) -> bool {
        self.0
            .as_ref()
            .is_some_and(|registered| registered.will_wake(cx.waker()))
    }

    /// Notes that `cx`'s waker is now registered (cloned only when it changed).
    pub fn remember(&mut self, cx: &Context<'_>) {
        if !self.is_current(cx) {
            self.0 = Some(cx.waker().clone());
        }
    }

    /// Notes that no waker is registered any more.
    pub fn forget(&mut self) {
        self.0 = None;
    }
}

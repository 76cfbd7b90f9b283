//! tailguard: counts the codec buffers live connections hold, for tests that
//! prove an idle connection holds none (feature `tailguard-held-buffers`).
//! Without the feature, `Held` is empty and its methods do nothing.

#[cfg(feature = "tailguard-held-buffers")]
use std::sync::atomic::{AtomicUsize, Ordering};

#[cfg(feature = "tailguard-held-buffers")]
static HELD: AtomicUsize = AtomicUsize::new(0);

/// The number of read and write buffers that codecs in this process hold now:
/// two for a connection that is reading and writing, none for an idle one.
#[cfg(feature = "tailguard-held-buffers")]
pub fn held_buffers() -> usize {
    HELD.load(Ordering::SeqCst)
}

/// Whether one buffer (a codec's read or write buffer) is held, counted in
/// `held_buffers` while it is.
#[derive(Debug, Default)]
pub(crate) struct Held {
    #[cfg(feature = "tailguard-held-buffers")]
    held: bool,
}

impl Held {
    /// The buffer was (re-)taken.
    #[inline]
    pub(crate) fn take(&mut self) {
        #[cfg(feature = "tailguard-held-buffers")]
        if !self.held {
            self.held = true;
            HELD.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The buffer was released.
    #[inline]
    pub(crate) fn release(&mut self) {
        #[cfg(feature = "tailguard-held-buffers")]
        if self.held {
            self.held = false;
            HELD.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

#[cfg(feature = "tailguard-held-buffers")]
impl Drop for Held {
    fn drop(&mut self) {
        self.release();
    }
}

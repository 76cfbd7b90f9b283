//! A value alone on its cache line, so the request path's atomics and the ones a background
//! tick writes never share one.

use std::ops::Deref;

/// Keeps a hot value on its own cache line (128 B: adjacent-line prefetch pairs lines).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

impl<T> Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

//! Nanosecond timers on tokio's reactor: a `timerfd` registered with the runtime, which the
//! generator's dispatcher and the scraper sleep on (tokio's own timer rounds to milliseconds).

use tokio::io::unix::AsyncFd;

/// Registers a timerfd with the runtime's reactor.
///
/// `AsyncFd::new` is deprecated because a borrowed fd could be closed while registered; here
/// the `AsyncFd` owns the `OwnedFd`, so the fd lives exactly as long as the registration. The
/// replacement, `AsyncFd::register`, is `unsafe`, which this workspace forbids.
#[allow(deprecated)]
pub(crate) fn register_timer(
    fd: std::os::fd::OwnedFd,
) -> std::io::Result<AsyncFd<std::os::fd::OwnedFd>> {
    AsyncFd::new(fd)
}

//! The lab's own upstream, on its own runtime thread so the generator's blocking `run` can
//! drive it.

use tailguard_test_support::blocking::{Server, start};

/// The lab's own upstream.
pub(crate) fn upstream(config: tailguard_lab::upstream::UpstreamConfig) -> Server {
    start(move |l| async move {
        let _ = tailguard_lab::upstream::serve(l, config).await;
    })
}

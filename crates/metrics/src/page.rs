//! Pages the exporter serves beside the exposition (a status page, its JSON): answered on
//! the exporter's own thread, never a serving thread, with periodic work of their own there.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

/// A page served by the [`Exporter`](crate::Exporter) on its thread.
///
/// The exporter asks each page in turn, before its own path; the first that answers wins.
/// `respond` runs on the exporter's current-thread runtime, so it must not block for long:
/// a slow page delays every scrape behind it.
pub trait Page: Send + Sync + fmt::Debug + 'static {
    /// The answer to `request` if this page serves its path, else `None`.
    fn respond(&self, request: &http::request::Parts) -> Option<http::Response<Bytes>>;

    /// How often the exporter thread calls [`Page::tick`] (`None`, the default: never).
    fn tick_every(&self) -> Option<Duration> {
        None
    }

    /// Periodic work on the exporter thread, every [`Page::tick_every`] (the first one at
    /// once): e.g. keeping a history of the registry's values.
    fn tick(&self) {}
}

/// The pages an exporter serves (see [`Page`]).
#[derive(Clone, Default)]
pub struct Pages(pub Vec<Arc<dyn Page>>);

impl fmt::Debug for Pages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

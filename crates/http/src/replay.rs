//! A request body kept while a try that may be retried is in flight, so that the next try
//! can send it again (a route's `retry.buffer_bytes`), within a byte budget per serving
//! thread.
//!
//! The body still streams: the first try gets each frame as it arrives from the client (a
//! copy is kept beside it), so keeping adds no wait, whatever the body's size. A later try
//! sends the kept bytes first, then goes on reading the client where the earlier try
//! stopped (an upstream may answer `503` before it read the whole body, `Expect:
//! 100-continue` or not). A body that grows past its bound, or past what the thread's budget
//! has room for, stops being kept: what was kept is released and the rest streams on, but
//! the request can no longer be sent again ([`Kept::unkept`] says why).
//!
//! Memory: the bytes kept are copies in buffers the kept body owns (a frame read from a
//! connection shares that connection's read buffer, which keeping it would pin), each
//! buffer charged with its whole capacity to the budget of the serving thread that read
//! it, before it is allocated: all the bodies one serving thread keeps hold at most its
//! [`Budget`] ([`THREAD_BUDGET_BYTES`]); a body that does not fit is not kept. One body's
//! buffers hold at most its bound (`buffer_bytes`), or up to twice that when a try was
//! retried before the whole body had arrived (the kept part's buffer is handed to the
//! next try as it is, unused room included). What was kept is released as soon as no
//! further try can happen ([`Kept::stop`], also when the [`Kept`] handle drops): the last
//! try's frames go out as they are taken, with nothing kept behind.
//!
//! This module names nothing else of the crate: the retry loop (`retry.rs`) holds the
//! [`Kept`] handle, the body (`body.rs`) the [`Reader`] each try sends.

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

/// Bytes of request bodies one serving thread may keep for retries at once: 8 MiB is 128
/// bodies at the default `buffer_bytes` (64 KiB) in flight on one thread at the same time,
/// far more than a thread has waiting on upstreams at a few milliseconds each (10k
/// requests a second for 10 ms is 100), and 8 times the largest `buffer_bytes`.
pub const THREAD_BUDGET_BYTES: usize = 8 * 1024 * 1024;

pub use tailguard_config::retry::MAX_BUFFER_BYTES;

/// A chunked body's first buffer: most bodies of unknown length are small.
const FIRST_BUFFER_BYTES: usize = 4 * 1024;

/// Why a request's body cannot be sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unkept {
    /// It is larger than `buffer_bytes` (as declared, or as it grew while being read).
    TooLarge,
    /// The serving thread's budget had no room for it.
    Budget,
    /// It failed while being read (the client broke off, or it went over the size limit):
    /// there is nothing whole to send again.
    Failed,
}

/// Bytes of kept bodies one serving thread holds, against its limit. Only the thread it
/// belongs to charges it; a release may come from wherever a body is dropped (in practice
/// the same thread): hence an atomic, on a line no other thread writes.
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    used: AtomicUsize,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// Bytes charged now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Charges `n` bytes if there is room.
    fn take(&self, n: usize) -> bool {
        let before = self.used.fetch_add(n, Ordering::Relaxed);
        if before.saturating_add(n) > self.limit {
            self.used.fetch_sub(n, Ordering::Relaxed);
            return false;
        }
        true
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

thread_local! {
    static THREAD_BUDGET: Arc<Budget> = Budget::new(THREAD_BUDGET_BYTES);
}

/// The calling serving thread's budget.
pub fn thread_budget() -> Arc<Budget> {
    THREAD_BUDGET.with(Arc::clone)
}

/// What a [`Reader`] fails with: its source's error, or [`ReplayError::Superseded`].
#[derive(Debug)]
pub enum ReplayError<E> {
    /// The client's body failed.
    Source(E),
    /// A later try took the body: this reader's try was abandoned.
    Superseded,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keeping {
    /// Frames read are kept for a later try.
    Yes,
    /// No try after the current one: nothing more is kept, and what was is released as it
    /// goes out.
    Stopped,
    /// Could not be kept (and nothing is).
    No(Unkept),
}

struct Shared<B> {
    /// The body as the client sends it (its size limit and byte count on it).
    source: B,
    /// `source` returned its end.
    source_ended: bool,
    /// Kept bytes a later try sends first, in order, each with the bytes it charged.
    frozen: Vec<(Bytes, usize)>,
    /// Bytes kept since the current try started (that try sent them as they came).
    open: Vec<u8>,
    /// What `open` charged (its capacity).
    open_charge: usize,
    /// The trailers of a chunked body, once read.
    trailers: Option<HeaderMap>,
    /// Bytes in `frozen` and `open`.
    kept: usize,
    keeping: Keeping,
    /// The current try's; a reader of an older one is superseded.
    generation: u32,
    /// `frozen` entries the current try's reader has sent.
    replayed: usize,
    /// The current try's reader has sent the trailers (or there are none).
    trailers_sent: bool,
    bound: usize,
    budget: Arc<Budget>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while the lock was held leaves nothing half-written that matters more than
    // the request it belongs to: go on.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<B> Shared<B> {
    /// Copies `data` into the kept bytes, or says why it cannot be.
    fn keep(&mut self, data: &[u8]) -> Result<(), Unkept> {
        let kept = self.kept + data.len();
        if kept > self.bound {
            return Err(Unkept::TooLarge);
        }
        let need = self.open.len() + data.len();
        if need > self.open.capacity() {
            // Doubling, from a small first buffer, but never past the bound: the capacity
            // charged is the memory held.
            let room = self.bound - (self.kept - self.open.len());
            let capacity = need
                .max(self.open.capacity() * 2)
                .max(FIRST_BUFFER_BYTES)
                .min(room);
            let extra = capacity - self.open.capacity();
            if !self.budget.take(extra) {
                return Err(Unkept::Budget);
            }
            self.open.reserve_exact(capacity - self.open.len());
            self.open_charge += extra;
        }
        self.open.extend_from_slice(data);
        self.kept = kept;
        Ok(())
    }

    /// Keeps nothing more; releases what no reader will send again: everything but the
    /// frozen bytes the current try has yet to send (those are released as they go out).
    fn stop_keeping(&mut self, now: Keeping) {
        if self.keeping != Keeping::Yes {
            return;
        }
        self.keeping = now;
        self.budget.give(std::mem::take(&mut self.open_charge));
        self.open = Vec::new();
        for (bytes, charge) in &mut self.frozen[..self.replayed] {
            *bytes = Bytes::new();
            self.budget.give(std::mem::take(charge));
        }
    }
}

impl<B> Drop for Shared<B> {
    fn drop(&mut self) {
        let frozen: usize = self.frozen.iter().map(|(_, c)| c).sum();
        self.budget.give(self.open_charge + frozen);
    }
}

/// The retry loop's handle on a kept body: makes each try's [`Reader`], says whether the
/// body can still be sent again. Dropped, it stops keeping ([`Kept::stop`]).
pub struct Kept<B> {
    shared: Arc<Mutex<Shared<B>>>,
}

impl<B: Body<Data = Bytes> + Unpin> Kept<B> {
    /// Keeps `source` (a body of at most `bound` bytes) for later tries, charging `budget`;
    /// returns the handle and the first try's reader. A body declared larger than `bound`,
    /// or one the budget has no room for, comes back with why.
    #[allow(clippy::type_complexity)]
    pub fn new(
        source: B,
        bound: usize,
        budget: Arc<Budget>,
    ) -> Result<(Kept<B>, Reader<B>), (B, Unkept)> {
        let (open, open_charge) = match source.size_hint().exact() {
            // The length is known: one buffer of exactly that size, charged now.
            Some(n) => {
                let Some(n) = usize::try_from(n).ok().filter(|&n| n <= bound) else {
                    return Err((source, Unkept::TooLarge));
                };
                if !budget.take(n) {
                    return Err((source, Unkept::Budget));
                }
                (Vec::with_capacity(n), n)
            }
            // Chunked: grown as it arrives (see `Shared::keep`).
            None => (Vec::new(), 0),
        };
        let shared = Arc::new(Mutex::new(Shared {
            source,
            source_ended: false,
            frozen: Vec::new(),
            open,
            open_charge,
            trailers: None,
            kept: 0,
            keeping: Keeping::Yes,
            generation: 0,
            replayed: 0,
            trailers_sent: false,
            bound,
            budget,
        }));
        let reader = Reader {
            shared: Arc::clone(&shared),
            generation: 0,
        };
        Ok((Kept { shared }, reader))
    }
}

impl<B> Kept<B> {
    /// Why the body can no longer be sent again, if it cannot.
    pub fn unkept(&self) -> Option<Unkept> {
        match lock(&self.shared).keeping {
            Keeping::No(why) => Some(why),
            Keeping::Yes | Keeping::Stopped => None,
        }
    }

    /// The next try's reader: it sends the kept bytes, then reads on from the client. The
    /// earlier tries' readers fail from now on ([`ReplayError::Superseded`]), so an
    /// abandoned try can take nothing more from the client.
    pub fn next_try(&self) -> Reader<B> {
        let mut s = lock(&self.shared);
        debug_assert_eq!(s.keeping, Keeping::Yes, "only a kept body is sent again");
        s.generation = s.generation.wrapping_add(1);
        if !s.open.is_empty() {
            let open = std::mem::take(&mut s.open);
            let charge = std::mem::take(&mut s.open_charge);
            s.frozen.push((Bytes::from(open), charge));
        }
        s.replayed = 0;
        s.trailers_sent = false;
        Reader {
            shared: Arc::clone(&self.shared),
            generation: s.generation,
        }
    }

    /// No try will follow the current one: keep nothing more, and release what was kept
    /// as the current try sends it.
    pub fn stop(&self) {
        lock(&self.shared).stop_keeping(Keeping::Stopped);
    }
}

impl<B> Drop for Kept<B> {
    fn drop(&mut self) {
        self.stop();
    }
}

impl<B> fmt::Debug for Kept<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kept").finish_non_exhaustive()
    }
}

/// One try's request body: the kept bytes first, then the client's as they come (kept
/// too, while the body is being kept).
pub struct Reader<B> {
    shared: Arc<Mutex<Shared<B>>>,
    generation: u32,
}

impl<B> fmt::Debug for Reader<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reader")
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Reader<B> {
    type Data = Bytes;
    type Error = ReplayError<B::Error>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut guard = lock(&self.shared);
        let s = &mut *guard;
        if s.generation != self.generation {
            return Poll::Ready(Some(Err(ReplayError::Superseded)));
        }
        if let Some((bytes, charge)) = s.frozen.get_mut(s.replayed) {
            s.replayed += 1;
            let data = if s.keeping == Keeping::Yes {
                bytes.clone()
            } else {
                // Not sent again after this: it leaves with this try.
                s.budget.give(std::mem::take(charge));
                std::mem::take(bytes)
            };
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if s.source_ended {
            // An earlier try read the body to its end: its trailers, then the end.
            if !std::mem::replace(&mut s.trailers_sent, true)
                && let Some(trailers) = &s.trailers
            {
                return Poll::Ready(Some(Ok(Frame::trailers(trailers.clone()))));
            }
            return Poll::Ready(None);
        }
        match ready!(Pin::new(&mut s.source).poll_frame(cx)) {
            Some(Ok(frame)) => {
                if s.keeping == Keeping::Yes {
                    let kept = match (frame.data_ref(), frame.trailers_ref()) {
                        (Some(data), _) => s.keep(data),
                        (None, Some(trailers)) => {
                            s.trailers = Some(trailers.clone());
                            Ok(())
                        }
                        (None, None) => Ok(()),
                    };
                    if let Err(why) = kept {
                        s.stop_keeping(Keeping::No(why));
                    }
                }
                if frame.is_trailers() {
                    s.trailers_sent = true;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => {
                s.stop_keeping(Keeping::No(Unkept::Failed));
                Poll::Ready(Some(Err(ReplayError::Source(e))))
            }
            None => {
                s.source_ended = true;
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        let s = lock(&self.shared);
        if s.generation != self.generation {
            // Polled, it fails: never claim a clean end for an abandoned try.
            return false;
        }
        s.replayed == s.frozen.len()
            && if s.source_ended {
                s.trailers_sent || s.trailers.is_none()
            } else {
                s.source.is_end_stream()
            }
    }

    fn size_hint(&self) -> SizeHint {
        let s = lock(&self.shared);
        if s.generation != self.generation {
            return SizeHint::default();
        }
        let kept: u64 = s.frozen[s.replayed..]
            .iter()
            .map(|(b, _)| b.len() as u64)
            .sum();
        if s.source_ended {
            return SizeHint::with_exact(kept);
        }
        let rest = s.source.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(kept + rest.lower());
        if let Some(upper) = rest.upper() {
            hint.set_upper(kept + upper);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use http_body_util::BodyExt as _;

    use super::*;

    /// A client body: the frames given, then its end; `exact` announces its length.
    #[derive(Debug)]
    struct Client {
        frames: VecDeque<Frame<Bytes>>,
        left: Option<u64>,
        fail_at_end: bool,
    }

    impl Client {
        fn new(chunks: &[&str], exact: bool) -> Client {
            let total = chunks.iter().map(|c| c.len() as u64).sum();
            Client {
                frames: chunks
                    .iter()
                    .map(|c| Frame::data(Bytes::copy_from_slice(c.as_bytes())))
                    .collect(),
                left: exact.then_some(total),
                fail_at_end: false,
            }
        }
    }

    impl Body for Client {
        type Data = Bytes;
        type Error = &'static str;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, &'static str>>> {
            match self.frames.pop_front() {
                Some(f) => {
                    if let (Some(left), Some(d)) = (&mut self.left, f.data_ref()) {
                        *left -= d.len() as u64;
                    }
                    Poll::Ready(Some(Ok(f)))
                }
                None if self.fail_at_end => Poll::Ready(Some(Err("client went away"))),
                None => Poll::Ready(None),
            }
        }

        fn is_end_stream(&self) -> bool {
            self.frames.is_empty() && !self.fail_at_end
        }

        fn size_hint(&self) -> SizeHint {
            self.left
                .map_or_else(SizeHint::default, SizeHint::with_exact)
        }
    }

    /// The next frame's data (`None` at the end), without a waker: every body here is ready.
    fn next(r: &mut Reader<Client>) -> Option<Result<Bytes, String>> {
        let frame = r.frame().now_or_never_ready()?;
        Some(match frame {
            Ok(f) => Ok(f.into_data().unwrap_or_default()),
            Err(ReplayError::Source(e)) => Err(e.to_owned()),
            Err(ReplayError::Superseded) => Err("superseded".to_owned()),
        })
    }

    trait NowOrNever: std::future::Future + Sized {
        fn now_or_never_ready(self) -> Self::Output {
            let waker = std::task::Waker::noop();
            let mut cx = Context::from_waker(waker);
            match std::pin::pin!(self).poll(&mut cx) {
                Poll::Ready(v) => v,
                Poll::Pending => panic!("every test body is ready"),
            }
        }
    }
    impl<F: std::future::Future> NowOrNever for F {}

    fn all(r: &mut Reader<Client>) -> String {
        let mut out = String::new();
        while let Some(d) = next(r) {
            out.push_str(std::str::from_utf8(&d.expect("data")).expect("utf-8"));
        }
        out
    }

    #[test]
    fn a_later_try_sends_what_was_read_then_reads_on() {
        let budget = Budget::new(1 << 20);
        let (kept, mut first) =
            Kept::new(Client::new(&["ab", "cd", "ef"], true), 64, budget.clone()).expect("kept");
        assert_eq!(first.size_hint().exact(), Some(6));
        assert_eq!(budget.used(), 6, "a known length is charged at once");
        // The first try read part of it before its answer came.
        assert_eq!(next(&mut first), Some(Ok(Bytes::from("ab"))));
        let mut second = kept.next_try();
        assert_eq!(
            second.size_hint().exact(),
            Some(6),
            "kept + what is still to come"
        );
        assert_eq!(
            next(&mut first),
            Some(Err("superseded".to_owned())),
            "the abandoned try takes nothing more"
        );
        assert!(!first.is_end_stream());
        assert_eq!(all(&mut second), "abcdef");
        assert!(second.is_end_stream());
        // And once more, after the whole body was read.
        let mut third = kept.next_try();
        assert_eq!(third.size_hint().exact(), Some(6));
        assert_eq!(all(&mut third), "abcdef");
        assert_eq!(kept.unkept(), None);
        drop((first, second, third, kept));
        assert_eq!(budget.used(), 0, "everything released");
    }

    #[test]
    fn the_last_try_releases_the_kept_bytes_as_it_sends_them() {
        let budget = Budget::new(1 << 20);
        let (kept, mut first) =
            Kept::new(Client::new(&["abc", "def"], false), 64, budget.clone()).expect("kept");
        assert_eq!(all(&mut first), "abcdef");
        assert_eq!(budget.used(), FIRST_BUFFER_BYTES.min(64));
        let mut last = kept.next_try();
        kept.stop();
        assert_eq!(budget.used(), 64, "still to be sent");
        assert_eq!(all(&mut last), "abcdef");
        assert_eq!(
            budget.used(),
            0,
            "sent: released, while the reader lives on"
        );
        assert!(last.is_end_stream());
    }

    #[test]
    fn a_chunked_body_past_its_bound_streams_on_but_is_not_kept() {
        let budget = Budget::new(1 << 20);
        let (kept, mut first) = Kept::new(
            Client::new(&["0123", "4567", "89"], false),
            8,
            budget.clone(),
        )
        .expect("kept: its length is not known yet");
        assert_eq!(
            all(&mut first),
            "0123456789",
            "every byte went to the first try"
        );
        assert_eq!(kept.unkept(), Some(Unkept::TooLarge));
        assert_eq!(budget.used(), 0);
        // Declared too large: not kept at all, and the body comes back.
        let (body, why) = Kept::new(Client::new(&["0123456789"], true), 8, budget.clone())
            .expect_err("over the bound");
        assert_eq!((why, body.frames.len()), (Unkept::TooLarge, 1));
    }

    #[test]
    fn the_thread_budget_bounds_what_is_kept() {
        let budget = Budget::new(10);
        let (a, _ra) =
            Kept::new(Client::new(&["12345678"], true), 64, budget.clone()).expect("room for 8");
        let (_, why) = Kept::new(Client::new(&["12345"], true), 64, budget.clone())
            .expect_err("no room for 5 more");
        assert_eq!(why, Unkept::Budget);
        // A chunked body grows in buffers the budget pays for: the first one does not fit.
        let (b, mut rb) =
            Kept::new(Client::new(&["12"], false), 64, budget.clone()).expect("nothing yet");
        assert_eq!(all(&mut rb), "12", "it streamed all the same");
        assert_eq!(b.unkept(), Some(Unkept::Budget));
        drop((a, _ra));
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_body_that_failed_is_not_sent_again() {
        let budget = Budget::new(1 << 20);
        let mut client = Client::new(&["ab"], false);
        client.fail_at_end = true;
        let (kept, mut first) = Kept::new(client, 64, budget.clone()).expect("kept");
        assert_eq!(next(&mut first), Some(Ok(Bytes::from("ab"))));
        assert_eq!(next(&mut first), Some(Err("client went away".to_owned())));
        assert_eq!(kept.unkept(), Some(Unkept::Failed));
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn trailers_are_kept_and_sent_again() {
        let budget = Budget::new(1 << 20);
        let mut client = Client::new(&["ab"], false);
        let mut trailers = HeaderMap::new();
        trailers.insert("x-sum", http::HeaderValue::from_static("1"));
        client.frames.push_back(Frame::trailers(trailers));
        let (kept, mut first) = Kept::new(client, 64, budget).expect("kept");
        let mut frames = 0;
        while let Some(Ok(_)) = first.frame().now_or_never_ready() {
            frames += 1;
        }
        assert_eq!(frames, 2);
        let mut again = kept.next_try();
        let data = again.frame().now_or_never_ready().expect("data").ok();
        assert_eq!(
            data.and_then(|f| f.into_data().ok()),
            Some(Bytes::from("ab"))
        );
        let t = again.frame().now_or_never_ready().expect("trailers").ok();
        assert_eq!(
            t.and_then(|f| f.into_trailers().ok())
                .and_then(|t| t.get("x-sum").cloned()),
            Some(http::HeaderValue::from_static("1"))
        );
        assert!(again.frame().now_or_never_ready().is_none());
    }
}

//! Idle keep-alive connections parked: each waits for its next request as its socket and
//! one small entry here, with no task, timer, buffer or per-connection state of its own.
//!
//! A connection served on its task holds ~2 KB while it waits for its next request (the
//! task and its future, the connection's state, its timers, its forwarding fields); nginx
//! holds ~0.5 KB for an idle connection. Parked, a connection holds its socket (tokio's
//! registration, 256 bytes), its entry (the stream and what the caller needs to serve it
//! again) and a waker naming the entry. A connection under load never parks: it must be
//! idle for `timeouts.park_ms` first, so rebuilding its state (a spawn, its `ConnCtx`, its
//! timers: ~10,000 instructions in callgrind) is paid at most once per such pause.
//!
//! Written here, not with `FuturesUnordered`: that allocates a node (its future, five
//! pointers, an `Arc`) per connection and cannot drop one by key, which the idle timeout
//! needs. Here the timeout is one heap of deadlines and one timer for all the parked
//! connections of an accept loop, where each connection's task had a timer of its own.
//!
//! One parker per accept loop, on its serving thread: the connections' tasks park into it,
//! and [`Parker::run`], a task of its own, hands back those that became readable and
//! closes those past their idle timeout. The locks are taken by that thread only (the
//! socket's waker runs on the thread that polls the I/O driver, the same one).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;
use slab::Slab;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// The parked connections of one accept loop; `T` is what the caller keeps with each (its
/// settings, its connection permit) to serve it again.
pub(crate) struct Parker<T> {
    inner: Mutex<Inner<T>>,
    woken: Arc<Woken>,
}

struct Inner<T> {
    entries: Slab<Entry<T>>,
    /// Each parked connection's idle deadline: `(deadline, key, generation)`, soonest
    /// first, the deadline in milliseconds after `base` (rounded up: never early), 16 bytes
    /// an entry. An entry whose connection was handed back stays until it comes up (its
    /// generation no longer matches) or the heap is swept.
    deadlines: BinaryHeap<Reverse<(u64, u32, u32)>>,
    /// What the deadlines count from.
    base: Instant,
    /// The deadline (as in `deadlines`) [`Parker::run`]'s timer is set for: a park with a
    /// later one (every park, while the idle timeout stays the same) need not wake it.
    timer_at: u64,
    /// Tells apart the connections that used the same slab key in turn.
    next_generation: u32,
    closed: bool,
}

struct Entry<T> {
    stream: TcpStream,
    payload: T,
    generation: u32,
}

/// The entries whose sockets became readable, and the parker's task to tell.
#[derive(Default)]
struct Woken {
    keys: Mutex<Vec<(u32, u32)>>,
    task: AtomicWaker,
}

/// The waker a parked socket holds: it names its entry.
struct EntryWaker {
    key: u32,
    generation: u32,
    woken: Arc<Woken>,
}

impl Wake for EntryWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        lock(&self.woken.keys).push((self.key, self.generation));
        self.woken.task.wake();
    }
}

/// Every critical section leaves the parker consistent (a push, a removal), so a panic
/// elsewhere must not stop it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<T> Parker<T> {
    pub(crate) fn new() -> Parker<T> {
        Parker {
            inner: Mutex::new(Inner {
                entries: Slab::new(),
                deadlines: BinaryHeap::new(),
                base: Instant::now(),
                timer_at: u64::MAX,
                next_generation: 0,
                closed: false,
            }),
            woken: Arc::default(),
        }
    }

    /// Parks `stream` until it is readable (then [`Parker::run`] hands it back) or
    /// `deadline` passes (then it is closed; `None`: no idle timeout). Gives it back at
    /// once, to be served now, when it is readable already or the parker has closed (its
    /// loop drains: the connection, served again, sees the drain and closes).
    pub(crate) fn park(
        &self,
        stream: TcpStream,
        payload: T,
        deadline: Option<Instant>,
    ) -> Result<(), (TcpStream, T)> {
        let mut inner = lock(&self.inner);
        if inner.closed {
            return Err((stream, payload));
        }
        // Keys and generations are 32 bits, to keep the deadline heap's entries small; a
        // generation wraps after 4 billion parks, long after any stale deadline or wake of
        // the key's earlier connection is gone (an idle timeout).
        let Ok(key) = u32::try_from(inner.entries.vacant_key()) else {
            return Err((stream, payload));
        };
        let generation = inner.next_generation;
        let waker = Waker::from(Arc::new(EntryWaker {
            key,
            generation,
            woken: Arc::clone(&self.woken),
        }));
        // Registers the entry's waker as the socket's reader, in place of the connection
        // task's; ready now means bytes (or the client's close) came since the last read.
        if stream
            .poll_read_ready(&mut Context::from_waker(&waker))
            .is_ready()
        {
            return Err((stream, payload));
        }
        inner.next_generation = inner.next_generation.wrapping_add(1);
        inner.entries.insert(Entry {
            stream,
            payload,
            generation,
        });
        let mut sooner = false;
        if let Some(deadline) = deadline {
            let after = deadline.saturating_duration_since(inner.base);
            let millis = u64::try_from(after.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
            inner.deadlines.push(Reverse((millis, key, generation)));
            sooner = millis < inner.timer_at;
        }
        // Handed-back connections' deadlines, once they outnumber the parked ones, are
        // swept out, so the heap stays within twice the parked connections.
        if inner.deadlines.len() > 2 * inner.entries.len() + 64 {
            let Inner {
                entries, deadlines, ..
            } = &mut *inner;
            deadlines.retain(|&Reverse((_, key, generation))| live(entries, key, generation));
        }
        drop(inner);
        if sooner {
            self.woken.task.wake();
        }
        Ok(())
    }

    /// How many connections are parked.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.inner).entries.len()
    }

    /// Closes every parked connection; [`Parker::run`] returns, and later connections are
    /// not parked.
    pub(crate) fn close(&self) {
        let entries = {
            let mut inner = lock(&self.inner);
            inner.closed = true;
            inner.deadlines.clear();
            std::mem::take(&mut inner.entries)
        };
        // Closed outside the lock: each drop deregisters a socket.
        drop(entries);
        self.woken.task.wake();
    }

    /// Hands each parked connection that became readable to `resume`, and closes those
    /// past their deadline, until [`Parker::close`].
    pub(crate) async fn run(&self, mut resume: impl FnMut(TcpStream, T)) {
        // With nothing parked, the timer waits for a moment no deadline reaches.
        let never = Instant::now() + std::time::Duration::from_secs(86_400 * 365);
        let mut timer: Pin<Box<Sleep>> = Box::pin(tokio::time::sleep_until(never));
        let mut keys = Vec::new();
        let mut ready = Vec::new();
        let mut expired = Vec::new();
        poll_fn(|cx| {
            loop {
                // Registered before the keys are taken: a wake after this is not lost. The
                // two lists are swapped, so neither allocates again.
                self.woken.task.register(cx.waker());
                std::mem::swap(&mut keys, &mut *lock(&self.woken.keys));
                let mut inner = lock(&self.inner);
                if inner.closed {
                    return Poll::Ready(());
                }
                for (key, generation) in keys.drain(..) {
                    if live(&inner.entries, key, generation) {
                        ready.push(inner.entries.remove(key as usize));
                    }
                }
                let now = Instant::now();
                let mut next_deadline = None;
                while let Some(&Reverse((millis, key, generation))) = inner.deadlines.peek() {
                    let deadline = inner.base + std::time::Duration::from_millis(millis);
                    if deadline > now {
                        next_deadline = Some(deadline);
                        break;
                    }
                    inner.deadlines.pop();
                    if live(&inner.entries, key, generation) {
                        expired.push(inner.entries.remove(key as usize));
                    }
                }
                inner.timer_at = inner
                    .deadlines
                    .peek()
                    .map_or(u64::MAX, |Reverse((millis, ..))| *millis);
                drop(inner);
                for entry in ready.drain(..) {
                    resume(entry.stream, entry.payload);
                }
                // Closed without a word, as an idle connection past its timeout is.
                expired.clear();
                let deadline = next_deadline.unwrap_or(never);
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
            }
        })
        .await;
    }
}

/// Whether `key` still holds the connection parked as `generation`.
fn live<T>(entries: &Slab<Entry<T>>, key: u32, generation: u32) -> bool {
    entries
        .get(key as usize)
        .is_some_and(|e| e.generation == generation)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let server = accepted.expect("accept").0;
        // A new socket counts as ready until a read finds nothing; a connection's reader
        // has always found nothing by the time it parks.
        let nothing = server.try_read(&mut [0u8; 1]);
        assert!(matches!(nothing, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock));
        (client.expect("connect"), server)
    }

    fn hour() -> Option<Instant> {
        Some(Instant::now() + Duration::from_secs(3600))
    }

    #[tokio::test]
    async fn a_parked_connection_comes_back_when_its_client_sends_and_not_before() {
        let parker = Arc::new(Parker::new());
        let (mut client, server) = pair().await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let running = tokio::spawn({
            let parker = Arc::clone(&parker);
            async move {
                parker
                    .run(|stream, payload| drop(tx.send((stream, payload))))
                    .await
            }
        });
        assert!(parker.park(server, 7u32, hour()).is_ok(), "idle: parked");
        assert_eq!(parker.len(), 1);
        tokio::task::yield_now().await;
        assert!(rx.try_recv().is_err(), "nothing sent, nothing handed back");

        client
            .write_all(b"GET / HTTP/1.1\r\n")
            .await
            .expect("write");
        let (mut stream, payload) = rx.recv().await.expect("handed back");
        assert_eq!(payload, 7);
        assert_eq!(parker.len(), 0);
        // Read as the connection's reader does, into more room than came: a short read
        // leaves the socket not ready, as a parked one must be.
        let mut buf = [0u8; 64];
        let n = stream.read(&mut buf).await.expect("what the client sent");
        assert_eq!(&buf[..n], b"GET / HTTP/1.1\r\n");

        // Parked again once it is idle again; the same slab key, a new generation.
        assert!(parker.park(stream, 8u32, hour()).is_ok());
        client.write_all(b"x").await.expect("write");
        let (_, payload) = rx.recv().await.expect("handed back again");
        assert_eq!(payload, 8);

        parker.close();
        running.await.expect("run returns once closed");
    }

    #[tokio::test]
    async fn a_readable_connection_is_given_back_at_once() {
        let parker = Parker::<()>::new();
        let (mut client, server) = pair().await;
        client.write_all(b"early").await.expect("write");
        // Readiness comes through the I/O driver: wait for it as a connection's task would.
        server.readable().await.expect("readable");
        assert!(parker.park(server, (), hour()).is_err());
        assert_eq!(parker.len(), 0);
    }

    #[tokio::test]
    async fn a_connection_past_its_deadline_is_closed() {
        let parker = Arc::new(Parker::new());
        let (mut client, server) = pair().await;
        let (mut other_client, other) = pair().await;
        let (_third_client, third) = pair().await;
        let running = tokio::spawn({
            let parker = Arc::clone(&parker);
            async move { parker.run(|_, _: ()| panic!("nothing is sent")).await }
        });
        assert!(parker.park(other, (), hour()).is_ok());
        assert!(parker.park(third, (), None).is_ok(), "no idle timeout");
        // The parker's timer is set for the hour first: a sooner deadline must move it.
        tokio::task::yield_now().await;
        let soon = Instant::now() + Duration::from_millis(50);
        assert!(parker.park(server, (), Some(soon)).is_ok());
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(10), client.read(&mut buf))
            .await
            .expect("closed within 10 s, not at the hour")
            .expect("a clean close");
        assert_eq!(n, 0, "closed at its deadline");
        assert_eq!(parker.len(), 2, "the others wait on");

        parker.close();
        running.await.expect("run returns once closed");
        let n = other_client.read(&mut buf).await.expect("a clean close");
        assert_eq!(n, 0, "close() closes every parked connection");
        assert!(
            parker.park(pair().await.1, (), hour()).is_err(),
            "closed: not parked"
        );
    }

    #[tokio::test]
    async fn deadlines_of_connections_handed_back_do_not_pile_up() {
        let parker = Arc::new(Parker::new());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let running = tokio::spawn({
            let parker = Arc::clone(&parker);
            async move { parker.run(|stream, ()| drop(tx.send(stream))).await }
        });
        let (mut client, mut server) = pair().await;
        // One connection parked and woken 1000 times: its 1000 deadlines are an hour away.
        for _ in 0..1000 {
            assert!(parker.park(server, (), hour()).is_ok());
            client.write_all(b"x").await.expect("write");
            server = rx.recv().await.expect("handed back");
            let mut buf = [0u8; 64];
            assert_eq!(server.read(&mut buf).await.expect("read"), 1);
        }
        // The sweep keeps the heap within twice the one parked connection plus 64, and the
        // push that triggers it.
        let heap = lock(&parker.inner).deadlines.len();
        assert!(heap <= 67, "{heap} deadlines for one connection");
        parker.close();
        running.await.expect("run returns once closed");
    }
}

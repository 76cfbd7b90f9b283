//! Idle keep-alive connections parked: each waits for its next request as its socket and
//! one small entry here, with no task, timer, buffer, registration or state of its own.
//!
//! A connection served on its task holds ~2 KB while it waits for its next request (the
//! task and its future, the connection's state, its timers, its forwarding fields); nginx
//! holds ~0.5 KB for an idle connection. Parked, a connection holds its socket and its entry
//! (the socket and what the caller needs to serve it again), in one slab. A connection under
//! load never parks: it must be idle for `timeouts.park_ms` first, so rebuilding its state
//! (a spawn, its `ConnCtx`, its timers, its socket's registration with tokio: ~12,600
//! instructions in callgrind) is paid at most once per such pause.
//!
//! A parked socket leaves tokio's reactor for an epoll instance of the parker's own: tokio
//! keeps a 256-byte, cache-line-aligned `ScheduledIo` for each socket it watches, and a
//! waker naming the entry would be another 40 bytes; here the kernel's epoll item holds the
//! entry's key instead. That costs four `epoll_ctl` calls per park and wake (out of
//! tokio's set and into this one, and back) and the parker's `epoll_wait`, paid by
//! connections idle for `park_ms` only.
//! The epoll instance is itself watched by tokio, like any socket.
//!
//! Written here, not with `FuturesUnordered`: that allocates a node (its future, five
//! pointers, an `Arc`) per connection and cannot drop one by key, which the idle timeout
//! needs. Here the timeout is one heap of deadlines and one timer for all the parked
//! connections of an accept loop, where each connection's task had a timer of its own.
//!
//! One parker per accept loop, on its serving thread: the connections' tasks park into it,
//! and [`Parker::run`], a task of its own, hands back those that became readable and
//! closes those past their idle timeout.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::poll_fn;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use futures_util::task::AtomicWaker;
use rustix::event::epoll;
use slab::Slab;
use tokio::io::unix::AsyncFd;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// The parked connections of one accept loop; `T` is what the caller keeps with each (its
/// settings, its connection permit) to serve it again.
pub(crate) struct Parker<T> {
    inner: Mutex<Inner<T>>,
    /// The parked sockets' epoll instance, watched by tokio; `None` when it could not be
    /// made (then nothing parks).
    epoll: Option<AsyncFd<OwnedFd>>,
    /// [`Parker::run`]'s task: woken for a sooner deadline and for [`Parker::close`].
    task: AtomicWaker,
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
    /// Out of tokio's reactor, in the parker's epoll set (closing it leaves the set too).
    stream: std::net::TcpStream,
    payload: T,
    generation: u32,
}

/// What [`Parker::park`] did with a connection.
pub(crate) enum Parking<T> {
    /// Parked: [`Parker::run`] hands it back when its client sends, or closes it.
    Parked,
    /// To be served now: it is readable already, the parker has closed (its loop drains:
    /// the connection, served again, sees the drain and closes) or cannot take it.
    ServeNow(TcpStream, T),
    /// Lost on the way: the socket could not leave or rejoin tokio's reactor (the kernel
    /// refused an `epoll_ctl`), and is closed.
    Closed,
}

/// Every critical section leaves the parker consistent (a push, a removal), so a panic
/// elsewhere must not stop it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A parked entry's name in the epoll set: its slab key and generation.
fn event_data(key: u32, generation: u32) -> epoll::EventData {
    epoll::EventData::new_u64(u64::from(key) << 32 | u64::from(generation))
}

/// The parked connections' lists keep room for this many when they empty (~100 KB for the
/// slab); more is returned. Smaller in tests, so that a storm past it and a wake past one
/// `epoll_wait`'s batch fit under a default limit of 1024 descriptors.
#[cfg(not(test))]
const KEPT_CAPACITY: usize = 1024;
#[cfg(test)]
const KEPT_CAPACITY: usize = 64;

/// How many readiness events one `epoll_wait` takes.
#[cfg(not(test))]
const EVENTS_PER_WAIT: usize = 256;
#[cfg(test)]
const EVENTS_PER_WAIT: usize = 16;

impl<T> Parker<T> {
    /// A parker for the calling runtime's accept loop. Without an epoll instance (the
    /// kernel refused one) it parks nothing, and says so once.
    pub(crate) fn new() -> Parker<T> {
        // `AsyncFd::new` is deprecated for owners whose `as_raw_fd` could change or close
        // the descriptor under tokio; its replacement is `unsafe`, which this workspace
        // forbids. An `OwnedFd` can do neither: it keeps one descriptor open until dropped,
        // and `AsyncFd` owns it.
        #[allow(deprecated)]
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)
            .map_err(std::io::Error::from)
            .and_then(AsyncFd::new);
        let epoll = match epoll {
            Ok(epoll) => Some(epoll),
            Err(e) => {
                tracing::warn!("idle connections will not park: no epoll instance: {e}");
                None
            }
        };
        Parker {
            inner: Mutex::new(Inner {
                entries: Slab::new(),
                deadlines: BinaryHeap::new(),
                base: Instant::now(),
                timer_at: u64::MAX,
                next_generation: 0,
                closed: false,
            }),
            epoll,
            task: AtomicWaker::new(),
        }
    }

    /// Parks `stream` until it is readable (then [`Parker::run`] hands it back) or
    /// `deadline` passes (then it is closed; `None`: no idle timeout).
    pub(crate) fn park(
        &self,
        stream: TcpStream,
        payload: T,
        deadline: Option<Instant>,
    ) -> Parking<T> {
        let Some(epoll) = &self.epoll else {
            return Parking::ServeNow(stream, payload);
        };
        let mut inner = lock(&self.inner);
        if inner.closed {
            return Parking::ServeNow(stream, payload);
        }
        // Keys and generations are 32 bits, to keep the deadline heap's entries small; a
        // generation wraps after 4 billion parks, long after any stale deadline of the
        // key's earlier connection is gone (an idle timeout).
        let Ok(key) = u32::try_from(inner.entries.vacant_key()) else {
            return Parking::ServeNow(stream, payload);
        };
        // Ready in tokio's eyes means bytes (or the client's close) came since the last
        // read: serve it on. Bytes that come after this are reported by the epoll set,
        // which is level-triggered.
        if stream
            .poll_read_ready(&mut Context::from_waker(Waker::noop()))
            .is_ready()
        {
            return Parking::ServeNow(stream, payload);
        }
        let Ok(stream) = stream.into_std() else {
            // Dropped with its registration: closed.
            return Parking::Closed;
        };
        let generation = inner.next_generation;
        // One-shot: reported once, then [`Parker::run`] takes it out of the set.
        let interest =
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP | epoll::EventFlags::ONESHOT;
        if let Err(e) = epoll::add(
            epoll.get_ref(),
            &stream,
            event_data(key, generation),
            interest,
        ) {
            tracing::debug!("not parked: epoll_ctl: {e}");
            drop(inner);
            return match TcpStream::from_std(stream) {
                Ok(stream) => Parking::ServeNow(stream, payload),
                Err(_) => Parking::Closed,
            };
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
            self.task.wake();
        }
        Parking::Parked
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
        // Closed outside the lock.
        drop(entries);
        self.task.wake();
    }

    /// Hands each parked connection that became readable to `resume`, and closes those
    /// past their deadline, until [`Parker::close`].
    pub(crate) async fn run(&self, mut resume: impl FnMut(TcpStream, T)) {
        let Some(epoll) = &self.epoll else {
            return;
        };
        // With nothing parked, the timer waits for a moment no deadline reaches.
        let never = Instant::now() + std::time::Duration::from_secs(86_400 * 365);
        let mut timer: Pin<Box<Sleep>> = Box::pin(tokio::time::sleep_until(never));
        let mut keys = Vec::new();
        let mut ready = Vec::new();
        let mut expired = Vec::new();
        poll_fn(|cx| {
            loop {
                // Registered before the state is read: a wake after this is not lost.
                self.task.register(cx.waker());
                // Whether to go round again at once: after readiness was seen, so that the
                // next poll either reads more or, readiness cleared, registers this task's
                // waker with tokio (a `Ready` poll registers none).
                let mut again = false;
                if let Poll::Ready(Ok(mut guard)) = epoll.poll_read_ready(cx) {
                    again = true;
                    // On the stack: an `epoll::Event` holds a pointer, so a list of them
                    // kept across the task's awaits would make it `!Send`.
                    let mut events = [MaybeUninit::<epoll::Event>::uninit(); EVENTS_PER_WAIT];
                    let zero = rustix::time::Timespec {
                        tv_sec: 0,
                        tv_nsec: 0,
                    };
                    match epoll::wait(epoll.get_ref(), &mut events, Some(&zero)) {
                        Ok((events, _)) => {
                            // A full batch may have more behind it. A short one emptied the
                            // set's ready list; an event after it reaches tokio as a new
                            // edge, so clearing does not lose it.
                            if events.len() < EVENTS_PER_WAIT {
                                guard.clear_ready();
                            }
                            keys.extend(events.iter().map(|event| {
                                let data = event.data.u64();
                                // The high and low halves, as `event_data` packed them.
                                ((data >> 32) as u32, data as u32)
                            }));
                        }
                        Err(rustix::io::Errno::INTR) => {}
                        Err(e) => {
                            tracing::warn!("parked connections: epoll_wait: {e}");
                            guard.clear_ready();
                        }
                    }
                }
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
                // A storm of connections leaves the lists at its size: once all have come
                // back or closed, every deadline left is stale, and lists grown past
                // `KEPT_CAPACITY` go back to the allocator.
                if inner.entries.is_empty() {
                    inner.deadlines.clear();
                    if inner.entries.capacity() > KEPT_CAPACITY {
                        inner.entries = Slab::new();
                    }
                    if inner.deadlines.capacity() > KEPT_CAPACITY {
                        inner.deadlines = BinaryHeap::new();
                    }
                }
                inner.timer_at = inner
                    .deadlines
                    .peek()
                    .map_or(u64::MAX, |Reverse((millis, ..))| *millis);
                drop(inner);
                for entry in ready.drain(..) {
                    // Out of this set (its one shot is spent, but it is still a member),
                    // and back into tokio's reactor. A socket the kernel will not take back
                    // is closed: its client sees the close of an idle connection.
                    let _ = epoll::delete(epoll.get_ref(), &entry.stream);
                    match TcpStream::from_std(entry.stream) {
                        Ok(stream) => resume(stream, entry.payload),
                        Err(e) => tracing::debug!("parked connection closed: epoll_ctl: {e}"),
                    }
                }
                // Closed without a word, as an idle connection past its timeout is.
                expired.clear();
                if again {
                    continue;
                }
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
    use std::sync::Arc;
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

    /// Where a running parker's handed-back connections arrive, with their payloads.
    type HandedBack<T> = tokio::sync::mpsc::UnboundedReceiver<(TcpStream, T)>;

    /// A parker running on a task of its own; each connection it hands back, with its
    /// payload, arrives on the channel.
    fn running_parker<T: Send + 'static>()
    -> (Arc<Parker<T>>, tokio::task::JoinHandle<()>, HandedBack<T>) {
        let parker = Arc::new(Parker::new());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let running = tokio::spawn({
            let parker = Arc::clone(&parker);
            async move {
                parker
                    .run(|stream, payload| drop(tx.send((stream, payload))))
                    .await
            }
        });
        (parker, running, rx)
    }

    fn parked<T>(parking: Parking<T>) -> bool {
        matches!(parking, Parking::Parked)
    }

    fn served_now<T>(parking: Parking<T>) -> bool {
        matches!(parking, Parking::ServeNow(..))
    }

    fn hour() -> Option<Instant> {
        Some(Instant::now() + Duration::from_secs(3600))
    }

    #[tokio::test]
    async fn a_parked_connection_comes_back_when_its_client_sends_and_not_before() {
        let (parker, running, mut rx) = running_parker();
        let (mut client, server) = pair().await;
        assert!(parked(parker.park(server, 7u32, hour())), "idle: parked");
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
        assert!(parked(parker.park(stream, 8u32, hour())));
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
        assert!(served_now(parker.park(server, (), hour())));
        assert_eq!(parker.len(), 0);
    }

    #[tokio::test]
    async fn bytes_that_came_before_the_park_but_after_the_last_read_bring_it_back() {
        let (parker, running, mut rx) = running_parker();
        let (mut client, server) = pair().await;
        client.write_all(b"late").await.expect("write");
        // The bytes are in the socket; whether tokio has seen them yet is the scheduler's
        // business. Seen: served at once. Not seen: parked, and the level-triggered epoll
        // set must report them, since no new bytes will come.
        let mut stream = match parker.park(server, (), hour()) {
            Parking::ServeNow(stream, ()) => stream,
            Parking::Parked => {
                tokio::time::timeout(Duration::from_secs(10), rx.recv())
                    .await
                    .expect("handed back for the bytes already there")
                    .expect("handed back")
                    .0
            }
            Parking::Closed => panic!("closed"),
        };
        let mut buf = [0u8; 64];
        let n = stream.read(&mut buf).await.expect("read");
        assert_eq!(&buf[..n], b"late");
        parker.close();
        running.await.expect("run returns once closed");
    }

    #[tokio::test]
    async fn a_client_that_closes_while_parked_is_handed_back_to_read_its_end() {
        let (parker, running, mut rx) = running_parker();
        let (client, server) = pair().await;
        assert!(parked(parker.park(server, (), hour())));
        drop(client);
        let (mut stream, ()) = rx.recv().await.expect("handed back on the client's close");
        let mut buf = [0u8; 8];
        assert_eq!(stream.read(&mut buf).await.expect("read"), 0, "the end");
        assert_eq!(parker.len(), 0);
        parker.close();
        running.await.expect("run returns once closed");
    }

    #[tokio::test]
    async fn many_parked_connections_woken_at_once_all_come_back() {
        // More than one `epoll_wait` takes, so the batches after the first are read too.
        let count = EVENTS_PER_WAIT * 2 + 3;
        let (parker, running, mut rx) = running_parker();
        let mut clients = Vec::new();
        for key in 0..count {
            let (client, server) = pair().await;
            assert!(parked(parker.park(server, key, hour())));
            clients.push(client);
        }
        assert_eq!(parker.len(), count);
        for client in &mut clients {
            client.write_all(b"x").await.expect("write");
        }
        let mut seen = vec![false; count];
        for _ in 0..count {
            let (_, key) = rx.recv().await.expect("handed back");
            assert!(
                !std::mem::replace(&mut seen[key], true),
                "{key} came back twice"
            );
        }
        assert_eq!(parker.len(), 0);
        parker.close();
        running.await.expect("run returns once closed");
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
        assert!(parked(parker.park(other, (), hour())));
        assert!(parked(parker.park(third, (), None)), "no idle timeout");
        // The parker's timer is set for the hour first: a sooner deadline must move it.
        tokio::task::yield_now().await;
        let soon = Instant::now() + Duration::from_millis(50);
        assert!(parked(parker.park(server, (), Some(soon))));
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
            served_now(parker.park(pair().await.1, (), hour())),
            "closed: not parked"
        );
    }

    #[tokio::test]
    async fn deadlines_of_connections_handed_back_do_not_pile_up() {
        let (parker, running, mut rx) = running_parker();
        // One connection parked throughout, so the parker never empties (which would clear
        // the heap), and one parked and woken 1000 times: its 1000 deadlines are an hour away.
        let (_stays_client, stays) = pair().await;
        assert!(parked(parker.park(stays, (), hour())));
        let (mut client, mut server) = pair().await;
        for _ in 0..1000 {
            assert!(parked(parker.park(server, (), hour())));
            client.write_all(b"x").await.expect("write");
            (server, ()) = rx.recv().await.expect("handed back");
            let mut buf = [0u8; 64];
            assert_eq!(server.read(&mut buf).await.expect("read"), 1);
        }
        // The sweep keeps the heap within twice the parked connections plus 64, and the
        // push that triggers it.
        let heap = lock(&parker.inner).deadlines.len();
        assert!(heap <= 69, "{heap} deadlines for two connections");
        parker.close();
        running.await.expect("run returns once closed");
    }

    #[tokio::test]
    async fn the_lists_a_storm_grew_are_returned_once_it_is_over() {
        let (parker, running, mut rx) = running_parker();
        let storm = KEPT_CAPACITY * 2;
        let mut clients = Vec::new();
        for _ in 0..storm {
            let (client, server) = pair().await;
            assert!(parked(parker.park(server, (), hour())));
            clients.push(client);
        }
        assert!(lock(&parker.inner).entries.capacity() >= storm);
        // The clients go: every connection comes back to read its end.
        drop(clients);
        for _ in 0..storm {
            rx.recv().await.expect("handed back");
        }
        {
            let inner = lock(&parker.inner);
            assert_eq!(inner.entries.len(), 0);
            assert!(
                inner.entries.capacity() <= KEPT_CAPACITY,
                "the slab kept its room"
            );
            assert!(inner.deadlines.is_empty(), "stale deadlines cleared");
            assert!(
                inner.deadlines.capacity() <= KEPT_CAPACITY,
                "the heap kept its room"
            );
        }
        parker.close();
        running.await.expect("run returns once closed");
    }
}

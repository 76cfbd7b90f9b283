//! A small bounded pool of threads for password hashes (bcrypt, apr1): the slow part of a
//! basic-auth check, kept off the serving threads.
//!
//! A job goes into a queue of fixed length ([`HashPool::try_run`]); a full queue refuses at
//! once (the caller answers `503`), it never grows: a flood of wrong passwords costs at
//! most the pool's threads and a queue of jobs, whatever its rate. The threads run at nice
//! 19, so on a core shared with a serving thread the serving thread always runs first: a
//! flood aimed at one route takes the CPU other routes leave idle, not theirs. The caller
//! awaits the answer on its own runtime (a oneshot channel), so nothing blocks there.

use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};

/// A job: a hash check that sends its answer itself.
type Job = Box<dyn FnOnce() + Send>;

/// The pool: dropping it (with the authenticator that owns it) ends its threads once they
/// finish the jobs queued.
#[derive(Debug)]
pub struct HashPool {
    jobs: SyncSender<Job>,
    threads: usize,
    queue: usize,
}

/// The queue was full: the check was not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

/// The nice value of the pool's threads: the lowest priority there is, so a serving thread
/// on the same core is never the one that waits.
pub const NICE: i32 = 19;

impl HashPool {
    /// Starts `threads` threads (at least one) behind a queue of `queue` jobs (at least
    /// one), named `name` for `top -H`.
    pub fn start(name: &str, threads: usize, queue: usize) -> std::io::Result<HashPool> {
        let threads = threads.max(1);
        let queue = queue.max(1);
        let (jobs, rx) = sync_channel::<Job>(queue);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads {
            let rx = Arc::clone(&rx);
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || work(&rx))?;
        }
        Ok(HashPool {
            jobs,
            threads,
            queue,
        })
    }

    /// Queues `check`; its answer comes through the returned receiver. `Err(Full)` when the
    /// queue is full: nothing was queued.
    pub fn try_run<T, F>(&self, check: F) -> Result<tokio::sync::oneshot::Receiver<T>, Full>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            // The caller may have gone (its client closed): the answer is dropped.
            let _ = tx.send(check());
        });
        match self.jobs.try_send(job) {
            Ok(()) => Ok(rx),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => Err(Full),
        }
    }

    /// Its threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The length of its queue.
    pub fn queue(&self) -> usize {
        self.queue
    }
}

/// A pool thread: lowers its own priority, then runs jobs until the pool is dropped.
fn work(rx: &Mutex<Receiver<Job>>) {
    let tid = rustix::thread::gettid();
    if let Err(err) = rustix::process::setpriority_process(Some(tid), NICE) {
        tracing::warn!(target: "tailguard::auth", %err, "hash pool: could not lower its priority");
    }
    loop {
        // The lock is held only to take one job (the receiver is not shared otherwise).
        let job = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(poisoned) => poisoned.into_inner().recv(),
        };
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_and_a_full_queue_refuses_at_once() {
        let pool = HashPool::start("test-hash", 1, 2).unwrap();
        // The one thread takes a job that waits until told.
        let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        let first = pool
            .try_run(move || {
                started_tx.send(()).unwrap();
                hold_rx.recv().is_ok()
            })
            .unwrap();
        started_rx.recv().unwrap();
        // Two fit in the queue behind it; the third is refused, not queued.
        let a = pool.try_run(|| 1).unwrap();
        let b = pool.try_run(|| 2).unwrap();
        assert_eq!(pool.try_run(|| 3).unwrap_err(), Full);
        hold_tx.send(()).unwrap();
        assert!(first.await.unwrap());
        assert_eq!(a.await.unwrap(), 1);
        assert_eq!(b.await.unwrap(), 2);
        // Room again.
        assert_eq!(pool.try_run(|| 4).unwrap().await.unwrap(), 4);
    }
}

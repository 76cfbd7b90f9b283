//! Retry budget: retries may add at most `ratio` of the requests plus a small floor per second
//! (SRE book: 10 %; Envoy `retry_budget`), so retries cannot multiply an overload.
//!
//! A 10 s window of 1 s buckets behind one small mutex per upstream; deposits and
//! withdrawals are a few adds.

use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug, Default, Clone, Copy)]
struct Slot {
    requests: u64,
    retries: u64,
}

#[derive(Debug)]
struct Ring {
    slots: [Slot; 10],
    cur: u64,
}

/// Tracks requests and retries of one upstream.
#[derive(Debug)]
pub struct RetryBudget {
    ratio: f64,
    min_per_sec: u64,
    ring: Mutex<Ring>,
}

impl RetryBudget {
    /// Allows `ratio` (e.g. 0.1) of requests as retries, plus `min_per_sec` per second.
    pub fn new(ratio: f64, min_per_sec: u64) -> Self {
        Self {
            ratio: ratio.clamp(0.0, 1.0),
            min_per_sec,
            ring: Mutex::new(Ring {
                slots: [Slot::default(); 10],
                cur: 0,
            }),
        }
    }

    fn with<T>(&self, now: Duration, f: impl FnOnce(&mut Ring) -> T) -> T {
        let mut r = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let idx = now.as_secs();
        if idx > r.cur {
            let span = (idx - r.cur).min(10);
            for i in 1..=span {
                r.slots[((idx - span + i) % 10) as usize] = Slot::default();
            }
            r.cur = idx;
        }
        f(&mut r)
    }

    /// Counts an original request.
    pub fn deposit(&self, now: Duration) {
        self.deposit_many(now, 1);
    }

    /// Counts `n` original requests at once (for callers that count requests elsewhere,
    /// e.g. per serving thread, and hand the total over when a retry is considered).
    pub fn deposit_many(&self, now: Duration, n: u64) {
        if n > 0 {
            self.with(now, |r| r.slots[(r.cur % 10) as usize].requests += n);
        }
    }

    /// Takes one retry from the budget if there is room.
    pub fn try_withdraw(&self, now: Duration) -> bool {
        let (ratio, floor) = (self.ratio, self.min_per_sec * 10);
        self.with(now, |r| {
            let (req, ret) = r
                .slots
                .iter()
                .fold((0, 0), |(a, b), s| (a + s.requests, b + s.retries));
            let allowed = floor as f64 + ratio * req as f64;
            if (ret as f64) < allowed {
                r.slots[(r.cur % 10) as usize].retries += 1;
                true
            } else {
                false
            }
        })
    }

    /// The window's retries taken and requests counted, as of `now` (changes nothing the
    /// budget decides with: a window that moved on is emptied, as any call would).
    pub fn usage(&self, now: Duration) -> (u64, u64) {
        self.with(now, |r| {
            r.slots
                .iter()
                .fold((0, 0), |(ret, req), s| (ret + s.retries, req + s.requests))
        })
    }

    /// Retries the window allows with `requests` counted in it: `min_per_sec` x 10 s plus
    /// `ratio` of the requests.
    pub fn allowed(&self, requests: u64) -> f64 {
        (self.min_per_sec * 10) as f64 + self.ratio * requests as f64
    }
}

//! Verified tokens remembered per serving thread until their `exp`, so a client that sends
//! the same token again pays a hash and a lookup, not a signature check. Per thread: no
//! lock, no cache line shared with another serving thread (design.md §2 rule 3). Bounded:
//! [`MAX_ENTRIES`] per thread; a full table is emptied (the simplest bound that can never
//! grow, at the cost of one signature check per token after it).

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use http::{HeaderName, HeaderValue};

/// Tokens remembered per thread: 4,096 (at ~1 KiB a token, 4 MiB per serving thread at
/// most), more than the 1,000 distinct tokens in rotation of the cost target.
pub const MAX_ENTRIES: usize = 4096;

/// What an accepted token let through, as it is handed out again.
#[derive(Debug)]
pub struct Remembered {
    /// The consumer.
    pub consumer: Option<Arc<str>>,
    /// The headers its claims set.
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

struct Entry {
    auth: u64,
    generation: u64,
    token: Box<[u8]>,
    /// Unix seconds: `exp` plus the leeway.
    until: u64,
    remembered: Arc<Remembered>,
}

struct Cache {
    hasher: RandomState,
    entries: HashMap<u64, Entry>,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache {
        hasher: RandomState::new(),
        entries: HashMap::new(),
    });
}

/// The remembered answer for `token` of authenticator `auth`, verified with the key set of
/// `generation` and valid at `now`.
pub fn get(auth: u64, generation: u64, token: &[u8], now: u64) -> Option<Arc<Remembered>> {
    CACHE.with(|c| {
        let c = c.borrow();
        let key = c.hasher.hash_one((auth, token));
        let e = c.entries.get(&key)?;
        (e.auth == auth && e.generation == generation && now < e.until && *e.token == *token)
            .then(|| Arc::clone(&e.remembered))
    })
}

/// Remembers `token` of `auth` until `until`.
pub fn put(auth: u64, generation: u64, token: &[u8], until: u64, remembered: Arc<Remembered>) {
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.entries.len() >= MAX_ENTRIES {
            c.entries.clear();
        }
        let key = c.hasher.hash_one((auth, token));
        c.entries.insert(
            key,
            Entry {
                auth,
                generation,
                token: token.into(),
                until,
                remembered,
            },
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_remembered_until_its_time_for_its_authenticator_and_key_set_only() {
        let r = Arc::new(Remembered {
            consumer: Some(Arc::from("alice")),
            headers: Vec::new(),
        });
        put(1, 7, b"tok", 100, r);
        assert!(get(1, 7, b"tok", 99).is_some());
        assert!(get(1, 7, b"tok", 100).is_none(), "expired");
        assert!(get(2, 7, b"tok", 50).is_none(), "another authenticator");
        assert!(get(1, 8, b"tok", 50).is_none(), "another key set");
        assert!(get(1, 7, b"tok2", 50).is_none());
    }

    #[test]
    fn the_table_never_grows_past_its_bound() {
        let r = Arc::new(Remembered {
            consumer: None,
            headers: Vec::new(),
        });
        for i in 0..(MAX_ENTRIES as u64 * 2 + 3) {
            put(9, 1, &i.to_le_bytes(), u64::MAX, Arc::clone(&r));
        }
        let len = CACHE.with(|c| c.borrow().entries.len());
        assert!(len <= MAX_ENTRIES, "{len}");
    }
}

//! Where a JWT authenticator's keys come from and how they stay fresh, off the request
//! path: a key set read from a file (and again when it changes) or fetched from a URL by a
//! task on the key fetcher's own thread, refreshed every `refresh_s` (or the server's
//! `Cache-Control: max-age`, within bounds), fetched again early for a token whose `kid` is
//! unknown (at most once per `refetch_min_s`), and kept when the key server fails.
//!
//! Serving threads only load the current set (one atomic pointer load) and, for an unknown
//! `kid`, may wake the fetcher (an atomic compare and a notify). A key server that hangs
//! delays nothing but its own fetch (each is bounded by `timeout_ms`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use http::Uri;
use tailguard_metrics::{Counter, Gauge};

use crate::jwk::KeySet;

/// The longest a fetched set is kept before the next fetch, whatever `max-age` says: a day.
pub const MAX_REFRESH: Duration = Duration::from_secs(86_400);

/// Where the keys are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// An `http` or `https` URL.
    Url(Uri),
    /// A file (read at build, re-read when it changes).
    File(PathBuf),
}

/// How a fetched key set is kept fresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refresh {
    /// The period between fetches when the server sends no `max-age`.
    pub refresh: Duration,
    /// The shortest period a `max-age` may set (a server saying `max-age=0` is not fetched
    /// from in a loop).
    pub min_refresh: Duration,
    /// The shortest time between two fetches asked for by unknown `kid`s.
    pub refetch_min: Duration,
    /// A fetch's time limit.
    pub timeout: Duration,
}

impl Refresh {
    /// The wait before the next fetch after a good one.
    pub fn after_success(&self, max_age: Option<u64>) -> Duration {
        match max_age {
            Some(s) => Duration::from_secs(s).clamp(self.min_refresh, MAX_REFRESH),
            None => self.refresh,
        }
    }
}

/// The current keys with a generation that changes with each new set (the token cache
/// drops what older sets verified).
#[derive(Debug)]
pub struct Current {
    /// The keys; `None` until the first set arrived.
    pub keys: Option<KeySet>,
    /// Bumped with every new set.
    pub generation: u64,
}

fn next_generation() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The key set metrics of one authenticator.
#[derive(Debug, Clone)]
pub struct KeyMetrics {
    /// Unix time of the last good fetch or read.
    pub last_success: Gauge,
    /// Fetches or reads that failed (the last good set stayed).
    pub failures: Counter,
    /// Keys in the current set.
    pub keys: Gauge,
}

/// A key set kept fresh off the request path.
#[derive(Debug)]
pub struct KeySource {
    current: Arc<ArcSwap<Current>>,
    wake: tokio::sync::Notify,
    /// Milliseconds since the epoch of the last refetch asked for by an unknown `kid`.
    last_ask_ms: AtomicU64,
    refetch_min_ms: u64,
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

impl KeySource {
    /// Starts keeping the key set at `location` fresh. A file is read now (an error is the
    /// caller's, as a config error); a URL is fetched by the fetcher thread from now on, so
    /// until its first answer the set is empty.
    /// `ca`: a PEM file of CA certificates trusted for an `https://` URL besides the
    /// system's roots.
    pub fn start(
        name: &str,
        location: Location,
        refresh: Refresh,
        ca: Option<&std::path::Path>,
        metrics: KeyMetrics,
    ) -> Result<Arc<KeySource>, String> {
        let source = Arc::new(KeySource {
            current: Arc::new(ArcSwap::from_pointee(Current {
                keys: None,
                generation: 0,
            })),
            wake: tokio::sync::Notify::new(),
            last_ask_ms: AtomicU64::new(0),
            refetch_min_ms: u64::try_from(refresh.refetch_min.as_millis()).unwrap_or(u64::MAX),
        });
        match location {
            Location::File(path) => {
                let text = std::fs::read(&path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                let keys =
                    KeySet::parse_jwks(&text).map_err(|e| format!("{}: {e}", path.display()))?;
                metrics
                    .keys
                    .set(i64::try_from(keys.len()).unwrap_or(i64::MAX));
                metrics
                    .last_success
                    .set(i64::try_from(unix_now().as_secs()).unwrap_or(0));
                source.current.store(Arc::new(Current {
                    keys: Some(keys),
                    generation: next_generation(),
                }));
                crate::watch::watch(path, &source.current, move |text| match KeySet::parse_jwks(
                    text.as_bytes(),
                ) {
                    Ok(keys) => {
                        metrics
                            .keys
                            .set(i64::try_from(keys.len()).unwrap_or(i64::MAX));
                        metrics
                            .last_success
                            .set(i64::try_from(unix_now().as_secs()).unwrap_or(0));
                        Ok(Current {
                            keys: Some(keys),
                            generation: next_generation(),
                        })
                    }
                    Err(e) => {
                        metrics.failures.inc();
                        Err(e)
                    }
                });
            }
            Location::Url(url) => {
                // Built here, at config load: the roots are read from disk.
                let tls = crate::connect::tls_config(ca)?;
                let weak = Arc::downgrade(&source);
                let name = name.to_owned();
                fetcher().spawn(fetch_loop(weak, name, url, refresh, tls, metrics));
            }
        }
        Ok(source)
    }

    /// The current keys.
    #[inline]
    pub fn current(&self) -> arc_swap::Guard<Arc<Current>> {
        self.current.load()
    }

    /// A token named a `kid` the set does not hold (or no set arrived yet): wakes the
    /// fetcher, at most once per `refetch_min_s`.
    pub fn ask_refetch(&self) {
        let now = u64::try_from(unix_now().as_millis()).unwrap_or(u64::MAX);
        let last = self.last_ask_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < self.refetch_min_ms {
            return;
        }
        if self
            .last_ask_ms
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.wake.notify_one();
        }
    }
}

/// The key fetcher: one thread with its own current-thread runtime for every fetched key
/// set of the process, started with the first. Its tasks end when their authenticator is
/// dropped (a reload replaced it).
fn fetcher() -> &'static tokio::runtime::Handle {
    static HANDLE: OnceLock<tokio::runtime::Handle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime for the key fetcher builds");
        let handle = runtime.handle().clone();
        let spawned = std::thread::Builder::new()
            .name("tailguard-auth-keys".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()));
        if let Err(e) = spawned {
            tracing::error!(target: "tailguard::auth", "no key fetcher thread: {e}");
        }
        handle
    })
}

async fn fetch_loop(
    source: Weak<KeySource>,
    name: String,
    url: Uri,
    refresh: Refresh,
    tls: Arc<rustls::ClientConfig>,
    metrics: KeyMetrics,
) {
    // After a failure: 1 s, doubling, up to `refresh` (a key server back up is used soon,
    // one that stays down is not hammered).
    let mut backoff = Duration::from_secs(1);
    // The last document stored: the same document fetched again keeps its generation, so
    // the tokens it verified stay remembered.
    let mut last_body = bytes::Bytes::new();
    loop {
        let fetched = crate::fetch::get(&url, refresh.timeout, &tls).await;
        let Some(src) = source.upgrade() else {
            return;
        };
        let wait = match fetched
            .and_then(|f| KeySet::parse_jwks(&f.body).map(|keys| (keys, f.max_age, f.body)))
        {
            Ok((keys, max_age, body)) => {
                metrics
                    .keys
                    .set(i64::try_from(keys.len()).unwrap_or(i64::MAX));
                metrics
                    .last_success
                    .set(i64::try_from(unix_now().as_secs()).unwrap_or(0));
                if body != last_body {
                    src.current.store(Arc::new(Current {
                        keys: Some(keys),
                        generation: next_generation(),
                    }));
                    last_body = body;
                }
                backoff = Duration::from_secs(1);
                refresh.after_success(max_age)
            }
            Err(e) => {
                metrics.failures.inc();
                tracing::warn!(
                    target: "tailguard::auth",
                    auth = %name,
                    "key set not fetched, the last good one stays: {e}"
                );
                let wait = backoff.min(refresh.refresh);
                backoff = (backoff * 2).min(refresh.refresh);
                wait
            }
        };
        // Woken early by an unknown `kid` (rate-limited by `ask_refetch`).
        let woken = async {
            src.wake.notified().await;
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = woken => {}
        }
        drop(src);
    }
}

//! The config from etcd: a thread of its own gets the config's key, watches it from the next
//! revision and hands every new document to the main thread, which applies it through the
//! same path as a SIGHUP reload (`apply.rs`).
//!
//! The watcher never serves traffic and never touches the gateway: it only talks to etcd
//! (on its own current-thread runtime) and sends [`Update`]s. While etcd cannot be reached
//! the running config keeps serving; the watcher reconnects with a jittered exponential
//! backoff and resumes the watch at the revision after the last one it saw, so a change
//! made meanwhile arrives as an ordinary event. If that revision has been compacted away,
//! etcd cancels the watch and the watcher reads the key afresh instead.
//!
//! Every revision applied is also written to the node's etcd cache (`etcd_cache.rs`). A
//! start that cannot reach etcd within the timeout serves the cached revision instead, and
//! the watcher goes on trying: once etcd answers it reads the key and hands over whatever
//! changed meanwhile.
//!
//! The client is `tailguard-etcd` (`crates/etcd`: etcd's v3 gRPC API over tonic): its HTTP/2
//! keep-alive pings find a dead etcd behind a silent network, which a plain HTTP watch
//! would not notice.
//!
//! TLS and authentication: the client speaks TLS to `https://` endpoints and authenticates
//! with the bootstrap's credentials, renewing an expired token by itself (an open watch is
//! not touched). A refusal (no client certificate, an untrusted server, a wrong password) is
//! a [`Failure`] that names the setting to fix; at start it ends the wait for etcd at once,
//! since retrying cannot cure it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use tailguard_config::Config;
use tailguard_config::Diagnostic;
use tailguard_etcd::{Client, ConnectOptions, EventType, KeyValue, Refusal, WatchCreateRequest};
use tailguard_metrics::{Counter, Gauge, Registry};
use tailguard_proxy::{Error, Server};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep, timeout};

use crate::bootstrap::{Credentials, Settings};
use crate::etcd_cache::{Cache, Cached};

/// HTTP/2 ping interval on the etcd connection: a peer that stops answering for this plus
/// the request timeout is dropped and reconnected, even with no change to deliver.
const KEEPALIVE: Duration = Duration::from_secs(5);
/// First reconnection delay, doubled per failure up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// 500 ms: with the ±20 % jitter a gateway tries again at most 600 ms after its last failed
/// attempt, so it follows etcd again within a second of etcd answering (a 5 s cap made a
/// change pushed right after etcd's restart reach the last of three gateways 4.9 and 5.8 s
/// later). A failed attempt against a down etcd is a refused TCP connection, so two a second
/// per gateway cost etcd's host little; the jitter still spreads a fleet's reconnections
/// over a tenth of a second or more.
const BACKOFF_MAX: Duration = Duration::from_millis(500);
/// About a minute between warnings while etcd stays away, at [`BACKOFF_MAX`] per attempt.
const WARN_EVERY_ATTEMPTS: u32 = 120;

/// What the watcher hands to the main thread.
#[derive(Debug)]
pub(crate) enum Update {
    /// The key's value as of `revision` (its mod revision), not yet parsed.
    Document {
        revision: i64,
        text: Result<String, std::str::Utf8Error>,
    },
    /// The key was deleted at `revision`: the running config keeps serving.
    Deleted { revision: i64 },
}

/// Whether the watcher is connected, and when it last knew it had every change: written by
/// the watcher thread, read by the exporter at scrape.
#[derive(Debug, Default)]
struct SyncState {
    connected: AtomicBool,
    /// Unix time in ms; 0 before the first successful read.
    last_sync_ms: AtomicU64,
    /// Serving the cached revision, etcd not yet reached since the start.
    cached: AtomicBool,
}

impl SyncState {
    fn synced(&self) {
        self.last_sync_ms.store(unix_ms(), Ordering::Relaxed);
    }

    fn set_connected(&self, up: bool) {
        self.synced();
        self.connected.store(up, Ordering::Relaxed);
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The etcd source's metrics (all on the gateway's registry, so on its /metrics).
#[derive(Clone)]
struct EtcdMetrics {
    /// Set by the main thread only (`Gauge::set` is for one writer).
    revision: Gauge,
    last_apply_ok: Gauge,
    invalid: Counter,
    deleted: Counter,
    /// Incremented by the watcher thread.
    connection: Counter,
    /// A failed write of the etcd cache (main thread).
    cache: Counter,
}

impl EtcdMetrics {
    fn register(r: &Registry, state: &Arc<SyncState>) -> anyhow::Result<EtcdMetrics> {
        let errors = r.counter(
            "tailguard_config_etcd_errors",
            "etcd config source errors: a revision rejected as invalid, the key deleted, \
             a failed connection, read or watch, or a failed write of the etcd cache.",
            &["kind"],
        )?;
        let connected = r
            .gauge(
                "tailguard_config_etcd_connected",
                "1 while the watch on the config's etcd key is established.",
                &[],
            )?
            .get_or_create(&[])?;
        let last_sync = r
            .float_gauge(
                "tailguard_config_etcd_last_sync_timestamp_seconds",
                "When this node last knew it had every change of the config's etcd key \
                 (now, while the watch is established).",
                &[],
            )?
            .get_or_create(&[])?;
        let cached = r
            .gauge(
                "tailguard_config_etcd_cached",
                "1 while the node serves the revision in its etcd cache because etcd could \
                 not be reached at its start; 0 once etcd has answered.",
                &[],
            )?
            .get_or_create(&[])?;
        {
            // Read rather than recorded: only the exporter's thread writes these three.
            let state = Arc::clone(state);
            r.on_scrape(move || {
                let up = state.connected.load(Ordering::Relaxed);
                connected.set(i64::from(up));
                cached.set(i64::from(state.cached.load(Ordering::Relaxed)));
                let ms = if up {
                    unix_ms()
                } else {
                    state.last_sync_ms.load(Ordering::Relaxed)
                };
                last_sync.set(ms as f64 / 1000.0);
            });
        }
        Ok(EtcdMetrics {
            revision: r
                .gauge(
                    "tailguard_config_etcd_revision",
                    "etcd revision (the key's mod revision) of the config being served.",
                    &[],
                )?
                .get_or_create(&[])?,
            last_apply_ok: r
                .gauge(
                    "tailguard_config_etcd_last_apply_ok",
                    "1 if the newest revision of the config's etcd key was applied, 0 if it \
                     was rejected (an older revision keeps serving).",
                    &[],
                )?
                .get_or_create(&[])?,
            invalid: errors.get_or_create(&["invalid"])?,
            deleted: errors.get_or_create(&["deleted"])?,
            connection: errors.get_or_create(&["connection"])?,
            cache: errors.get_or_create(&["cache"])?,
        })
    }
}

/// The running etcd source, owned by the main thread.
pub(crate) struct EtcdSource {
    settings: Settings,
    updates: mpsc::UnboundedReceiver<Update>,
    /// A message asks the watcher to read the key afresh (SIGHUP), with the credentials to
    /// reconnect with first if the password changed; dropping it stops the watcher.
    resync: mpsc::UnboundedSender<Option<Credentials>>,
    metrics: EtcdMetrics,
    /// The revision being served.
    applied: i64,
    closed: bool,
    /// Where each applied revision is written; `None` without a cache (or once the default
    /// one could not be written).
    cache: Option<Cache>,
    /// The cache has been written at least once.
    cache_written: bool,
    /// The first document read from etcd, written to the cache once the gateway runs on it.
    first_document: Option<String>,
}

/// The document a gateway starts on.
pub(crate) enum StartDocument {
    /// Read from etcd (at [`EtcdSource::revision`]).
    Etcd(Result<String, std::str::Utf8Error>),
    /// etcd could not be reached within the timeout (`why`): the cached revision (at
    /// [`EtcdSource::revision`]), to be parsed as the file `path`.
    Cached {
        path: PathBuf,
        text: String,
        why: String,
    },
}

/// What the watcher's first attempt found.
enum First {
    Read {
        revision: i64,
        text: Result<String, std::str::Utf8Error>,
    },
    /// etcd answered: the key does not exist.
    Missing(String),
    /// etcd refused the gateway (certificate, password, permission): a setting to fix, so
    /// neither retried nor covered by the cache.
    Refused(String),
    /// etcd did not answer before the timeout. The watcher goes on only if it was told of a
    /// cached revision.
    Unreachable(String),
}

impl EtcdSource {
    /// Starts the watcher thread and waits (up to the settings' timeout, retrying) for the
    /// key's current document, which the caller parses and starts the gateway with; if etcd
    /// cannot be reached by then, the cached revision.
    pub(crate) fn start(
        settings: Settings,
        registry: &Registry,
    ) -> anyhow::Result<(EtcdSource, StartDocument)> {
        let cache = settings.cache.resolve(&settings.key);
        // Read before the watcher starts, which must know whether to go on without etcd.
        let cached = cache.as_ref().map_or(Ok(None), Cache::load);
        let cached_revision = cached
            .as_ref()
            .ok()
            .and_then(|c| c.as_ref())
            .map(|c| c.revision);
        let state = Arc::new(SyncState::default());
        let metrics = EtcdMetrics::register(registry, &state)?;
        let (updates_tx, updates) = mpsc::unbounded_channel();
        let (resync, resync_rx) = mpsc::unbounded_channel();
        let (first_tx, first_rx) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building the etcd watcher's runtime")?;
        let watcher = Watcher {
            settings: settings.clone(),
            updates: updates_tx,
            resync: resync_rx,
            state,
            connection_errors: metrics.connection.clone(),
            next: 0,
            seen: 0,
            last_document: 0,
            resync_pending: false,
            cached_revision,
            read_on_connect: false,
        };
        std::thread::Builder::new()
            .name("tailguard-etcd".into())
            .spawn(move || runtime.block_on(watcher.run(first_tx)))
            .context("starting the etcd watcher thread")?;
        let first = first_rx
            .blocking_recv()
            .context("the etcd watcher thread ended")?;
        let mut source = EtcdSource {
            settings,
            updates,
            resync,
            metrics,
            applied: 0,
            closed: false,
            cache,
            cache_written: false,
            first_document: None,
        };
        let document = match (first, cached) {
            (First::Read { revision, text }, cached) => {
                if let Err(e) = cached {
                    tracing::warn!("tailguard: {e}; replaced by the revision read from etcd");
                }
                source.applied = revision;
                source.first_document = text.as_ref().ok().cloned();
                StartDocument::Etcd(text)
            }
            (First::Missing(e) | First::Refused(e), _) => anyhow::bail!(e),
            (First::Unreachable(why), Ok(Some(Cached { revision, text }))) => {
                source.applied = revision;
                let path = source.cache.as_ref().map(|c| c.path().to_owned());
                StartDocument::Cached {
                    path: path.expect("a cached revision was read from the cache"),
                    text,
                    why,
                }
            }
            (First::Unreachable(why), cached) => {
                let cache = match (&source.cache, cached) {
                    (_, Err(e)) => format!("; the etcd cache cannot be served: {e}"),
                    (Some(c), _) => format!("; no etcd cache at {} yet", c.path().display()),
                    (None, _) => String::new(),
                };
                anyhow::bail!("{why}{cache}")
            }
        };
        Ok((source, document))
    }

    /// Where relative certificate paths resolve.
    pub(crate) fn base_dir(&self) -> &Path {
        &self.settings.base_dir
    }

    /// The name a revision's errors carry.
    pub(crate) fn source_name(&self, revision: i64) -> String {
        self.settings.source_name(revision)
    }

    /// The revision of the document `start` returned, then of the one being served.
    pub(crate) fn revision(&self) -> i64 {
        self.applied
    }

    /// Records that the gateway started on the document `start` returned (and caches it, if
    /// it came from etcd).
    pub(crate) fn started(&mut self) {
        self.metrics.revision.set(self.applied);
        self.metrics.last_apply_ok.set(1);
        if let Some(text) = self.first_document.take() {
            self.write_cache(self.applied, &text);
        }
    }

    /// Writes an applied revision to the cache. On the main thread, never a serving one; the
    /// fsyncs cost a reload a few milliseconds. A failure never stops the gateway: it is
    /// logged and counted, and the default cache is given up at its first failed write.
    fn write_cache(&mut self, revision: i64, text: &str) {
        let Some(cache) = &self.cache else { return };
        match cache.store(revision, text) {
            Ok(()) => self.cache_written = true,
            Err(e) if cache.explicit() || self.cache_written => {
                self.metrics.cache.inc();
                tracing::error!(
                    "tailguard: cannot write the etcd cache {}: {e}; a start while etcd is \
                     unreachable would not serve {}",
                    cache.path().display(),
                    self.source_name(revision)
                );
            }
            Err(e) => {
                self.metrics.cache.inc();
                tracing::warn!(
                    "tailguard: cannot write the etcd cache {} ({e}); running without one \
                     (set `[etcd] cache` or --etcd-cache, or `cache = \"\"` to say so)",
                    cache.path().display()
                );
                self.cache = None;
            }
        }
    }

    /// The next update; never resolves once the watcher has gone.
    pub(crate) async fn next(&mut self) -> Update {
        if !self.closed {
            if let Some(u) = self.updates.recv().await {
                return u;
            }
            self.closed = true;
            tracing::error!(
                "tailguard: the etcd watcher stopped; the running config keeps serving"
            );
        }
        std::future::pending().await
    }

    /// SIGHUP: read the key afresh and apply it even if its revision is the one running
    /// (certificate files are read again, and so is the etcd password file).
    pub(crate) fn resync(&mut self) {
        tracing::info!(
            "tailguard: SIGHUP: reading etcd:{} afresh",
            self.settings.key
        );
        let credentials = self.settings.reread_password();
        let _ = self.resync.send(credentials);
    }

    /// Applies an update through the reload path. `parse` turns a document into a config
    /// (the command line's overrides included).
    pub(crate) fn apply(
        &mut self,
        server: &Server,
        update: Update,
        parse: impl FnOnce(&str, &str, &Path) -> Result<Config, Error>,
    ) {
        let (revision, text) = match update {
            Update::Document { revision, text } => (revision, text),
            Update::Deleted { revision } => {
                self.metrics.deleted.inc();
                tracing::warn!(
                    "tailguard: etcd key {} deleted at revision {revision}; the running config \
                     (revision {}) keeps serving",
                    self.settings.key,
                    self.applied
                );
                return;
            }
        };
        let name = self.source_name(revision);
        let loaded = match &text {
            Ok(text) => parse(text, &name, &self.settings.base_dir),
            Err(e) => Err(Error::Config(vec![Diagnostic {
                file: name.clone(),
                position: None,
                field: "(document)".to_owned(),
                message: format!("not UTF-8 text: {e}"),
            }])),
        };
        let running = format!("etcd revision {}", self.applied);
        if crate::apply::apply(server, &name, &running, loaded) {
            self.applied = revision;
            self.metrics.revision.set(revision);
            self.metrics.last_apply_ok.set(1);
            if let Ok(text) = &text {
                self.write_cache(revision, text);
            }
        } else {
            self.metrics.invalid.inc();
            self.metrics.last_apply_ok.set(0);
        }
    }
}

/// Why a watch ended.
enum Ended {
    /// The main thread has gone: stop.
    Shutdown,
    /// Reconnect at once (the watch was compacted and the key read afresh, or the password
    /// changed).
    Rewatch,
    /// Connection, read or watch failure: back off, then reconnect.
    Lost(String),
}

/// The watcher thread's state.
struct Watcher {
    settings: Settings,
    updates: mpsc::UnboundedSender<Update>,
    resync: mpsc::UnboundedReceiver<Option<Credentials>>,
    state: Arc<SyncState>,
    connection_errors: Counter,
    /// The store revision the next watch starts at.
    next: i64,
    /// Every change up to this store revision has been sent (by an event or a read): older
    /// events a watch still delivers are skipped, so a config never goes back in time.
    seen: i64,
    /// The mod revision of the last document sent, 0 after a deletion (so a read after a
    /// compaction sends nothing twice).
    last_document: i64,
    /// A SIGHUP came while etcd was unreachable: read the key once reconnected.
    resync_pending: bool,
    /// The revision in the etcd cache, if there is one the start may serve.
    cached_revision: Option<i64>,
    /// Started on the cached revision: read the key once connected, and send it if it
    /// changed.
    read_on_connect: bool,
}

impl Watcher {
    async fn run(mut self, first: oneshot::Sender<First>) {
        let found = self.initial().await;
        let go_on = match (&found, self.cached_revision) {
            (First::Read { .. }, _) => true,
            (First::Unreachable(_), Some(revision)) => {
                // The main thread serves the cached revision: follow etcd once it answers.
                self.last_document = revision;
                self.read_on_connect = true;
                self.state.cached.store(true, Ordering::Relaxed);
                self.connection_errors.inc();
                true
            }
            _ => false,
        };
        if first.send(found).is_err() || !go_on {
            return;
        }
        self.watch_forever().await;
    }

    /// Reads the key, retrying until the timeout: a node starts only with a config.
    async fn initial(&mut self) -> First {
        let deadline = Instant::now() + self.settings.timeout;
        let mut backoff = Backoff::default();
        loop {
            let attempt = async {
                let mut client = connect(&self.settings).await?;
                read(&mut client, &self.settings.key).await
            };
            let last_error = match timeout_at(deadline, attempt).await {
                Ok((store_revision, Some(kv))) => {
                    self.next = store_revision + 1;
                    self.seen = store_revision;
                    self.last_document = kv.mod_revision;
                    self.state.synced();
                    return First::Read {
                        revision: kv.mod_revision,
                        text: document(&kv),
                    };
                }
                Ok((store_revision, None)) => {
                    return First::Missing(format!(
                        "etcd key {} does not exist (etcd revision {store_revision}); store a \
                         config there first: tailguard config push FILE --etcd URL --etcd-key {}",
                        self.settings.key, self.settings.key
                    ));
                }
                Err(e) if e.refusal.is_some() => {
                    return First::Refused(format!(
                        "cannot read {} from etcd at {}: {e}",
                        self.settings.key,
                        self.settings.endpoints.join(","),
                    ));
                }
                Err(e) => e,
            };
            let wait = backoff.next();
            if Instant::now() + wait >= deadline {
                return First::Unreachable(format!(
                    "cannot read {} from etcd at {} within {} ms: {last_error}",
                    self.settings.key,
                    self.settings.endpoints.join(","),
                    self.settings.timeout.as_millis()
                ));
            }
            sleep(wait).await;
        }
    }

    async fn watch_forever(&mut self) {
        let mut backoff = Backoff::default();
        loop {
            let ended = self.watch_once(&mut backoff).await;
            self.state.set_connected(false);
            match ended {
                Ended::Shutdown => return,
                Ended::Rewatch => continue,
                Ended::Lost(why) => {
                    self.connection_errors.inc();
                    // The first failure, then one line a minute or so while etcd stays away,
                    // not one per attempt.
                    let attempts = backoff.failures + 1;
                    if attempts == 1 || attempts % WARN_EVERY_ATTEMPTS == 0 {
                        tracing::warn!(
                            "tailguard: etcd watch on {} lost ({why}; {attempts} attempts); the \
                             running config keeps serving; reconnecting",
                            self.settings.key
                        );
                    } else {
                        tracing::debug!("tailguard: etcd: {why}");
                    }
                }
            }
            // Wait, but stay answerable: a SIGHUP now is served once reconnected.
            let wake = sleep(backoff.next());
            tokio::pin!(wake);
            loop {
                tokio::select! {
                    () = &mut wake => break,
                    r = self.resync.recv() => match r {
                        None => return,
                        Some(credentials) => {
                            tracing::warn!(
                                "tailguard: etcd is unreachable; the key is read once reconnected"
                            );
                            self.settings.credentials = credentials.or(self.settings.credentials.take());
                            self.resync_pending = true;
                        }
                    },
                }
            }
        }
    }

    /// One connection: watch from `self.next` until the stream fails or we are told to stop.
    async fn watch_once(&mut self, backoff: &mut Backoff) -> Ended {
        let key = self.settings.key.clone();
        let t = self.settings.timeout;
        let mut client = match timeout_at(Instant::now() + t, connect(&self.settings)).await {
            Ok(c) => c,
            Err(e) => return Ended::Lost(e.to_string()),
        };
        let create = WatchCreateRequest {
            key: key.as_bytes().to_vec(),
            start_revision: self.next,
            ..WatchCreateRequest::default()
        };
        let mut stream = match timeout(t, client.watch(create)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Ended::Lost(format!("watch: {e}")),
            Err(_) => return Ended::Lost(format!("watch: no answer within {} ms", t.as_millis())),
        };
        // etcd answers a new watch with a `created` message: only then is it established.
        let mut established = false;
        loop {
            let message = if established {
                tokio::select! {
                    m = stream.message() => m,
                    r = self.resync.recv() => match r {
                        None => return Ended::Shutdown,
                        Some(None) => {
                            if let Err(e) = self.reread(&mut client, true).await {
                                return Ended::Lost(e);
                            }
                            continue;
                        }
                        // A new password: a new connection authenticates with it, then reads.
                        Some(credentials) => {
                            self.settings.credentials = credentials;
                            self.resync_pending = true;
                            return Ended::Rewatch;
                        }
                    },
                }
            } else {
                match timeout(t, stream.message()).await {
                    Ok(m) => m,
                    Err(_) => {
                        return Ended::Lost(format!(
                            "watch not created within {} ms",
                            t.as_millis()
                        ));
                    }
                }
            };
            let response = match message {
                Ok(Some(r)) => r,
                Ok(None) => return Ended::Lost("watch stream closed".to_owned()),
                Err(e) => return Ended::Lost(e.to_string()),
            };
            if response.compact_revision > 0 {
                // Revisions up to compact_revision are gone: read the present state instead
                // of replaying history (etcd has cancelled this watch).
                tracing::warn!(
                    "tailguard: etcd revision {} of {key} is compacted (compacted up to {}); \
                     reading the key afresh",
                    self.next,
                    response.compact_revision
                );
                return match self.reread(&mut client, false).await {
                    Ok(()) => Ended::Rewatch,
                    Err(e) => Ended::Lost(e),
                };
            }
            if response.canceled {
                return Ended::Lost(format!(
                    "watch cancelled by etcd: {}",
                    response.cancel_reason
                ));
            }
            if !established {
                established = true;
                backoff.reset();
                self.state.set_connected(true);
                if self.next == 0 {
                    // Started on the cached revision: the read below finds where etcd is.
                    tracing::info!("tailguard: watching etcd:{key} from its current revision");
                } else {
                    tracing::info!("tailguard: watching etcd:{key} from revision {}", self.next);
                }
                let resync = std::mem::take(&mut self.resync_pending);
                let first_contact = std::mem::take(&mut self.read_on_connect);
                if resync || first_contact {
                    if let Err(e) = self.reread(&mut client, resync).await {
                        // Not done: done at the next connection.
                        self.resync_pending = resync;
                        self.read_on_connect = first_contact;
                        return Ended::Lost(e);
                    }
                    if first_contact {
                        self.state.cached.store(false, Ordering::Relaxed);
                        tracing::info!(
                            "tailguard: etcd answered: following etcd:{key} (the cached \
                             revision {} served until now)",
                            self.cached_revision.unwrap_or_default()
                        );
                    }
                }
            }
            for event in &response.events {
                let Some(kv) = &event.kv else { continue };
                // Already covered by a read of the key at a later store revision.
                if kv.mod_revision <= self.seen {
                    continue;
                }
                self.seen = kv.mod_revision;
                self.next = self.next.max(kv.mod_revision + 1);
                let update = match event.r#type() {
                    EventType::Put => {
                        self.last_document = kv.mod_revision;
                        Update::Document {
                            revision: kv.mod_revision,
                            text: document(kv),
                        }
                    }
                    EventType::Delete => {
                        self.last_document = 0;
                        Update::Deleted {
                            revision: kv.mod_revision,
                        }
                    }
                };
                if self.updates.send(update).is_err() {
                    return Ended::Shutdown;
                }
            }
            self.state.synced();
        }
    }

    /// Reads the key now and sends it (`always`: SIGHUP; else only if it changed, after a
    /// compaction), then moves the watch start past the read.
    async fn reread(&mut self, client: &mut Client, always: bool) -> Result<(), String> {
        let authentications = client.authentications();
        let (store_revision, kv) = timeout_at(
            Instant::now() + self.settings.timeout,
            read(client, &self.settings.key),
        )
        .await?;
        if authentications > 0 && client.authentications() > authentications {
            tracing::info!("tailguard: etcd auth token expired and was renewed; the watch stays");
        }
        self.next = self.next.max(store_revision + 1);
        self.seen = self.seen.max(store_revision);
        self.state.synced();
        let current = kv.as_ref().map_or(0, |kv| kv.mod_revision);
        if !always && current == self.last_document {
            return Ok(());
        }
        self.last_document = current;
        let update = match kv {
            Some(kv) => Update::Document {
                revision: kv.mod_revision,
                text: document(&kv),
            },
            None => Update::Deleted {
                revision: store_revision,
            },
        };
        // The main thread has gone if this fails; the next receive ends the watcher.
        let _ = self.updates.send(update);
        Ok(())
    }
}

fn document(kv: &KeyValue) -> Result<String, std::str::Utf8Error> {
    std::str::from_utf8(&kv.value).map(str::to_owned)
}

/// A client for the settings' endpoints. Cheap: it connects lazily, on the first request.
pub(crate) async fn connect(settings: &Settings) -> Result<Client, Failure> {
    // Pings even while idle (between changes, a watch is an idle stream).
    let mut options = ConnectOptions::new()
        .with_connect_timeout(settings.timeout)
        .with_keep_alive(KEEPALIVE, settings.timeout);
    if let Some(tls) = &settings.tls {
        options = options.with_tls(tls.clone());
    }
    if let Some(c) = &settings.credentials {
        options = options.with_credentials(c.username.clone(), c.password.clone());
    }
    Client::connect(&settings.endpoints, &options)
        .await
        .map_err(|e| Failure::from_etcd("connect", &e))
}

/// The key's value (if it exists) and the store's revision at the read.
pub(crate) async fn read(
    client: &mut Client,
    key: &str,
) -> Result<(i64, Option<KeyValue>), Failure> {
    let response = client
        .get(key)
        .await
        .map_err(|e| Failure::from_etcd(&format!("read {key}"), &e))?;
    Ok((response.revision(), response.into_first()))
}

/// Why an etcd call failed, and whether etcd refused this node (so only a change of
/// settings, not a retry, can help).
#[derive(Debug)]
pub(crate) struct Failure {
    message: String,
    pub(crate) refusal: Option<Refusal>,
}

impl Failure {
    /// `what` failed with `e`; a refusal's message ends with the setting to look at.
    pub(crate) fn from_etcd(what: &str, e: &tailguard_etcd::Error) -> Failure {
        let refusal = e.refusal();
        let hint = refusal.map_or("", hint);
        Failure {
            message: format!("{what}: {e}{hint}"),
            refusal,
        }
    }
}

/// What to check for each refusal, in the bootstrap file's keys and the flags' names.
fn hint(refusal: Refusal) -> &'static str {
    match refusal {
        Refusal::ClientCertificateRequired => {
            "; give one: tls.cert and tls.key in [etcd], or --etcd-cert and --etcd-cert-key"
        }
        Refusal::ClientCertificateRejected => {
            "; is it signed by the CA etcd trusts (its --trusted-ca-file)?"
        }
        Refusal::UntrustedServer => {
            "; is tls.ca (--etcd-ca) the CA that signed etcd's certificate?"
        }
        Refusal::UntrustedServerSystemRoots => {
            "; name the CA that signed etcd's certificate: tls.ca in [etcd], or --etcd-ca"
        }
        Refusal::WrongPassword => {
            "; check username and password_file (--etcd-username, --etcd-password-file)"
        }
        Refusal::AuthenticationRequired => {
            "; give username and password_file in [etcd], or --etcd-username and \
             --etcd-password-file"
        }
        Refusal::PermissionDenied => "; grant the user access to the key",
        _ => "",
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure {
            message,
            refusal: None,
        }
    }
}

impl From<Failure> for String {
    fn from(f: Failure) -> String {
        f.message
    }
}

/// `future` with a deadline, its error and the timeout's as one message.
async fn timeout_at<T, E: From<String>>(
    deadline: Instant,
    future: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    match tokio::time::timeout_at(deadline, future).await {
        Ok(r) => r,
        Err(_) => Err(E::from("no answer before the timeout".to_owned())),
    }
}

/// Exponential backoff with ±20 % jitter, so a fleet does not reconnect in step.
#[derive(Debug, Default)]
struct Backoff {
    failures: u32,
}

impl Backoff {
    fn next(&mut self) -> Duration {
        let base = BACKOFF_MIN
            .saturating_mul(1 << self.failures.min(16))
            .min(BACKOFF_MAX);
        self.failures = self.failures.saturating_add(1);
        base.mul_f64(0.8 + 0.4 * fastrand::f64())
    }

    fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reconnect_backoff_doubles_from_100ms_to_a_500ms_cap_with_its_jitter() {
        let mut backoff = Backoff::default();
        let first: Vec<Duration> = (0..3).map(|_| backoff.next()).collect();
        for (wait, base) in first.iter().zip([100, 200, 400]) {
            let base = Duration::from_millis(base);
            assert!(
                *wait >= base.mul_f64(0.8) && *wait <= base.mul_f64(1.2),
                "{wait:?}"
            );
        }
        // However long etcd stays away: never more than 600 ms, and still spread.
        let capped: Vec<Duration> = (0..1000).map(|_| backoff.next()).collect();
        let (min, max) = (capped.iter().min().unwrap(), capped.iter().max().unwrap());
        assert!(*min >= Duration::from_millis(400), "{min:?}");
        assert!(*max <= Duration::from_millis(600), "{max:?}");
        assert!(
            *max - *min > Duration::from_millis(100),
            "no jitter: {min:?}..{max:?}"
        );
        backoff.reset();
        assert!(backoff.next() <= Duration::from_millis(120));
    }
}

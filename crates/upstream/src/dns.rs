//! Endpoints by DNS name: resolved by one thread per gateway (never a serving thread),
//! re-resolved every `dns_refresh_ms` and when an answer's TTL runs out; a changed set of
//! addresses rebuilds the snapshot the way a reload does.
//!
//! How it fits together: every name the config uses is kept in [`Names`], the last good
//! answer of each with its error if the latest lookup failed. A snapshot build reads it to
//! turn a named endpoint into one endpoint per address (each with the name's weight). The
//! resolver thread owns a hickory resolver on its own current-thread runtime and keeps a
//! schedule of the names in the running config; when a lookup changes an answer it calls the
//! [`OnChange`] handed to `Resolver::watch`: the gateway's `refresh_endpoints`, which
//! rebuilds the snapshot from the same config (pools,
//! breakers and health of unchanged addresses are carried over, as on a reload). A failed
//! lookup keeps the last good answer; a name that never resolved leaves its upstream
//! without endpoints, and the upstream answers 503 with the resolver's error as the reason.
//!
//! Why hickory and not `getaddrinfo` on a blocking thread: the answer's TTL is needed to
//! re-resolve when it expires, and the name servers must be configurable (`[dns] servers`,
//! which the tests point at a responder of their own); libc gives neither. The hosts file
//! (`[dns] hosts_file`, `/etc/hosts` by default) is read first either way, so `localhost`
//! resolves with no name server. As glibc does, the thread reads it again when it changed
//! (its modification time, size or inode): container platforms write service names there,
//! and hickory alone would read it once, when the resolver is built.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use hickory_resolver::config::{
    ConnectionConfig, NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::{Hosts, TokioResolver};
use tailguard_metrics::{Counter, Family, Gauge, Registry};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::UpstreamError;
use tailguard_config::Config;

pub use tailguard_config::dns::{DnsConfig, Target};

/// The names a config's endpoints use, with the shortest refresh interval asked of each.
pub(crate) fn names_in(config: &Config) -> HashMap<String, Duration> {
    let mut names = HashMap::new();
    for u in &config.upstreams {
        let refresh = Duration::from_millis(u.dns_refresh_ms.max(1));
        for e in &u.endpoints {
            if let Ok(Target::Name { host, .. }) = Target::parse(e.address.get_ref()) {
                names
                    .entry(host)
                    .and_modify(|r: &mut Duration| *r = (*r).min(refresh))
                    .or_insert(refresh);
            }
        }
    }
    names
}

/// What is known of one name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolution {
    /// The last good answer, sorted (empty if the name never resolved).
    pub addrs: Vec<IpAddr>,
    /// Why the latest lookup failed, if it did.
    pub error: Option<String>,
}

/// The last answer for each name: written by the resolver thread, read when a snapshot is
/// built (a reload or a refresh). Never touched by a serving thread.
#[derive(Debug, Default)]
pub struct Names {
    answers: Mutex<HashMap<String, Resolution>>,
}

impl Names {
    /// What is known of `host` (`None`: never looked up).
    pub fn get(&self, host: &str) -> Option<Resolution> {
        self.lock().get(host).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Resolution>> {
        // Only whole entries are inserted: a panic cannot leave one half-written.
        self.answers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a lookup's result; returns whether the usable addresses changed.
    fn record(&self, host: &str, result: Result<Vec<IpAddr>, String>) -> bool {
        let mut answers = self.lock();
        let entry = answers.entry(host.to_owned()).or_default();
        match result {
            Ok(addrs) => {
                entry.error = None;
                if entry.addrs == addrs {
                    false
                } else {
                    entry.addrs = addrs;
                    true
                }
            }
            Err(e) => {
                entry.error = Some(e);
                false
            }
        }
    }

    fn forget_except(&self, keep: &HashMap<String, Duration>) {
        self.lock().retain(|host, _| keep.contains_key(host));
    }
}

/// The resolver's metric families.
#[derive(Debug, Clone)]
struct DnsMetrics {
    lookups: Family<Counter>,
    addresses: Family<Gauge>,
}

impl DnsMetrics {
    fn register(registry: &Registry) -> Result<DnsMetrics, UpstreamError> {
        let internal =
            |e: tailguard_metrics::MetricsError| UpstreamError::Internal(format!("metrics: {e}"));
        Ok(DnsMetrics {
            lookups: registry
                .counter(
                    "tailguard_dns_lookups",
                    "Lookups of endpoint names, by name and result (ok, changed, failed).",
                    &["name", "result"],
                )
                .map_err(internal)?,
            addresses: registry
                .gauge(
                    "tailguard_dns_addresses",
                    "Addresses of each endpoint name in use (the last good answer).",
                    &["name"],
                )
                .map_err(internal)?,
        })
    }

    fn lookup(&self, host: &str, result: &str) {
        if let Ok(c) = self.lookups.get_or_create(&[host, result]) {
            c.inc();
        }
    }

    fn addresses(&self, host: &str, n: usize) {
        if let Ok(g) = self.addresses.get_or_create(&[host]) {
            g.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}

/// What the resolver thread calls when a watched name's addresses changed: the layer above
/// rebuilds its endpoints (holding itself weakly in it, so the thread never keeps it alive).
pub type OnChange = Box<dyn Fn() + Send>;

enum Command {
    /// Look these names up now and say when done (a build is waiting for them).
    Resolve(Vec<String>, std::sync::mpsc::Sender<()>),
    /// The running config's names and resolver settings, and whom to tell of a change.
    Watch {
        names: HashMap<String, Duration>,
        dns: DnsConfig,
        on_change: OnChange,
    },
}

/// The resolver thread and the answers it keeps. Dropping it stops the thread.
#[derive(Debug)]
pub struct Resolver {
    names: Arc<Names>,
    commands: Option<mpsc::UnboundedSender<Command>>,
    thread: Option<std::thread::JoinHandle<()>>,
    budget: Mutex<Duration>,
}

impl Resolver {
    /// Starts the resolver thread with `[dns]` settings.
    pub fn start(dns: &DnsConfig, registry: &Registry) -> Result<Resolver, UpstreamError> {
        let names = Arc::new(Names::default());
        let metrics = DnsMetrics::register(registry)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| UpstreamError::Internal(format!("dns runtime: {e}")))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let thread = {
            let names = Arc::clone(&names);
            let dns = dns.clone();
            std::thread::Builder::new()
                .name("tailguard-dns".into())
                .spawn(move || runtime.block_on(run(rx, names, dns, metrics)))
                .map_err(|e| UpstreamError::Internal(format!("dns thread: {e}")))?
        };
        Ok(Resolver {
            names,
            commands: Some(tx),
            thread: Some(thread),
            budget: Mutex::new(dns.lookup_budget()),
        })
    }

    /// The answers.
    pub fn names(&self) -> &Names {
        &self.names
    }

    /// Looks up the names of `config` not looked up before, and waits for them (at most one
    /// lookup's time budget): called before a snapshot is built, off the request path.
    pub fn resolve_new(&self, config: &Config) {
        let wanted: Vec<String> = names_in(config)
            .into_keys()
            .filter(|host| self.names.get(host).is_none())
            .collect();
        if wanted.is_empty() {
            return;
        }
        let budget = config_budget(config, &self.budget);
        let (done, wait) = std::sync::mpsc::channel();
        if let Some(commands) = &self.commands
            && commands.send(Command::Resolve(wanted, done)).is_ok()
        {
            // A timeout leaves the names unresolved for this build; the thread goes on and
            // a refresh brings them in when they answer.
            let _ = wait.recv_timeout(budget);
        }
    }

    /// Follows `config`'s names from now on, calling `on_change` when an answer changes.
    pub fn watch(&self, config: &Config, on_change: OnChange) {
        let names = names_in(config);
        self.names.forget_except(&names);
        if let Some(commands) = &self.commands {
            let _ = commands.send(Command::Watch {
                names,
                dns: config.dns.clone(),
                on_change,
            });
        }
    }
}

fn config_budget(config: &Config, budget: &Mutex<Duration>) -> Duration {
    let mut b = budget
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *b = config.dns.lookup_budget();
    *b
}

impl Drop for Resolver {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop.
        self.commands = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Re-resolves no sooner than this after an answer whose TTL is shorter (0 included), so a
/// name with a tiny TTL is not looked up in a loop.
const MIN_TTL_WAIT: Duration = Duration::from_secs(1);

/// A name the running config uses.
#[derive(Debug)]
struct Watched {
    refresh: Duration,
    next: Instant,
}

fn build_resolver(dns: &DnsConfig) -> Result<TokioResolver, String> {
    let servers = dns.server_addrs();
    let mut builder = if servers.is_empty() {
        TokioResolver::builder_tokio().map_err(|e| format!("reading /etc/resolv.conf: {e}"))?
    } else {
        let name_servers = servers
            .iter()
            .map(|addr| {
                let mut udp = ConnectionConfig::udp();
                udp.port = addr.port();
                let mut tcp = ConnectionConfig::tcp();
                tcp.port = addr.port();
                NameServerConfig::new(addr.ip(), true, vec![udp, tcp])
            })
            .collect();
        TokioResolver::builder_with_config(
            ResolverConfig::from_name_servers(name_servers),
            TokioRuntimeProvider::default(),
        )
    };
    let mut opts = ResolverOpts::default();
    opts.timeout = Duration::from_millis(dns.timeout_ms.max(1));
    opts.attempts = dns.attempts.max(1);
    // Our own schedule decides when to ask again (refresh interval, TTL); a cache in front
    // of the server would hide a changed answer until its TTL ran out.
    opts.cache_size = 0;
    // The hosts file is ours to read (`HostsFile`), from the configured path and again when
    // it changes; hickory would read /etc/hosts once, here.
    opts.use_hosts_file = ResolveHosts::Never;
    *builder.options_mut() = opts;
    builder.build().map_err(|e| e.to_string())
}

/// What the resolver answers from: hickory's resolver and the hosts file it is given.
struct Source {
    resolver: Result<TokioResolver, String>,
    hosts: HostsFile,
}

impl Source {
    fn new(dns: &DnsConfig) -> Source {
        let resolver = build_resolver(dns);
        if let Err(e) = &resolver {
            tracing::error!(target: "tailguard::dns", "cannot build the resolver: {e}");
        }
        Source {
            resolver,
            hosts: HostsFile::new(dns.hosts_path()),
        }
    }

    /// Gives the resolver the hosts file again if it changed since it was last read: called
    /// before every batch of lookups, so a changed entry is followed as soon as its name is
    /// looked up again (every `dns_refresh_ms`).
    fn refresh_hosts(&mut self) {
        if let Ok(resolver) = &mut self.resolver
            && let Some(hosts) = self.hosts.read_if_changed()
        {
            resolver.set_hosts(Arc::new(hosts));
        }
    }
}

/// What identifies one version of the hosts file: a file edited in place gets a new
/// modification time (and often a new size); one replaced by a rename, as editors and
/// container platforms do, gets a new inode.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

impl FileStamp {
    fn of(meta: &std::fs::Metadata) -> FileStamp {
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(meta);
        #[cfg(not(unix))]
        let inode = 0;
        FileStamp {
            modified: meta.modified().ok(),
            len: meta.len(),
            inode,
        }
    }
}

/// The hosts file and the version of it the resolver was last given.
#[derive(Debug)]
struct HostsFile {
    path: PathBuf,
    /// The version last read; `None` before the first read and while the file cannot be
    /// read (each lookup batch tries again).
    read: Option<FileStamp>,
    /// Why the last attempt failed, so the same failure is logged once.
    error: Option<String>,
}

impl HostsFile {
    fn new(path: &Path) -> HostsFile {
        HostsFile {
            path: path.to_owned(),
            read: None,
            error: None,
        }
    }

    /// The file's entries if it changed since the last read (the first call reads it). A
    /// file that cannot be read has no entries, as for glibc: names go to the name servers.
    /// One `stat` when nothing changed.
    fn read_if_changed(&mut self) -> Option<Hosts> {
        let read = std::fs::metadata(&self.path)
            .map(|meta| FileStamp::of(&meta))
            .and_then(|stamp| {
                if self.read.as_ref() == Some(&stamp) {
                    return Ok(None);
                }
                let mut hosts = Hosts::default();
                hosts.read_hosts_conf(std::fs::File::open(&self.path)?)?;
                Ok(Some((stamp, hosts)))
            });
        match read {
            Ok(None) => None,
            Ok(Some((stamp, hosts))) => {
                if self.read.is_some() || self.error.is_some() {
                    tracing::info!(
                        target: "tailguard::dns",
                        path = %self.path.display(),
                        "the hosts file changed; read it again"
                    );
                }
                (self.read, self.error) = (Some(stamp), None);
                Some(hosts)
            }
            Err(e) => {
                let e = e.to_string();
                if self.error.as_ref() != Some(&e) {
                    tracing::warn!(
                        target: "tailguard::dns",
                        path = %self.path.display(),
                        "cannot read the hosts file, resolving without it: {e}"
                    );
                }
                let had_entries = self.read.take().is_some();
                self.error = Some(e);
                // Entries of a file that is gone are forgotten once.
                had_entries.then(Hosts::default)
            }
        }
    }
}

/// Looks `host` up: its addresses sorted and deduplicated, and until when they are valid.
async fn lookup(resolver: &TokioResolver, host: &str) -> Result<(Vec<IpAddr>, Instant), String> {
    // A trailing dot: the name is absolute, no search domains are tried.
    let answer = resolver
        .lookup_ip(format!("{host}."))
        .await
        .map_err(|e| e.to_string())?;
    let mut addrs: Vec<IpAddr> = answer.iter().collect();
    addrs.sort_unstable();
    addrs.dedup();
    if addrs.is_empty() {
        return Err("no addresses in the answer".to_owned());
    }
    Ok((addrs, Instant::from_std(answer.valid_until())))
}

/// The resolver thread: answers `Resolve` commands at once and re-resolves watched names
/// when they are due.
async fn run(
    mut commands: mpsc::UnboundedReceiver<Command>,
    names: Arc<Names>,
    mut dns: DnsConfig,
    metrics: DnsMetrics,
) {
    let mut source = Source::new(&dns);
    let mut watched: HashMap<String, Watched> = HashMap::new();
    let mut on_change: OnChange = Box::new(|| {}); // Nobody to tell before the first `Watch`.
    // When each name's last answer expires (its TTL), kept for names not yet watched.
    let mut expiry: HashMap<String, Instant> = HashMap::new();
    loop {
        let next = watched.values().map(|w| w.next).min();
        let command = match next {
            Some(at) => tokio::select! {
                c = commands.recv() => Some(c),
                () = tokio::time::sleep_until(at) => None,
            },
            None => Some(commands.recv().await),
        };
        match command {
            // The gateway dropped its resolver.
            Some(None) => return,
            Some(Some(Command::Resolve(hosts, done))) => {
                // No refresh on a change: the build that asked comes next and reads it.
                resolve_all(
                    &mut source,
                    &hosts,
                    &names,
                    &metrics,
                    &mut watched,
                    &mut expiry,
                )
                .await;
                let _ = done.send(());
            }
            Some(Some(Command::Watch {
                names: wanted,
                dns: new_dns,
                on_change: tell,
            })) => {
                on_change = tell;
                let mut resolve_now = Vec::new();
                if !new_dns.same_as(&dns) {
                    dns = new_dns;
                    source = Source::new(&dns);
                    // New servers may answer differently: ask them now.
                    resolve_now.extend(wanted.keys().cloned());
                }
                let now = Instant::now();
                watched.retain(|host, _| wanted.contains_key(host));
                expiry.retain(|host, _| wanted.contains_key(host));
                for (host, refresh) in wanted {
                    let first = next_lookup(now, refresh, expiry.get(&host).copied());
                    let w = watched.entry(host.clone()).or_insert(Watched {
                        refresh,
                        next: first,
                    });
                    if refresh < w.refresh {
                        w.next = w.next.min(now + refresh);
                    }
                    w.refresh = refresh;
                    if names.get(&host).is_none() {
                        resolve_now.push(host);
                    }
                }
                resolve_now.sort_unstable();
                resolve_now.dedup();
                if !resolve_now.is_empty()
                    && resolve_all(
                        &mut source,
                        &resolve_now,
                        &names,
                        &metrics,
                        &mut watched,
                        &mut expiry,
                    )
                    .await
                {
                    on_change();
                }
            }
            None => {
                let now = Instant::now();
                let due: Vec<String> = watched
                    .iter()
                    .filter(|(_, w)| w.next <= now)
                    .map(|(h, _)| h.clone())
                    .collect();
                if resolve_all(
                    &mut source,
                    &due,
                    &names,
                    &metrics,
                    &mut watched,
                    &mut expiry,
                )
                .await
                {
                    on_change();
                }
            }
        }
    }
}

/// When to look a name up next: after `refresh`, or when its answer expires if sooner (but
/// not sooner than [`MIN_TTL_WAIT`]).
fn next_lookup(now: Instant, refresh: Duration, valid_until: Option<Instant>) -> Instant {
    let ttl = valid_until.map_or(refresh, |until| {
        until.saturating_duration_since(now).max(MIN_TTL_WAIT)
    });
    now + refresh.min(ttl)
}

/// Looks up `hosts` together, records the answers and schedules each name's next lookup;
/// returns whether any name's addresses changed.
async fn resolve_all(
    source: &mut Source,
    hosts: &[String],
    names: &Names,
    metrics: &DnsMetrics,
    watched: &mut HashMap<String, Watched>,
    expiry: &mut HashMap<String, Instant>,
) -> bool {
    source.refresh_hosts();
    let resolver = &source.resolver;
    let lookups = hosts.iter().map(|host| async move {
        let result = match resolver {
            Ok(r) => lookup(r, host).await,
            Err(e) => Err(format!("no resolver: {e}")),
        };
        (host, result)
    });
    let results = futures_util::future::join_all(lookups).await;
    let now = Instant::now();
    let mut any_changed = false;
    for (host, result) in results {
        let previous = names.get(host);
        let (recorded, valid_until) = match result {
            Ok((addrs, until)) => (Ok(addrs), Some(until)),
            Err(e) => (Err(e), None),
        };
        if let Some(until) = valid_until {
            expiry.insert(host.clone(), until);
        }
        let failed = recorded.as_ref().err().cloned();
        let changed = names.record(host, recorded);
        any_changed |= changed;
        let current = names.get(host).unwrap_or_default();
        metrics.addresses(host, current.addrs.len());
        match (&failed, changed) {
            (Some(e), _) => {
                metrics.lookup(host, "failed");
                let kept = current.addrs.len();
                // Logged once per change of error, not on every retry of a name that stays
                // down.
                if previous.as_ref().and_then(|p| p.error.as_ref()) != Some(e) {
                    tracing::warn!(
                        target: "tailguard::dns",
                        name = %host,
                        kept,
                        "lookup failed, keeping the last good answer ({kept} addresses): {e}"
                    );
                }
            }
            (None, true) => {
                metrics.lookup(host, "changed");
                tracing::info!(
                    target: "tailguard::dns",
                    name = %host,
                    addresses = ?current.addrs,
                    "name resolved to a new set of addresses"
                );
            }
            (None, false) => metrics.lookup(host, "ok"),
        }
        if let Some(w) = watched.get_mut(host) {
            w.next = if failed.is_some() && current.addrs.is_empty() {
                // A name that never resolved is asked again sooner than its refresh.
                now + w.refresh.min(MIN_TTL_WAIT)
            } else {
                next_lookup(now, w.refresh, valid_until)
            };
        }
    }
    any_changed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_file_is_read_again_only_when_it_changed_and_forgotten_when_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("hosts");
        let mut file = HostsFile::new(&path);
        let a = |hosts: &Hosts| {
            let query = hickory_resolver::proto::op::Query::query(
                "svc.test.".parse().expect("name"),
                hickory_resolver::proto::rr::RecordType::A,
            );
            hosts.lookup_static_host(&query).map(|l| {
                l.answers()
                    .iter()
                    .filter_map(|r| r.data.ip_addr())
                    .collect::<Vec<_>>()
            })
        };
        // No file yet: nothing to give (and nothing to forget).
        assert!(file.read_if_changed().is_none());
        std::fs::write(&path, "10.0.0.1 svc.test\n").expect("write");
        let hosts = file.read_if_changed().expect("first read");
        assert_eq!(a(&hosts), Some(vec!["10.0.0.1".parse().expect("ip")]));
        assert!(
            file.read_if_changed().is_none(),
            "unchanged: one stat, no read"
        );
        // Replaced by a rename: same size, new inode.
        let next = dir.path().join("next");
        std::fs::write(&next, "10.0.0.2 svc.test\n").expect("write");
        std::fs::rename(&next, &path).expect("rename");
        let hosts = file.read_if_changed().expect("changed");
        assert_eq!(a(&hosts), Some(vec!["10.0.0.2".parse().expect("ip")]));
        // Gone: its entries are forgotten, once.
        std::fs::remove_file(&path).expect("remove");
        let hosts = file.read_if_changed().expect("forgotten");
        assert_eq!(a(&hosts), None);
        assert!(file.read_if_changed().is_none());
    }

    #[test]
    fn a_failed_lookup_keeps_the_last_good_answer() {
        let names = Names::default();
        let a: IpAddr = "10.0.0.1".parse().expect("literal");
        assert!(names.record("api", Ok(vec![a])));
        assert!(!names.record("api", Ok(vec![a])));
        assert!(!names.record("api", Err("SERVFAIL".into())));
        assert_eq!(
            names.get("api"),
            Some(Resolution {
                addrs: vec![a],
                error: Some("SERVFAIL".into())
            })
        );
        assert!(!names.record("api", Ok(vec![a])));
        assert_eq!(names.get("api").and_then(|r| r.error), None);
    }
}

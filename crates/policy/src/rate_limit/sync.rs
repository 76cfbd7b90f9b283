//! The Redis sync thread of `scope = "global"` limits: every `sync_ms`, on its own thread and
//! runtime (never a serving thread's), one pipeline to Redis holding this gateway's heartbeat
//! (which returns the fleet's size) and one `EVALSHA` per batch of keys (which adds what each
//! key admitted here and returns the fleet's totals); failures switch the limits to their
//! fallback, logged once, counted and exported as a gauge.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ClientTlsConfig, TlsCertificates};
use tailguard_config::RedisConfig;
use tailguard_metrics::{Counter, Gauge, Histogram, MetricsError, Registry};

use super::global::{Fleet, GlobalTable, Pending};

/// Keys per `EVALSHA`: a script call runs alone on Redis's one thread, so a batch is kept
/// short enough (~0.2 ms of Redis time) not to delay other clients noticeably.
pub const BATCH_KEYS: usize = 256;

/// Keys without requests since the last sync whose totals one sync reads anyway (over
/// every table), so a gateway's view of a key it sees rarely is at most a few syncs old:
/// 4,096 keys are 16 script calls, a millisecond or two of Redis time.
pub const REFRESH_KEYS: usize = 4096;

/// The sorted set of live gateways (score: Redis's time of each one's last heartbeat).
const FLEET_KEY: &str = "tailguard:fleet";

/// Adds a batch's counts and returns the fleet's totals. `KEYS`: per key, its current
/// window's key and the previous window's; `ARGV[1]`: the keys' TTL in ms; `ARGV[i + 1]` and
/// `ARGV[i + 2]`: what this gateway adds to `KEYS[i]` and `KEYS[i + 1]` (0: only read). Returns
/// the two totals per key, in order. A key gets its TTL when its first count creates it.
pub const COUNT_SCRIPT: &str = r"
local ttl = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS do
  local add = tonumber(ARGV[i + 1])
  local n
  if add > 0 then
    n = redis.call('INCRBY', KEYS[i], add)
    if n == add then redis.call('PEXPIRE', KEYS[i], ttl) end
  else
    n = tonumber(redis.call('GET', KEYS[i]) or '0')
  end
  out[i] = n
end
return out
";

/// This gateway's heartbeat: `KEYS[1]` the fleet's set, `ARGV[1]` this gateway's id, `ARGV[2]`
/// how long a gateway counts without a heartbeat (ms). Returns the fleet's size. Redis's
/// own clock scores the set, so the gateways' clocks need not agree for it.
pub const HEARTBEAT_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
return redis.call('ZCARD', KEYS[1])
";

/// The sync's metric handles (registered once, when the first `[redis]` starts it).
#[derive(Debug, Clone)]
struct SyncMetrics {
    seconds: Histogram,
    keys: Histogram,
    errors: Counter,
    fallback: Gauge,
    fleet_size: Gauge,
}

impl SyncMetrics {
    fn register(registry: &Registry) -> Result<SyncMetrics, MetricsError> {
        Ok(SyncMetrics {
            seconds: registry
                .histogram(
                    "tailguard_rate_limit_sync_seconds",
                    "Time a successful sync of global rate limits with Redis took (one \
                     pipeline: the heartbeat and every batch of keys).",
                    &[],
                    &[
                        0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
                    ],
                )?
                .get_or_create(&[])?,
            keys: registry
                .histogram(
                    "tailguard_rate_limit_sync_keys",
                    "Keys one sync of global rate limits sent to Redis (those with requests \
                     since the sync before).",
                    &[],
                    &[0.0, 1.0, 10.0, 100.0, 1000.0, 10_000.0, 100_000.0],
                )?
                .get_or_create(&[])?,
            errors: registry
                .counter(
                    "tailguard_rate_limit_sync_errors",
                    "Syncs of global rate limits that failed (Redis down, slow past \
                     timeout_ms, or refusing).",
                    &[],
                )?
                .get_or_create(&[])?,
            fallback: registry
                .gauge(
                    "tailguard_rate_limit_fallback",
                    "1 while global rate limits fall back to on_redis_error because Redis \
                     does not answer, else 0.",
                    &[],
                )?
                .get_or_create(&[])?,
            fleet_size: registry
                .gauge(
                    "tailguard_rate_limit_fleet_size",
                    "Gateways whose heartbeat Redis held at the last sync (what local_share \
                     divides a limit by).",
                    &[],
                )?
                .get_or_create(&[])?,
        })
    }
}

/// The running sync thread; stops when dropped.
#[derive(Debug)]
pub struct RedisSync {
    config: Arc<Mutex<RedisConfig>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RedisSync {
    /// Starts the thread for `config`, trading the counts of `fleet`'s tables, recording
    /// into `registry`.
    pub fn start(
        config: &RedisConfig,
        fleet: &Arc<Fleet>,
        registry: &Registry,
    ) -> Result<RedisSync, String> {
        let metrics = SyncMetrics::register(registry).map_err(|e| format!("metrics: {e}"))?;
        metrics.fleet_size.set(1);
        fleet.set_on_error(config.on_redis_error());
        let shared = Arc::new(Mutex::new(config.clone()));
        let stop = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            config: Arc::clone(&shared),
            fleet: Arc::clone(fleet),
            stop: Arc::clone(&stop),
            metrics,
            id: node_id(),
        };
        let thread = std::thread::Builder::new()
            .name("tailguard-redis-sync".into())
            .spawn(move || worker.run())
            .map_err(|e| format!("cannot start the Redis sync thread: {e}"))?;
        Ok(RedisSync {
            config: shared,
            stop,
            thread: Some(thread),
        })
    }

    /// Hands the thread a reloaded `[redis]` (it reconnects if the connection changed).
    pub fn update(&self, config: &RedisConfig, fleet: &Fleet) {
        fleet.set_on_error(config.on_redis_error());
        *self.config.lock().unwrap_or_else(PoisonError::into_inner) = config.clone();
    }
}

impl Drop for RedisSync {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// This gateway's name in the fleet's set: host, process and a random part (two runs with
/// one pid on one host must not count as one).
fn node_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!(
        "{}:{}:{:08x}",
        host.trim(),
        std::process::id(),
        fastrand::u32(..)
    )
}

/// An open connection and the scripts' hashes on that server.
struct Connected {
    conn: MultiplexedConnection,
    count_sha: String,
    heartbeat_sha: String,
    /// The config it was opened with: a reload that changes it reconnects.
    config: RedisConfig,
}

struct Worker {
    config: Arc<Mutex<RedisConfig>>,
    fleet: Arc<Fleet>,
    stop: Arc<AtomicBool>,
    metrics: SyncMetrics,
    id: String,
}

impl Worker {
    fn run(self) {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!("rate limits: cannot start the Redis sync's runtime: {e}");
                return;
            }
        };
        rt.block_on(self.sync_loop());
    }

    fn config(&self) -> RedisConfig {
        self.config
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    async fn sync_loop(&self) {
        let mut connected: Option<Connected> = None;
        let mut failing_since: Option<Instant> = None;
        let mut pending = Vec::new();
        let mut next = tokio::time::Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            let config = self.config();
            next += Duration::from_millis(config.sync_ms());
            let timeout = Duration::from_millis(config.timeout_ms());
            if connected.as_ref().is_some_and(|c| c.config != config) {
                connected = None;
            }
            let tables = self.fleet.tables();
            pending.clear();
            let mut taken = Vec::with_capacity(tables.len());
            let now_ms = unix_ms(SystemTime::now());
            let mut refresh = REFRESH_KEYS;
            for t in &tables {
                let start = pending.len();
                t.take_dirty(&mut pending, t.window_at(now_ms), &mut refresh);
                taken.push(start..pending.len());
            }
            let started = Instant::now();
            let result = tokio::time::timeout(
                timeout,
                self.sync_once(&mut connected, &config, &tables, &taken, &pending),
            )
            .await
            .unwrap_or_else(|_| Err(format!("no answer within timeout_ms ({timeout:?})")));
            match result {
                Ok(size) => {
                    self.metrics.seconds.observe_duration(started.elapsed());
                    self.metrics.keys.observe(pending.len() as f64);
                    self.metrics.fleet_size.set(size as i64);
                    self.metrics.fallback.set(0);
                    self.fleet.succeed(size);
                    if let Some(since) = failing_since.take() {
                        tracing::warn!(
                            "rate limits: Redis at {} answers again after {:.1} s; global \
                             limits count for the fleet again",
                            config.url.get_ref(),
                            since.elapsed().as_secs_f64()
                        );
                    }
                }
                Err(e) => {
                    connected = None;
                    self.metrics.errors.inc();
                    self.metrics.fallback.set(1);
                    for (t, range) in tables.iter().zip(&taken) {
                        for p in &pending[range.clone()] {
                            t.retry(p);
                        }
                    }
                    if self.fleet.fail() || failing_since.is_none() {
                        failing_since = Some(Instant::now());
                        tracing::warn!(
                            "rate limits: Redis at {} does not answer ({e}); global limits \
                             fall back to on_redis_error = \"{}\" (fleet size {}) until it does",
                            config.url.get_ref(),
                            config.on_redis_error().as_str(),
                            self.fleet.size()
                        );
                    }
                }
            }
            // Not an interval's tick: a sync that ran long (Redis slow) is followed by the
            // next one at once, never by a burst of the missed ones.
            let now = tokio::time::Instant::now();
            if next < now {
                next = now;
            }
            tokio::time::sleep_until(next).await;
        }
    }

    /// One exchange: connect if needed, then the heartbeat and every batch in one
    /// pipeline; the answers stored in the tables. Returns the fleet's size.
    async fn sync_once(
        &self,
        connected: &mut Option<Connected>,
        config: &RedisConfig,
        tables: &[Arc<GlobalTable>],
        taken: &[std::ops::Range<usize>],
        pending: &[Pending],
    ) -> Result<u64, String> {
        if connected.is_none() {
            *connected = Some(connect(config).await?);
        }
        let c = connected.as_mut().expect("connected above");
        let heartbeat_ttl = (3 * config.sync_ms()).max(3000) + config.timeout_ms();
        let mut pipe = redis::pipe();
        pipe.cmd("EVALSHA")
            .arg(&c.heartbeat_sha)
            .arg(1)
            .arg(FLEET_KEY)
            .arg(&self.id)
            .arg(heartbeat_ttl);
        // (table, first pending index, count) per batch, in pipeline order.
        let mut batches = Vec::new();
        for (ti, (t, range)) in tables.iter().zip(taken).enumerate() {
            let mut start = range.start;
            while start < range.end {
                let end = (start + BATCH_KEYS).min(range.end);
                let slice = &pending[start..end];
                let cmd = pipe.cmd("EVALSHA").arg(&c.count_sha).arg(2 * slice.len());
                for p in slice {
                    cmd.arg(t.redis_key(p.stable, p.window))
                        .arg(t.redis_key(p.stable, p.window.wrapping_sub(1)));
                }
                cmd.arg(t.ttl_ms());
                for p in slice {
                    cmd.arg(p.sent[0]).arg(p.sent[1]);
                }
                batches.push((ti, start, end));
                start = end;
            }
        }
        let (size, answers): (u64, Vec<Vec<u64>>) = if batches.is_empty() {
            let (size,): (u64,) = pipe
                .query_async(&mut c.conn)
                .await
                .map_err(|e| e.to_string())?;
            (size, Vec::new())
        } else {
            let values: Vec<redis::Value> = pipe
                .query_async(&mut c.conn)
                .await
                .map_err(|e| e.to_string())?;
            let mut values = values.into_iter();
            let size = redis::from_redis_value(values.next().ok_or("empty pipeline answer")?)
                .map_err(|e| e.to_string())?;
            let answers = values
                .map(|v| redis::from_redis_value::<Vec<u64>>(v).map_err(|e| e.to_string()))
                .collect::<Result<_, _>>()?;
            (size, answers)
        };
        for ((ti, start, end), totals) in batches.into_iter().zip(answers) {
            let t = &tables[ti];
            for (p, pair) in pending[start..end].iter().zip(totals.chunks_exact(2)) {
                t.apply(p, [pair[0], pair[1]]);
            }
        }
        Ok(size)
    }
}

/// Opens a connection as `config` says (TLS files, ACL user, password file, timeouts) and
/// loads the scripts.
async fn connect(config: &RedisConfig) -> Result<Connected, String> {
    let url = config.url.get_ref();
    let mut info: redis::ConnectionInfo =
        redis::IntoConnectionInfo::into_connection_info(url.as_str())
            .map_err(|e| format!("{url}: {e}"))?;
    let mut settings = info.redis_settings().clone();
    if let Some(u) = &config.username {
        settings = settings.set_username(u.get_ref());
    }
    if let Some(p) = &config.password_file {
        let path = config.resolve(p.get_ref());
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("password_file {}: {e}", path.display()))?;
        settings = settings.set_password(text.trim_end_matches(['\r', '\n']));
    }
    info = info.set_redis_settings(settings);
    let client = match &config.tls {
        Some(tls) => {
            let tls = tls.get_ref();
            let read = |f: &toml::Spanned<String>| {
                let path = config.resolve(f.get_ref());
                std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))
            };
            let root_cert = tls.ca.as_ref().map(read).transpose()?;
            let client_tls = match (&tls.cert, &tls.key) {
                (Some(c), Some(k)) => Some(ClientTlsConfig {
                    client_cert: read(c)?,
                    client_key: read(k)?,
                }),
                _ => None,
            };
            Client::build_with_tls(
                info,
                TlsCertificates {
                    client_tls,
                    root_cert,
                },
            )
        }
        None => Client::open(info),
    }
    .map_err(|e| e.to_string())?;
    let timeout = Some(Duration::from_millis(config.timeout_ms()));
    let options = AsyncConnectionConfig::new()
        .set_connection_timeout(timeout)
        .set_response_timeout(timeout);
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&options)
        .await
        .map_err(|e| e.to_string())?;
    let count_sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(COUNT_SCRIPT)
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let heartbeat_sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(HEARTBEAT_SCRIPT)
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Connected {
        conn,
        count_sha,
        heartbeat_sha,
        config: config.clone(),
    })
}

/// Milliseconds since the Unix epoch (what windows are numbered by).
pub fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

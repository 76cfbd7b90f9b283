//! A latency-driven concurrency limit per upstream: learns the upstream's no-queue response
//! time by probing at low concurrency, and keeps the requests in flight where the response
//! time stays near it, from response times alone (no CPU signal).
//!
//! Why: the CPU-aware shedder protects the process it runs in. An upstream on another core
//! or host drowns while the gateway's CPU stays low; its queue is visible only as response
//! time. The lab measured the gap (issue 14): at 10x with the upstream on its own core the
//! CPU shedder kept goodput but admitted P99 was 597 ms, every admitted request waiting in
//! the upstream's queue.
//!
//! The controller is a gradient limit in the family of Envoy's adaptive concurrency filter
//! and Netflix's Gradient2 (see `docs/overload.md` for the comparison and the choices):
//!
//! - every window (a 100 ms tick with at least `min_samples` responses, at most
//!   `max_window`) the sample is the window's median response time, and
//!   `g = clamp(min_rtt · (1 + tolerance) / sample, 0.5, 2)`;
//! - `L ← (1 − α) · L + α · (g · L + q(L))` with the queue allowance
//!   `q(L) = max(1, √L / 2)`: at saturation a k-worker upstream settles at about
//!   `k · (1 + tolerance) + q` in flight, one or two requests queued behind the workers, so
//!   the upstream never idles between a completion and the next request and nobody waits
//!   more than a fraction of a service;
//! - while the limit does not bind (the window's peak in flight under `L / 2`) it does not
//!   grow; while it binds and the response time shows no queue it jumps to twice the peak,
//!   so a fast upstream is never throttled by a slow start;
//! - **only an overload shrinks it**: `L` is enforced while the upstream is overloaded (a
//!   rejection in the last second, or a second's arrivals over its completions by
//!   `overload_ratio`); otherwise admissions see `cold_factor · L` and a queue the upstream
//!   absorbs (a Poisson burst below capacity) leaves `L` alone. Entering an overload cuts
//!   `L` to Little's law of what the upstream just completed;
//! - `min_rtt` comes from **probes**: while overloaded and queued, every
//!   `probe_interval` (jittered, so a fleet of gateways does not probe one upstream in
//!   step) the limit drops to `probe_concurrency` (the upstream's endpoint count: about
//!   one request per endpoint) until `probe_samples` requests admitted during the probe
//!   have answered; their median is the new `min_rtt`. Only requests admitted once the
//!   backlog drained below the probe concurrency count, so a probe never measures a
//!   queue. Between probes `min_rtt` can only fall (to a window's 10th percentile). This is
//!   what the CPU shedder's `minRt` lacked: measured on queued requests under sustained
//!   overload, it followed the queue up.
//!
//! Request path: [`UpstreamLimit::acquire`] loads the limit and the in-flight count (two
//! relaxed loads), adds one to in flight, and keeps the peak; a permit's
//! [`record`](LimitPermit::record) adds one to a histogram bucket and its drop subtracts
//! one from in flight. Everything else runs in [`UpstreamLimit::tick`] on the sampler
//! thread. Rejections count per class; priorities scale the limit as the shedder's do
//! (low 0.5, normal 1, high 1.5, critical never limited).

use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::Error;
use crate::class::{Class, Rejected};
use crate::padded::Padded;

/// Tuning of an [`UpstreamLimit`].
#[derive(Debug, Clone, PartialEq)]
pub struct LimitConfig {
    /// Limit before anything was measured.
    pub initial: f64,
    /// The limit never goes under this (a probe may: it uses `probe_concurrency`).
    pub min_limit: f64,
    /// Nor over this.
    pub max_limit: f64,
    /// Response time accepted above `min_rtt` before the limit shrinks: the target is
    /// `min_rtt · (1 + tolerance)`.
    pub tolerance: f64,
    /// Weight α of a new limit in the smoothed one.
    pub smoothing: f64,
    /// Responses a window needs before it is evaluated...
    pub min_samples: u32,
    /// ...unless it is this old.
    pub max_window: Duration,
    /// Time between probes while requests are being rejected (±`probe_jitter`).
    pub probe_interval: Duration,
    /// Relative jitter of `probe_interval`, in [0, 1).
    pub probe_jitter: f64,
    /// Responses to requests admitted during a probe that make a `min_rtt`.
    pub probe_samples: u32,
    /// A probe ends after this even with fewer samples.
    pub probe_timeout: Duration,
    /// Arrivals over completions (last second) that make the upstream overloaded.
    pub overload_ratio: f64,
    /// While not overloaded the limit enforced is this multiple of `L`: it bounds the
    /// backlog of an onset before the ratio sees it, and leaves room for bursts of a
    /// load the upstream can serve.
    pub cold_factor: f64,
    /// An overload (a rejection, or the ratio) lasts at least this long.
    pub hot_hold: Duration,
}

impl Default for LimitConfig {
    fn default() -> Self {
        Self {
            initial: 20.0,
            min_limit: 1.0,
            max_limit: 10_000.0,
            tolerance: 0.1,
            smoothing: 0.5,
            min_samples: 5,
            max_window: Duration::from_millis(500),
            probe_interval: Duration::from_secs(10),
            probe_jitter: 0.25,
            probe_samples: 5,
            probe_timeout: Duration::from_secs(1),
            overload_ratio: 1.3,
            cold_factor: 4.0,
            hot_hold: Duration::from_secs(1),
        }
    }
}

impl LimitConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |what: &str| Err(Error::Config(format!("upstream limit: {what}")));
        if !(self.min_limit >= 1.0 && self.min_limit <= self.max_limit) {
            return bad("min_limit must be >= 1 and <= max_limit");
        }
        if !(self.initial >= self.min_limit && self.initial <= self.max_limit) {
            return bad("initial must be within [min_limit, max_limit]");
        }
        if !(self.tolerance >= 0.0 && self.tolerance.is_finite()) {
            return bad("tolerance must be >= 0");
        }
        if !(self.smoothing > 0.0 && self.smoothing <= 1.0) {
            return bad("smoothing must be in (0, 1]");
        }
        if !(0.0..1.0).contains(&self.probe_jitter) {
            return bad("probe_jitter must be in [0, 1)");
        }
        if self.min_samples == 0 || self.probe_samples == 0 {
            return bad("min_samples and probe_samples must be > 0");
        }
        if !(self.overload_ratio > 1.0 && self.cold_factor >= 1.0) {
            return bad("overload_ratio must be > 1 and cold_factor >= 1");
        }
        if self.probe_interval.is_zero() || self.probe_timeout.is_zero() {
            return bad("probe_interval and probe_timeout must be > 0");
        }
        Ok(())
    }
}

/// Log-linear histogram of response times in µs: 8 sub-buckets per power of two (≤ 12.5 %
/// wide), exact under 8 µs, 2^28 µs (4.5 min) and over in the last bucket. One relaxed add
/// per sample; the tick drains it.
const SUB: usize = 8;
const BUCKETS: usize = SUB + SUB * 26;

#[derive(Debug)]
struct Histogram {
    counts: [AtomicU32; BUCKETS],
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }
}

fn bucket_of(us: u64) -> usize {
    if us < SUB as u64 {
        return us as usize;
    }
    let exp = 63 - us.leading_zeros() as usize; // >= 3
    let mantissa = ((us >> (exp - 3)) & (SUB as u64 - 1)) as usize;
    (SUB + (exp - 3) * SUB + mantissa).min(BUCKETS - 1)
}

/// The middle of bucket `i`, in µs.
fn value_of(i: usize) -> f64 {
    if i < SUB {
        return i as f64;
    }
    let exp = (i - SUB) / SUB + 3;
    let mantissa = (i - SUB) % SUB;
    let width = (1u64 << (exp - 3)) as f64;
    (SUB + mantissa) as f64 * width + width / 2.0
}

impl Histogram {
    fn record(&self, rtt: Duration) {
        let us = rtt.as_micros().min(u64::MAX as u128) as u64;
        self.counts[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
    }

    /// Moves the counts into `into`, returning how many there were.
    fn drain(&self, into: &mut [u32; BUCKETS]) -> u32 {
        let mut n = 0;
        for (c, acc) in self.counts.iter().zip(into.iter_mut()) {
            let v = c.swap(0, Ordering::Relaxed);
            *acc += v;
            n += v;
        }
        n
    }
}

/// The `q`-quantile (0..1) of `counts` (holding `n` samples), in µs.
fn quantile(counts: &[u32; BUCKETS], n: u32, q: f64) -> f64 {
    let rank = ((n as f64 * q).ceil() as u64).max(1);
    let mut seen = 0u64;
    for (i, &c) in counts.iter().enumerate() {
        seen += c as u64;
        if seen >= rank {
            return value_of(i);
        }
    }
    value_of(BUCKETS - 1)
}

/// The state only the tick touches.
#[derive(Debug)]
struct Control {
    limit: f64,
    min_rtt_us: Option<f64>,
    window: [u32; BUCKETS],
    window_n: u32,
    window_start: Duration,
    probe: Option<Probe>,
    probe_window: [u32; BUCKETS],
    probe_n: u32,
    next_probe: Duration,
    rejected_seen: u64,
    admitted_seen: u64,
    /// Arrivals (admitted + rejected) and completions of the last `RING` ticks.
    ring: [(u64, u64); RING],
    ring_at: usize,
    /// Overloaded until then.
    hot_until: Option<Duration>,
    /// The last evaluated window showed a queue (gradient under 1).
    queued: bool,
    rng: u64,
}

/// Ticks (of 100 ms) over which arrivals and completions are compared.
const RING: usize = 10;

#[derive(Debug, Clone, Copy)]
struct Probe {
    started: Duration,
    saved_limit: f64,
}

/// What an [`UpstreamLimit`] shows (metrics, tests).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitSnapshot {
    /// The limit of the normal class admissions see now: `L` while overloaded,
    /// `cold_factor · L` otherwise, the probe's concurrency during a probe.
    pub limit: f64,
    /// Requests in flight.
    pub inflight: i64,
    /// The no-queue response time, once measured.
    pub min_rtt: Option<Duration>,
    /// The last evaluated window's median response time.
    pub sample_rtt: Option<Duration>,
    /// A probe is running.
    pub probing: bool,
    /// The limiter sees an overload and enforces `L` (not `cold_factor · L`).
    pub overloaded: bool,
    /// Requests rejected so far, by class index ([`Class::index`]).
    pub rejected: [u64; 4],
    /// Probes completed so far.
    pub probes: u64,
}

/// The concurrency limit of one upstream (shared by every route to it). Keep the `Arc`
/// from config load; never look one up per request.
#[derive(Debug)]
pub struct UpstreamLimit {
    name: String,
    cfg: LimitConfig,
    /// In flight, its peak since the last tick, and admissions: written by every
    /// admission.
    inflight: Padded<(AtomicI64, AtomicI64, AtomicU64)>,
    /// The normal class's limit (f64 bits) and the probe epoch (odd while probing): read
    /// by every admission, written by the tick.
    gate: Padded<(AtomicU64, AtomicU64)>,
    rejected: Padded<[AtomicU64; 4]>,
    window: Histogram,
    probe_window: Histogram,
    probe_concurrency: AtomicU64,
    sample_us: AtomicU64,
    min_rtt_us: AtomicU64,
    probes: AtomicU64,
    overloaded: std::sync::atomic::AtomicBool,
    control: Mutex<Control>,
}

fn multiplier(class: Class) -> f64 {
    match class {
        Class::Low => 0.5,
        Class::Normal => 1.0,
        Class::High => 1.5,
        Class::Critical => f64::INFINITY,
    }
}

impl UpstreamLimit {
    /// A limit named after its upstream.
    pub fn new(name: &str, cfg: LimitConfig) -> Result<Self, Error> {
        cfg.validate()?;
        let limit = cfg.initial;
        // The probe schedule's jitter needs no quality, only a different phase per
        // upstream and per process: seed from the name and the address of a local.
        let seed = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        }) ^ (&limit as *const f64 as u64);
        Ok(Self {
            name: name.to_string(),
            inflight: Padded::default(),
            gate: Padded((
                AtomicU64::new((limit * cfg.cold_factor).min(cfg.max_limit).to_bits()),
                AtomicU64::new(0),
            )),
            rejected: Padded::default(),
            window: Histogram::default(),
            probe_window: Histogram::default(),
            probe_concurrency: AtomicU64::new(1.0f64.to_bits()),
            sample_us: AtomicU64::new(0),
            min_rtt_us: AtomicU64::new(0),
            probes: AtomicU64::new(0),
            overloaded: std::sync::atomic::AtomicBool::new(false),
            control: Mutex::new(Control {
                limit,
                min_rtt_us: None,
                window: [0; BUCKETS],
                window_n: 0,
                window_start: Duration::ZERO,
                probe: None,
                probe_window: [0; BUCKETS],
                probe_n: 0,
                next_probe: Duration::ZERO,
                rejected_seen: 0,
                admitted_seen: 0,
                ring: [(0, 0); RING],
                ring_at: 0,
                hot_until: None,
                queued: false,
                rng: seed | 1,
            }),
            cfg,
        })
    }

    /// The upstream's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The configuration.
    pub fn config(&self) -> &LimitConfig {
        &self.cfg
    }

    /// The concurrency a probe allows: about one request per endpoint of the upstream.
    pub fn set_probe_concurrency(&self, n: usize) {
        let n = (n.max(1) as f64).min(self.cfg.max_limit);
        self.probe_concurrency.store(n.to_bits(), Ordering::Relaxed);
    }

    /// Admits a request of `class` at `now` or rejects it (503, `Retry-After`, body never
    /// read). The permit must live until the upstream is done with the request.
    pub fn acquire(&self, now: Duration, class: Class) -> Result<LimitPermit<'_>, Rejected> {
        let epoch = self.admit(class)?;
        Ok(LimitPermit {
            limit: self,
            start: now,
            epoch,
            recorded: false,
        })
    }

    /// [`acquire`](Self::acquire) for a permit that owns its `Arc`.
    pub fn acquire_owned(
        self: &Arc<Self>,
        now: Duration,
        class: Class,
    ) -> Result<OwnedLimitPermit, Rejected> {
        let epoch = self.admit(class)?;
        Ok(OwnedLimitPermit {
            limit: Arc::clone(self),
            start: now,
            epoch,
            recorded: false,
        })
    }

    fn admit(&self, class: Class) -> Result<u64, Rejected> {
        let limit = f64::from_bits(self.gate.0.0.load(Ordering::Relaxed));
        let inflight = self.inflight.0.0.load(Ordering::Relaxed);
        if class != Class::Critical {
            let over = inflight as f64 + 1.0 > limit * multiplier(class);
            if over {
                self.rejected.0[class.index()].fetch_add(1, Ordering::Relaxed);
                return Err(Rejected {
                    class,
                    severe: inflight as f64 > 2.0 * limit,
                });
            }
        }
        let now_in = self.inflight.0.0.fetch_add(1, Ordering::Relaxed) + 1;
        self.inflight.0.2.fetch_add(1, Ordering::Relaxed);
        // Load first: at a steady level the peak is already there and the line stays
        // shared instead of being written by every admission.
        if now_in > self.inflight.0.1.load(Ordering::Relaxed) {
            self.inflight.0.1.fetch_max(now_in, Ordering::Relaxed);
        }
        Ok(self.gate.0.1.load(Ordering::Relaxed))
    }

    fn record(&self, epoch: u64, rtt: Duration) {
        if epoch % 2 == 1 && self.gate.0.1.load(Ordering::Relaxed) == epoch {
            self.probe_window.record(rtt);
        } else {
            self.window.record(rtt);
        }
    }

    fn release(&self) {
        self.inflight.0.0.fetch_sub(1, Ordering::Relaxed);
    }

    fn publish(&self, limit: f64) {
        self.gate.0.0.store(limit.to_bits(), Ordering::Relaxed);
    }

    fn next_probe_after(&self, c: &mut Control, now: Duration) -> Duration {
        // xorshift64: the jitter's only job is to spread probes.
        c.rng ^= c.rng << 13;
        c.rng ^= c.rng >> 7;
        c.rng ^= c.rng << 17;
        let unit = (c.rng >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
        let factor = 1.0 + self.cfg.probe_jitter * (2.0 * unit - 1.0);
        now + self.cfg.probe_interval.mul_f64(factor)
    }

    /// Evaluates the window, decides whether the upstream is overloaded and runs the probe
    /// schedule; call every 100 ms (the shedder's sampler thread does, for limits made by
    /// [`Shedder::upstream_limit`]).
    ///
    /// [`Shedder::upstream_limit`]: crate::Shedder::upstream_limit
    pub fn tick(&self, now: Duration) {
        let mut guard = self.control.lock().unwrap_or_else(|e| e.into_inner());
        let c = &mut *guard;
        let rejected: u64 = self
            .rejected
            .0
            .iter()
            .map(|r| r.load(Ordering::Relaxed))
            .sum();
        let admitted = self.inflight.0.2.load(Ordering::Relaxed);
        let new_rejected = rejected.saturating_sub(c.rejected_seen);
        let arrivals = new_rejected + admitted.saturating_sub(c.admitted_seen);
        c.rejected_seen = rejected;
        c.admitted_seen = admitted;
        let inflight = self.inflight.0.0.load(Ordering::Relaxed);
        let peak = self.inflight.0.1.swap(inflight, Ordering::Relaxed);
        let n = self.window.drain(&mut c.window);
        c.window_n += n;
        let probe_n = if c.probe.is_some() {
            self.probe_window.drain(&mut c.probe_window)
        } else {
            0
        };
        c.probe_n += probe_n;

        // Overloaded: something was rejected (at the cold limit, a backlog of `cold_factor`
        // limits), or over the last second more arrived than the upstream completed by
        // `overload_ratio`. A Poisson burst at 0.8x does neither (a second's arrivals
        // would have to outgrow its completions by 30 %: a backlog of a third of a
        // second), an onset of 3x or more does the second within a tick or two.
        c.ring[c.ring_at] = (arrivals, (n + probe_n) as u64);
        c.ring_at = (c.ring_at + 1) % RING;
        let (sum_arrivals, sum_done) = c.ring.iter().fold((0, 0), |(a, d), &(x, y)| (a + x, d + y));
        let was_hot = c.hot_until.is_some_and(|t| now <= t);
        if new_rejected > 0
            || (sum_arrivals >= 10
                && sum_arrivals as f64 >= self.cfg.overload_ratio * sum_done as f64)
        {
            c.hot_until = Some(now + self.cfg.hot_hold);
        }
        let hot = c.hot_until.is_some_and(|t| now <= t);
        self.overloaded.store(hot, Ordering::Relaxed);
        if hot && !was_hot && c.probe.is_none() {
            // Little's law from what the upstream just completed: the concurrency it served
            // without a queue, with the same tolerance and allowance as the gradient. An
            // onset is then cut to size at once instead of by halves over a second.
            if let Some(min_rtt) = c.min_rtt_us {
                let throughput = sum_done as f64 / (RING as f64 * 0.1);
                let little = throughput * min_rtt / 1e6 * (1.0 + self.cfg.tolerance)
                    + queue_allowance(c.limit);
                c.limit = c.limit.min(little).max(self.cfg.min_limit);
            }
        }

        if let Some(probe) = c.probe {
            let timed_out = now.saturating_sub(probe.started) >= self.cfg.probe_timeout;
            if c.probe_n >= self.cfg.probe_samples || timed_out {
                if c.probe_n > 0 {
                    let rtt = quantile(&c.probe_window, c.probe_n, 0.5);
                    c.min_rtt_us = Some(rtt);
                    self.min_rtt_us.store(rtt as u64, Ordering::Relaxed);
                    self.probes.fetch_add(1, Ordering::Relaxed);
                }
                c.probe = None;
                c.limit = probe.saved_limit;
                self.publish(self.enforced(c, hot));
                self.gate.0.1.fetch_add(1, Ordering::Relaxed); // even: no probe
                c.next_probe = self.next_probe_after(c, now);
                c.window = [0; BUCKETS];
                c.window_n = 0;
                c.window_start = now;
            }
            return;
        }

        // A probe costs goodput, so only while overloaded, and only when the response time
        // shows a queue or `min_rtt` was never measured clean (a start in overload: a FIFO
        // queue's 10th percentile is as queued as its median, so the gradient alone would
        // not see it).
        let probed = self.probes.load(Ordering::Relaxed) > 0;
        if hot && now >= c.next_probe && (c.queued || !probed) {
            c.probe = Some(Probe {
                started: now,
                saved_limit: c.limit,
            });
            c.probe_window = [0; BUCKETS];
            c.probe_n = 0;
            let mut scratch = [0; BUCKETS];
            self.probe_window.drain(&mut scratch);
            self.gate.0.1.fetch_add(1, Ordering::Relaxed); // odd: probing
            self.publish(f64::from_bits(
                self.probe_concurrency.load(Ordering::Relaxed),
            ));
            return;
        }

        let age = now.saturating_sub(c.window_start);
        if c.window_n == 0 {
            c.window_start = now;
            self.publish(self.enforced(c, hot));
            return;
        }
        if c.window_n < self.cfg.min_samples && age < self.cfg.max_window {
            self.publish(self.enforced(c, hot));
            return;
        }
        let sample = quantile(&c.window, c.window_n, 0.5);
        let low = quantile(&c.window, c.window_n, 0.1);
        let min_rtt = c.min_rtt_us.map_or(low, |m| m.min(low));
        c.min_rtt_us = Some(min_rtt);
        self.min_rtt_us.store(min_rtt as u64, Ordering::Relaxed);
        self.sample_us.store(sample as u64, Ordering::Relaxed);
        c.window = [0; BUCKETS];
        c.window_n = 0;
        c.window_start = now;

        let gradient = (min_rtt * (1.0 + self.cfg.tolerance) / sample).clamp(0.5, 2.0);
        c.queued = gradient < 1.0;
        let binding = peak as f64 >= c.limit / 2.0;
        let proposed = if gradient >= 1.0 {
            if binding {
                // No queue at the upstream and the limit is what holds requests back.
                (gradient * c.limit + queue_allowance(c.limit)).max(2.0 * peak as f64)
            } else {
                c.limit
            }
        } else if hot {
            gradient * c.limit + queue_allowance(c.limit)
        } else {
            // A queue but no overload (a burst the upstream absorbs): not a reason to
            // shrink; the cold limit bounds it.
            c.limit
        };
        let a = self.cfg.smoothing;
        c.limit =
            ((1.0 - a) * c.limit + a * proposed).clamp(self.cfg.min_limit, self.cfg.max_limit);
        self.publish(self.enforced(c, hot));
    }

    /// The limit admissions see: `L` while overloaded, `cold_factor · L` otherwise.
    fn enforced(&self, c: &Control, hot: bool) -> f64 {
        if hot {
            c.limit
        } else {
            (c.limit * self.cfg.cold_factor).min(self.cfg.max_limit)
        }
    }

    /// What the limiter shows now.
    pub fn snapshot(&self) -> LimitSnapshot {
        let us = |v: u64| (v > 0).then(|| Duration::from_micros(v));
        LimitSnapshot {
            limit: f64::from_bits(self.gate.0.0.load(Ordering::Relaxed)),
            inflight: self.inflight.0.0.load(Ordering::Relaxed),
            min_rtt: us(self.min_rtt_us.load(Ordering::Relaxed)),
            sample_rtt: us(self.sample_us.load(Ordering::Relaxed)),
            probing: self.gate.0.1.load(Ordering::Relaxed) % 2 == 1,
            overloaded: self.overloaded.load(Ordering::Relaxed),
            rejected: std::array::from_fn(|i| self.rejected.0[i].load(Ordering::Relaxed)),
            probes: self.probes.load(Ordering::Relaxed),
        }
    }
}

/// Requests allowed to wait behind the upstream's workers: at least one, so a completion
/// finds the next request already there; √L/2 for large limits (a fleet of endpoints).
fn queue_allowance(limit: f64) -> f64 {
    (limit.sqrt() / 2.0).max(1.0)
}

/// An admitted request. [`record`](Self::record) when the upstream's response head
/// arrives (or the exchange timed out: that is latency too); drop when the upstream is
/// done with the request. Dropped unrecorded (a connect error, an abort) it gives no sample.
#[derive(Debug)]
pub struct LimitPermit<'a> {
    limit: &'a UpstreamLimit,
    start: Duration,
    epoch: u64,
    recorded: bool,
}

impl LimitPermit<'_> {
    /// Records the response time `now − admission` once.
    pub fn record(&mut self, now: Duration) {
        if !std::mem::replace(&mut self.recorded, true) {
            self.limit
                .record(self.epoch, now.saturating_sub(self.start));
        }
    }
}

impl Drop for LimitPermit<'_> {
    fn drop(&mut self) {
        self.limit.release();
    }
}

/// [`LimitPermit`] owning its limit.
#[derive(Debug)]
pub struct OwnedLimitPermit {
    limit: Arc<UpstreamLimit>,
    start: Duration,
    epoch: u64,
    recorded: bool,
}

impl OwnedLimitPermit {
    /// Records the response time `now − admission` once.
    pub fn record(&mut self, now: Duration) {
        if !std::mem::replace(&mut self.recorded, true) {
            self.limit
                .record(self.epoch, now.saturating_sub(self.start));
        }
    }
}

impl Drop for OwnedLimitPermit {
    fn drop(&mut self) {
        self.limit.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn histogram_buckets_are_at_most_an_eighth_wide_and_ordered() {
        let mut last = 0;
        for us in 1..200_000u64 {
            let b = bucket_of(us);
            assert!(b >= last, "{us}");
            last = b;
            let mid = value_of(b);
            assert!(
                (mid - us as f64).abs() <= us as f64 / 8.0 + 1.0,
                "{us} -> {mid}"
            );
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_of_a_drained_window() {
        let h = Histogram::default();
        for us in [
            1000u64, 1000, 1000, 2000, 4000, 8000, 8000, 8000, 8000, 100_000,
        ] {
            h.record(Duration::from_micros(us));
        }
        let mut counts = [0; BUCKETS];
        let n = h.drain(&mut counts);
        assert_eq!(n, 10);
        let p50 = quantile(&counts, n, 0.5);
        assert!((3500.0..=4500.0).contains(&p50), "{p50}");
        let p10 = quantile(&counts, n, 0.1);
        assert!((900.0..=1100.0).contains(&p10), "{p10}");
        assert_eq!(h.drain(&mut [0; BUCKETS]), 0, "drained");
    }

    /// Serves `per_tick` requests per 100 ms tick with response time `rtt(in_flight)`,
    /// each admitted, recorded and released within the tick.
    fn run(
        l: &UpstreamLimit,
        from: u64,
        ticks: u64,
        offered: usize,
        rtt: impl Fn(usize) -> u64,
    ) -> u64 {
        let mut rejected = 0;
        for t in 0..ticks {
            let now = ms((from + t) * 100);
            let mut held = Vec::new();
            for _ in 0..offered {
                match l.acquire(now, Class::Normal) {
                    Ok(p) => held.push(p),
                    Err(_) => rejected += 1,
                }
            }
            let rtt_us = rtt(held.len());
            for mut p in held {
                p.record(now + Duration::from_micros(rtt_us));
            }
            l.tick(now + ms(100));
        }
        rejected
    }

    /// Runs on until no probe is in progress (its jitter comes from the process, so where
    /// one falls differs from run to run), then returns the snapshot.
    fn settled(
        l: &UpstreamLimit,
        from: u64,
        offered: usize,
        rtt: impl Fn(usize) -> u64,
    ) -> LimitSnapshot {
        for t in 0..20 {
            if !l.snapshot().probing {
                break;
            }
            run(l, from + t, 1, offered, &rtt);
        }
        l.snapshot()
    }

    #[test]
    fn a_queueing_upstream_settles_near_its_workers_plus_a_small_queue() {
        // 8 workers of 20 ms: with n in flight the response takes 20 ms · max(1, n/8).
        let l = UpstreamLimit::new("io", LimitConfig::default()).unwrap();
        let rtt = |n: usize| (20_000.0 * (n as f64 / 8.0).max(1.0)) as u64;
        run(&l, 0, 200, 100, rtt);
        let s = settled(&l, 200, 100, rtt);
        assert!(s.probes >= 1, "{s:?}");
        let m = s.min_rtt.unwrap().as_micros();
        assert!((18_000..=22_000).contains(&m), "{s:?}");
        assert!((9.0..=13.0).contains(&s.limit), "{s:?}");
    }

    #[test]
    fn a_one_worker_upstream_keeps_one_request_waiting_at_most() {
        let l = UpstreamLimit::new("cpu", LimitConfig::default()).unwrap();
        let rtt = |n: usize| 3_600 * n.max(1) as u64;
        run(&l, 0, 200, 100, rtt);
        let s = settled(&l, 200, 100, rtt);
        assert!((2.0..3.0).contains(&s.limit), "{s:?}");
    }

    #[test]
    fn under_capacity_nothing_is_rejected_and_the_limit_follows_demand_up() {
        let l = UpstreamLimit::new("fast", LimitConfig::default()).unwrap();
        // 300 in flight at once, no queue: the limit must open within a few ticks.
        let rejected_late = {
            run(&l, 0, 20, 300, |_| 1_000);
            run(&l, 20, 50, 300, |_| 1_000)
        };
        assert_eq!(rejected_late, 0, "{:?}", l.snapshot());
        assert!(l.snapshot().limit >= 300.0);
    }

    #[test]
    fn a_probe_admits_only_the_probe_concurrency_and_measures_without_a_queue() {
        let cfg = LimitConfig {
            cold_factor: 1.0,
            ..LimitConfig::default()
        };
        let l = UpstreamLimit::new("p", cfg).unwrap();
        l.set_probe_concurrency(2);
        // Overload with a queue: the first rejection starts a probe at the next tick.
        let held: Vec<_> = (0..20)
            .map(|_| l.acquire(ms(0), Class::Normal).unwrap())
            .collect();
        assert!(l.acquire(ms(0), Class::Normal).is_err());
        l.tick(ms(100));
        assert!(l.snapshot().probing);
        assert_eq!(l.snapshot().limit, 2.0);
        // The backlog still holds the slots: nothing new gets in until it drains.
        assert!(l.acquire(ms(100), Class::Normal).is_err());
        for mut p in held {
            p.record(ms(150)); // queued responses: not probe samples
        }
        for i in 0..5 {
            let mut p = l.acquire(ms(200 + i), Class::Normal).unwrap();
            let _second = l.acquire(ms(200 + i), Class::Normal).unwrap();
            assert!(l.acquire(ms(200 + i), Class::Normal).is_err(), "a third");
            p.record(ms(200 + i) + Duration::from_micros(3_000));
        }
        l.tick(ms(300));
        let s = l.snapshot();
        assert!(!s.probing, "{s:?}");
        assert_eq!(s.probes, 1);
        let m = s.min_rtt.unwrap().as_micros();
        assert!((2_700..=3_300).contains(&m), "{s:?}");
        assert_eq!(s.limit, 20.0, "the limit from before the probe is back");
    }

    #[test]
    fn classes_scale_the_limit_and_critical_is_never_limited() {
        let cfg = LimitConfig {
            initial: 4.0,
            cold_factor: 1.0,
            ..LimitConfig::default()
        };
        let l = UpstreamLimit::new("c", cfg).unwrap();
        let a = l.acquire(ms(0), Class::Low).unwrap();
        let b = l.acquire(ms(0), Class::Low).unwrap();
        assert!(l.acquire(ms(0), Class::Low).is_err(), "low gets half");
        let c = l.acquire(ms(0), Class::Normal).unwrap();
        let d = l.acquire(ms(0), Class::Normal).unwrap();
        assert!(l.acquire(ms(0), Class::Normal).is_err());
        let e = l.acquire(ms(0), Class::High).unwrap();
        let f = l.acquire(ms(0), Class::High).unwrap();
        assert!(l.acquire(ms(0), Class::High).is_err(), "high gets 1.5x");
        let g = l.acquire(ms(0), Class::Critical).unwrap();
        assert_eq!(l.snapshot().inflight, 7);
        assert_eq!(l.snapshot().rejected, [1, 1, 1, 0]);
        drop((a, b, c, d, e, f, g));
        assert_eq!(l.snapshot().inflight, 0);
    }

    #[test]
    fn bad_configs_are_refused() {
        for cfg in [
            LimitConfig {
                min_limit: 0.5,
                ..LimitConfig::default()
            },
            LimitConfig {
                initial: 0.5,
                ..LimitConfig::default()
            },
            LimitConfig {
                smoothing: 0.0,
                ..LimitConfig::default()
            },
            LimitConfig {
                probe_jitter: 1.0,
                ..LimitConfig::default()
            },
        ] {
            assert!(UpstreamLimit::new("x", cfg).is_err());
        }
    }
}

//! Whether each endpoint may take traffic: the state active checks and passive ejection
//! keep per (upstream, endpoint), the one-load test a balancer makes per candidate, and the
//! request path's count of consecutive failures.
//!
//! Who writes what (design.md §2):
//! - `down` (one byte: down by checks, ejected) is written only by the checker thread
//!   ([`checker`]), rarely, and read by every pick: one relaxed load per candidate, no lock.
//! - `failures` (passive ejection) is written by serving threads only when a request fails;
//!   a success reads it and resets it only when it is not already 0, so the success path
//!   writes no shared cache line. It sits on its own cache lines, away from `down`.
//! - The rest (consecutive check results, ejection deadlines and streaks) is the checker
//!   thread's alone, behind a mutex no serving thread ever takes.
//!
//! The state is shared by reference ([`Arc`]) and carried from one snapshot to the next by
//! (upstream name, address), as pools are, so a reload (or a DNS re-resolution that swaps a
//! snapshot) keeps what the checks learned about the endpoints it keeps.

pub mod checker;
pub mod handover;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tailguard_metrics::Gauge;
use tokio::sync::Notify;

use crate::outcome::Outcome;
use crate::shard::Padded;

pub use tailguard_config::health::{
    ActiveCheck, Ejection, ExpectStatus, HealthConfig, MAX_EJECTION_FACTOR,
};

/// `down` bit: the active check took the endpoint out.
const PROBE_DOWN: u8 = 1;
/// `down` bit: passive ejection took the endpoint out.
const EJECTED: u8 = 2;

/// The health settings of one upstream in one snapshot (`[upstreams.health]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthSettings {
    /// Active checks, when `path` is set.
    pub active: Option<ActiveCheck>,
    /// Passive ejection, unless `consecutive_failures = 0`.
    pub ejection: Option<Ejection>,
}

impl HealthSettings {
    /// The settings of an upstream's `[upstreams.health]` table.
    pub fn from_config(config: &HealthConfig) -> HealthSettings {
        HealthSettings {
            active: config.active(),
            ejection: config.ejection(),
        }
    }
}

/// The endpoints a balancer may pick from: those neither down by checks nor ejected.
///
/// A view of the endpoints' health states (in endpoint order), not of the endpoints, so the
/// balancers below the upstream that holds them need not know what an endpoint is.
#[derive(Debug, Clone, Copy)]
pub struct Up<'a>(&'a [Arc<EndpointHealth>]);

impl<'a> Up<'a> {
    /// A view of `states`, the health of an upstream's endpoints in endpoint order.
    #[inline]
    pub fn new(states: &'a [Arc<EndpointHealth>]) -> Up<'a> {
        Up(states)
    }

    /// Whether endpoint `i` may take a request: one relaxed atomic load (an index past the
    /// end, which no balancer should ask about, is not up).
    #[inline]
    pub fn is_up(&self, i: usize) -> bool {
        self.0.get(i).is_some_and(|h| h.is_up())
    }

    /// Number of endpoints (up or not).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no endpoints at all.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The checker thread's own record of an endpoint.
#[derive(Debug, Default)]
struct Track {
    /// Consecutive passed checks (reset by a failed one).
    passes: u32,
    /// Consecutive failed checks (reset by a passed one).
    fails: u32,
    /// Ejections in the current streak: the next one lasts `base * 2^ejections`.
    ejections: u32,
    /// When the current ejection ends.
    ejected_until: Option<Instant>,
    /// When the last ejection ended (for resetting the streak).
    back_since: Option<Instant>,
    /// Consecutive passed checks since the current ejection began: `healthy` of them end it.
    /// Counted apart from `passes`, so checks that passed before the failures which ejected
    /// the endpoint do not end the ejection at the next check.
    passes_while_ejected: u32,
    /// The last active check: when, and what it found (the status page shows it).
    last_check: Option<(Instant, Result<u16, String>, bool)>,
}

/// The last change of an endpoint's state: when, to what, and why.
#[derive(Debug, Clone)]
struct Change {
    at: Instant,
    reason: String,
}

/// What the status page shows of one endpoint's health, read off the request path (the
/// checker's own lock, which no serving thread takes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthReport {
    /// `up`, `down` (by checks), `ejected`, or `down+ejected`.
    pub state: &'static str,
    /// Why it last changed (the same words as the log line), if it ever did.
    pub reason: Option<String>,
    /// How long ago it last changed.
    pub since: Option<Duration>,
    /// Time left of the current ejection.
    pub ejected_for: Option<Duration>,
    /// The last active check: how long ago, whether it passed, and what it got (`status
    /// 200`, or why there was no status).
    pub last_check: Option<(Duration, bool, String)>,
    /// Consecutive failed requests counted for passive ejection.
    pub failures: u32,
}

/// The health of one endpoint of one upstream; see the module doc for who writes what.
#[derive(Debug)]
pub struct EndpointHealth {
    /// 0 when the endpoint may take traffic; else `PROBE_DOWN | EJECTED` bits.
    down: AtomicU8,
    /// Set when no snapshot holds this state any more: late check results are dropped.
    retired: AtomicBool,
    /// Consecutive failed requests, counted by serving threads (passive ejection).
    failures: Padded<AtomicU32>,
    upstream: Arc<str>,
    addr: SocketAddr,
    /// `tailguard_upstream_endpoint_up{upstream, endpoint}`, set by whoever changes `down`.
    up_gauge: Gauge,
    /// Wakes the checker thread when `failures` reaches an ejection threshold.
    wake: Arc<Notify>,
    track: Mutex<Track>,
    /// The last state change (written by whoever changes `down`: the checker thread).
    changed: Mutex<Option<Change>>,
}

impl EndpointHealth {
    /// A new endpoint's state: in service (a new endpoint gets traffic until checks or
    /// failures say otherwise, as nginx and HAProxy assume; Envoy waits for a first pass).
    pub fn new(
        upstream: Arc<str>,
        addr: SocketAddr,
        up_gauge: Gauge,
        wake: Arc<Notify>,
    ) -> EndpointHealth {
        up_gauge.set(1);
        EndpointHealth {
            down: AtomicU8::new(0),
            retired: AtomicBool::new(false),
            failures: Padded(AtomicU32::new(0)),
            upstream,
            addr,
            up_gauge,
            wake,
            track: Mutex::default(),
            changed: Mutex::default(),
        }
    }

    /// What the status page shows, as of `now`. Takes the checker's locks for a copy: the
    /// exporter thread calls it, never a serving thread.
    pub fn report(&self, now: Instant) -> HealthReport {
        let down = self.down.load(Ordering::Relaxed);
        let (ejected_for, last_check) = {
            let t = self.track();
            (
                t.ejected_until
                    .filter(|_| down & EJECTED != 0)
                    .map(|until| until.saturating_duration_since(now)),
                t.last_check.as_ref().map(|(at, result, passed)| {
                    let what = match result {
                        Ok(status) => format!("status {status}"),
                        Err(why) => why.clone(),
                    };
                    (now.saturating_duration_since(*at), *passed, what)
                }),
            )
        };
        let changed = self
            .changed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        HealthReport {
            state: state_name(down),
            since: changed
                .as_ref()
                .map(|c| now.saturating_duration_since(c.at)),
            reason: changed.map(|c| c.reason),
            ejected_for,
            last_check,
            failures: self.failures(),
        }
    }

    /// The endpoint's upstream name.
    pub fn upstream(&self) -> &Arc<str> {
        &self.upstream
    }

    /// The endpoint's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether the endpoint may take traffic (neither down by checks nor ejected).
    #[inline]
    pub fn is_up(&self) -> bool {
        self.down.load(Ordering::Relaxed) == 0
    }

    /// Whether the active check has the endpoint down.
    pub fn is_probe_down(&self) -> bool {
        self.down.load(Ordering::Relaxed) & PROBE_DOWN != 0
    }

    /// Whether passive ejection has the endpoint out.
    pub fn is_ejected(&self) -> bool {
        self.down.load(Ordering::Relaxed) & EJECTED != 0
    }

    /// Counts a finished exchange for passive ejection (`threshold`: the upstream's
    /// `consecutive_failures`, at least 1). A failure is a connect error, a timeout, a
    /// connection broken before the response head, or a 502/503/504 answer; anything else
    /// the upstream answered resets the count, and an exchange the client aborted says
    /// nothing. The request that makes the count reach `threshold` wakes the checker thread,
    /// which ejects (the request path never decides an ejection, so it needs no lock).
    #[inline]
    pub(crate) fn record(&self, outcome: Outcome, threshold: u32) {
        let failed = match outcome {
            Outcome::Status(s) => matches!(s, 502..=504),
            Outcome::ConnectFailed | Outcome::Timeout | Outcome::Broken => true,
            Outcome::Aborted => return,
        };
        let failures = &self.failures.0;
        if failed {
            if failures.fetch_add(1, Ordering::Relaxed).wrapping_add(1) == threshold {
                self.wake.notify_one();
            }
        } else if failures.load(Ordering::Relaxed) != 0 {
            // Only when non-zero: a success must not write a line other threads write.
            failures.store(0, Ordering::Relaxed);
        }
    }

    /// Consecutive failed requests counted so far.
    pub fn failures(&self) -> u32 {
        self.failures.0.load(Ordering::Relaxed)
    }

    fn track(&self) -> MutexGuard<'_, Track> {
        // Only the checker thread locks it; a panic there cannot leave it half-written in a
        // way that matters more than one wrong count.
        self.track
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets or clears `bit`, keeping the gauge and the log in step. Checker thread only.
    fn set(&self, bit: u8, on: bool, message: &str, reason: &str) {
        let before = self.down.load(Ordering::Relaxed);
        let after = if on { before | bit } else { before & !bit };
        if before == after {
            return;
        }
        self.down.store(after, Ordering::Relaxed);
        self.up_gauge.set(i64::from(after == 0));
        *self
            .changed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Change {
            at: Instant::now(),
            reason: format!("{message}: {reason}"),
        });
        let (from, to) = (state_name(before), state_name(after));
        if on {
            tracing::warn!(
                target: "tailguard::health",
                upstream = %self.upstream,
                endpoint = %self.addr,
                from,
                to,
                reason,
                "{message}"
            );
        } else {
            tracing::info!(
                target: "tailguard::health",
                upstream = %self.upstream,
                endpoint = %self.addr,
                from,
                to,
                reason,
                "{message}"
            );
        }
    }

    /// Applies an active check's result (the status, or why there is none) at `now`.
    /// `check.healthy` passes in a row bring back an endpoint the checks took down, and end a
    /// passive ejection too (counting only passes since it began), restarting its doubling:
    /// a check that passes is fresher news than the failures that ejected the endpoint, and
    /// without this a recovered endpoint would stay out for the rest of its ejection
    /// (Envoy's `successful_active_health_check_uneject_host`). Checker thread only.
    pub(crate) fn probed(&self, check: &ActiveCheck, result: Result<u16, String>, now: Instant) {
        if self.retired.load(Ordering::Relaxed) {
            return;
        }
        let mut t = self.track();
        let passed = matches!(result, Ok(status) if check.passes(status));
        t.last_check = Some((now, result.clone(), passed));
        let failure = match result {
            Ok(status) if check.passes(status) => None,
            Ok(status) => Some(format!("status {status}")),
            Err(why) => Some(why),
        };
        match failure {
            None => {
                t.fails = 0;
                t.passes = t.passes.saturating_add(1);
                if self.is_probe_down() && t.passes >= check.healthy {
                    let reason = format!("{} consecutive passed checks", t.passes);
                    self.set(
                        PROBE_DOWN,
                        false,
                        "endpoint passes its checks again",
                        &reason,
                    );
                }
                if self.is_ejected() {
                    t.passes_while_ejected = t.passes_while_ejected.saturating_add(1);
                    if t.passes_while_ejected >= check.healthy {
                        let reason = format!(
                            "{} consecutive passed checks since it was ejected",
                            t.passes_while_ejected
                        );
                        end_ejection(&mut t, now, true);
                        drop(t);
                        self.back_from_ejection(&reason);
                    }
                }
            }
            Some(why) => {
                t.passes = 0;
                t.passes_while_ejected = 0;
                t.fails = t.fails.saturating_add(1);
                if !self.is_probe_down() && t.fails >= check.unhealthy {
                    let reason = format!("{} consecutive failed checks, last: {why}", t.fails);
                    self.set(PROBE_DOWN, true, "endpoint fails its checks", &reason);
                } else {
                    tracing::debug!(
                        target: "tailguard::health",
                        upstream = %self.upstream,
                        endpoint = %self.addr,
                        "check failed: {why}"
                    );
                }
            }
        }
    }

    /// Ejects the endpoint if its failures reached the threshold and `allowed` (the
    /// upstream's `max_ejected_percent` leaves room); returns when the ejection ends.
    /// The count restarts either way, so a refused ejection is reconsidered after another
    /// `consecutive_failures` failures. Checker thread only.
    pub(crate) fn eject(
        &self,
        ejection: &Ejection,
        now: Instant,
        allowed: bool,
    ) -> Option<Instant> {
        let failures = self.failures();
        if self.retired.load(Ordering::Relaxed) || failures < ejection.consecutive_failures {
            return None;
        }
        self.failures.0.store(0, Ordering::Relaxed);
        if self.is_ejected() {
            return None;
        }
        if !allowed {
            tracing::debug!(
                target: "tailguard::health",
                upstream = %self.upstream,
                endpoint = %self.addr,
                failures,
                "not ejected: max_ejected_percent of the upstream is out of service already"
            );
            return None;
        }
        let mut t = self.track();
        let length = ejection_length(&mut t, ejection.base, now);
        let until = now + length;
        t.ejected_until = Some(until);
        t.passes_while_ejected = 0;
        drop(t);
        let reason = format!(
            "{failures} consecutive failures; ejected for {} ms",
            length.as_millis()
        );
        self.set(EJECTED, true, "endpoint ejected", &reason);
        Some(until)
    }

    /// Ends an ejection that is due; returns when the current one ends if it is not yet.
    /// Checker thread only.
    pub(crate) fn expire(&self, now: Instant) -> Option<Instant> {
        let mut t = self.track();
        let until = t.ejected_until?;
        if until > now {
            return Some(until);
        }
        end_ejection(&mut t, now, false);
        drop(t);
        self.back_from_ejection("ejection time over");
        None
    }

    /// Clears the ejection bit once the track says the ejection is over. Failures counted
    /// while it was out (requests already in flight) start no new ejection: it comes back
    /// with a clean count.
    fn back_from_ejection(&self, reason: &str) {
        self.failures.0.store(0, Ordering::Relaxed);
        self.set(EJECTED, false, "endpoint back from ejection", reason);
    }

    /// The upstream no longer has active checks: an endpoint they had taken down comes
    /// back (nothing else would ever bring it back), and the counts restart. Checker
    /// thread only.
    pub(crate) fn unchecked(&self) {
        if !self.is_probe_down() || self.retired.load(Ordering::Relaxed) {
            return;
        }
        let mut t = self.track();
        (t.passes, t.fails) = (0, 0);
        drop(t);
        self.set(
            PROBE_DOWN,
            false,
            "endpoint back in service",
            "active checks removed from the config",
        );
    }

    /// Marks a state no snapshot holds any more: late results for it are dropped.
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
    }

    /// Sets the gauge to 0: the endpoint left the config (no new state took its series).
    pub(crate) fn clear_gauge(&self) {
        self.up_gauge.set(0);
    }
}

/// The name of a `down` value, as the log and the status page say it.
fn state_name(down: u8) -> &'static str {
    match down {
        0 => "up",
        PROBE_DOWN => "down",
        EJECTED => "ejected",
        _ => "down+ejected",
    }
}

/// Ends the current ejection in the checker's record at `now`. `by_checks`: passing checks
/// ended it, which proves the endpoint recovered, so the streak restarts and its next
/// ejection lasts the base time again (an ejection that merely ran out proves nothing, and
/// the streak goes on doubling).
fn end_ejection(t: &mut Track, now: Instant, by_checks: bool) {
    t.ejected_until = None;
    t.back_since = Some(now);
    t.passes_while_ejected = 0;
    if by_checks {
        t.ejections = 0;
    }
}

/// The length of the next ejection, counting it in the streak: `base`, doubling with each
/// repeat, at most [`MAX_EJECTION_FACTOR`] x `base`. The streak restarts when the endpoint
/// stayed in service since its last ejection for as long as the longest ejection
/// (`MAX_EJECTION_FACTOR` x `base`): it has recovered, so it is treated as a first offender.
fn ejection_length(t: &mut Track, base: Duration, now: Instant) -> Duration {
    let longest = base.saturating_mul(MAX_EJECTION_FACTOR);
    if t.back_since
        .is_some_and(|back| now.saturating_duration_since(back) >= longest)
    {
        t.ejections = 0;
    }
    let doubled = base.saturating_mul(1u32.checked_shl(t.ejections).unwrap_or(u32::MAX));
    t.ejections = t.ejections.saturating_add(1);
    doubled.min(longest)
}

/// Fresh states of endpoints on 127.0.0.1:1.., for balancer unit tests.
#[cfg(test)]
pub(crate) fn test_states(n: usize) -> Vec<Arc<EndpointHealth>> {
    let registry = tailguard_metrics::Registry::new();
    let up = registry
        .gauge("up", "test", &["endpoint"])
        .expect("a fresh registry takes a gauge");
    (0..n)
        .map(|i| {
            let addr: SocketAddr = ([127, 0, 0, 1], 1 + i as u16).into();
            Arc::new(EndpointHealth::new(
                Arc::from("test"),
                addr,
                up.get_or_create(&[&addr.to_string()]).expect("gauge"),
                Arc::new(Notify::new()),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> EndpointHealth {
        let registry = tailguard_metrics::Registry::new();
        let gauge = registry
            .gauge("up", "test", &[])
            .unwrap()
            .get_or_create(&[])
            .unwrap();
        EndpointHealth::new(
            Arc::from("u"),
            "127.0.0.1:1".parse().unwrap(),
            gauge,
            Arc::new(Notify::new()),
        )
    }

    fn ejection(n: u32, base_ms: u64) -> Ejection {
        Ejection {
            consecutive_failures: n,
            base: Duration::from_millis(base_ms),
            max_ejected_percent: 50,
        }
    }

    fn check() -> ActiveCheck {
        ActiveCheck {
            path: "/health".into(),
            interval: Duration::from_millis(10),
            timeout: Duration::from_millis(10),
            healthy: 2,
            unhealthy: 3,
            expect: vec![200..=399],
        }
    }

    #[test]
    fn checks_take_an_endpoint_down_after_unhealthy_and_back_after_healthy() {
        let h = state();
        let c = check();
        h.probed(&c, Ok(500), Instant::now());
        h.probed(&c, Err("timed out".into()), Instant::now());
        assert!(h.is_up(), "two failures of three");
        h.probed(&c, Ok(200), Instant::now());
        h.probed(&c, Ok(503), Instant::now());
        h.probed(&c, Ok(503), Instant::now());
        assert!(h.is_up(), "a pass restarted the count");
        h.probed(&c, Ok(404), Instant::now());
        assert!(!h.is_up() && h.is_probe_down());
        assert_eq!(h.up_gauge.get(), 0);
        h.probed(&c, Ok(204), Instant::now());
        assert!(!h.is_up(), "one pass of two");
        h.probed(&c, Ok(399), Instant::now());
        assert!(h.is_up());
        assert_eq!(h.up_gauge.get(), 1);
    }

    #[test]
    fn the_report_says_the_state_why_since_when_and_the_last_check() {
        let h = state();
        let c = check();
        let start = Instant::now();
        let fresh = h.report(start);
        assert_eq!(
            (fresh.state, fresh.reason, fresh.last_check),
            ("up", None, None)
        );
        for _ in 0..3 {
            h.probed(&c, Err("connection refused".into()), start);
        }
        let later = start + Duration::from_millis(1500);
        let r = h.report(later);
        assert_eq!(r.state, "down");
        assert_eq!(
            r.reason.as_deref(),
            Some(
                "endpoint fails its checks: 3 consecutive failed checks, last: connection refused"
            )
        );
        assert_eq!(
            r.last_check,
            Some((
                Duration::from_millis(1500),
                false,
                "connection refused".into()
            ))
        );
        assert_eq!(r.ejected_for, None);
        h.probed(&c, Ok(204), later);
        let r = h.report(later);
        assert_eq!(
            r.last_check,
            Some((Duration::ZERO, true, "status 204".into()))
        );
        assert_eq!(r.state, "down", "one pass of two");

        let e = ejection(1, 100);
        let ejected = state();
        ejected.record(Outcome::ConnectFailed, 1);
        ejected.eject(&e, start, true).expect("ejected");
        let r = ejected.report(start + Duration::from_millis(30));
        assert_eq!(r.state, "ejected");
        assert_eq!(r.ejected_for, Some(Duration::from_millis(70)));
        assert!(
            r.reason
                .unwrap()
                .starts_with("endpoint ejected: 1 consecutive failures")
        );
    }

    #[test]
    fn failures_count_until_a_success_and_wake_the_checker_at_the_threshold() {
        let h = state();
        for o in [
            Outcome::Status(502),
            Outcome::ConnectFailed,
            Outcome::Timeout,
            Outcome::Broken,
            Outcome::Status(504),
        ] {
            h.record(o, 10);
        }
        assert_eq!(h.failures(), 5);
        h.record(Outcome::Aborted, 10);
        h.record(Outcome::Status(500), 10);
        assert_eq!(h.failures(), 0, "a 500 is an answer, not an outage");
        h.record(Outcome::Status(503), 1);
        // The permit notify_one left behind is there for the checker's next wait.
        let woken = futures_util::FutureExt::now_or_never(h.wake.notified());
        assert!(woken.is_some());
    }

    #[test]
    fn ejections_double_up_to_the_cap_and_the_streak_resets_after_a_long_recovery() {
        let h = state();
        let e = ejection(2, 100);
        let mut now = Instant::now();
        let mut lengths = Vec::new();
        for _ in 0..6 {
            h.record(Outcome::ConnectFailed, 2);
            assert_eq!(h.eject(&e, now, true), None, "one failure of two");
            h.record(Outcome::ConnectFailed, 2);
            let until = h.eject(&e, now, true).expect("ejected");
            assert!(h.is_ejected() && h.failures() == 0);
            assert_eq!(h.expire(now), Some(until), "not over yet");
            lengths.push((until - now).as_millis());
            now = until;
            assert_eq!(h.expire(now), None);
            assert!(h.is_up());
        }
        assert_eq!(lengths, [100, 200, 400, 800, 1000, 1000]);
        // In service for the longest ejection (10 x base): a first offender again.
        now += Duration::from_millis(1000);
        h.record(Outcome::Timeout, 1);
        h.record(Outcome::Timeout, 1);
        let until = h.eject(&e, now, true).expect("ejected");
        assert_eq!((until - now).as_millis(), 100);
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Fails `consecutive_failures` requests in a row and ejects at `now`; returns the
    /// ejection's length.
    fn fail_and_eject(h: &EndpointHealth, e: &Ejection, now: Instant) -> Duration {
        for _ in 0..e.consecutive_failures {
            h.record(Outcome::Status(503), e.consecutive_failures);
        }
        let until = h.eject(e, now, true).expect("ejected");
        until - now
    }

    #[test]
    fn without_checks_an_ejection_lasts_its_time_and_the_streak_keeps_doubling() {
        // Regression test for issue 22 item 1's other half: only passing checks end an
        // ejection early; without them the timer alone does.
        let h = state();
        let e = ejection(2, 100);
        let mut now = Instant::now();
        assert_eq!(fail_and_eject(&h, &e, now), ms(100));
        // Even if the endpoint recovered, no request is routed to it to say so: nothing but
        // the timer brings it back.
        assert_eq!(h.expire(now + ms(99)), Some(now + ms(100)));
        assert!(h.is_ejected() && !h.is_up());
        now += ms(100);
        assert_eq!(h.expire(now), None);
        assert!(h.is_up());
        assert_eq!(fail_and_eject(&h, &e, now), ms(200), "the streak goes on");
    }

    #[test]
    fn healthy_passes_end_an_ejection_and_restart_its_doubling() {
        // Regression test for issue 22 item 1: an endpoint ejected and down by checks came
        // back by checks but stayed ejected for the rest of its 30 s.
        let h = state();
        let c = check(); // healthy = 2, unhealthy = 3
        let e = ejection(2, 100);
        let mut now = Instant::now();
        // A streak: 100 ms, then 200 ms, then a third ejection of 400 ms...
        for want in [100, 200] {
            assert_eq!(fail_and_eject(&h, &e, now), ms(want));
            now += ms(want);
            assert_eq!(h.expire(now), None);
        }
        assert_eq!(fail_and_eject(&h, &e, now), ms(400));
        // ...during which its checks fail too: down by checks and ejected.
        for _ in 0..3 {
            h.probed(&c, Ok(503), now);
        }
        assert!(h.is_probe_down() && h.is_ejected());
        assert_eq!(h.up_gauge.get(), 0);

        // It recovers. One pass of two: still out; a failure restarts the count.
        now += ms(10);
        h.probed(&c, Ok(200), now);
        h.probed(&c, Ok(500), now);
        h.probed(&c, Ok(200), now);
        assert!(h.is_ejected() && h.is_probe_down());
        // `healthy` passes in a row: back from both at once, long before the 400 ms end.
        h.probed(&c, Ok(200), now);
        assert!(!h.is_probe_down() && !h.is_ejected() && h.is_up());
        assert_eq!(
            h.up_gauge.get(),
            1,
            "the gauge shows what the balancers use"
        );
        assert_eq!(h.expire(now + ms(1000)), None, "no ejection left to end");
        assert!(h.is_up());
        // The streak restarted: the next ejection lasts the base time, not 800 ms.
        assert_eq!(fail_and_eject(&h, &e, now), ms(100));
    }

    #[test]
    fn passes_before_an_ejection_do_not_end_it() {
        // Checks that passed while requests failed (a shallow health path) say nothing of
        // the failures that came after them: `healthy` new passes are needed.
        let h = state();
        let c = check();
        let now = Instant::now();
        for _ in 0..5 {
            h.probed(&c, Ok(200), now);
        }
        fail_and_eject(&h, &ejection(2, 100_000), now);
        h.probed(&c, Ok(200), now);
        assert!(h.is_ejected(), "one pass since the ejection, of two");
        h.probed(&c, Ok(200), now);
        assert!(h.is_up());
    }

    #[test]
    fn a_refused_ejection_restarts_the_count() {
        let h = state();
        let e = ejection(1, 100);
        h.record(Outcome::Status(503), 1);
        assert_eq!(h.eject(&e, Instant::now(), false), None);
        assert!(h.is_up());
        assert_eq!(h.failures(), 0);
    }

    /// Runs `f` with this thread's `info` and louder log lines captured as text.
    ///
    /// tracing caches per call site whether any subscriber wants it. A call site first hit
    /// by another test's thread while no subscriber exists is cached as "never", and this
    /// thread's scoped subscriber then misses its lines (a soak run lost both `INFO` lines
    /// that way). A global default that wants every call site (a bare registry, which
    /// prints nothing) keeps the cache at "always", so each event asks the current thread's
    /// subscriber.
    fn logged(f: impl FnOnce()) -> String {
        static GLOBAL: std::sync::Once = std::sync::Once::new();
        GLOBAL.call_once(|| {
            // Another global default set first would do the same job.
            let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
        });
        #[derive(Clone)]
        struct Capture(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Capture {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let capture = Capture(Arc::default());
        let writer = capture.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let text = capture.0.lock().unwrap().clone();
        String::from_utf8(text).unwrap()
    }

    #[test]
    fn every_transition_is_logged_once_with_its_reason() {
        let h = state();
        let c = check();
        let log = logged(|| {
            for _ in 0..5 {
                h.probed(&c, Ok(500), Instant::now());
            }
            h.probed(&c, Ok(200), Instant::now());
            h.probed(&c, Ok(200), Instant::now());
            h.probed(&c, Ok(200), Instant::now());
            h.record(Outcome::Timeout, 2);
            h.record(Outcome::Timeout, 2);
            let now = Instant::now();
            let until = h.eject(&ejection(2, 100), now, true).unwrap();
            assert_eq!(h.expire(now), Some(until));
            assert_eq!(h.expire(until), None);
        });
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 4, "{log}");
        let expect = [
            (
                "WARN",
                "endpoint fails its checks",
                "from=\"up\" to=\"down\" reason=\"3 consecutive failed checks, last: status 500\"",
            ),
            (
                "INFO",
                "endpoint passes its checks again",
                "from=\"down\" to=\"up\" reason=\"2 consecutive passed checks\"",
            ),
            (
                "WARN",
                "endpoint ejected",
                "from=\"up\" to=\"ejected\" reason=\"2 consecutive failures; ejected for 100 ms\"",
            ),
            (
                "INFO",
                "endpoint back from ejection",
                "from=\"ejected\" to=\"up\" reason=\"ejection time over\"",
            ),
        ];
        for (line, (level, message, fields)) in lines.iter().zip(expect) {
            for part in [
                level,
                "tailguard::health",
                message,
                "upstream=u endpoint=127.0.0.1:1",
                fields,
            ] {
                assert!(line.contains(part), "{part:?} not in {line:?}");
            }
        }
    }

    #[test]
    fn retired_state_ignores_late_results() {
        let h = state();
        h.retire();
        let c = check();
        for _ in 0..5 {
            h.probed(&c, Ok(500), Instant::now());
        }
        assert!(h.is_up());
    }
}

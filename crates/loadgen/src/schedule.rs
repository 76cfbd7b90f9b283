//! The open-loop schedule: when each request is meant to be sent, fixed before the run starts
//! and never moved by how fast the target answers.

use std::time::Duration;

/// One stretch of a stepped load: `rate` requests per second for `duration`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phase {
    /// Requests per second (0: none in this stretch).
    pub rate: f64,
    /// How long the stretch lasts.
    pub duration: Duration,
}

/// One phase as the schedule walks it: nanoseconds from the start of the run.
#[derive(Debug, Clone, Copy)]
struct Span {
    start_ns: f64,
    /// `f64::INFINITY` for the last phase: the schedule goes on at its rate.
    end_ns: f64,
    /// Mean gap between two requests of this lane (constant: of the whole schedule);
    /// infinite when the rate is 0.
    interval_ns: f64,
}

/// Intended send times at a constant rate, or as a Poisson process of the same mean rate;
/// either one piecewise constant over [`Phase`]s.
///
/// Offsets are nanoseconds from the start of the run. With `threads` schedules interleaved
/// (`lane` 0..threads), lane `k` of a constant schedule sends requests `k, k+T, k+2T, ...` of
/// the single global schedule, so the union is exactly the requested rate; in phase `p` the
/// global schedule sends its `i`-th request at `start_p + i / rate_p`. A Poisson lane is a
/// Poisson process of `rate_p / T` in each phase, restarted at each phase's start (exponential
/// gaps are memoryless, so this is exactly a Poisson process of piecewise-constant rate).
#[derive(Debug, Clone)]
pub struct Schedule {
    spans: Vec<Span>,
    lane: u64,
    lanes: u64,
    /// Constant: the phase being walked, the index of the next request in it, and the
    /// global index of the next request of the whole schedule.
    span: usize,
    in_span: u64,
    global: u64,
    poisson: Option<fastrand::Rng>,
    /// Poisson: the next arrival, already drawn.
    poisson_at: f64,
}

/// What [`Schedule::next_offset`] returns once a schedule has no more requests (its last
/// phase has rate 0).
pub const NEVER: u64 = u64::MAX;

fn spans(phases: &[Phase], per_lane: f64) -> Vec<Span> {
    let mut out = Vec::with_capacity(phases.len());
    let mut at = 0.0;
    for (i, p) in phases.iter().enumerate() {
        let end = if i + 1 == phases.len() {
            f64::INFINITY
        } else {
            at + p.duration.as_nanos() as f64
        };
        out.push(Span {
            start_ns: at,
            end_ns: end,
            interval_ns: if p.rate > 0.0 {
                1e9 / p.rate * per_lane
            } else {
                f64::INFINITY
            },
        });
        at = end;
    }
    out
}

impl Schedule {
    /// A constant-rate schedule of `rate` requests per second for one lane of `lanes`.
    pub fn constant(rate: f64, lane: u64, lanes: u64) -> Self {
        Self::stepped(
            &[Phase {
                rate,
                duration: Duration::MAX,
            }],
            lane,
            lanes,
        )
    }

    /// A constant-rate schedule that changes rate at each phase's end; after the last phase
    /// it goes on at the last rate. One lane of `lanes`.
    pub fn stepped(phases: &[Phase], lane: u64, lanes: u64) -> Self {
        Self {
            spans: spans(phases, 1.0),
            lane,
            lanes: lanes.max(1),
            span: 0,
            in_span: 0,
            global: 0,
            poisson: None,
            poisson_at: 0.0,
        }
    }

    /// A Poisson schedule: exponential gaps of mean `lanes / rate` for this lane, so that
    /// `lanes` independent lanes add up to a Poisson process of `rate`.
    pub fn poisson(rate: f64, lane: u64, lanes: u64, seed: u64) -> Self {
        Self::stepped_poisson(
            &[Phase {
                rate,
                duration: Duration::MAX,
            }],
            lane,
            lanes,
            seed,
        )
    }

    /// A Poisson schedule whose rate changes at each phase's end (see [`Schedule`]).
    pub fn stepped_poisson(phases: &[Phase], lane: u64, lanes: u64, seed: u64) -> Self {
        let lanes = lanes.max(1);
        let spans = spans(phases, lanes as f64);
        // The first arrival of a lane is at the start, as it always was; the next ones follow
        // exponential gaps.
        let poisson_at = match spans.first() {
            Some(s) if s.interval_ns.is_finite() => 0.0,
            _ => f64::INFINITY,
        };
        Self {
            spans,
            lane,
            lanes,
            span: 0,
            in_span: 0,
            global: 0,
            poisson: Some(fastrand::Rng::with_seed(seed.wrapping_add(lane))),
            poisson_at,
        }
    }

    /// The next intended send time, in nanoseconds from the start; [`NEVER`] when the
    /// schedule sends nothing more.
    pub fn next_offset(&mut self) -> u64 {
        if self.poisson.is_some() {
            return self.next_poisson();
        }
        loop {
            let Some(at) = self.next_global() else {
                return NEVER;
            };
            let index = self.global - 1;
            if index % self.lanes == self.lane {
                return at;
            }
        }
    }

    /// The next request of the whole constant schedule (every lane's).
    fn next_global(&mut self) -> Option<u64> {
        loop {
            let s = self.spans.get(self.span)?;
            if s.interval_ns.is_finite() {
                let at = s.start_ns + self.in_span as f64 * s.interval_ns;
                if at < s.end_ns {
                    self.in_span += 1;
                    self.global += 1;
                    return Some(at as u64);
                }
            } else if s.end_ns.is_infinite() {
                // The last phase has rate 0: nothing more, ever.
                return None;
            }
            self.span += 1;
            self.in_span = 0;
        }
    }

    fn next_poisson(&mut self) -> u64 {
        let rng = self
            .poisson
            .as_mut()
            .expect("next_poisson is called on Poisson schedules only");
        loop {
            let Some(s) = self.spans.get(self.span).copied() else {
                return NEVER;
            };
            if self.poisson_at < s.end_ns && s.interval_ns.is_finite() {
                let at = self.poisson_at;
                // Inverse transform of an exponential; 1 - f64() is in (0, 1].
                self.poisson_at += -(1.0 - rng.f64()).ln() * s.interval_ns;
                self.global += 1;
                return at as u64;
            }
            // The drawn arrival falls past this phase (or it has rate 0): restart the process
            // at the next phase's start with its rate.
            self.span += 1;
            let Some(next) = self.spans.get(self.span) else {
                return NEVER;
            };
            self.poisson_at = if next.interval_ns.is_finite() {
                next.start_ns - (1.0 - rng.f64()).ln() * next.interval_ns
            } else {
                next.start_ns
            };
        }
    }
}

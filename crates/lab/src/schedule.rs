//! The open-loop schedule: when each request is meant to be sent, fixed before the run starts
//! and never moved by how fast the target answers.

/// Intended send times at a constant rate, or as a Poisson process of the same mean rate.
///
/// Offsets are nanoseconds from the start of the run. With `threads` schedules interleaved
/// (`lane` 0..threads), lane `k` of a constant schedule sends requests `k, k+T, k+2T, ...` of
/// the single global schedule, so the union is exactly the requested rate.
#[derive(Debug, Clone)]
pub struct Schedule {
    interval_ns: f64,
    lane: u64,
    lanes: u64,
    index: u64,
    poisson: Option<fastrand::Rng>,
    poisson_at: f64,
}

impl Schedule {
    /// A constant-rate schedule of `rate` requests per second for one lane of `lanes`.
    pub fn constant(rate: f64, lane: u64, lanes: u64) -> Self {
        Self {
            interval_ns: 1e9 / rate,
            lane,
            lanes: lanes.max(1),
            index: 0,
            poisson: None,
            poisson_at: 0.0,
        }
    }

    /// A Poisson schedule: exponential gaps of mean `lanes / rate` for this lane, so that
    /// `lanes` independent lanes add up to a Poisson process of `rate`.
    pub fn poisson(rate: f64, lane: u64, lanes: u64, seed: u64) -> Self {
        let lanes = lanes.max(1);
        Self {
            interval_ns: 1e9 / rate * lanes as f64,
            lane,
            lanes,
            index: 0,
            poisson: Some(fastrand::Rng::with_seed(seed.wrapping_add(lane))),
            poisson_at: 0.0,
        }
    }

    /// The next intended send time, in nanoseconds from the start.
    pub fn next_offset(&mut self) -> u64 {
        match &mut self.poisson {
            None => {
                let n = self.index * self.lanes + self.lane;
                self.index += 1;
                (n as f64 * self.interval_ns) as u64
            }
            Some(rng) => {
                // Inverse transform of an exponential; 1 - f64() is in (0, 1].
                let gap = -(1.0 - rng.f64()).ln() * self.interval_ns;
                let at = self.poisson_at;
                self.poisson_at += gap;
                self.index += 1;
                at as u64
            }
        }
    }
}

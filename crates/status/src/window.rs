//! The exporter thread's memory of the last minutes: the samples of the last
//! [`WINDOW_TICKS`] ticks (rates and percentiles are taken over them) and, every
//! [`HISTORY_EVERY`] ticks, one point per chart (the gateway's and each upstream's rate,
//! errors and P99) in a ring of [`HISTORY_POINTS`]: 15 minutes.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::sample::{Sample, Traffic};

/// Samples a rate spans, one per tick (1 s): 10 s, short enough to be live, long enough that
/// a quiet route's rate does not flicker between 0 and 1 / s.
pub(crate) const WINDOW_TICKS: usize = 10;

/// Ticks between two chart points: 5 s.
pub(crate) const HISTORY_EVERY: u64 = 5;

/// Chart points kept: 180 x 5 s = 15 minutes.
pub(crate) const HISTORY_POINTS: usize = 180;

/// One chart point: requests / s, 5xx / s, P99 (ms) over the window that ended there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Point {
    pub(crate) rate: f64,
    pub(crate) errors: f64,
    pub(crate) p99_ms: Option<f64>,
}

/// A ring of chart points, oldest first.
#[derive(Debug, Clone, Default)]
pub(crate) struct Series(pub(crate) VecDeque<Point>);

impl Series {
    fn push(&mut self, point: Point) {
        if self.0.len() == HISTORY_POINTS {
            self.0.pop_front();
        }
        self.0.push_back(point);
    }
}

/// What a window says of some traffic: rates per second and latency percentiles.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Rates {
    pub(crate) rate: f64,
    /// `1xx` ... `5xx` per second.
    pub(crate) classes: [f64; 5],
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) mean_ms: Option<f64>,
}

impl Rates {
    /// `new` over `old` (`None`: the traffic is newer than the window), `seconds` apart.
    pub(crate) fn between(
        new: &Traffic,
        old: Option<&Traffic>,
        seconds: f64,
        bounds: &[f64],
    ) -> Rates {
        let per_s = |n: f64, o: f64| {
            if seconds > 0.0 {
                (n - o).max(0.0) / seconds
            } else {
                0.0
            }
        };
        let latency = new.latency.since(old.map(|o| &o.latency));
        let count = latency.count();
        let ms = |s: f64| s * 1000.0;
        let mut classes = [0.0; 5];
        for (i, c) in classes.iter_mut().enumerate() {
            *c = per_s(new.classes[i], old.map_or(0.0, |o| o.classes[i]));
        }
        Rates {
            rate: per_s(new.requests, old.map_or(0.0, |o| o.requests)),
            classes,
            p50_ms: latency.quantile(bounds, 0.5).map(ms),
            p99_ms: latency.quantile(bounds, 0.99).map(ms),
            mean_ms: (count > 0).then(|| ms(latency.sum / count as f64)),
        }
    }

    fn point(&self) -> Point {
        Point {
            rate: self.rate,
            errors: self.classes[4],
            p99_ms: self.p99_ms,
        }
    }
}

/// The samples of the window and the charts' rings.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    recent: VecDeque<Sample>,
    ticks: u64,
    pub(crate) gateway: Series,
    pub(crate) upstreams: HashMap<String, Series>,
}

impl Tracker {
    /// Adds a tick's sample; every [`HISTORY_EVERY`] ticks, a chart point.
    pub(crate) fn push(&mut self, sample: Sample) {
        if self.recent.len() > WINDOW_TICKS {
            self.recent.pop_front();
        }
        self.recent.push_back(sample);
        self.ticks += 1;
        if self.ticks.is_multiple_of(HISTORY_EVERY) {
            self.add_points();
        }
    }

    /// Ticks so far (the JSON's cache key).
    pub(crate) fn ticks(&self) -> u64 {
        self.ticks
    }

    /// The newest sample and the oldest of the window, and the seconds between them (the
    /// newest alone, 0 s apart, after the first tick).
    pub(crate) fn window(&self) -> Option<(&Sample, &Sample, f64)> {
        let newest = self.recent.back()?;
        let oldest = self.recent.front()?;
        let seconds = newest.at.saturating_duration_since(oldest.at).as_secs_f64();
        Some((newest, oldest, seconds))
    }

    fn add_points(&mut self) {
        let Some((new, old, seconds)) = self.window() else {
            return;
        };
        let gateway =
            Rates::between(&new.gateway, Some(&old.gateway), seconds, &new.bounds).point();
        let upstreams: Vec<(String, Point)> = new
            .upstreams
            .iter()
            .map(|(name, u)| {
                let before = old.upstreams.get(name).map(|o| &o.traffic);
                let rates = Rates::between(&u.traffic, before, seconds, &new.upstream_bounds);
                (name.clone(), rates.point())
            })
            .collect();
        self.gateway.push(gateway);
        // An upstream that left the config leaves the charts.
        self.upstreams
            .retain(|name, _| upstreams.iter().any(|(n, _)| n == name));
        for (name, point) in upstreams {
            self.upstreams.entry(name).or_default().push(point);
        }
    }
}

/// The chart points' spacing, for the JSON.
pub(crate) fn history_interval() -> Duration {
    Duration::from_secs(HISTORY_EVERY)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::sample::{Latency, Traffic};

    fn sample(at: Instant, requests: f64, errors: f64) -> Sample {
        Sample {
            at,
            gateway: Traffic {
                requests,
                classes: [0.0, requests - errors, 0.0, 0.0, errors],
                latency: Latency {
                    buckets: vec![requests as u64, 0],
                    sum: requests * 0.001,
                },
            },
            routes: HashMap::new(),
            upstreams: HashMap::new(),
            endpoints: HashMap::new(),
            totals: Default::default(),
            gauges: Default::default(),
            bounds: vec![0.002],
            upstream_bounds: vec![0.002],
        }
    }

    #[test]
    fn rates_span_the_window_and_points_come_every_fifth_tick() {
        let start = Instant::now();
        let mut t = Tracker::default();
        for i in 0..30u32 {
            // 100 requests a second, 10 of them 5xx.
            t.push(sample(
                start + Duration::from_secs(u64::from(i)),
                f64::from(i) * 100.0,
                f64::from(i) * 10.0,
            ));
        }
        let (new, old, seconds) = t.window().unwrap();
        assert_eq!(seconds, WINDOW_TICKS as f64);
        let r = Rates::between(&new.gateway, Some(&old.gateway), seconds, &new.bounds);
        assert_eq!((r.rate, r.classes[4], r.classes[1]), (100.0, 10.0, 90.0));
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
        assert!(close(r.p50_ms, 1.0) && close(r.mean_ms, 1.0), "{r:?}");
        assert_eq!(t.gateway.0.len(), 6);
        assert_eq!(t.gateway.0.back().unwrap().errors, 10.0);
    }
}

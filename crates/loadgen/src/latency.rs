//! Latency distributions: an HdrHistogram in microseconds (3 significant digits, up to 60 s)
//! with wrk2's percentile table and a lossless JSON form.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Highest latency recorded exactly; longer ones saturate here and are counted.
pub const MAX_US: u64 = 60_000_000;

/// The percentiles of wrk2's "Latency Distribution" block.
pub const WRK2_PERCENTILES: [f64; 8] = [50.0, 75.0, 90.0, 99.0, 99.9, 99.99, 99.999, 100.0];

/// A latency distribution in microseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Latency {
    hist: Histogram<u64>,
    saturated: u64,
}

impl Default for Latency {
    fn default() -> Self {
        Self::new()
    }
}

impl Latency {
    /// An empty distribution.
    pub fn new() -> Self {
        Self {
            hist: Histogram::new_with_bounds(1, MAX_US, 3)
                .expect("1..60e6 us at 3 digits is a valid histogram"),
            saturated: 0,
        }
    }

    /// An empty distribution at 2 significant digits (1 % resolution) in a seventh of the
    /// memory: for the per-second distributions of a timeline, a few hundred of them per run.
    pub fn coarse() -> Self {
        Self {
            hist: Histogram::new_with_bounds(1, MAX_US, 2)
                .expect("1..60e6 us at 2 digits is a valid histogram"),
            saturated: 0,
        }
    }

    /// Records one latency in microseconds (0 is raised to 1; above 60 s saturates).
    pub fn record_us(&mut self, us: u64) {
        if us > MAX_US {
            self.saturated += 1;
        }
        self.hist.saturating_record(us.clamp(1, MAX_US));
    }

    /// Records one latency given in nanoseconds.
    pub fn record_ns(&mut self, ns: u64) {
        self.record_us(ns.div_ceil(1000));
    }

    /// Adds another distribution into this one.
    pub fn add(&mut self, other: &Latency) {
        self.hist
            .add(&other.hist)
            .expect("histograms of the same bounds always add");
        self.saturated += other.saturated;
    }

    /// Number of recorded latencies.
    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// Number of latencies above 60 s, recorded as 60 s.
    pub fn saturated(&self) -> u64 {
        self.saturated
    }

    /// Value at a percentile (0..=100), in microseconds; 0 when empty.
    pub fn percentile_us(&self, percentile: f64) -> u64 {
        if self.hist.is_empty() {
            return 0;
        }
        if percentile >= 100.0 {
            return self.hist.highest_equivalent(self.hist.max());
        }
        self.hist
            .highest_equivalent(self.hist.value_at_percentile(percentile))
    }

    /// Largest recorded value, in microseconds (the P100).
    pub fn max_us(&self) -> u64 {
        self.percentile_us(100.0)
    }

    /// Mean in microseconds.
    pub fn mean_us(&self) -> f64 {
        self.hist.mean()
    }

    /// Standard deviation in microseconds.
    pub fn stdev_us(&self) -> f64 {
        self.hist.stdev()
    }

    /// The underlying histogram.
    pub fn histogram(&self) -> &Histogram<u64> {
        &self.hist
    }

    /// The summary kept in reports: wrk2's percentiles, mean, stdev, count.
    pub fn summary(&self) -> Summary {
        Summary {
            count: self.count(),
            mean_us: self.mean_us(),
            stdev_us: self.stdev_us(),
            percentiles_us: WRK2_PERCENTILES
                .iter()
                .map(|&p| (format_percentile(p), self.percentile_us(p)))
                .collect(),
        }
    }

    /// The detailed percentile spectrum as HdrHistogram prints it (5 ticks per half
    /// distance): `(value_us, quantile, total_count)`.
    pub fn spectrum(&self) -> Vec<(u64, f64, u64)> {
        let mut out = Vec::new();
        if self.hist.is_empty() {
            return out;
        }
        let mut total = 0;
        for v in self.hist.iter_quantiles(5) {
            total += v.count_since_last_iteration();
            out.push((
                self.hist.highest_equivalent(v.value_iterated_to()),
                v.quantile_iterated_to(),
                total,
            ));
        }
        out
    }
}

/// wrk2 percentiles as report keys: "50", "99.9", "100".
pub fn format_percentile(p: f64) -> String {
    let s = format!("{p:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The numbers a reader quotes from a distribution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Recorded latencies.
    pub count: u64,
    /// Mean, microseconds.
    pub mean_us: f64,
    /// Standard deviation, microseconds.
    pub stdev_us: f64,
    /// wrk2's percentiles (key "50" ... "100"), microseconds.
    pub percentiles_us: Vec<(String, u64)>,
}

/// JSON form: the summary for readers plus the whole histogram in HdrHistogram's own
/// interchange encoding (V2, deflate, base64: what HdrHistogram's `.hlog` files hold, readable
/// by its tools in every language), so it is rebuilt exactly on the way back in at a few KB.
#[derive(Serialize, Deserialize)]
struct LatencyJson {
    summary: Summary,
    saturated: u64,
    /// The histogram, microseconds, V2-deflate-base64.
    hdr: String,
}

impl Serialize for Latency {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use base64::Engine as _;
        use hdrhistogram::serialization::Serializer as _;
        let mut bytes = Vec::new();
        hdrhistogram::serialization::V2DeflateSerializer::new()
            .serialize(&self.hist, &mut bytes)
            .map_err(|e| serde::ser::Error::custom(format!("histogram encoding: {e:?}")))?;
        LatencyJson {
            summary: self.summary(),
            saturated: self.saturated,
            hdr: base64::engine::general_purpose::STANDARD.encode(bytes),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Latency {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use base64::Engine as _;
        let json = LatencyJson::deserialize(d)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(json.hdr.as_bytes())
            .map_err(|e| serde::de::Error::custom(format!("histogram is not base64: {e}")))?;
        let hist: Histogram<u64> = hdrhistogram::serialization::Deserializer::new()
            .deserialize(&mut std::io::Cursor::new(bytes))
            .map_err(|e| serde::de::Error::custom(format!("histogram does not decode: {e:?}")))?;
        let mut latency = if hist.sigfig() == 2 {
            Latency::coarse()
        } else {
            Latency::new()
        };
        latency
            .hist
            .add(&hist)
            .map_err(|e| serde::de::Error::custom(format!("histogram out of range: {e:?}")))?;
        latency.saturated = json.saturated;
        Ok(latency)
    }
}

/// Formats microseconds the way wrk2 does: `812.00us`, `1.23ms`, `2.50s`.
pub fn format_us(us: f64) -> String {
    if us < 1000.0 {
        format!("{us:.2}us")
    } else if us < 1_000_000.0 {
        format!("{:.2}ms", us / 1000.0)
    } else {
        format!("{:.2}s", us / 1_000_000.0)
    }
}

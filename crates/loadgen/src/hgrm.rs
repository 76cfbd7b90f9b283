//! HdrHistogram's percentile distribution text (`.hgrm`, values in milliseconds): written in
//! the layout of wrk2 and HdrHistogram_c, read back for overlaid plots.

use std::fmt::Write as _;

use crate::LoadError;
use crate::latency::Latency;

/// The percentile distribution of `latency`, values in milliseconds, in the classic layout
/// HdrHistogram's plotter reads.
pub fn render(latency: &Latency) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:>12} {:>12} {:>12} {:>12}\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    );
    for (value_us, quantile, total) in latency.spectrum() {
        let ms = value_us as f64 / 1000.0;
        if quantile < 1.0 {
            let _ = writeln!(
                o,
                "{ms:>12.3} {quantile:>12.6} {total:>12} {:>12.2}",
                1.0 / (1.0 - quantile)
            );
        } else {
            let _ = writeln!(o, "{ms:>12.3} {quantile:>12.6} {total:>12}");
        }
    }
    let hist = latency.histogram();
    let _ = writeln!(
        o,
        "#[Mean    = {:>12.3}, StdDeviation   = {:>12.3}]",
        latency.mean_us() / 1000.0,
        latency.stdev_us() / 1000.0
    );
    let _ = writeln!(
        o,
        "#[Max     = {:>12.3}, Total count    = {:>12}]",
        latency.max_us() as f64 / 1000.0,
        latency.count()
    );
    // 3 significant digits: 2 * 10^3 rounded up to a power of two.
    let _ = writeln!(
        o,
        "#[Buckets = {:>12}, SubBuckets     = {:>12}]",
        hist.buckets(),
        2048
    );
    o
}

/// One point of a percentile curve read from a `.hgrm` file: milliseconds at a quantile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// Latency, milliseconds.
    pub value_ms: f64,
    /// Quantile, 0..=1.
    pub quantile: f64,
}

/// Reads the `(value, percentile)` rows of a `.hgrm` text (header and `#` lines skipped).
pub fn parse(text: &str) -> Result<Vec<Point>, LoadError> {
    let mut points = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with("Value") {
            continue;
        }
        let mut cols = line.split_whitespace();
        let bad = || LoadError::Hgrm {
            line: i + 1,
            text: line.to_string(),
        };
        let value_ms: f64 = cols.next().and_then(|c| c.parse().ok()).ok_or_else(bad)?;
        let quantile: f64 = cols.next().and_then(|c| c.parse().ok()).ok_or_else(bad)?;
        if !(0.0..=1.0).contains(&quantile) {
            return Err(bad());
        }
        points.push(Point { value_ms, quantile });
    }
    Ok(points)
}

/// The percentile curve of a distribution, as [`parse`] would read it back.
pub fn points(latency: &Latency) -> Vec<Point> {
    latency
        .spectrum()
        .into_iter()
        .map(|(us, quantile, _)| Point {
            value_ms: us as f64 / 1000.0,
            quantile,
        })
        .collect()
}

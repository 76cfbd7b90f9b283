//! Answers counted per value of a rotating header (`--header-file` with
//! `--count-per-value`): every answer is tallied by the value its request carried and by
//! wall-clock window, so a per-key rate limit can be checked key by key
//! (`lab/global-limit.sh`'s `keys` part: 10,000 API keys at once, each within 5 % of its
//! limit).
//!
//! Windows are numbered by the wall clock (`unix_ms / window_ms`), as a limiter that counts in
//! fixed windows numbers them, so the tally lines up with the limiter's own windows. A request
//! is placed by the moment it was written.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderName;
use serde::{Deserialize, Serialize};

use crate::clock::now_ns;

/// What a run answered per key and window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KeyCounts {
    /// The header that carried the key.
    pub header: String,
    /// Distinct values (keys), numbered in the order of `--header-file`'s lines.
    pub keys: u32,
    /// Window length, milliseconds.
    pub window_ms: u64,
    /// When the load started (warmup included), Unix milliseconds.
    pub start_unix_ms: u64,
    /// When the measured window ended, Unix milliseconds.
    pub end_unix_ms: u64,
    /// Per window number, per key: `[2xx, 429, anything else or no answer]`.
    pub windows: BTreeMap<u64, Vec<[u32; 3]>>,
}

impl KeyCounts {
    /// The windows the load covered from start to end.
    pub fn full_windows(&self) -> impl Iterator<Item = (u64, &Vec<[u32; 3]>)> {
        let w = self.window_ms.max(1);
        self.windows
            .iter()
            .filter(move |(n, _)| {
                **n * w >= self.start_unix_ms && (**n + 1) * w <= self.end_unix_ms
            })
            .map(|(n, v)| (*n, v))
    }

    /// Adds another tally of the same keys (another thread, stream or process).
    pub fn add(&mut self, other: &KeyCounts) {
        if self.keys == 0 {
            self.header.clone_from(&other.header);
            self.keys = other.keys;
            self.window_ms = other.window_ms;
            self.start_unix_ms = other.start_unix_ms;
            self.end_unix_ms = other.end_unix_ms;
        }
        self.start_unix_ms = self.start_unix_ms.max(other.start_unix_ms);
        self.end_unix_ms = self.end_unix_ms.min(other.end_unix_ms);
        for (w, counts) in &other.windows {
            let mine = self
                .windows
                .entry(*w)
                .or_insert_with(|| vec![[0; 3]; counts.len()]);
            for (m, o) in mine.iter_mut().zip(counts) {
                for i in 0..3 {
                    m[i] += o[i];
                }
            }
        }
    }

    /// One line per full window: how many keys had how many 2xx answers in it.
    pub fn render(&self) -> String {
        let mut o = format!(
            "Per value of {1} ({0} values), each {2} s window: 2xx answers: values with as many\n",
            self.keys,
            self.header,
            self.window_ms as f64 / 1000.0
        );
        for (w, counts) in self.full_windows() {
            let mut hist = BTreeMap::<u32, u32>::new();
            for c in counts {
                *hist.entry(c[0]).or_default() += 1;
            }
            let cells: Vec<String> = hist.iter().map(|(n, k)| format!("{n}: {k}")).collect();
            let total: u64 = counts.iter().map(|c| u64::from(c[0])).sum();
            o.push_str(&format!(
                "  window {w} ({} 2xx): {}\n",
                total,
                cells.join(", ")
            ));
        }
        o
    }
}

/// One generator thread's tally.
#[derive(Debug)]
pub(crate) struct KeyTally {
    header: HeaderName,
    values: usize,
    window_ms: u64,
    /// Unix nanoseconds minus monotonic nanoseconds, read once at the start.
    unix_minus_mono: i128,
    counts: BTreeMap<u64, Vec<[u32; 3]>>,
}

impl KeyTally {
    /// A tally of `values` values of `header` in windows of `window`.
    pub(crate) fn new(header: &HeaderName, values: usize, window: Duration) -> KeyTally {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        KeyTally {
            header: header.clone(),
            values,
            window_ms: (window.as_millis() as u64).max(1),
            unix_minus_mono: unix - i128::from(now_ns()),
            counts: BTreeMap::new(),
        }
    }

    /// Unix milliseconds at monotonic `ns`.
    pub(crate) fn unix_ms(&self, ns: u64) -> u64 {
        u64::try_from((i128::from(ns) + self.unix_minus_mono) / 1_000_000).unwrap_or(0)
    }

    /// Counts an answer for value number `key` written at monotonic `sent_ns`: `Some(status)`, or `None`
    /// for no answer.
    pub(crate) fn record(&mut self, key: usize, sent_ns: u64, status: Option<u16>) {
        let window = self.unix_ms(sent_ns) / self.window_ms;
        let keys = self.values;
        let cell = &mut self
            .counts
            .entry(window)
            .or_insert_with(|| vec![[0; 3]; keys])[key];
        match status {
            Some(s) if (200..300).contains(&s) => cell[0] += 1,
            Some(429) => cell[1] += 1,
            _ => cell[2] += 1,
        }
    }

    /// The tally, for a run that started and ended at these monotonic times.
    pub(crate) fn finish(&mut self, start_ns: u64, end_ns: u64) -> KeyCounts {
        KeyCounts {
            header: self.header.as_str().to_owned(),
            keys: u32::try_from(self.values).unwrap_or(u32::MAX),
            window_ms: self.window_ms,
            start_unix_ms: self.unix_ms(start_ns),
            end_unix_ms: self.unix_ms(end_ns),
            windows: std::mem::take(&mut self.counts),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_count_per_key_and_window_and_only_full_windows_are_listed() {
        let mut lane = KeyTally::new(
            &HeaderName::from_static("x-api-key"),
            3,
            Duration::from_secs(60),
        );
        // Pin the clocks: monotonic 0 is Unix 10 minutes plus 30 s.
        lane.unix_minus_mono = 630_000_000_000;
        let at = |s: u64| s * 1_000_000_000;
        lane.record(1, at(0), Some(200)); // window 10, the partial first one
        lane.record(1, at(40), Some(200)); // window 11
        lane.record(1, at(41), Some(429));
        lane.record(2, at(42), None);
        lane.record(0, at(100), Some(200)); // window 12, partial at the end
        let mut counts = lane.finish(at(0), at(130));
        let full: Vec<_> = counts.full_windows().map(|(w, c)| (w, c.clone())).collect();
        assert_eq!(full, [(11, vec![[0, 0, 0], [1, 1, 0], [0, 0, 1]])]);
        let other = counts.clone();
        counts.add(&other);
        assert_eq!(counts.windows[&11][1], [2, 2, 0]);
        assert!(counts.render().contains("window 11 (2 2xx): 0: 2, 2: 1"));
    }
}

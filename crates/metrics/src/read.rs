//! Reading values back out of a [`Snapshot`]: the numbers a scrape would render, for a
//! consumer in the same process (a status page) that wants them as numbers, not text.
//!
//! A reading sums the same per-thread cells the render sums, at the same cost (one relaxed
//! load per shard and cell); it never takes a lock a serving thread takes. Label values come
//! back from the bytes rendered at creation, unescaped only when they contain an escape.

use std::borrow::Cow;
use std::sync::Arc;

use crate::chunk::Chunk;
use crate::family::FamilyCore;
use crate::metric::Kind;
use crate::render::Snapshot;

impl Snapshot {
    /// The family named `name` (a counter's name without `_total`), if registered.
    /// Linear in the number of families (tens), not series.
    pub fn family(&self, name: &str) -> Option<FamilyReading<'_>> {
        self.families
            .iter()
            .find(|(core, _)| core.name == name)
            .map(|(core, chunks)| FamilyReading { core, chunks })
    }
}

/// One family of a [`Snapshot`], to read its series' values.
#[derive(Debug, Clone, Copy)]
pub struct FamilyReading<'a> {
    core: &'a FamilyCore,
    chunks: &'a [Arc<Chunk>],
}

impl<'a> FamilyReading<'a> {
    /// The family's name (a counter's without `_total`).
    pub fn name(&self) -> &'a str {
        &self.core.name
    }

    /// The position of label `name` in the family's label names (the order of
    /// [`SeriesReading::label_values`]).
    pub fn label_index(&self, name: &str) -> Option<usize> {
        self.core.label_names.iter().position(|l| l == name)
    }

    /// A histogram's finite bucket bounds (empty for other kinds).
    pub fn bounds(&self) -> &'a [f64] {
        self.chunks.first().map_or(&[], |c| &c.bounds)
    }

    /// Every live series, in creation order.
    pub fn series(&self) -> impl Iterator<Item = SeriesReading<'a>> + 'a {
        let kind = self.core.kind;
        self.chunks.iter().flat_map(move |chunk| {
            (0..chunk.slots.len()).filter_map(move |slot| {
                chunk.live_labels(slot).map(|labels| SeriesReading {
                    chunk,
                    slot,
                    labels,
                    kind,
                })
            })
        })
    }
}

/// One series of a [`FamilyReading`].
#[derive(Debug, Clone, Copy)]
pub struct SeriesReading<'a> {
    chunk: &'a Chunk,
    slot: usize,
    labels: &'a [u8],
    kind: Kind,
}

impl<'a> SeriesReading<'a> {
    /// The label values in the family's label-name order.
    pub fn label_values(&self) -> Vec<Cow<'a, str>> {
        parse_label_values(self.labels)
    }

    /// A counter's or gauge's value (a histogram's: its count).
    pub fn value(&self) -> f64 {
        let base = self.slot * self.chunk.cells_per_series;
        match self.kind {
            Kind::Counter => self.chunk.sum_u64(base) as f64,
            Kind::Gauge => self.chunk.sum_u64(base) as i64 as f64,
            Kind::FloatCounter | Kind::FloatGauge => self.chunk.sum_f64(base),
            Kind::Histogram => self.count() as f64,
        }
    }

    /// A histogram's count in each bucket (not cumulative), `+Inf` last, added into `into`
    /// (which is grown to fit); nothing for other kinds.
    pub fn add_buckets(&self, into: &mut Vec<u64>) {
        if self.kind != Kind::Histogram {
            return;
        }
        let n = self.chunk.bounds.len() + 1;
        if into.len() < n {
            into.resize(n, 0);
        }
        let base = self.slot * self.chunk.cells_per_series;
        for (b, total) in into.iter_mut().take(n).enumerate() {
            *total = total.wrapping_add(self.chunk.sum_u64(base + b));
        }
    }

    /// A histogram's sum of observations (0 for other kinds).
    pub fn sum(&self) -> f64 {
        if self.kind != Kind::Histogram {
            return 0.0;
        }
        let base = self.slot * self.chunk.cells_per_series;
        self.chunk.sum_f64(base + self.chunk.bounds.len() + 1)
    }

    fn count(&self) -> u64 {
        let base = self.slot * self.chunk.cells_per_series;
        (0..=self.chunk.bounds.len())
            .map(|b| self.chunk.sum_u64(base + b))
            .fold(0, u64::wrapping_add)
    }
}

/// The values of rendered labels `a="x",b="y\"z"`, unescaped (`\\`, `\"`, `\n`).
fn parse_label_values(mut rest: &[u8]) -> Vec<Cow<'_, str>> {
    let mut values = Vec::new();
    while let Some(open) = rest.iter().position(|&b| b == b'"') {
        let body = &rest[open + 1..];
        let mut end = 0;
        let mut escaped = false;
        while end < body.len() {
            match body[end] {
                b'\\' => {
                    escaped = true;
                    end += 2;
                }
                b'"' => break,
                _ => end += 1,
            }
        }
        let end = end.min(body.len());
        let raw = &body[..end];
        values.push(if escaped {
            let mut out = Vec::with_capacity(raw.len());
            let mut bytes = raw.iter();
            while let Some(&b) = bytes.next() {
                if b == b'\\' {
                    match bytes.next() {
                        Some(b'n') => out.push(b'\n'),
                        Some(&other) => out.push(other),
                        None => {}
                    }
                } else {
                    out.push(b);
                }
            }
            Cow::Owned(String::from_utf8_lossy(&out).into_owned())
        } else {
            String::from_utf8_lossy(raw)
        });
        rest = body.get(end + 1..).unwrap_or(&[]);
    }
    values
}

#[cfg(test)]
mod tests {
    use crate::Registry;

    #[test]
    fn reads_what_the_render_shows() {
        let registry = Registry::builder()
            .self_metrics_prefix(None)
            .build()
            .unwrap();
        let requests = registry.counter("req", "R.", &["route", "status"]).unwrap();
        requests.get_or_create(&["a", "200"]).unwrap().add(3);
        requests
            .get_or_create(&["q\"uo\\te\nx", "500"])
            .unwrap()
            .inc();
        let gauge = registry.gauge("g", "G.", &[]).unwrap();
        gauge.get_or_create(&[]).unwrap().set(-4);
        let latency = registry
            .histogram("lat", "L.", &["route"], &[0.1, 1.0])
            .unwrap();
        let h = latency.get_or_create(&["a"]).unwrap();
        h.observe(0.05);
        h.observe(0.5);
        h.observe(5.0);

        let snapshot = registry.snapshot();
        let req = snapshot.family("req").expect("registered");
        assert_eq!(req.label_index("status"), Some(1));
        let rows: Vec<(Vec<String>, f64)> = req
            .series()
            .map(|s| {
                (
                    s.label_values()
                        .into_iter()
                        .map(|v| v.into_owned())
                        .collect(),
                    s.value(),
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                (vec!["a".to_owned(), "200".to_owned()], 3.0),
                (vec!["q\"uo\\te\nx".to_owned(), "500".to_owned()], 1.0),
            ]
        );
        let g = snapshot.family("g").unwrap().series().next().unwrap();
        assert_eq!(g.value(), -4.0);
        let lat = snapshot.family("lat").unwrap();
        assert_eq!(lat.bounds(), &[0.1, 1.0]);
        let s = lat.series().next().unwrap();
        let mut buckets = Vec::new();
        s.add_buckets(&mut buckets);
        s.add_buckets(&mut buckets);
        assert_eq!(buckets, [2, 2, 2]);
        assert_eq!(s.value(), 3.0);
        assert!((s.sum() - 5.55).abs() < 1e-9);
        assert!(snapshot.family("missing").is_none());
    }
}

//! The scrape path: walks a snapshot of the registry and writes exposition text, a bounded
//! piece at a time, formatting only numbers.
//!
//! Names, labels, `le` values and headers were rendered to bytes when their family or series
//! was created; here each series costs a few `memcpy`s, an atomic load per shard and cell,
//! and `itoa`/`ryu`. Families come out in registration order and series in creation order,
//! so nothing is sorted.

use std::sync::Arc;

use crate::chunk::Chunk;
use crate::family::FamilyCore;
use crate::metric::Kind;
use crate::text::{push_f64, push_i64, push_u64};

/// An exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Prometheus text format 0.0.4.
    Text,
    /// OpenMetrics text 1.0.0 (`# EOF` at the end, counters named without `_total`).
    OpenMetrics,
}

impl Format {
    /// The `Content-Type` of a response in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// The families and chunks one scrape walks. Taking it copies one pointer per family and per
/// chunk; series created afterwards in an existing chunk still show up if the walk has not
/// passed them yet.
#[derive(Debug)]
pub struct Snapshot {
    pub(crate) families: Vec<(Arc<FamilyCore>, Vec<Arc<Chunk>>)>,
}

impl Snapshot {
    pub(crate) fn new(families: &[Arc<FamilyCore>]) -> Self {
        Snapshot {
            families: families
                .iter()
                .map(|core| (Arc::clone(core), core.chunks()))
                .collect(),
        }
    }
}

/// A render in progress: call [`Render::fill`] until it returns `true`.
#[derive(Debug)]
pub struct Render {
    snapshot: Snapshot,
    format: Format,
    family: usize,
    chunk: usize,
    slot: usize,
    header_done: bool,
    done: bool,
}

impl Render {
    /// Starts rendering `snapshot` in `format`.
    pub fn new(snapshot: Snapshot, format: Format) -> Self {
        Render {
            snapshot,
            format,
            family: 0,
            chunk: 0,
            slot: 0,
            header_done: false,
            done: false,
        }
    }

    /// Appends the next whole series to `out` until at least `min_bytes` were appended or
    /// the exposition is complete; returns `true` once it is complete.
    pub fn fill(&mut self, out: &mut Vec<u8>, min_bytes: usize) -> bool {
        let start = out.len();
        let openmetrics = self.format == Format::OpenMetrics;
        while let Some((core, chunks)) = self.snapshot.families.get(self.family) {
            if !self.header_done {
                out.extend_from_slice(if openmetrics {
                    &core.bytes.header_openmetrics
                } else {
                    &core.bytes.header_text
                });
                self.header_done = true;
            }
            while let Some(chunk) = chunks.get(self.chunk) {
                while self.slot < chunk.slots.len() {
                    if let Some(labels) = chunk.live_labels(self.slot) {
                        write_series(out, core, chunk, self.slot, labels);
                    }
                    self.slot += 1;
                    if out.len() - start >= min_bytes {
                        return false;
                    }
                }
                self.chunk += 1;
                self.slot = 0;
            }
            self.family += 1;
            self.chunk = 0;
            self.header_done = false;
        }
        if !self.done {
            if openmetrics {
                out.extend_from_slice(b"# EOF\n");
            }
            self.done = true;
        }
        true
    }
}

#[inline]
fn sample_prefix(out: &mut Vec<u8>, name: &[u8], labels: &[u8]) {
    out.extend_from_slice(name);
    if !labels.is_empty() {
        out.push(b'{');
        out.extend_from_slice(labels);
        out.push(b'}');
    }
    out.push(b' ');
}

#[inline]
fn write_series(out: &mut Vec<u8>, core: &FamilyCore, chunk: &Chunk, slot: usize, labels: &[u8]) {
    let base = slot * chunk.cells_per_series;
    let bytes = &core.bytes;
    match core.kind {
        Kind::Counter => {
            sample_prefix(out, &bytes.sample, labels);
            push_u64(out, chunk.sum_u64(base));
        }
        Kind::Gauge => {
            sample_prefix(out, &bytes.sample, labels);
            push_i64(out, chunk.sum_u64(base) as i64);
        }
        Kind::FloatCounter | Kind::FloatGauge => {
            sample_prefix(out, &bytes.sample, labels);
            push_f64(out, chunk.sum_f64(base));
        }
        Kind::Histogram => {
            let mut cumulative = 0u64;
            for (bucket, le) in bytes.le.iter().enumerate() {
                cumulative = cumulative.wrapping_add(chunk.sum_u64(base + bucket));
                out.extend_from_slice(&bytes.sample);
                out.push(b'{');
                if !labels.is_empty() {
                    out.extend_from_slice(labels);
                    out.push(b',');
                }
                out.extend_from_slice(le);
                out.extend_from_slice(b"} ");
                push_u64(out, cumulative);
                out.push(b'\n');
            }
            sample_prefix(out, &bytes.sum, labels);
            push_f64(out, chunk.sum_f64(base + bytes.le.len()));
            out.push(b'\n');
            sample_prefix(out, &bytes.count, labels);
            push_u64(out, cumulative);
        }
    }
    out.push(b'\n');
}

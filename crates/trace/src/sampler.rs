//! Sampling: the head decision taken when a request arrives (parent-based, a ratio for new
//! traces decided from the trace id) and the tail rule applied when it ends (errors and
//! slow requests are kept even when the head said no).
//!
//! The head decision is what the upstream is told (the `sampled` flag of the `traceparent`
//! the gateway sends). The tail rule can only change what the gateway itself exports: when
//! a request the head dropped fails or is slow, the gateway's spans are exported, but the
//! upstream was told `sampled=00` and, if it follows its parent, recorded nothing; the
//! trace then shows the gateway's server and client spans with no children under them.

use crate::context::SpanContext;
use crate::id::TraceId;

/// The head sampler.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// Follow the caller's `sampled` flag when there is a caller (`parentbased_*`).
    pub parent_based: bool,
    /// The share of new traces sampled, 0.0 to 1.0 (`always_on` is 1.0, `always_off` 0.0).
    pub ratio: f64,
}

impl Default for Sampler {
    /// OpenTelemetry's default: `parentbased_always_on`.
    fn default() -> Sampler {
        Sampler {
            parent_based: true,
            ratio: 1.0,
        }
    }
}

impl Sampler {
    /// Parent-based with a ratio for new traces.
    pub fn parent_based(ratio: f64) -> Sampler {
        Sampler {
            parent_based: true,
            ratio,
        }
    }

    /// The head decision for a span of `trace_id` whose caller is `parent` (or a bare
    /// decision `hint`, as `b3: 0` sends).
    pub fn sample(
        &self,
        parent: Option<&SpanContext>,
        hint: Option<bool>,
        trace_id: TraceId,
    ) -> bool {
        if self.parent_based {
            if let Some(p) = parent {
                return p.sampled;
            }
            if let Some(h) = hint {
                return h;
            }
        }
        ratio_decision(self.ratio, trace_id)
    }
}

/// OpenTelemetry's `TraceIdRatioBased`, as its Rust SDK computes it: the low 8 bytes of the
/// trace id, shifted right once, below `ratio * 2^63`. Every hop that uses the same ratio
/// decides the same for the same trace.
pub fn ratio_decision(ratio: f64, trace_id: TraceId) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio <= 0.0 || ratio.is_nan() {
        return false;
    }
    // ratio < 1, so the product is below 2^63 and the cast is exact enough.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let bound = (ratio * (1u64 << 63) as f64) as u64;
    let low: [u8; 8] = trace_id.0[8..].try_into().expect("16 - 8 = 8 bytes");
    (u64::from_be_bytes(low) >> 1) < bound
}

/// The tail rule: what is exported when the request has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TailRule {
    /// Keep requests that failed (5xx, shed, rate limited, timed out).
    pub keep_errors: bool,
    /// Keep requests that took at least this long (nanoseconds); 0: off.
    pub slow_nanos: u64,
}

impl TailRule {
    /// Whether the request's spans are exported.
    pub fn keep(&self, head_sampled: bool, failed: bool, duration_nanos: u64) -> bool {
        head_sampled
            || (self.keep_errors && failed)
            || (self.slow_nanos > 0 && duration_nanos >= self.slow_nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::SpanId;

    #[test]
    fn parent_based_follows_the_caller() {
        let s = Sampler::parent_based(0.0);
        let parent = SpanContext {
            trace_id: TraceId::random(),
            span_id: SpanId::random(),
            sampled: true,
        };
        assert!(s.sample(Some(&parent), None, parent.trace_id));
        let unsampled = SpanContext {
            sampled: false,
            ..parent
        };
        assert!(!Sampler::parent_based(1.0).sample(Some(&unsampled), None, parent.trace_id));
        assert!(!Sampler::parent_based(1.0).sample(None, Some(false), parent.trace_id));
        let not_parent_based = Sampler {
            parent_based: false,
            ratio: 1.0,
        };
        assert!(not_parent_based.sample(Some(&unsampled), None, parent.trace_id));
    }

    #[test]
    fn the_ratio_is_decided_from_the_trace_id() {
        let mut low = TraceId([0xff; 16]);
        low.0[8..].copy_from_slice(&[0; 8]);
        assert!(ratio_decision(0.0001, low), "the lowest ids are always in");
        assert!(
            !ratio_decision(0.9999, TraceId([0xff; 16])),
            "the highest never"
        );
        let n = 20_000;
        let kept = (0..n)
            .filter(|_| ratio_decision(0.25, TraceId::random()))
            .count();
        // 20 000 draws at p = 0.25: the standard deviation is ~61; 10 of them is never hit.
        assert!((4_400..=5_600).contains(&kept), "{kept}");
    }

    #[test]
    fn the_tail_keeps_errors_and_slow_requests() {
        let rule = TailRule {
            keep_errors: true,
            slow_nanos: 1_000,
        };
        assert!(rule.keep(true, false, 0));
        assert!(rule.keep(false, true, 0));
        assert!(rule.keep(false, false, 1_000));
        assert!(!rule.keep(false, false, 999));
        assert!(!TailRule::default().keep(false, true, u64::MAX));
    }
}

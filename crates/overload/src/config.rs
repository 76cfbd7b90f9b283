//! The `[overload]` section of the gateway's config file (embedded by crates/proxy's config
//! with `deny_unknown_fields`), and what it builds.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::breaker::BreakerConfig;
use crate::class::Class;
use crate::limit::LimitConfig;
use crate::sampler::Smoothing;
use crate::shedder::{Mode, ShedderConfig};

/// Which shedder runs (`tailguard run --overload off|adaptive|gozero` overrides it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OverloadMode {
    /// No shedding and no breaker: the no-op implementations.
    #[default]
    Off,
    /// The corrected algorithm (research §9).
    Adaptive,
    /// go-zero's formulas exactly (A/B runs), with go-zero's breaker.
    Gozero,
}

impl OverloadMode {
    /// Parses `off`, `adaptive` or `gozero`.
    pub fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "off" => Ok(Self::Off),
            "adaptive" => Ok(Self::Adaptive),
            "gozero" => Ok(Self::Gozero),
            other => Err(Error::Config(format!(
                "overload mode must be off, adaptive or gozero, got `{other}`"
            ))),
        }
    }
}

/// `[overload]`:
///
/// ```toml
/// [overload]
/// mode = "adaptive"        # off | adaptive | gozero
/// threshold = 0.9          # CPU share of the allowed cores that counts as overloaded
/// cpu_trigger = true       # shed on the CPU; false: only on in-flight (CPU not read)
/// breaker = true           # adaptive breaker per (upstream, route)
/// upstream_limit = true    # latency-driven concurrency limit per upstream (adaptive)
/// [overload.classes]       # priority class per route id (default: normal)
/// checkout = "high"
/// reports = "low"
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OverloadConfig {
    /// Which shedder runs.
    pub mode: OverloadMode,
    /// CPU threshold as a share of the allowed cores, in (0, 1).
    pub threshold: f64,
    /// Cool-off after the last overloaded moment, in milliseconds.
    pub cool_off_ms: u64,
    /// Read the CPU and turn hot on it (`threshold`). Off, the CPU is not read (it counts
    /// as idle): for a gateway whose CPU reading is mostly other work (a host or cgroup
    /// shared with builds or batch jobs), where only the in-flight triggers and the
    /// upstream limits should act.
    pub cpu_trigger: bool,
    /// Run the adaptive breaker per (upstream, route) when shedding is on.
    pub breaker: bool,
    /// Run the latency-driven concurrency limit of each upstream (`adaptive` mode only).
    pub upstream_limit: bool,
    /// Priority class per route id.
    pub classes: BTreeMap<String, Class>,
}

impl Default for OverloadConfig {
    fn default() -> Self {
        Self {
            mode: OverloadMode::Off,
            threshold: 0.9,
            cool_off_ms: 1000,
            cpu_trigger: true,
            breaker: true,
            upstream_limit: true,
            classes: BTreeMap::new(),
        }
    }
}

impl OverloadConfig {
    /// Checks ranges (the shedder config it builds is validated too).
    pub fn validate(&self) -> Result<(), Error> {
        if !(self.threshold > 0.0 && self.threshold < 1.0) {
            return Err(Error::Config(format!(
                "overload.threshold must be in (0, 1), got {}",
                self.threshold
            )));
        }
        if self.mode != OverloadMode::Off {
            self.shedder_config().expect("mode is not off").validate()?;
        }
        Ok(())
    }

    /// The class of route `id`.
    pub fn class_of(&self, route_id: &str) -> Class {
        self.classes.get(route_id).copied().unwrap_or_default()
    }

    /// The shedder's configuration, `None` when off.
    pub fn shedder_config(&self) -> Option<ShedderConfig> {
        let base = match self.mode {
            OverloadMode::Off => return None,
            OverloadMode::Adaptive => ShedderConfig::adaptive(),
            OverloadMode::Gozero => ShedderConfig::gozero(),
        };
        Some(ShedderConfig {
            threshold: (self.threshold * 1000.0).round() as u32,
            cool_off: Duration::from_millis(self.cool_off_ms),
            ..base
        })
    }

    /// CPU smoothing for the sampler.
    pub fn smoothing(&self) -> Smoothing {
        match self.mode {
            OverloadMode::Gozero => Smoothing::GoZero,
            _ => Smoothing::adaptive(),
        }
    }

    /// The breaker's configuration, `None` when off or disabled.
    pub fn breaker_config(&self) -> Option<BreakerConfig> {
        match (self.mode, self.breaker) {
            (OverloadMode::Off, _) | (_, false) => None,
            (OverloadMode::Adaptive, true) => Some(BreakerConfig::adaptive()),
            (OverloadMode::Gozero, true) => Some(BreakerConfig::gozero()),
        }
    }

    /// The configuration of each upstream's concurrency limit, `None` unless `adaptive`
    /// with `upstream_limit` on (go-zero has none: `gozero` stays go-zero).
    pub fn limit_config(&self) -> Option<LimitConfig> {
        (self.mode == OverloadMode::Adaptive && self.upstream_limit).then(LimitConfig::default)
    }

    /// The shedding mode of the built shedder.
    pub fn shedder_mode(&self) -> Option<Mode> {
        self.shedder_config().map(|c| c.mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_section() {
        let c: OverloadConfig = toml::from_str(
            "mode = \"adaptive\"\nthreshold = 0.85\n[classes]\ncheckout = \"high\"\nreports = \"low\"\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.class_of("checkout"), Class::High);
        assert_eq!(c.class_of("other"), Class::Normal);
        assert_eq!(c.shedder_config().unwrap().threshold, 850);
        assert!(c.breaker_config().is_some());
        assert!(c.limit_config().is_some());
        let gozero = OverloadConfig {
            mode: OverloadMode::Gozero,
            ..c.clone()
        };
        assert!(gozero.limit_config().is_none(), "gozero stays go-zero");
        let without = OverloadConfig {
            upstream_limit: false,
            ..c
        };
        assert!(without.limit_config().is_none());
        assert!(OverloadConfig::default().cpu_trigger);
        let off: OverloadConfig =
            toml::from_str("mode = \"adaptive\"\ncpu_trigger = false\n").unwrap();
        assert!(!off.cpu_trigger);
        off.validate().unwrap();
    }

    #[test]
    fn rejects_unknown_fields_and_bad_values() {
        let err = toml::from_str::<OverloadConfig>("treshold = 0.9\n").unwrap_err();
        assert!(
            err.to_string().contains("unknown field `treshold`"),
            "{err}"
        );
        let err = toml::from_str::<OverloadConfig>("[classes]\na = \"urgent\"\n").unwrap_err();
        assert!(
            err.to_string().contains("unknown variant `urgent`"),
            "{err}"
        );
        let c = OverloadConfig {
            threshold: 1.0,
            ..OverloadConfig::default()
        };
        assert!(c.validate().is_err());
        assert!(OverloadMode::parse("fast").is_err());
        assert_eq!(OverloadConfig::default().shedder_config(), None);
    }
}

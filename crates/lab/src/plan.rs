//! A condition's plan: each stream's path, connections and rate (or phases), resolved from
//! the scenario and the capacities measured before, and the window the streams share.

use std::collections::BTreeMap;
use std::time::Duration;

use tailguard_loadgen::schedule::Phase;
use tailguard_loadgen::timeline::Timeline;

use crate::scenario::{Condition, PhaseSpec, Scenario};

/// One stream of a condition, resolved: its path, connections and rate over time.
#[derive(Debug, Clone)]
pub(crate) struct StreamPlan {
    /// Empty for a scenario without `[[load.streams]]`.
    pub(crate) name: String,
    pub(crate) path: String,
    pub(crate) connections: usize,
    /// The rate, or the first phase's.
    pub(crate) rate: f64,
    /// Empty: `rate` throughout.
    pub(crate) phases: Vec<Phase>,
}

/// A condition's streams and measured window.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) streams: Vec<StreamPlan>,
    pub(crate) duration: Duration,
}

impl StreamPlan {
    pub(crate) fn mean_rate(&self, window: Duration) -> f64 {
        if self.phases.is_empty() {
            return self.rate;
        }
        let t = Timeline::new(&self.phases, self.rate, window.as_secs_f64());
        t.phases
            .iter()
            .map(|p| p.rate * (p.end_s - p.start_s).max(0.0))
            .sum::<f64>()
            / window.as_secs_f64().max(1e-9)
    }

    pub(crate) fn describe(&self) -> String {
        if self.phases.is_empty() {
            return format!("{:.0}", self.rate);
        }
        let rates: Vec<String> = self
            .phases
            .iter()
            .map(|p| format!("{:.0}", p.rate))
            .collect();
        let secs: Vec<String> = self
            .phases
            .iter()
            .map(|p| {
                let s = p.duration.as_secs_f64();
                if s.fract() == 0.0 {
                    format!("{s:.0}")
                } else {
                    format!("{s:.1}")
                }
            })
            .collect();
        format!("{} ({} s)", rates.join(" / "), secs.join("+"))
    }
}

impl Plan {
    pub(crate) fn mean_rate(&self) -> f64 {
        self.streams
            .iter()
            .map(|s| s.mean_rate(self.duration))
            .sum()
    }

    pub(crate) fn describe(&self) -> String {
        match &self.streams[..] {
            [one] if one.name.is_empty() => one.describe(),
            streams => {
                let parts: Vec<String> = streams
                    .iter()
                    .map(|s| format!("{} {}", s.name, s.describe()))
                    .collect();
                parts.join(" + ")
            }
        }
    }
}

/// The rate (or phases) of one stream from a rate, a factor of `capacity`, or phases.
fn resolve_rate(
    rate: Option<f64>,
    factor: Option<f64>,
    phases: &[PhaseSpec],
    capacity: Option<f64>,
    default: f64,
) -> Result<(f64, Vec<Phase>), String> {
    let one = |rate: Option<f64>, factor: Option<f64>| match (rate, factor, capacity) {
        (Some(r), _, _) => Ok(r),
        (None, Some(0.0), _) => Ok(0.0),
        (None, Some(f), Some(cap)) => Ok((f * cap).max(1.0)),
        (None, Some(_), None) => Err("no capacity measured, so no rate".to_string()),
        (None, None, _) => Ok(default),
    };
    if phases.is_empty() {
        return Ok((one(rate, factor)?, Vec::new()));
    }
    let phases = phases
        .iter()
        .map(|p| {
            Ok(Phase {
                rate: one(p.rate, p.rate_factor)?,
                duration: p.duration,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok((phases[0].rate, phases))
}

/// A condition's streams (streams at rate 0 are left out) and window.
pub(crate) fn plan(
    scenario: &Scenario,
    cond: &Condition,
    capacities: &BTreeMap<String, f64>,
) -> Result<Plan, String> {
    let l = &scenario.load;
    let mut streams = Vec::new();
    if l.streams.is_empty() {
        let (rate, phases) = resolve_rate(
            cond.rate,
            cond.rate_factor,
            &cond.phases,
            capacities.get("").copied(),
            l.rate,
        )?;
        streams.push(StreamPlan {
            name: String::new(),
            path: l.path.clone(),
            connections: l.connections,
            rate,
            phases,
        });
    } else {
        for st in &l.streams {
            let r = scenario.stream_rate(cond, st);
            let (rate, phases) = resolve_rate(
                r.rate,
                r.rate_factor,
                &r.phases,
                capacities.get(&st.name).copied(),
                0.0,
            )?;
            if rate == 0.0 && phases.iter().all(|p| p.rate == 0.0) {
                continue;
            }
            streams.push(StreamPlan {
                name: st.name.clone(),
                path: st.path.clone(),
                connections: st.connections.unwrap_or(l.connections),
                rate,
                phases,
            });
        }
    }
    let stepped = streams
        .iter()
        .map(|s| s.phases.iter().map(|p| p.duration).sum::<Duration>())
        .max()
        .unwrap_or_default();
    Ok(Plan {
        duration: if stepped.is_zero() {
            l.duration
        } else {
            stepped
        },
        streams,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    const STREAMS: &str = r#"
name = "t"
description = "d"
[load]
rate = 100
duration = "3s"
connections = 4
[[load.streams]]
name = "a"
path = "/a"
connections = 32
[[load.streams]]
name = "b"
path = "/b"
rate = 20
[capacity]
probe_rate = 1000
duration = "1s"
[upstream_b]
args = []
[[condition]]
name = "b alone"
streams = { b = { rate_factor = 0.5 } }
[[condition]]
name = "a steps, b default"
streams = { a = { phases = [{ rate_factor = 1.0, duration = "2s" }, { rate_factor = 10.0, duration = "4s" }] } }
"#;

    #[test]
    fn each_condition_plans_its_streams_from_their_own_capacities() {
        let s = crate::scenario::Scenario::parse(STREAMS, std::path::Path::new("t")).unwrap();
        let caps = [("a".to_string(), 270.0), ("b".to_string(), 400.0)].into();
        let alone = super::plan(&s, &s.conditions[0], &caps).unwrap();
        // a is not named and has no default: not sent.
        assert_eq!(alone.streams.len(), 1);
        assert_eq!(
            (alone.streams[0].name.as_str(), alone.streams[0].rate),
            ("b", 200.0)
        );
        assert_eq!(alone.duration, Duration::from_secs(3));
        assert_eq!(alone.describe(), "b 200");
        let both = super::plan(&s, &s.conditions[1], &caps).unwrap();
        let a = &both.streams[0];
        assert_eq!((a.connections, a.phases.len()), (32, 2));
        assert_eq!((a.phases[0].rate, a.phases[1].rate), (270.0, 2700.0));
        assert_eq!(both.streams[1].rate, 20.0);
        // The stepped stream sets the window; the other one runs through it.
        assert_eq!(both.duration, Duration::from_secs(6));
        assert_eq!(both.describe(), "a 270 / 2700 (2+4 s) + b 20");
        assert!((both.mean_rate() - (270.0 * 2.0 + 2700.0 * 4.0) / 6.0 - 20.0).abs() < 1e-9);
        let none = super::plan(&s, &s.conditions[1], &Default::default()).unwrap_err();
        assert!(none.contains("no capacity"), "{none}");
    }
}

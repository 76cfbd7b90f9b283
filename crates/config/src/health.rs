//! The `[upstreams.health]` table: active checks and passive ejection, as written in the
//! config file, and its checks (each problem with the span of the field it is about).

use std::ops::{Range, RangeInclusive};
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use toml::Spanned;

/// Health checks and outlier ejection of one upstream's endpoints. Without this table an
/// upstream's endpoints are never checked and never ejected.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthConfig {
    /// Path (and query) of the active check (`GET` over HTTP/1.1). Active checks run only
    /// when it is set.
    #[serde(default)]
    pub path: Option<Spanned<String>>,
    /// Time between the starts of two checks of the same endpoint.
    #[serde(default = "default_interval_ms")]
    pub interval_ms: Spanned<u64>,
    /// A check that has no status line after this long failed (connect included).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: Spanned<u64>,
    /// Consecutive passed checks that bring a down endpoint back.
    #[serde(default = "default_healthy")]
    pub healthy: Spanned<u32>,
    /// Consecutive failed checks that take an endpoint down.
    #[serde(default = "default_unhealthy")]
    pub unhealthy: Spanned<u32>,
    /// Statuses that pass a check: `"200-399"`, `204`, or a list of both.
    #[serde(default = "default_expect_status")]
    pub expect_status: Spanned<ExpectStatus>,
    /// Consecutive failed requests (connect errors, timeouts, broken exchanges, 502/503/504
    /// answers) that eject an endpoint; 0 disables passive ejection.
    #[serde(default = "default_consecutive_failures")]
    pub consecutive_failures: Spanned<u32>,
    /// How long a first ejection lasts; each repeat doubles it, up to
    /// [`MAX_EJECTION_FACTOR`] times this.
    #[serde(default = "default_ejection_ms")]
    pub ejection_ms: Spanned<u64>,
    /// Passive ejection never leaves more than this share (percent) of the upstream's
    /// endpoints out of service.
    #[serde(default = "default_max_ejected_percent")]
    pub max_ejected_percent: Spanned<u32>,
}

/// The longest ejection is this many times `ejection_ms`: doubling stops there (30 s, 60 s,
/// 120 s, 240 s, then 300 s with the defaults: Envoy's default `max_ejection_time` is also
/// 300 s), so an endpoint that recovered is tried again within minutes, never hours.
pub const MAX_EJECTION_FACTOR: u32 = 10;

fn spanned<T>(v: T) -> Spanned<T> {
    Spanned::new(0..0, v)
}
fn default_interval_ms() -> Spanned<u64> {
    spanned(5_000)
}
fn default_timeout_ms() -> Spanned<u64> {
    spanned(1_000)
}
fn default_healthy() -> Spanned<u32> {
    spanned(2)
}
fn default_unhealthy() -> Spanned<u32> {
    spanned(3)
}
fn default_expect_status() -> Spanned<ExpectStatus> {
    spanned(ExpectStatus(vec![StatusItem::Text("200-399".to_owned())]))
}
fn default_consecutive_failures() -> Spanned<u32> {
    spanned(5)
}
fn default_ejection_ms() -> Spanned<u64> {
    spanned(30_000)
}
fn default_max_ejected_percent() -> Spanned<u32> {
    spanned(50)
}

/// `expect_status` as written: each item a code (`204`) or a string (`"204"`, `"200-399"`).
/// [`ExpectStatus::ranges`] turns it into ranges; [`HealthConfig::check`] reports the bad
/// ones with the field's position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectStatus(Vec<StatusItem>);

/// One item of `expect_status`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum StatusItem {
    Code(i64),
    Text(String),
}

impl ExpectStatus {
    /// The ranges of statuses that pass, or what is wrong with the first bad item.
    pub fn ranges(&self) -> Result<Vec<RangeInclusive<u16>>, String> {
        if self.0.is_empty() {
            return Err("needs at least one status or range".to_owned());
        }
        self.0.iter().map(StatusItem::range).collect()
    }
}

impl StatusItem {
    fn range(&self) -> Result<RangeInclusive<u16>, String> {
        let code = |n: i64| -> Result<u16, String> {
            u16::try_from(n)
                .ok()
                .filter(|c| (100..=599).contains(c))
                .ok_or_else(|| format!("{n} is not a status code (100..=599)"))
        };
        let text_code = |t: &str| -> Result<u16, String> {
            match t.trim().parse::<i64>() {
                Ok(n) => code(n),
                Err(_) => Err(format!("`{t}` is not a status or a range like \"200-399\"")),
            }
        };
        match self {
            StatusItem::Code(n) => code(*n).map(|c| c..=c),
            StatusItem::Text(t) => match t.split_once('-') {
                Some((lo, hi)) => {
                    let (lo, hi) = (text_code(lo)?, text_code(hi)?);
                    if lo > hi {
                        return Err(format!("range `{t}` is empty (its start is above its end)"));
                    }
                    Ok(lo..=hi)
                }
                None => text_code(t).map(|c| c..=c),
            },
        }
    }
}

const EXPECTED: &str =
    "a status (204), a range (\"200-399\"), or a list of them ([\"200-299\", 418])";

impl<'de> Deserialize<'de> for StatusItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Item;
        impl Visitor<'_> for Item {
            type Value = StatusItem;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<StatusItem, E> {
                Ok(StatusItem::Code(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<StatusItem, E> {
                Ok(StatusItem::Code(i64::try_from(v).unwrap_or(i64::MAX)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StatusItem, E> {
                Ok(StatusItem::Text(v.to_owned()))
            }
        }
        d.deserialize_any(Item)
    }
}

impl<'de> Deserialize<'de> for ExpectStatus {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Items;
        impl<'de> Visitor<'de> for Items {
            type Value = ExpectStatus;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(EXPECTED)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ExpectStatus, E> {
                Ok(ExpectStatus(vec![StatusItem::Code(v)]))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ExpectStatus, E> {
                Ok(ExpectStatus(vec![StatusItem::Code(
                    i64::try_from(v).unwrap_or(i64::MAX),
                )]))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ExpectStatus, E> {
                Ok(ExpectStatus(vec![StatusItem::Text(v.to_owned())]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ExpectStatus, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<StatusItem>()? {
                    items.push(item);
                }
                Ok(ExpectStatus(items))
            }
        }
        d.deserialize_any(Items)
    }
}

/// The active check of an upstream, ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveCheck {
    /// Path and query requested.
    pub path: String,
    /// Between the starts of two rounds.
    pub interval: Duration,
    /// Bound on one probe, connect included.
    pub timeout: Duration,
    /// Consecutive passes to come back.
    pub healthy: u32,
    /// Consecutive failures to go down.
    pub unhealthy: u32,
    /// Statuses that pass.
    pub expect: Vec<RangeInclusive<u16>>,
}

impl ActiveCheck {
    /// Whether `status` passes the check.
    pub fn passes(&self, status: u16) -> bool {
        self.expect.iter().any(|r| r.contains(&status))
    }
}

/// Passive ejection (outlier detection) of an upstream, ready to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ejection {
    /// Consecutive failed requests that eject an endpoint (at least 1).
    pub consecutive_failures: u32,
    /// A first ejection's length.
    pub base: Duration,
    /// At most this share of the endpoints may be out of service after an ejection.
    pub max_ejected_percent: u32,
}

impl HealthConfig {
    /// The active check, when `path` is set.
    pub fn active(&self) -> Option<ActiveCheck> {
        let path = self.path.as_ref()?.get_ref().clone();
        Some(ActiveCheck {
            path,
            interval: Duration::from_millis(*self.interval_ms.get_ref()),
            timeout: Duration::from_millis(*self.timeout_ms.get_ref()),
            healthy: *self.healthy.get_ref(),
            unhealthy: *self.unhealthy.get_ref(),
            // Checked by `check`; an invalid config never gets here.
            expect: self.expect_status.get_ref().ranges().unwrap_or_default(),
        })
    }

    /// Passive ejection, unless `consecutive_failures` is 0.
    pub fn ejection(&self) -> Option<Ejection> {
        let n = *self.consecutive_failures.get_ref();
        (n > 0).then(|| Ejection {
            consecutive_failures: n,
            base: Duration::from_millis(*self.ejection_ms.get_ref()),
            max_ejected_percent: *self.max_ejected_percent.get_ref(),
        })
    }

    /// Every problem: the span of the field (none for a default), the field's name under
    /// `health.`, and the message.
    pub fn check(&self) -> Vec<(Option<Range<usize>>, &'static str, String)> {
        let mut out = Vec::new();
        let mut push = |span: Range<usize>, field: &'static str, message: String| {
            out.push(((!span.is_empty()).then_some(span), field, message));
        };
        if let Some(p) = &self.path {
            let text = p.get_ref();
            if !text.starts_with('/') || text.parse::<http::uri::PathAndQuery>().is_err() {
                push(
                    p.span(),
                    "path",
                    format!("`{text}` is not a request path (it must start with `/`)"),
                );
            }
        }
        for (field, value) in [
            ("interval_ms", &self.interval_ms),
            ("timeout_ms", &self.timeout_ms),
        ] {
            if *value.get_ref() == 0 {
                push(value.span(), field, "must be at least 1".to_owned());
            }
        }
        for (field, value) in [("healthy", &self.healthy), ("unhealthy", &self.unhealthy)] {
            if *value.get_ref() == 0 {
                push(value.span(), field, "must be at least 1".to_owned());
            }
        }
        if let Err(message) = self.expect_status.get_ref().ranges() {
            push(self.expect_status.span(), "expect_status", message);
        }
        if *self.consecutive_failures.get_ref() > 0 && *self.ejection_ms.get_ref() == 0 {
            push(
                self.ejection_ms.span(),
                "ejection_ms",
                "must be at least 1 (set `consecutive_failures = 0` to disable ejection)"
                    .to_owned(),
            );
        }
        if *self.max_ejected_percent.get_ref() > 100 {
            push(
                self.max_ejected_percent.span(),
                "max_ejected_percent",
                format!("{} is outside 0..=100", self.max_ejected_percent.get_ref()),
            );
        }
        out
    }
}

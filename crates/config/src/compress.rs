//! `compress = { algorithms, min_bytes, types, level }` of a route or a listener: the config
//! as written, and the form it compiles to at load (the codings in the order of preference,
//! each coding's level, the media types sorted for a binary search), so a response's check
//! allocates nothing. The compilation is also the check: every problem has its field and
//! position. What a request and its response get from it is decided by
//! `tailguard_policy::compress`; the encoders are `tailguard-compress`'s.

use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

/// `min_bytes` when none is written: a body shorter than about one TCP segment gains
/// nothing worth the CPU (Caddy's `minimum_length` is 512, nginx's `gzip_min_length` 20;
/// the issue's example is 1024, a body that fits a 1500-byte packet either way).
pub const DEFAULT_MIN_BYTES: u64 = 1024;

/// gzip's level when none is written: nginx's default `gzip_comp_level` (1), the cheapest
/// CPU per response.
pub const DEFAULT_GZIP_LEVEL: u32 = 1;
/// Brotli's level when none is written: 4, where on-the-fly brotli is usually set
/// (Cloudflare's default for dynamic content): about gzip 6's ratio or better at a fraction
/// of brotli 6 to 11's CPU.
pub const DEFAULT_BR_LEVEL: u32 = 4;
/// zstd's level when none is written: zstd's own default (3), which Caddy's `encode zstd`
/// uses too.
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;

/// The media types compressed when `types` is not written: text that compresses well, as
/// nginx and Caddy list it (Caddy's `encode` defaults, plus `text/csv`, `text/markdown` and
/// a few `+json`/`+xml` types). Images, video, archives and fonts in `woff`/`woff2` are
/// compressed already and never listed. `text/event-stream` is not here: it is compressed
/// only when listed by name, and then flushed per frame (`tailguard_policy::compress`).
pub const DEFAULT_TYPES: &[&str] = &[
    "application/atom+xml",
    "application/geo+json",
    "application/graphql-response+json",
    "application/javascript",
    "application/json",
    "application/ld+json",
    "application/manifest+json",
    "application/problem+json",
    "application/problem+xml",
    "application/rss+xml",
    "application/vnd.api+json",
    "application/wasm",
    "application/x-javascript",
    "application/xhtml+xml",
    "application/xml",
    "font/otf",
    "font/ttf",
    "image/svg+xml",
    "image/x-icon",
    "text/*",
];

/// `compress = { .. }` of a route or listener, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompressConfig {
    /// The codings offered, most preferred first (`zstd`, `br`, `gzip`); a client's
    /// `Accept-Encoding` picks among them by its q-values, ties by this order. Default: all
    /// three in that order.
    #[serde(default)]
    pub algorithms: Option<Spanned<Vec<Spanned<String>>>>,
    /// A body whose length is known and shorter than this is sent as it is (default 1024).
    #[serde(default)]
    pub min_bytes: Option<Spanned<u64>>,
    /// Media types compressed (`type/subtype`, or `type/*`); default [`DEFAULT_TYPES`].
    #[serde(default)]
    pub types: Option<Spanned<Vec<Spanned<String>>>>,
    /// One level for every coding listed, or `{ gzip = .., br = .., zstd = .. }`.
    #[serde(default)]
    pub level: Option<Spanned<LevelConfig>>,
}

/// `level`: one number for all codings, or one per coding.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum LevelConfig {
    /// The same level for every coding listed (each must accept it).
    All(i64),
    /// A level per coding; a coding not named keeps its default.
    Each(EachLevel),
}

/// `level = { gzip = .., br = .., zstd = .. }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EachLevel {
    /// 1 to 9 (default 1).
    #[serde(default)]
    pub gzip: Option<i64>,
    /// 0 to 11 (default 4).
    #[serde(default)]
    pub br: Option<i64>,
    /// 1 to 19 (default 3; 20 to 22 need windows far larger than a stream's bound).
    #[serde(default)]
    pub zstd: Option<i64>,
}

/// A content coding the gateway can apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// `gzip` (RFC 1952).
    Gzip,
    /// `br` (RFC 7932).
    Br,
    /// `zstd` (RFC 8878).
    Zstd,
}

impl Coding {
    /// The token in `Accept-Encoding` and `Content-Encoding`.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Br => "br",
            Coding::Zstd => "zstd",
        }
    }

    fn from_token(text: &str) -> Option<Coding> {
        match text {
            "gzip" => Some(Coding::Gzip),
            "br" => Some(Coding::Br),
            "zstd" => Some(Coding::Zstd),
            _ => None,
        }
    }

    /// The levels a coding accepts.
    fn levels(self) -> std::ops::RangeInclusive<i64> {
        match self {
            Coding::Gzip => 1..=9,
            Coding::Br => 0..=11,
            // 20 to 22 ("ultra") need a window of 8 MiB and more, far past a stream's bound.
            Coding::Zstd => 1..=19,
        }
    }
}

/// A problem found compiling `compress`: where, the field after `compress.`, and what.
pub type Problem = (Option<Range<usize>>, String, String);

/// A route's or listener's compression, compiled.
#[derive(Debug, Clone)]
pub struct Compress {
    /// The codings offered, most preferred first (never empty).
    pub algorithms: Box<[Coding]>,
    /// gzip's level.
    pub gzip_level: u32,
    /// Brotli's level.
    pub br_level: u32,
    /// zstd's level.
    pub zstd_level: i32,
    /// A body of a known length below this is not compressed.
    pub min_bytes: u64,
    /// The media types compressed.
    pub types: Types,
}

impl Compress {
    /// The level configured for `coding`.
    pub fn level(&self, coding: Coding) -> i32 {
        match coding {
            // Both at most 11: the casts cannot truncate.
            Coding::Gzip => self.gzip_level as i32,
            Coding::Br => self.br_level as i32,
            Coding::Zstd => self.zstd_level,
        }
    }
}

/// The media types compressed: exact `type/subtype` names and `type/*` prefixes,
/// lowercase.
#[derive(Debug, Clone, Default)]
pub struct Types {
    /// `type/subtype`, sorted for a binary search.
    pub exact: Box<[Box<str>]>,
    /// `type/` of each `type/*`.
    pub prefixes: Box<[Box<str>]>,
}

impl Types {
    /// Whether a `Content-Type` value's media type (parameters ignored, any case) is listed.
    /// `text/event-stream` matches only when listed by name, never through `text/*`: an
    /// event stream is compressed only by an operator who asked for it. Allocates nothing
    /// for a media type of up to 64 bytes.
    pub fn matches(&self, content_type: &[u8]) -> bool {
        let essence = content_type
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        let mut buf = [0u8; 64];
        let Some(lower) = buf.get_mut(..essence.len()) else {
            return false;
        };
        lower.copy_from_slice(essence);
        lower.make_ascii_lowercase();
        let lower = &*lower;
        if self
            .exact
            .binary_search_by(|t| t.as_bytes().cmp(lower))
            .is_ok()
        {
            return true;
        }
        lower != b"text/event-stream"
            && self
                .prefixes
                .iter()
                .any(|p| lower.starts_with(p.as_bytes()) && lower.len() > p.len())
    }
}

impl CompressConfig {
    /// Compiles the config; every problem with its field (after `compress.`) and position.
    pub fn compile(&self) -> Result<Compress, Vec<Problem>> {
        let mut problems: Vec<Problem> = Vec::new();
        let mut algorithms = Vec::new();
        match &self.algorithms {
            None => algorithms.extend([Coding::Zstd, Coding::Br, Coding::Gzip]),
            Some(list) => {
                if list.get_ref().is_empty() {
                    problems.push((
                        Some(list.span()),
                        "algorithms".to_owned(),
                        "needs at least one of `zstd`, `br`, `gzip`".to_owned(),
                    ));
                }
                for (i, a) in list.get_ref().iter().enumerate() {
                    let field = format!("algorithms[{i}]");
                    match Coding::from_token(a.get_ref()) {
                        Some(c) if algorithms.contains(&c) => problems.push((
                            Some(a.span()),
                            field,
                            format!("`{}` is listed twice", a.get_ref()),
                        )),
                        Some(c) => algorithms.push(c),
                        None => problems.push((
                            Some(a.span()),
                            field,
                            format!(
                                "`{}` is not a coding the gateway applies: `zstd`, `br` or \
                                 `gzip`",
                                a.get_ref()
                            ),
                        )),
                    }
                }
            }
        }

        let (mut gzip, mut br, mut zstd) = (
            i64::from(DEFAULT_GZIP_LEVEL),
            i64::from(DEFAULT_BR_LEVEL),
            i64::from(DEFAULT_ZSTD_LEVEL),
        );
        if let Some(level) = &self.level {
            let mut set = |coding: Coding, value: i64, field: &str, slot: &mut i64| {
                if coding.levels().contains(&value) {
                    *slot = value;
                } else {
                    let range = coding.levels();
                    problems.push((
                        Some(level.span()),
                        field.to_owned(),
                        format!(
                            "{value} is not a {} level: {} to {}",
                            coding.token(),
                            range.start(),
                            range.end()
                        ),
                    ));
                }
            };
            match level.get_ref() {
                LevelConfig::All(value) => {
                    for &c in &algorithms {
                        let slot = match c {
                            Coding::Gzip => &mut gzip,
                            Coding::Br => &mut br,
                            Coding::Zstd => &mut zstd,
                        };
                        set(c, *value, "level", slot);
                    }
                }
                LevelConfig::Each(each) => {
                    for (c, value, slot) in [
                        (Coding::Gzip, each.gzip, &mut gzip),
                        (Coding::Br, each.br, &mut br),
                        (Coding::Zstd, each.zstd, &mut zstd),
                    ] {
                        if let Some(v) = value {
                            set(c, v, &format!("level.{}", c.token()), slot);
                        }
                    }
                }
            }
        }

        let mut exact = Vec::new();
        let mut prefixes = Vec::new();
        let written: Vec<(Option<Range<usize>>, &str)> = match &self.types {
            None => DEFAULT_TYPES.iter().map(|t| (None, *t)).collect(),
            Some(list) => {
                if list.get_ref().is_empty() {
                    problems.push((
                        Some(list.span()),
                        "types".to_owned(),
                        "needs at least one media type (leave `types` out for the defaults)"
                            .to_owned(),
                    ));
                }
                list.get_ref()
                    .iter()
                    .map(|t| (Some(t.span()), t.get_ref().as_str()))
                    .collect()
            }
        };
        for (i, (span, text)) in written.into_iter().enumerate() {
            let lower = text.to_ascii_lowercase();
            match media_type(&lower) {
                Ok(MediaType::Exact) => exact.push(lower.into_boxed_str()),
                Ok(MediaType::Prefix(p)) => prefixes.push(p.into()),
                Err(why) => problems.push((span, format!("types[{i}]"), why)),
            }
        }
        exact.sort();
        exact.dedup();

        if !problems.is_empty() {
            return Err(problems);
        }
        // Each level was checked against its coding's range above.
        let to_u32 = |v: i64| u32::try_from(v).unwrap_or_default();
        Ok(Compress {
            algorithms: algorithms.into_boxed_slice(),
            gzip_level: to_u32(gzip),
            br_level: to_u32(br),
            zstd_level: i32::try_from(zstd).unwrap_or_default(),
            min_bytes: self
                .min_bytes
                .as_ref()
                .map_or(DEFAULT_MIN_BYTES, |m| *m.get_ref()),
            types: Types {
                exact: exact.into_boxed_slice(),
                prefixes: prefixes.into_boxed_slice(),
            },
        })
    }

    /// The problems of [`CompressConfig::compile`], for `tailguard check` and a load.
    pub fn check(&self) -> Vec<Problem> {
        self.compile().err().unwrap_or_default()
    }
}

enum MediaType {
    Exact,
    /// `type/` of a `type/*`.
    Prefix(String),
}

/// A media type as `types` lists it: `type/subtype` or `type/*`, tokens only, no
/// parameters, at most 64 bytes (the longest registered is well under).
fn media_type(text: &str) -> Result<MediaType, String> {
    let bad = |why: &str| Err(format!("`{text}` is not a media type: {why}"));
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    if text.len() > 64 {
        return bad("longer than 64 bytes");
    }
    let Some((kind, sub)) = text.split_once('/') else {
        return bad("expected `type/subtype` or `type/*`, like `application/json`");
    };
    if !token(kind) {
        return bad("expected `type/subtype` or `type/*`, like `application/json`");
    }
    if sub == "*" {
        return Ok(MediaType::Prefix(format!("{kind}/")));
    }
    if !token(sub) {
        return bad("expected `type/subtype` without parameters, like `application/json`");
    }
    Ok(MediaType::Exact)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compress(text: &str) -> Result<Compress, Vec<String>> {
        #[derive(Deserialize)]
        struct Doc {
            compress: CompressConfig,
        }
        let doc: Doc = toml::from_str(text).expect("parses");
        doc.compress
            .compile()
            .map_err(|p| p.into_iter().map(|(_, f, m)| format!("{f}: {m}")).collect())
    }

    #[test]
    fn defaults_offer_all_three_codings_and_text_types() {
        let c = compress("compress = {}").expect("valid");
        assert_eq!(&*c.algorithms, [Coding::Zstd, Coding::Br, Coding::Gzip]);
        assert_eq!(
            (c.gzip_level, c.br_level, c.zstd_level, c.min_bytes),
            (1, 4, 3, 1024)
        );
        for t in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "text/html",
            "text/plain;charset=utf-8",
            "image/svg+xml",
        ] {
            assert!(c.types.matches(t.as_bytes()), "{t}");
        }
        for t in [
            "image/png",
            "application/octet-stream",
            "text/event-stream",
            "text/",
            "application/grpc",
            "",
        ] {
            assert!(!c.types.matches(t.as_bytes()), "{t}");
        }
    }

    #[test]
    fn an_event_stream_is_compressed_only_when_listed_by_name() {
        let c =
            compress(r#"compress = { types = ["text/*", "text/event-stream"] }"#).expect("valid");
        assert!(c.types.matches(b"text/event-stream"));
    }

    #[test]
    fn a_level_applies_to_every_coding_listed_or_to_each_by_name() {
        let c = compress(r#"compress = { algorithms = ["gzip"], level = 6 }"#).expect("valid");
        assert_eq!((&*c.algorithms, c.gzip_level), (&[Coding::Gzip][..], 6));
        let c = compress("compress = { level = { br = 5, zstd = 7 } }").expect("valid");
        assert_eq!((c.gzip_level, c.br_level, c.zstd_level), (1, 5, 7));
        assert_eq!(c.level(Coding::Br), 5);
    }

    #[test]
    fn every_mistake_is_named_by_its_field() {
        let errors = compress(
            r#"compress = { algorithms = ["gzip", "deflate", "gzip"], level = 10, types = ["json", "text/*", "a/b;c=d"] }"#,
        )
        .expect_err("invalid");
        let fields: Vec<&str> = errors
            .iter()
            .map(|e| e.split(':').next().unwrap_or(""))
            .collect();
        assert_eq!(
            fields,
            [
                "algorithms[1]",
                "algorithms[2]",
                "level",
                "types[0]",
                "types[2]"
            ],
            "{errors:#?}"
        );
        let errors = compress("compress = { level = { zstd = 22, gzip = 0 } }").expect_err("bad");
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(compress("compress = { algorithms = [] }").is_err());
        assert!(compress("compress = { types = [] }").is_err());
    }
}

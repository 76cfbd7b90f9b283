//! The `[access_log]` configuration section and its validation.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::error::Error;
use crate::format::Format;

/// 64 KiB: the buffer size the nginx field report found best; it holds about 130
/// 500-byte lines, so a busy thread hands over one buffer per ~130 requests.
pub const DEFAULT_BUFFER_SIZE: usize = 64 * 1024;

/// 32 buffers of 64 KiB = 2 MiB: room for every serving thread's open buffer plus a
/// queue that absorbs a disk pause of several hundred milliseconds at 100k lines/s.
pub const DEFAULT_BUFFERS: usize = 32;

/// 1 s: a quiet server's lines reach the disk within a second (Envoy's 10 s is too slow
/// for `tail -f`).
pub const DEFAULT_FLUSH_MS: u64 = 1000;

/// Nice 10 for the writer thread: when it shares a core with a serving thread, the serving
/// thread wins (CFS weight 1024 vs 110), yet the writer, which needs well under 1% of a
/// core, is never starved the way `SCHED_IDLE` would starve it on a saturated core.
pub const DEFAULT_WRITER_NICE: i32 = 10;

/// Where lines go.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(from = "String")]
pub enum Output {
    /// Nowhere: the log is a no-op implementation and costs a function call.
    #[default]
    Off,
    /// The process's standard output (`-`).
    Stdout,
    /// A file, opened for append and created with mode 0640.
    File(PathBuf),
}

impl From<String> for Output {
    fn from(s: String) -> Self {
        Self::parse(&s)
    }
}

impl Output {
    /// `off`, `-` (stdout), or a file path (write `./off` for a file named `off`).
    pub fn parse(s: &str) -> Self {
        match s {
            "off" | "" => Self::Off,
            "-" => Self::Stdout,
            path => Self::File(PathBuf::from(path)),
        }
    }
}

/// What a serving thread does when every buffer is full or queued (the disk is slower
/// than the traffic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFull {
    /// Drop the line, count it in `tailguard_access_log_dropped_lines_total`, and let the
    /// writer add one "dropped N lines" line when it catches up. Requests never wait.
    #[default]
    Drop,
    /// Wait for a free buffer: no line is lost, but a stalled disk stalls requests.
    Block,
}

/// The named formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FormatName {
    /// nginx `combined`.
    Combined,
    /// JSON lines.
    Json,
}

/// The `[access_log]` section.
///
/// ```toml
/// [access_log]
/// path = "/var/log/tailguard/access.log"   # or "-" for stdout, or "off"
/// format = "combined"                        # or "json"; or set `template` instead
/// # template = '$remote_addr "$request" $status $request_time $upstream_addr'
/// buffer_size = 65536                        # bytes per thread buffer
/// buffers = 32                               # pool size: memory = buffer_size * buffers
/// flush_ms = 1000                            # idle buffers reach the file within this
/// on_full = "drop"                           # or "block"
/// writer_nice = 10                           # the writer yields to serving threads
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where lines go.
    pub path: Output,
    /// A named format (default `combined`); exclusive with `template`.
    pub format: Option<FormatName>,
    /// A template with nginx variable names; exclusive with `format`.
    pub template: Option<String>,
    /// Bytes per buffer.
    pub buffer_size: usize,
    /// Buffers in the pool, open ones and queued ones together.
    pub buffers: usize,
    /// How often the writer collects partly filled buffers, in milliseconds.
    pub flush_ms: u64,
    /// What to do when no buffer is free.
    pub on_full: OnFull,
    /// Nice value of the writer thread (0 keeps the process's own).
    pub writer_nice: i32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            path: Output::Off,
            format: None,
            template: None,
            buffer_size: DEFAULT_BUFFER_SIZE,
            buffers: DEFAULT_BUFFERS,
            flush_ms: DEFAULT_FLUSH_MS,
            on_full: OnFull::Drop,
            writer_nice: DEFAULT_WRITER_NICE,
        }
    }
}

impl Config {
    /// A config that logs to `path` (see [`Output::parse`]) with every other field default.
    pub fn to(path: &str) -> Self {
        Self {
            path: Output::parse(path),
            ..Self::default()
        }
    }

    /// Checks ranges and compiles the format; the error names what is wrong.
    pub fn validate(&self) -> Result<Format, Error> {
        if !(256..=64 << 20).contains(&self.buffer_size) {
            return Err(Error::Config(format!(
                "buffer_size = {} is outside 256 B ..= 64 MiB",
                self.buffer_size
            )));
        }
        if !(2..=65_536).contains(&self.buffers) {
            return Err(Error::Config(format!(
                "buffers = {} is outside 2 ..= 65536",
                self.buffers
            )));
        }
        if !(-20..=19).contains(&self.writer_nice) {
            return Err(Error::Config(format!(
                "writer_nice = {} is outside -20 ..= 19",
                self.writer_nice
            )));
        }
        if self.flush_ms == 0 {
            return Err(Error::Config("flush_ms must be at least 1".into()));
        }
        match (&self.format, &self.template) {
            (Some(_), Some(_)) => Err(Error::Config(
                "set either `format` or `template`, not both".into(),
            )),
            (_, Some(t)) => Format::template(t),
            (None | Some(FormatName::Combined), None) => Ok(Format::combined()),
            (Some(FormatName::Json), None) => Ok(Format::json()),
        }
    }

    /// The flush interval.
    pub fn flush_interval(&self) -> Duration {
        Duration::from_millis(self.flush_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_toml_and_rejects_unknown_fields() {
        let c: Config = toml::from_str(
            "path = \"/tmp/a.log\"\nformat = \"json\"\nbuffer_size = 4096\non_full = \"block\"",
        )
        .unwrap();
        assert_eq!(c.path, Output::File("/tmp/a.log".into()));
        assert_eq!(c.format, Some(FormatName::Json));
        assert_eq!(c.buffer_size, 4096);
        assert_eq!(c.on_full, OnFull::Block);
        assert_eq!(c.flush_ms, DEFAULT_FLUSH_MS);
        assert!(c.validate().is_ok());
        let err = toml::from_str::<Config>("pth = \"x\"").unwrap_err();
        assert!(err.to_string().contains("pth"), "{err}");
        let c: Config = toml::from_str("path = \"-\"").unwrap();
        assert_eq!(c.path, Output::Stdout);
        assert_eq!(Config::default().path, Output::Off);
    }

    #[test]
    fn validation_names_the_problem() {
        let c = Config {
            buffer_size: 10,
            ..Config::default()
        };
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("buffer_size")
        );
        let c = Config {
            template: Some("$nope".into()),
            ..Config::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("$nope"));
        let c = Config {
            template: Some("$status".into()),
            format: Some(FormatName::Json),
            ..Config::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("either"));
    }
}

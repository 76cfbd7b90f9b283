//! One problem in a config file with its position (`file:line:col: field: message`), and
//! the collector that turns byte offsets into lines and columns.

use std::fmt;
use std::ops::Range;

/// One problem in a config file, with its position when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// File name as given (or `<embedded default config>`, or `command line`).
    pub file: String,
    /// 1-based line and column of the offending value, when known.
    pub position: Option<(usize, usize)>,
    /// Dotted path of the field, e.g. `routes[2].upstream`.
    pub field: String,
    /// What is wrong, in one line.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some((line, col)) => write!(f, "{}:{line}:{col}: ", self.file)?,
            None => write!(f, "{}: ", self.file)?,
        }
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every diagnostic on its own line, in order: how `tailguard check` and a failed reload
/// print them.
pub fn lines(diags: &[Diagnostic]) -> String {
    let mut out = String::new();
    for (i, d) in diags.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&d.to_string());
    }
    out
}

/// A problem on the command line (`--listen`, `--upstream`, `--access-log`): no file, no
/// position, the flag as the field.
pub fn command_line(flag: &str, message: impl Into<String>) -> Diagnostic {
    Diagnostic {
        file: "command line".to_owned(),
        position: None,
        field: flag.to_owned(),
        message: message.into(),
    }
}

/// A problem in an environment variable (`OTEL_*`): no file, no position, the variable as
/// the field.
pub fn environment(var: &str, message: impl Into<String>) -> Diagnostic {
    Diagnostic {
        file: "environment".to_owned(),
        position: None,
        field: var.to_owned(),
        message: message.into(),
    }
}

/// Collects diagnostics with positions computed from byte offsets.
pub(crate) struct Diags<'a> {
    file: &'a str,
    text: &'a str,
    list: Vec<(usize, Diagnostic)>,
}

impl<'a> Diags<'a> {
    /// Diagnostics of `text`, named `file` in messages.
    pub(crate) fn new(file: &'a str, text: &'a str) -> Diags<'a> {
        Diags {
            file,
            text,
            list: Vec::new(),
        }
    }

    pub(crate) fn push(
        &mut self,
        span: Option<Range<usize>>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        let offset = span.as_ref().map_or(usize::MAX, |s| s.start);
        let position = span.map(|s| line_col(self.text, s.start));
        self.list.push((
            offset,
            Diagnostic {
                file: self.file.to_owned(),
                position,
                field: field.into(),
                message: message.into(),
            },
        ));
    }

    /// A problem outside the file (an environment variable), listed after the file's.
    pub(crate) fn push_outside(&mut self, d: Diagnostic) {
        self.list.push((usize::MAX, d));
    }

    pub(crate) fn de_error(&mut self, field: &str, err: &toml::de::Error) {
        self.push(
            err.span(),
            field,
            err.message().trim_end().replace('\n', " "),
        );
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The diagnostics in file order (those without a position last).
    pub(crate) fn finish(mut self) -> Vec<Diagnostic> {
        self.list.sort_by_key(|(offset, _)| *offset);
        self.list.into_iter().map(|(_, d)| d).collect()
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

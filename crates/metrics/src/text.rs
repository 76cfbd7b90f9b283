//! Bytes of the exposition formats that do not depend on values: name checks, escaping,
//! number formatting.

use crate::MetricsError;

/// Checks a metric family name against `[a-zA-Z_:][a-zA-Z0-9_:]*`.
pub(crate) fn check_metric_name(name: &str) -> Result<(), MetricsError> {
    let mut bytes = name.bytes();
    let ok = match bytes.next() {
        Some(first) => {
            (first.is_ascii_alphabetic() || first == b'_' || first == b':')
                && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
        }
        None => false,
    };
    if ok {
        Ok(())
    } else {
        Err(MetricsError::InvalidName(name.to_owned()))
    }
}

/// Checks a label name against `[a-zA-Z_][a-zA-Z0-9_]*`, not starting with `__`.
pub(crate) fn check_label_name(name: &str) -> Result<(), MetricsError> {
    let mut bytes = name.bytes();
    let ok = match bytes.next() {
        Some(first) => {
            (first.is_ascii_alphabetic() || first == b'_')
                && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !name.starts_with("__")
        }
        None => false,
    };
    if ok {
        Ok(())
    } else {
        Err(MetricsError::InvalidLabelName(name.to_owned()))
    }
}

/// Appends a label value escaped for both formats: `\` → `\\`, `"` → `\"`, newline → `\n`.
pub(crate) fn escape_label_value(out: &mut Vec<u8>, value: &str) {
    for &b in value.as_bytes() {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'"' => out.extend_from_slice(b"\\\""),
            b'\n' => out.extend_from_slice(b"\\n"),
            _ => out.push(b),
        }
    }
}

/// Appends HELP text escaped for the format: both escape `\` and newline; OpenMetrics also
/// escapes `"`.
pub(crate) fn escape_help(out: &mut Vec<u8>, help: &str, openmetrics: bool) {
    for &b in help.as_bytes() {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'"' if openmetrics => out.extend_from_slice(b"\\\""),
            _ => out.push(b),
        }
    }
}

/// Renders `a="x",b="y"` for the given names and values.
pub(crate) fn render_labels(names: &[String], values: &[&str]) -> Vec<u8> {
    let mut out = Vec::with_capacity(names.iter().map(|n| n.len() + 4).sum::<usize>() + 16);
    for (i, (name, value)) in names.iter().zip(values).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"=\"");
        escape_label_value(&mut out, value);
        out.push(b'"');
    }
    out
}

/// Appends a float the way both formats spell it: `NaN`, `+Inf`, `-Inf`, else the shortest
/// representation that parses back to the same value (ryu), e.g. `0.005`, `1.0`, `1e21`.
#[inline]
pub(crate) fn push_f64(out: &mut Vec<u8>, v: f64) {
    if v.is_finite() {
        let mut buf = ryu::Buffer::new();
        out.extend_from_slice(buf.format_finite(v).as_bytes());
    } else if v.is_nan() {
        out.extend_from_slice(b"NaN");
    } else if v > 0.0 {
        out.extend_from_slice(b"+Inf");
    } else {
        out.extend_from_slice(b"-Inf");
    }
}

/// Appends an unsigned integer.
#[inline]
pub(crate) fn push_u64(out: &mut Vec<u8>, v: u64) {
    let mut buf = itoa::Buffer::new();
    out.extend_from_slice(buf.format(v).as_bytes());
}

/// Appends a signed integer.
#[inline]
pub(crate) fn push_i64(out: &mut Vec<u8>, v: i64) {
    let mut buf = itoa::Buffer::new();
    out.extend_from_slice(buf.format(v).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_metric_name("http_requests").is_ok());
        assert!(check_metric_name("a:b_c9").is_ok());
        assert!(check_metric_name("9a").is_err());
        assert!(check_metric_name("").is_err());
        assert!(check_metric_name("a-b").is_err());
        assert!(check_label_name("route").is_ok());
        assert!(check_label_name("__name__").is_err());
        assert!(check_label_name("a:b").is_err());
    }

    #[test]
    fn label_values_are_escaped() {
        let out = render_labels(
            &["a".to_owned(), "b".to_owned()],
            &["back\\slash \"quoted\"", "two\nlines"],
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"a="back\\slash \"quoted\"",b="two\nlines""#
        );
    }

    #[test]
    fn floats_use_the_exposition_spelling() {
        let mut out = Vec::new();
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.005, 1.0, -2.5] {
            push_f64(&mut out, v);
            out.push(b' ');
        }
        assert_eq!(out, b"NaN +Inf -Inf 0.005 1.0 -2.5 ");
    }
}

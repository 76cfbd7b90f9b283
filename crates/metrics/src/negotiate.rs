//! What a scrape request asks for: format from `Accept`, gzip from `Accept-Encoding`, and a
//! time budget from `X-Prometheus-Scrape-Timeout-Seconds`.

use std::time::Duration;

use crate::render::Format;

/// Picks the format for an `Accept` header: OpenMetrics when the client ranks
/// `application/openmetrics-text` at least as high as `text/plain` (Prometheus sends
/// OpenMetrics at q=0.6 and text at q=0.3-0.4 by default), else text 0.0.4, which is also the
/// answer to no header, `*/*` and anything unparseable.
pub fn negotiate_format(accept: Option<&str>) -> Format {
    let Some(accept) = accept else {
        return Format::Text;
    };
    let mut openmetrics_q = 0.0f32;
    let mut text_q = 0.0f32;
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let mut q = 1.0f32;
        for param in parts {
            if let Some((key, value)) = param.split_once('=')
                && key.trim().eq_ignore_ascii_case("q")
            {
                q = value.trim().parse().unwrap_or(0.0);
            }
        }
        match media.as_str() {
            "application/openmetrics-text" => openmetrics_q = openmetrics_q.max(q),
            "text/plain" | "text/*" | "*/*" => text_q = text_q.max(q),
            _ => {}
        }
    }
    if openmetrics_q > 0.0 && openmetrics_q >= text_q {
        Format::OpenMetrics
    } else {
        Format::Text
    }
}

/// Whether `Accept-Encoding` allows gzip (named explicitly with q > 0; Prometheus sends
/// `gzip` unless compression is turned off for the job).
pub fn accepts_gzip(accept_encoding: Option<&str>) -> bool {
    let Some(header) = accept_encoding else {
        return false;
    };
    header.split(',').any(|coding| {
        let mut parts = coding.split(';');
        let name = parts.next().unwrap_or("").trim();
        let q = parts
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
            .map_or(1.0, |(_, v)| v.trim().parse::<f32>().unwrap_or(0.0));
        name.eq_ignore_ascii_case("gzip") && q > 0.0
    })
}

/// The time a scrape may take: 90% of `X-Prometheus-Scrape-Timeout-Seconds` (the rest is
/// the network's and Prometheus's), at least 10 ms; `None` if absent or not a number.
pub fn scrape_budget(timeout_header: Option<&str>) -> Option<Duration> {
    let seconds: f64 = timeout_header?.trim().parse().ok()?;
    if !seconds.is_finite() || seconds <= 0.0 {
        return None;
    }
    Some(Duration::from_secs_f64(
        (seconds * 0.9).clamp(0.01, 86_400.0),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_default_accept_gets_openmetrics() {
        let prometheus = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert_eq!(negotiate_format(Some(prometheus)), Format::OpenMetrics);
    }

    #[test]
    fn text_when_asked_or_unspecified() {
        assert_eq!(negotiate_format(None), Format::Text);
        assert_eq!(negotiate_format(Some("*/*")), Format::Text);
        assert_eq!(
            negotiate_format(Some("text/plain;version=0.0.4")),
            Format::Text
        );
        assert_eq!(
            negotiate_format(Some("application/openmetrics-text;q=0.2,text/plain;q=0.5")),
            Format::Text
        );
        assert_eq!(
            negotiate_format(Some("application/openmetrics-text;q=0")),
            Format::Text
        );
        assert_eq!(negotiate_format(Some("garbage;;;,")), Format::Text);
    }

    #[test]
    fn gzip_only_when_allowed() {
        assert!(accepts_gzip(Some("gzip")));
        assert!(accepts_gzip(Some("identity, GZIP;q=0.5")));
        assert!(!accepts_gzip(Some("gzip;q=0")));
        assert!(!accepts_gzip(Some("identity")));
        assert!(!accepts_gzip(None));
    }

    #[test]
    fn budget_is_most_of_the_timeout() {
        assert_eq!(scrape_budget(Some("10")), Some(Duration::from_secs(9)));
        assert_eq!(scrape_budget(Some("0.5")), Some(Duration::from_millis(450)));
        assert_eq!(scrape_budget(Some("nope")), None);
        assert_eq!(scrape_budget(Some("-1")), None);
        assert_eq!(scrape_budget(None), None);
    }
}

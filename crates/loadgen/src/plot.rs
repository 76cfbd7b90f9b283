//! SVG plots of the lab's results: latency against a logarithmic "nines" axis (0%, 90%, 99%,
//! 99.9%, ...) in the style of HdrHistogram's plotter, several runs overlaid with a legend;
//! and stacked panels of values against time (a run's timeline) sharing one time axis.
//!
//! Hand-written: a plot is a few polylines and labels, and the plotting crates pull in font
//! stacks and image backends the lab does not need.

use std::fmt::Write as _;

use crate::hgrm::Point;

const W: f64 = 860.0;
const H: f64 = 480.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 40.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// One curve: a legend label and its percentile points.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Points, quantile ascending.
    pub points: Vec<Point>,
}

fn nines(q: f64, max_nines: f64) -> f64 {
    if q >= 1.0 {
        max_nines
    } else {
        (1.0 / (1.0 - q)).log10().min(max_nines)
    }
}

/// Renders the series into one SVG document.
pub fn render(title: &str, series: &[Series]) -> String {
    // The axis ends at the first whole nine past the deepest quantile below 100% (at least 99.9%);
    // the maximum is drawn there.
    let deepest = series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|p| p.quantile < 1.0)
        .map(|p| (1.0 / (1.0 - p.quantile)).log10())
        .fold(0.0_f64, f64::max);
    let max_nines = deepest.ceil().clamp(3.0, 7.0);
    let max_ms = series
        .iter()
        .flat_map(|s| s.points.iter())
        .map(|p| p.value_ms)
        .fold(0.0_f64, f64::max);
    let y_max = nice_ceiling(max_ms.max(0.001) * 1.05);
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let x = |n: f64| LEFT + n / max_nines * pw;
    let y = |ms: f64| TOP + ph - ms / y_max * ph;

    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        W / 2.0,
        escape(title)
    );
    // Grid: one vertical line per nine, five horizontal lines.
    for n in 0..=(max_nines as u32) {
        let xv = x(f64::from(n));
        let label = match n {
            0 => "0%".to_string(),
            _ => format!("{}%", format_nines(n)),
        };
        let _ = writeln!(
            o,
            r##"<line x1="{xv:.1}" y1="{TOP}" x2="{xv:.1}" y2="{:.1}" stroke="#ddd"/><text x="{xv:.1}" y="{:.1}" text-anchor="middle">{label}</text>"##,
            TOP + ph,
            TOP + ph + 16.0
        );
    }
    for i in 0..=5 {
        let v = y_max * f64::from(i) / 5.0;
        let yv = y(v);
        let _ = writeln!(
            o,
            r##"<line x1="{LEFT}" y1="{yv:.1}" x2="{:.1}" y2="{yv:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            yv + 4.0,
            trim_float(v)
        );
    }
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">Percentile (the rightmost point is the maximum)</text>"#,
        LEFT + pw / 2.0,
        H - 12.0
    );
    let _ = writeln!(
        o,
        r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">Latency (ms)</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0
    );
    let _ = writeln!(
        o,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|p| {
                format!(
                    "{:.1},{:.1}",
                    x(nines(p.quantile, max_nines)),
                    y(p.value_ms)
                )
            })
            .collect();
        let _ = writeln!(
            o,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{}"/>"#,
            pts.join(" ")
        );
        let ly = TOP + 16.0 + 18.0 * i as f64;
        let _ = writeln!(
            o,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            LEFT + 12.0,
            LEFT + 36.0,
            LEFT + 42.0,
            ly + 4.0,
            escape(&s.label)
        );
    }
    o.push_str("</svg>\n");
    o
}

/// `1` -> `90`, `2` -> `99`, `3` -> `99.9`.
fn format_nines(n: u32) -> String {
    let mut s = String::from("9");
    for i in 1..n {
        if i == 2 {
            s.push('.');
        }
        s.push('9');
    }
    if n == 1 { "90".to_string() } else { s }
}

fn nice_ceiling(v: f64) -> f64 {
    let mag = 10f64.powf(v.log10().floor());
    for step in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if step * mag >= v {
            return step * mag;
        }
    }
    10.0 * mag
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// One curve of a time panel: points `(seconds, value)`.
#[derive(Debug, Clone)]
pub struct Line {
    /// Legend text.
    pub label: String,
    /// Points, time ascending.
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed (a reference: offered load, P50, in-flight).
    pub dashed: bool,
    /// Stroke colour; `None` takes the panel's next one.
    pub color: Option<&'static str>,
}

/// One panel of a time plot: its own y axis, its lines, and a note shown when it has none.
#[derive(Debug, Clone)]
pub struct Panel {
    /// Y axis title.
    pub y_label: String,
    /// The curves.
    pub lines: Vec<Line>,
    /// Said in the panel when it has no points (e.g. a metric the gateway does not export).
    pub note: Option<String>,
}

const PANEL_H: f64 = 220.0;
const PANEL_GAP: f64 = 40.0;
const LEGEND_W: f64 = 210.0;

/// Renders panels stacked over one time axis from 0 to `x_max` seconds, with dashed
/// vertical lines at `marks` (phase boundaries).
pub fn render_panels(title: &str, panels: &[Panel], marks: &[f64], x_max: f64) -> String {
    let pw = W - LEFT - LEGEND_W;
    let height = TOP + panels.len() as f64 * (PANEL_H + PANEL_GAP) + BOTTOM - PANEL_GAP + 10.0;
    // Ticks at a round step (1, 2, 2.5 or 5 times a power of ten), about ten of them.
    let x_step = nice_ceiling(x_max.max(1.0) / 10.0);
    let x_ticks = (x_max.max(1.0) / x_step - 1e-9).ceil().max(1.0);
    let x_max = x_ticks * x_step;
    let x = |t: f64| LEFT + t / x_max * pw;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{W}" height="{height}" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        W / 2.0,
        escape(title)
    );
    for (k, panel) in panels.iter().enumerate() {
        let top = TOP + k as f64 * (PANEL_H + PANEL_GAP);
        let y_top = panel
            .lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.1))
            .filter(|v| v.is_finite())
            .fold(0.0_f64, f64::max);
        let y_step = nice_ceiling(y_top.max(1e-3) * 1.05 / 4.0);
        let y_ticks = (y_top.max(1e-3) * 1.05 / y_step - 1e-9).ceil().max(1.0) as u32;
        let y_max = f64::from(y_ticks) * y_step;
        let y = |v: f64| top + PANEL_H - v.clamp(0.0, y_max) / y_max * PANEL_H;
        for i in 0..=y_ticks {
            let v = y_step * f64::from(i);
            let yv = y(v);
            let _ = writeln!(
                o,
                r##"<line x1="{LEFT}" y1="{yv:.1}" x2="{:.1}" y2="{yv:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + pw,
                LEFT - 6.0,
                yv + 4.0,
                trim_float(v)
            );
        }
        for i in 0..=(x_ticks as u32) {
            let t = x_step * f64::from(i);
            let xv = x(t);
            let _ = writeln!(
                o,
                r##"<line x1="{xv:.1}" y1="{top}" x2="{xv:.1}" y2="{:.1}" stroke="#eee"/><text x="{xv:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                top + PANEL_H,
                top + PANEL_H + 15.0,
                trim_float(t)
            );
        }
        for &m in marks {
            let xv = x(m);
            let _ = writeln!(
                o,
                r##"<line x1="{xv:.1}" y1="{top}" x2="{xv:.1}" y2="{:.1}" stroke="#555" stroke-dasharray="2,3"/>"##,
                top + PANEL_H
            );
        }
        let mid = top + PANEL_H / 2.0;
        let _ = writeln!(
            o,
            r#"<text x="16" y="{mid:.1}" text-anchor="middle" transform="rotate(-90 16 {mid:.1})">{}</text>"#,
            escape(&panel.y_label)
        );
        let _ = writeln!(
            o,
            r#"<rect x="{LEFT}" y="{top}" width="{pw}" height="{PANEL_H}" fill="none" stroke="black"/>"#
        );
        if panel.lines.iter().all(|l| l.points.is_empty())
            && let Some(note) = &panel.note
        {
            let _ = writeln!(
                o,
                r##"<text x="{:.1}" y="{mid:.1}" text-anchor="middle" fill="#777">{}</text>"##,
                LEFT + pw / 2.0,
                escape(note)
            );
        }
        for (i, line) in panel.lines.iter().enumerate() {
            let color = line.color.unwrap_or(COLORS[i % COLORS.len()]);
            let dash = if line.dashed {
                r#" stroke-dasharray="6,4""#
            } else {
                ""
            };
            // A non-finite value breaks the line (a second without a reading).
            for run in line.points.split(|p| !p.1.is_finite()) {
                if run.is_empty() {
                    continue;
                }
                let pts: Vec<String> = run
                    .iter()
                    .map(|&(t, v)| format!("{:.1},{:.1}", x(t), y(v)))
                    .collect();
                let _ = writeln!(
                    o,
                    r#"<polyline fill="none" stroke="{color}" stroke-width="1.6"{dash} points="{}"/>"#,
                    pts.join(" ")
                );
            }
            let lx = LEFT + pw + 12.0;
            let ly = top + 12.0 + 18.0 * i as f64;
            let _ = writeln!(
                o,
                r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
                lx + 22.0,
                lx + 28.0,
                ly + 4.0,
                escape(&line.label)
            );
        }
    }
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">seconds from the start of the measured window (dashed verticals: steps)</text>"#,
        LEFT + pw / 2.0,
        height - 12.0
    );
    o.push_str("</svg>\n");
    o
}

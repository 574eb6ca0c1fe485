//! A small hand-written SVG writer for study figures: a grid of line-chart panels sharing axes
//! kinds and one legend, with logarithmic axes. No plotting crate: the figures need lines,
//! markers, ticks and text, and writing them directly keeps the output byte-stable (every
//! number is printed with a fixed precision), so the same rows always give the same file.

use std::fmt::Write as _;

/// One line of a panel.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text; series with the same label share one legend entry.
    pub label: String,
    /// Stroke colour (any SVG colour).
    pub color: String,
    /// Dashed instead of solid.
    pub dashed: bool,
    /// `(x, y)` points, drawn in x order; points with a non-positive coordinate on a
    /// logarithmic axis are left out.
    pub points: Vec<(f64, f64)>,
}

/// One chart of the grid.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// Title above the chart.
    pub title: String,
    /// Its own y axis label, with the unit (None: the figure's).
    pub y_label: Option<String>,
    /// Its lines.
    pub series: Vec<Series>,
}

/// A figure: panels in a grid, row by row.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// Title at the top.
    pub title: String,
    /// A line under the title (units, assumptions).
    pub subtitle: String,
    /// X axis label (every panel).
    pub x_label: String,
    /// Y axis label (every panel).
    pub y_label: String,
    /// Panels per row.
    pub columns: usize,
    /// The panels.
    pub panels: Vec<Panel>,
    /// Whether the panels of a row share one y range (easier comparison along a row); else
    /// each panel fits its own.
    pub shared_y: bool,
    /// X ticks at 1-2-5 steps of each decade (a continuous axis) instead of at the points'
    /// own x values (a sweep's settings).
    pub x_log_ticks: bool,
    /// A vertical line at this x in every panel, labelled (the proposed point of a sweep).
    pub mark: Option<(f64, String)>,
}

const PANEL_W: f64 = 300.0;
const PANEL_H: f64 = 220.0;
const MARGIN_L: f64 = 64.0;
const MARGIN_R: f64 = 16.0;
const MARGIN_T: f64 = 30.0;
const MARGIN_B: f64 = 44.0;
const HEADER: f64 = 58.0;
const LEGEND_ROW: f64 = 20.0;

/// Escapes text for SVG.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A tick value printed short: 512, 2k, 15k, 1.5M.
fn short(v: f64) -> String {
    let (scaled, unit) = if v >= 1e6 {
        (v / 1e6, "M")
    } else if v >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    if (scaled - scaled.round()).abs() < 1e-9 {
        format!("{}{unit}", scaled.round() as i64)
    } else if scaled < 1.0 {
        format!("{scaled:.2}")
    } else {
        format!("{scaled:.1}{unit}")
    }
}

/// Log-scale ticks over `[lo, hi]`: 1-2-5 per decade, thinned to the decades when there are
/// more than seven, and finer steps when a narrow range would get fewer than three.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let pick = |mantissas: &[f64]| {
        let mut ticks = Vec::new();
        let mut decade = 10f64.powf(lo.log10().floor());
        while decade <= hi * 1.0001 {
            for m in mantissas {
                let t = decade * m;
                if t >= lo * 0.9999 && t <= hi * 1.0001 {
                    ticks.push(t);
                }
            }
            decade *= 10.0;
        }
        ticks
    };
    let mut ticks = pick(&[1.0, 2.0, 5.0]);
    if ticks.len() > 7 {
        ticks.retain(|t| (t.log10() - t.log10().round()).abs() < 1e-9);
    }
    for finer in [
        &[1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0][..],
        &[
            1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0,
        ][..],
    ] {
        if ticks.len() >= 3 {
            break;
        }
        ticks = pick(finer);
    }
    if ticks.len() > 7 {
        ticks = ticks.into_iter().step_by(2).collect();
    }
    ticks
}

/// The padded log range of the positive values in `vals`.
fn log_range(vals: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, 0f64);
    for v in vals.filter(|v| *v > 0.0) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (1.0, 10.0);
    }
    if hi / lo < 2.0 {
        return (lo / 1.5, hi * 1.5);
    }
    (lo / 1.15, hi * 1.15)
}

/// The figure as an SVG document.
pub fn render(fig: &Figure) -> String {
    let cols = fig.columns.max(1);
    let rows = fig.panels.len().div_ceil(cols).max(1);
    let cell_w = MARGIN_L + PANEL_W + MARGIN_R;
    let cell_h = MARGIN_T + PANEL_H + MARGIN_B;
    let mut legend: Vec<&Series> = Vec::new();
    for s in fig.panels.iter().flat_map(|p| &p.series) {
        if !legend.iter().any(|l| l.label == s.label) {
            legend.push(s);
        }
    }
    let legend_cols = ((cols as f64 * cell_w) / 230.0).floor().max(1.0) as usize;
    let legend_rows = legend.len().div_ceil(legend_cols);
    let width = cols as f64 * cell_w;
    let height = HEADER + rows as f64 * cell_h + legend_rows as f64 * LEGEND_ROW + 24.0;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        o,
        r#"<rect x="0" y="0" width="{width:.0}" height="{height:.0}" fill="white"/>"#
    );
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        width / 2.0,
        esc(&fig.title)
    );
    let _ = writeln!(
        o,
        r##"<text x="{:.1}" y="42" text-anchor="middle" fill="#444">{}</text>"##,
        width / 2.0,
        esc(&fig.subtitle)
    );
    let all_x = fig
        .panels
        .iter()
        .flat_map(|p| &p.series)
        .flat_map(|s| s.points.iter().map(|p| p.0));
    let (x_lo, x_hi) = log_range(all_x);
    let mut x_ticks: Vec<f64> = fig
        .panels
        .iter()
        .flat_map(|p| &p.series)
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .filter(|x| *x > 0.0)
        .collect();
    x_ticks.sort_by(f64::total_cmp);
    x_ticks.dedup();
    if fig.x_log_ticks {
        x_ticks = log_ticks(x_lo, x_hi);
    }
    let y_values = |panels: &[Panel]| -> Vec<f64> {
        panels
            .iter()
            .flat_map(|p| &p.series)
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .collect()
    };
    for (k, panel) in fig.panels.iter().enumerate() {
        let ox = (k % cols) as f64 * cell_w + MARGIN_L;
        let oy = HEADER + (k / cols) as f64 * cell_h + MARGIN_T;
        let row = &fig.panels[k / cols * cols..((k / cols + 1) * cols).min(fig.panels.len())];
        let (y_lo, y_hi) = if fig.shared_y {
            log_range(y_values(row).into_iter())
        } else {
            log_range(y_values(std::slice::from_ref(panel)).into_iter())
        };
        let px = |x: f64| ox + (x.ln() - x_lo.ln()) / (x_hi.ln() - x_lo.ln()) * PANEL_W;
        let py = |y: f64| oy + PANEL_H - (y.ln() - y_lo.ln()) / (y_hi.ln() - y_lo.ln()) * PANEL_H;
        let _ = writeln!(o, "<g>");
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-weight="bold">{}</text>"#,
            ox + PANEL_W / 2.0,
            oy - 10.0,
            esc(&panel.title)
        );
        let _ = writeln!(
            o,
            r##"<rect x="{ox:.1}" y="{oy:.1}" width="{PANEL_W:.1}" height="{PANEL_H:.1}" fill="none" stroke="#888"/>"##
        );
        for t in log_ticks(y_lo, y_hi) {
            let y = py(t);
            let _ = writeln!(
                o,
                r##"<line x1="{ox:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e4e4e4"/>"##,
                ox + PANEL_W
            );
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                ox - 4.0,
                y + 4.0,
                short(t)
            );
        }
        for &t in &x_ticks {
            let x = px(t);
            let _ = writeln!(
                o,
                r##"<line x1="{x:.1}" y1="{oy:.1}" x2="{x:.1}" y2="{:.1}" stroke="#e4e4e4"/>"##,
                oy + PANEL_H
            );
            let _ = writeln!(
                o,
                r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                oy + PANEL_H + 14.0,
                short(t)
            );
        }
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            ox + PANEL_W / 2.0,
            oy + PANEL_H + 32.0,
            esc(&fig.x_label)
        );
        let _ = writeln!(
            o,
            r#"<text transform="translate({:.1},{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
            ox - 48.0,
            oy + PANEL_H / 2.0,
            esc(panel.y_label.as_deref().unwrap_or(&fig.y_label))
        );
        if let Some((mx, label)) = &fig.mark
            && *mx > 0.0
        {
            let x = px(*mx);
            let _ = writeln!(
                o,
                r##"<line x1="{x:.1}" y1="{oy:.1}" x2="{x:.1}" y2="{:.1}" stroke="#d62728" stroke-width="1.2" stroke-dasharray="3,3"/>"##,
                oy + PANEL_H
            );
            let _ = writeln!(
                o,
                r##"<text x="{:.1}" y="{:.1}" fill="#d62728">{}</text>"##,
                x + 3.0,
                oy + 12.0,
                esc(label)
            );
        }
        for s in &panel.series {
            let mut pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|(x, y)| *x > 0.0 && *y > 0.0)
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            if pts.is_empty() {
                continue;
            }
            let path: Vec<String> = pts
                .iter()
                .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
                .collect();
            let dash = if s.dashed {
                r#" stroke-dasharray="5,3""#
            } else {
                ""
            };
            let _ = writeln!(
                o,
                r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="1.6"{dash}/>"#,
                path.join(" "),
                s.color
            );
            for (x, y) in &pts {
                let _ = writeln!(
                    o,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="2.2" fill="{}"/>"#,
                    px(*x),
                    py(*y),
                    s.color
                );
            }
        }
        let _ = writeln!(o, "</g>");
    }
    let ly = HEADER + rows as f64 * cell_h + 8.0;
    for (k, s) in legend.iter().enumerate() {
        let x = 20.0 + (k % legend_cols) as f64 * 230.0;
        let y = ly + (k / legend_cols) as f64 * LEGEND_ROW;
        let dash = if s.dashed {
            r#" stroke-dasharray="5,3""#
        } else {
            ""
        };
        let _ = writeln!(
            o,
            r#"<line x1="{x:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-width="2"{dash}/>"#,
            x + 26.0,
            s.color
        );
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            x + 32.0,
            y + 4.0,
            esc(&s.label)
        );
    }
    let _ = writeln!(o, "</svg>");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_and_labels() {
        assert_eq!(
            log_ticks(90.0, 2100.0),
            vec![100.0, 200.0, 500.0, 1000.0, 2000.0]
        );
        // A narrow range still gets at least three ticks.
        assert_eq!(log_ticks(130.0, 320.0), vec![150.0, 200.0, 300.0]);
        assert_eq!(log_ticks(1.03, 2.9), vec![1.2, 1.4, 1.6, 1.8, 2.0, 2.5]);
        assert_eq!(short(2000.0), "2k");
        assert_eq!(short(0.15), "0.15");
        assert_eq!(short(1500.0), "1.5k");
        assert_eq!(short(64.0), "64");
        assert_eq!(esc("a<b & c"), "a&lt;b &amp; c");
    }

    #[test]
    fn a_figure_is_well_formed_and_stable() {
        let fig = Figure {
            title: "t".into(),
            subtitle: "s".into(),
            x_label: "gears".into(),
            y_label: "cycles".into(),
            columns: 2,
            shared_y: true,
            x_log_ticks: false,
            mark: Some((8.0, "proposed".into())),
            panels: vec![Panel {
                title: "p".into(),
                y_label: None,
                series: vec![Series {
                    label: "a".into(),
                    color: "#1f77b4".into(),
                    dashed: true,
                    points: vec![(2.0, 10.0), (8.0, 100.0), (0.0, 5.0)],
                }],
            }],
        };
        let svg = render(&fig);
        assert!(svg.starts_with("<svg ") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 1);
        assert_eq!(
            svg.matches("<circle").count(),
            2,
            "the point at x = 0 is left out"
        );
        assert_eq!(svg, render(&fig));
        assert!(svg.contains(">proposed</text>"));
        assert!(svg.contains(">cycles</text>"));
    }
}

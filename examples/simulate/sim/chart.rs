//! The SVG chart (plotters): cumulative admitted requests and the downstream rate.

use std::fmt;

use plotters::prelude::*;

use super::{series::Point, SimError, NS};

/// The series' colours, in order: the Okabe-Ito palette (readable with colour blindness).
pub const COLOURS: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
];

/// The colour of the i-th series as SVG writes it (`#0072B2`).
pub fn colour_hex(i: usize) -> String {
    let RGBColor(r, g, b) = COLOURS[i % COLOURS.len()];
    format!("#{r:02X}{g:02X}{b:02X}")
}

fn drawing<E: fmt::Display>(e: E) -> SimError {
    SimError::new(format!("drawing the chart: {e}"))
}

/// The chart: above, cumulative admitted requests (as they pass downstream); below, the
/// downstream rate; one series per policy, in [`COLOURS`] order, with a legend.
pub fn chart_svg(title: &str, runs: &[(&str, &[Point])]) -> Result<String, SimError> {
    let all = || runs.iter().flat_map(|(_, p)| p.iter());
    let from = all().map(|p| p.at).min().unwrap_or(0) as f64 / NS as f64;
    let to = (all().map(|p| p.at).max().unwrap_or(0) as f64 / NS as f64).max(from + 0.1);
    let top = all().map(|p| p.cumulative).max().unwrap_or(0).max(1) as f64 * 1.1;
    let rate_top = all().map(|p| p.rate).fold(1.0, f64::max) * 1.1;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 680)).into_drawing_area();
        root.fill(&WHITE).map_err(drawing)?;
        let root = root.titled(title, ("sans-serif", 20)).map_err(drawing)?;
        let (upper, lower) = root.split_vertically(320);
        let panels = [
            (
                &upper,
                "cumulative admitted (counted as they pass downstream)",
                "requests",
                top,
            ),
            (
                &lower,
                "downstream rate (over the last 100 ms)",
                "requests per second",
                rate_top,
            ),
        ];
        for (n, (area, caption, y_desc, y_top)) in panels.into_iter().enumerate() {
            let mut chart = ChartBuilder::on(area)
                .caption(caption, ("sans-serif", 15))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(64)
                .build_cartesian_2d(from..to, 0.0..y_top)
                .map_err(drawing)?;
            chart
                .configure_mesh()
                .max_light_lines(2)
                .x_desc("time since the trace started (s)")
                .y_desc(y_desc)
                .x_label_formatter(&|x| format!("{x:.1}"))
                .y_label_formatter(&|y| format!("{y:.0}"))
                .draw()
                .map_err(drawing)?;
            for (i, (label, points)) in runs.iter().enumerate() {
                let colour = COLOURS[i % COLOURS.len()];
                let data = points.iter().map(|p| {
                    let y = if n == 0 { p.cumulative as f64 } else { p.rate };
                    (p.at as f64 / NS as f64, y)
                });
                chart
                    .draw_series(LineSeries::new(data, colour.stroke_width(2)))
                    .map_err(drawing)?
                    .label(*label)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                    });
            }
            chart
                .configure_series_labels()
                .position(if n == 0 {
                    SeriesLabelPosition::UpperLeft
                } else {
                    SeriesLabelPosition::UpperRight
                })
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 13))
                .draw()
                .map_err(drawing)?;
        }
        root.present().map_err(drawing)?;
    }
    Ok(svg)
}

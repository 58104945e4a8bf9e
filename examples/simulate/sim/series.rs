//! A policy's series sampled over the trace, and the series' CSV.

use super::replay::{downstream, Fate};
use super::report::BURST_SPAN;
use super::Arrival;
use super::MS;
use super::NS;

/// One sample of a policy's series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// Since the start of the trace, in ns.
    pub at: u64,
    /// Admitted requests passed downstream by then.
    pub cumulative: usize,
    /// Requests per second passed downstream over the span that ends then.
    pub rate: f64,
}

/// The span a chart shows: from a second before the first arrival (or 0) to a second
/// after the last departure or arrival, in whole tenths of a second.
pub fn span(trace: &[Arrival], all_fates: &[&[Fate]]) -> (u64, u64) {
    let first = trace.first().map_or(0, |a| a.at);
    let mut last = trace.last().map_or(0, |a| a.at);
    for fates in all_fates {
        if let Some(&d) = downstream(trace, fates).last() {
            last = last.max(d);
        }
    }
    let tenth = NS / 10;
    let from = first.saturating_sub(NS) / tenth * tenth;
    let to = (last + NS).div_ceil(tenth) * tenth;
    (from, to)
}

/// The sampling step of a span: 10 ms, or coarser to keep about 1 000 samples.
pub fn step(from: u64, to: u64) -> u64 {
    ((to - from) / 1000).div_ceil(10 * MS).max(1) * 10 * MS
}

/// Samples a policy's departures every `step` over `[from, to]`; the rate is measured over
/// the last [`BURST_SPAN`] (or `step`, when longer).
pub fn series(trace: &[Arrival], fates: &[Fate], from: u64, to: u64, step: u64) -> Vec<Point> {
    let ds = downstream(trace, fates);
    let window = step.max(BURST_SPAN);
    let mut points = Vec::new();
    let mut at = from;
    while at <= to {
        let cumulative = ds.partition_point(|&d| d <= at);
        let before = ds.partition_point(|&d| d + window <= at);
        let rate = (cumulative - before) as f64 * NS as f64 / window as f64;
        points.push(Point {
            at,
            cumulative,
            rate,
        });
        at += step;
    }
    points
}

/// A CSV field, quoted when it holds a comma or a quote (policy labels may).
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

/// The series of every policy: `policy,time_ms,admitted_cumulative,downstream_rate_per_s`.
pub fn series_csv(runs: &[(&str, &[Point])]) -> String {
    let mut out = String::from("policy,time_ms,admitted_cumulative,downstream_rate_per_s\n");
    for (label, points) in runs {
        let label = csv_field(label);
        for p in *points {
            out += &format!(
                "{label},{},{},{}\n",
                p.at / MS,
                p.cumulative,
                p.rate.round() as u64
            );
        }
    }
    out
}

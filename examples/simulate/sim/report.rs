//! The figures of each policy over a trace, the comparison table, and the report that
//! gathers a replay's figures, series and outputs.

use std::{collections::BTreeMap, time::Duration};

use super::chart::chart_svg;
use super::replay::{downstream, Fate};
use super::series::{series, series_csv, span, step, Point};
use super::Arrival;
use super::SimError;
use super::MS;

/// The span in which "the largest burst passed downstream" is counted, and the shortest
/// over which the downstream rate is measured.
pub const BURST_SPAN: u64 = 100 * MS;

/// A policy's figures over a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    pub requests: usize,
    /// Admitted, at once or after a wait.
    pub admitted: usize,
    pub refused: usize,
    /// Admitted after a wait above zero (a queue).
    pub delayed: usize,
    /// Waits of admitted requests, in ns (nearest-rank percentiles).
    pub wait_p50: u64,
    pub wait_p99: u64,
    pub wait_max: u64,
    /// The most requests passed downstream within any [`BURST_SPAN`].
    pub max_burst: usize,
    /// Refusals by their `Retry-After` value in whole seconds (the exact wait rounded up);
    /// `None` for a cost that can never be admitted (no `Retry-After`).
    pub retry_after: BTreeMap<Option<u64>, usize>,
    /// The exact retry-after of refusals, in ns: median and largest.
    pub retry_p50: u64,
    pub retry_max: u64,
}

/// The nearest-rank percentile `p` (0 to 100) of sorted values; 0 for none.
fn percentile(sorted: &[u64], p: u64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (sorted.len() as u64 * p).div_ceil(100).max(1);
    sorted[rank as usize - 1]
}

pub fn stats(trace: &[Arrival], fates: &[Fate]) -> Stats {
    let mut waits = Vec::new();
    let mut retries = Vec::new();
    let mut retry_after = BTreeMap::new();
    for f in fates {
        match *f {
            Fate::Admitted { wait } => waits.push(wait),
            Fate::Refused { retry_after: r } => {
                if let Some(r) = r {
                    retries.push(r);
                }
                let header = r.map(|r| retry_after_secs(Duration::from_nanos(r)));
                *retry_after.entry(header).or_insert(0) += 1;
            }
        }
    }
    waits.sort_unstable();
    retries.sort_unstable();
    // The largest count in a half-open span [t, t + BURST_SPAN), t at each departure.
    let ds = downstream(trace, fates);
    let (mut max_burst, mut lo) = (0, 0);
    for hi in 0..ds.len() {
        while ds[hi] - ds[lo] >= BURST_SPAN {
            lo += 1;
        }
        max_burst = max_burst.max(hi - lo + 1);
    }
    Stats {
        requests: fates.len(),
        admitted: waits.len(),
        refused: fates.len() - waits.len(),
        delayed: waits.iter().filter(|&&w| w > 0).count(),
        wait_p50: percentile(&waits, 50),
        wait_p99: percentile(&waits, 99),
        wait_max: waits.last().copied().unwrap_or(0),
        max_burst,
        retry_after,
        retry_p50: percentile(&retries, 50),
        retry_max: retries.last().copied().unwrap_or(0),
    }
}

/// Milliseconds with one decimal.
fn ms(ns: u64) -> String {
    format!("{}.{}", ns / MS, ns % MS / 100_000)
}

/// The widest label the table shows, in characters; a longer one is cut, ending in `...`.
const LABEL: usize = 48;

/// A policy's label as the table shows it: at most [`LABEL`] characters.
fn label_cell(label: &str) -> String {
    if label.chars().count() <= LABEL {
        return label.to_owned();
    }
    let mut cut: String = label.chars().take(LABEL - 3).collect();
    cut.push_str("...");
    cut
}

/// The comparison table: one row per policy, then each policy's `Retry-After` values.
/// Labels are cut to [`LABEL`] characters, which also keeps the column's width within
/// what `format!` can pad (below 65,536).
pub fn table(runs: &[(&str, &Stats)]) -> String {
    let runs: Vec<(String, &Stats)> = runs.iter().map(|(l, s)| (label_cell(l), *s)).collect();
    let width = runs
        .iter()
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0)
        .max("policy".len());
    let mut out = format!(
        "{:<width$}  {:>8}  {:>8}  {:>8}  {:>9}  {:>9}  {:>9}  {:>14}\n",
        "policy",
        "admitted",
        "refused",
        "delayed",
        "wait p50",
        "wait p99",
        "wait max",
        "max per 100ms"
    );
    for (label, s) in &runs {
        out += &format!(
            "{:<width$}  {:>8}  {:>8}  {:>8}  {:>6} ms  {:>6} ms  {:>6} ms  {:>14}\n",
            label,
            s.admitted,
            s.refused,
            s.delayed,
            ms(s.wait_p50),
            ms(s.wait_p99),
            ms(s.wait_max),
            s.max_burst
        );
    }
    out += "\nRetry-After of the refusals (seconds: count)\n";
    for (label, s) in &runs {
        let mut hist: Vec<String> = s
            .retry_after
            .iter()
            .map(|(secs, n)| match secs {
                Some(secs) => format!("{secs}s: {n}"),
                None => format!("never: {n}"),
            })
            .collect();
        if hist.is_empty() {
            hist.push("no refusals".into());
        } else {
            hist.push(format!(
                "(exact: p50 {} ms, max {} ms)",
                ms(s.retry_p50),
                ms(s.retry_max)
            ));
        }
        out += &format!("{:<width$}  {}\n", label, hist.join("  "));
    }
    out
}

/// Everything a replay of one trace against several policies produces.
#[derive(Debug, Clone)]
pub struct Report {
    pub labels: Vec<String>,
    pub stats: Vec<Stats>,
    pub series: Vec<Vec<Point>>,
}

impl Report {
    /// Figures, series and chart span from the fates of each policy.
    pub fn new(trace: &[Arrival], labels: Vec<String>, fates: Vec<Vec<Fate>>) -> Report {
        let refs: Vec<&[Fate]> = fates.iter().map(Vec::as_slice).collect();
        let (from, to) = span(trace, &refs);
        let step = step(from, to);
        Report {
            stats: fates.iter().map(|f| stats(trace, f)).collect(),
            series: fates
                .iter()
                .map(|f| series(trace, f, from, to, step))
                .collect(),
            labels,
        }
    }

    pub fn table(&self) -> String {
        let runs: Vec<(&str, &Stats)> = self
            .labels
            .iter()
            .map(String::as_str)
            .zip(&self.stats)
            .collect();
        table(&runs)
    }

    fn runs(&self) -> Vec<(&str, &[Point])> {
        self.labels
            .iter()
            .map(String::as_str)
            .zip(self.series.iter().map(Vec::as_slice))
            .collect()
    }

    pub fn csv(&self) -> String {
        series_csv(&self.runs())
    }

    pub fn svg(&self, title: &str) -> Result<String, SimError> {
        chart_svg(title, &self.runs())
    }
}

/// `Retry-After` as tollgate sends it: the wait in whole seconds, rounded up.
fn retry_after_secs(wait: std::time::Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

//! The simulator's engine: traces (read from CSV or JSON lines, or built from patterns),
//! their replay through a store's own decisions on a manual clock, the statistics, the
//! series CSV and the SVG chart. `main.rs` is the command line around it; the tests in
//! `tests/simulate.rs` include this file as a module.
#![allow(dead_code, unreachable_pub)]

use std::{collections::BTreeMap, fmt, time::Duration};

use plotters::prelude::*;
use tollgate::{
    clock::ManualClock,
    decision::{Outcome, Source},
    policy::PolicySet,
    response::retry_after_secs,
    store::{MemoryStore, Store},
    Policy,
};

/// Nanoseconds in a second.
pub const NS: u64 = 1_000_000_000;
/// Nanoseconds in a millisecond.
pub const MS: u64 = 1_000_000;

/// Where trace time zero sits on the clock: 2027-01-15 00:00:00 UTC, a whole day since the
/// Unix epoch, so that windows of a second, a minute, an hour or a day start at trace time
/// zero on every store.
pub const BASE: Duration = Duration::from_secs(20_833 * 86_400);

/// The span in which "the largest burst passed downstream" is counted, and the shortest
/// over which the downstream rate is measured.
pub const BURST_SPAN: u64 = 100 * MS;

/// A bad trace, pattern or policy: what was wrong and, when it came from a file, the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimError {
    /// The 1-based line of the input it was found on, if it came from a file.
    pub line: Option<usize>,
    /// What was wrong.
    pub message: String,
}

impl SimError {
    pub fn new(message: impl Into<String>) -> Self {
        SimError {
            line: None,
            message: message.into(),
        }
    }

    pub fn at(line: usize, message: impl Into<String>) -> Self {
        SimError {
            line: Some(line),
            message: message.into(),
        }
    }
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for SimError {}

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    /// Nanoseconds since the start of the trace.
    pub at: u64,
    /// Who sent it: the rate-limit key.
    pub key: String,
    /// Units it spends.
    pub cost: u64,
}

// ---------------------------------------------------------------------------------------
// Numbers as written
// ---------------------------------------------------------------------------------------

/// A non-negative decimal (`1.25`, `300`, `0.0005`) times `unit` nanoseconds, exactly (no
/// floating point, up to nanosecond precision).
pub fn decimal_ns(text: &str, unit: u64) -> Result<u64, String> {
    if text.starts_with('-') {
        return Err(format!("{text} is negative"));
    }
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() && frac.is_empty() || !digits(int) || !digits(frac) {
        return Err(format!("{text:?} is not a number such as 1.25"));
    }
    let too_big = || format!("{text} is too large");
    let whole: u64 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| too_big())?
    };
    let mut ns = whole.checked_mul(unit).ok_or_else(too_big)?;
    // Each fractional digit is worth a tenth of the previous one; digits below a
    // nanosecond are dropped.
    let mut place = unit;
    for b in frac.bytes() {
        place /= 10;
        ns = ns
            .checked_add(u64::from(b - b'0') * place)
            .ok_or_else(too_big)?;
    }
    Ok(ns)
}

/// A duration in a pattern: `5s`, `100ms`, `2.5s`, `1min`.
pub fn duration_ns(text: &str) -> Result<u64, String> {
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .ok_or_else(|| format!("{text:?} needs a unit: ms, s or min"))?;
    let (n, unit) = text.split_at(split);
    let unit = match unit {
        "ms" => MS,
        "s" => NS,
        "min" => 60 * NS,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {text:?} (expected ms, s or min)"
            ))
        }
    };
    decimal_ns(n, unit)
}

/// Seconds with millisecond precision, for messages and tables.
pub fn secs(ns: u64) -> String {
    format!("{}.{:03}", ns / NS, ns % NS / MS)
}

/// A cost as written: a whole number, not negative.
fn cost_of(text: &str) -> Result<u64, String> {
    if text.starts_with('-') {
        return Err(format!("cost {text} is negative"));
    }
    text.parse()
        .map_err(|_| format!("cost {text:?} is not a whole number"))
}

// ---------------------------------------------------------------------------------------
// Traces from files
// ---------------------------------------------------------------------------------------

/// How a trace file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `time,key,cost` per line: time in seconds since the trace's start, cost optional
    /// (default 1); an optional header line; `#` comments.
    Csv,
    /// One JSON object per line: `{"time": 1.25, "key": "alice", "cost": 2}`, cost
    /// optional (default 1).
    JsonLines,
}

impl Format {
    /// By the file's extension: `.jsonl`, `.ndjson` and `.json` are JSON lines, anything
    /// else CSV.
    pub fn of_path(path: &str) -> Format {
        let lower = path.to_ascii_lowercase();
        if [".jsonl", ".ndjson", ".json"]
            .iter()
            .any(|e| lower.ends_with(e))
        {
            Format::JsonLines
        } else {
            Format::Csv
        }
    }
}

/// Reads a trace. Times must not go backwards; an error names its line.
pub fn parse_trace(text: &str, format: Format) -> Result<Vec<Arrival>, SimError> {
    let mut trace = Vec::new();
    // The previous arrival's time, as written and in ns.
    let mut previous: Option<(String, u64)> = None;
    let mut header_allowed = true;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let content = raw.trim();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let (time, key, cost) = match format {
            Format::Csv => {
                let fields: Vec<&str> = content.split(',').map(str::trim).collect();
                // A first line whose time is not a number is a header (`time,key,cost`).
                if header_allowed
                    && decimal_ns(fields[0], NS).is_err()
                    && !fields[0].starts_with('-')
                {
                    header_allowed = false;
                    continue;
                }
                if !(2..=3).contains(&fields.len()) {
                    return Err(SimError::at(
                        line,
                        format!(
                            "expected `time,key` or `time,key,cost`, found {} fields",
                            fields.len()
                        ),
                    ));
                }
                let cost = match fields.get(2) {
                    Some(c) => cost_of(c).map_err(|e| SimError::at(line, e))?,
                    None => 1,
                };
                (fields[0].to_owned(), fields[1].to_owned(), cost)
            }
            Format::JsonLines => json_line(content).map_err(|e| SimError::at(line, e))?,
        };
        header_allowed = false;
        if key.is_empty() {
            return Err(SimError::at(line, "the key is empty"));
        }
        let at = decimal_ns(&time, NS).map_err(|e| SimError::at(line, format!("time {e}")))?;
        if let Some((prev_text, prev)) = &previous {
            if at < *prev {
                return Err(SimError::at(
                    line,
                    format!("time {time} is before the previous {prev_text}"),
                ));
            }
        }
        previous = Some((time, at));
        trace.push(Arrival { at, key, cost });
    }
    if trace.is_empty() {
        return Err(SimError::new("the trace has no requests"));
    }
    Ok(trace)
}

/// One JSON line: its time (as written), key and cost.
fn json_line(content: &str) -> Result<(String, String, u64), String> {
    let value: serde_json::Value =
        serde_json::from_str(content).map_err(|e| format!("not JSON: {e}"))?;
    let obj = value
        .as_object()
        .ok_or("expected an object such as {\"time\": 1.5, \"key\": \"a\", \"cost\": 1}")?;
    let time = match obj.get("time") {
        Some(serde_json::Value::Number(n)) => {
            let text = n.to_string();
            if text.contains(['e', 'E']) {
                // An exponent (1e-7): to nanoseconds through a float, the only place one is
                // used.
                let secs = n.as_f64().unwrap_or(-1.0);
                if secs < 0.0 {
                    return Err(format!("time {text} is negative"));
                }
                format!("{:.9}", secs)
            } else {
                text
            }
        }
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => return Err(format!("time {other} is not a number of seconds")),
        None => return Err("no \"time\" field".into()),
    };
    let key = match obj.get("key") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Number(n)) => n.to_string(),
        Some(other) => return Err(format!("key {other} is not a string")),
        None => return Err("no \"key\" field".into()),
    };
    let cost = match obj.get("cost") {
        None => 1,
        Some(serde_json::Value::Number(n)) => cost_of(&n.to_string())?,
        Some(other) => return Err(format!("cost {other} is not a whole number")),
    };
    Ok((time, key, cost))
}

// ---------------------------------------------------------------------------------------
// Built-in patterns
// ---------------------------------------------------------------------------------------

/// The patterns and their parameters with defaults, for `--help`.
pub const PATTERNS: &str = "  idle-burst   idle=5s n=200 over=100ms key=client     n requests evenly spread over `over`, after `idle`
  overload     rate=300 for=2s key=client              `rate` per second, evenly spaced, for `for`
  sawtooth     peak=300 period=1s for=4s key=client    the rate ramps from 0 to `peak` per second over each period
  on-off       rate=300 on=500ms off=1s for=4s key=client   `rate` per second during `on`, nothing during `off`
  zipf         keys=50 s=1.1 rate=500 for=2s seed=1    `rate` per second over `keys` keys, key k chosen with weight 1/k^s
  (every pattern also takes cost=1)";

/// A pattern's parameters: `name:k=v,k=v`, with defaults.
struct Params {
    name: String,
    given: BTreeMap<String, String>,
}

impl Params {
    fn get(&mut self, key: &str, default: &str) -> String {
        self.given.remove(key).unwrap_or_else(|| default.to_owned())
    }

    fn duration(&mut self, key: &str, default: &str) -> Result<u64, SimError> {
        let v = self.get(key, default);
        duration_ns(&v).map_err(|e| SimError::new(format!("pattern {}: {key}: {e}", self.name)))
    }

    fn count(&mut self, key: &str, default: &str) -> Result<u64, SimError> {
        let v = self.get(key, default);
        match v.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(SimError::new(format!(
                "pattern {}: {key}={v} is not a whole number above 0",
                self.name
            ))),
        }
    }

    fn number(&mut self, key: &str, default: &str) -> Result<f64, SimError> {
        let v = self.get(key, default);
        match v.parse::<f64>() {
            Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
            _ => Err(SimError::new(format!(
                "pattern {}: {key}={v} is not a number",
                self.name
            ))),
        }
    }

    /// Refuses parameters the pattern does not take.
    fn done(self) -> Result<(), SimError> {
        match self.given.keys().next() {
            None => Ok(()),
            Some(k) => Err(SimError::new(format!(
                "pattern {} takes no parameter {k:?}",
                self.name
            ))),
        }
    }
}

/// A built-in pattern: `idle-burst`, `overload:rate=300,for=2s`, ... (see [`PATTERNS`]).
pub fn pattern(spec: &str) -> Result<Vec<Arrival>, SimError> {
    let (name, args) = spec.split_once(':').unwrap_or((spec, ""));
    let mut given = BTreeMap::new();
    for kv in args.split(',').filter(|s| !s.trim().is_empty()) {
        let (k, v) = kv.split_once('=').ok_or_else(|| {
            SimError::new(format!("pattern {name}: expected key=value, found {kv:?}"))
        })?;
        given.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    let mut p = Params {
        name: name.to_owned(),
        given,
    };
    let cost = p.count("cost", "1")?;
    let mut times = Vec::new();
    let mut keys = None;
    match name {
        "idle-burst" => {
            let idle = p.duration("idle", "5s")?;
            let n = p.count("n", "200")?;
            let over = p.duration("over", "100ms")?;
            times.extend((0..n).map(|i| idle + spread(i, n, over)));
        }
        "overload" => {
            let rate = p.count("rate", "300")?;
            let span = p.duration("for", "2s")?;
            times.extend(steady(0, span, rate));
        }
        "sawtooth" => {
            let peak = p.number("peak", "300")?;
            let period = p.duration("period", "1s")?;
            let span = p.duration("for", "4s")?;
            // Within a period of length P the rate is peak * t / P, so the k-th request of
            // the period arrives when peak * t^2 / (2P) reaches k.
            let per_period = (peak * period as f64 / NS as f64 / 2.0).floor() as u64;
            let mut start = 0;
            while start < span {
                for k in 0..per_period {
                    let t = (2.0 * period as f64 * k as f64 * NS as f64 / peak).sqrt() as u64;
                    if start + t < span {
                        times.push(start + t);
                    }
                }
                start += period;
            }
        }
        "on-off" => {
            let rate = p.count("rate", "300")?;
            let on = p.duration("on", "500ms")?;
            let off = p.duration("off", "1s")?;
            let span = p.duration("for", "4s")?;
            let mut start = 0;
            while start < span {
                times.extend(steady(start, on.min(span - start), rate));
                start += on + off;
            }
        }
        "zipf" => {
            let n = p.count("keys", "50")?;
            let s = p.number("s", "1.1")?;
            let rate = p.count("rate", "500")?;
            let span = p.duration("for", "2s")?;
            let seed = p.get("seed", "1");
            let seed = seed
                .parse::<u64>()
                .map_err(|_| SimError::new(format!("pattern zipf: seed={seed} is not a number")))?;
            times.extend(steady(0, span, rate));
            keys = Some(zipf_keys(times.len(), n, s, seed));
        }
        _ => {
            return Err(SimError::new(format!(
                "unknown pattern {name:?}; the patterns are:\n{PATTERNS}"
            )))
        }
    }
    let key = p.get("key", "client");
    p.done()?;
    if times.is_empty() {
        return Err(SimError::new(format!("pattern {name} makes no requests")));
    }
    Ok(times
        .into_iter()
        .enumerate()
        .map(|(i, at)| Arrival {
            at,
            key: keys
                .as_ref()
                .map_or_else(|| key.clone(), |k: &Vec<String>| k[i].clone()),
            cost,
        })
        .collect())
}

/// The i-th of n instants evenly spread over `span` (the first at 0).
fn spread(i: u64, n: u64, span: u64) -> u64 {
    (u128::from(i) * u128::from(span) / u128::from(n)) as u64
}

/// Arrivals at `rate` per second from `start` for `span`.
fn steady(start: u64, span: u64, rate: u64) -> impl Iterator<Item = u64> {
    let n = (u128::from(span) * u128::from(rate) / u128::from(NS)) as u64;
    (0..n).map(move |i| start + (u128::from(i) * u128::from(NS) / u128::from(rate)) as u64)
}

/// `count` keys drawn from `n` keys with Zipf popularity (key k has weight 1/k^s), from a
/// seeded generator (SplitMix64), so a pattern is the same trace on every run.
fn zipf_keys(count: usize, n: u64, s: f64, seed: u64) -> Vec<String> {
    let mut cdf = Vec::with_capacity(n as usize);
    let mut total = 0.0;
    for k in 1..=n {
        total += 1.0 / (k as f64).powf(s);
        cdf.push(total);
    }
    let width = n.to_string().len();
    let mut state = seed;
    (0..count)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let u = (z >> 11) as f64 / (1u64 << 53) as f64 * total;
            let k = cdf.partition_point(|&c| c <= u).min(n as usize - 1) + 1;
            format!("k{k:0width$}")
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Policies
// ---------------------------------------------------------------------------------------

/// A policy to replay against and the name it is shown under.
#[derive(Debug, Clone)]
pub struct Named {
    pub label: String,
    pub policy: Policy,
}

/// A policy written on the command line: its text is its label.
pub fn policy_arg(text: &str) -> Result<Named, SimError> {
    let policy = text
        .parse::<Policy>()
        .map_err(|e| SimError::new(format!("policy {text:?}: {e}")))?;
    Ok(Named {
        label: text.to_owned(),
        policy,
    })
}

/// A policies file, as [`PolicySet::from_text`] reads it: `name = policy` per line, `*`
/// for limits every policy also applies, `#` comments. Each named policy is replayed.
pub fn policies_file(text: &str) -> Result<Vec<Named>, SimError> {
    let set = PolicySet::from_text(text).map_err(|e| match e {
        tollgate::ConfigError::Line { line, error } => SimError::at(line, error.to_string()),
        other => SimError::new(other.to_string()),
    })?;
    let named: Vec<Named> = set
        .names()
        .filter_map(|name| {
            Some(Named {
                label: name.to_owned(),
                policy: set.policy(name)?.clone(),
            })
        })
        .collect();
    if named.is_empty() {
        return Err(SimError::new("the policies file names no policy"));
    }
    Ok(named)
}

// ---------------------------------------------------------------------------------------
// Replay
// ---------------------------------------------------------------------------------------

/// What happened to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Admitted, passed downstream after `wait` ns (zero unless queued).
    Admitted { wait: u64 },
    /// Refused; `retry_after` in ns, `None` when the cost can never be admitted (no
    /// `Retry-After`).
    Refused { retry_after: Option<u64> },
}

/// Replays `trace` against `policy` on `store`, moving `clock` to each arrival (trace time
/// zero at the clock's time when called): the decisions are the store's own, as the
/// middleware would get them.
pub async fn replay<S: Store<String>>(
    store: &S,
    clock: &ManualClock,
    policy: &Policy,
    trace: &[Arrival],
) -> Result<Vec<Fate>, SimError> {
    use tollgate::clock::Clock;
    let start = clock.now();
    let mut fates = Vec::with_capacity(trace.len());
    for (i, a) in trace.iter().enumerate() {
        clock.set(start + a.at);
        let d = store
            .decide(&a.key, policy, a.cost)
            .await
            .map_err(|e| SimError::new(format!("request {}: the store failed: {e}", i + 1)))?;
        // A decision the store made without its backend is not the policy's.
        if !matches!(d.source(), Source::Local | Source::Store) {
            return Err(SimError::new(format!(
                "request {}: decided by {:?}, not by the store",
                i + 1,
                d.source()
            )));
        }
        fates.push(match d.outcome() {
            Outcome::Allowed { wait } => Fate::Admitted {
                wait: wait.as_nanos() as u64,
            },
            Outcome::Denied { retry_after } => Fate::Refused {
                retry_after: Some(retry_after.as_nanos() as u64),
            },
            _ => Fate::Refused { retry_after: None },
        });
    }
    Ok(fates)
}

/// Replays against a fresh in-memory store on a manual clock at [`BASE`].
pub async fn replay_memory(policy: &Policy, trace: &[Arrival]) -> Result<Vec<Fate>, SimError> {
    let clock = ManualClock::at(BASE);
    let store: MemoryStore<String, ManualClock> =
        MemoryStore::new(policy.clone()).with_clock(clock.clone());
    replay(&store, &clock, policy, trace).await
}

// ---------------------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------------------

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

/// When each admitted request passed downstream (arrival plus wait), in order.
pub fn downstream(trace: &[Arrival], fates: &[Fate]) -> Vec<u64> {
    let mut out: Vec<u64> = trace
        .iter()
        .zip(fates)
        .filter_map(|(a, f)| match f {
            Fate::Admitted { wait } => Some(a.at + wait),
            Fate::Refused { .. } => None,
        })
        .collect();
    out.sort_unstable();
    out
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

/// The comparison table: one row per policy, then each policy's `Retry-After` values.
pub fn table(runs: &[(&str, &Stats)]) -> String {
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
    for (label, s) in runs {
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
    for (label, s) in runs {
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

// ---------------------------------------------------------------------------------------
// Series, CSV and chart
// ---------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------
// The showcase: seed 000's two scenarios, measured
// ---------------------------------------------------------------------------------------

/// A scenario of the showcase.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The chart's file name, without `.svg`.
    pub name: &'static str,
    pub title: &'static str,
    pub trace: Vec<Arrival>,
    pub policies: Vec<Named>,
}

/// The three policies of seed 000 at "100 per second": a token bucket with a burst of 200,
/// a strict leaky meter, a leaky-bucket queue of 200.
pub fn showcase_policies() -> Vec<Named> {
    [
        ("token bucket: 100/s burst 200", "100/s burst 200"),
        ("leaky meter: 100/s meter", "100/s meter"),
        ("leaky queue: queue 100/s 200", "queue 100/s 200"),
    ]
    .into_iter()
    .map(|(label, text)| Named {
        label: label.to_owned(),
        policy: text.parse().expect("the showcase's policies parse"),
    })
    .collect()
}

/// Seed 000's scenarios: 5 s idle then 200 requests in 100 ms; 300 per second for 2 s.
pub fn showcase() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "idle-then-burst",
            title: "5 s idle, then 200 requests in 100 ms, against 100/s",
            trace: pattern("idle-burst:idle=5s,n=200,over=100ms").expect("a valid pattern"),
            policies: showcase_policies(),
        },
        Scenario {
            name: "sustained-overload",
            title: "300 requests per second for 2 s, against 100/s",
            trace: pattern("overload:rate=300,for=2s").expect("a valid pattern"),
            policies: showcase_policies(),
        },
    ]
}

/// Everything a replay of one trace against several policies produces.
#[derive(Debug, Clone)]
pub struct Report {
    pub labels: Vec<String>,
    pub fates: Vec<Vec<Fate>>,
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
            fates,
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

/// Replays `trace` against each policy on its own fresh in-memory store.
pub async fn run_memory(trace: &[Arrival], policies: &[Named]) -> Result<Report, SimError> {
    let mut fates = Vec::new();
    for p in policies {
        fates.push(replay_memory(&p.policy, trace).await?);
    }
    Ok(Report::new(
        trace,
        policies.iter().map(|p| p.label.clone()).collect(),
        fates,
    ))
}

//! The simulator's engine: traces (read from CSV or JSON lines, or built from patterns),
//! their replay through a store's own decisions on a manual clock, the statistics, the
//! series CSV and the SVG chart. `main.rs` is the command line around it; the tests in
//! `tests/policies/simulate.rs` include this module.
#![allow(dead_code, unreachable_pub)]

mod chart;
mod patterns;
mod policies;
mod replay;
mod report;
mod series;
mod showcase;
mod trace;
mod units;

use std::fmt;

// What both includers name: `main.rs` and `tests/policies/simulate.rs`.
pub use patterns::pattern;
pub use policies::{policies_file, policy_arg, Named};
pub use replay::run_memory;
pub use showcase::showcase;
pub use trace::{parse_trace, Format};

// What only one of them names; the other would find these unused.
#[cfg(feature = "redis")]
#[allow(unused_imports)]
pub use replay::run_redis;
#[allow(unused_imports)]
pub use {
    chart::colour_hex,
    patterns::PATTERNS,
    replay::{replay_memory, Fate, BASE},
    report::Stats,
    units::secs,
};

/// Nanoseconds in a second.
pub const NS: u64 = 1_000_000_000;
/// Nanoseconds in a millisecond.
pub const MS: u64 = 1_000_000;

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

/// The longest stretch of the input an error message quotes, in bytes.
const QUOTED: usize = 64;

/// The start of `text` an error message shows (at most [`QUOTED`] bytes, cut at a
/// character) and, when it was cut, what follows it: the full length.
fn cut(text: &str) -> (&str, String) {
    if text.len() <= QUOTED {
        return (text, String::new());
    }
    let mut end = QUOTED;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (&text[..end], format!("... ({} bytes)", text.len()))
}

/// Input as an error message shows it, cut short: a 100 MB field makes a short message.
pub fn shown(text: &str) -> String {
    let (start, rest) = cut(text);
    format!("{start}{rest}")
}

/// Input as an error message quotes it: in quotes (escaped as Rust writes strings), cut
/// short as by [`shown`].
pub fn quoted(text: &str) -> String {
    let (start, rest) = cut(text);
    format!("{start:?}{rest}")
}

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

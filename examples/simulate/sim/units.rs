//! Numbers as written: decimals, durations and costs read exactly, seconds shown.

use super::{quoted, shown, MS, NS};

/// A non-negative decimal (`1.25`, `300`, `0.0005`) times `unit` nanoseconds, exactly (no
/// floating point, up to nanosecond precision).
pub fn decimal_ns(text: &str, unit: u64) -> Result<u64, String> {
    if text.starts_with('-') {
        return Err(format!("{} is negative", shown(text)));
    }
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if int.is_empty() && frac.is_empty() || !digits(int) || !digits(frac) {
        return Err(format!("{} is not a number such as 1.25", quoted(text)));
    }
    let too_big = || format!("{} is too large", shown(text));
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
        .ok_or_else(|| format!("{} needs a unit: ms, s or min", quoted(text)))?;
    let (n, unit) = text.split_at(split);
    let unit = match unit {
        "ms" => MS,
        "s" => NS,
        "min" => 60 * NS,
        _ => {
            return Err(format!(
                "unknown unit {} in {} (expected ms, s or min)",
                quoted(unit),
                quoted(text)
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
pub(super) fn cost_of(text: &str) -> Result<u64, String> {
    if text.starts_with('-') {
        return Err(format!("cost {} is negative", shown(text)));
    }
    text.parse()
        .map_err(|_| format!("cost {} is not a whole number", quoted(text)))
}

//! Policies written as text: `"100/s burst 200"`, `"10/min"`, `"1000/day window"`,
//! `"queue 100/s 50"`. See [`Policy`]'s `FromStr` and [`PolicySet::from_text`].

use std::{str::FromStr, time::Duration};

use super::quote::{cut, echo, ECHO};
use super::PolicySet;
use crate::{algorithm::Limit, error::ConfigError, policy::Policy, quota::Quota};

/// The longest reason a parse error gives, in bytes: reasons quote the text they are about
/// (cut to [`ECHO`] bytes), and an error of the library may quote more.
const REASON: usize = 4 * ECHO;

/// A parse error: what was wrong, and the part of the text it was found in (both cut, so
/// that a huge text makes a short message).
fn bad(part: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Parse {
        part: cut(part, ECHO),
        reason: cut(&reason.into(), REASON),
    }
}

/// A time unit in nanoseconds.
fn unit(text: &str) -> Option<u64> {
    const S: u64 = 1_000_000_000;
    Some(match text {
        "ns" | "nsec" | "nanosecond" | "nanoseconds" => 1,
        "us" | "usec" | "microsecond" | "microseconds" => 1_000,
        "ms" | "msec" | "millisecond" | "milliseconds" => 1_000_000,
        "s" | "sec" | "secs" | "second" | "seconds" => S,
        "m" | "min" | "mins" | "minute" | "minutes" => 60 * S,
        "h" | "hr" | "hour" | "hours" => 3600 * S,
        "d" | "day" | "days" => 86_400 * S,
        _ => return None,
    })
}

const UNITS: &str = "ns, us, ms, s, min, h or day";

/// Splits `text` at every character `at` accepts outside double quotes (in quotes, `\`
/// escapes the next character).
pub(super) fn split_unquoted(text: &str, at: impl Fn(char) -> bool) -> Vec<&str> {
    let (mut parts, mut start) = (Vec::new(), 0);
    let (mut quoted, mut escaped) = (false, false);
    for (i, c) in text.char_indices() {
        if escaped {
            escaped = false;
        } else if quoted && c == '\\' {
            escaped = true;
        } else if c == '"' {
            quoted = !quoted;
        } else if !quoted && at(c) {
            parts.push(&text[start..i]);
            start = i + c.len_utf8();
        }
    }
    parts.push(&text[start..]);
    parts
}

/// A name as written: as it is, or in double quotes with `\"` and `\\` escaped.
fn name(part: &str, text: &str) -> Result<String, ConfigError> {
    let Some(inner) = text.strip_prefix('"') else {
        return Ok(text.to_owned());
    };
    let unclosed = || {
        bad(
            part,
            format!("the quoted name {} is not closed", echo(text)),
        )
    };
    let inner = inner.strip_suffix('"').ok_or_else(unclosed)?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next().ok_or_else(unclosed)?),
            '"' => return Err(unclosed()),
            c => out.push(c),
        }
    }
    Ok(out)
}

fn int(part: &str, text: &str, what: &str) -> Result<u64, ConfigError> {
    text.parse::<u64>()
        .map_err(|_| bad(part, format!("{what} {} is not a whole number", echo(text))))
}

/// `5h`, `30min`, `1s`: a number followed by a unit.
fn duration(part: &str, text: &str) -> Result<Duration, ConfigError> {
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (n, u) = text.split_at(digits);
    let n = int(part, n, "duration")?;
    let u = unit(u).ok_or_else(|| {
        bad(
            part,
            format!(
                "unknown time unit {} in {} (expected {UNITS})",
                echo(u),
                echo(text)
            ),
        )
    })?;
    n.checked_mul(u)
        .map(Duration::from_nanos)
        .ok_or_else(|| bad(part, format!("duration {} is too long", echo(text))))
}

/// `100/s`, `10/min`, `5/12s`: units per period.
fn rate(part: &str, text: &str) -> Result<Quota, ConfigError> {
    let (n, per) = text.split_once('/').ok_or_else(|| {
        bad(
            part,
            format!("expected a rate such as 100/s, found {}", echo(text)),
        )
    })?;
    let n = int(part, n, "the rate's count")?;
    let period = if per.starts_with(|c: char| c.is_ascii_digit()) {
        duration(part, per)?
    } else {
        Duration::from_nanos(unit(per).ok_or_else(|| {
            bad(
                part,
                format!("unknown time unit {} (expected {UNITS})", echo(per)),
            )
        })?)
    };
    Quota::new(n, period).map_err(|e| bad(part, e.to_string()))
}

/// One limit: `[name:] body [options]`.
fn limit(part: &str) -> Result<Limit, ConfigError> {
    let mut words = split_unquoted(part, char::is_whitespace)
        .into_iter()
        .filter(|w| !w.is_empty())
        .peekable();
    let mut limit_name = None;
    if let Some(w) = words.peek() {
        if let Some(n) = w.strip_suffix(':') {
            limit_name = Some(name(part, n)?);
            words.next();
        }
    }
    let first = words
        .next()
        .ok_or_else(|| bad(part, "an empty limit (expected a rate such as 100/s)"))?;
    let queued = first == "queue";
    let quota = rate(
        part,
        if queued {
            words.next().unwrap_or("")
        } else {
            first
        },
    )?;
    let mut queue = None;
    if queued {
        let size = words
            .next()
            .ok_or_else(|| bad(part, "a queue needs its size: queue 100/s 50"))?;
        queue = Some(int(part, size, "the queue size")?);
    }
    let (mut burst, mut nodelay, mut offset, mut max_wait) = (None, None, None, None);
    let (mut kind, mut mode) = ("", None);
    while let Some(w) = words.next() {
        let mut value = |what: &str| {
            words
                .next()
                .ok_or_else(|| bad(part, format!("{} needs {what}", echo(w))))
        };
        match w {
            "burst" => burst = Some(int(part, value("a number")?, "the burst")?),
            "nodelay" => nodelay = Some(int(part, value("a number")?, "nodelay")?),
            "offset" => offset = Some(duration(part, value("a duration such as 5h")?)?),
            "max-wait" => max_wait = Some(duration(part, value("a duration such as 300ms")?)?),
            "meter" | "window" | "sliding" if kind.is_empty() && !queued => kind = w,
            "shadow" => mode = Some(None),
            "enforce" => {
                let p = value("a percentage such as 25%")?;
                let n = p
                    .strip_suffix('%')
                    .and_then(|n| n.parse::<f64>().ok())
                    .ok_or_else(|| {
                        bad(part, format!("{} is not a percentage such as 25%", echo(p)))
                    })?;
                mode = Some(Some(n));
            }
            other => return Err(bad(part, format!("unexpected {}", echo(other)))),
        }
    }
    let fail = |e: ConfigError| bad(part, e.to_string());
    let small = |n: u64, what: &str| {
        u32::try_from(n).map_err(|_| bad(part, format!("{what} {n} is too large")))
    };
    let mut l = match (queue, kind) {
        (Some(q), _) => {
            let nodelay = small(nodelay.unwrap_or(0), "nodelay")?;
            Limit::leaky_queue_nodelay(quota, small(q, "the queue size")?, nodelay)
        }
        (None, "meter") => Limit::leaky_meter(quota),
        (None, "window") => Limit::fixed_window(quota),
        (None, "sliding") => Limit::sliding_window(quota),
        _ => match burst {
            Some(b) => quota.with_burst(b).and_then(Limit::token_bucket),
            None => Limit::token_bucket(quota),
        },
    }
    .map_err(fail)?;
    if burst.is_some() && !kind.is_empty() {
        return Err(bad(part, format!("a {kind} takes no burst")));
    }
    if nodelay.is_some() && !queued {
        return Err(bad(part, "nodelay applies to a queue only"));
    }
    if let Some(o) = offset {
        l = l.with_window_offset(o).map_err(fail)?;
    }
    if let Some(w) = max_wait {
        l = l.with_max_wait(w).map_err(fail)?;
    }
    if let Some(n) = limit_name {
        l = l.named(n).map_err(fail)?;
    }
    match mode {
        None => {}
        Some(None) => l = l.shadow(),
        Some(Some(percent)) => l = l.enforce_percent(percent).map_err(fail)?,
    }
    Ok(l)
}

/// A policy: limits separated by commas.
///
/// ```
/// use tollgate::Policy;
///
/// let api: Policy = "minute: 100/min burst 20, daily: 10000/day window".parse()?;
/// assert_eq!(api.limits().len(), 2);
/// assert_eq!(api.limits()[1].name(), "daily");
///
/// let err = "100/fortnight".parse::<Policy>().unwrap_err();
/// assert!(err.to_string().contains("\"fortnight\""), "{err}");
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
impl FromStr for Policy {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, ConfigError> {
        let limits = split_unquoted(text, |c| c == ',')
            .into_iter()
            .map(|part| limit(part.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        Policy::from_limits(limits).map_err(|e| bad(text, e.to_string()))
    }
}

impl PolicySet {
    /// Reads a set written one policy per line, `name = policy`; the name `*` holds the
    /// limits every policy also applies; `#` starts a comment. An error names the line.
    /// A text of one policy alone (one line without `name =`, such as `100/s burst 200`)
    /// is a set of that one unnamed policy, as [`PolicySet::single`] makes. A name the
    /// plain form cannot hold (one with `=`, `#` or `"`) is written in double quotes, as
    /// [`Display`](std::fmt::Display) writes it.
    ///
    /// ```
    /// use tollgate::policy::PolicySet;
    ///
    /// let plans = PolicySet::from_text(
    ///     "# plans\n\
    ///      free = 10/min\n\
    ///      pro = 100/min\n\
    ///      * = daily: 1000/day window\n",
    /// )?;
    /// assert_eq!(plans.names().collect::<Vec<_>>(), ["free", "pro"]);
    ///
    /// let err = PolicySet::from_text("free = 10/min\npro = 100/mni").unwrap_err();
    /// assert!(err.to_string().starts_with("line 2"), "{err}");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn from_text(text: &str) -> Result<PolicySet, ConfigError> {
        let lines: Vec<(usize, &str)> = text
            .lines()
            .enumerate()
            .map(|(i, line)| (i + 1, split_unquoted(line, |c| c == '#')[0].trim()))
            .filter(|(_, line)| !line.is_empty())
            .collect();
        let at = |line: usize| {
            move |e: ConfigError| ConfigError::Line {
                line,
                error: Box::new(e),
            }
        };
        if let [(n, line)] = lines[..] {
            if split_unquoted(line, |c| c == '=').len() == 1 {
                return line.parse::<Policy>().map(PolicySet::single).map_err(at(n));
            }
        }
        let mut entries = Vec::with_capacity(lines.len());
        for (n, line) in lines {
            let (policy_name, policy) = match &split_unquoted(line, |c| c == '=')[..] {
                [policy_name, _, ..] => (*policy_name, &line[policy_name.len() + 1..]),
                _ => return Err(at(n)(bad(line, "expected `name = policy`"))),
            };
            let policy = policy.trim().parse::<Policy>().map_err(at(n))?;
            let policy_name = name(line, policy_name.trim()).map_err(at(n))?;
            entries.push((policy_name, policy, n));
        }
        PolicySet::from_entries(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;

    fn one(text: &str) -> Limit {
        let p: Policy = text.parse().unwrap();
        assert_eq!(p.limits().len(), 1, "{text}");
        p.limits()[0].clone()
    }

    #[test]
    fn the_documented_forms() {
        let l = one("100/s burst 200");
        assert_eq!(l.algorithm(), Algorithm::TokenBucket);
        assert_eq!(
            l.quota(),
            &Quota::per_second(100).unwrap().with_burst(200).unwrap()
        );
        assert_eq!(one("10/min").quota(), &Quota::per_minute(10).unwrap());
        let w = one("1000/day window");
        assert_eq!(w.algorithm(), Algorithm::FixedWindow);
        assert_eq!(w.quota(), &Quota::per_day(1000).unwrap());
        let q = one("queue 100/s 50");
        assert_eq!(
            q.algorithm(),
            Algorithm::LeakyQueue {
                queue: 50,
                nodelay: 0
            }
        );
        assert_eq!(
            one("queue 10/s 20 nodelay 5").algorithm(),
            Algorithm::LeakyQueue {
                queue: 20,
                nodelay: 5
            }
        );
        assert_eq!(one("5/s meter").algorithm(), Algorithm::LeakyMeter);
        assert_eq!(one("50/h sliding").algorithm(), Algorithm::SlidingWindow);
        assert_eq!(
            one("5/12s").quota(),
            &Quota::new(5, Duration::from_secs(12)).unwrap()
        );
        assert_eq!(one("daily: 1000/day window").name(), "daily");
        assert_eq!(
            one("1/day window offset 5h"),
            Limit::fixed_window(Quota::per_day(1).unwrap())
                .unwrap()
                .with_window_offset(Duration::from_secs(5 * 3600))
                .unwrap()
        );
        assert!(one("5/s shadow").is_shadow());
        assert_eq!(one("5/s enforce 25%").enforced_percent(), 25.0);
    }

    #[test]
    fn bad_texts_name_the_bad_part() {
        for (text, needle) in [
            ("", "empty limit"),
            ("100", "expected a rate"),
            ("x/s", "\"x\" is not a whole number"),
            ("100/fortnight", "unknown time unit \"fortnight\""),
            ("0/s", "at least 1"),
            ("100/s burst", "\"burst\" needs a number"),
            ("100/s burst x", "the burst \"x\""),
            ("100/s window burst 3", "takes no burst"),
            ("5/s meter burst 2", "takes no burst"),
            ("queue 100/s", "needs its size"),
            ("100/s nodelay 2", "queue only"),
            ("100/s turbo", "unexpected \"turbo\""),
            ("10/s, 5/s, 4/s, 3/s, 2/s", "at most"),
            ("5/s enforce lots", "not a percentage"),
            ("5/s enforce 120%", "percent"),
        ] {
            let err = text.parse::<Policy>().unwrap_err().to_string();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }
}

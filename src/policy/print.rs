//! Policies printed as the text they are read from: `Display` for [`Policy`] and
//! [`PolicySet`], which [`FromStr`](std::str::FromStr) and [`PolicySet::from_text`] read
//! back to an equal value.

use std::fmt::{self, Display, Formatter, Write};

use super::{Policy, PolicySet};
use crate::algorithm::{Algorithm, Enforcement, Limit, Params};

/// Time units as the text writes them, the largest first.
const UNITS: [(u64, &str); 7] = [
    (86_400_000_000_000, "day"),
    (3_600_000_000_000, "h"),
    (60_000_000_000, "min"),
    (1_000_000_000, "s"),
    (1_000_000, "ms"),
    (1_000, "us"),
    (1, "ns"),
];

/// `ns` as a whole number of the largest unit that divides it: `5h`, `300ms`.
fn duration(f: &mut Formatter<'_>, ns: u64) -> fmt::Result {
    if ns == 0 {
        return f.write_str("0s");
    }
    let (n, unit) = UNITS
        .iter()
        .find(|(n, _)| ns.is_multiple_of(*n))
        .unwrap_or(&UNITS[6]);
    write!(f, "{}{unit}", ns / n)
}

/// A rate: `100/s`, `5/12s`.
fn rate(f: &mut Formatter<'_>, limit: &Limit) -> fmt::Result {
    let q = limit.quota();
    write!(f, "{}/", q.limit())?;
    let period = q.period_ns();
    match UNITS.iter().find(|(n, _)| *n == period) {
        Some((_, unit)) => f.write_str(unit),
        None => duration(f, period),
    }
}

/// A name, quoted when the plain text could not hold it: with a space, or one of the
/// characters the text is split at.
fn name(f: &mut Formatter<'_>, name: &str) -> fmt::Result {
    let plain = !name.is_empty()
        && !name.starts_with('"')
        && !name.contains(|c: char| c.is_whitespace() || matches!(c, ',' | '#' | '=' | '"'));
    if plain {
        return f.write_str(name);
    }
    f.write_char('"')?;
    for c in name.chars() {
        if matches!(c, '"' | '\\') {
            f.write_char('\\')?;
        }
        f.write_char(c)?;
    }
    f.write_char('"')
}

/// A share of keys, in percent with up to two decimals: `25`, `0.01`.
fn percent(f: &mut Formatter<'_>, hundredths: u16) -> fmt::Result {
    write!(f, "{}", hundredths / 100)?;
    match hundredths % 100 {
        0 => Ok(()),
        n if n % 10 == 0 => write!(f, ".{}", n / 10),
        n => write!(f, ".{n:02}"),
    }
}

/// One limit, its name written when `named` says so.
fn limit(f: &mut Formatter<'_>, l: &Limit, named: bool) -> fmt::Result {
    if named {
        name(f, l.name())?;
        f.write_str(": ")?;
    }
    match l.algorithm() {
        Algorithm::LeakyQueue { queue, nodelay } => {
            f.write_str("queue ")?;
            rate(f, l)?;
            write!(f, " {queue}")?;
            if nodelay > 0 {
                write!(f, " nodelay {nodelay}")?;
            }
            let unbounded = u64::from(queue - nodelay) * l.quota().interval_ns();
            if let Some(wait) = l
                .max_wait()
                .filter(|w| w.as_nanos() < u128::from(unbounded))
            {
                f.write_str(" max-wait ")?;
                duration(f, wait.as_nanos() as u64)?;
            }
        }
        algorithm => {
            rate(f, l)?;
            match algorithm {
                Algorithm::LeakyMeter => f.write_str(" meter")?,
                Algorithm::FixedWindow => f.write_str(" window")?,
                Algorithm::SlidingWindow => f.write_str(" sliding")?,
                _ if l.quota().burst_is_set() => write!(f, " burst {}", l.quota().burst())?,
                _ => {}
            }
        }
    }
    if let Params::Fixed(w) | Params::Sliding(w) = l.params {
        if w.shift != 0 {
            f.write_str(" offset ")?;
            duration(f, w.w - w.shift)?;
        }
    }
    match l.enforcement() {
        Enforcement::Enforced => Ok(()),
        Enforcement::Keys(0) => f.write_str(" shadow"),
        Enforcement::Keys(n) => {
            f.write_str(" enforce ")?;
            percent(f, n)?;
            f.write_char('%')
        }
    }
}

/// Limits separated by commas; `named` says which names to write.
fn limits(f: &mut Formatter<'_>, limits: &[Limit], named: fn(&Limit) -> bool) -> fmt::Result {
    for (i, l) in limits.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        limit(f, l, named(l))?;
    }
    Ok(())
}

/// A policy as text: `minute: 100/min burst 20, daily: 10000/day window`. Read back with
/// [`str::parse`], it gives an equal policy. A limit's name is written when it was given
/// ([`Limit::named`]) or a policy set gave it (`free`), not when it is its quota's
/// default (`100-per-1m`).
///
/// ```
/// use tollgate::Policy;
///
/// let api: Policy = "minute: 100/min burst 20, daily: 10000/day window offset 5h".parse()?;
/// assert_eq!(api.to_string(), "minute: 100/min burst 20, daily: 10000/day window offset 5h");
/// assert_eq!(api.to_string().parse::<Policy>()?, api);
/// // One way of writing each limit: the largest unit, no default spelled out.
/// let queue: Policy = "queue 10/1000ms 50 max-wait 300000us".parse()?;
/// assert_eq!(queue.to_string(), "queue 10/s 50 max-wait 300ms");
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
impl Display for Policy {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        limits(f, self.limits(), |l| {
            l.is_named() || l.name() != l.quota().default_name()
        })
    }
}

/// A policy set as [`PolicySet::from_text`] reads it: one `name = policy` line per policy,
/// the fallback first, then `* = ...` for the limits every policy applies; a set of one
/// unnamed policy ([`PolicySet::single`]) is that policy's text alone. Read back, it gives
/// an equal set.
///
/// ```
/// use tollgate::policy::PolicySet;
///
/// let plans = PolicySet::from_text("free = 10/min\npro = 100/min burst 20\n* = daily: 1000/day window")?;
/// assert_eq!(plans.to_string(), "free = 10/min\npro = 100/min burst 20\n* = daily: 1000/day window\n");
/// assert_eq!(PolicySet::from_text(&plans.to_string())?, plans);
/// assert_eq!(PolicySet::from_text("100/s burst 200")?.to_string(), "100/s burst 200");
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
impl Display for PolicySet {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let every = self.every().len();
        for i in 0..self.len() {
            let entry = self.entry(i);
            let Some(policy_name) = &entry.name else {
                return Display::fmt(&entry.policy, f);
            };
            name(f, policy_name)?;
            f.write_str(" = ")?;
            limits(f, &entry.policy.limits()[every..], Limit::is_named)?;
            f.write_char('\n')?;
        }
        if every > 0 {
            f.write_str("* = ")?;
            limits(f, self.every(), |l| {
                l.is_named() || l.name() != l.quota().default_name()
            })?;
            f.write_char('\n')?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(text: &str) -> String {
        let p: Policy = text.parse().unwrap();
        let printed = p.to_string();
        assert_eq!(printed.parse::<Policy>().unwrap(), p, "{text} -> {printed}");
        printed
    }

    #[test]
    fn every_form_prints_as_it_is_written() {
        for text in [
            "100/s burst 200",
            "10/min",
            "5/s meter",
            "queue 100/s 50",
            "queue 10/s 20 nodelay 5",
            "queue 10/s 50 max-wait 300ms",
            "1000/day window",
            "1000/day window offset 5h",
            "50/h sliding",
            "5/12s",
            "1/90min",
            "3/250us",
            "daily: 1000/day window",
            "5/s shadow",
            "5/s enforce 25%",
            "5/s enforce 0.5%",
            "5/s enforce 12.34%",
            "\"my limit, v2\": 5/s",
            "\"say \\\"hi\\\" \\\\ bye\": 5/s",
            "minute: 100/min burst 20, daily: 10000/day window",
        ] {
            assert_eq!(round_trip(text), text);
        }
        // Another way of writing the same limit prints one way.
        assert_eq!(round_trip("100/1s burst 200"), "100/s burst 200");
        assert_eq!(round_trip("10/60s"), "10/min");
        assert_eq!(
            round_trip("1/1day window offset 29h"),
            "1/day window offset 5h"
        );
        assert_eq!(round_trip("5/s enforce 100%"), "5/s");
        assert_eq!(round_trip("queue 10/s 5 max-wait 1h"), "queue 10/s 5");
    }
}

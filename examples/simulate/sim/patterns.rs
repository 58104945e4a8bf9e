//! Built-in patterns: traces made from a name and parameters, Zipf-distributed keys included.

use std::collections::BTreeMap;

use super::replay::check_time;
use super::{quoted, shown, units::duration_ns, Arrival, SimError, NS};

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
        duration_ns(&v)
            .and_then(|ns| check_time(ns, &v))
            .map_err(|e| SimError::new(format!("pattern {}: {key}: {e}", self.name)))
    }

    fn count(&mut self, key: &str, default: &str) -> Result<u64, SimError> {
        let v = self.get(key, default);
        match v.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(SimError::new(format!(
                "pattern {}: {key}={} is not a whole number above 0",
                self.name,
                shown(&v)
            ))),
        }
    }

    fn number(&mut self, key: &str, default: &str) -> Result<f64, SimError> {
        let v = self.get(key, default);
        match v.parse::<f64>() {
            Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
            _ => Err(SimError::new(format!(
                "pattern {}: {key}={} is not a number",
                self.name,
                shown(&v)
            ))),
        }
    }

    /// Refuses parameters the pattern does not take.
    fn done(self) -> Result<(), SimError> {
        match self.given.keys().next() {
            None => Ok(()),
            Some(k) => Err(SimError::new(format!(
                "pattern {} takes no parameter {}",
                self.name,
                quoted(k)
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
            SimError::new(format!(
                "pattern {}: expected key=value, found {}",
                shown(name),
                quoted(kv)
            ))
        })?;
        given.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    let mut p = Params {
        name: shown(name),
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
            let seed = seed.parse::<u64>().map_err(|_| {
                SimError::new(format!(
                    "pattern zipf: seed={} is not a number",
                    shown(&seed)
                ))
            })?;
            times.extend(steady(0, span, rate));
            keys = Some(zipf_keys(times.len(), n, s, seed));
        }
        _ => {
            return Err(SimError::new(format!(
                "unknown pattern {}; the patterns are:\n{PATTERNS}",
                quoted(name)
            )))
        }
    }
    let key = p.get("key", "client");
    let name = p.name.clone();
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

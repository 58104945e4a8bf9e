//! What an upstream's response says about its limits: `Retry-After` on a `429` or `503`,
//! the IETF `RateLimit` and `RateLimit-Policy` fields, and the `X-RateLimit-Limit` /
//! `-Remaining` / `-Reset` family. A malformed field is ignored, as if absent.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, StatusCode};

/// A `X-RateLimit-Reset` at least this large is a Unix time (seconds), not a delta: a
/// delta of 31 years is no reset anyone sends, and Unix times passed it in 2001.
const UNIX_TIME_FROM: f64 = 1_000_000_000.0;

/// The longest window a quota is learned for (a year): longer ones are ignored.
const MAX_WINDOW_SECS: u64 = 366 * 86_400;

/// Which field asked for a pause (the label of the pauses' metric).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Field {
    /// `Retry-After` on a `429` or `503`.
    RetryAfter,
    /// The IETF `RateLimit` field with a quota at `r=0`.
    RateLimit,
    /// `X-RateLimit-Remaining: 0` with its `X-RateLimit-Reset`.
    XRateLimit,
}

impl Field {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Field::RetryAfter => "retry_after",
            Field::RateLimit => "ratelimit",
            Field::XRateLimit => "x_ratelimit",
        }
    }
}

/// A quota the upstream announced: `quota` units per `window_secs` seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Announced {
    pub(crate) quota: u64,
    pub(crate) window_secs: u64,
}

/// What one response said.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Heard {
    /// The longest pause asked for, and by which field.
    pub(crate) pause: Option<(Duration, Field)>,
    /// The quotas of `RateLimit-Policy`.
    pub(crate) policy: Vec<Announced>,
    /// `X-RateLimit-Limit`, with the seconds to its `X-RateLimit-Reset` when sent: the
    /// window is not said, so the caller estimates it from the resets it sees.
    pub(crate) x_limit: Option<(u64, Option<f64>)>,
}

impl Heard {
    fn pause(&mut self, secs: f64, field: Field) {
        if !(secs.is_finite() && secs > 0.0) {
            return;
        }
        let pause = Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX);
        if self.pause.is_none_or(|(p, _)| pause > p) {
            self.pause = Some((pause, field));
        }
    }
}

/// Reads `status` and `headers` as of `now`.
pub(crate) fn read(status: StatusCode, headers: &HeaderMap, now: SystemTime) -> Heard {
    let mut heard = Heard::default();
    if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
        if let Some(secs) = one(headers, "retry-after").and_then(|v| retry_after(v, now)) {
            heard.pause(secs, Field::RetryAfter);
        }
    }
    ietf(headers, &mut heard);
    x_ratelimit(headers, now, &mut heard);
    heard
}

/// A field's value, when it is sent once and is text.
fn one<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    value.to_str().ok().map(str::trim)
}

/// A field's values joined as one list (RFC 9110 §5.3), when all are text.
fn list(headers: &HeaderMap, name: &str) -> Option<String> {
    let mut joined = String::new();
    for value in headers.get_all(name) {
        if !joined.is_empty() {
            joined.push_str(", ");
        }
        joined.push_str(value.to_str().ok()?);
    }
    (!joined.is_empty()).then_some(joined)
}

/// `Retry-After` as seconds from `now`: delay-seconds, or an HTTP date (RFC 9110 §10.2.3).
fn retry_after(value: &str, now: SystemTime) -> Option<f64> {
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return value.parse::<u64>().ok().map(|s| s as f64);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).map_or(0.0, |d| d.as_secs_f64()))
}

/// `RateLimit-Policy` (quotas) and `RateLimit` (a quota at `r=0` pauses for its `t`).
fn ietf(headers: &HeaderMap, heard: &mut Heard) {
    let policies = list(headers, "ratelimit-policy").and_then(|v| sf::list(&v));
    for item in policies.iter().flatten() {
        // Draft 10 on: `"name";q=100;w=60`; before it, the item was the quota itself.
        let quota = item.param("q").or(item.integer);
        let window = item.param("w");
        if let (Some(quota), Some(window)) = (quota, window) {
            if quota > 0 && (1..=MAX_WINDOW_SECS).contains(&window) {
                heard.policy.push(Announced {
                    quota,
                    window_secs: window,
                });
            }
        }
    }
    let limits = list(headers, "ratelimit").and_then(|v| sf::list(&v));
    for item in limits.iter().flatten() {
        if item.param("r") == Some(0) {
            if let Some(t) = item.param("t") {
                heard.pause(t as f64, Field::RateLimit);
            }
        }
    }
}

/// `X-RateLimit-Limit`, `-Remaining` and `-Reset` (delta seconds, or a Unix time as
/// GitHub sends it).
fn x_ratelimit(headers: &HeaderMap, now: SystemTime, heard: &mut Heard) {
    let number = |name| {
        one(headers, name)
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|n| n.is_finite() && *n >= 0.0)
    };
    let reset = number("x-ratelimit-reset").map(|r| {
        if r >= UNIX_TIME_FROM {
            let now = now
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            (r - now).max(0.0)
        } else {
            r
        }
    });
    if let (Some(remaining), Some(reset)) = (number("x-ratelimit-remaining"), reset) {
        if remaining < 1.0 {
            heard.pause(reset, Field::XRateLimit);
        }
    }
    if let Some(limit) = number("x-ratelimit-limit").filter(|l| *l >= 1.0 && l.fract() == 0.0) {
        heard.x_limit = Some((limit as u64, reset));
    }
}

/// The part of Structured Field Values (RFC 9651) the rate-limit fields use: a list of
/// items with parameters, integers read, other values skipped. A list that does not
/// parse is ignored whole, as the RFC asks.
mod sf {
    /// One member of a list: its integer value (if it is one) and its integer
    /// parameters.
    #[derive(Debug, Default)]
    pub(super) struct Item {
        pub(super) integer: Option<u64>,
        params: Vec<(String, Option<u64>)>,
    }

    impl Item {
        /// The parameter `key`, when it is a non-negative integer.
        pub(super) fn param(&self, key: &str) -> Option<u64> {
            self.params
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .and_then(|(_, v)| *v)
        }
    }

    struct Parser<'a> {
        s: &'a [u8],
        at: usize,
    }

    pub(super) fn list(input: &str) -> Option<Vec<Item>> {
        let mut p = Parser {
            s: input.as_bytes(),
            at: 0,
        };
        let mut items = Vec::new();
        p.spaces();
        while p.at < p.s.len() {
            items.push(p.item()?);
            p.ows();
            if p.at == p.s.len() {
                break;
            }
            p.eat(b',')?;
            p.ows();
            if p.at == p.s.len() {
                return None; // a trailing comma
            }
        }
        Some(items)
    }

    impl Parser<'_> {
        fn peek(&self) -> Option<u8> {
            self.s.get(self.at).copied()
        }

        fn eat(&mut self, b: u8) -> Option<()> {
            (self.peek() == Some(b)).then(|| self.at += 1)
        }

        fn spaces(&mut self) {
            while self.peek() == Some(b' ') {
                self.at += 1;
            }
        }

        fn ows(&mut self) {
            while matches!(self.peek(), Some(b' ' | b'\t')) {
                self.at += 1;
            }
        }

        fn item(&mut self) -> Option<Item> {
            let mut item = Item {
                integer: self.bare()?,
                ..Item::default()
            };
            while self.eat(b';').is_some() {
                self.spaces();
                let key = self.key()?;
                let value = if self.eat(b'=').is_some() {
                    self.bare()?
                } else {
                    None // a boolean `true`
                };
                item.params.push((key, value));
            }
            Some(item)
        }

        fn key(&mut self) -> Option<String> {
            let start = self.at;
            match self.peek()? {
                b'a'..=b'z' | b'*' => self.at += 1,
                _ => return None,
            }
            while let Some(b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*') = self.peek() {
                self.at += 1;
            }
            Some(String::from_utf8_lossy(&self.s[start..self.at]).into_owned())
        }

        /// A bare item: `Some(n)` for a non-negative integer, `None` for any other
        /// valid value; `Err`-like `None` of the outer option when it does not parse.
        #[allow(clippy::option_option)]
        fn bare(&mut self) -> Option<Option<u64>> {
            match self.peek()? {
                b'-' | b'0'..=b'9' => self.number(),
                b'"' => {
                    self.at += 1;
                    loop {
                        match self.peek()? {
                            b'\\' => {
                                self.at += 1;
                                matches!(self.peek()?, b'"' | b'\\').then_some(())?;
                                self.at += 1;
                            }
                            b'"' => {
                                self.at += 1;
                                return Some(None);
                            }
                            0x20..=0x7e => self.at += 1,
                            _ => return None,
                        }
                    }
                }
                b'?' => {
                    self.at += 1;
                    matches!(self.peek()?, b'0' | b'1').then(|| self.at += 1)?;
                    Some(None)
                }
                b':' => {
                    self.at += 1;
                    while let Some(b) = self.peek() {
                        self.at += 1;
                        if b == b':' {
                            return Some(None);
                        }
                        (b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
                            .then_some(())?;
                    }
                    None
                }
                b'A'..=b'Z' | b'a'..=b'z' | b'*' => {
                    while let Some(b) = self.peek() {
                        if b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b) {
                            self.at += 1;
                        } else {
                            break;
                        }
                    }
                    Some(None)
                }
                _ => None,
            }
        }

        /// An integer (at most 15 digits) or a decimal; only a non-negative integer has a
        /// value.
        #[allow(clippy::option_option)]
        fn number(&mut self) -> Option<Option<u64>> {
            let negative = self.eat(b'-').is_some();
            let start = self.at;
            while let Some(b'0'..=b'9') = self.peek() {
                self.at += 1;
            }
            let digits = self.at - start;
            if digits == 0 || digits > 15 {
                return None;
            }
            if self.eat(b'.').is_some() {
                let frac = self.at;
                while let Some(b'0'..=b'9') = self.peek() {
                    self.at += 1;
                }
                let frac = self.at - frac;
                return (digits <= 12 && (1..=3).contains(&frac)).then_some(None);
            }
            let text = std::str::from_utf8(&self.s[start..self.at]).ok()?;
            Some((!negative).then(|| text.parse().ok()).flatten())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heard(status: u16, fields: &[(&str, &str)]) -> Heard {
        let mut headers = HeaderMap::new();
        for (name, value) in fields {
            headers.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        read(StatusCode::from_u16(status).unwrap(), &headers, now)
    }

    fn pause(h: &Heard) -> Option<(f64, Field)> {
        h.pause.map(|(d, f)| (d.as_secs_f64(), f))
    }

    #[test]
    fn retry_after_as_seconds_or_a_date_on_429_and_503_only() {
        let secs = heard(429, &[("retry-after", "7")]);
        assert_eq!(pause(&secs), Some((7.0, Field::RetryAfter)));
        // 1_800_000_000 is Fri, 15 Jan 2027 08:00:00 GMT.
        let date = heard(503, &[("retry-after", "Fri, 15 Jan 2027 08:00:30 GMT")]);
        assert_eq!(pause(&date), Some((30.0, Field::RetryAfter)));
        let past = heard(429, &[("retry-after", "Fri, 15 Jan 2027 07:00:00 GMT")]);
        assert_eq!(pause(&past), None);
        assert_eq!(pause(&heard(200, &[("retry-after", "7")])), None);
        assert_eq!(pause(&heard(301, &[("retry-after", "7")])), None);
        for bad in ["-1", "7s", "1.5", "", "tomorrow"] {
            assert_eq!(pause(&heard(429, &[("retry-after", bad)])), None, "{bad:?}");
        }
        let twice = heard(429, &[("retry-after", "7"), ("retry-after", "9")]);
        assert_eq!(pause(&twice), None, "a field sent twice is not trusted");
    }

    #[test]
    fn the_ietf_fields_give_quotas_and_a_pause_at_r_0() {
        let h = heard(
            200,
            &[
                (
                    "ratelimit-policy",
                    "\"burst\";q=10;w=1, \"day\";q=1000;w=86400;pk=:YWJj:",
                ),
                ("ratelimit", "\"burst\";r=0;t=1, \"day\";r=940;t=3000"),
            ],
        );
        let want =
            [(10, 1), (1000, 86_400)].map(|(quota, window_secs)| Announced { quota, window_secs });
        assert_eq!(h.policy, want);
        assert_eq!(pause(&h), Some((1.0, Field::RateLimit)));
        // Before draft 10, the quota was the item itself.
        let old = heard(200, &[("ratelimit-policy", "100;w=60")]);
        assert_eq!(
            old.policy,
            [Announced {
                quota: 100,
                window_secs: 60
            }]
        );
    }

    #[test]
    fn malformed_ietf_fields_are_ignored_whole() {
        for bad in [
            "\"a\";q=10;w=1,",
            "\"a\";q=10;w=1, \"b",
            "\"a\";Q=10;w=1",
            "\"a\";q=10;w=1 \"b\"",
            "\"a\";q=1000000000000000;w=1",
        ] {
            let h = heard(200, &[("ratelimit-policy", bad)]);
            assert_eq!(h.policy, [], "{bad:?}");
        }
        let odd = heard(
            200,
            &[(
                "ratelimit-policy",
                "\"a\";q=0;w=1, \"b\";q=5;w=0, \"c\";q=-5;w=1, \"d\";q=5",
            )],
        );
        assert_eq!(
            odd.policy,
            [],
            "a zero, negative or missing quota or window"
        );
        let h = heard(200, &[("ratelimit", "\"a\";r=0")]);
        assert_eq!(pause(&h), None, "r=0 without t says no time");
    }

    #[test]
    fn x_ratelimit_pauses_at_0_remaining_until_its_reset() {
        let delta = heard(
            200,
            &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "12")],
        );
        assert_eq!(pause(&delta), Some((12.0, Field::XRateLimit)));
        let unix = heard(
            200,
            &[
                ("x-ratelimit-limit", "5000"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1800000042"),
            ],
        );
        assert_eq!(pause(&unix), Some((42.0, Field::XRateLimit)));
        assert_eq!(unix.x_limit, Some((5000, Some(42.0))));
        let some_left = heard(
            200,
            &[("x-ratelimit-remaining", "3"), ("x-ratelimit-reset", "12")],
        );
        assert_eq!(pause(&some_left), None);
        let bad = heard(
            200,
            &[
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "soon"),
            ],
        );
        assert_eq!(pause(&bad), None);
        assert_eq!(heard(200, &[("x-ratelimit-limit", "2.5")]).x_limit, None);
    }

    #[test]
    fn the_longest_pause_wins() {
        let h = heard(
            429,
            &[
                ("retry-after", "3"),
                ("ratelimit", "\"a\";r=0;t=10"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "5"),
            ],
        );
        assert_eq!(pause(&h), Some((10.0, Field::RateLimit)));
    }
}

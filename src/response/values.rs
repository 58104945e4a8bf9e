//! Header values and body text written by hand: `Retry-After` seconds (rounded up),
//! `RateLimit` items, structured-field strings, problem bodies and their JSON escapes,
//! values of an exact length, and a refusal's two values in one allocation.

use std::cell::RefCell;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;

/// "10" to "99" back to back: `Retry-After` values below 100 are slices of static text, so
/// they cost no allocation.
const TWO_DIGITS: &str = "101112131415161718192021222324252627282930313233343536373839404142434445464748495051525354555657585960616263646566676869707172737475767778798081828384858687888990919293949596979899";

/// A header value for a whole number of seconds; no allocation below 100.
pub(super) fn seconds_value(secs: u64) -> HeaderValue {
    match secs {
        0..=9 => {
            let i = secs as usize;
            HeaderValue::from_static(&"0123456789"[i..i + 1])
        }
        10..=99 => {
            let i = (secs as usize - 10) * 2;
            HeaderValue::from_static(&TWO_DIGITS[i..i + 2])
        }
        _ => HeaderValue::from(secs),
    }
}

/// The largest integer a structured field may carry (RFC 9651: at most 15 digits).
pub(crate) const SF_MAX: u64 = 999_999_999_999_999;

/// `n` as a structured field's integer: at most [`SF_MAX`]. The fields are hints a server
/// may lower (draft-ietf-httpapi-ratelimit-headers-11 §6), so a count beyond it (a quota
/// of a quadrillion bytes) is advertised as the largest one a client can read.
#[inline]
pub(crate) fn sf_int(n: u64) -> u64 {
    n.min(SF_MAX)
}

/// Whole seconds for `Retry-After` / `t`, rounded up: any wait above zero is at least 1.
pub(crate) fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs();
    if wait.subsec_nanos() > 0 {
        secs + 1
    } else {
        secs
    }
}

/// A `RateLimit` item of one limit: `prefix` (`"name";r=`), then `remaining` and `secs`
/// (`t`), each at most [`SF_MAX`].
pub(crate) fn rate_limit_item(prefix: &[u8], remaining: u64, secs: u64) -> HeaderValue {
    let mut numbers = [itoa::Buffer::new(); 2];
    let [r, t] = &mut numbers;
    let item = Item(prefix, r.format(sf_int(remaining)), t.format(sf_int(secs)));
    let mut v = Exact::new(item.len());
    v.item(&item);
    v.value()
}

/// `prefix` followed by `n` (an item with one parameter, `"name";r=N`).
pub(crate) fn prefixed_value(prefix: &[u8], n: u64) -> HeaderValue {
    let mut number = itoa::Buffer::new();
    let n = number.format(n);
    let mut v = Exact::new(prefix.len() + n.len());
    v.push(prefix);
    v.push(n.as_bytes());
    v.value()
}

/// A header value from formatted bytes whose clones share one allocation.
pub(crate) fn shared_value(bytes: Vec<u8>) -> HeaderValue {
    let value = HeaderValue::from_maybe_shared(bytes::Bytes::from(bytes))
        .unwrap_or_else(|_| HeaderValue::from_static(""));
    // The first clone of bytes taken from a `Vec` allocates their shared counter: pay it
    // here, at build time, not in the first response.
    drop(value.clone());
    value
}

/// A problem body (RFC 9457): its type (when given, with the violated policies), title,
/// status and detail.
pub(crate) fn problem_body(
    status: u16,
    title: &str,
    detail: &str,
    violated: &[&str],
    typ: Option<&str>,
) -> Bytes {
    let mut s = problem_open(status, title, detail, violated, typ);
    s.push(b'}');
    Bytes::from(s)
}

/// A problem body as [`problem_body`] writes it, without its closing brace: a refusal
/// adds its wait ([`with_wait`]).
pub(crate) fn problem_open(
    status: u16,
    title: &str,
    detail: &str,
    violated: &[&str],
    typ: Option<&str>,
) -> Vec<u8> {
    let mut s = String::from("{");
    if let Some(t) = typ {
        s.push_str("\"type\":\"");
        s.push_str(t);
        s.push_str("\",");
    }
    s.push_str("\"title\":\"");
    s.push_str(title);
    s.push_str("\",\"status\":");
    s.push_str(itoa::Buffer::new().format(status));
    s.push_str(",\"detail\":\"");
    json_escape(detail, &mut s);
    s.push('"');
    if typ.is_some() {
        s.push_str(",\"violated-policies\":[");
        for (i, name) in violated.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push('"');
            json_escape(name, &mut s);
            s.push('"');
        }
        s.push(']');
    }
    s.into_bytes()
}

/// The extension member that closes a refusal's problem body: its exact wait in whole
/// milliseconds, rounded up (`,"retry_after_ms":N}`; a client that waits that long is
/// never early, and every JSON parser reads an integer exactly).
const WAIT_MEMBER: &[u8] = b",\"retry_after_ms\":";

/// A problem body opened by [`problem_open`], closed with the wait's member.
pub(crate) fn with_wait(open: &[u8], wait: Duration) -> Bytes {
    let mut ms = itoa::Buffer::new();
    let ms = ms.format(ms_up(wait)).as_bytes();
    let mut v = Exact::new(open.len() + WAIT_MEMBER.len() + ms.len() + 1);
    v.push(open);
    v.push(WAIT_MEMBER);
    v.push(ms);
    v.push(b"}");
    Bytes::from(v.0)
}

fn json_escape(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
}

pub(crate) fn sf_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for b in s.bytes() {
        if b == b'"' || b == b'\\' {
            out.push(b'\\');
        }
        out.push(b);
    }
    out.push(b'"');
}

/// Room for a refusal's `RateLimit` value, its `Retry-After` seconds and its problem body
/// written together: a body naming one or two limits of short names fits (about 260 and
/// 300 bytes); a larger one is written apart.
const ROOM: usize = 384;

/// Header values written back to back into one small buffer, which one allocation then
/// holds for all of them: each value is a slice of it.
#[derive(Clone, Copy)]
struct Together {
    buf: [u8; ROOM],
    len: usize,
}

impl AsRef<[u8]> for Together {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Together {
    fn push(&mut self, bytes: &[u8]) {
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    /// Three parts, the bytes before `cuts[0]`, up to `cuts[1]` and after, in one
    /// allocation.
    #[inline(never)]
    fn parts(&self, cuts: [usize; 2]) -> (HeaderValue, HeaderValue, Bytes) {
        let mut all = Bytes::from_owner(*self);
        let first = all.split_to(cuts[0]);
        let second = all.split_to(cuts[1] - cuts[0]);
        (shared(first), shared(second), all)
    }
}

/// A value of `items` (`len` bytes, their separators included): `RateLimit`'s.
pub(super) fn items_value(items: &[Item<'_>], len: usize) -> HeaderValue {
    let mut v = Exact::new(len);
    for (k, item) in items.iter().enumerate() {
        if k > 0 {
            v.push(b", ");
        }
        v.item(item);
    }
    v.value()
}

/// A refusal's values: the `RateLimit` value of `items` (`len` bytes), the `Retry-After`
/// value of `wait` (whole seconds, rounded up) and the problem body opened by `open` (when
/// given: [`problem_open`]) closed with the wait ([`with_wait`]), written back to back
/// into a small buffer that one allocation then holds for all three. A thread repeats the
/// values it wrote last without writing them again: refusals come in runs (a client
/// retrying in a loop, a flood) whose values stay the same for a millisecond or a second
/// at a time, and a clone of each (a count increased) spares the allocation, the check of
/// the bytes and the free. Values too long for the buffer are written apart.
pub(super) fn refusal_values(
    items: &[Item<'_>],
    len: usize,
    wait: Duration,
    open: Option<&[u8]>,
) -> (HeaderValue, HeaderValue, Option<Bytes>) {
    let secs = retry_after_secs(wait);
    let mut number = itoa::Buffer::new();
    let digits = number.format(secs).as_bytes();
    let mut ms = itoa::Buffer::new();
    let ms = ms.format(ms_up(wait)).as_bytes();
    let body_len = open.map_or(0, |o| o.len() + WAIT_MEMBER.len() + ms.len() + 1);
    if len + digits.len() + body_len > ROOM {
        return (
            items_value(items, len),
            seconds_value(secs),
            open.map(|o| with_wait(o, wait)),
        );
    }
    let mut t = Together {
        buf: [0; ROOM],
        len: 0,
    };
    for (k, Item(prefix, r, s)) in items.iter().enumerate() {
        if k > 0 {
            t.push(b", ");
        }
        for part in [*prefix, r.as_bytes(), b";t=", s.as_bytes()] {
            t.push(part);
        }
    }
    let cuts = [t.len, t.len + digits.len()];
    t.push(digits);
    if let Some(o) = open {
        for part in [o, WAIT_MEMBER, ms, b"}"] {
            t.push(part);
        }
    }
    let has_body = open.is_some();
    // `try_with`: a thread tearing its locals down writes its values without them.
    LAST.try_with(|last| {
        let mut last = last.borrow_mut();
        if let Some((rate_limit, retry_after, body)) = &*last {
            if rate_limit.as_bytes() == &t.buf[..cuts[0]]
                && retry_after.as_bytes() == digits
                && body.as_ref() == &t.buf[cuts[1]..t.len]
            {
                return (
                    rate_limit.clone(),
                    retry_after.clone(),
                    has_body.then(|| body.clone()),
                );
            }
        }
        let (rate_limit, retry_after, body) = t.parts(cuts);
        *last = Some((rate_limit.clone(), retry_after.clone(), body.clone()));
        (rate_limit, retry_after, has_body.then_some(body))
    })
    .unwrap_or_else(|_| {
        let (rate_limit, retry_after, body) = t.parts(cuts);
        (rate_limit, retry_after, has_body.then_some(body))
    })
}

thread_local! {
    /// The `RateLimit`, `Retry-After` and problem body values [`refusal_values`] wrote
    /// last on this thread (the three slices of one allocation).
    static LAST: RefCell<Option<(HeaderValue, HeaderValue, Bytes)>> = const { RefCell::new(None) };
}

/// A header value of bytes checked as they are written (digits, and policy names
/// checked when the layer was built; the empty value is the unreachable fallback).
fn shared(bytes: Bytes) -> HeaderValue {
    HeaderValue::from_maybe_shared(bytes).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// One `RateLimit` item's parts: its prefix (`"name";r=`), then the units left and the
/// seconds until the next unit, formatted.
pub(super) struct Item<'a>(pub(super) &'a [u8], pub(super) &'a str, pub(super) &'a str);

impl Item<'_> {
    /// The item's length, `;t=` included.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.0.len() + self.1.len() + 3 + self.2.len()
    }
}

/// A header value's bytes written once into an allocation of their exact length, which
/// the value then owns: no buffer to clear, no copy, one allocation.
pub(super) struct Exact(pub(super) Vec<u8>);

impl Exact {
    #[inline]
    pub(super) fn new(len: usize) -> Self {
        Exact(Vec::with_capacity(len))
    }

    #[inline]
    pub(super) fn push(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    #[inline]
    pub(super) fn item(&mut self, Item(prefix, r, t): &Item<'_>) {
        self.push(prefix);
        self.push(r.as_bytes());
        self.push(b";t=");
        self.push(t.as_bytes());
    }

    /// The value (always valid: policy names were checked when the layer was built; the
    /// empty value is the unreachable fallback). A `Vec` as long as its capacity becomes
    /// `Bytes` without reallocating.
    #[inline]
    pub(super) fn value(self) -> HeaderValue {
        debug_assert_eq!(
            self.0.len(),
            self.0.capacity(),
            "a value's length was miscounted"
        );
        HeaderValue::from_maybe_shared(Bytes::from(self.0))
            .unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

pub(super) fn push_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// A wait in whole milliseconds, rounded up: what events say in `retry_after_ms`, as the
/// problem bodies do.
pub(crate) fn ms_up(wait: std::time::Duration) -> u64 {
    u64::try_from(wait.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

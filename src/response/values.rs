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

/// Whole seconds for `Retry-After` / `t`, rounded up: any wait above zero is at least 1.
pub(crate) fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs();
    if wait.subsec_nanos() > 0 {
        secs + 1
    } else {
        secs
    }
}

pub(crate) fn rate_limit_item(prefix: &[u8], remaining: u64, secs: u64) -> HeaderValue {
    let mut numbers = [itoa::Buffer::new(); 2];
    let [r, t] = &mut numbers;
    let item = Item(prefix, r.format(remaining), t.format(secs));
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
    s.push('}');
    Bytes::from(s)
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

/// Room for a refusal's `RateLimit` value and its `Retry-After` seconds written together.
const ROOM: usize = 64;

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

    /// Two values, the bytes before `cut` and those after, in one allocation.
    #[inline(never)]
    fn values(&self, cut: usize) -> (HeaderValue, HeaderValue) {
        let mut both = Bytes::from_owner(*self);
        let first = both.split_to(cut);
        (shared(first), shared(both))
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

/// The `RateLimit` value of `items` (`len` bytes) and the `Retry-After` value of `secs`,
/// written back to back into a small buffer that one allocation then holds for both. A
/// thread repeats the values it wrote last without writing them again: refusals come in
/// runs (a client retrying in a loop, a flood) whose values stay the same for a second
/// at a time, and a clone of each (a count increased) spares the allocation, the check of
/// the bytes and the free. Values too long for the buffer are written apart.
pub(super) fn items_and_seconds(
    items: &[Item<'_>],
    len: usize,
    secs: u64,
) -> (HeaderValue, HeaderValue) {
    let mut number = itoa::Buffer::new();
    let digits = number.format(secs).as_bytes();
    if len + digits.len() > ROOM {
        return (items_value(items, len), seconds_value(secs));
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
    let cut = t.len;
    t.push(digits);
    // `try_with`: a thread tearing its locals down writes its values without them.
    LAST.try_with(|last| {
        let mut last = last.borrow_mut();
        if let Some((rate_limit, retry_after)) = &*last {
            if rate_limit.as_bytes() == &t.buf[..cut] && retry_after.as_bytes() == digits {
                return (rate_limit.clone(), retry_after.clone());
            }
        }
        let (rate_limit, retry_after) = t.values(cut);
        *last = Some((rate_limit.clone(), retry_after.clone()));
        (rate_limit, retry_after)
    })
    .unwrap_or_else(|_| t.values(cut))
}

thread_local! {
    /// The `RateLimit` and `Retry-After` values [`items_and_seconds`] wrote last on this
    /// thread (the two slices of one allocation).
    static LAST: RefCell<Option<(HeaderValue, HeaderValue)>> = const { RefCell::new(None) };
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

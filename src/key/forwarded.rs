//! Parsing of `X-Forwarded-For` and RFC 7239 `Forwarded` entries, from the right.
//!
//! Everything works on bytes: a header value that is not UTF-8 is not an error, its
//! entries simply fail to parse.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// One hop of a forwarding header, as seen while walking it from the right.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hop {
    /// An empty list element (`a,,b`); HTTP list syntax says to ignore it.
    Empty,
    /// A parsed address.
    Addr(IpAddr),
    /// `unknown`, an obfuscated identifier (`_hidden`), a `Forwarded` element without
    /// `for=`, or anything that does not parse.
    Opaque,
}

/// Splits `s` on `sep` from the right. With `quotes`, a separator between double quotes
/// does not split (escapes are not interpreted; a value that needs them is malformed for
/// our purposes anyway). Scanning from the right keeps the elements that trusted proxies
/// appended intact even when the client-written part on their left is unbalanced.
pub(super) struct RevSplit<'a> {
    rest: Option<&'a [u8]>,
    sep: u8,
    quotes: bool,
}

impl<'a> RevSplit<'a> {
    pub(super) fn new(s: &'a [u8], sep: u8, quotes: bool) -> Self {
        Self {
            rest: Some(s),
            sep,
            quotes,
        }
    }

    /// Whether the last element returned was the leftmost one.
    pub(super) fn finished(&self) -> bool {
        self.rest.is_none()
    }
}

impl<'a> Iterator for RevSplit<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let s = self.rest?;
        let mut quoted = false;
        for i in (0..s.len()).rev() {
            let b = s[i];
            if self.quotes && b == b'"' {
                quoted = !quoted;
            } else if b == self.sep && !quoted {
                self.rest = Some(&s[..i]);
                return Some(&s[i + 1..]);
            }
        }
        self.rest = None;
        Some(s)
    }
}

/// The longest node we try to parse; a full IPv6 address with brackets and port is 47 bytes.
const MAX_NODE_LEN: usize = 64;

fn trim(s: &[u8]) -> &[u8] {
    s.trim_ascii()
}

/// Parses one `X-Forwarded-For` entry: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`,
/// `[2001:db8::1]`, `[2001:db8::1]:80`.
pub(super) fn xff_hop(entry: &[u8]) -> Hop {
    let entry = trim(entry);
    if entry.is_empty() {
        return Hop::Empty;
    }
    if entry.len() > MAX_NODE_LEN {
        return Hop::Opaque;
    }
    let Ok(s) = std::str::from_utf8(entry) else {
        return Hop::Opaque;
    };
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Hop::Addr(ip);
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Hop::Addr(sa.ip());
    }
    if let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        if let Ok(v6) = inner.parse::<Ipv6Addr>() {
            return Hop::Addr(IpAddr::V6(v6));
        }
    }
    Hop::Opaque
}

/// Parses one RFC 7239 `Forwarded` element (`for=192.0.2.60;proto=http;by=203.0.113.43`)
/// and returns its `for=` node.
pub(super) fn forwarded_hop(element: &[u8]) -> Hop {
    let element = trim(element);
    if element.is_empty() {
        return Hop::Empty;
    }
    let mut node = None;
    for pair in RevSplit::new(element, b';', true) {
        let pair = trim(pair);
        if pair.is_empty() {
            continue;
        }
        let Some(eq) = pair.iter().position(|&b| b == b'=') else {
            return Hop::Opaque;
        };
        if trim(&pair[..eq]).eq_ignore_ascii_case(b"for") {
            if node.is_some() {
                // A parameter may occur once per element (RFC 7239, section 4).
                return Hop::Opaque;
            }
            node = Some(trim(&pair[eq + 1..]));
        }
    }
    match node {
        Some(node) => forwarded_node(node),
        None => Hop::Opaque,
    }
}

/// Parses a `Forwarded` node: `192.0.2.60`, `"192.0.2.60:80"`, `"[2001:db8::1]:4711"`,
/// `"[2001:db8::1]"`; `unknown`, `_hidden` and obfuscated ports give [`Hop::Opaque`] or
/// the address respectively.
fn forwarded_node(node: &[u8]) -> Hop {
    let node = match node {
        [b'"', inner @ .., b'"'] => inner,
        _ => node,
    };
    if node.len() > MAX_NODE_LEN || node.contains(&b'"') || node.contains(&b'\\') {
        return Hop::Opaque;
    }
    let Ok(s) = std::str::from_utf8(node) else {
        return Hop::Opaque;
    };
    if let Some(rest) = s.strip_prefix('[') {
        let Some((v6, port)) = rest.split_once(']') else {
            return Hop::Opaque;
        };
        return match v6.parse::<Ipv6Addr>() {
            Ok(v6) if port.is_empty() || valid_port(port) => Hop::Addr(IpAddr::V6(v6)),
            _ => Hop::Opaque,
        };
    }
    let (host, port) = match s.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (s, None),
    };
    match host.parse::<std::net::Ipv4Addr>() {
        Ok(v4) if port.is_none_or(valid_port_digits_or_obf) => Hop::Addr(IpAddr::V4(v4)),
        _ => Hop::Opaque,
    }
}

/// `:80` or an obfuscated port `:_abc` (after the closing bracket of an IPv6 node).
fn valid_port(s: &str) -> bool {
    s.strip_prefix(':').is_some_and(valid_port_digits_or_obf)
}

/// `80` (1-5 digits) or an obfuscated port `_abc` (RFC 7239, section 6.3).
fn valid_port_digits_or_obf(s: &str) -> bool {
    if let Some(obf) = s.strip_prefix('_') {
        return !obf.is_empty()
            && obf
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    }
    (1..=5).contains(&s.len()) && s.parse::<u16>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> Hop {
        Hop::Addr(s.parse().unwrap())
    }

    #[test]
    fn rev_split_plain() {
        let parts: Vec<_> = RevSplit::new(b"a, b,,c", b',', false).collect();
        assert_eq!(parts, [&b"c"[..], b"", b" b", b"a"]);
        let mut it = RevSplit::new(b"", b',', false);
        assert_eq!(it.next(), Some(&b""[..]));
        assert!(it.finished());
        assert_eq!(it.next(), None);
    }

    #[test]
    fn rev_split_respects_quotes() {
        let parts: Vec<_> = RevSplit::new(br#"for="a,b";x=1, for=c"#, b',', true).collect();
        assert_eq!(parts, [&b" for=c"[..], br#"for="a,b";x=1"#]);
        // An unbalanced quote on the left does not swallow the right-hand elements.
        let parts: Vec<_> = RevSplit::new(br#"for="1.2.3.4, for=5.6.7.8"#, b',', true).collect();
        assert_eq!(parts[0], b" for=5.6.7.8");
    }

    /// Checks `parse` on entries naming an address, a blank one and malformed ones.
    fn parses(parse: fn(&[u8]) -> Hop, good: &[(&[u8], &str)], blank: &[u8], bad: &[&[u8]]) {
        for &(entry, want) in good {
            assert_eq!(parse(entry), addr(want), "{entry:?}");
        }
        assert_eq!(parse(blank), Hop::Empty);
        for &entry in bad {
            assert_eq!(parse(entry), Hop::Opaque, "{entry:?}");
        }
    }

    #[test]
    fn xff_entries() {
        let good: [(&[u8], _); 5] = [
            (b" 192.0.2.1 ", "192.0.2.1"),
            (b"192.0.2.1:8080", "192.0.2.1"),
            (b"2001:db8::1", "2001:db8::1"),
            (b"[2001:db8::1]", "2001:db8::1"),
            (b"[2001:db8::1]:443", "2001:db8::1"),
        ];
        let long = [b'1'; 200];
        let bad: [&[u8]; 8] = [
            b"unknown",
            b"999.1.1.1",
            b"garbage",
            b"1.2.3",
            b"\xff\xfe",
            b"[2001:db8::1",
            b"1.2.3.4:99999",
            &long,
        ];
        parses(xff_hop, &good, b"  ", &bad);
    }

    #[test]
    fn forwarded_elements() {
        let good: [(&[u8], _); 7] = [
            (b"for=192.0.2.60", "192.0.2.60"),
            (b"for=192.0.2.60;proto=http;by=203.0.113.43", "192.0.2.60"),
            (b"proto=https; For=\"192.0.2.60:80\"", "192.0.2.60"),
            (br#"FOR="[2001:db8:cafe::17]:4711""#, "2001:db8:cafe::17"),
            (br#"for="[2001:db8::1]""#, "2001:db8::1"),
            (br#"for="[2001:db8::1]:_p0rt""#, "2001:db8::1"),
            (br#"for=192.0.2.1;ext="a;b""#, "192.0.2.1"),
        ];
        let bad: [&[u8]; 12] = [
            b"for=unknown",
            b"for=_hidden",
            b"for=\"_SEVKISEK\"",
            b"proto=http",
            b"for=192.0.2.1;for=192.0.2.2",
            b"for=2001:db8::1",
            b"for=\"[2001:db8::1\"",
            b"for=\"[2001:db8::1]x\"",
            b"for=\"192.0.2.1:\"",
            b"for=\"192.0.2.1\\\"\"",
            b"garbage",
            b"for=\xff",
        ];
        parses(forwarded_hop, &good, b" ", &bad);
    }
}

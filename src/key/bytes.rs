//! Stable byte encodings of keys, for stores that name state by bytes (Redis).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// A key that can be written as bytes, stably across processes and builds, so that
/// instances sharing a store agree on the name of a client's state.
///
/// The encoding is injective within one key type: two different keys never write the same
/// bytes. Strings and header values write their bytes as they are; addresses their text
/// form (`192.0.2.1`, `2001:db8::1`); integers their decimal form; `()` nothing; `None` a
/// single `-` and `Some(k)` a `+` followed by `k` (so `None` differs from every `Some`);
/// tuples join their parts with `,` after escaping `\` and `,` in each part with a `\`.
///
/// A store may hash the bytes before use (the Redis store hashes long or non-printable key
/// material); the encoding itself never loses information.
///
/// ```
/// use tollgate::key::KeyBytes;
///
/// let mut out = Vec::new();
/// ("a,b", 7u32, Some("x")).write_key(&mut out);
/// assert_eq!(out, b"a\\,b,7,+x");
/// ```
pub trait KeyBytes {
    /// Appends this key's bytes to `out`.
    fn write_key(&self, out: &mut Vec<u8>);
}

impl<T: KeyBytes + ?Sized> KeyBytes for &T {
    fn write_key(&self, out: &mut Vec<u8>) {
        (**self).write_key(out)
    }
}

impl KeyBytes for str {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl KeyBytes for String {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl KeyBytes for Arc<str> {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl KeyBytes for [u8] {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl KeyBytes for Vec<u8> {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl KeyBytes for http::HeaderValue {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

impl KeyBytes for http::Method {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_str().as_bytes());
    }
}

impl KeyBytes for Ipv4Addr {
    fn write_key(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        let _ = write!(out, "{self}");
    }
}

impl KeyBytes for Ipv6Addr {
    fn write_key(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        let _ = write!(out, "{self}");
    }
}

impl KeyBytes for IpAddr {
    fn write_key(&self, out: &mut Vec<u8>) {
        match self {
            IpAddr::V4(a) => a.write_key(out),
            IpAddr::V6(a) => a.write_key(out),
        }
    }
}

macro_rules! int_keys {
    ($($t:ty),*) => {$(
        impl KeyBytes for $t {
            fn write_key(&self, out: &mut Vec<u8>) {
                use std::io::Write;
                let _ = write!(out, "{self}");
            }
        }
    )*};
}
int_keys!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize);

impl KeyBytes for () {
    fn write_key(&self, _out: &mut Vec<u8>) {}
}

impl<K: KeyBytes> KeyBytes for Option<K> {
    fn write_key(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(b'-'),
            Some(k) => {
                out.push(b'+');
                k.write_key(out);
            }
        }
    }
}

/// Writes one tuple part, escaping `\` and `,`.
fn write_part<K: KeyBytes + ?Sized>(k: &K, out: &mut Vec<u8>) {
    let start = out.len();
    k.write_key(out);
    if out[start..].iter().any(|&b| b == b'\\' || b == b',') {
        let part: Vec<u8> = out.drain(start..).collect();
        for b in part {
            if b == b'\\' || b == b',' {
                out.push(b'\\');
            }
            out.push(b);
        }
    }
}

macro_rules! tuple_keys {
    ($first:ident $(, $rest:ident)*) => {
        impl<$first: KeyBytes, $($rest: KeyBytes),*> KeyBytes for ($first, $($rest),*) {
            #[allow(non_snake_case)]
            fn write_key(&self, out: &mut Vec<u8>) {
                let ($first, $($rest),*) = self;
                write_part($first, out);
                $(
                    out.push(b',');
                    write_part($rest, out);
                )*
            }
        }
    };
}
tuple_keys!(A);
tuple_keys!(A, B);
tuple_keys!(A, B, C);
tuple_keys!(A, B, C, D);

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<K: KeyBytes + ?Sized>(k: &K) -> Vec<u8> {
        let mut v = Vec::new();
        k.write_key(&mut v);
        v
    }

    #[test]
    fn encodings() {
        assert_eq!(bytes("alice"), b"alice");
        assert_eq!(bytes(&IpAddr::from([192, 0, 2, 1])), b"192.0.2.1");
        assert_eq!(
            bytes(&"2001:db8::1".parse::<Ipv6Addr>().unwrap()),
            b"2001:db8::1"
        );
        assert_eq!(bytes(&42u64), b"42");
        assert_eq!(bytes(&-3i32), b"-3");
        assert_eq!(bytes(&()), b"");
        assert_eq!(bytes(&http::Method::POST), b"POST");
        assert_eq!(bytes(&http::HeaderValue::from_static("k1")), b"k1");
    }

    #[test]
    fn none_differs_from_every_some() {
        assert_ne!(bytes(&None::<String>), bytes(&Some(String::new())));
        assert_ne!(bytes(&None::<String>), bytes(&Some("-".to_string())));
        assert_ne!(bytes(&Some(None::<u8>)), bytes(&None::<Option<u8>>));
    }

    #[test]
    fn tuples_are_unambiguous() {
        assert_ne!(bytes(&("a,b", "c")), bytes(&("a", "b,c")));
        assert_ne!(bytes(&("a\\", ",b")), bytes(&("a\\,", "b")));
        assert_ne!(bytes(&(("a", "b"), "c")), bytes(&("a", ("b", "c"))));
        assert_eq!(bytes(&("a", 1u8, (), None::<u8>)), b"a,1,,-");
    }
}

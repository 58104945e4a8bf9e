//! [`HeaderKey`]: the value of a named request header (an API key).

use std::fmt;

use http::{HeaderName, Request};

use super::KeyExtractor;
use crate::error::ConfigError;

/// The default longest header value accepted as a key, in bytes.
const DEFAULT_MAX_LEN: usize = 256;

/// Keys requests by the value of a request header, such as `x-api-key`.
///
/// The key is a [`HeaderBytes`]: the value's bytes copied out of the request, compared
/// exactly. A copy, not the `HeaderValue`: a header value shares the connection's whole
/// read buffer, which a stored key would keep alive. It is `None` when the header is
/// missing, empty, or longer than [`max_len`](HeaderKey::max_len) (256 bytes by
/// default). When the header occurs several times, the first occurrence is used.
///
/// # Deployment caveat
///
/// The value is chosen by the client. An unbounded key lets one client fill the store's
/// memory (and Redis's) with fresh keys of any size, which is why the length is capped.
/// Every distinct value is still its own limit: a client can rotate made-up values to
/// escape a per-key limit unless something in front of the limiter rejects unknown keys.
/// Put this extractor behind authentication, or combine it (as a tuple, or with
/// [`or`](super::KeyExtractorExt::or)) with an IP-based key.
///
/// See the [module docs](super) for the other extractors.
///
/// ```
/// use tollgate::key::{HeaderKey, KeyExtractor};
///
/// let by_key = HeaderKey::new("x-api-key")?;
/// let req = http::Request::builder().header("x-api-key", "k-123").body(())?;
/// assert_eq!(by_key.extract(&req).unwrap(), "k-123");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct HeaderKey {
    name: HeaderName,
    max_len: usize,
}

impl HeaderKey {
    /// Keys by the header `name` (case-insensitive, as header names are).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidHeaderName`] if `name` is not a valid header name.
    pub fn new(name: &str) -> Result<Self, ConfigError> {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| ConfigError::InvalidHeaderName(name.to_owned()))?;
        Ok(Self {
            name,
            max_len: DEFAULT_MAX_LEN,
        })
    }

    /// Sets the longest value, in bytes, used as a key (default 256). Longer values are
    /// treated as absent (`None`), not truncated, so two long keys never collide.
    pub fn max_len(mut self, max_len: usize) -> Self {
        self.max_len = max_len;
        self
    }
}

impl<B> KeyExtractor<Request<B>> for HeaderKey {
    type Key = HeaderBytes;

    fn extract(&self, req: &Request<B>) -> Option<HeaderBytes> {
        let value = req.headers().get(&self.name)?.as_bytes();
        (!value.is_empty() && value.len() <= self.max_len).then(|| HeaderBytes(value.into()))
    }
}

/// The bytes of a header value, copied out of the request: the key of [`HeaderKey`].
///
/// It owns exactly the value's bytes and nothing of the request around them. It compares
/// with `str` and byte slices, dereferences to `[u8]` (so `key.starts_with(b"pro_")`
/// works), and shows as text in `Debug`.
///
/// See the [module docs](super).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HeaderBytes(Box<[u8]>);

impl HeaderBytes {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The value as text, when it is visible ASCII (as HTTP header text should be).
    pub fn to_str(&self) -> Option<&str> {
        self.0
            .iter()
            .all(|b| (0x20..0x7f).contains(b) || *b == b'\t')
            .then(|| std::str::from_utf8(&self.0).ok())
            .flatten()
    }
}

impl From<&str> for HeaderBytes {
    fn from(s: &str) -> Self {
        HeaderBytes(s.as_bytes().into())
    }
}

impl std::ops::Deref for HeaderBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for HeaderBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl PartialEq<str> for HeaderBytes {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other.as_bytes()
    }
}

impl PartialEq<&str> for HeaderBytes {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == *other.as_bytes()
    }
}

impl PartialEq<[u8]> for HeaderBytes {
    fn eq(&self, other: &[u8]) -> bool {
        *self.0 == *other
    }
}

impl fmt::Debug for HeaderBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

impl super::KeyBytes for HeaderBytes {
    fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(value: &[u8]) -> Request<()> {
        Request::builder()
            .header("X-Api-Key", value)
            .body(())
            .unwrap()
    }

    #[test]
    fn reads_the_header() {
        let k = HeaderKey::new("x-api-key").unwrap();
        assert_eq!(k.extract(&req(b"abc")).unwrap(), "abc");
        let k = HeaderKey::new("X-API-KEY").unwrap();
        assert_eq!(k.extract(&req(b"\xffbin")).unwrap().as_bytes(), b"\xffbin");
        assert_eq!(k.extract(&Request::new(())), None);
    }

    #[test]
    fn first_occurrence_wins() {
        let r = Request::builder()
            .header("x-api-key", "one")
            .header("x-api-key", "two")
            .body(())
            .unwrap();
        assert_eq!(
            HeaderKey::new("x-api-key").unwrap().extract(&r).unwrap(),
            "one"
        );
    }

    #[test]
    fn empty_and_long_are_absent() {
        let k = HeaderKey::new("x-api-key").unwrap();
        assert_eq!(k.extract(&req(b"")), None);
        assert_eq!(k.extract(&req(&[b'a'; 257])), None);
        assert!(k.extract(&req(&[b'a'; 256])).is_some());
        let k = k.max_len(4);
        assert_eq!(k.extract(&req(b"abcde")), None);
        assert!(k.extract(&req(b"abcd")).is_some());
    }

    #[test]
    fn bad_name() {
        assert_eq!(
            HeaderKey::new("bad name"),
            Err(ConfigError::InvalidHeaderName("bad name".into()))
        );
        assert!(HeaderKey::new("").is_err());
    }
}

//! What a connection's bytes say of it: HTTP/1, HTTP/2 (after its preface), or bytes the
//! listener cannot read (TLS, a tunnel); and where it stands, as a [`Phase`].

use super::http1::Http1;
use super::http2::Http2;
use super::progress::Phase;

/// The HTTP/2 connection preface a client sends first (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The first byte of a TLS record carrying a handshake: a TLS client's first byte.
const TLS_HANDSHAKE: u8 = 0x16;

/// A connection's protocol, and where its bytes stand in it.
#[derive(Debug)]
pub(super) enum Track {
    /// HTTP/1, with how many of its first bytes matched the HTTP/2 preface (`None` once
    /// one did not).
    Http1(Http1, Option<u8>),
    Http2(Box<Http2>),
    Opaque,
}

/// What a read found that the listener reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Found {
    Nothing,
    /// A TLS handshake: the listener cannot read this connection.
    Tls,
}

impl Default for Track {
    fn default() -> Self {
        Track::Http1(Http1::default(), Some(0))
    }
}

impl Track {
    /// Follows bytes read from the client.
    pub(super) fn read(&mut self, bytes: &[u8]) -> Found {
        match self {
            Track::Http1(h1, preface) => {
                let Some(matched) = *preface else {
                    h1.read(bytes);
                    return Found::Nothing;
                };
                if matched == 0 && bytes.first() == Some(&TLS_HANDSHAKE) {
                    *self = Track::Opaque;
                    return Found::Tls;
                }
                let want = &PREFACE[matched as usize..];
                let n = want.len().min(bytes.len());
                if bytes[..n] != want[..n] {
                    *preface = None;
                    h1.read(bytes);
                } else if n == want.len() {
                    let mut h2 = Box::<Http2>::default();
                    h2.read(&bytes[n..]);
                    *self = Track::Http2(h2);
                } else {
                    *preface = Some(matched + n as u8);
                    h1.read(bytes);
                }
            }
            Track::Http2(h2) => h2.read(bytes),
            Track::Opaque => {}
        }
        Found::Nothing
    }

    /// Follows bytes the server wrote.
    pub(super) fn wrote(&mut self, bytes: &[u8]) {
        match self {
            Track::Http1(h1, _) => h1.wrote(bytes),
            Track::Http2(h2) => h2.wrote(bytes),
            Track::Opaque => {}
        }
    }

    pub(super) fn phase(&self) -> Phase {
        match self {
            // A part of the preface is a head, whatever HTTP/1 makes of it.
            Track::Http1(_, Some(n)) if *n > 0 => Phase::Head,
            Track::Http1(h1, _) => h1.phase(),
            Track::Http2(h2) => h2.phase(),
            Track::Opaque => Phase::Opaque,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_http2_preface_is_a_head_until_whole_then_the_connection_waits() {
        let mut t = Track::default();
        t.read(b"PRI * HTTP/2.0\r\n\r\n");
        assert_eq!(t.phase(), Phase::Head, "not a whole HTTP/1 request");
        t.read(b"SM\r\n\r\n\0\0\0\x04\0\0\0\0\0");
        assert!(matches!(t, Track::Http2(_)));
        assert_eq!(t.phase(), Phase::Waiting);
    }

    #[test]
    fn a_request_that_starts_like_the_preface_is_http1() {
        let mut t = Track::default();
        t.read(b"PRI");
        assert_eq!(t.phase(), Phase::Head);
        t.read(b"NT / HTTP/1.1\r\n\r\n");
        assert_eq!(t.phase(), Phase::Server);
        assert!(matches!(t, Track::Http1(_, None)));
    }

    #[test]
    fn a_tls_handshake_is_opaque() {
        let mut t = Track::default();
        assert_eq!(t.read(&[0x16, 3, 1]), Found::Tls);
        assert_eq!(t.phase(), Phase::Opaque);
        // Only as the first byte.
        let mut t = Track::default();
        t.read(b"G");
        assert_eq!(t.read(&[0x16]), Found::Nothing);
    }
}

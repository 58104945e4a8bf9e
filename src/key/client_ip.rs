//! [`ClientIp`]: the client's address behind trusted reverse proxies.

use std::{net::IpAddr, sync::Arc};

use http::{header, HeaderName, Request};

use super::cidr::Cidr;
use super::forwarded::{forwarded_hop, xff_hop, Hop, RevSplit};
use super::peer_ip::peer_addr;
use super::KeyExtractor;
use super::PeerIp;
use crate::error::ConfigError;

/// The most forwarding-header entries examined per request.
const MAX_ENTRIES: usize = 64;
/// The most forwarding-header bytes examined per request, counted from the right.
const MAX_HEADER_BYTES: usize = 8 * 1024;

/// Which forwarding header [`ClientIp`] reads.
///
/// See the [module docs](super).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the de facto standard; the default).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:4711"`: the `for=` parameter of
    /// each element.
    Forwarded,
}

impl ForwardedHeader {
    fn name(self) -> HeaderName {
        match self {
            Self::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            Self::Forwarded => header::FORWARDED,
        }
    }

    fn hop(self, entry: &[u8]) -> Hop {
        match self {
            Self::XForwardedFor => xff_hop(entry),
            Self::Forwarded => forwarded_hop(entry),
        }
    }
}

/// Keys requests by the client's IP address when the app runs behind reverse proxies
/// (load balancers, CDNs) whose addresses you list.
///
/// The key is an [`IpAddr`], grouped like [`PeerIp`]'s (IPv6 by a /56 prefix by default,
/// see [`ClientIp::ipv6_prefix`]; IPv4-mapped IPv6 as IPv4).
///
/// # How the client is found
///
/// 1. Take the TCP peer's address (from the same extensions [`PeerIp`] reads; `None` if
///    there is none).
/// 2. If the peer is **not** a trusted proxy, the peer is the client. The forwarding
///    header is ignored completely: a client that talks to the app directly controls
///    every byte of it.
/// 3. Otherwise walk the header's entries **from the right** (all occurrences of the
///    header, in order, as if joined with commas), skipping entries that are trusted
///    proxies. The first address that is not a trusted proxy is the client: it is what the
///    outermost trusted proxy saw as its peer. If every entry is trusted, the leftmost one
///    is the client.
/// 4. If, before an untrusted address is found, an entry is malformed, `unknown`, an
///    obfuscated identifier (`_hidden`), a `Forwarded` element without `for=`, or the walk
///    reaches its limits (64 entries, 8 KiB of header counted from the right), the walk
///    stops and the key is the **last trusted hop** seen: the trusted proxy that wrote
///    the bad entry (the peer, if the rightmost entry is already bad). Skipping past a
///    bad entry would mean trusting what lies to its left, which no trusted proxy vouched
///    for; giving no key (`None`) would let a garbage header pick the layer's missing-key
///    behaviour. Keying on the last trusted hop never returns an address a client could
///    have written, and never fails.
///
/// Empty list elements (`a,,b`) are skipped, as HTTP list syntax requires. `X-Forwarded-For`
/// entries may carry a port (`192.0.2.1:80`, `[2001:db8::1]:80`); IPv6 may be bare.
///
/// # Deployment caveat
///
/// List every proxy that can connect to the app, and only those: a trusted address that a
/// client can reach directly lets that client write its own key. Proxies must append to
/// the header (nginx `$proxy_add_x_forwarded_for`, most load balancers) rather than pass
/// it through untouched or replace it with the client's copy.
///
/// See the [module docs](super) for an example and the other extractors.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct ClientIp {
    trusted: Arc<[Cidr]>,
    header: ForwardedHeader,
    grouping: PeerIp,
}

impl ClientIp {
    /// Trusts the proxies in `cidrs`: CIDR blocks (`10.0.0.0/8`, `2001:db8::/32`) or bare
    /// addresses (`192.0.2.1`, i.e. `/32`; `2001:db8::1`, i.e. `/128`). Host bits set in a
    /// block (`10.1.2.3/8`) are ignored. An empty list trusts nobody: the key is then the
    /// peer, as with [`PeerIp`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidCidr`] for an entry that is not an address or a block with a
    /// prefix no longer than the address (`/32` for IPv4, `/128` for IPv6).
    pub fn trusting<I, S>(cidrs: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let trusted = cidrs
            .into_iter()
            .map(|s| Cidr::parse(s.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            trusted: trusted.into(),
            header: ForwardedHeader::default(),
            grouping: PeerIp::new(),
        })
    }

    /// Chooses the forwarding header to read (default: [`ForwardedHeader::XForwardedFor`]).
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Sets the IPv6 grouping prefix length, 0 to 128 (default 56), as
    /// [`PeerIp::ipv6_prefix`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidPrefix`] for a prefix longer than 128.
    pub fn ipv6_prefix(mut self, prefix: u8) -> Result<Self, ConfigError> {
        self.grouping = self.grouping.ipv6_prefix(prefix)?;
        Ok(self)
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|c| c.contains(ip))
    }

    /// The client's address, ungrouped.
    pub(crate) fn client<B>(&self, req: &Request<B>) -> Option<IpAddr> {
        let peer = peer_addr(req)?.ip().to_canonical();
        if !self.is_trusted(peer) {
            return Some(peer);
        }
        let header = self.header;
        let mut last_trusted = peer;
        let mut entries = 0;
        let mut budget = MAX_HEADER_BYTES;
        for value in req.headers().get_all(header.name()).iter().rev() {
            let bytes = value.as_bytes();
            let truncated = bytes.len() > budget;
            let window = &bytes[bytes.len().saturating_sub(budget)..];
            budget -= window.len();
            let mut split = RevSplit::new(window, b',', header == ForwardedHeader::Forwarded);
            while let Some(entry) = split.next() {
                entries += 1;
                if entries > MAX_ENTRIES || (truncated && split.finished()) {
                    // A limit: what lies further left is not examined.
                    return Some(last_trusted);
                }
                match header.hop(entry) {
                    Hop::Empty => {}
                    Hop::Opaque => return Some(last_trusted),
                    Hop::Addr(ip) => {
                        let ip = ip.to_canonical();
                        if !self.is_trusted(ip) {
                            return Some(ip);
                        }
                        last_trusted = ip;
                    }
                }
            }
            if truncated {
                return Some(last_trusted);
            }
        }
        Some(last_trusted)
    }
}

impl<B> KeyExtractor<Request<B>> for ClientIp {
    type Key = IpAddr;

    fn extract(&self, req: &Request<B>) -> Option<IpAddr> {
        self.client(req).map(|ip| self.grouping.group(ip))
    }

    fn misconfiguration(&self, req: &Request<B>) -> Option<&'static str> {
        peer_addr(req).is_none().then_some(super::NO_PEER_ADDRESS)
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn req(peer: &str, name: &str, values: &[&[u8]]) -> Request<()> {
        let mut b = Request::builder();
        for v in values {
            b = b.header(name, *v);
        }
        let mut r = b.body(()).unwrap();
        r.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
        r
    }

    #[test]
    fn refuses_bad_blocks() {
        assert_eq!(
            ClientIp::trusting(["10.0.0.0/8", "nope"]),
            Err(ConfigError::InvalidCidr("nope".into()))
        );
    }

    #[test]
    fn walks_from_the_right() {
        let c = ClientIp::trusting(["10.0.0.0/8"]).unwrap();
        let r = req(
            "10.0.0.1:1",
            "x-forwarded-for",
            &[b"6.6.6.6, 192.0.2.1, 10.0.0.2"],
        );
        assert_eq!(c.extract(&r), Some(ip("192.0.2.1")));
        // Several header lines are one list.
        let r = req(
            "10.0.0.1:1",
            "x-forwarded-for",
            &[b"6.6.6.6, 192.0.2.1", b"10.0.0.2"],
        );
        assert_eq!(c.extract(&r), Some(ip("192.0.2.1")));
        // All trusted: the leftmost.
        let r = req("10.0.0.1:1", "x-forwarded-for", &[b"10.0.0.3, 10.0.0.2"]);
        assert_eq!(c.extract(&r), Some(ip("10.0.0.3")));
        // No header: the peer.
        let r = req("10.0.0.1:1", "x-other", &[b"1.1.1.1"]);
        assert_eq!(c.extract(&r), Some(ip("10.0.0.1")));
    }

    #[test]
    fn stops_at_the_last_trusted_hop() {
        let c = ClientIp::trusting(["10.0.0.0/8"]).unwrap();
        for v in [
            &b"1.1.1.1, unknown, 10.0.0.2"[..],
            b"1.1.1.1, 1.1.1, 10.0.0.2",
            b"1.1.1.1,\xff,10.0.0.2",
        ] {
            let r = req("10.0.0.1:1", "x-forwarded-for", &[v]);
            assert_eq!(c.extract(&r), Some(ip("10.0.0.2")), "{v:?}");
        }
        let c = c.header(ForwardedHeader::Forwarded);
        let r = req(
            "10.0.0.1:1",
            "forwarded",
            &[b"for=1.1.1.1, for=_hidden, for=10.0.0.2"],
        );
        assert_eq!(c.extract(&r), Some(ip("10.0.0.2")));
        let r = req("10.0.0.1:1", "forwarded", &[b"for=1.1.1.1, proto=http"]);
        assert_eq!(c.extract(&r), Some(ip("10.0.0.1")));
    }

    #[test]
    fn limits() {
        let c = ClientIp::trusting(["10.0.0.0/8"]).unwrap();
        // 100 trusted entries: stops after 64, at the 64th from the right.
        let many: Vec<String> = (0..100).map(|i| format!("10.0.{i}.1")).collect();
        let r = req(
            "10.0.0.1:1",
            "x-forwarded-for",
            &[many.join(",").as_bytes()],
        );
        assert_eq!(c.extract(&r), Some(ip("10.0.36.1")));
        // A huge value: only its right end is read; the cut entry is never used.
        let mut big = "1".repeat(20_000);
        big.push_str(", 11.22.33.44");
        let r = req("10.0.0.1:1", "x-forwarded-for", &[big.as_bytes()]);
        assert_eq!(c.extract(&r), Some(ip("11.22.33.44")));
        let mut big = "11.1.1.1,".repeat(2_000);
        big.push_str("10.0.0.9");
        let r = req("10.0.0.1:1", "x-forwarded-for", &[big.as_bytes()]);
        assert_eq!(c.extract(&r), Some(ip("11.1.1.1")));
        let mut big = "10.1.1.1,".repeat(1_000);
        big.push_str("10.0.0.9");
        let r = req("10.0.0.1:1", "x-forwarded-for", &[big.as_bytes()]);
        assert_eq!(c.extract(&r), Some(ip("10.1.1.1")));
    }

    #[test]
    fn untrusted_peer_ignores_headers() {
        let c = ClientIp::trusting(["10.0.0.0/8"]).unwrap();
        let r = req("192.0.2.1:1", "x-forwarded-for", &[b"10.0.0.5"]);
        assert_eq!(c.extract(&r), Some(ip("192.0.2.1")));
        assert_eq!(c.extract(&Request::new(())), None);
    }

    #[test]
    fn mapped_peer_matches_ipv4_block() {
        let c = ClientIp::trusting(["10.0.0.0/8"]).unwrap();
        let r = req(
            "[::ffff:10.0.0.1]:1",
            "x-forwarded-for",
            &[b"[2001:db8:1:2ff::1]:5"],
        );
        assert_eq!(c.extract(&r), Some(ip("2001:db8:1:200::")));
        let c = c.ipv6_prefix(128).unwrap();
        assert_eq!(c.extract(&r), Some(ip("2001:db8:1:2ff::1")));
        assert!(c.ipv6_prefix(200).is_err());
    }
}

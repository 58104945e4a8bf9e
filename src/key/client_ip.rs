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
/// Two kinds: **lists** that every proxy appends to (`X-Forwarded-For`, `Forwarded`), walked
/// from the right; and **single-value** headers that one proxy or CDN sets to the address
/// it saw (`X-Real-IP`, `CF-Connecting-IP`, ...). A single-value header is read only when
/// the peer is trusted, and must occur exactly once and hold one address (a port is
/// allowed, as in `X-Forwarded-For`); otherwise it is treated as absent and the key is the
/// peer. The proxy that sets it must replace whatever the client sent under that name.
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
    /// `X-Real-IP` (nginx's `proxy_set_header X-Real-IP $remote_addr`): single-value.
    XRealIp,
    /// `CF-Connecting-IP` (Cloudflare): single-value.
    CfConnectingIp,
    /// `True-Client-IP` (Cloudflare Enterprise, Akamai): single-value.
    TrueClientIp,
    /// `Fly-Client-IP` (Fly.io): single-value.
    FlyClientIp,
    /// `Fastly-Client-IP` (Fastly): single-value.
    FastlyClientIp,
}

impl ForwardedHeader {
    fn name(self) -> HeaderName {
        HeaderName::from_static(match self {
            Self::XForwardedFor => "x-forwarded-for",
            Self::Forwarded => return header::FORWARDED,
            Self::XRealIp => "x-real-ip",
            Self::CfConnectingIp => "cf-connecting-ip",
            Self::TrueClientIp => "true-client-ip",
            Self::FlyClientIp => "fly-client-ip",
            Self::FastlyClientIp => "fastly-client-ip",
        })
    }

    /// Whether the header holds one address rather than a list.
    fn single(self) -> bool {
        !matches!(self, Self::XForwardedFor | Self::Forwarded)
    }

    fn hop(self, entry: &[u8]) -> Hop {
        match self {
            Self::Forwarded => forwarded_hop(entry),
            _ => xff_hop(entry),
        }
    }
}

/// Which addresses [`ClientIp`] treats as its proxies.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Trust {
    /// Addresses in these blocks.
    Blocks(Arc<[Cidr]>),
    /// The peer and the addresses after it, this many in all, whatever they are.
    Hops(usize),
}

/// Keys requests by the client's IP address when the app runs behind reverse proxies
/// (load balancers, CDNs): those whose addresses you list ([`ClientIp::trusting`]), or a
/// known number of them whatever their addresses ([`ClientIp::trusting_hops`]).
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
///    proxies: with [`trusting`](ClientIp::trusting), addresses in the listed blocks;
///    with [`trusting_hops(n)`](ClientIp::trusting_hops), the peer and the `n - 1`
///    entries nearest it. The first address that is not a trusted proxy is the client:
///    it is what the outermost trusted proxy saw as its peer. If every entry is trusted,
///    the leftmost one is the client. A single-value header (`X-Real-IP` and the like,
///    see [`ForwardedHeader`]) is a list of one entry that must occur exactly once.
/// 4. If, before an untrusted address is found, an entry is malformed, `unknown`, an
///    obfuscated identifier (`_hidden`), a `Forwarded` element without `for=`, or the walk
///    reaches its limits (64 entries, 8 KiB of header counted from the right), the walk
///    stops and the key is the **last trusted hop** seen: the trusted proxy that wrote
///    the bad entry (the peer, if the rightmost entry is already bad). Skipping past a
///    bad entry would mean trusting what lies to its left, which no trusted proxy vouched
///    for; giving no key (`None`) would let a garbage header pick the layer's missing-key
///    behaviour. Keying on the last trusted hop never returns an address a client could
///    have written, and never fails. A malformed header is thus treated as absent.
///
/// Empty list elements (`a,,b`) are skipped, as HTTP list syntax requires. `X-Forwarded-For`
/// entries may carry a port (`192.0.2.1:80`, `[2001:db8::1]:80`); IPv6 may be bare.
///
/// # Deployment caveat
///
/// List every proxy that can connect to the app, and only those: a trusted address that a
/// client can reach directly lets that client write its own key. Proxies must append to
/// the header (nginx `$proxy_add_x_forwarded_for`, most load balancers) rather than pass
/// it through untouched or replace it with the client's copy; a proxy that sets a
/// single-value header must overwrite the client's. With a hop count, every request must
/// come through exactly that many proxies: one that reaches the app past the outer ones
/// (a load balancer reachable from the internet behind a CDN) picks its own key.
///
/// See the [module docs](super) for examples and the other extractors.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct ClientIp {
    trust: Trust,
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
        Ok(Self::with(Trust::Blocks(trusted.into())))
    }

    /// Trusts the `hops` proxies nearest the app, whatever their addresses: for
    /// deployments whose proxies' addresses are not known in advance (a cloud load
    /// balancer, a platform's router). The peer is the first of them and each one after
    /// it appended one entry, so the client is the `hops`-th entry of the header from the
    /// right (fewer entries: the leftmost). This is Envoy's `xff_num_trusted_hops` (with
    /// `use_remote_address`), express's `trust proxy` set to a number and ASP.NET's
    /// `ForwardLimit`. `0` trusts nobody: the key is the peer. At most 64 entries are
    /// read (see [How the client is found](ClientIp#how-the-client-is-found)).
    ///
    /// Every request must come through that many proxies: see the [deployment
    /// caveat](ClientIp#deployment-caveat).
    pub fn trusting_hops(hops: usize) -> Self {
        Self::with(Trust::Hops(hops))
    }

    fn with(trust: Trust) -> Self {
        Self {
            trust,
            header: ForwardedHeader::default(),
            grouping: PeerIp::new(),
        }
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

    /// Whether `ip`, met after `depth` other hops (the peer is at depth 0), is a proxy.
    fn trusts(&self, ip: IpAddr, depth: usize) -> bool {
        match &self.trust {
            Trust::Blocks(blocks) => blocks.iter().any(|c| c.contains(ip)),
            Trust::Hops(hops) => depth < *hops,
        }
    }

    /// The client's address, ungrouped.
    pub(crate) fn client<B>(&self, req: &Request<B>) -> Option<IpAddr> {
        let peer = peer_addr(req)?.ip().to_canonical();
        if !self.trusts(peer, 0) {
            return Some(peer);
        }
        let header = self.header;
        let values = req.headers().get_all(header.name());
        if header.single() {
            // One occurrence holding one address; anything else is treated as absent.
            let mut values = values.iter();
            return Some(match (values.next(), values.next()) {
                (Some(value), None) => match header.hop(value.as_bytes()) {
                    Hop::Addr(ip) => ip.to_canonical(),
                    Hop::Empty | Hop::Opaque => peer,
                },
                _ => peer,
            });
        }
        let mut last_trusted = peer;
        let mut depth = 1;
        let mut entries = 0;
        let mut budget = MAX_HEADER_BYTES;
        for value in values.iter().rev() {
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
                        if !self.trusts(ip, depth) {
                            return Some(ip);
                        }
                        last_trusted = ip;
                        depth += 1;
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

    /// A request from `peer` with `X-Forwarded-For` lines `values`.
    fn xff(peer: &str, values: &[&[u8]]) -> Request<()> {
        req(peer, "x-forwarded-for", values)
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
        let peer = "10.0.0.1:1";
        for (r, want) in [
            (xff(peer, &[b"6.6.6.6, 192.0.2.1, 10.0.0.2"]), "192.0.2.1"),
            // Several header lines are one list.
            (
                xff(peer, &[b"6.6.6.6, 192.0.2.1", b"10.0.0.2"]),
                "192.0.2.1",
            ),
            // All trusted: the leftmost.
            (xff(peer, &[b"10.0.0.3, 10.0.0.2"]), "10.0.0.3"),
            // No header: the peer.
            (req(peer, "x-other", &[b"1.1.1.1"]), "10.0.0.1"),
        ] {
            assert_eq!(c.extract(&r), Some(ip(want)), "{:?}", r.headers());
        }
    }

    #[test]
    fn stops_at_the_last_trusted_hop() {
        let c = ClientIp::trusting(["10.0.0.0/8"]).unwrap();
        for v in [
            &b"1.1.1.1, unknown, 10.0.0.2"[..],
            b"1.1.1.1, 1.1.1, 10.0.0.2",
            b"1.1.1.1,\xff,10.0.0.2",
        ] {
            let r = xff("10.0.0.1:1", &[v]);
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
        let r = xff("10.0.0.1:1", &[many.join(",").as_bytes()]);
        assert_eq!(c.extract(&r), Some(ip("10.0.36.1")));
        // A huge value: only its right end is read; the cut entry is never used.
        let mut big = "1".repeat(20_000);
        big.push_str(", 11.22.33.44");
        let r = xff("10.0.0.1:1", &[big.as_bytes()]);
        assert_eq!(c.extract(&r), Some(ip("11.22.33.44")));
        let mut big = "11.1.1.1,".repeat(2_000);
        big.push_str("10.0.0.9");
        let r = xff("10.0.0.1:1", &[big.as_bytes()]);
        assert_eq!(c.extract(&r), Some(ip("11.1.1.1")));
        let mut big = "10.1.1.1,".repeat(1_000);
        big.push_str("10.0.0.9");
        let r = xff("10.0.0.1:1", &[big.as_bytes()]);
        assert_eq!(c.extract(&r), Some(ip("10.1.1.1")));
    }

    #[test]
    fn single_value_headers() {
        let c = ClientIp::trusting(["10.0.0.0/8"])
            .unwrap()
            .header(ForwardedHeader::XRealIp);
        let r = req("10.0.0.1:1", "x-real-ip", &[b"203.0.113.7"]);
        assert_eq!(c.extract(&r), Some(ip("203.0.113.7")));
        let r = req("10.0.0.1:1", "x-real-ip", &[b" [2001:db8::7]:443 "]);
        assert_eq!(c.extract(&r), Some(ip("2001:db8::")));
        // Treated as absent: the peer.
        for values in [
            &[&b"203.0.113.7"[..], b"203.0.113.8"][..],
            &[b"203.0.113.7, 10.0.0.2"],
            &[b"unknown"],
            &[b""],
            &[b"\xff"],
            &[&[b'1'; 100][..]],
            &[],
        ] {
            let r = req("10.0.0.1:1", "x-real-ip", values);
            assert_eq!(c.extract(&r), Some(ip("10.0.0.1")), "{values:?}");
        }
        // Another header, another name.
        let r = xff("10.0.0.1:1", &[b"203.0.113.7"]);
        assert_eq!(c.extract(&r), Some(ip("10.0.0.1")));
        for (header, name) in [
            (ForwardedHeader::CfConnectingIp, "cf-connecting-ip"),
            (ForwardedHeader::TrueClientIp, "true-client-ip"),
            (ForwardedHeader::FlyClientIp, "fly-client-ip"),
            (ForwardedHeader::FastlyClientIp, "fastly-client-ip"),
        ] {
            let c = c.clone().header(header);
            let r = req("10.0.0.1:1", name, &[b"198.51.100.1"]);
            assert_eq!(c.extract(&r), Some(ip("198.51.100.1")), "{name}");
            let r = req("192.0.2.1:1", name, &[b"198.51.100.1"]);
            assert_eq!(c.extract(&r), Some(ip("192.0.2.1")), "{name}");
        }
    }

    #[test]
    fn hop_count() {
        let hops = |peer: &str, v: &'static str| xff(peer, &[v.as_bytes()]);
        let two = ClientIp::trusting_hops(2);
        // The peer and one more proxy: the second entry from the right.
        let r = hops("192.0.2.1:1", "6.6.6.6, 203.0.113.5, 198.51.100.9");
        assert_eq!(two.extract(&r), Some(ip("203.0.113.5")));
        // Fewer entries than hops: the leftmost.
        assert_eq!(
            two.extract(&hops("192.0.2.1:1", "203.0.113.5")),
            Some(ip("203.0.113.5"))
        );
        assert_eq!(two.extract(&hops("192.0.2.1:1", "")), Some(ip("192.0.2.1")));
        // Empty elements are not hops; a bad entry stops at the last trusted hop.
        let r = hops("192.0.2.1:1", "6.6.6.6, 203.0.113.5,, 198.51.100.9,");
        assert_eq!(two.extract(&r), Some(ip("203.0.113.5")));
        let r = hops("192.0.2.1:1", "6.6.6.6, garbage, 198.51.100.9");
        assert_eq!(two.extract(&r), Some(ip("198.51.100.9")));
        // One hop: the rightmost entry; none: the peer, whatever the header says.
        let r = hops("192.0.2.1:1", "6.6.6.6, 203.0.113.5");
        assert_eq!(
            ClientIp::trusting_hops(1).extract(&r),
            Some(ip("203.0.113.5"))
        );
        assert_eq!(
            ClientIp::trusting_hops(0).extract(&r),
            Some(ip("192.0.2.1"))
        );
        // More hops than the walk reads: the last entry read.
        let many: Vec<String> = (0..100).map(|i| format!("10.0.{i}.1")).collect();
        let r = xff("192.0.2.1:1", &[many.join(",").as_bytes()]);
        assert_eq!(
            ClientIp::trusting_hops(80).extract(&r),
            Some(ip("10.0.36.1"))
        );
        // `Forwarded` and single-value headers count the same way.
        let f = two.clone().header(ForwardedHeader::Forwarded);
        let r = req(
            "192.0.2.1:1",
            "forwarded",
            &[b"for=6.6.6.6, for=203.0.113.5;proto=https, for=198.51.100.9"],
        );
        assert_eq!(f.extract(&r), Some(ip("203.0.113.5")));
        let s = two.header(ForwardedHeader::CfConnectingIp);
        let r = req("192.0.2.1:1", "cf-connecting-ip", &[b"203.0.113.5"]);
        assert_eq!(s.extract(&r), Some(ip("203.0.113.5")));
        let s = ClientIp::trusting_hops(0).header(ForwardedHeader::CfConnectingIp);
        assert_eq!(s.extract(&r), Some(ip("192.0.2.1")));
    }

    #[test]
    fn untrusted_peer_ignores_headers() {
        let c = ClientIp::trusting(["10.0.0.0/8"]).unwrap();
        let r = xff("192.0.2.1:1", &[b"10.0.0.5"]);
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

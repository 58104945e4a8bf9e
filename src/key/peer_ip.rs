//! [`PeerIp`]: the TCP peer's address, with IPv6 grouped by prefix.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::Request;

use super::KeyExtractor;
use crate::error::ConfigError;

/// The default IPv6 grouping prefix: /56.
pub(super) const DEFAULT_IPV6_PREFIX: u8 = 56;

/// Keys requests by the IP address of the TCP peer (the socket's remote end).
///
/// The key is an [`IpAddr`]:
///
/// - IPv4: one key per address.
/// - IPv6: one key per **network prefix**, /56 by default: the host bits are zeroed and the
///   key stays an `IpAddr` (`2001:db8:1:2ff::7` becomes `2001:db8:1:200::`). A subscriber
///   is usually handed a /56 or a /48, and at least a /64, so keying on the full /128 would
///   let one client rotate through more addresses than any store can hold. /56 is the
///   default of express-rate-limit; change it with [`PeerIp::ipv6_prefix`] (`/64` is
///   stricter about not grouping neighbours, `/48` stricter about rotation, `/128` turns
///   grouping off).
/// - IPv4-mapped IPv6 addresses (`::ffff:192.0.2.1`, what a dual-stack socket reports for
///   an IPv4 client) are keyed as the IPv4 address.
///
/// # Where the address comes from
///
/// The request extensions, in this order:
///
/// 1. `axum::extract::ConnectInfo<SocketAddr>` (feature `axum`): present when the app is
///    served with `into_make_service_with_connect_info::<SocketAddr>()`.
/// 2. `axum::extract::connect_info::MockConnectInfo<SocketAddr>` (feature `axum`), which
///    the `MockConnectInfo` layer inserts in tests; axum's `ConnectInfo` extractor falls
///    back to it the same way.
/// 3. tonic's `TcpConnectInfo` (feature `tonic`), which a tonic server
///    (`tonic::transport::Server`) inserts into every request: its `remote_addr()`.
/// 4. A plain [`SocketAddr`], for hyper servers without axum: insert the remote address
///    into each request's extensions in your accept loop.
///
/// If none is present the key is `None`. A tonic server over TLS inserts
/// `TlsConnectInfo<TcpConnectInfo>` instead, which naming would pull in rustls: insert the
/// peer's `SocketAddr` with a small layer there (`req.remote_addr()`).
///
/// # Deployment caveat
///
/// Behind a reverse proxy or a load balancer the peer is the proxy, and every client
/// shares its key. Use [`ClientIp`](super::ClientIp) with the proxies' addresses there.
///
/// See the [module docs](super) for the other extractors.
///
/// ```
/// use std::net::{IpAddr, SocketAddr};
/// use tollgate::key::{KeyExtractor, PeerIp};
///
/// let peer = PeerIp::new();
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert("[2001:db8:0:17::1]:443".parse::<SocketAddr>().unwrap());
/// assert_eq!(peer.extract(&req), Some("2001:db8::".parse::<IpAddr>().unwrap()));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct PeerIp {
    ipv6_prefix: u8,
}

impl PeerIp {
    /// Keys by peer address, grouping IPv6 by /56.
    pub const fn new() -> Self {
        Self {
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Sets the IPv6 grouping prefix length, 0 to 128 (`128` keys every address apart, `0`
    /// puts all of IPv6 under one key).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidPrefix`] for a prefix longer than 128.
    pub fn ipv6_prefix(mut self, prefix: u8) -> Result<Self, ConfigError> {
        if prefix > 128 {
            return Err(ConfigError::InvalidPrefix(prefix));
        }
        self.ipv6_prefix = prefix;
        Ok(self)
    }

    /// The key for an address: IPv4-mapped addresses become IPv4, IPv6 is masked to the
    /// grouping prefix.
    pub(crate) fn group(&self, ip: IpAddr) -> IpAddr {
        match ip.to_canonical() {
            IpAddr::V4(v4) => IpAddr::V4(v4),
            IpAddr::V6(v6) => {
                let bits = u128::from(v6) & prefix_mask(self.ipv6_prefix, 128);
                IpAddr::V6(Ipv6Addr::from(bits))
            }
        }
    }
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl<B> KeyExtractor<Request<B>> for PeerIp {
    type Key = IpAddr;

    fn extract(&self, req: &Request<B>) -> Option<IpAddr> {
        peer_addr(req).map(|addr| self.group(addr.ip()))
    }

    fn misconfiguration(&self, req: &Request<B>) -> Option<&'static str> {
        peer_addr(req).is_none().then_some(super::NO_PEER_ADDRESS)
    }
}

/// The remote address of the connection, from `ConnectInfo<SocketAddr>` (feature `axum`),
/// tonic's `TcpConnectInfo` (feature `tonic`) or a plain `SocketAddr` extension.
#[inline]
pub(crate) fn peer_addr<B>(req: &Request<B>) -> Option<SocketAddr> {
    let ext = req.extensions();
    #[cfg(feature = "axum")]
    {
        use axum::extract::{connect_info::MockConnectInfo, ConnectInfo};
        if let Some(ConnectInfo(addr)) = ext.get::<ConnectInfo<SocketAddr>>() {
            return Some(*addr);
        }
        // What axum's own `ConnectInfo` extractor falls back to: the `MockConnectInfo`
        // layer inserts this type, not `ConnectInfo`.
        if let Some(MockConnectInfo(addr)) = ext.get::<MockConnectInfo<SocketAddr>>() {
            return Some(*addr);
        }
    }
    #[cfg(feature = "tonic")]
    if let Some(addr) = ext
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|info| info.remote_addr())
    {
        return Some(addr);
    }
    ext.get::<SocketAddr>().copied()
}

/// A mask of `prefix` leading one bits in a `width`-bit address (`width` is 32 or 128),
/// right-aligned in a `u128`. `prefix` must be at most `width`.
pub(super) fn prefix_mask(prefix: u8, width: u8) -> u128 {
    debug_assert!(prefix <= width && width <= 128);
    let full = if width == 128 {
        u128::MAX
    } else {
        (1u128 << width) - 1
    };
    match u32::from(width - prefix) {
        128 => 0,
        host => full & !((1u128 << host) - 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn req_from(addr: &str) -> Request<()> {
        let mut req = Request::new(());
        req.extensions_mut()
            .insert(addr.parse::<SocketAddr>().unwrap());
        req
    }

    #[test]
    fn masks() {
        assert_eq!(prefix_mask(0, 32), 0);
        assert_eq!(prefix_mask(32, 32), 0xffff_ffff);
        assert_eq!(prefix_mask(8, 32), 0xff00_0000);
        assert_eq!(prefix_mask(0, 128), 0);
        assert_eq!(prefix_mask(128, 128), u128::MAX);
        assert_eq!(prefix_mask(1, 128), 1 << 127);
        assert_eq!(prefix_mask(127, 128), u128::MAX - 1);
    }

    /// The key `p` gives a request from `addr`.
    fn key(p: &PeerIp, addr: &str) -> IpAddr {
        p.extract(&req_from(addr)).unwrap()
    }

    #[test]
    fn ipv4_is_per_address_mapped_or_not() {
        let p = PeerIp::new();
        assert_eq!(key(&p, "192.0.2.7:1234"), ip("192.0.2.7"));
        assert_eq!(key(&p, "[::ffff:192.0.2.9]:80"), ip("192.0.2.9"));
    }

    #[test]
    fn ipv6_grouped_by_56_by_default() {
        let p = PeerIp::default();
        let a = key(&p, "[2001:db8:1:2ff::7]:80");
        assert_eq!(a, ip("2001:db8:1:200::"));
        assert_eq!(a, key(&p, "[2001:db8:1:200:aaaa::1]:80"));
        assert_ne!(a, key(&p, "[2001:db8:1:300::1]:80"));
    }

    #[test]
    fn prefix_edges() {
        let addr = "[2001:db8::1]:80";
        let all = PeerIp::new().ipv6_prefix(128).unwrap();
        assert_eq!(key(&all, addr), ip("2001:db8::1"));
        let none = PeerIp::new().ipv6_prefix(0).unwrap();
        assert_eq!(key(&none, addr), ip("::"));
        let too_long = PeerIp::new().ipv6_prefix(129);
        assert_eq!(too_long, Err(ConfigError::InvalidPrefix(129)));
    }

    #[test]
    fn no_address_is_none() {
        assert_eq!(PeerIp::new().extract(&Request::new(())), None);
    }

    #[cfg(feature = "axum")]
    #[test]
    fn reads_connect_info_first() {
        let mut req = req_from("192.0.2.1:1");
        req.extensions_mut().insert(axum::extract::ConnectInfo(
            "198.51.100.2:2".parse::<SocketAddr>().unwrap(),
        ));
        assert_eq!(PeerIp::new().extract(&req), Some(ip("198.51.100.2")));
    }

    #[cfg(feature = "tonic")]
    #[test]
    fn reads_tonic_connect_info() {
        use tonic::transport::server::TcpConnectInfo;
        let mut req = req_from("192.0.2.1:1");
        req.extensions_mut().insert(TcpConnectInfo {
            local_addr: None,
            remote_addr: Some("198.51.100.4:4".parse().unwrap()),
        });
        assert_eq!(PeerIp::new().extract(&req), Some(ip("198.51.100.4")));
    }

    #[cfg(feature = "axum")]
    #[test]
    fn reads_mock_connect_info() {
        use axum::extract::connect_info::MockConnectInfo;
        let mut req = req_from("192.0.2.1:1");
        req.extensions_mut().insert(MockConnectInfo(
            "198.51.100.3:3".parse::<SocketAddr>().unwrap(),
        ));
        assert_eq!(PeerIp::new().extract(&req), Some(ip("198.51.100.3")));
        req.extensions_mut().insert(axum::extract::ConnectInfo(
            "198.51.100.2:2".parse::<SocketAddr>().unwrap(),
        ));
        assert_eq!(PeerIp::new().extract(&req), Some(ip("198.51.100.2")));
    }
}

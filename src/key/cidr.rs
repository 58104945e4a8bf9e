//! A small CIDR block matcher for the trusted-proxy list of [`ClientIp`](super::ClientIp).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::peer_ip::prefix_mask;
use crate::error::ConfigError;

/// An address block; IPv4-mapped IPv6 blocks are stored as IPv4 (addresses are
/// canonicalized the same way before matching).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cidr {
    V4 { net: u32, prefix: u8 },
    V6 { net: u128, prefix: u8 },
}

impl Cidr {
    pub(crate) fn parse(s: &str) -> Result<Self, ConfigError> {
        let err = || ConfigError::InvalidCidr(s.to_owned());
        let t = s.trim();
        let (addr, prefix) = match t.split_once('/') {
            Some((addr, prefix)) => {
                if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(err());
                }
                (addr, Some(prefix.parse::<u8>().map_err(|_| err())?))
            }
            None => (t, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| err())?;
        match addr {
            IpAddr::V4(v4) => {
                let prefix = prefix.unwrap_or(32);
                if prefix > 32 {
                    return Err(err());
                }
                Ok(Self::v4(v4, prefix))
            }
            IpAddr::V6(v6) => {
                let prefix = prefix.unwrap_or(128);
                if prefix > 128 {
                    return Err(err());
                }
                match v6.to_ipv4_mapped() {
                    Some(v4) if prefix >= 96 => Ok(Self::v4(v4, prefix - 96)),
                    _ => {
                        let net = u128::from(v6) & prefix_mask(prefix, 128);
                        Ok(Self::V6 { net, prefix })
                    }
                }
            }
        }
    }

    fn v4(addr: Ipv4Addr, prefix: u8) -> Self {
        let net = u32::from(addr) & prefix_mask(prefix, 32) as u32;
        Self::V4 { net, prefix }
    }

    /// Whether `ip` (already canonical) is in the block.
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        match (*self, ip) {
            (Self::V4 { net, prefix }, IpAddr::V4(a)) => {
                u32::from(a) & prefix_mask(prefix, 32) as u32 == net
            }
            (Self::V6 { net, prefix }, IpAddr::V6(a)) => {
                u128::from(a) & prefix_mask(prefix, 128) == net
            }
            _ => false,
        }
    }
}

impl fmt::Debug for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::V4 { net, prefix } => write!(f, "{}/{prefix}", Ipv4Addr::from(net)),
            Self::V6 { net, prefix } => write!(f, "{}/{prefix}", Ipv6Addr::from(net)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidr_parsing() {
        let c = |s| Cidr::parse(s).unwrap();
        assert!(c("10.0.0.0/8").contains(ip("10.200.1.1")));
        assert!(!c("10.0.0.0/8").contains(ip("11.0.0.1")));
        assert!(c("10.1.2.3/8").contains(ip("10.9.9.9")));
        assert!(c("192.0.2.1").contains(ip("192.0.2.1")));
        assert!(!c("192.0.2.1").contains(ip("192.0.2.2")));
        assert!(c("0.0.0.0/0").contains(ip("8.8.8.8")));
        assert!(!c("0.0.0.0/0").contains(ip("::1")));
        assert!(c("2001:db8::/32").contains(ip("2001:db8:ffff::1")));
        assert!(!c("2001:db8::/32").contains(ip("2001:db9::1")));
        assert!(c("::/0").contains(ip("2001:db9::1")));
        assert!(c("::1").contains(ip("::1")));
        assert!(c("::ffff:10.0.0.0/104").contains(ip("10.1.1.1")));
        assert_eq!(format!("{:?}", c(" 10.1.2.3/8 ")), "10.0.0.0/8");
        for bad in [
            "",
            "10.0.0.0/33",
            "::/129",
            "10.0.0/8",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "x",
            "10.0.0.0/8/8",
        ] {
            assert_eq!(
                Cidr::parse(bad),
                Err(ConfigError::InvalidCidr(bad.into())),
                "{bad}"
            );
        }
    }
}

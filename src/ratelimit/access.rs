//! Exemptions and deny lists of the HTTP layer: requests skipped by a predicate, and
//! client addresses allowed (never limited) or denied (`403`), screened by the service
//! before the core reads the key. Lists of keys are the rate limits' part's
//! ([`KeyList`](crate::options::KeyList)), since both rate layers have keys.

use std::{fmt, net::IpAddr, sync::Arc};

use http::Request;

use crate::error::ConfigError;
use crate::key::{cidr::Cidr, peer_ip::peer_addr, ClientIp, RequestHead};

/// What a layer's exemption and deny rules say of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Screen {
    /// Limited as usual.
    Limit,
    /// Never limited: no state, no rate-limit fields.
    Exempt,
    /// Refused (`403` on HTTP).
    Deny,
}

/// A predicate for requests the layer never limits.
pub(crate) type Skip = Arc<dyn Fn(&RequestHead<'_>) -> bool + Send + Sync>;

/// What the HTTP layer checks before reading a request's key.
#[derive(Clone, Default)]
pub(crate) struct Access {
    pub(crate) skip: Option<Skip>,
    allow: Vec<Cidr>,
    deny: Vec<Cidr>,
    /// Where the client's address comes from: the connection's peer by default.
    pub(crate) client_ip: Option<ClientIp>,
    /// Whether any rule is set (the common case, none, is one test).
    active: bool,
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Access")
            .field("skip", &self.skip.is_some())
            .field("allow", &self.allow)
            .field("deny", &self.deny)
            .field("client_ip", &self.client_ip)
            .finish()
    }
}

/// Parses address blocks (`10.0.0.0/8`, `2001:db8::/32`, a single address).
pub(crate) fn blocks<I, S>(cidrs: I) -> Result<Vec<Cidr>, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    cidrs.into_iter().map(|s| Cidr::parse(s.as_ref())).collect()
}

impl Access {
    /// The rules as given, ready to screen requests.
    pub(crate) fn finish(mut self) -> Self {
        self.active = self.skip.is_some() || !self.allow.is_empty() || !self.deny.is_empty();
        self
    }

    pub(crate) fn allow(&mut self, blocks: Vec<Cidr>) {
        self.allow.extend(blocks);
    }

    pub(crate) fn deny(&mut self, blocks: Vec<Cidr>) {
        self.deny.extend(blocks);
    }

    /// Denied first (a denied client is denied everywhere), then skipped, then allowed.
    #[inline]
    pub(crate) fn screen<B>(&self, req: &Request<B>) -> Screen {
        if !self.active {
            return Screen::Limit;
        }
        self.rules(req)
    }

    #[cold]
    fn rules<B>(&self, req: &Request<B>) -> Screen {
        let ip = if self.allow.is_empty() && self.deny.is_empty() {
            None
        } else {
            self.client(req)
        };
        if let Some(ip) = ip {
            if self.deny.iter().any(|c| c.contains(ip)) {
                return Screen::Deny;
            }
        }
        if let Some(skip) = &self.skip {
            if skip(&RequestHead::of(req)) {
                return Screen::Exempt;
            }
        }
        match ip {
            Some(ip) if self.allow.iter().any(|c| c.contains(ip)) => Screen::Exempt,
            _ => Screen::Limit,
        }
    }

    fn client<B>(&self, req: &Request<B>) -> Option<IpAddr> {
        match &self.client_ip {
            Some(c) => c.client(req),
            None => peer_addr(req).map(|a| a.ip().to_canonical()),
        }
    }
}

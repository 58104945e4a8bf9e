//! [`Host`]: the host a request is sent to, for limits per upstream API.

use http::{header::HOST, uri::Authority, Request};

use super::KeyExtractor;

/// The longest host accepted as a key, in bytes (a DNS name is at most 253, plus a port).
const MAX_LEN: usize = 262;

/// Keys requests by the host they are sent to: the authority of the request's URI
/// (`api.example.com`, `api.example.com:8443`), else its `Host` header, in lower case.
/// For a limit per upstream API in front of an outbound client (the
/// [upstream layer](crate::upstream)'s default key), where each call's URI names the API
/// it goes to.
///
/// The key is a `String`; `None` when the request names no host (or one longer than 262
/// bytes, or not ASCII).
///
/// ```
/// use tollgate::key::{Host, KeyExtractor};
///
/// let req = http::Request::get("https://API.example.com/v1/charges").body(())?;
/// assert_eq!(Host::new().extract(&req).unwrap(), "api.example.com");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct Host;

impl Host {
    /// Keys by the request's host.
    pub const fn new() -> Self {
        Host
    }
}

impl<B> KeyExtractor<Request<B>> for Host {
    type Key = String;

    fn extract(&self, req: &Request<B>) -> Option<String> {
        let from_header;
        let authority = match req.uri().authority() {
            Some(authority) => authority,
            None => {
                from_header = req.headers().get(HOST)?.to_str().ok()?.parse::<Authority>();
                from_header.as_ref().ok()?
            }
        };
        // The host and port, without credentials before an `@`.
        let (host, port) = (authority.host(), authority.port());
        let len = host.len() + port.as_ref().map_or(0, |p| p.as_str().len() + 1);
        if host.is_empty() || len > MAX_LEN || !host.is_ascii() {
            return None;
        }
        let mut key = host.to_ascii_lowercase();
        if let Some(port) = port {
            key.push(':');
            key.push_str(port.as_str());
        }
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(req: Request<()>) -> Option<String> {
        Host::new().extract(&req)
    }

    #[test]
    fn the_uri_authority_first_then_the_host_header() {
        let uri = Request::get("http://a.example:8080/x")
            .header(HOST, "b.example")
            .body(());
        assert_eq!(host(uri.unwrap()).as_deref(), Some("a.example:8080"));
        let header = Request::get("/x").header(HOST, "B.Example").body(());
        assert_eq!(host(header.unwrap()).as_deref(), Some("b.example"));
        assert_eq!(host(Request::get("/x").body(()).unwrap()), None);
    }

    #[test]
    fn credentials_are_not_the_host_and_odd_hosts_are_absent() {
        let creds = Request::get("http://user:pw@a.example/").body(());
        assert_eq!(host(creds.unwrap()).as_deref(), Some("a.example"));
        let long = format!("{}.example", "a".repeat(300));
        let req = Request::get("/").header(HOST, long).body(()).unwrap();
        assert_eq!(host(req), None);
    }
}

//! Key extractors through the public API: spoofing, proxy chains, IPv6 grouping, garbage.

use std::net::{IpAddr, SocketAddr};

use http::{HeaderValue, Method, Request};
use tollgate::key::{
    key_fn, ClientIp, ExtensionKey, ForwardedHeader, Global, HeaderBytes, HeaderKey, KeyExtractor,
    KeyExtractorExt, MethodKey, PeerIp,
};
use tollgate::ConfigError;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn sock(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A request from `peer` (as axum's `ConnectInfo`, or a plain `SocketAddr` without the
/// `axum` feature) with the given header lines.
fn request(peer: &str, headers: &[(&str, &[u8])]) -> Request<()> {
    let mut b = Request::builder();
    for (name, value) in headers {
        b = b.header(*name, HeaderValue::from_bytes(value).unwrap());
    }
    let mut req = b.body(()).unwrap();
    #[cfg(feature = "axum")]
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(sock(peer)));
    #[cfg(not(feature = "axum"))]
    req.extensions_mut().insert(sock(peer));
    req
}

fn proxies() -> ClientIp {
    ClientIp::trusting(["10.0.0.0/8", "2001:db8:ffff::/48", "192.0.2.10"]).unwrap()
}

#[test]
fn spoofed_headers_from_an_untrusted_peer_are_ignored() {
    let peer = "198.51.100.7:4000";
    let spoofed: &[(&str, &[u8])] = &[
        ("x-forwarded-for", b"1.2.3.4, 10.0.0.1"),
        ("forwarded", b"for=1.2.3.4, for=10.0.0.1"),
    ];
    let xff = proxies();
    let fwd = proxies().header(ForwardedHeader::Forwarded);
    let req = request(peer, spoofed);
    assert_eq!(xff.extract(&req), Some(ip("198.51.100.7")));
    assert_eq!(fwd.extract(&req), Some(ip("198.51.100.7")));
    assert_eq!(PeerIp::new().extract(&req), Some(ip("198.51.100.7")));
    // Same key with and without the spoofed headers.
    assert_eq!(xff.extract(&req), xff.extract(&request(peer, &[])));
    assert_eq!(fwd.extract(&req), fwd.extract(&request(peer, &[])));
}

#[test]
fn client_found_through_trusted_hops_in_x_forwarded_for() {
    let c = proxies();
    // client -> 192.0.2.10 -> 10.1.1.1 -> 10.2.2.2 (peer)
    let req = request(
        "10.2.2.2:5000",
        &[("x-forwarded-for", b"203.0.113.50, 192.0.2.10, 10.1.1.1")],
    );
    assert_eq!(c.extract(&req), Some(ip("203.0.113.50")));
    // IPv6 client with a port, an IPv6 proxy, the list split over two header lines.
    let req = request(
        "10.2.2.2:5000",
        &[
            ("x-forwarded-for", b"[2001:db8:1:2::5]:61000"),
            ("x-forwarded-for", b"2001:db8:ffff::1, 10.1.1.1"),
        ],
    );
    assert_eq!(c.extract(&req), Some(ip("2001:db8:1::")));
}

#[test]
fn client_found_through_trusted_hops_in_forwarded() {
    let c = proxies().header(ForwardedHeader::Forwarded);
    let req = request(
        "10.2.2.2:5000",
        &[(
            "forwarded",
            br#"for="[2001:db8:cafe::17]:4711";proto=https, For=192.0.2.10;by=10.1.1.1, for="10.1.1.1:80""#,
        )],
    );
    assert_eq!(
        c.clone().ipv6_prefix(128).unwrap().extract(&req),
        Some(ip("2001:db8:cafe::17"))
    );
    assert_eq!(c.extract(&req), Some(ip("2001:db8:cafe::")));
    let req = request(
        "10.2.2.2:5000",
        &[("forwarded", b"for=203.0.113.60;proto=http, for=10.1.1.1")],
    );
    assert_eq!(c.extract(&req), Some(ip("203.0.113.60")));
}

#[test]
fn client_written_leftmost_entry_is_not_trusted() {
    let c = proxies();
    // The client sent "X-Forwarded-For: 1.1.1.1"; the proxy appended what it saw.
    let req = request(
        "10.0.0.1:5000",
        &[("x-forwarded-for", b"1.1.1.1, 203.0.113.50")],
    );
    assert_eq!(c.extract(&req), Some(ip("203.0.113.50")));
    // Writing a trusted proxy's address into the header gains nothing either.
    let req = request(
        "10.0.0.1:5000",
        &[("x-forwarded-for", b"1.1.1.1, 10.9.9.9, 203.0.113.50")],
    );
    assert_eq!(c.extract(&req), Some(ip("203.0.113.50")));
    let c = c.header(ForwardedHeader::Forwarded);
    let req = request(
        "10.0.0.1:5000",
        &[
            ("forwarded", b"for=1.1.1.1"),
            ("forwarded", b"for=203.0.113.50"),
        ],
    );
    assert_eq!(c.extract(&req), Some(ip("203.0.113.50")));
}

#[test]
fn unknown_and_hidden_stop_at_the_last_trusted_hop() {
    let c = proxies().header(ForwardedHeader::Forwarded);
    for value in [
        &b"for=1.1.1.1, for=unknown, for=10.1.1.1"[..],
        b"for=1.1.1.1, for=_hidden, for=10.1.1.1",
    ] {
        let req = request("10.2.2.2:1", &[("forwarded", value)]);
        assert_eq!(c.extract(&req), Some(ip("10.1.1.1")));
    }
}

#[test]
fn ipv6_grouping() {
    let key = |p: &PeerIp, addr: &str| {
        let mut req = Request::new(());
        req.extensions_mut().insert(sock(addr));
        p.extract(&req).unwrap()
    };
    let p = PeerIp::new();
    // Same /56 (2001:db8:0:1200::/56), different /64s.
    let a = key(&p, "[2001:db8:0:1201::1]:1");
    let b = key(&p, "[2001:db8:0:12ff::2]:1");
    let c = key(&p, "[2001:db8:0:1301::1]:1");
    assert_eq!(a, b);
    assert_ne!(a, c);
    let p64 = PeerIp::new().ipv6_prefix(64).unwrap();
    assert_ne!(
        key(&p64, "[2001:db8:0:1201::1]:1"),
        key(&p64, "[2001:db8:0:12ff::2]:1")
    );
    assert_eq!(
        key(&p64, "[2001:db8:0:1201::1]:1"),
        key(&p64, "[2001:db8:0:1201::9]:1")
    );
    assert_eq!(
        PeerIp::new().ipv6_prefix(129),
        Err(ConfigError::InvalidPrefix(129))
    );
    assert_eq!(
        proxies().ipv6_prefix(200).unwrap_err(),
        ConfigError::InvalidPrefix(200)
    );
}

#[test]
fn ipv4_mapped_is_keyed_as_ipv4() {
    let req = request("[::ffff:198.51.100.7]:4000", &[]);
    assert_eq!(PeerIp::new().extract(&req), Some(ip("198.51.100.7")));
    // A mapped peer matches an IPv4 trusted block, and a mapped entry is IPv4 too.
    let req = request(
        "[::ffff:10.0.0.1]:4000",
        &[("x-forwarded-for", b"::ffff:203.0.113.5")],
    );
    assert_eq!(proxies().extract(&req), Some(ip("203.0.113.5")));
}

#[test]
fn plain_socket_addr_extension() {
    let mut req = Request::new(());
    req.extensions_mut().insert(sock("192.0.2.77:1"));
    assert_eq!(PeerIp::new().extract(&req), Some(ip("192.0.2.77")));
    assert_eq!(proxies().extract(&req), Some(ip("192.0.2.77")));
    assert_eq!(PeerIp::new().extract(&Request::new(())), None);
    assert_eq!(proxies().extract(&Request::new(())), None);
}

#[test]
fn garbage_headers_are_ignored() {
    let c = proxies();
    let f = proxies().header(ForwardedHeader::Forwarded);
    let huge = vec![b'9'; 100 * 1024];
    let huge_list = "1.2.3.4, ".repeat(12_000);
    let garbage: [&[u8]; 6] = [
        b",,,garbage, 999.1.1.1",
        b"\xff\xfe\x80, \xc3",
        b"",
        &huge,
        huge_list.as_bytes(),
        b"\"\"\"; ;;=,=for=",
    ];
    for value in garbage {
        let headers: &[(&str, &[u8])] = &[("x-forwarded-for", value), ("forwarded", value)];
        // From an untrusted peer: the peer.
        let req = request("198.51.100.7:1", headers);
        assert_eq!(c.extract(&req), Some(ip("198.51.100.7")));
        assert_eq!(f.extract(&req), Some(ip("198.51.100.7")));
        // From a trusted peer: no address from the garbage, except a well-formed untrusted
        // entry appended by the peer (the last one of the long list).
        let req = request("10.0.0.1:1", headers);
        let expected = if value == huge_list.as_bytes() {
            ip("1.2.3.4")
        } else {
            ip("10.0.0.1")
        };
        assert_eq!(c.extract(&req), Some(expected));
        assert_eq!(f.extract(&req), Some(ip("10.0.0.1")));
    }
    assert_eq!(
        ClientIp::trusting(["10.0.0.0/8", "10.0.0.0/99"]).unwrap_err(),
        ConfigError::InvalidCidr("10.0.0.0/99".into())
    );
}

#[test]
fn header_key_and_length_cap() {
    let k = HeaderKey::new("X-Api-Key").unwrap();
    let req = request("192.0.2.1:1", &[("x-api-key", b"key-1")]);
    assert_eq!(k.extract(&req).unwrap(), "key-1");
    let long = vec![b'k'; 257];
    let with = |v: &[u8]| request("192.0.2.1:1", &[("x-api-key", v)]);
    assert_eq!(k.extract(&with(&long)), None);
    assert_eq!(k.extract(&with(b"")), None);
    let k = k.max_len(1024);
    assert!(k.extract(&with(&long)).is_some());
    assert_eq!(
        HeaderKey::new("no spaces allowed").unwrap_err(),
        ConfigError::InvalidHeaderName("no spaces allowed".into())
    );
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct UserId(u64);

#[derive(Clone)]
struct Claims {
    tenant: String,
}

#[test]
fn extension_keys() {
    let mut req = Request::new(());
    assert_eq!(ExtensionKey::<UserId>::new().extract(&req), None);
    req.extensions_mut().insert(UserId(42));
    req.extensions_mut().insert(Claims {
        tenant: "acme".into(),
    });
    assert_eq!(
        ExtensionKey::<UserId>::new().extract(&req),
        Some(UserId(42))
    );
    let by_tenant = ExtensionKey::map(|c: &Claims| c.tenant.clone());
    assert_eq!(by_tenant.extract(&req).as_deref(), Some("acme"));
}

#[test]
fn composite_and_or() {
    let mut req = request("192.0.2.1:1", &[("x-api-key", b"k")]);
    *req.method_mut() = Method::POST;
    let both = (PeerIp::new(), MethodKey::new());
    assert_eq!(both.extract(&req), Some((ip("192.0.2.1"), Method::POST)));
    let three = (Global, HeaderKey::new("x-api-key").unwrap(), MethodKey);
    assert_eq!(
        three.extract(&req),
        Some(((), HeaderBytes::from("k"), Method::POST))
    );
    let four = (
        Global,
        Global,
        PeerIp::new(),
        HeaderKey::new("x-tenant").unwrap(),
    );
    assert_eq!(four.extract(&req), None);

    // The user if authenticated, else the client address.
    let ip_string = key_fn(|r: &Request<()>| PeerIp::new().extract(r).map(|ip| ip.to_string()));
    let user_or_ip = ExtensionKey::map(|u: &UserId| u.0.to_string()).or(ip_string);
    assert_eq!(user_or_ip.extract(&req).as_deref(), Some("192.0.2.1"));
    req.extensions_mut().insert(UserId(9));
    assert_eq!(user_or_ip.extract(&req).as_deref(), Some("9"));

    // Same key type, no closure needed.
    let api_key_or_tenant = HeaderKey::new("x-tenant")
        .unwrap()
        .or(HeaderKey::new("x-api-key").unwrap());
    assert_eq!(api_key_or_tenant.extract(&req).unwrap(), "k");
}

#[cfg(feature = "jwt-rust-crypto")]
mod jwt {
    use tollgate::key::{jwt, BearerClaim};

    use super::*;

    const SECRET: &[u8] = b"the issuer's secret";

    fn token(claims: serde_json::Value, secret: &[u8]) -> String {
        jwt::encode(
            &jwt::Header::default(),
            &claims,
            &jwt::EncodingKey::from_secret(secret),
        )
        .unwrap()
    }

    fn bearer(token: &str) -> Request<()> {
        Request::builder()
            .header("authorization", format!("Bearer {token}"))
            .body(())
            .unwrap()
    }

    fn exp() -> u64 {
        jwt::get_current_timestamp() + 600
    }

    #[test]
    fn bearer_claims() {
        let req = bearer(&token(
            serde_json::json!({"sub":"alice","tenant":1234,"exp":exp()}),
            SECRET,
        ));
        let sub = BearerClaim::hs256("sub", SECRET).unwrap();
        assert_eq!(sub.extract(&req).as_deref(), Some("alice"));
        assert_eq!(
            BearerClaim::hs256("tenant", SECRET)
                .unwrap()
                .extract(&req)
                .as_deref(),
            Some("1234")
        );
        assert_eq!(
            BearerClaim::hs256("role", SECRET).unwrap().extract(&req),
            None
        );
        assert_eq!(sub.extract(&bearer("not-a-jwt")), None);
        let long = token(
            serde_json::json!({"sub":"a".repeat(10_000),"exp":exp()}),
            SECRET,
        );
        assert_eq!(sub.extract(&bearer(&long)), None);
    }

    #[test]
    fn verification_refuses_forged_tokens() {
        let genuine = token(serde_json::json!({"sub":"alice","exp":exp()}), SECRET);
        let forged = token(serde_json::json!({"sub":"bob","exp":exp()}), b"guess");
        let k = BearerClaim::hs256("sub", SECRET).unwrap();
        assert_eq!(k.extract(&bearer(&genuine)).as_deref(), Some("alice"));
        assert_eq!(k.extract(&bearer(&forged)), None);
        // Behind an auth layer that verified it, the claim is read as it is.
        let after_auth = BearerClaim::unverified("sub");
        assert_eq!(after_auth.extract(&bearer(&forged)).as_deref(), Some("bob"));
    }
}

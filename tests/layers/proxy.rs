//! Client IP behind proxies, through the whole layer: who shares a limit with whom.

use std::net::SocketAddr;

use axum::{body::Body, extract::connect_info::MockConnectInfo, routing::get, Router};
use http::Request;
use tollgate::key::{ClientIp, ForwardedHeader, PeerIp};
use tollgate::Quota;
use tollgate::RateLimitLayer;
use tower::ServiceExt;

/// A router limited to one request per minute per key, seen from `peer`.
fn app(layer_key: ClientIp, peer: &str) -> Router {
    let layer = RateLimitLayer::builder()
        .key(layer_key)
        .token_bucket(Quota::per_minute(1).unwrap())
        .build()
        .unwrap();
    let peer: SocketAddr = peer.parse().unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
        .layer(MockConnectInfo(peer))
}

async fn status(app: &Router, headers: &[(&str, &str)]) -> u16 {
    let mut req = Request::builder().uri("/");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    app.clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn spoofed_headers_from_an_untrusted_peer_do_not_change_the_key() {
    let app = app(
        ClientIp::trusting(["10.0.0.0/8"]).unwrap(),
        "198.51.100.7:5000",
    );
    assert_eq!(status(&app, &[("x-forwarded-for", "1.1.1.1")]).await, 200);
    // A new "client" per request in the header: still the same peer, still limited.
    assert_eq!(status(&app, &[("x-forwarded-for", "2.2.2.2")]).await, 429);
    assert_eq!(status(&app, &[("forwarded", "for=3.3.3.3")]).await, 429);
    assert_eq!(status(&app, &[]).await, 429);
}

#[tokio::test]
async fn trusted_proxy_chain_finds_the_client() {
    // Peer is our load balancer; the header went through another trusted hop.
    let app = app(ClientIp::trusting(["10.0.0.0/8"]).unwrap(), "10.0.0.1:443");
    let chain = |client: &str| format!("{client}, 10.1.2.3");
    assert_eq!(
        status(&app, &[("x-forwarded-for", &chain("203.0.113.5"))]).await,
        200
    );
    assert_eq!(
        status(&app, &[("x-forwarded-for", &chain("203.0.113.6"))]).await,
        200,
        "another client"
    );
    assert_eq!(
        status(&app, &[("x-forwarded-for", &chain("203.0.113.5"))]).await,
        429,
        "same client again"
    );
    // A client-written leftmost entry does not help: the rightmost untrusted hop is the key.
    assert_eq!(
        status(
            &app,
            &[("x-forwarded-for", "9.9.9.9, 203.0.113.5, 10.1.2.3")]
        )
        .await,
        429
    );
}

#[tokio::test]
async fn forwarded_header_with_quoted_ipv6_and_prefix_grouping() {
    let key = ClientIp::trusting(["10.0.0.0/8"])
        .unwrap()
        .header(ForwardedHeader::Forwarded);
    let app = app(key, "10.0.0.1:443");
    let fwd = |ip: &str| format!("for=\"[{ip}]:4711\";proto=https, for=10.0.0.9");
    assert_eq!(
        status(&app, &[("forwarded", &fwd("2001:db8:1:100::1"))]).await,
        200
    );
    // Same /56: the same subscriber rotating addresses shares the limit.
    assert_eq!(
        status(&app, &[("forwarded", &fwd("2001:db8:1:1ff::abcd"))]).await,
        429
    );
    // Another /56 is another client.
    assert_eq!(
        status(&app, &[("forwarded", &fwd("2001:db8:1:200::1"))]).await,
        200
    );
}

#[tokio::test]
async fn garbage_headers_are_ignored_without_error() {
    let app = app(ClientIp::trusting(["10.0.0.0/8"]).unwrap(), "10.0.0.1:443");
    let huge = "1.1.1.1, ".repeat(10_000);
    for garbage in [",,,garbage, 999.1.1.1", "", "for=", "[::1", huge.as_str()] {
        let s = status(
            &app,
            &[("x-forwarded-for", garbage), ("forwarded", garbage)],
        )
        .await;
        assert!(s == 200 || s == 429, "garbage {garbage:?} gave {s}");
    }
    // Non-UTF-8 bytes (obs-text) are valid header bytes and must be ignored too.
    let mut req = Request::builder().uri("/").body(Body::empty()).unwrap();
    let bytes = http::HeaderValue::from_bytes(&[0xff, 0xfe, b'1', 0x80]).unwrap();
    req.headers_mut().insert("x-forwarded-for", bytes);
    let s = app.clone().oneshot(req).await.unwrap().status().as_u16();
    assert!(s == 200 || s == 429);
    // All of those fell back to the peer (the trusted proxy itself) as one key: limited.
    assert_eq!(status(&app, &[("x-forwarded-for", "not an ip")]).await, 429);
}

#[tokio::test]
async fn peer_ip_groups_ipv6_by_prefix() {
    let layer = RateLimitLayer::builder()
        .key(PeerIp::new())
        .token_bucket(Quota::per_minute(1).unwrap())
        .build()
        .unwrap();
    let one = |peer: &str| {
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer.clone())
            .layer(MockConnectInfo(peer.parse::<SocketAddr>().unwrap()))
    };
    assert_eq!(status(&one("[2001:db8:0:a00::1]:1"), &[]).await, 200);
    assert_eq!(
        status(&one("[2001:db8:0:aff::2]:2"), &[]).await,
        429,
        "same /56"
    );
    assert_eq!(
        status(&one("[2001:db8:0:b00::1]:1"), &[]).await,
        200,
        "other /56"
    );
    assert_eq!(status(&one("192.0.2.1:1"), &[]).await, 200);
    assert_eq!(
        status(&one("192.0.2.2:1"), &[]).await,
        200,
        "IPv4 per address"
    );
}

#[tokio::test]
async fn single_value_headers_are_believed_only_from_trusted_proxies() {
    for (header, name) in [
        (ForwardedHeader::XRealIp, "x-real-ip"),
        (ForwardedHeader::CfConnectingIp, "cf-connecting-ip"),
        (ForwardedHeader::TrueClientIp, "true-client-ip"),
        (ForwardedHeader::FlyClientIp, "fly-client-ip"),
        (ForwardedHeader::FastlyClientIp, "fastly-client-ip"),
    ] {
        let key = || ClientIp::trusting(["10.0.0.0/8"]).unwrap().header(header);
        // From the trusted proxy: one client per address.
        let proxied = app(key(), "10.0.0.1:443");
        assert_eq!(status(&proxied, &[(name, "203.0.113.5")]).await, 200);
        assert_eq!(
            status(&proxied, &[(name, "203.0.113.6")]).await,
            200,
            "{name}"
        );
        assert_eq!(
            status(&proxied, &[(name, "203.0.113.5")]).await,
            429,
            "{name}"
        );
        // A client connecting directly cannot pick a new key with the header.
        let direct = app(key(), "198.51.100.7:5000");
        assert_eq!(status(&direct, &[(name, "1.1.1.1")]).await, 200);
        assert_eq!(status(&direct, &[(name, "2.2.2.2")]).await, 429, "{name}");
        // Nor with the list headers, which this extractor does not read.
        assert_eq!(
            status(
                &proxied,
                &[(name, "203.0.113.5"), ("x-forwarded-for", "4.4.4.4")]
            )
            .await,
            429,
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_malformed_single_value_header_is_treated_as_absent() {
    let key = ClientIp::trusting(["10.0.0.0/8"])
        .unwrap()
        .header(ForwardedHeader::XRealIp);
    let app = app(key, "10.0.0.1:443");
    // No header: the proxy itself is the key; every malformed value shares it.
    assert_eq!(status(&app, &[]).await, 200);
    for bad in [
        &[("x-real-ip", "203.0.113.5, 203.0.113.6")][..],
        &[("x-real-ip", "unknown")],
        &[("x-real-ip", "")],
        &[("x-real-ip", "203.0.113.5"), ("x-real-ip", "203.0.113.6")],
    ] {
        assert_eq!(status(&app, bad).await, 429, "{bad:?}");
    }
    assert_eq!(status(&app, &[("x-real-ip", "203.0.113.5")]).await, 200);
}

#[tokio::test]
async fn a_hop_count_ignores_what_the_client_prepends() {
    // A CDN and a load balancer, addresses unknown: the client is 2 entries from the right.
    let app = app(ClientIp::trusting_hops(2), "192.0.2.1:443");
    let via = |spoof: &str, client: &str| format!("{spoof}{client}, 198.51.100.9");
    assert_eq!(
        status(&app, &[("x-forwarded-for", &via("", "203.0.113.5"))]).await,
        200
    );
    // A new fake entry on the left per request: still the same client.
    for spoof in ["1.1.1.1, ", "2.2.2.2, 3.3.3.3, ", "garbage, "] {
        assert_eq!(
            status(&app, &[("x-forwarded-for", &via(spoof, "203.0.113.5"))]).await,
            429,
            "{spoof}"
        );
    }
    assert_eq!(
        status(
            &app,
            &[("x-forwarded-for", &via("1.1.1.1, ", "203.0.113.6"))]
        )
        .await,
        200,
        "another client"
    );
    // A header the proxies' entries cannot be read from: the last proxy that wrote one.
    assert_eq!(
        status(
            &app,
            &[("x-forwarded-for", "203.0.113.7, bad, 198.51.100.9")]
        )
        .await,
        200
    );
    assert_eq!(
        status(
            &app,
            &[("x-forwarded-for", "203.0.113.8, bad, 198.51.100.9")]
        )
        .await,
        429,
        "the same hop, 198.51.100.9"
    );
}

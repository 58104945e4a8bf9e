//! gRPC end to end: a real tonic server on `127.0.0.1:0` behind `RateLimitLayer`, a real
//! tonic client. A refused call is `RESOURCE_EXHAUSTED` with the exact delay in a
//! `RetryInfo` (the store runs on a manual clock, so the delay is exact); keys by
//! metadata, by method and by the peer; the layer's other answers are gRPC statuses too;
//! a plain HTTP request to the same server still gets a plain 429.

use std::{net::SocketAddr, time::Duration};

use crate::support::FailingStore;
use http::StatusCode;
use tokio::net::TcpListener;
use tollgate::clock::ManualClock;
use tollgate::key::MissingKey;
use tollgate::key::{GrpcMethod, HeaderKey};
use tollgate::store::MemoryStore;
use tollgate::store::OnStoreError;
use tollgate::Limit;
use tollgate::Policy;
use tollgate::Quota;
use tollgate::RateLimitLayer;
use tonic::transport::{server::TcpIncoming, Channel, Server};
use tonic::Code;
use tonic::Request;
use tonic::Response;
use tonic::Status;
use tonic_types::StatusExt as _;

#[allow(unreachable_pub, missing_docs, clippy::all)]
#[path = "../../examples/grpc/helloworld.rs"]
mod helloworld;

use helloworld::greeter_client::GreeterClient;
use helloworld::greeter_server::{Greeter, GreeterServer};
use helloworld::HelloReply;
use helloworld::HelloRequest;

struct Hello;

#[tonic::async_trait]
impl Greeter for Hello {
    async fn say_hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        let message = format!("Hello {}!", req.into_inner().name);
        Ok(Response::new(HelloReply { message }))
    }
}

/// Serves the greeter behind `$layer` on a fresh loopback port (HTTP/1 accepted too, for
/// the plain HTTP request), returning its address.
macro_rules! serve {
    ($layer:expr) => {{
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = Server::builder()
            .accept_http1(true)
            .layer($layer)
            .add_service(GreeterServer::new(Hello))
            .serve_with_incoming(TcpIncoming::from(listener));
        tokio::spawn(server);
        addr
    }};
}

async fn client(addr: SocketAddr) -> GreeterClient<Channel> {
    GreeterClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

/// A call with `x-api-key: key` when given.
fn hello(key: Option<&'static str>) -> Request<HelloRequest> {
    let mut req = Request::new(HelloRequest {
        name: "tollgate".into(),
    });
    if let Some(k) = key {
        req.metadata_mut().insert("x-api-key", k.parse().unwrap());
    }
    req
}

/// The call's gRPC code (`Ok` for a reply).
async fn code(client: &mut GreeterClient<Channel>, req: Request<HelloRequest>) -> Code {
    match client.say_hello(req).await {
        Ok(reply) => {
            assert_eq!(reply.get_ref().message, "Hello tollgate!");
            Code::Ok
        }
        Err(status) => status.code(),
    }
}

/// 1 per second on a frozen manual clock.
fn one_per_second() -> (ManualClock, MemoryStore<Option<()>, ManualClock>) {
    let clock = ManualClock::at(Duration::from_secs(1_800_000_000));
    let policy = Policy::new(Limit::token_bucket(Quota::per_second(1).unwrap()).unwrap());
    let store = MemoryStore::new(policy).with_clock(clock.clone());
    (clock, store)
}

#[tokio::test]
async fn refusal_is_resource_exhausted_with_the_exact_retry_info() {
    let (clock, store) = one_per_second();
    let addr = serve!(RateLimitLayer::builder().build_with(store).unwrap());
    let mut client = client(addr).await;

    let reply = client.say_hello(hello(None)).await.unwrap();
    assert!(reply.metadata().contains_key("ratelimit"));

    // Two calls at one frozen instant: the second waits exactly one second.
    let status = client.say_hello(hello(None)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let info = status.get_details_retry_info().expect("RetryInfo");
    assert_eq!(info.retry_delay, Some(Duration::from_secs(1)));
    assert!(status.message().contains("quota exceeded"), "{status:?}");
    // The HTTP fields ride along as metadata.
    let meta = status.metadata();
    assert_eq!(meta.get("retry-after").unwrap(), "1");
    assert!(meta
        .get("ratelimit")
        .unwrap()
        .to_str()
        .unwrap()
        .contains("r=0;t=1"));

    // A quarter second later: the delay is exact to the nanosecond, not rounded.
    clock.advance(Duration::from_millis(250));
    let status = client.say_hello(hello(None)).await.unwrap_err();
    let info = status.get_details_retry_info().expect("RetryInfo");
    assert_eq!(info.retry_delay, Some(Duration::from_millis(750)));
    assert_eq!(status.metadata().get("retry-after").unwrap(), "1");

    clock.advance(Duration::from_millis(750));
    assert_eq!(code(&mut client, hello(None)).await, Code::Ok);
}

#[tokio::test]
async fn keys_by_metadata() {
    let clock = ManualClock::new();
    let store = MemoryStore::new("1/s".parse::<Policy>().unwrap()).with_clock(clock);
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::new("x-api-key").unwrap())
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
        .deny_keys(["leaked"])
        .build_with(store)
        .unwrap();
    let mut client = client(serve!(layer)).await;
    assert_eq!(code(&mut client, hello(Some("a"))).await, Code::Ok);
    assert_eq!(
        code(&mut client, hello(Some("a"))).await,
        Code::ResourceExhausted
    );
    // Another key has its own limit.
    assert_eq!(code(&mut client, hello(Some("b"))).await, Code::Ok);
    // No key under `Reject(401)`: UNAUTHENTICATED; a denied key: PERMISSION_DENIED.
    assert_eq!(code(&mut client, hello(None)).await, Code::Unauthenticated);
    assert_eq!(
        code(&mut client, hello(Some("leaked"))).await,
        Code::PermissionDenied
    );
}

#[tokio::test]
async fn keys_by_method() {
    let clock = ManualClock::new();
    let store = MemoryStore::new("1/s".parse::<Policy>().unwrap()).with_clock(clock);
    let layer = RateLimitLayer::builder()
        .key(GrpcMethod::new())
        .build_with(store)
        .unwrap();
    let addr = serve!(layer);
    let mut greeter = client(addr).await;
    assert_eq!(code(&mut greeter, hello(None)).await, Code::Ok);
    assert_eq!(
        code(&mut greeter, hello(None)).await,
        Code::ResourceExhausted
    );

    // Another method of the same server is counted apart: the limiter lets it through
    // and the server, which lacks it, answers UNIMPLEMENTED.
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let grpc = tonic::client::Grpc::new(channel);
    let goodbye = |mut grpc: tonic::client::Grpc<Channel>| async move {
        grpc.ready().await.unwrap();
        let path = http::uri::PathAndQuery::from_static("/helloworld.Greeter/SayGoodbye");
        let codec = tonic_prost::ProstCodec::<HelloRequest, HelloReply>::default();
        grpc.unary(hello(None), path, codec)
            .await
            .unwrap_err()
            .code()
    };
    assert_eq!(goodbye(grpc.clone()).await, Code::Unimplemented);
    assert_eq!(goodbye(grpc).await, Code::ResourceExhausted);
}

/// Feature `tonic`: `PeerIp` reads the `TcpConnectInfo` tonic's server inserts (keyless
/// calls would be refused, so a reply shows the key was found).
#[cfg(feature = "tonic")]
#[tokio::test]
async fn keys_by_peer_ip_from_tonic_connect_info() {
    let clock = ManualClock::new();
    let store = MemoryStore::new("1/s".parse::<Policy>().unwrap()).with_clock(clock);
    let layer = RateLimitLayer::builder()
        .key(tollgate::key::PeerIp::new())
        .on_missing_key(MissingKey::Reject(StatusCode::BAD_REQUEST))
        .build_with(store)
        .unwrap();
    let mut client = client(serve!(layer)).await;
    assert_eq!(code(&mut client, hello(None)).await, Code::Ok);
    assert_eq!(
        code(&mut client, hello(None)).await,
        Code::ResourceExhausted
    );
}

#[tokio::test]
async fn a_plain_http_request_still_gets_a_plain_429() {
    let (_clock, store) = one_per_second();
    let addr = serve!(RateLimitLayer::builder().build_with(store).unwrap());
    let mut greeter = client(addr).await;
    assert_eq!(code(&mut greeter, hello(None)).await, Code::Ok);

    let res = reqwest::Client::new()
        .get(format!("http://{addr}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    assert!(!res.headers().contains_key("grpc-status"));
}

#[tokio::test]
async fn grpc_status_off_gives_grpc_clients_the_http_refusal() {
    let (_clock, store) = one_per_second();
    let layer = RateLimitLayer::builder()
        .grpc_status(false)
        .build_with(store)
        .unwrap();
    let mut client = client(serve!(layer)).await;
    assert_eq!(code(&mut client, hello(None)).await, Code::Ok);
    // tonic cannot read a 429 with a problem body: it reports INTERNAL (the JSON's `{` is
    // not a gRPC frame's compression flag), with no delay.
    let status = client.say_hello(hello(None)).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(status.get_details_retry_info().is_none());
}

#[tokio::test]
async fn a_failed_store_under_fail_closed_is_unavailable() {
    let layer = RateLimitLayer::builder()
        .on_store_error(OnStoreError::FailClosed)
        .build_with(FailingStore)
        .unwrap();
    let mut client = client(serve!(layer)).await;
    let status = client.say_hello(hello(None)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "The rate limiter's store is unavailable.");
}

/// The fair-sharing layer refuses a gRPC call as `RateLimitLayer` does: the exact delay
/// in a `RetryInfo` (here the key's ceiling, one per second, on a frozen clock).
#[tokio::test]
async fn a_fair_share_refusal_is_resource_exhausted_with_the_exact_retry_info() {
    use tollgate::fair::{MemoryFair, Share};
    use tollgate::FairLimitLayer;
    let clock = ManualClock::at(Duration::from_secs(1_800_000_000));
    let share = Share::new(Quota::per_second(1).unwrap(), Quota::per_second(1).unwrap()).unwrap();
    let layer = FairLimitLayer::builder(
        HeaderKey::new("x-api-key").unwrap(),
        Quota::per_second(2).unwrap(),
    )
    .share(share)
    .build_with(MemoryFair::new().with_clock(clock))
    .unwrap();
    let addr = serve!(layer);
    let mut client = client(addr).await;
    assert_eq!(code(&mut client, hello(Some("a"))).await, Code::Ok);
    let status = client.say_hello(hello(Some("a"))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let info = status.get_details_retry_info().expect("RetryInfo");
    assert_eq!(info.retry_delay, Some(Duration::from_secs(1)));
    assert_eq!(status.metadata().get("retry-after").unwrap(), "1");
}

/// Regression: the in-flight layer answered a gRPC call it refused with an HTTP 429 and
/// a JSON body, which a gRPC client reads as a protocol error (`INTERNAL`, no
/// `RetryInfo`). A limit of 0 in flight refuses every call.
#[tokio::test]
async fn an_in_flight_refusal_is_resource_exhausted_with_a_retry_info() {
    use tollgate::{key::Global, InFlightLimitLayer};
    let addr = serve!(InFlightLimitLayer::new(Global::new(), 0));
    let mut client = client(addr).await;
    let status = client.say_hello(hello(None)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let info = status.get_details_retry_info().expect("RetryInfo");
    assert_eq!(info.retry_delay, Some(Duration::from_secs(1)));
    assert!(status
        .metadata()
        .get("ratelimit-policy")
        .unwrap()
        .to_str()
        .unwrap()
        .contains("concurrent-requests"));
}

/// The in-flight and fair-sharing layers answer a keyless gRPC call they reject with the
/// status that means what the configured HTTP status means, as `RateLimitLayer` does
/// (they sent a problem+json body, which a tonic client reads as `INTERNAL`).
#[tokio::test]
async fn in_flight_and_fair_layers_reject_a_keyless_call_with_a_grpc_status() {
    use tollgate::{fair::Share, FairLimitLayer, InFlightLimitLayer};
    let in_flight = InFlightLimitLayer::builder(HeaderKey::new("x-api-key").unwrap(), 1)
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
        .build()
        .unwrap();
    let mut c = client(serve!(in_flight)).await;
    assert_eq!(code(&mut c, hello(None)).await, Code::Unauthenticated);
    assert_eq!(code(&mut c, hello(Some("k"))).await, Code::Ok);

    let share = Share::new(Quota::per_second(1).unwrap(), Quota::per_second(2).unwrap()).unwrap();
    let fair = FairLimitLayer::builder(
        HeaderKey::new("x-api-key").unwrap(),
        Quota::per_second(4).unwrap(),
    )
    .share(share)
    .on_missing_key(MissingKey::Reject(StatusCode::BAD_REQUEST))
    .build()
    .unwrap();
    let mut c = client(serve!(fair)).await;
    assert_eq!(code(&mut c, hello(None)).await, Code::InvalidArgument);
    assert_eq!(code(&mut c, hello(Some("k"))).await, Code::Ok);
}

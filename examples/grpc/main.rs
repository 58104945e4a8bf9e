//! A tonic gRPC server (`helloworld.Greeter/SayHello`) limited to 5 calls per second per
//! client IP, bursts of 5.
//!
//! ```sh
//! cargo run --example grpc --features tonic                               # 127.0.0.1:50051 (or $PORT)
//! TOLLGATE_EXAMPLE_SELFTEST=1 cargo run --example grpc --features tonic   # drive itself and check
//! ```
//!
//! A tonic server is a tower HTTP service, so `Server::builder().layer(RateLimitLayer..)`
//! limits every call. A refused call is the gRPC status `RESOURCE_EXHAUSTED` with the exact
//! retry delay in a `google.rpc.RetryInfo`, which tonic clients read with
//! `tonic_types::StatusExt::get_details_retry_info`. `PeerIp` reads the peer address tonic
//! puts into each request (tollgate's feature `tonic`). The messages and the Greeter
//! service are generated from `helloworld.proto` and checked in (`helloworld.rs`), so no
//! `protoc` is needed.

use std::{net::SocketAddr, time::Duration};

use tokio::{net::TcpListener, task::JoinHandle};
use tollgate::{key::PeerIp, Limit, Quota, RateLimitLayer};
use tonic::transport::{server::TcpIncoming, Server};
use tonic::Code;
use tonic::Request;
use tonic::Response;
use tonic::Status;
use tonic_types::StatusExt as _;

#[allow(unreachable_pub, missing_docs, clippy::all)]
mod helloworld;

use helloworld::greeter_client::GreeterClient;
use helloworld::greeter_server::{Greeter, GreeterServer};
use helloworld::HelloReply;
use helloworld::HelloRequest;

/// The greeter: says hello.
#[derive(Debug, Default)]
struct Hello;

#[tonic::async_trait]
impl Greeter for Hello {
    async fn say_hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        let message = format!("Hello {}!", req.into_inner().name);
        Ok(Response::new(HelloReply { message }))
    }
}

/// Serves the limited greeter on `127.0.0.1:port`.
async fn serve(
    port: u16,
) -> Result<(SocketAddr, JoinHandle<Result<(), tonic::transport::Error>>), Box<dyn std::error::Error>>
{
    // 5 calls per second per client IP, bursts of 5.
    let limit = RateLimitLayer::new(
        PeerIp::new(),
        Limit::token_bucket(Quota::per_second(5)?.with_burst(5)?)?,
    );
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    let server = Server::builder()
        .layer(limit)
        .add_service(GreeterServer::new(Hello))
        .serve_with_incoming(TcpIncoming::from(listener));
    Ok((addr, tokio::spawn(server)))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var("TOLLGATE_EXAMPLE_SELFTEST").as_deref() == Ok("1") {
        return selftest().await;
    }
    let port = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(50051);
    let (addr, server) = serve(port).await?;
    println!("helloworld.Greeter limited to 5/s per client IP, listening on {addr}");
    println!("  for i in $(seq 7); do grpcurl -plaintext -import-path examples/grpc -proto helloworld.proto \\");
    println!("    -d '{{\"name\":\"you\"}}' {addr} helloworld.Greeter/SayHello & done; wait");
    println!("  # 5 replies, then ResourceExhausted with a RetryInfo detail");
    server.await??;
    Ok(())
}

/// 7 calls at once from one client: 5 pass, 2 are refused with a decodable `RetryInfo`
/// (a machine so loaded that the calls span more than 200 ms lets one more pass for every
/// 200 ms they took).
async fn selftest() -> Result<(), Box<dyn std::error::Error>> {
    let (addr, _server) = serve(0).await?;
    let client = GreeterClient::connect(format!("http://{addr}")).await?;
    let started = std::time::Instant::now();
    let calls = (0..7).map(|i| {
        let mut client = client.clone();
        tokio::spawn(async move {
            let name = format!("caller {i}");
            client.say_hello(HelloRequest { name }).await
        })
    });
    let mut ok = 0;
    let mut delays = Vec::new();
    for call in calls.collect::<Vec<_>>() {
        match call.await? {
            Ok(reply) => {
                println!("ok: {}", reply.get_ref().message);
                ok += 1;
            }
            Err(status) => {
                let retry = status.get_details_retry_info();
                println!("{:?}: {} {retry:?}", status.code(), status.message());
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                let delay = retry
                    .and_then(|r| r.retry_delay)
                    .expect("a RetryInfo with a delay");
                delays.push(delay);
            }
        }
    }
    let refills = (started.elapsed().as_millis() / 200) as usize;
    assert_eq!(ok + delays.len(), 7);
    assert!(
        (5..=5 + refills).contains(&ok) && (refills >= 2 || !delays.is_empty()),
        "5 calls pass, 2 are refused ({ok} passed, {refills} refills)"
    );
    // The 6th unit comes back 200 ms after the burst was taken.
    for d in &delays {
        assert!(
            *d > Duration::ZERO && *d <= Duration::from_millis(200),
            "{d:?}"
        );
    }
    // After the delay a call passes again.
    let wait = delays.iter().max().copied().unwrap_or_default();
    tokio::time::sleep(wait).await;
    let reply = client
        .clone()
        .say_hello(HelloRequest {
            name: "again".into(),
        })
        .await?;
    println!("after {wait:?}: {}", reply.get_ref().message);
    println!("selftest ok");
    Ok(())
}

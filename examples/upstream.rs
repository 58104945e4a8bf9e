//! A command-line client for a rate-limited API: `N` GET calls to a URL from `C`
//! concurrent callers, each waiting for what the upstream allows, learned from its
//! answers (`Retry-After`, `RateLimit`/`RateLimit-Policy`, `X-RateLimit-*`).
//!
//! ```sh
//! cargo run --example upstream --features redis,upstream -- \
//!     --url URL --requests N --concurrency C [--redis REDIS_URL] [--limit POLICY]
//! # a local upstream to try it on (tollgate's HTTP layer at 20/s):
//! cargo run --example upstream --features redis,upstream -- --serve 127.0.0.1:8080 [--limit 20/s]
//! # its own upstream at 20/s, 200 calls from 8 callers, checked:
//! TOLLGATE_EXAMPLE_SELFTEST=1 cargo run --example upstream --features redis,upstream
//! ```
//!
//! The stack, outermost first: the upstream limit (partitioned by host; with `--redis`,
//! a `RedisStore` named `upstream-example`, so that every process running this shares
//! the pauses and quotas any of them learns), a retry of `429`/`503` after the time the
//! upstream gave (within a `TpsBudget`), a timeout per attempt, and reqwest. `--limit`
//! adds a limit of your own (`"10/s, 5000/day"`); the tighter of it and what the upstream
//! announces wins.
//!
//! When it ends it prints one line, `sent=N ok=N upstream_429=N refused=N waited_ms=N`:
//! - `sent`: requests sent to the upstream, retries included;
//! - `ok`: calls whose final answer was 2xx;
//! - `upstream_429`: `429` answers the upstream sent, one per attempt;
//! - `refused`: calls the limit did not send (no slot within its `max_wait`);
//! - `waited_ms`: the callers' total time not spent on an attempt: waiting for a slot,
//!   a pause, or a retry's turn (the sum over calls of their duration minus that of
//!   their attempts).
//!
//! Calls that end otherwise (another final status, a network error, a timeout) are
//! counted on a second line, on stderr, and the exit code is then 1. Bad arguments:
//! exit code 2.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::{routing::get, Router};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tokio::time::Instant;
use tollgate::generic::RateLimited;
use tollgate::key::Host;
use tollgate::store::{RedisConnection, RedisStore, Store};
use tollgate::upstream::UpstreamLayer;
use tollgate::RateLimitLayer;
use tower::retry::{budget::TpsBudget, RetryLayer};
use tower::timeout::TimeoutLayer;
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};

const USAGE: &str =
    "usage: upstream --url URL --requests N --concurrency C [--redis REDIS_URL] [--limit POLICY]
       upstream --serve ADDR [--limit POLICY]";

/// What the command line asks for.
enum Command {
    Call(Calls),
    /// Serve a local upstream limited to `limit` (default `20/s`).
    Serve {
        addr: String,
        limit: String,
    },
}

struct Calls {
    url: http::Uri,
    requests: u64,
    concurrency: u64,
    redis: Option<String>,
    limit: Option<String>,
}

/// What the run counted (see the module docs).
#[derive(Default)]
struct Stats {
    sent: AtomicU64,
    ok: AtomicU64,
    upstream_429: AtomicU64,
    refused: AtomicU64,
    calls_us: AtomicU64,
    attempts_us: AtomicU64,
    other: AtomicU64,
    first_other: Mutex<Option<String>>,
}

impl Stats {
    /// Counts a call that ended neither 2xx nor refused, keeping the first one's story.
    fn other(&self, what: String) -> u64 {
        self.first_other.lock().unwrap().get_or_insert(what);
        self.other.fetch_add(1, Relaxed)
    }

    fn line(&self) -> String {
        let waited_us = self.calls_us.load(Relaxed) - self.attempts_us.load(Relaxed);
        format!(
            "sent={} ok={} upstream_429={} refused={} waited_ms={}",
            self.sent.load(Relaxed),
            self.ok.load(Relaxed),
            self.upstream_429.load(Relaxed),
            self.refused.load(Relaxed),
            waited_us / 1000,
        )
    }
}

fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let (mut url, mut requests, mut concurrency) = (None, None, None);
    let (mut redis, mut limit, mut serve) = (None, None, None);
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        let count = |v: String| match v.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{flag} takes a positive whole number, not {v:?}")),
        };
        match flag.as_str() {
            "--url" => url = Some(value()?),
            "--requests" => requests = Some(count(value()?)?),
            "--concurrency" => concurrency = Some(count(value()?)?),
            "--redis" => redis = Some(value()?),
            "--limit" => limit = Some(value()?),
            "--serve" => serve = Some(value()?),
            _ => return Err(format!("unknown argument {flag:?}")),
        }
    }
    if let Some(addr) = serve {
        let limit = limit.unwrap_or_else(|| "20/s".into());
        let _: tollgate::Policy = limit
            .parse()
            .map_err(|e| format!("--limit {limit:?}: {e}"))?;
        return Ok(Command::Serve { addr, limit });
    }
    if let Some(limit) = &limit {
        // Checked here, as the layer will: a bad text, or more than three limits.
        let check = UpstreamLayer::builder().policy(limit.as_str()).build();
        check.map_err(|e| format!("--limit {limit:?}: {e}"))?;
    }
    let url = url.ok_or("--url is required")?;
    let url: http::Uri = url.parse().map_err(|e| format!("--url {url:?}: {e}"))?;
    if !matches!(url.scheme_str(), Some("http" | "https")) || url.authority().is_none() {
        return Err(format!(
            "--url {url}: an http:// or https:// URL with a host"
        ));
    }
    Ok(Command::Call(Calls {
        url,
        requests: requests.ok_or("--requests is required")?,
        concurrency: concurrency.ok_or("--concurrency is required")?,
        redis,
        limit,
    }))
}

#[tokio::main]
async fn main() {
    if std::env::var("TOLLGATE_EXAMPLE_SELFTEST").as_deref() == Ok("1") {
        if let Err(e) = selftest().await {
            eprintln!("selftest failed: {e}");
            std::process::exit(1);
        }
        return;
    }
    let outcome = match parse(std::env::args().skip(1)) {
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            std::process::exit(2);
        }
        Ok(Command::Serve { addr, limit }) => serve(&addr, &limit).await,
        Ok(Command::Call(calls)) => run(calls).await.map(|stats| {
            println!("{}", stats.line());
            report_other(&stats)
        }),
    };
    match outcome {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}

/// Prints the calls that ended neither 2xx nor refused; whether there were none.
fn report_other(stats: &Stats) -> bool {
    let other = stats.other.load(Relaxed);
    if other > 0 {
        let first = stats.first_other.lock().unwrap().take().unwrap_or_default();
        eprintln!("other={other} (the first: {first})");
    }
    other == 0
}

/// Builds the limit (in memory, or on Redis) and runs the calls through it.
async fn run(calls: Calls) -> Result<Arc<Stats>, BoxError> {
    // A call waits up to 30 s for its slot (a pause, a full quota), then is refused.
    let builder = UpstreamLayer::builder().max_wait(Duration::from_secs(30));
    match &calls.redis {
        None => {
            let builder = match &calls.limit {
                Some(limit) => builder.policy(limit.as_str()),
                None => builder,
            };
            drive(builder.build()?, &calls).await
        }
        Some(url) => {
            let connection = RedisConnection::connect(url)
                .await
                .map_err(|e| format!("--redis {url}: {e}"))?;
            // Every process using a store of this name shares what the upstream said. The
            // store's policy is the limit of your own (without --limit, one no API
            // allows, so that only what the upstream says limits the calls).
            let limit = calls.limit.as_deref().unwrap_or("1000000/s");
            let store = RedisStore::builder("upstream-example", limit.parse::<tollgate::Policy>()?)
                .build(connection)?;
            drive(builder.build_with(store)?, &calls).await
        }
    }
}

/// Sends `calls.requests` GETs to `calls.url` through `upstream`, `calls.concurrency` at
/// a time.
async fn drive<St>(upstream: UpstreamLayer<Host, St>, calls: &Calls) -> Result<Arc<Stats>, BoxError>
where
    St: Store<Option<String>>,
{
    let stats = Arc::new(Stats::default());
    let http_client = reqwest::Client::new();
    let http = service_fn(move |req: Request<String>| {
        let http_client = http_client.clone();
        async move {
            let res = http_client.execute(req.try_into()?).await?;
            let (parts, body) = Response::from(res).into_parts();
            let body = body.collect().await?.to_bytes();
            Ok::<_, BoxError>(Response::from_parts(parts, body))
        }
    });
    let per_attempt = Arc::clone(&stats);
    let retries = TpsBudget::new(Duration::from_secs(10), 10, 0.2);
    let client = ServiceBuilder::new()
        .layer(upstream.clone())
        .layer(RetryLayer::new(upstream.retry_policy(retries)))
        // Each attempt (a retry is one more): counted, and timed however it ends.
        .map_future(move |attempt| {
            let stats = Arc::clone(&per_attempt);
            async move {
                let started = Instant::now();
                stats.sent.fetch_add(1, Relaxed);
                let res: Result<Response<Bytes>, BoxError> = attempt.await;
                let took = started.elapsed().as_micros() as u64;
                stats.attempts_us.fetch_add(took, Relaxed);
                if res
                    .as_ref()
                    .is_ok_and(|r| r.status() == StatusCode::TOO_MANY_REQUESTS)
                {
                    stats.upstream_429.fetch_add(1, Relaxed);
                }
                res
            }
        })
        .layer(TimeoutLayer::new(Duration::from_secs(10)))
        .service(http)
        // Boxed for `tokio::spawn`: rustc cannot prove a stack of `BoxError` services'
        // future `Send` otherwise ("implementation of `From` is not general enough").
        .boxed_clone();

    let next = Arc::new(AtomicU64::new(0));
    let mut callers = Vec::new();
    for _ in 0..calls.concurrency.min(calls.requests) {
        let (client, stats, next) = (client.clone(), Arc::clone(&stats), Arc::clone(&next));
        let (url, requests) = (calls.url.clone(), calls.requests);
        callers.push(tokio::spawn(async move {
            while next.fetch_add(1, Relaxed) < requests {
                let started = Instant::now();
                let mut req = Request::new(String::new()); // a GET
                *req.uri_mut() = url.clone();
                let res = client.clone().oneshot(req).await;
                stats
                    .calls_us
                    .fetch_add(started.elapsed().as_micros() as u64, Relaxed);
                match res {
                    Ok(res) if res.status().is_success() => stats.ok.fetch_add(1, Relaxed),
                    Err(e) if e.is::<RateLimited>() => stats.refused.fetch_add(1, Relaxed),
                    Ok(res) => stats.other(format!("status {}", res.status())),
                    Err(e) => stats.other(format!("error: {e}")),
                };
            }
        }));
    }
    for caller in callers {
        caller.await?;
    }
    Ok(stats)
}

/// A local upstream limited by tollgate's HTTP layer to `limit` (one limit for all its
/// clients): every answer carries `RateLimit` and `RateLimit-Policy`, a refusal is a
/// `429` with `Retry-After`.
fn upstream_app(limit: &str) -> Result<Router, tollgate::ConfigError> {
    let limit = RateLimitLayer::builder().policy(limit).build()?;
    Ok(Router::new()
        .route("/", get(|| async { "ok\n" }))
        .layer(limit))
}

async fn serve(addr: &str, limit: &str) -> Result<bool, BoxError> {
    let app = upstream_app(limit)?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "upstream limited to {limit} on http://{}/",
        listener.local_addr()?
    );
    axum::serve(listener, app).await?;
    Ok(true)
}

/// Its own upstream at 20/s: 200 calls from 8 callers all complete, and learning keeps
/// the upstream's 429s to at most 2 (the first 8 calls go before anything is learned);
/// with the answers not read, they are dozens.
async fn selftest() -> Result<(), BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = upstream_app("20/s")?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    let stats = run(Calls {
        url: format!("http://{addr}/").parse()?,
        requests: 200,
        concurrency: 8,
        redis: None,
        limit: None,
    })
    .await?;
    println!("{}", stats.line());
    assert!(report_other(&stats), "every call ends 2xx or refused");
    assert_eq!(stats.ok.load(Relaxed), 200, "every call completes");
    let refusals = stats.upstream_429.load(Relaxed);
    assert!(refusals <= 2, "{refusals} 429s from the upstream");
    println!("selftest ok");
    Ok(())
}

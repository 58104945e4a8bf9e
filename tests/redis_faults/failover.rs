//! Redis as teams deploy it: a primary and a replica behind a name that follows the
//! master, and Redis-backed layers stacked on one route while Redis is out.

use std::time::{Duration, Instant};

use crate::support::redis::{Proxy, RedisServer};
use crate::SERIAL;
use axum::{routing::get, Router};
use http::Request;
use tollgate::decision::Source;
use tollgate::key::HeaderKey;
use tollgate::store::{BreakerState, RedisConnection, RedisStore};
use tollgate::{Limit, Quota, RateLimitLayer};
use tower::ServiceExt;

/// The process's metrics, as a Prometheus exporter renders them (a global recorder: the
/// connections' and breakers' counts happen on the runtime's threads).
#[cfg(feature = "metrics")]
fn metrics() -> String {
    static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
        std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .unwrap()
        })
        .render()
}

/// The sum of the samples of `name` whose labels include `label`.
#[cfg(feature = "metrics")]
fn counted(name: &str, label: &str) -> f64 {
    metrics()
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// A limit no test here reaches: a million a second, bursts of a million.
fn generous() -> Limit {
    let quota = Quota::per_second(1_000_000).unwrap();
    Limit::token_bucket(quota.with_burst(1_000_000).unwrap()).unwrap()
}

/// Waits until `cond` holds, for at most `limit`.
async fn until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Regression: a master demoted with `REPLICAOF` while its clients stay connected (what a
/// DNS name, a Kubernetes Service or a TCP proxy in front of a primary/replica pair does)
/// answered every write `READONLY`; the connection kept calling it, every decision came
/// from the local fallback and the breaker stayed open for as long as it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_master_is_left_for_the_promoted_replica_within_a_second() {
    let _serial = SERIAL.lock().await;
    #[cfg(feature = "metrics")]
    metrics();
    let Some(primary) = RedisServer::start() else {
        return;
    };
    let port = primary.port.to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).unwrap();
    until(Duration::from_secs(10), "the replica syncs", || {
        replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up")
    })
    .await;
    let proxy = Proxy::start(primary.port).await;
    let store = RedisStore::builder("limit", generous())
        .namespace("failover")
        .build(RedisConnection::connect(&proxy.url()).await.unwrap())
        .unwrap();

    // Steady load: one decision every 10 ms, each with its source and when it was made.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let load = {
        let store = store.clone();
        tokio::spawn(async move {
            loop {
                let asked = Instant::now();
                let d = store.check("client", 1).await.unwrap();
                if tx.send((asked, asked.elapsed(), d.source())).is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The failover: the replica promoted, the name pointed at it, the old master demoted
    // under its connected clients.
    let promoted = Instant::now();
    assert!(replica.cli(&["REPLICAOF", "NO", "ONE"]).contains("OK"));
    proxy.point_to(replica.port);
    let replica_port = replica.port.to_string();
    assert!(primary
        .cli(&["REPLICAOF", "127.0.0.1", &replica_port])
        .contains("OK"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    load.abort();

    let mut decisions = Vec::new();
    while let Ok(d) = rx.try_recv() {
        decisions.push(d);
    }
    let before = decisions.iter().filter(|d| d.0 < promoted).count();
    assert!(before > 10, "{before} decisions before the failover");
    assert!(
        decisions
            .iter()
            .filter(|d| d.0 < promoted)
            .all(|d| d.2 == Source::Store),
        "Redis decided before the failover"
    );
    let late: Vec<_> = decisions
        .iter()
        .filter(|d| d.0 >= promoted + Duration::from_secs(1) && d.2 != Source::Store)
        .map(|d| (d.0 - promoted, d.2))
        .collect();
    let first_back = decisions
        .iter()
        .filter(|d| d.0 >= promoted)
        .skip_while(|d| d.2 == Source::Store)
        .find(|d| d.2 == Source::Store)
        .map(|d| d.0 - promoted);
    let slowest = decisions.iter().map(|d| d.1).max().unwrap();
    eprintln!(
        "failover: {} decisions, back on Redis {first_back:?} after the promotion, slowest {slowest:?}",
        decisions.len()
    );
    assert!(
        late.is_empty(),
        "decisions not from Redis a second after the promotion: {late:?}"
    );
    assert!(
        slowest < Duration::from_millis(200),
        "no decision waits past its deadline: {slowest:?}"
    );
    // The new master holds the state: the key's value is there, written since.
    assert_ne!(replica.cli(&["DBSIZE"]).trim(), "0");
    // Counted: the connection replaced for a `READONLY` reply.
    #[cfg(feature = "metrics")]
    assert!(
        counted(
            "tollgate_redis_reconnects_total",
            "tollgate_reason=\"readonly\""
        ) >= 1.0,
        "{}",
        metrics()
    );
}

/// Regression: the breaker of a Redis layer behind another Redis layer never opened
/// during an outage: every call it made was cut short by the request's shared budget, and
/// such calls were not counted as failures. A route behind two Redis layers waited about
/// a deadline per request for the whole outage, and each request sent a command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stacked_layers_open_their_breakers_and_answer_at_once() {
    let _serial = SERIAL.lock().await;
    #[cfg(feature = "metrics")]
    metrics();
    let Some(server) = RedisServer::start() else {
        return;
    };
    let conn = RedisConnection::connect(&server.url()).await.unwrap();
    let store = |namespace: &str| {
        RedisStore::builder("limit", generous())
            .namespace(namespace)
            .build(conn.clone())
            .unwrap()
    };
    let (edge, route) = (store("edge"), store("route"));
    let layer = |store: &RedisStore| {
        RateLimitLayer::builder()
            .key(HeaderKey::new("x-api-key").unwrap())
            .build_with(store.clone())
            .unwrap()
    };
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer(&route))
        .layer(layer(&edge));
    let request = || {
        Request::get("/")
            .header("x-api-key", "client")
            .body(axum::body::Body::empty())
            .unwrap()
    };
    for _ in 0..5 {
        assert_eq!(app.clone().oneshot(request()).await.unwrap().status(), 200);
    }
    let commands_before = server.settled_script_calls();

    server.stop();
    let stopped = Instant::now();
    let mut both_open = None;
    let mut after_open = Vec::new();
    while stopped.elapsed() < Duration::from_secs(3) {
        let asked = Instant::now();
        let response = app.clone().oneshot(request()).await.unwrap();
        let took = asked.elapsed();
        assert_eq!(response.status(), 200, "the fallbacks admit");
        if both_open.is_some() {
            after_open.push(took);
        } else if edge.breaker_state() != BreakerState::Closed
            && route.breaker_state() != BreakerState::Closed
        {
            both_open = Some(stopped.elapsed());
        }
    }
    let outage = stopped.elapsed();
    server.cont();
    let sent = server.settled_script_calls() - commands_before;

    let opened = both_open.expect("both breakers open during the outage");
    // Each breaker probes once per cooldown (500 ms): only a probing request waits for
    // Redis (a deadline, 20 ms).
    let probes = 2 * (outage.as_millis() / 500 + 1) as usize;
    after_open.sort();
    let n = after_open.len();
    let (p50, p99) = (after_open[n / 2], after_open[n * 99 / 100]);
    let waited = after_open
        .iter()
        .filter(|t| **t >= Duration::from_millis(10))
        .count();
    eprintln!(
        "stacked: both open after {opened:?}; {n} requests since, p50 {p50:?}, p99 {p99:?}, \
         {waited} waited 10 ms or more; {sent} commands sent over a {outage:?} outage"
    );
    assert!(
        opened < Duration::from_secs(1),
        "both open within 1 s: {opened:?}"
    );
    assert!(n > 100, "{n} requests after the breakers opened");
    assert!(
        p99 < Duration::from_millis(2),
        "p99 {p99:?} after both breakers opened"
    );
    assert!(
        waited <= probes,
        "{waited} requests waited for Redis after both breakers opened (probes: {probes})"
    );
    #[cfg(feature = "metrics")]
    for store in ["edge", "route"] {
        let label = format!("tollgate_store=\"{store}\"");
        let opened = counted("tollgate_store_breaker_openings_total", &label);
        assert!(opened >= 1.0, "{store}: {}", metrics());
    }
    assert!(
        sent <= 6 + probes as u64,
        "{sent} commands reached Redis (3 failures per breaker, then {probes} probes)"
    );
}

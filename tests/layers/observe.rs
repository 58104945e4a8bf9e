//! What the crate promises to observe (src/observe.rs): the metrics' names, attributes and
//! exact values computed from the decisions made, and the `tracing` events of refusals,
//! shadow would-be refusals and store failures. Stores run on a frozen `ManualClock` (or
//! paused tokio time) so that nothing refills while a test runs.
//!
//! Metrics are read from a `metrics_util` `DebuggingRecorder` set as the thread's local
//! recorder while a layer or store is built: the handles registered then keep pointing at
//! it; or for the whole test, for the series registered at their first use. A snapshot
//! resets counters and gauges, so each test takes one, at its end.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::{Events, FailingStore};
use axum::{body::Body, routing::get, Router};
use http::{Request, StatusCode};
use tollgate::clock::ManualClock;
use tollgate::decision::{Outcome, Source};
use tollgate::error::StoreError;
use tollgate::key::{Global, HeaderBytes, HeaderKey, RequestHead};
use tollgate::store::OnStoreError;
use tollgate::store::{MemoryStore, Store, StoreFuture};
use tollgate::Decision;
use tollgate::Policy;
use tollgate::RateLimitLayer;
use tower::ServiceExt;

/// A realistic "now" for the manual clocks (frozen unless a test moves them).
const NOW: Duration = Duration::from_secs(1_700_000_000);

/// The route events name: the matched route with axum's `MatchedPath` (feature `axum`),
/// else the path.
const ROUTE: &str = if cfg!(feature = "axum") {
    " route=\"/items/{id}\""
} else {
    " route=\"/items/"
};

/// The raw keys of the plans tests: they must never appear in events.
const FREE_KEY: &str = "free_s3cret-alice";
const PRO_KEY: &str = "pro_s3cret-bob";

/// `GET /items/{id}` behind a layer labelled `label` with two named policies, `free`
/// (3/min) and `pro` (5/min, for keys starting with `pro_`), keyed by `x-key`, on a store
/// whose clock never moves.
fn plans_app(label: &str) -> Router {
    let store = MemoryStore::<Option<HeaderBytes>, _>::new("1/s".parse::<Policy>().unwrap())
        .with_clock(ManualClock::at(NOW));
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::new("x-key").unwrap())
        .named_policy("free", "3/min")
        .named_policy("pro", "5/min")
        .select(|_: &RequestHead<'_>, key: Option<&HeaderBytes>| match key {
            Some(k) if k.starts_with(b"pro_") => "pro",
            _ => "free",
        })
        .label(label)
        .build_with(store)
        .unwrap();
    Router::new()
        .route("/items/{id}", get(|| async { "ok" }))
        .layer(layer)
}

/// One request to `app`, with `x-key: key` when given; its status.
async fn send(app: &Router, path: &str, key: Option<&str>) -> StatusCode {
    let mut req = Request::get(path);
    if let Some(key) = key {
        req = req.header("x-key", key);
    }
    let resp = app
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    resp.status()
}

/// `n` requests with `key`: how many were admitted (200) and refused (429).
async fn burst(app: &Router, key: &str, n: usize) -> (u64, u64) {
    let (mut ok, mut refused) = (0, 0);
    for i in 0..n {
        match send(app, &format!("/items/{i}"), Some(key)).await {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    (ok, refused)
}

/// A store that answers every call with the same decision, made without its backend:
/// what the Redis store's failure policy and negative cache return.
struct Degraded {
    outcome: Outcome,
    source: Source,
}

impl Store<Option<()>> for Degraded {
    fn default_policy(&self) -> Option<Policy> {
        Some("1/s".parse().unwrap())
    }
    fn decide(&self, _: &Option<()>, _: &Policy, _: u64) -> StoreFuture<Decision> {
        StoreFuture::ready(Ok(Decision::without_state(self.outcome, self.source, 1)))
    }
    fn preview(&self, key: &Option<()>, policy: &Policy, cost: u64) -> StoreFuture<Decision> {
        self.decide(key, policy, cost)
    }
    fn refund(&self, _: &Option<()>, _: &Policy, _: u64) {}
    fn settle(&self, _: &Option<()>, _: &Policy, _: u64, _: u64) -> StoreFuture<()> {
        StoreFuture::ready(Err(StoreError::backend("connection refused")))
    }
    fn reset(&self, _: &Option<()>) -> StoreFuture<()> {
        StoreFuture::ready(Err(StoreError::backend("connection refused")))
    }
    fn ban(&self, _: &Option<()>, _: &Policy, _: Duration) -> StoreFuture<()> {
        StoreFuture::ready(Err(StoreError::backend("connection refused")))
    }
}

/// `GET /` behind a global layer labelled `label` on `store`.
fn app_on<St: Store<Option<()>>>(label: &str, store: St, on_error: OnStoreError) -> Router {
    let layer = RateLimitLayer::builder()
        .key(Global::new())
        .label(label)
        .on_store_error(on_error)
        .build_with(store)
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// The lines of target `tollgate` at `level`.
fn tollgate_at(events: &Events, level: &str) -> Vec<String> {
    events
        .at(level)
        .into_iter()
        .filter(|l| l.starts_with(&format!("{level} tollgate:")))
        .collect()
}

/// The value of the `key` field of an event line: it must be 16 hex digits.
fn key_field(line: &str) -> String {
    let at = line
        .find(" key=")
        .unwrap_or_else(|| panic!("no key field: {line}"));
    let value: String = line[at + 5..]
        .chars()
        .take_while(|c| !c.is_whitespace())
        .collect();
    assert!(
        value.len() == 16 && value.chars().all(|c| c.is_ascii_hexdigit()),
        "the key field is not a 64-bit hash: {line}"
    );
    value
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Five requests to a fresh `app()` within one wall-clock second (the warnings are per
/// second), each answered `status`: the events they logged. Retried on a new app when a
/// second boundary fell inside the burst.
async fn five_within_one_second(app: impl Fn() -> Router, status: StatusCode) -> Events {
    for _ in 0..3 {
        at_start_of_a_second();
        let app = app();
        let (events, guard) = Events::capture();
        let before = unix_secs();
        for _ in 0..5 {
            assert_eq!(send(&app, "/", None).await, status);
        }
        let after = unix_secs();
        drop(guard);
        if before == after {
            return events;
        }
    }
    panic!("could not run 5 requests within one second");
}

/// Sleeps, if needed, until the wall clock is in the first half of a second, so that a
/// short burst of failures happens within one second.
fn at_start_of_a_second() {
    let sub = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    if sub > 400_000_000 {
        std::thread::sleep(Duration::from_nanos(
            u64::from(1_000_000_000 - sub) + 1_000_000,
        ));
    }
}

// ---------------------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------------------

#[cfg(feature = "metrics")]
mod recorded {
    use std::collections::BTreeMap;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

    pub(crate) type Labels = BTreeMap<String, String>;

    pub(crate) fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A recorder for one test.
    pub(crate) struct Recorder {
        recorder: DebuggingRecorder,
        snapshotter: Snapshotter,
    }

    impl Recorder {
        pub(crate) fn new() -> Self {
            let recorder = DebuggingRecorder::new();
            let snapshotter = recorder.snapshotter();
            Recorder {
                recorder,
                snapshotter,
            }
        }

        /// Runs `f` (building a layer or a store) with this recorder as the thread's.
        pub(crate) fn scope<T>(&self, f: impl FnOnce() -> T) -> T {
            metrics::with_local_recorder(&self.recorder, f)
        }

        /// This recorder as the thread's until the guard drops: for handles registered at
        /// their first use (a test on tokio's current-thread runtime runs on this thread).
        pub(crate) fn in_force(&self) -> metrics::LocalRecorderGuard<'_> {
            metrics::set_default_local_recorder(&self.recorder)
        }

        /// Every series recorded so far (this resets counters and gauges).
        pub(crate) fn snapshot(&self) -> Snap {
            Snap(
                self.snapshotter
                    .snapshot()
                    .into_vec()
                    .into_iter()
                    .map(|(ck, _, _, value)| {
                        let key = ck.key();
                        let labels = key
                            .labels()
                            .map(|l| (l.key().to_owned(), l.value().to_owned()))
                            .collect();
                        (key.name().to_owned(), labels, value)
                    })
                    .collect(),
            )
        }
    }

    pub(crate) struct Snap(Vec<(String, Labels, DebugValue)>);

    impl Snap {
        /// Every series: its name and attributes.
        pub(crate) fn series(&self) -> impl Iterator<Item = (&str, &Labels)> {
            self.0.iter().map(|(n, l, _)| (n.as_str(), l))
        }

        /// The one series of `name` with exactly these attributes.
        fn find(&self, name: &str, pairs: &[(&str, &str)]) -> &DebugValue {
            let want = labels(pairs);
            let found: Vec<_> = self
                .0
                .iter()
                .filter(|(n, l, _)| n == name && *l == want)
                .collect();
            match found.as_slice() {
                [one] => &one.2,
                _ => panic!(
                    "{} series {name} {want:?}; recorded: {:#?}",
                    found.len(),
                    self.0
                        .iter()
                        .filter(|(n, _, _)| n == name)
                        .collect::<Vec<_>>()
                ),
            }
        }

        pub(crate) fn counter(&self, name: &str, pairs: &[(&str, &str)]) -> u64 {
            match self.find(name, pairs) {
                DebugValue::Counter(n) => *n,
                other => panic!("{name} is not a counter: {other:?}"),
            }
        }

        pub(crate) fn gauge(&self, name: &str, pairs: &[(&str, &str)]) -> f64 {
            match self.find(name, pairs) {
                DebugValue::Gauge(v) => v.0,
                other => panic!("{name} is not a gauge: {other:?}"),
            }
        }

        pub(crate) fn histogram(&self, name: &str, pairs: &[(&str, &str)]) -> Vec<f64> {
            match self.find(name, pairs) {
                DebugValue::Histogram(v) => v.iter().map(|x| x.0).collect(),
                other => panic!("{name} is not a histogram: {other:?}"),
            }
        }

        /// Every counter series of `name` whose attributes include `having`.
        pub(crate) fn counters(
            &self,
            name: &str,
            having: &[(&str, &str)],
        ) -> BTreeMap<Labels, u64> {
            self.0
                .iter()
                .filter(|(n, l, _)| {
                    n == name
                        && having
                            .iter()
                            .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
                })
                .map(|(_, l, v)| match v {
                    DebugValue::Counter(n) => (l.clone(), *n),
                    other => panic!("{name} is not a counter: {other:?}"),
                })
                .collect()
        }
    }
}

#[cfg(feature = "metrics")]
use recorded::{labels, Recorder};

#[cfg(feature = "metrics")]
const REQUESTS: &str = "tollgate.rate_limit.requests_total";
#[cfg(feature = "metrics")]
const IN_QUEUE: &str = "tollgate.rate_limit.request.time_in_queue_seconds";
#[cfg(feature = "metrics")]
const DEGRADED: &str = "tollgate.rate_limit.degraded_decisions_total";
#[cfg(feature = "metrics")]
const KEYS: &str = "tollgate.store.keys";
#[cfg(feature = "metrics")]
const EVICTIONS: &str = "tollgate.store.evictions_total";

/// The four `tollgate.rate_limit.requests_total` series of one policy, by result.
#[cfg(feature = "metrics")]
fn requests_of(
    limiter: &str,
    policy: &str,
    [admitted, delayed, refused, shadow_refused]: [u64; 4],
) -> Vec<(recorded::Labels, u64)> {
    [
        ("admitted", admitted),
        ("delayed", delayed),
        ("refused", refused),
        ("shadow_refused", shadow_refused),
    ]
    .into_iter()
    .map(|(result, n)| {
        (
            labels(&[
                ("tollgate.limiter", limiter),
                ("tollgate.policy", policy),
                ("tollgate.result", result),
            ]),
            n,
        )
    })
    .collect()
}

/// The `tollgate.rate_limit.degraded_decisions_total` series of a limiter, by source: those
/// counted at least once (each is registered at its first count).
#[cfg(feature = "metrics")]
fn degraded_of(
    limiter: &str,
    [negative_cache, fallback, fail_open, fail_closed]: [u64; 4],
) -> std::collections::BTreeMap<recorded::Labels, u64> {
    [
        ("negative_cache", negative_cache),
        ("fallback", fallback),
        ("fail_open", fail_open),
        ("fail_closed", fail_closed),
    ]
    .into_iter()
    .filter(|&(_, n)| n > 0)
    .map(|(source, n)| {
        (
            labels(&[("tollgate.limiter", limiter), ("tollgate.source", source)]),
            n,
        )
    })
    .collect()
}

/// The policy guide: a swap of a layer's policies is logged at `INFO`, with the layer's
/// label; a swap refused is not logged as one.
#[tokio::test]
async fn a_policy_swap_is_logged_at_info() {
    let (events, _guard) = Events::capture();
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::new("x-key").unwrap())
        .policy("1/s")
        .label("plans-layer")
        .build()
        .unwrap();
    let handle = layer.policy_handle();
    assert!(handle.swap_text("2/fortnight").is_err());
    assert_eq!(tollgate_at(&events, "INFO"), Vec::<String>::new());
    handle.swap_text("2/s").unwrap();
    let info = tollgate_at(&events, "INFO");
    assert_eq!(info.len(), 1, "{info:?}");
    assert!(info[0].contains("policies swapped"), "{info:?}");
    assert!(info[0].contains("plans-layer"), "{info:?}");
}

/// A set of more than 64 policies (a policy per tenant) registers a policy's series at its
/// first decision, the fallback's when the set is installed: the recorder does not hold
/// seven series for every tenant up front. A set of up to 64 registers all at once (the
/// test above).
#[cfg(feature = "metrics")]
#[tokio::test]
async fn a_large_set_registers_a_policys_series_at_its_first_decision() {
    let rec = Recorder::new();
    let _in_force = rec.in_force();
    let text: String = (0..100).map(|i| format!("t{i} = 10/min\n")).collect();
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::new("x-key").unwrap())
        .policies(tollgate::policy::PolicySet::from_text(&text).unwrap())
        .select(|_: &RequestHead<'_>, key: Option<&HeaderBytes>| {
            key.map(|k| String::from_utf8_lossy(k).into_owned())
                .unwrap_or_default()
        })
        .label("tenants")
        .build()
        .unwrap();
    let app = Router::new()
        .route("/items/{id}", get(|| async { "ok" }))
        .layer(layer);
    let policies = |snap: &recorded::Snap| {
        snap.counters(REQUESTS, &[("tollgate.limiter", "tenants")])
            .keys()
            .map(|l| l["tollgate.policy"].clone())
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(policies(&rec.snapshot()), ["t0".to_owned()].into());
    assert_eq!(send(&app, "/items/1", Some("t42")).await, StatusCode::OK);
    let snap = rec.snapshot();
    assert_eq!(policies(&snap), ["t0".to_owned(), "t42".to_owned()].into());
    let t42 = [
        ("tollgate.limiter", "tenants"),
        ("tollgate.policy", "t42"),
        ("tollgate.result", "admitted"),
    ];
    assert_eq!(snap.counter(REQUESTS, &t42), 1);
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn requests_are_counted_per_policy_and_result_under_the_layer_label() {
    let rec = Recorder::new();
    let app = rec.scope(|| plans_app("edge"));
    // Requests are made outside the recorder's scope: the handles were registered inside.
    let free = burst(&app, FREE_KEY, 10).await;
    let pro = burst(&app, PRO_KEY, 10).await;
    // 3/min and 5/min on a frozen clock: exactly the quota is admitted.
    assert_eq!(free, (3, 7));
    assert_eq!(pro, (5, 5));

    let snap = rec.snapshot();
    let expected: std::collections::BTreeMap<_, _> = requests_of("edge", "free", [3, 0, 7, 0])
        .into_iter()
        .chain(requests_of("edge", "pro", [5, 0, 5, 0]))
        .collect();
    assert_eq!(snap.counters(REQUESTS, &[]), expected);
    // Nothing degraded: the memory store decided every request.
    assert_eq!(snap.counters(DEGRADED, &[]), degraded_of("edge", [0; 4]));
    assert!(snap
        .histogram(
            IN_QUEUE,
            &[("tollgate.limiter", "edge"), ("tollgate.policy", "free")]
        )
        .is_empty());
}

#[cfg(feature = "metrics")]
#[tokio::test(start_paused = true)]
async fn queued_requests_are_counted_as_delayed_with_their_exact_time_in_queue() {
    use http::Response;
    use std::convert::Infallible;
    use tower::{Service, ServiceBuilder};

    let rec = Recorder::new();
    // 10/s (one slot every 100 ms), a queue of 5; the default label and an unnamed policy.
    let layer = rec.scope(|| {
        RateLimitLayer::builder()
            .policy("queue 10/s 5")
            .build()
            .unwrap()
    });
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) });
    let start = tokio::time::Instant::now();
    let mut futures = Vec::new();
    for _ in 0..8 {
        let mut svc = svc.clone();
        futures.push(svc.ready().await.unwrap().call(Request::new(Body::empty())));
    }
    let mut got = Vec::new();
    for f in futures {
        let r = f.await.unwrap();
        got.push((r.status().as_u16(), start.elapsed()));
    }
    // 1 at once, 5 queued at 100 ms spacing, 2 overflowing the queue.
    let served: Vec<_> = got.iter().filter(|g| g.0 == 200).map(|g| g.1).collect();
    assert_eq!(
        served,
        (0..6)
            .map(|i| Duration::from_millis(100 * i))
            .collect::<Vec<_>>()
    );
    assert_eq!(got.iter().filter(|g| g.0 == 429).count(), 2);

    let snap = rec.snapshot();
    let expected: std::collections::BTreeMap<_, _> =
        requests_of("tollgate", "default", [1, 5, 2, 0])
            .into_iter()
            .collect();
    assert_eq!(snap.counters(REQUESTS, &[]), expected);
    let waits: Vec<f64> = (1..=5)
        .map(|i| Duration::from_millis(100 * i).as_secs_f64())
        .collect();
    assert_eq!(
        snap.histogram(
            IN_QUEUE,
            &[
                ("tollgate.limiter", "tollgate"),
                ("tollgate.policy", "default")
            ]
        ),
        waits
    );
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn shadow_would_be_refusals_are_counted_as_shadow_refused_and_let_through() {
    let rec = Recorder::new();
    let app = rec.scope(|| {
        let store = MemoryStore::<Option<HeaderBytes>, _>::new("1/s".parse::<Policy>().unwrap())
            .with_clock(ManualClock::at(NOW));
        let layer = RateLimitLayer::builder()
            .key(HeaderKey::new("x-key").unwrap())
            .policy("5/s shadow")
            .label("rollout")
            .build_with(store)
            .unwrap();
        Router::new()
            .route("/items/{id}", get(|| async { "ok" }))
            .layer(layer)
    });
    assert_eq!(
        burst(&app, "k", 8).await,
        (8, 0),
        "a shadow limit refuses nothing"
    );

    let snap = rec.snapshot();
    let expected: std::collections::BTreeMap<_, _> =
        requests_of("rollout", "default", [5, 0, 0, 3])
            .into_iter()
            .collect();
    assert_eq!(snap.counters(REQUESTS, &[]), expected);
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn swapped_policies_are_counted_under_their_new_names() {
    let rec = Recorder::new();
    let (layer, app) = rec.scope(|| {
        let store = MemoryStore::<Option<HeaderBytes>, _>::new("1/s".parse::<Policy>().unwrap())
            .with_clock(ManualClock::at(NOW));
        let layer = RateLimitLayer::builder()
            .key(HeaderKey::new("x-key").unwrap())
            .named_policy("old", "2/min")
            .label("swap")
            .build_with(store)
            .unwrap();
        let app = Router::new()
            .route("/items/{id}", get(|| async { "ok" }))
            .layer(layer.clone());
        (layer, app)
    });
    assert_eq!(burst(&app, "a", 3).await, (2, 1));
    rec.scope(|| layer.policy_handle().swap_text("new = 3/min").unwrap());
    // A key never seen, so that no state carries over from the old policy.
    assert_eq!(burst(&app, "b", 5).await, (3, 2));

    let snap = rec.snapshot();
    let expected: std::collections::BTreeMap<_, _> = requests_of("swap", "old", [2, 0, 1, 0])
        .into_iter()
        .chain(requests_of("swap", "new", [3, 0, 2, 0]))
        .collect();
    assert_eq!(snap.counters(REQUESTS, &[]), expected);
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn the_generic_layer_counts_its_decisions_under_its_label() {
    use tollgate::{generic, key::key_fn};
    use tower::BoxError;
    use tower::{Service, ServiceBuilder};

    let rec = Recorder::new();
    let layer = rec.scope(|| {
        let store = MemoryStore::<Option<u32>, _>::new("1/s".parse::<Policy>().unwrap())
            .with_clock(ManualClock::at(NOW));
        generic::RateLimitLayer::builder()
            .key(key_fn(|tenant: &u32| Some(*tenant)))
            .policy("2/min")
            .label("jobs")
            .build_with::<u32, _>(store)
            .unwrap()
    });
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|n: u32| async move { Ok::<_, BoxError>(n) });
    let (events, _guard) = Events::capture();
    let mut refused = 0;
    for tenant in [1, 1, 1, 2, 2, 2, 2] {
        match svc.ready().await.unwrap().call(tenant).await {
            Ok(_) => {}
            Err(e) if e.downcast_ref::<generic::RateLimited>().is_some() => refused += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(refused, 3);

    let snap = rec.snapshot();
    let expected: std::collections::BTreeMap<_, _> = requests_of("jobs", "default", [4, 0, 3, 0])
        .into_iter()
        .collect();
    assert_eq!(snap.counters(REQUESTS, &[]), expected);
    // One refusal event each, under the label, 2/min: 30 s to the next unit.
    let info = tollgate_at(&events, "INFO");
    assert_eq!(info.len(), 3, "{info:#?}");
    for line in &info {
        assert!(line.contains(" limiter=jobs"), "{line}");
        assert!(line.contains(" policy=\"default\""), "{line}");
        assert!(line.contains(" retry_after_ms=30000"), "{line}");
    }
}

#[cfg(feature = "metrics")]
#[tokio::test(start_paused = true)]
async fn the_store_keys_gauge_counts_the_keys_held_under_the_layer_label() {
    let rec = Recorder::new();
    // `build` makes a memory store on tokio's clock (paused here), named after the layer.
    let layer = rec.scope(|| {
        RateLimitLayer::builder()
            .key(HeaderKey::new("x-key").unwrap())
            .policy("5/min")
            .label("api")
            .build()
            .unwrap()
    });
    let app = Router::new()
        .route("/items/{id}", get(|| async { "ok" }))
        .layer(layer.clone());
    assert_eq!(burst(&app, "k1", 7).await, (5, 2));
    assert_eq!(burst(&app, "k2", 2).await, (2, 0));
    assert_eq!(burst(&app, "k3", 1).await, (1, 0));
    assert_eq!(layer.store().len(), 3);

    let snap = rec.snapshot();
    assert_eq!(snap.gauge(KEYS, &[("tollgate.store", "api")]), 3.0);
    assert_eq!(
        snap.counters(EVICTIONS, &[("tollgate.store", "api")]),
        [("fresh", 0), ("with_state", 0)]
            .into_iter()
            .map(|(s, n)| (
                labels(&[("tollgate.store", "api"), ("tollgate.state", s)]),
                n
            ))
            .collect()
    );
}

#[cfg(feature = "metrics")]
#[test]
fn evictions_are_counted_with_state_over_budget_and_fresh_once_back_to_fresh() {
    let rec = Recorder::new();
    let clock = ManualClock::at(NOW);
    // 1/min: every key checked once carries state for a minute. A 4 KiB budget: one
    // shard holding a few dozen keys.
    let store = rec.scope(|| {
        MemoryStore::<u64, _>::new("1/min".parse::<Policy>().unwrap())
            .with_clock(clock.clone())
            .with_label("tiny")
            .with_max_bytes(4096)
            .unwrap()
    });
    let inserted = 3 * store.max_keys() as u64 + 7;
    for k in 0..inserted {
        assert!(store.check(&k, 1).is_allowed(), "key {k}");
    }
    // The clock has not moved: every key evicted so far still carried state.
    let held = store.len() as u64;
    assert!(held > 0 && held <= store.max_keys() as u64, "held {held}");
    let with_state = inserted - held;
    assert!(with_state > 0);
    assert_eq!(store.stats().evicted_with_state, with_state);

    // A minute later every key held is back to fresh; a sweep forgets them all.
    clock.advance(Duration::from_secs(60));
    store.sweep();
    assert_eq!(store.len(), 0);

    let snap = rec.snapshot();
    let state = |s| [("tollgate.store", "tiny"), ("tollgate.state", s)];
    assert_eq!(snap.counter(EVICTIONS, &state("with_state")), with_state);
    assert_eq!(snap.counter(EVICTIONS, &state("fresh")), held);
    // Every insert counted, every eviction taken off: nothing is held.
    assert_eq!(snap.gauge(KEYS, &[("tollgate.store", "tiny")]), 0.0);
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn fail_closed_store_errors_are_counted_as_degraded_decisions() {
    let rec = Recorder::new();
    let _in_force = rec.in_force();
    let app = app_on("closed", FailingStore, OnStoreError::FailClosed);
    for _ in 0..6 {
        assert_eq!(send(&app, "/", None).await, StatusCode::SERVICE_UNAVAILABLE);
    }
    let snap = rec.snapshot();
    assert_eq!(
        snap.counters(DEGRADED, &[]),
        degraded_of("closed", [0, 0, 0, 6])
    );
    // A failed request is no decision of the policy's.
    let expected: std::collections::BTreeMap<_, _> = requests_of("closed", "default", [0; 4])
        .into_iter()
        .collect();
    assert_eq!(snap.counters(REQUESTS, &[]), expected);
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn fail_open_store_errors_are_counted_once_as_degraded_decisions() {
    let rec = Recorder::new();
    let _in_force = rec.in_force();
    // Fail open is the default.
    let app = app_on("open", FailingStore, OnStoreError::default());
    for _ in 0..6 {
        assert_eq!(send(&app, "/", None).await, StatusCode::OK);
    }
    let snap = rec.snapshot();
    assert_eq!(
        snap.counters(DEGRADED, &[]),
        degraded_of("open", [0, 0, 6, 0])
    );
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn admitting_decisions_a_store_made_without_its_backend_are_counted_by_source() {
    let admitted = Outcome::Allowed {
        wait: Duration::ZERO,
    };
    for (source, counts) in [
        (Source::Fallback, [0, 4, 0, 0]),
        (Source::FailOpen, [0, 0, 4, 0]),
    ] {
        let rec = Recorder::new();
        let store = Degraded {
            outcome: admitted,
            source,
        };
        let _in_force = rec.in_force();
        let app = app_on("redis", store, OnStoreError::default());
        for _ in 0..4 {
            assert_eq!(send(&app, "/", None).await, StatusCode::OK, "{source:?}");
        }
        let snap = rec.snapshot();
        assert_eq!(
            snap.counters(DEGRADED, &[]),
            degraded_of("redis", counts),
            "{source:?}"
        );
    }
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn refusing_decisions_a_store_made_without_its_backend_are_counted_by_source() {
    let refused = Outcome::Denied {
        retry_after: Duration::from_secs(1),
    };
    for (source, counts) in [
        (Source::FailClosed, [0, 0, 0, 4]),
        (Source::NegativeCache, [4, 0, 0, 0]),
    ] {
        let rec = Recorder::new();
        let store = Degraded {
            outcome: refused,
            source,
        };
        let _in_force = rec.in_force();
        let app = app_on("redis", store, OnStoreError::default());
        for _ in 0..4 {
            assert_eq!(
                send(&app, "/", None).await,
                StatusCode::TOO_MANY_REQUESTS,
                "{source:?}"
            );
        }
        let snap = rec.snapshot();
        assert_eq!(
            snap.counters(DEGRADED, &[]),
            degraded_of("redis", counts),
            "{source:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn each_refusal_logs_one_info_event_with_label_policy_route_key_hash_and_retry_after() {
    let app = plans_app("edge");
    let (events, _guard) = Events::capture();
    assert_eq!(burst(&app, FREE_KEY, 10).await, (3, 7));
    assert_eq!(burst(&app, PRO_KEY, 10).await, (5, 5));

    let info = tollgate_at(&events, "INFO");
    assert_eq!(info.len(), 12, "one event per refusal: {info:#?}");
    let (free, pro): (Vec<_>, Vec<_>) = info.iter().partition(|l| l.contains(" policy=\"free\""));
    assert_eq!((free.len(), pro.len()), (7, 5), "{info:#?}");
    // Refusals charge nothing and the clock is frozen: 3/min (free) waits 60 s / 3 for its
    // next unit, 5/min (pro) 60 s / 5.
    for (lines, policy, retry_ms) in [(&free, "free", 20_000), (&pro, "pro", 12_000)] {
        for line in lines {
            assert!(line.contains("rate limit refused a request"), "{line}");
            assert!(line.contains(" limiter=edge"), "{line}");
            assert!(line.contains(&format!(" policy=\"{policy}\"")), "{line}");
            assert!(line.contains(ROUTE), "the matched route: {line}");
            assert!(
                line.contains(&format!(" retry_after_ms={retry_ms}")),
                "{line}"
            );
            // One field for one fact: the wait is said once, in ms.
            assert_eq!(line.matches("retry_after").count(), 1, "{line}");
            assert!(line.contains(" outcome=\"denied\""), "{line}");
        }
    }
    // The key appears as a hash: the same for every event of a key, distinct across keys.
    let free_hashes: std::collections::BTreeSet<_> = free.iter().map(|l| key_field(l)).collect();
    let pro_hashes: std::collections::BTreeSet<_> = pro.iter().map(|l| key_field(l)).collect();
    assert_eq!(free_hashes.len(), 1, "{free:#?}");
    assert_eq!(pro_hashes.len(), 1, "{pro:#?}");
    assert_ne!(free_hashes, pro_hashes);
    // ...and never as it is, in any event.
    for line in events.lines() {
        for raw in [FREE_KEY, PRO_KEY, "s3cret"] {
            assert!(!line.contains(raw), "raw key in an event: {line}");
        }
    }
}

/// Regression: a refusal logged its wait twice (`retry_after_ms=19998` and
/// `outcome=Denied { retry_after: 19.998129122s }`); a cost no limit can ever admit has no
/// wait, and says so once.
#[tokio::test]
async fn a_refusal_of_a_cost_that_can_never_pass_logs_outcome_exceeds_and_no_wait() {
    let store = MemoryStore::<Option<()>, _>::new("1/s".parse::<Policy>().unwrap())
        .with_clock(ManualClock::at(NOW));
    let layer = RateLimitLayer::builder()
        .key(Global::new())
        .policy("5/s")
        .cost(|_: &Request<Body>| 6)
        .label("big")
        .build_with(store)
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let (events, _guard) = Events::capture();
    assert_eq!(send(&app, "/", None).await, StatusCode::TOO_MANY_REQUESTS);
    let info = tollgate_at(&events, "INFO");
    assert_eq!(info.len(), 1, "{info:#?}");
    assert!(info[0].contains(" outcome=\"exceeds\""), "{}", info[0]);
    assert!(!info[0].contains("retry_after"), "{}", info[0]);
}

#[tokio::test]
async fn shadow_would_be_refusals_log_an_info_event_marked_shadow() {
    let store = MemoryStore::<Option<HeaderBytes>, _>::new("1/s".parse::<Policy>().unwrap())
        .with_clock(ManualClock::at(NOW));
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::new("x-key").unwrap())
        .policy("5/s shadow")
        .label("rollout")
        .build_with(store)
        .unwrap();
    let app = Router::new()
        .route("/items/{id}", get(|| async { "ok" }))
        .layer(layer);
    let (events, _guard) = Events::capture();
    assert_eq!(burst(&app, "tenant-7", 8).await, (8, 0));

    let info = tollgate_at(&events, "INFO");
    assert_eq!(info.len(), 3, "one event per would-be refusal: {info:#?}");
    for line in &info {
        assert!(
            line.contains("a shadow rate limit would have refused this request"),
            "{line}"
        );
        assert!(!line.contains("rate limit refused a request"), "{line}");
        assert!(line.contains(" limiter=rollout"), "{line}");
        assert!(line.contains(" policy=\"default\""), "{line}");
        assert!(line.contains(ROUTE), "{line}");
        // 5/s: 200 ms to the next unit.
        assert!(line.contains(" retry_after_ms=200"), "{line}");
        key_field(line);
        assert!(!line.contains("tenant-7"), "{line}");
    }
}

#[tokio::test]
async fn store_failures_warn_once_a_second_and_log_the_others_at_debug() {
    let events = five_within_one_second(
        || app_on("edge", FailingStore, OnStoreError::FailClosed),
        StatusCode::SERVICE_UNAVAILABLE,
    )
    .await;
    let warn = tollgate_at(&events, "WARN");
    let debug = tollgate_at(&events, "DEBUG");
    assert_eq!(warn.len(), 1, "{warn:#?}");
    assert_eq!(debug.len(), 4, "{debug:#?}");
    for line in warn.iter().chain(&debug) {
        assert!(line.contains("rate-limit store failed"), "{line}");
        assert!(line.contains(" limiter=edge"), "{line}");
        assert!(line.contains(" policy=\"default\""), "{line}");
        assert!(line.contains(" route=\"/\""), "{line}");
        assert!(line.contains("connection refused"), "the error: {line}");
        assert!(line.contains(" then=FailClosed"), "{line}");
    }
    assert!(tollgate_at(&events, "INFO").is_empty());
}

#[tokio::test]
async fn fail_open_logs_each_store_failure_once() {
    let events = five_within_one_second(
        || app_on("edge", FailingStore, OnStoreError::FailOpen),
        StatusCode::OK,
    )
    .await;
    let warn = tollgate_at(&events, "WARN");
    let debug = tollgate_at(&events, "DEBUG");
    assert_eq!(warn.len(), 1, "{warn:#?}");
    assert_eq!(debug.len(), 4, "one event per failure: {debug:#?}");
    for line in warn.iter().chain(&debug) {
        assert!(line.contains(" then=FailOpen"), "{line}");
    }
}

#[tokio::test]
async fn a_stores_fail_closed_refusals_warn_once_a_second_and_log_the_others_at_debug() {
    let refused = Outcome::Denied {
        retry_after: Duration::from_secs(1),
    };
    let app = || {
        app_on(
            "redis",
            Degraded {
                outcome: refused,
                source: Source::FailClosed,
            },
            OnStoreError::default(),
        )
    };
    let events = five_within_one_second(app, StatusCode::TOO_MANY_REQUESTS).await;
    let warn = tollgate_at(&events, "WARN");
    let debug = tollgate_at(&events, "DEBUG");
    assert_eq!((warn.len(), debug.len()), (1, 4), "{:#?}", events.lines());
    for line in warn.iter().chain(&debug) {
        assert!(line.contains("decided without it"), "{line}");
        assert!(line.contains(" source=FailClosed"), "{line}");
    }
}

#[tokio::test]
async fn a_stores_fallback_decisions_warn_once_a_second_and_log_the_others_at_debug() {
    let admitted = Outcome::Allowed {
        wait: Duration::ZERO,
    };
    let app = || {
        app_on(
            "redis",
            Degraded {
                outcome: admitted,
                source: Source::Fallback,
            },
            OnStoreError::default(),
        )
    };
    let events = five_within_one_second(app, StatusCode::OK).await;
    let warn = tollgate_at(&events, "WARN");
    let debug = tollgate_at(&events, "DEBUG");
    assert_eq!((warn.len(), debug.len()), (1, 4), "{:#?}", events.lines());
    for line in warn.iter().chain(&debug) {
        assert!(line.contains("decided without it"), "{line}");
        assert!(line.contains(" limiter=redis"), "{line}");
        assert!(line.contains(" policy=\"default\""), "{line}");
        assert!(line.contains(" source=Fallback"), "{line}");
    }
}

/// Requests never limited and requests denied are counted under the layer's label.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn exempt_and_denied_requests_are_counted() {
    let rec = Recorder::new();
    let layer = rec.scope(|| {
        RateLimitLayer::builder()
            .key(HeaderKey::new("x-api-key").unwrap())
            .policy("10/s")
            .skip(|head| head.uri().path() == "/health")
            .allow_keys(["internal"])
            .deny_keys(["leaked"])
            .label("screened")
            .build()
            .unwrap()
    });
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/health", get(|| async { "ok" }))
        .layer(layer);
    let send = |path: &str, key: &str| {
        app.clone().oneshot(
            Request::get(path)
                .header("x-api-key", key)
                .body(Body::empty())
                .unwrap(),
        )
    };
    assert_eq!(send("/health", "a").await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        send("/", "internal").await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        send("/", "internal").await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        send("/", "leaked").await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        send("/", "customer").await.unwrap().status(),
        StatusCode::OK
    );
    let snap = rec.snapshot();
    let screened = |result| {
        snap.counter(
            "tollgate.rate_limit.screened_total",
            &[
                ("tollgate.limiter", "screened"),
                ("tollgate.result", result),
            ],
        )
    };
    assert_eq!((screened("exempt"), screened("denied")), (3, 1));
    assert_eq!(
        snap.counter(
            REQUESTS,
            &[
                ("tollgate.limiter", "screened"),
                ("tollgate.policy", "default"),
                ("tollgate.result", "admitted")
            ]
        ),
        1
    );
}

/// An in-flight limit counts what it admits and refuses, and what a failed store let
/// through or refused.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn in_flight_decisions_are_counted() {
    let rec = Recorder::new();
    let layer = rec.scope(|| {
        tollgate::InFlightLimitLayer::builder(Global::new(), 1)
            .label("exports")
            .build()
            .unwrap()
    });
    let svc = tower::ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: Request<Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::from("report")))
        });
    let held = svc
        .clone()
        .oneshot(Request::new(Body::empty()))
        .await
        .unwrap();
    for _ in 0..3 {
        let r = svc
            .clone()
            .oneshot(Request::new(Body::empty()))
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    drop(held);
    let r = svc
        .clone()
        .oneshot(Request::new(Body::empty()))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let snap = rec.snapshot();
    let count = |result| {
        snap.counter(
            "tollgate.in_flight.requests_total",
            &[("tollgate.limiter", "exports"), ("tollgate.result", result)],
        )
    };
    assert_eq!((count("admitted"), count("refused")), (2, 3));
    assert_eq!((count("fail_open"), count("fail_closed")), (0, 0));
}

/// Regression: a queued request refused because its turn came after its deadline was a
/// `DEBUG` event unlike every other refusal, and an in-flight limit's likewise. Both are
/// `INFO` events with `outcome = "deadline"`, the rate limit's with the same fields as a
/// denial (policy, key hash, the wait in whole milliseconds rounded up).
#[tokio::test(start_paused = true)]
async fn refusals_for_a_deadline_are_info_events_of_their_own_outcome() {
    let (events, _guard) = Events::capture();
    let queue = RateLimitLayer::builder()
        .policy("slots: queue 1/s 5")
        .label("queued")
        .build()
        .unwrap();
    let svc = tower::ServiceBuilder::new()
        .layer(queue)
        .service_fn(|_: Request<Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
        });
    let call = |timeout: &str| {
        Request::builder()
            .header("grpc-timeout", timeout)
            .body(Body::empty())
            .unwrap()
    };
    svc.clone().oneshot(call("10S")).await.unwrap();
    let late = svc.oneshot(call("250m")).await.unwrap();
    assert_eq!(late.status(), StatusCode::TOO_MANY_REQUESTS);
    let info = tollgate_at(&events, "INFO");
    assert_eq!(info.len(), 1, "{info:#?}");
    let line = &info[0];
    for part in [
        "limiter=queued",
        "policy=\"default\"",
        "outcome=\"deadline\"",
        "retry_after_ms=1000",
    ] {
        assert!(line.contains(part), "{part} in {line}");
    }
    assert_eq!(key_field(line).len(), 16);

    let inflight = tollgate::InFlightLimitLayer::builder(Global::new(), 1)
        .queue(1)
        .label("slots")
        .build()
        .unwrap();
    let svc = tower::ServiceBuilder::new()
        .layer(inflight)
        .service_fn(|_: Request<Body>| {
            std::future::pending::<Result<http::Response<Body>, std::convert::Infallible>>()
        });
    let holder = tokio::spawn(svc.clone().oneshot(Request::new(Body::empty())));
    tokio::task::yield_now().await;
    let late = svc.oneshot(call("1m")).await.unwrap();
    assert_eq!(late.status(), StatusCode::TOO_MANY_REQUESTS);
    holder.abort();
    let info = tollgate_at(&events, "INFO");
    assert_eq!(info.len(), 2, "{info:#?}");
    assert!(
        info[1].contains("limiter=slots") && info[1].contains("outcome=\"deadline\""),
        "{}",
        info[1]
    );
}

/// The metrics and attribute values the observability guide lists, row by row: a metric's
/// name, the attributes named in its row (`tollgate.result`), the values listed (`admitted`),
/// and whether the row is for network stores only.
#[cfg(feature = "metrics")]
fn guide_rows() -> Vec<(String, Vec<String>, Vec<String>, bool)> {
    let guide = include_str!("../../src/docs/observability.md");
    guide
        .lines()
        .filter(|l| l.starts_with("| `tollgate."))
        .map(|row| {
            let cells: Vec<&str> = row.split('|').collect();
            let ticked = |cell: &str| -> Vec<String> {
                cell.split('`')
                    .skip(1)
                    .step_by(2)
                    .map(str::to_owned)
                    .collect()
            };
            let name = ticked(cells[1]).remove(0);
            let words = ticked(cells[3]);
            let attributes = words
                .iter()
                .filter(|w| w.contains('.') && !w.starts_with('.'))
                .cloned()
                .collect();
            let values = words
                .iter()
                .filter(|w| w.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
                .cloned()
                .collect();
            (
                name,
                attributes,
                values,
                cells[2].contains("network stores"),
            )
        })
        .collect()
}

/// The attributes whose values are a fixed list (the others are labels and names).
#[cfg(feature = "metrics")]
const LISTED: [&str; 7] = [
    "tollgate.result",
    "tollgate.source",
    "tollgate.outcome",
    "tollgate.state",
    "tollgate.reason",
    "tollgate.field",
    "error.type",
];

/// Regression: the observability guide omitted the `deadline` result the rate-limit and
/// in-flight layers count, and the listener's series. Every series the layers, the memory
/// store, the listener and the upstream layer register (each result included, the first-use ones made to
/// happen) is in the guide with its attributes and values; every metric of the guide is
/// registered (but the network stores', which need a server), with every value listed
/// (but those only a Redis store makes).
#[cfg(feature = "metrics")]
#[tokio::test]
async fn the_guide_lists_the_metrics_and_values_the_code_registers() {
    use tollgate::InFlightLimitLayer;
    let rec = Recorder::new();
    let _in_force = rec.in_force();
    // Every rate-limit result: a queue (delayed, deadline), a refusal, a limit in shadow,
    // counted by route; screened requests; and a store failing open and closed.
    let limit = RateLimitLayer::builder()
        .key(Global::new())
        .policy("queue: queue 1/s 2, watched: 1/min shadow")
        .route_metrics(true)
        .allow_keys([()])
        .build()
        .unwrap();
    let queued = RateLimitLayer::builder()
        .key(Global::new())
        .policy("queue 1/s 2")
        .label("queued")
        .build()
        .unwrap();
    let app = Router::new()
        .route("/items/{id}", get(|| async { "ok" }))
        .layer(queued);
    assert_eq!(send(&app, "/items/1", None).await, StatusCode::OK);
    let late = Request::get("/items/1")
        .header("x-envoy-expected-rq-timeout-ms", "1")
        .body(Body::empty())
        .unwrap();
    let late = app.clone().oneshot(late).await.unwrap();
    assert_eq!(late.status(), StatusCode::TOO_MANY_REQUESTS);
    for on_error in [OnStoreError::FailOpen, OnStoreError::FailClosed] {
        let failing = RateLimitLayer::builder()
            .key(Global::new())
            .on_store_error(on_error)
            .build_with(FailingStore)
            .unwrap();
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(failing);
        send(&app, "/", None).await;
    }
    let in_flight = InFlightLimitLayer::new(Global::new(), 1);
    let ten = tollgate::Quota::per_second(10).unwrap();
    let fair = tollgate::FairLimitLayer::builder(Global::new(), ten)
        .share(tollgate::fair::Share::new(ten, ten).unwrap())
        .build()
        .unwrap();
    #[cfg(feature = "listener")]
    let listener = tollgate::listener::ConnectionLimits::new()
        .build(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap())
        .unwrap();
    #[cfg(feature = "upstream")]
    let upstream = tollgate::upstream::UpstreamLayer::builder()
        .build()
        .unwrap();
    let snap = rec.snapshot();
    #[cfg(feature = "upstream")]
    drop(upstream);
    drop((limit, in_flight, fair));
    #[cfg(feature = "listener")]
    drop(listener);

    let rows = guide_rows();
    let row = |name: &str| rows.iter().find(|r| r.0 == name);
    let mut registered: std::collections::BTreeMap<&str, std::collections::BTreeSet<&str>> =
        Default::default();
    for (name, labels) in snap.series() {
        let (_, attributes, values, _) =
            row(name).unwrap_or_else(|| panic!("{name} is not in the guide"));
        let seen = registered.entry(name).or_default();
        for (key, value) in labels {
            assert!(
                attributes.contains(key),
                "{name}: attribute {key} is not in the guide ({attributes:?})"
            );
            if LISTED.contains(&key.as_str()) {
                assert!(
                    values.contains(value),
                    "{name}: {key} = {value:?} is not in the guide ({values:?})"
                );
                seen.insert(value);
            }
        }
    }
    // Only a Redis store decides from a negative cache or falls back to a local share.
    let redis_only = ["negative_cache", "fallback"];
    for (name, _, values, network) in &rows {
        if *network {
            continue;
        }
        #[cfg(not(feature = "listener"))]
        if name.starts_with("tollgate.connections") {
            continue;
        }
        #[cfg(not(feature = "upstream"))]
        if name.starts_with("tollgate.upstream") {
            continue;
        }
        let seen = registered
            .get(name.as_str())
            .unwrap_or_else(|| panic!("{name} is in the guide but never registered"));
        for v in values {
            assert!(
                seen.contains(v.as_str()) || redis_only.contains(&v.as_str()),
                "{name}: {v:?} is in the guide but never registered ({seen:?})"
            );
        }
    }
}

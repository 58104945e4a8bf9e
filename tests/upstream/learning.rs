//! What the upstream layer learns from an upstream's answers and what its callers see,
//! in paused time against upstreams written as services: pauses (`Retry-After`, the
//! IETF `RateLimit` at `r=0`, `X-RateLimit-Remaining: 0`), quotas announced and
//! replaced, the caps (`max_pause`, `max_wait`), fields ignored, the retry policy, and
//! the doors for jobs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tokio::time::Instant;
use tollgate::generic::RateLimited;
use tollgate::upstream::UpstreamLayer;
use tower::retry::budget::TpsBudget;
use tower::retry::RetryLayer;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

/// An upstream answering each call with what `answer` makes of its number (from 0) and
/// recording when each arrives (from the test's start) and at which host.
#[derive(Clone)]
struct Upstream {
    started: Instant,
    arrivals: Arc<Mutex<Vec<(Duration, String)>>>,
}

type Answer = Arc<dyn Fn(usize) -> Response<()> + Send + Sync>;
type Client = BoxCloneSyncService<Request<String>, Response<()>, BoxError>;

impl Upstream {
    fn new() -> Self {
        Upstream {
            started: Instant::now(),
            arrivals: Arc::default(),
        }
    }

    fn service(&self, answer: impl Fn(usize) -> Response<()> + Send + Sync + 'static) -> Client {
        let answer: Answer = Arc::new(answer);
        let me = self.clone();
        BoxCloneSyncService::new(tower::service_fn(move |req: Request<String>| {
            let host = req.uri().host().unwrap_or("").to_owned();
            let n = {
                let mut arrivals = me.arrivals.lock().unwrap();
                arrivals.push((me.started.elapsed(), host));
                arrivals.len() - 1
            };
            let res = answer(n);
            async move { Ok::<_, BoxError>(res) }
        }))
    }

    fn times(&self) -> Vec<Duration> {
        self.arrivals.lock().unwrap().iter().map(|a| a.0).collect()
    }
}

fn answer(status: u16, fields: &[(&str, &str)]) -> Response<()> {
    let mut res = Response::new(());
    *res.status_mut() = StatusCode::from_u16(status).unwrap();
    for (name, value) in fields {
        res.headers_mut().append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    res
}

fn call(host: &str) -> Request<String> {
    Request::get(format!("https://{host}/v1/x"))
        .body(String::new())
        .unwrap()
}

async fn send(client: &Client, host: &str) -> Result<StatusCode, BoxError> {
    client.clone().oneshot(call(host)).await.map(|r| r.status())
}

fn through(layer: &UpstreamLayer, inner: Client) -> Client {
    BoxCloneSyncService::new(ServiceBuilder::new().layer(layer.clone()).service(inner))
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[tokio::test(start_paused = true)]
async fn a_429_with_retry_after_pauses_the_host_for_every_caller() {
    let upstream = Upstream::new();
    let inner = upstream.service(|n| match n {
        0 => answer(429, &[("retry-after", "3")]),
        _ => answer(200, &[]),
    });
    let layer = UpstreamLayer::builder().build().unwrap();
    let client = through(&layer, inner);
    assert_eq!(send(&client, "a.example").await.unwrap(), 429);
    // Another host is not paused; the paused one waits the 3 s out, each caller alike.
    assert_eq!(send(&client, "b.example").await.unwrap(), 200);
    let waiting = (0..3).map(|_| {
        let client = client.clone();
        tokio::spawn(async move { send(&client, "a.example").await.unwrap() })
    });
    for w in waiting.collect::<Vec<_>>() {
        assert_eq!(w.await.unwrap(), 200);
    }
    let times = upstream.times();
    assert_eq!(times[1], Duration::ZERO, "b.example went at once");
    // At 3 s (tokio's timer has millisecond ticks).
    for t in &times[2..] {
        assert!(
            *t >= Duration::from_secs(3) && *t <= Duration::from_millis(3002),
            "{times:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_ietf_ratelimit_at_r_0_and_x_ratelimit_remaining_0_pause_until_their_reset() {
    for fields in [
        vec![("ratelimit", "\"default\";r=0;t=4")],
        vec![("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "4")],
    ] {
        let upstream = Upstream::new();
        let first = fields.clone();
        let inner = upstream.service(move |n| match n {
            0 => answer(200, &first),
            _ => answer(200, &[]),
        });
        let layer = UpstreamLayer::builder().build().unwrap();
        let client = through(&layer, inner);
        send(&client, "a.example").await.unwrap();
        send(&client, "a.example").await.unwrap();
        assert_eq!(upstream.times()[1], Duration::from_secs(4), "{fields:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_pause_is_capped_and_a_caller_waits_at_most_max_wait() {
    let upstream = Upstream::new();
    let inner = upstream.service(|n| match n {
        0 => answer(503, &[("retry-after", "86400")]),
        _ => answer(200, &[]),
    });
    let layer = UpstreamLayer::builder()
        .max_pause(Duration::from_secs(60))
        .max_wait(Duration::from_secs(10))
        .build()
        .unwrap();
    let client = through(&layer, inner);
    assert_eq!(send(&client, "a.example").await.unwrap(), 503);
    // The pause is 60 s, not a day; a caller who waits 10 s at most is not sent at all.
    let started = Instant::now();
    let e = send(&client, "a.example").await.unwrap_err();
    let refused = e.downcast_ref::<RateLimited>().expect("a RateLimited");
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(60)));
    assert_eq!(started.elapsed(), Duration::ZERO, "refused at once");
    assert_eq!(upstream.times().len(), 1, "not sent");
    tokio::time::sleep(Duration::from_secs(55)).await;
    assert_eq!(send(&client, "a.example").await.unwrap(), 200);
    assert_eq!(upstream.times()[1], Duration::from_secs(60));
}

#[tokio::test(start_paused = true)]
async fn malformed_or_unknown_fields_pause_nothing_and_teach_nothing() {
    let upstream = Upstream::new();
    let inner = upstream.service(|_| {
        answer(
            429,
            &[
                ("retry-after", "soon"),
                ("ratelimit-policy", "\"a\";q=1;w=1,"),
                ("ratelimit", "\"a\";r=0;t=-3"),
                ("x-ratelimit-remaining", "none"),
                ("x-ratelimit-reset", "10"),
                ("x-rate-limit-reset", "10"),
            ],
        )
    });
    let layer = UpstreamLayer::builder().build().unwrap();
    let client = through(&layer, inner);
    for _ in 0..20 {
        send(&client, "a.example").await.unwrap();
    }
    assert!(
        upstream.times().iter().all(|t| t.is_zero()),
        "nothing waited"
    );
}

/// Sends `n` calls with `concurrency` callers; returns when each reached the upstream.
async fn flood(
    client: &Client,
    upstream: &Upstream,
    n: usize,
    concurrency: usize,
) -> Vec<Duration> {
    let left = Arc::new(std::sync::atomic::AtomicUsize::new(n));
    let callers = (0..concurrency).map(|_| {
        let (client, left) = (client.clone(), left.clone());
        tokio::spawn(async move {
            while left
                .fetch_update(
                    std::sync::atomic::Ordering::SeqCst,
                    std::sync::atomic::Ordering::SeqCst,
                    |l| l.checked_sub(1),
                )
                .is_ok()
            {
                send(&client, "a.example").await.unwrap();
            }
        })
    });
    for c in callers.collect::<Vec<_>>() {
        c.await.unwrap();
    }
    let mut times = upstream.times();
    times.sort();
    times
}

/// The most calls in any window of `w` starting at a call.
fn most_in(times: &[Duration], w: Duration) -> usize {
    (0..times.len())
        .map(|i| times[i..].iter().take_while(|t| **t < times[i] + w).count())
        .max()
        .unwrap_or(0)
}

#[tokio::test(start_paused = true)]
async fn an_announced_quota_is_followed_at_95_percent_and_replaced_when_it_changes() {
    let upstream = Upstream::new();
    let announced = Arc::new(Mutex::new("\"default\";q=20;w=1"));
    let now = announced.clone();
    let inner =
        upstream.service(move |_| answer(200, &[("ratelimit-policy", *now.lock().unwrap())]));
    let layer = UpstreamLayer::builder().build().unwrap();
    let client = through(&layer, inner);
    let times = flood(&client, &upstream, 200, 8).await;
    // The first 8 go before anything is known; then a burst of 1 and 19 a second.
    let learned = &times[8..];
    assert!(
        most_in(learned, Duration::from_secs(1)) <= 20,
        "{learned:?}"
    );
    let span = secs(*learned.last().unwrap() - learned[0]);
    let rate = (learned.len() - 1) as f64 / span;
    assert!((18.9..=19.1).contains(&rate), "{rate} a second");

    // Told otherwise: 40 a second from the next answer on.
    *announced.lock().unwrap() = "\"default\";q=40;w=1";
    tokio::time::sleep(Duration::from_secs(2)).await;
    upstream.arrivals.lock().unwrap().clear();
    let times = flood(&client, &upstream, 200, 8).await;
    let later = &times[2..];
    let rate = (later.len() - 1) as f64 / secs(*later.last().unwrap() - later[0]);
    assert!((37.9..=38.1).contains(&rate), "{rate} a second");
}

#[tokio::test(start_paused = true)]
async fn the_tighter_of_the_configured_and_announced_limits_holds() {
    for (configured, announced, want) in [
        ("5/s", "\"d\";q=100;w=1", 5.0),
        ("100/s", "\"d\";q=10;w=1", 9.5),
    ] {
        let upstream = Upstream::new();
        let inner = upstream.service(move |_| answer(200, &[("ratelimit-policy", announced)]));
        let layer = UpstreamLayer::builder()
            .policy(format!("queue {configured} 1000").as_str())
            .build()
            .unwrap();
        let client = through(&layer, inner);
        let times = flood(&client, &upstream, 100, 4).await;
        let steady = &times[20..];
        let rate = (steady.len() - 1) as f64 / secs(*steady.last().unwrap() - steady[0]);
        assert!(
            (want * 0.99..=want * 1.01).contains(&rate),
            "{configured} and {announced}: {rate}"
        );
    }
}

/// A pause bans the pause alone: a learned quota's queue goes on from where it was
/// when the pause ends (not pushed back by its length, nor refilled).
#[tokio::test(start_paused = true)]
async fn after_a_pause_a_learned_quota_goes_on_at_its_rate() {
    let upstream = Upstream::new();
    let inner = upstream.service(|n| match n {
        50 => answer(
            429,
            &[("retry-after", "2"), ("ratelimit-policy", "\"d\";q=20;w=1")],
        ),
        _ => answer(200, &[("ratelimit-policy", "\"d\";q=20;w=1")]),
    });
    let layer = UpstreamLayer::builder().build().unwrap();
    let client = through(&layer, inner);
    let times = flood(&client, &upstream, 120, 4).await;
    let paused_at = times[50];
    let after: Vec<_> = times[51..].to_vec();
    assert!(after[0] >= paused_at + Duration::from_secs(2), "{after:?}");
    assert!(
        after[0] <= paused_at + Duration::from_millis(2100),
        "not pushed back: {after:?}"
    );
    assert!(
        most_in(&after, Duration::from_secs(1)) <= 20,
        "not refilled: {after:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_retry_policy_retries_429_and_503_after_their_time_within_the_budget() {
    let upstream = Upstream::new();
    let inner = upstream.service(|n| match n {
        0..=3 => answer(200, &[]),
        4 => answer(429, &[("retry-after", "2")]),
        5 => answer(503, &[]),
        6 => answer(500, &[]),
        _ => answer(429, &[("retry-after", "1")]),
    });
    let layer = UpstreamLayer::builder()
        .max_wait(Duration::from_secs(30))
        .build()
        .unwrap();
    // One retry for every two answers that were not refusals, none besides.
    let retries = layer.retry_policy(TpsBudget::new(Duration::from_secs(60), 0, 0.5));
    let client = BoxCloneSyncService::new(
        ServiceBuilder::new()
            .layer(layer.clone())
            .layer(RetryLayer::new(retries))
            .service(inner),
    );
    for _ in 0..4 {
        assert_eq!(send(&client, "a.example").await.unwrap(), 200);
    }
    // 429 (retried after its 2 s), 503 without a time (after 1 s), 500: not retried.
    assert_eq!(send(&client, "a.example").await.unwrap(), 500);
    assert_eq!(upstream.times()[4..], [0, 2, 3].map(Duration::from_secs));
    // The budget is spent: the next refusal is the answer.
    assert_eq!(send(&client, "a.example").await.unwrap(), 429);
    assert_eq!(upstream.times().len(), 8, "{:?}", upstream.times());
}

#[tokio::test(start_paused = true)]
async fn a_retry_that_would_wait_past_max_wait_is_not_made() {
    let upstream = Upstream::new();
    let inner = upstream.service(|_| answer(429, &[("retry-after", "120")]));
    let layer = UpstreamLayer::builder()
        .max_wait(Duration::from_secs(30))
        .build()
        .unwrap();
    let retries = layer.retry_policy(TpsBudget::new(Duration::from_secs(10), 10, 0.2));
    let client = BoxCloneSyncService::new(
        ServiceBuilder::new()
            .layer(layer.clone())
            .layer(RetryLayer::new(retries))
            .service(inner),
    );
    let started = Instant::now();
    assert_eq!(send(&client, "a.example").await.unwrap(), 429);
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(upstream.times().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn jobs_take_their_turn_and_a_pause_holds_them() {
    let layer = UpstreamLayer::builder()
        .policy("queue 10/s 100")
        .build()
        .unwrap();
    let started = Instant::now();
    for _ in 0..5 {
        layer.acquire("sms-provider".to_owned()).await.unwrap();
    }
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(400),
        "5 turns at 10 a second"
    );
    layer
        .pause("sms-provider".to_owned(), Duration::from_secs(3))
        .await
        .unwrap();
    layer.acquire("sms-provider".to_owned()).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(3400));
    // Another provider is not held.
    layer.acquire("email-provider".to_owned()).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(3400));
}

#[test]
fn bad_configuration_is_refused_when_built() {
    let text = UpstreamLayer::builder().policy("10/x").build().unwrap_err();
    assert!(text.to_string().contains("10/x"), "{text}");
    let four = UpstreamLayer::builder()
        .policy("1/s, 2/s, 3/s, 4/s")
        .build()
        .unwrap_err();
    assert!(
        four.to_string().contains("at most 3 configured limits"),
        "{four}"
    );
    let label = UpstreamLayer::builder().label("").build().unwrap_err();
    assert!(
        matches!(label, tollgate::ConfigError::InvalidName(_)),
        "{label}"
    );
}

//! One story in the fields, on every kind of limit, read with an independent parser of
//! RFC 9651 lists (`support/sf.rs`) as a client of draft-ietf-httpapi-ratelimit-headers-11
//! would read them:
//!
//! - both fields parse, every item a string with integers of at most 15 digits;
//! - each `RateLimit` item has its `RateLimit-Policy` item, and its `r` never exceeds
//!   that item's `q` (a burst above the rate is advertised over the window that holds it);
//! - a refusal's `Retry-After` is never earlier than the `t` of an item with nothing
//!   left, and is the `t` of the item that refused (one unit: the exact wait, rounded up);
//!   its problem body carries that wait in milliseconds (`retry_after_ms`, rounded up),
//!   of which `Retry-After` is the rounding up to seconds.
//!
//! Paused time throughout: every wait is exact.

use std::{convert::Infallible, time::Duration};

use crate::support::sf;
use axum::body::Body;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use proptest::prelude::*;
use sf::{parse_list_lines, Bare, Member};
use tollgate::fair::{FairLimitLayer, Share};
use tollgate::key::Global;
use tollgate::{InFlightLimitLayer, Limit, Quota, RateLimitLayer};
use tower::{Service, ServiceBuilder, ServiceExt};

const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
const PAST_DEADLINE: &str =
    "https://docs.rs/tollgate/latest/tollgate/response/index.html#queued-past-the-deadline";

/// A response as a client sees it.
#[derive(Debug)]
struct Seen {
    status: StatusCode,
    headers: HeaderMap,
    body: Option<serde_json::Value>,
}

impl Seen {
    fn lines(&self, name: &str) -> Vec<&str> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    fn list(&self, name: &str) -> Vec<Member> {
        parse_list_lines(self.lines(name))
            .unwrap_or_else(|e| panic!("{name}: {e}: {:?}", self.lines(name)))
    }

    fn retry_after(&self) -> Option<i64> {
        let v = self.headers.get("retry-after")?;
        Some(v.to_str().unwrap().parse().expect("delay-seconds"))
    }
}

async fn seen<B>(res: Response<B>) -> Seen
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let (parts, body) = res.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    Seen {
        status: parts.status,
        headers: parts.headers,
        body: serde_json::from_slice(&bytes).ok(),
    }
}

fn get() -> Request<Body> {
    Request::new(Body::empty())
}

async fn ok(_: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::empty()))
}

/// The story every response tells (see the module docs); `what` names the case.
fn check(what: &str, res: &Seen) {
    check_cost(what, res, 1);
}

/// [`check`] for a request of `cost` units: a refusal's `Retry-After` is never earlier
/// than the `t` of an item with fewer than `cost` units left, and for one unit it is the
/// `t` of one of them; a cost no limit can ever admit gets no `Retry-After`.
fn check_cost(what: &str, res: &Seen, cost: i64) {
    let policy = res.list("ratelimit-policy");
    let limits = res.list("ratelimit");
    assert_eq!(
        policy.len(),
        limits.len(),
        "{what}: one item per limit in both fields"
    );
    assert!(!limits.is_empty(), "{what}: no fields in {:?}", res.headers);
    let int = |m: &Member, key: &str| {
        m.param(key)
            .map(|v| v.int().unwrap_or_else(|| panic!("{what}: {key} is {v:?}")))
    };
    let mut blocked = Vec::new();
    for (p, l) in policy.iter().zip(&limits) {
        let name = p
            .item
            .as_ref()
            .and_then(Bare::str)
            .expect("a policy item is a string");
        assert_eq!(l.item.as_ref().and_then(Bare::str), Some(name), "{what}");
        let q = int(p, "q").unwrap_or_else(|| panic!("{what}: q is required"));
        if let Some(w) = int(p, "w") {
            assert!(w > 0, "{what}: w={w}");
        }
        if let Some(qu) = p.param("qu") {
            let qu = qu.str().expect("qu is a string");
            assert!(
                ["requests", "content-bytes", "concurrent-requests"].contains(&qu),
                "{qu}"
            );
        }
        let r = int(l, "r").unwrap_or_else(|| panic!("{what}: r is required"));
        assert!((0..=q).contains(&r), "{what}: {name}: r={r} against q={q}");
        let t = int(l, "t");
        assert!(t.is_none_or(|t| t >= 0), "{what}");
        if r < cost {
            blocked.push(t);
        }
    }
    if res.status != StatusCode::TOO_MANY_REQUESTS {
        return;
    }
    assert!(!blocked.is_empty(), "{what}: a refusal with room left");
    let body = res
        .body
        .as_ref()
        .unwrap_or_else(|| panic!("{what}: a problem body"));
    let Some(retry) = res.retry_after() else {
        // Only a cost that can never be admitted goes without.
        assert!(body.get("retry_after_ms").is_none(), "{what}");
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains("can ever admit"), "{what}: {body}");
        return;
    };
    assert!(retry > 0, "{what}: Retry-After: 0");
    // Retry-After is never earlier than the end of an item's effective window when the
    // item has too little left (draft-11 §6), and for one unit it is the refusing item's.
    for t in blocked.iter().flatten() {
        assert!(*t <= retry, "{what}: t={t} after Retry-After: {retry}");
    }
    if cost == 1 && blocked.iter().any(Option::is_some) {
        assert!(
            blocked.contains(&Some(retry)),
            "{what}: no item says t={retry}: {blocked:?}"
        );
    }
    let typ = body["type"].as_str().unwrap();
    assert!(
        [QUOTA_EXCEEDED, PAST_DEADLINE].contains(&typ),
        "{what}: {typ}"
    );
    assert_eq!(body["status"], 429);
    if let Some(ms) = body.get("retry_after_ms") {
        let ms = ms.as_i64().expect("whole milliseconds");
        assert_eq!(
            (ms + 999) / 1000,
            retry,
            "{what}: {ms} ms against Retry-After: {retry}"
        );
    }
}

/// `n` requests at the same instant through `svc`, each decided in order (a queued one
/// waits for its slot while the others are decided).
async fn at_once<S, B>(svc: &S, n: usize) -> Vec<Seen>
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: std::fmt::Debug,
{
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { seen(svc.oneshot(get()).await.unwrap()).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

fn rate_limit(policy: &str) -> RateLimitLayer {
    RateLimitLayer::builder()
        .policy(policy)
        .deadline_header("x-deadline-ms")
        .build()
        .unwrap()
}

fn statuses(seen: &[Seen]) -> Vec<u16> {
    seen.iter().map(|s| s.status.as_u16()).collect()
}

/// Every kind of limit, alone and together: admitted responses and refusals tell one
/// story. Regression: a bucket of 5/s burst 10 advertised `q=5` and then `r=9`; a queue
/// refused with `Retry-After: 1` and `t=4`.
#[tokio::test(start_paused = true)]
async fn every_kind_of_limit_tells_one_story() {
    for (policy, n, expected) in [
        ("5/s burst 10", 12, [vec![200; 10], vec![429; 2]].concat()),
        ("5/s", 7, [vec![200; 5], vec![429; 2]].concat()),
        ("5/s meter", 3, vec![200, 429, 429]),
        ("queue 1/s 3", 6, [vec![200; 4], vec![429; 2]].concat()),
        (
            "queue 2/s 4 nodelay 2",
            6,
            [vec![200; 5], vec![429]].concat(),
        ),
        (
            "queue 2/s 4 max-wait 1100ms",
            5,
            [vec![200; 3], vec![429; 2]].concat(),
        ),
        ("3/s window", 4, vec![200, 200, 200, 429]),
        ("3/min sliding", 4, vec![200, 200, 200, 429]),
        ("1000/day window", 3, vec![200; 3]),
        (
            "second: 2/s burst 4, daily: 5/day window",
            6,
            [vec![200; 4], vec![429; 2]].concat(),
        ),
        (
            "second: 10/s, daily: 3/day window",
            5,
            [vec![200; 3], vec![429; 2]].concat(),
        ),
        // A limit in shadow is not reported; the enforced one tells its story.
        (
            "minute: 3/min, burst: 1/s shadow",
            4,
            vec![200, 200, 200, 429],
        ),
    ] {
        let svc = ServiceBuilder::new()
            .layer(rate_limit(policy))
            .service_fn(ok);
        let seen = at_once(&svc, n).await;
        assert_eq!(statuses(&seen), expected, "{policy}");
        for s in &seen {
            check(policy, s);
        }
        // Later, when the refused request would be admitted: every response still does.
        tokio::time::advance(Duration::from_secs(2)).await;
        let later = seen_one(&svc).await;
        check(policy, &later);
    }
}

async fn seen_one<S, B>(svc: &S) -> Seen
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible> + Clone,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    seen(svc.clone().oneshot(get()).await.unwrap()).await
}

/// A queue's fields, read by a client: a rested queue of one a second with 3 waiting
/// places admits 4 at once (`q=4;w=4`: the rate, over the window that holds them); the
/// fifth is refused until the first slot has passed, which is what both `Retry-After`
/// and `t` say.
#[tokio::test(start_paused = true)]
async fn a_full_queue_says_when_it_admits_again() {
    let svc = ServiceBuilder::new()
        .layer(rate_limit("q: queue 1/s 3"))
        .service_fn(ok);
    let seen = at_once(&svc, 5).await;
    let field = |s: &Seen, name: &str| s.lines(name).join(", ");
    assert_eq!(field(&seen[0], "ratelimit-policy"), "\"q\";q=4;w=4");
    let items: Vec<String> = seen.iter().map(|s| field(s, "ratelimit")).collect();
    assert_eq!(
        items,
        [
            "\"q\";r=3;t=1",
            "\"q\";r=2;t=1",
            "\"q\";r=1;t=1",
            "\"q\";r=0;t=1",
            "\"q\";r=0;t=1"
        ]
    );
    assert_eq!(seen[4].retry_after(), Some(1));
    assert_eq!(seen[4].body.as_ref().unwrap()["retry_after_ms"], 1000);
}

/// Regression: a queued request whose slot came after its caller's deadline was refused
/// like any quota refusal (`quota-exceeded`), with `Retry-After: 3` and `t=4`. It has its
/// own problem type, and `Retry-After`, `t` and the body's wait all say when its slot
/// would have come.
#[tokio::test(start_paused = true)]
async fn a_refusal_for_the_deadline_is_marked_and_agrees() {
    let svc = ServiceBuilder::new()
        .layer(rate_limit("slots: queue 1/s 5"))
        .service_fn(ok);
    for _ in 0..3 {
        // Two waiting: the next slot is 3 s away.
        drop(tokio::spawn(svc.clone().oneshot(get())));
    }
    tokio::task::yield_now().await;
    let req = Request::builder()
        .header("grpc-timeout", "1500m")
        .body(Body::empty())
        .unwrap();
    let late = seen(svc.clone().oneshot(req).await.unwrap()).await;
    check("deadline", &late);
    assert_eq!(late.status, 429);
    assert_eq!(late.retry_after(), Some(3));
    assert_eq!(late.lines("ratelimit"), ["\"slots\";r=0;t=3"]);
    let body = late.body.as_ref().unwrap();
    assert_eq!(body["type"], PAST_DEADLINE);
    assert_eq!(body["title"], "Queued Past the Deadline");
    assert_eq!(body["violated-policies"], serde_json::json!(["slots"]));
    assert_eq!(body["retry_after_ms"], 3000);
}

/// A quota of absurd size: its numbers stay within RFC 9651's 15 digits (the largest
/// integer a client can read); it wrote `r=4999999999999999`.
#[tokio::test(start_paused = true)]
async fn absurd_quotas_stay_within_fifteen_digits() {
    let svc = ServiceBuilder::new()
        .layer(rate_limit("1000000000/s burst 5000000000000000"))
        .service_fn(ok);
    let s = seen_one(&svc).await;
    check("absurd", &s);
    assert_eq!(
        s.lines("ratelimit-policy"),
        ["\"1000000000-per-1s\";q=999999999999999;w=5000000"]
    );
    assert_eq!(
        s.lines("ratelimit"),
        ["\"1000000000-per-1s\";r=999999999999999;t=1"]
    );
}

/// The in-flight layer: `qu="concurrent-requests"`, `r` at most `q`; its refusal has no
/// exact wait (a slot frees when a response ends): `Retry-After: 1`, no `t`, no
/// `retry_after_ms`.
#[tokio::test(start_paused = true)]
async fn in_flight_limits_tell_the_same_story() {
    let layer = InFlightLimitLayer::builder(Global::new(), 2)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: Request<Body>| async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<_, Infallible>(Response::new(Body::empty()))
        });
    let seen = at_once(&svc, 3).await;
    assert_eq!(statuses(&seen), [200, 200, 429]);
    for s in &seen {
        check("in-flight", s);
    }
    assert_eq!(
        seen[0].lines("ratelimit-policy"),
        ["\"inflight\";q=2;qu=\"concurrent-requests\""]
    );
    let refused = seen[2].body.as_ref().unwrap();
    assert!(refused.get("retry_after_ms").is_none());
}

/// The fair-share layer: `q` is the key's ceiling (what `r` may reach), `borrow` the part
/// it has only while the pool has room; a refusal's `t`, `Retry-After` and body agree.
#[tokio::test(start_paused = true)]
async fn fair_share_limits_tell_the_same_story() {
    let share = Share::new(
        Quota::per_second(4).unwrap(),
        Quota::per_second(16).unwrap(),
    )
    .unwrap();
    let layer = FairLimitLayer::builder(Global::new(), Quota::per_second(20).unwrap())
        .share(share)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    let seen = at_once(&svc, 12).await;
    assert_eq!(statuses(&seen), [vec![200; 10], vec![429; 2]].concat());
    for s in &seen {
        check("fair", s);
    }
    assert_eq!(
        seen[0].lines("ratelimit-policy"),
        ["\"fair\";q=16;w=1;borrow=12"]
    );
    assert_eq!(seen[0].lines("ratelimit"), ["\"fair\";r=9;t=1"]);
}

/// Layers stacked on one route: each adds its items to both fields, and the story holds
/// for the whole lists.
#[tokio::test(start_paused = true)]
async fn stacked_layers_keep_their_items_together() {
    let inflight = InFlightLimitLayer::builder(Global::new(), 5)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(inflight)
        .layer(rate_limit("per-second: 2/s burst 3"))
        .service_fn(ok);
    let seen = at_once(&svc, 4).await;
    assert_eq!(statuses(&seen), [200, 200, 200, 429]);
    for s in &seen {
        check("stacked", s);
    }
}

/// A gRPC call queued past its deadline is `RESOURCE_EXHAUSTED` with a message that says
/// so, not a quota's; its metadata tell the same story as an HTTP refusal's fields.
#[tokio::test(start_paused = true)]
async fn a_grpc_call_queued_past_its_deadline_says_so() {
    let svc = ServiceBuilder::new()
        .layer(rate_limit("slots: queue 1/s 5"))
        .service_fn(ok);
    let call = |timeout: &str| {
        Request::post("/helloworld.Greeter/SayHello")
            .header("content-type", "application/grpc")
            .header("grpc-timeout", timeout)
            .body(Body::empty())
            .unwrap()
    };
    svc.clone().oneshot(call("10S")).await.unwrap();
    let late = seen(svc.oneshot(call("500m")).await.unwrap()).await;
    assert_eq!(late.headers["grpc-status"], "8");
    let message = late.headers["grpc-message"].to_str().unwrap();
    assert!(message.contains("deadline"), "{message}");
    assert_eq!(late.retry_after(), Some(1));
    assert_eq!(late.lines("ratelimit"), ["\"slots\";r=0;t=1"]);
}

/// The legacy trio says what the IETF fields say: its limit is the limit's `q`, never
/// below its remaining count.
#[tokio::test(start_paused = true)]
async fn the_legacy_limit_is_the_advertised_quota() {
    let layer = RateLimitLayer::builder()
        .policy("5/s burst 10")
        .legacy_headers(true)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new().layer(layer).service_fn(ok);
    let first = seen_one(&svc).await;
    check("legacy", &first);
    let n = |name: &str| -> u64 { first.headers[name].to_str().unwrap().parse().unwrap() };
    assert_eq!(
        (n("x-ratelimit-limit"), n("x-ratelimit-remaining")),
        (10, 9)
    );
}

/// A limit of every kind, over small quotas and odd periods, one in five in shadow.
fn limit() -> impl Strategy<Value = Limit> {
    (
        0u8..6,
        1u64..12,
        1u64..3_000,
        1u64..20,
        0u32..6,
        0u64..2_000,
        0u8..5,
    )
        .prop_map(|(kind, n, period_ms, burst, queue, ms, shadow)| {
            let q = Quota::new(n, Duration::from_millis(period_ms)).unwrap();
            let l = match kind {
                0 => Limit::token_bucket(q.with_burst(burst).unwrap()),
                1 => Limit::leaky_meter(q),
                2 => Limit::leaky_queue_nodelay(q, queue, queue / 2),
                3 => Limit::leaky_queue(q, queue)
                    .and_then(|l| l.with_max_wait(Duration::from_millis(ms + 1))),
                4 => Limit::fixed_window(q),
                _ => Limit::sliding_window(q)
                    .and_then(|l| l.with_window_offset(Duration::from_millis(ms))),
            }
            .unwrap();
            if shadow == 0 {
                l.shadow()
            } else {
                l
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any policy of one to three limits of any kind, under random arrivals and costs
    /// (a queued request waits in a task of its own while the next ones are decided):
    /// every response parses and tells the story of [`check_cost`].
    #[test]
    fn any_policy_tells_one_story(
        limits in prop::collection::vec(limit(), 1..=3),
        arrivals in prop::collection::vec(
            (prop_oneof![Just(0u64), 0u64..400, 0u64..5_000], 1u64..4),
            1..30,
        ),
    ) {
        // Every limit in shadow: nothing is reported.
        prop_assume!(!limits.iter().all(|l| l.is_shadow()));
        let mut builder = RateLimitLayer::builder().cost(|req: &Request<Body>| {
            req.headers()["x-cost"].to_str().unwrap().parse::<u64>().unwrap()
        });
        for l in &limits {
            builder = builder.limit(l.clone());
        }
        let svc = ServiceBuilder::new().layer(builder.build().unwrap()).service_fn(ok);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let mut waiting = Vec::new();
            for (i, &(gap, cost)) in arrivals.iter().enumerate() {
                tokio::time::advance(Duration::from_millis(gap)).await;
                let req = Request::builder().header("x-cost", cost).body(Body::empty()).unwrap();
                let res = svc.clone().oneshot(req);
                let task = tokio::spawn(async move { seen(res.await.unwrap()).await });
                tokio::task::yield_now().await;
                waiting.push((format!("#{i} cost {cost} under {limits:?}"), cost, task));
            }
            for (what, cost, task) in waiting {
                check_cost(&what, &task.await.unwrap(), cost as i64);
            }
        });
    }
}

/// A queue in shadow delays nothing: a refusal for the deadline names only the queues
/// enforced for the key (the one in shadow is neither reported nor named).
#[tokio::test(start_paused = true)]
async fn a_refusal_for_the_deadline_names_the_enforced_queues_only() {
    let svc = ServiceBuilder::new()
        .layer(rate_limit("slots: queue 1/s 5, trial: queue 2/s 5 shadow"))
        .service_fn(ok);
    drop(tokio::spawn(svc.clone().oneshot(get())));
    tokio::task::yield_now().await;
    let req = Request::builder()
        .header("grpc-timeout", "500m")
        .body(Body::empty())
        .unwrap();
    let late = seen(svc.oneshot(req).await.unwrap()).await;
    check("deadline beside a shadow queue", &late);
    assert_eq!(late.lines("ratelimit"), ["\"slots\";r=0;t=1"]);
    let body = late.body.as_ref().unwrap();
    assert_eq!(body["type"], PAST_DEADLINE);
    assert_eq!(body["violated-policies"], serde_json::json!(["slots"]));
}

/// The parser the tests above read the fields with (`support/sf.rs`), on its own.
mod sf_parser {
    use crate::support::sf::{parse_list, parse_list_lines, Bare};

    #[test]
    fn parses_what_rfc_9651_says() {
        let l = parse_list(r#""burst";q=100;w=60, "daily";q=1000;w=86400"#).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].item, Some(Bare::String("burst".into())));
        assert_eq!(l[1].param("w"), Some(&Bare::Integer(86_400)));
        let l = parse_list(r#"tok;a;b=?0;c=:aGVsbG8=:;d=-1.5, (1 2);x=@1"#).unwrap();
        assert_eq!(l[0].item, Some(Bare::Token("tok".into())));
        assert_eq!(l[0].param("a"), Some(&Bare::Boolean(true)));
        assert_eq!(l[0].param("b"), Some(&Bare::Boolean(false)));
        assert_eq!(l[0].param("c"), Some(&Bare::Bytes(b"hello".to_vec())));
        assert_eq!(l[0].param("d"), Some(&Bare::Decimal(-1500)));
        assert_eq!(l[1].inner.len(), 2);
        assert_eq!(l[1].param("x"), Some(&Bare::Date(1)));
        assert_eq!(
            parse_list(r#""a\"b""#).unwrap()[0].item,
            Some(Bare::String("a\"b".into()))
        );
        // 15 digits are an integer; 16 are not.
        assert!(parse_list("\"x\";r=999999999999999").is_ok());
        assert!(parse_list("\"x\";r=4999999999999999").is_err());
        for bad in [
            "\"x\";R=1",
            "\"x\",",
            "\"x\" \"y\"",
            "\"x\";r=1.",
            "\"unterminated",
            "\"x\";r=1.2345",
        ] {
            assert!(parse_list(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_list_lines(["\"a\";r=1", "\"b\";r=2"]).unwrap().len(),
            2
        );
    }
}

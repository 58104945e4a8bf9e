//! Shared by the Redis tests: random policies and operation sequences, and the
//! comparison of the Redis store with the in-memory store.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use proptest::{prelude::*, test_runner::TestCaseError};
use tollgate::clock::{Clock, ManualClock};
use tollgate::decision::{Decision, Source};
use tollgate::store::{MemoryStore, RedisConnection, RedisStore, Store};
use tollgate::Limit;
use tollgate::Policy;
use tollgate::Quota;

pub fn limit_strategy() -> impl Strategy<Value = Limit> {
    (
        (0u8..5, 1u64..40, 1u64..3_000),
        (1u64..20, 0u32..8, 0u32..8, 0u64..5_000_000, 0u8..5),
    )
        .prop_map(
            |((alg, limit, period_ms), (burst, queue, nodelay, offset_us, mode))| {
                let q = Quota::new(limit, Duration::from_millis(period_ms)).unwrap();
                let offset = Duration::from_micros(offset_us);
                match alg {
                    0 => Limit::token_bucket(q.with_burst(burst).unwrap()),
                    1 => Limit::leaky_meter(q),
                    2 if offset_us % 3 == 0 => {
                        Limit::leaky_queue_nodelay(q, queue, nodelay.min(queue))
                            .and_then(|l| l.with_max_wait(offset * 40))
                    }
                    2 => Limit::leaky_queue_nodelay(q, queue, nodelay.min(queue)),
                    3 => Limit::fixed_window(q).and_then(|l| l.with_window_offset(offset)),
                    _ => Limit::sliding_window(q).and_then(|l| l.with_window_offset(offset)),
                }
                // One limit in five runs in shadow: never refuses, charged when it admits.
                .map(|l| if mode == 0 { l.shadow() } else { l })
                .unwrap()
            },
        )
}

pub fn policy_strategy() -> impl Strategy<Value = Policy> {
    prop::collection::vec(limit_strategy(), 1..=3).prop_map(|l| Policy::from_limits(l).unwrap())
}

/// One to three policies a key is decided under in turn (plans, or a live change).
pub fn policies_strategy() -> impl Strategy<Value = Vec<Policy>> {
    prop::collection::vec(policy_strategy(), 1..=3)
}

/// (gap in µs, cost, op: 0-6 check, 7-8 peek, 9 refund, 10 a cost settled above its
/// estimate, 11 below it, 12 reset, 13 a ban of `cost` ms; the policy it is under)
pub fn ops_strategy() -> impl Strategy<Value = Vec<Op>> {
    let gap = prop_oneof![Just(0u64), 0u64..2_000, 0u64..400_000];
    let cost = prop_oneof![8 => 0u64..4, 1 => 4u64..60];
    // Mostly one policy for a while, then another: runs of the same index.
    let which = prop_oneof![6 => Just(0u8), 1 => 0u8..3];
    prop::collection::vec((gap, cost, 0u8..14, which), 1..60)
}

/// An operation of a sequence: gap in µs, cost, kind, policy index.
pub type Op = (u64, u64, u8, u8);

static KEY: AtomicU64 = AtomicU64::new(0);

/// Runs one sequence on both stores, on one manual clock starting at `start_us`
/// microseconds past the Unix epoch, and compares every decision. Each operation is
/// decided under one of `policies`, each store told the policy per call (as a layer's
/// plans and swaps tell it): the Redis store converts the key's state between them as an
/// instance with other quotas would. One operation at a time: see [`compare_concurrent`].
pub async fn compare(
    conn: &RedisConnection,
    policies: &[Policy],
    start_us: u64,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    compare_concurrent(conn, policies, start_us, ops, 1).await
}

/// What the in-memory store answered to one operation, to compare with Redis's answer.
enum Expected {
    Decision(Decision, String),
    Done,
}

type Pending<'a> = Pin<Box<dyn Future<Output = (Expected, Option<Decision>)> + 'a>>;

/// [`compare`], with up to `window` operations in flight on Redis at once: each is
/// started in order (at its time on the clock, which is when its request is made), and
/// the window is awaited when full. On a single node the connection's batcher then sends
/// the first alone and the others queued behind it as one batch call, which must decide
/// them exactly as the in-memory store decides them one after the other.
pub async fn compare_concurrent(
    conn: &RedisConnection,
    policies: &[Policy],
    start_us: u64,
    ops: &[Op],
    window: usize,
) -> Result<(), TestCaseError> {
    let key = format!(
        "eq-{}-{}",
        std::process::id(),
        KEY.fetch_add(1, Ordering::Relaxed)
    );
    let clock = ManualClock::at(Duration::from_micros(start_us));
    // One store, each request naming its policy, as a layer's plans and swaps do.
    let store = RedisStore::builder("equivalence", policies[0].clone())
        .clock(clock.clone())
        .negative_cache(0)
        // Semantics, not latency: a stalled machine must not turn a decision into the
        // fallback's.
        .deadline(Duration::from_secs(5))
        .build(conn.clone())
        .unwrap();
    let store = &store;
    let mem = MemoryStore::<String, _>::new(policies[0].clone()).with_clock(clock.clone());
    let mut pending: Vec<Pending<'_>> = Vec::new();
    for (i, &(gap, cost, op, which)) in ops.iter().enumerate() {
        clock.advance(Duration::from_micros(gap));
        let now = clock.now();
        let w = which as usize % policies.len();
        let policy = &policies[w];
        let key = &key;
        let mut fut: Pending<'_> = match op {
            0..=6 => {
                let m = Store::decide(&mem, key, policy, cost)
                    .await
                    .unwrap()
                    .with_source(Source::Store);
                let what = format!(
                    "check #{i} cost {cost} at +{}ns under policy {w}\npolicies {policies:?}",
                    now - start_us * 1000
                );
                // A cost of 0 is admitted at once, whatever the state (Redis must then
                // answer the same).
                if cost == 0 {
                    prop_assert_eq!(
                        m.outcome(),
                        tollgate::decision::Outcome::Allowed {
                            wait: Duration::ZERO
                        },
                        "{}",
                        what
                    );
                }
                Box::pin(async move {
                    let r = Store::decide(store, key, policy, cost).await.unwrap();
                    (Expected::Decision(m, what), Some(r))
                })
            }
            7 | 8 => {
                let m = Store::preview(&mem, key, policy, cost)
                    .await
                    .unwrap()
                    .with_source(Source::Store);
                let what = format!("peek #{i} cost {cost} under policy {w}\npolicies {policies:?}");
                Box::pin(async move {
                    let r = Store::preview(store, key, policy, cost).await.unwrap();
                    (Expected::Decision(m, what), Some(r))
                })
            }
            // A refund (of something: layers never refund nothing), confirmed: a settlement
            // `cost` below what was reserved.
            9 => {
                if cost > 0 {
                    Store::refund(&mem, key, policy, cost);
                }
                Box::pin(async move {
                    Store::settle(store, key, policy, cost + 1, 1)
                        .await
                        .unwrap();
                    (Expected::Done, None)
                })
            }
            10 | 11 => {
                let actual = if op == 10 { cost * 2 + 1 } else { cost / 2 };
                Store::settle(&mem, key, policy, cost, actual)
                    .await
                    .unwrap();
                Box::pin(async move {
                    Store::settle(store, key, policy, cost, actual)
                        .await
                        .unwrap();
                    (Expected::Done, None)
                })
            }
            12 => {
                Store::reset(&mem, key).await.unwrap();
                Box::pin(async move {
                    Store::reset(store, key).await.unwrap();
                    (Expected::Done, None)
                })
            }
            _ => {
                let ban = Duration::from_micros(cost * 1_700 + 3);
                Store::ban(&mem, key, policy, ban).await.unwrap();
                Box::pin(async move {
                    Store::ban(store, key, policy, ban).await.unwrap();
                    (Expected::Done, None)
                })
            }
        };
        // Polled once now, so that the request is made at this point of the clock and in
        // this order; finished later.
        match std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await {
            Poll::Ready(out) => pending.push(Box::pin(std::future::ready(out))),
            Poll::Pending => pending.push(fut),
        }
        if pending.len() >= window || i + 1 == ops.len() {
            for fut in pending.drain(..) {
                if let (Expected::Decision(m, what), Some(r)) = fut.await {
                    prop_assert_eq!(r, m, "{}", what);
                }
            }
        }
    }
    Ok(())
}

//! What a decision's `remaining` and `next_after` mean, on every store: the units that
//! would still be admitted now, one at a time (a queue's waiting ones included), and the
//! time until one more would be (a refused unit's retry-after): the IETF `RateLimit`
//! field's `r` and `t`.
//!
//! Regression: a leaky queue reported only the units it would serve without a wait (at
//! first not even its `nodelay` ones), so a full queue said `r=0` until its backlog had
//! drained (`t=4`) while it would admit a request a slot later (`Retry-After: 1`).

use std::time::Duration;

#[cfg(feature = "redis")]
use crate::support;
use proptest::prelude::*;
use tollgate::clock::ManualClock;
use tollgate::store::{MemoryStore, Store};
use tollgate::{Limit, Policy, Quota};

/// One unit every 1.311 s; 5 may queue, the first of them served at once.
fn queue() -> Limit {
    Limit::leaky_queue_nodelay(Quota::every(Duration::from_millis(1311)).unwrap(), 5, 1).unwrap()
}

/// The queue alone (the Redis store's fast script) and the queue beside a limit that
/// never binds (its general script).
fn policies() -> [Policy; 2] {
    let roomy = Limit::token_bucket(Quota::per_second(1000).unwrap().with_burst(1000).unwrap());
    [
        Policy::new(queue()),
        Policy::new(queue()).and(roomy.unwrap()).unwrap(),
    ]
}

/// Four requests of one unit on a fresh key, at one instant: each one's wait and the
/// queue's `remaining` after it. The queue admits six at once (one now, its `nodelay` one
/// and four more delayed to their slots): the first two pass without a wait.
const EXPECTED: [(Duration, u64); 4] = [
    (Duration::ZERO, 5),
    (Duration::ZERO, 4),
    (Duration::from_millis(1311), 3),
    (Duration::from_millis(2622), 2),
];

async fn four_requests<S: Store<String>>(
    store: &S,
    policy: &Policy,
    key: &str,
) -> Vec<(Duration, u64)> {
    let key = key.to_string();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let d = store.decide(&key, policy, 1).await.unwrap();
        assert!(d.is_allowed(), "{d:?}");
        seen.push((d.wait(), d.limits()[0].remaining()));
    }
    seen
}

#[tokio::test]
async fn a_queues_waiting_units_count_as_remaining_in_memory() {
    for policy in policies() {
        let store = MemoryStore::<String, _>::new(policy.clone()).with_clock(ManualClock::new());
        assert_eq!(
            four_requests(&store, &policy, "k").await,
            EXPECTED,
            "{policy:?}"
        );
        // A request of cost 0 on a fresh key: every slot.
        let fresh = store
            .preview(&"fresh".to_string(), &policy, 0)
            .await
            .unwrap();
        assert_eq!(fresh.limits()[0].remaining(), 6);
    }
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_queues_waiting_units_count_as_remaining_on_redis() {
    use tollgate::store::{RedisConnection, RedisStore};
    let Some(target) = support::redis::Target::get() else {
        return;
    };
    let conn = RedisConnection::connect(&target.url()).await.unwrap();
    let ns = format!("remaining-{}", std::process::id());
    for (i, policy) in policies().into_iter().enumerate() {
        let clock = ManualClock::at(Duration::from_secs(1_800_000_000));
        let builder = || {
            RedisStore::builder("limit", policy.clone())
                .namespace(&ns)
                .clock(clock.clone())
                .negative_cache(0)
                .deadline(Duration::from_secs(5))
        };
        let plain = builder().batching(false).build(conn.clone()).unwrap();
        assert_eq!(
            four_requests(&plain, &policy, &format!("plain-{i}")).await,
            EXPECTED,
            "{policy:?}"
        );

        // Four at once through one connection: the first alone, the rest as a batch.
        let batched = builder().build(conn.clone()).unwrap();
        let key = format!("batched-{i}");
        let one = || Store::decide(&batched, &key, &policy, 1);
        let (a, b, c, d) = tokio::join!(one(), one(), one(), one());
        let seen: Vec<_> = [a, b, c, d]
            .into_iter()
            .map(|d| d.unwrap())
            .map(|d| (d.wait(), d.limits()[0].remaining()))
            .collect();
        assert_eq!(seen, EXPECTED, "batched, {policy:?}");

        let local = builder()
            .build_local_first(conn.clone(), Duration::from_secs(3600))
            .unwrap();
        assert_eq!(
            four_requests(&local, &policy, &format!("local-{i}")).await,
            EXPECTED,
            "local-first, {policy:?}"
        );
    }
}

proptest! {
    /// For every GCRA flavour and any history, `remaining` units are admitted now (a
    /// queue's after their wait) and one more is not; one more is admitted exactly
    /// `next_after` later, and refused 1 ns earlier; a refused unit's retry-after is its
    /// `next_after`.
    #[test]
    fn remaining_units_are_admitted_and_one_more_comes_after_next_after(
        flavour in 0u8..4,
        rate in 1u64..50,
        burst in 1u64..8,
        queue in 0u32..8,
        nodelay in 0u32..8,
        max_wait_ms in 1u64..2_000,
        arrivals in proptest::collection::vec((0u64..400_000_000, 0u64..4), 1..40),
    ) {
        let q = Quota::per_second(rate).unwrap();
        let limit = match flavour {
            0 => Limit::token_bucket(q.with_burst(burst).unwrap()),
            1 => Limit::leaky_meter(q),
            2 => Limit::leaky_queue_nodelay(q, queue, nodelay.min(queue)),
            _ => Limit::leaky_queue(q, queue)
                .and_then(|l| l.with_max_wait(Duration::from_millis(max_wait_ms))),
        }
        .unwrap();
        let policy = Policy::new(limit);
        let mut state = vec![0u64; policy.state_words()];
        let mut now = 1_000_000_000u64;
        for (gap, cost) in arrivals {
            now += gap;
            let d = policy.decide(&mut state, now, cost);
            let report = d.limits()[0];
            let r = report.remaining();
            if r > 0 {
                prop_assert!(policy.peek(&state, now, r).is_allowed(), "{} remaining", r);
            }
            let more = policy.peek(&state, now, r + 1);
            prop_assert!(!more.is_allowed(), "{} remaining, one more: {:?}", r, more);
            let next = report.next_after().as_nanos() as u64;
            if next > 0 {
                prop_assert_eq!(policy.peek(&state, now + next, 0).limits()[0].remaining(), r + 1);
                prop_assert_eq!(policy.peek(&state, now + next - 1, 0).limits()[0].remaining(), r);
            }
            if r == 0 {
                prop_assert_eq!(more.retry_after(), Some(report.next_after()));
            }
        }
    }
}

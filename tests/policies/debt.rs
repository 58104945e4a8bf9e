//! A state in debt, as the guides state it, on every algorithm, in memory and on Redis:
//! a cost of 0 is admitted at once, whatever the state; a charge without a check
//! (`Policy::charge`, a cost settled above its estimate) stops at twice a limit's
//! capacity; a debt carried to a limit of the same rate and size is kept whole.

use std::time::Duration;

#[cfg(feature = "redis")]
use crate::support::equiv;
use proptest::prelude::*;
use tollgate::decision::{Decision, Outcome};
use tollgate::{Limit, Policy, Quota};

/// An instant on a whole second (windows start on it), in ns since the Unix epoch.
const T0: u64 = 1_755_000_000_000_000_000;
const SEC: u64 = 1_000_000_000;
const AT_ONCE: Outcome = Outcome::Allowed {
    wait: Duration::ZERO,
};

/// A limit of every kind, over small quotas (so that charges put it in debt often).
fn limit() -> impl Strategy<Value = Limit> {
    (0u8..7, 1u64..12, 1u64..2_000, 1u64..8, 0u32..6, 0u64..3_000).prop_map(
        |(kind, n, period_ms, burst, queue, offset_ms)| {
            let q = Quota::new(n, Duration::from_millis(period_ms)).unwrap();
            let offset = Duration::from_millis(offset_ms);
            match kind {
                0 => Limit::token_bucket(q.with_burst(burst).unwrap()),
                1 => Limit::leaky_meter(q),
                2 => Limit::leaky_queue(q, queue),
                3 => Limit::leaky_queue_nodelay(q, queue, queue / 2),
                4 => Limit::leaky_queue(q, queue).and_then(|l| l.with_max_wait(offset)),
                5 => Limit::fixed_window(q).and_then(|l| l.with_window_offset(offset)),
                _ => Limit::sliding_window(q).and_then(|l| l.with_window_offset(offset)),
            }
            .unwrap()
        },
    )
}

fn policy() -> impl Strategy<Value = Policy> {
    prop::collection::vec(limit(), 1..=3).prop_map(|l| Policy::from_limits(l).unwrap())
}

/// (gap in ms, cost, op: 0-3 check, 4-5 charge, 6 refund, 7 ban; the policy it is under)
fn ops() -> impl Strategy<Value = Vec<(u64, u64, u8, u8)>> {
    let gap = prop_oneof![Just(0u64), 0u64..50, 0u64..3_000];
    prop::collection::vec((gap, 0u64..30, 0u8..8, 0u8..3), 1..60)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Regression: a fixed or a sliding window in debt (after a charge, or a plan change
    /// to a smaller limit on the same grid) refused a cost of 0, which every other
    /// algorithm admits, and which the changelog says every algorithm admits. A cost of 0
    /// is admitted at once on any state reached by checks, charges, refunds, bans and
    /// plan changes, spends nothing, and says what a look says.
    #[test]
    fn a_cost_of_zero_is_admitted_at_once_on_any_state(
        policies in prop::collection::vec(policy(), 1..=3),
        ops in ops(),
    ) {
        let mut state = [0u64; 12];
        let (mut now, mut under) = (T0, 0usize);
        for (gap, cost, op, which) in ops {
            now += gap * 1_000_000;
            let w = which as usize % policies.len();
            if w != under {
                state = policies[w].carry_from(&policies[under], &state, now);
                under = w;
            }
            let p = &policies[under];
            match op {
                0..=3 => drop(p.decide(&mut state, now, cost)),
                4 | 5 => p.charge(&mut state, now, cost),
                6 => p.refund(&mut state, now, cost),
                _ => p.ban(&mut state, now, cost * 1_000_000),
            }
            let before = state;
            let probe = p.decide(&mut state, now, 0);
            prop_assert_eq!(probe.outcome(), AT_ONCE, "{:?} at +{} ns", p, now - T0);
            prop_assert_eq!(state, before, "a cost of 0 changed the state");
            prop_assert_eq!(p.peek(&state, now, 0), probe);
        }
    }

    /// A charge without a check stops at twice a limit's capacity, whatever the charge:
    /// giving back the capacity and two units afterwards (at the same instant) always makes
    /// room for a unit (two: a queue bounded by its longest wait holds a part of a unit). A charge that went on would leave the key in debt for as long as
    /// the charge, however large.
    #[test]
    fn a_charge_stops_at_twice_the_capacity(
        limit in limit(),
        before in ops(),
        charge in 1u64..1_000_000,
    ) {
        let p = Policy::new(limit.clone());
        let mut s = [0u64; 3];
        let mut now = T0;
        for (gap, cost, op, _) in before {
            now += gap * 1_000_000;
            match op {
                0..=3 => drop(p.decide(&mut s, now, cost)),
                // Charges in the same window as the last one: a sliding window's previous
                // window stays as the checks left it.
                4 | 5 => p.charge(&mut s, now, cost),
                _ => p.refund(&mut s, now, cost),
            }
        }
        // A sliding window weighs its previous window too: charged in a fresh window,
        // that one is empty.
        if matches!(limit.algorithm(), tollgate::algorithm::Algorithm::SlidingWindow) {
            now += 2 * limit.quota().period().as_nanos() as u64;
        }
        p.charge(&mut s, now, charge);
        p.refund(&mut s, now, limit.max_cost() + 2);
        let d = p.peek(&s, now, 1);
        prop_assert!(d.is_allowed(), "{:?} after charge({}): {:?}", limit, charge, d);
    }

    /// A debt carried to a limit of the same rate and size (another algorithm, or another
    /// queue setting, over the same capacity) is kept whole, not cut to a full bucket: the
    /// key waits exactly as long under either. Carried to another size at the same rate, it
    /// is cut to at most full.
    #[test]
    fn a_debt_carried_to_the_same_rate_and_size_is_kept_whole(
        t_ms in 1u64..500,
        units in 1u32..8,
        from in 0u8..3,
        to in 0u8..3,
        spent in 0u64..20,
        charge in 0u64..40,
        later in 0u64..5_000,
    ) {
        // Three limits of one rate (a unit every `t_ms`) and one capacity (`units + 1`
        // units): a token bucket, a queue, a queue serving some at once.
        let q = Quota::every(Duration::from_millis(t_ms)).unwrap();
        let of = |k: u8| match k {
            0 => Limit::token_bucket(q.with_burst(u64::from(units) + 1).unwrap()).unwrap(),
            1 => Limit::leaky_queue(q, units).unwrap(),
            _ => Limit::leaky_queue_nodelay(q, units, units / 2).unwrap(),
        };
        let (a, b) = (Policy::new(of(from)), Policy::new(of(to)));
        let mut s = [0u64];
        for _ in 0..spent {
            a.decide(&mut s, T0, 1);
        }
        a.charge(&mut s, T0, charge);
        let now = T0 + later * 1_000_000;
        let carried = b.carry_from(&a, &s, now);
        let wait = |p: &Policy, s: &[u64]| p.peek(s, now, 1).retry_after();
        prop_assert_eq!(wait(&b, &carried), wait(&a, &s));
        // Another size at the same rate: at most full (one unit's wait at most).
        let bigger = Policy::new(Limit::token_bucket(q.with_burst(u64::from(units) + 2).unwrap()).unwrap());
        let cut = bigger.carry_from(&a, &s, now);
        prop_assert!(wait(&bigger, &cut).is_none_or(|w| w <= q.emission_interval()));
    }
}

fn denied(d: &Decision) -> Option<Duration> {
    match d.outcome() {
        Outcome::Denied { retry_after } => Some(retry_after),
        _ => None,
    }
}

/// The cases: a fixed window of 10/s spent and charged 5 more refused a cost of 0
/// for 999.999999 ms; a sliding window, the same, for 133.333334 ms at 1.2 s; a sliding
/// window of 100/h with 60 spent at the start of an hour and 60 at half past the next,
/// changed to 50/h, refused it for 1 800 s.
#[test]
fn windows_in_debt_admit_a_cost_of_zero() {
    let q = Quota::per_second(10).unwrap();
    for (limit, at) in [
        (Limit::fixed_window(q).unwrap(), T0 + 1),
        (Limit::sliding_window(q).unwrap(), T0 + 1_200_000_000),
    ] {
        let p = Policy::new(limit);
        let mut s = [0u64; 3];
        assert!(p.decide(&mut s, T0, 10).is_allowed());
        p.charge(&mut s, T0, 5);
        assert_eq!(p.decide(&mut s, at, 0).outcome(), AT_ONCE, "{p:?}");
        assert_eq!(p.peek(&s, at, 0).outcome(), AT_ONCE);
        // A unit still waits out the debt.
        assert!(denied(&p.peek(&s, at, 1)).is_some());
    }
    let hour = 3_600 * SEC;
    let (before, after): (Policy, Policy) = (
        "100/h sliding".parse().unwrap(),
        "50/h sliding".parse().unwrap(),
    );
    let mut s = [0u64; 3];
    assert!(before.decide(&mut s, T0, 60).is_allowed());
    let half_past = T0 + hour + hour / 2;
    assert!(before.decide(&mut s, half_past, 60).is_allowed());
    let mut carried = after.carry_from(&before, &s, half_past);
    assert_eq!(after.decide(&mut carried, half_past, 0).outcome(), AT_ONCE);
    // A unit waits for the next hour, and 72 s into it (the previous hour's 50 then weigh
    // 49 units).
    assert_eq!(
        denied(&after.peek(&carried, half_past, 1)),
        Some(Duration::from_secs(1_872))
    );
}

/// The guides' example: a bucket of 1/s burst 5, spent, then charged 20 without a check:
/// the next request waits 6 s (the charge stopped at twice the capacity), not 21.
#[test]
fn a_spent_bucket_charged_twenty_waits_six_seconds() {
    let p: Policy = "1/s burst 5".parse().unwrap();
    let mut s = [0u64];
    while p.decide(&mut s, T0, 1).is_allowed() {}
    p.charge(&mut s, T0, 20);
    assert_eq!(denied(&p.peek(&s, T0, 1)), Some(Duration::from_secs(6)));
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use crate::support::redis::Target;
    use proptest::test_runner::{Config, TestRunner};
    use tollgate::clock::ManualClock;
    use tollgate::store::{RedisConnection, RedisStore, Store};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// Policies whose windows go into debt often: small limits, settled costs above their
    /// estimate, plan changes.
    fn policies() -> impl Strategy<Value = Vec<Policy>> {
        prop::collection::vec(
            prop::collection::vec(equiv::limit_strategy(), 1..=2)
                .prop_map(|l| Policy::from_limits(l).unwrap()),
            1..=3,
        )
    }

    /// (gap in µs, cost, op, policy): checks of cost 0 one time in three, costs settled
    /// above their estimate one time in four.
    fn ops() -> impl Strategy<Value = Vec<equiv::Op>> {
        let gap = prop_oneof![Just(0u64), 0u64..2_000, 0u64..1_500_000];
        let cost = prop_oneof![Just(0u64), 1u64..50];
        let op = prop_oneof![3 => 0u8..7, 1 => Just(10u8), 1 => Just(7u8)];
        prop::collection::vec((gap, cost, op, 0u8..3), 1..50)
    }

    /// Regression: the Redis scripts refused a cost of 0 on a window in debt, as the
    /// in-memory store did. Every check of cost 0 is admitted at once on Redis, and Redis
    /// answers every operation as the in-memory store does (see `support/equiv.rs`).
    #[test]
    fn a_cost_of_zero_is_admitted_at_once_on_redis() {
        let Some(target) = Target::get() else { return };
        let rt = runtime();
        let conn = rt
            .block_on(RedisConnection::connect(&target.url()))
            .unwrap();
        let mut runner = TestRunner::new(Config {
            cases: 150,
            ..Config::default()
        });
        runner
            .run(&(policies(), ops()), |(policies, ops)| {
                rt.block_on(equiv::compare(&conn, &policies, T0 / 1_000, &ops))
            })
            .unwrap();
    }

    /// The cases and the guides' example, on Redis: the windows in debt admit a
    /// cost of 0, the bucket charged 20 waits 6 s, and a debt carried between instances
    /// configured with a token bucket and a queue of the same rate and size is kept whole.
    #[test]
    fn debts_on_redis_are_the_guides() {
        let Some(target) = Target::get() else { return };
        let rt = runtime();
        rt.block_on(async {
            // Each store its own connection: instances configured apart, one limit's name.
            let store = |p: &Policy, clock: &ManualClock| {
                let (p, clock, url) = (p.clone(), clock.clone(), target.url());
                async move {
                    RedisStore::builder("debt", p)
                        .clock(clock)
                        .negative_cache(0)
                        .deadline(Duration::from_secs(5))
                        .build(RedisConnection::connect(&url).await.unwrap())
                        .unwrap()
                }
            };
            let key = |name: &str| format!("debt-{}-{name}", std::process::id());
            let q = Quota::per_second(10).unwrap();
            for (limit, after) in [
                (Limit::fixed_window(q).unwrap(), 1),
                (Limit::sliding_window(q).unwrap(), 1_200_000_000),
            ] {
                let p = Policy::new(limit);
                let clock = ManualClock::at(Duration::from_nanos(T0));
                let s = store(&p, &clock).await;
                let k = key(&format!("{p:?}"));
                assert!(s.check(&k, 10).await.unwrap().is_allowed());
                // A cost settled 5 above its estimate of 1.
                Store::settle(&s, &k, &p, 1, 6).await.unwrap();
                clock.advance(Duration::from_nanos(after));
                assert_eq!(s.check(&k, 0).await.unwrap().outcome(), AT_ONCE, "{p:?}");
                assert!(denied(&s.peek(&k, 1).await.unwrap()).is_some());
            }

            let bucket: Policy = "1/s burst 5".parse().unwrap();
            let clock = ManualClock::at(Duration::from_nanos(T0));
            let s = store(&bucket, &clock).await;
            let k = key("bucket");
            while s.check(&k, 1).await.unwrap().is_allowed() {}
            Store::settle(&s, &k, &bucket, 0, 20).await.unwrap();
            let d = s.peek(&k, 1).await.unwrap();
            assert_eq!(denied(&d), Some(Duration::from_secs(6)));

            // The same rate and size: the debt (a full bucket below empty) stays whole.
            let queue: Policy = "queue 1/s 4".parse().unwrap();
            let other = store(&queue, &clock).await;
            let d = other.peek(&k, 1).await.unwrap();
            assert_eq!(denied(&d), Some(Duration::from_secs(6)));
        });
    }
}

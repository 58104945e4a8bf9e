//! The in-memory store decides exactly like the pure decision functions: its lock-free
//! single-limit path (a compare-and-swap on one TAT) and its locked multi-limit path,
//! against `Policy::decide` on a plain state vector, and under two racing threads.

use std::sync::{Arc, Barrier};

use tollgate::{clock::ManualClock, store::MemoryStore, Limit, Policy, Quota};

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// The store's lock-free single-limit path (compare-and-swap on the TAT) and its
    /// multi-limit path decide exactly like `Policy::decide` on a plain state vector: same
    /// outcome, same reports, for every GCRA flavour, under random arrivals and costs, on
    /// a few keys at once.
    #[test]
    fn store_decides_like_the_policy(
        rate in 1u64..2_000,
        burst in 1u64..20,
        queue in 0u32..10,
        flavour in 0u8..4,
        arrivals in proptest::collection::vec((0u64..20_000_000, 1u64..5, 0u8..3), 1..150),
    ) {
        let q = Quota::per_second(rate).unwrap();
        let limit = match flavour {
            0 => Limit::token_bucket(q.with_burst(burst).unwrap()).unwrap(),
            1 => Limit::leaky_meter(q).unwrap(),
            2 => Limit::leaky_queue_nodelay(q, queue, queue / 2).unwrap(),
            // Two limits: the store's mutex path.
            _ => {
                let p = Policy::new(Limit::token_bucket(q.with_burst(burst).unwrap()).unwrap())
                    .and(Limit::sliding_window(Quota::per_second(rate * 2).unwrap()).unwrap())
                    .unwrap();
                return check_against(p, &arrivals);
            }
        };
        check_against(Policy::new(limit), &arrivals)?;
    }
}

fn check_against(
    policy: Policy,
    arrivals: &[(u64, u64, u8)],
) -> Result<(), proptest::test_runner::TestCaseError> {
    let store = MemoryStore::new(policy.clone()).with_clock(ManualClock::new());
    let clock = store.clock().clone();
    let mut states = vec![vec![0u64; policy.state_words()]; 3];
    let mut now = 1_000_000_000u64;
    for &(gap, cost, key) in arrivals {
        now += gap;
        let expected = policy.decide(&mut states[key as usize], now, cost);
        clock.set(now);
        let got = store.check(&key, cost);
        proptest::prop_assert_eq!(got, expected, "key {} at {} cost {}", key, now, cost);
        let peeked = store.peek(&key, 1);
        proptest::prop_assert_eq!(peeked, policy.peek(&states[key as usize], now, 1));
    }
    Ok(())
}

#[test]
fn racing_threads_admit_exactly_the_burst_at_a_frozen_instant() {
    // Time does not move, so exactly `burst` units can be admitted, whatever the
    // interleaving: a lost update would admit more, a double charge fewer.
    let burst = 20_000u64;
    let q = Quota::per_hour(1).unwrap().with_burst(burst).unwrap();
    let store = Arc::new(
        MemoryStore::<u32>::new(Limit::token_bucket(q).unwrap()).with_clock(ManualClock::new()),
    );
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let (store, barrier) = (store.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let mut admitted = 0u64;
                while store.check(&7, 1).is_allowed() {
                    admitted += 1;
                }
                admitted
            })
        })
        .collect();
    let admitted: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(admitted, burst);
    assert_eq!(store.check(&7, 1).remaining(), 0);
}

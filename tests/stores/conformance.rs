//! `store::conformance::check` (feature `conformance`): the stores the crate ships and
//! the `custom_store` example's store pass it; stores that lose updates, forget refunds
//! or carry no state across policies fail it, with a report that says why.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

#[cfg(feature = "redis")]
use crate::support;
use tollgate::clock::{Clock, ManualClock};
use tollgate::error::StoreError;
use tollgate::store::{conformance, MemoryStore, Store, StoreFuture};
use tollgate::{Decision, Limit, Policy, Quota};

#[allow(dead_code)]
#[path = "../../examples/custom_store.rs"]
mod custom_store;
use custom_store::MapStore;

fn any_policy() -> Policy {
    Policy::new(Limit::token_bucket(Quota::per_second(1).unwrap()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_passes() {
    conformance::check(|clock| {
        Ok::<_, StoreError>(MemoryStore::new(any_policy()).with_clock(clock))
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_store_built_on_policy_functions_passes() {
    conformance::check(|clock| Ok::<_, StoreError>(MapStore::new(clock)))
        .await
        .unwrap();
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_store_passes() {
    let Some(server) = support::redis::RedisServer::start() else {
        return;
    };
    let conn = tollgate::store::RedisConnection::connect(&server.url())
        .await
        .unwrap();
    conformance::check(|clock| {
        tollgate::store::RedisStore::builder("limit", any_policy())
            .clock(clock)
            // Semantics, not latency: a refusal remembered locally, or a stalled machine
            // turning a call into the fallback's decision, is another test's subject.
            .negative_cache(0)
            .deadline(Duration::from_secs(5))
            .build(conn.clone())
    })
    .await
    .unwrap();
}

/// A store that reads a key's state, yields, then writes what it decided: tasks that
/// interleave there overwrite each other's charges.
struct LosesUpdates {
    clock: ManualClock,
    states: Arc<Mutex<HashMap<String, Vec<u64>>>>,
}

impl Store<String> for LosesUpdates {
    fn decide(&self, key: &String, policy: &Policy, cost: u64) -> StoreFuture<Decision> {
        let (states, key, policy, now) = (
            self.states.clone(),
            key.clone(),
            policy.clone(),
            self.clock.now(),
        );
        StoreFuture::boxed(async move {
            let read = states
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&key)
                .cloned();
            let mut state = read.unwrap_or_else(|| vec![0; policy.state_words()]);
            tokio::task::yield_now().await; // a network round trip between read and write
            let decision = policy.decide(&mut state, now, cost);
            states
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key, state);
            Ok(decision)
        })
    }
    fn preview(&self, _: &String, policy: &Policy, cost: u64) -> StoreFuture<Decision> {
        StoreFuture::ready(Ok(policy.peek(
            &vec![0; policy.state_words()],
            self.clock.now(),
            cost,
        )))
    }
    fn refund(&self, _: &String, _: &Policy, _: u64) {}
    fn settle(&self, _: &String, _: &Policy, _: u64, _: u64) -> StoreFuture<()> {
        StoreFuture::ready(Ok(()))
    }
    fn ban(&self, _: &String, _: &Policy, _: Duration) -> StoreFuture<()> {
        StoreFuture::ready(Ok(()))
    }
    fn reset(&self, _: &String) -> StoreFuture<()> {
        StoreFuture::ready(Ok(()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_loses_updates_fails_the_race() {
    let err = conformance::check(|clock| {
        Ok::<_, StoreError>(LosesUpdates {
            clock,
            states: Arc::default(),
        })
    })
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("8 tasks racing on one key"), "{err}");
    assert!(
        err.contains("a decision must read, decide and write atomically"),
        "{err}"
    );
}

/// The example's store with one fault: `fault` names the call it gets wrong.
struct Faulty {
    inner: MapStore<ManualClock>,
    fault: &'static str,
}

impl Store<String> for Faulty {
    fn decide(&self, key: &String, policy: &Policy, cost: u64) -> StoreFuture<Decision> {
        Store::decide(&self.inner, key, policy, cost)
    }
    fn decide_now(&self, key: &String, policy: &Policy, cost: u64) -> Option<Decision> {
        Store::decide_now(&self.inner, key, policy, cost)
    }
    fn preview(&self, key: &String, policy: &Policy, cost: u64) -> StoreFuture<Decision> {
        Store::preview(&self.inner, key, policy, cost)
    }
    fn refund(&self, key: &String, policy: &Policy, cost: u64) {
        if self.fault != "refund" {
            Store::refund(&self.inner, key, policy, cost)
        }
    }
    fn settle(&self, key: &String, policy: &Policy, reserved: u64, actual: u64) -> StoreFuture<()> {
        // The fault: a cost settled above its reservation is not charged.
        let actual = if self.fault == "settle" {
            actual.min(reserved)
        } else {
            actual
        };
        Store::settle(&self.inner, key, policy, reserved, actual)
    }
    fn ban(&self, key: &String, policy: &Policy, ban: Duration) -> StoreFuture<()> {
        Store::ban(&self.inner, key, policy, ban)
    }
    fn reset(&self, key: &String) -> StoreFuture<()> {
        Store::reset(&self.inner, key)
    }
}

async fn fails_with_fault(fault: &'static str) -> String {
    conformance::check(|clock| {
        Ok::<_, StoreError>(Faulty {
            inner: MapStore::new(clock),
            fault,
        })
    })
    .await
    .unwrap_err()
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_forgets_refunds_fails() {
    let err = fails_with_fault("refund").await;
    assert!(
        err.starts_with("conformance check `refund` failed: 4 units decided, then refunded"),
        "{err}"
    );
    assert!(err.contains("it did not show within 2s"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_undercharges_settled_costs_fails() {
    let err = fails_with_fault("settle").await;
    assert!(err.contains("the decisions differ"), "{err}");
    // The report names the check, the sequence, the operations on the key up to the
    // failure and the policies as text.
    assert!(
        err.starts_with("conformance check `sequences` failed: sequence "),
        "{err}"
    );
    assert!(err.contains("settle a reservation of "), "{err}");
    assert!(err.contains("\n  policies: #0 `"), "{err}");
}

/// Regression: a failing check reported the policies and the decisions in `Debug`, about
/// 240 lines (112 for the store below) with no hint of what differed. It now takes six: the
/// check and the operation, the policies as text, the operations on that key, the two
/// answers on a line each, and where they differ first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_check_is_reported_in_a_few_lines() {
    let err = fails_with_fault("settle").await;
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 6, "{err}");
    assert!(
        lines[0].starts_with("conformance check `sequences` failed: sequence 0, operation #"),
        "{err}"
    );
    assert!(lines[0].ends_with(": the decisions differ"), "{err}");
    // The policies read back as they are written.
    let policies = lines[1].strip_prefix("  policies: ").unwrap();
    let first = policies.split('`').nth(1).unwrap();
    assert_eq!(first.parse::<Policy>().unwrap().to_string(), first);
    assert!(
        lines[2].starts_with("  key 0: #0 at +121.548ms settle a reservation of 0 at 1 under #0; "),
        "{err}"
    );
    // The sequences are the same on every run: the settled unit was not charged, and this
    // store has one more left.
    assert!(
        lines[3].starts_with("  in memory:  admitted; #0 remaining 16, "),
        "{err}"
    );
    assert!(
        lines[4].starts_with("  this store: admitted; #0 remaining 17, "),
        "{err}"
    );
    assert_eq!(
        lines[5],
        "  first difference: limit #0's remaining, 16 in memory, 17 in this store"
    );
    assert!(err.len() < 2_000, "{} bytes: {err}", err.len());
}

/// The example's store without carrying state across policies: a key's state written
/// under another policy is taken as fresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_starts_fresh_on_another_policy_fails() {
    struct Fresh {
        clock: ManualClock,
        states: Mutex<HashMap<(String, u64), Vec<u64>>>,
    }
    impl Fresh {
        fn with<T>(
            &self,
            key: &str,
            p: &Policy,
            write: bool,
            op: impl FnOnce(&mut [u64], u64) -> T,
        ) -> T {
            let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
            let slot = (key.to_owned(), p.fingerprint());
            let mut s = states
                .get(&slot)
                .cloned()
                .unwrap_or_else(|| vec![0; p.state_words()]);
            let out = op(&mut s, self.clock.now());
            if write {
                states.insert(slot, s);
            }
            out
        }
    }
    impl Store<String> for Fresh {
        fn decide(&self, key: &String, p: &Policy, cost: u64) -> StoreFuture<Decision> {
            StoreFuture::ready(Ok(self.with(key, p, true, |s, now| p.decide(s, now, cost))))
        }
        fn preview(&self, key: &String, p: &Policy, cost: u64) -> StoreFuture<Decision> {
            StoreFuture::ready(Ok(self.with(key, p, false, |s, now| p.peek(s, now, cost))))
        }
        fn refund(&self, key: &String, p: &Policy, cost: u64) {
            self.with(key, p, true, |s, now| p.refund(s, now, cost));
        }
        fn settle(&self, key: &String, p: &Policy, reserved: u64, actual: u64) -> StoreFuture<()> {
            self.with(key, p, true, |s, now| {
                if actual > reserved {
                    p.charge(s, now, actual - reserved)
                } else {
                    p.refund(s, now, reserved - actual)
                }
            });
            StoreFuture::ready(Ok(()))
        }
        fn ban(&self, key: &String, p: &Policy, ban: Duration) -> StoreFuture<()> {
            self.with(key, p, true, |s, now| p.ban(s, now, ban.as_nanos() as u64));
            StoreFuture::ready(Ok(()))
        }
        fn reset(&self, key: &String) -> StoreFuture<()> {
            let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
            states.retain(|(k, _), _| k != key);
            StoreFuture::ready(Ok(()))
        }
    }
    let err = conformance::check(|clock| {
        Ok::<_, StoreError>(Fresh {
            clock,
            states: Mutex::default(),
        })
    })
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("the decisions differ"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_fails_to_build_is_reported() {
    let err = conformance::check(|_| Err::<MemoryStore<String>, _>("no backend configured"))
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(err, "building the store failed: no backend configured");
}

//! A store of your own: per-key state kept by a backend that can read, change and write
//! one value atomically, the decisions made by `Policy`'s pure functions, and the checks
//! of `tollgate::store::conformance` (feature `conformance`) run on it.
//!
//! ```sh
//! cargo run --example custom_store --features conformance
//! ```
//!
//! The backend here is a map behind a mutex; `VersionedMap::update` is the one place
//! that must be atomic. On a database it is a transaction (`SELECT .. FOR UPDATE`, then
//! `UPDATE`), a compare-and-set on a version column, or a conditional write: retry the
//! closure when the value changed under you. The value per key is the policy's
//! fingerprint and its state words: a few `u64`s.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tollgate::clock::Clock;
use tollgate::error::StoreError;
use tollgate::key::KeyBytes;
use tollgate::policy::PolicySet;
use tollgate::store::{Store, StoreFuture};
use tollgate::{ConfigError, Decision, Policy};

/// One key's value in the backend: the fingerprint of the policy that wrote the state,
/// and the state.
#[derive(Clone, Debug)]
struct Record {
    fingerprint: u64,
    words: Vec<u64>,
}

/// Stands for the backend: values by key bytes, changed atomically.
#[derive(Debug, Default)]
struct VersionedMap(Mutex<HashMap<Vec<u8>, Record>>);

impl VersionedMap {
    /// Reads `key`'s value, lets `f` change it (`None`: delete), writes it back:
    /// atomically.
    fn update<T>(&self, key: &[u8], f: impl FnOnce(Option<&Record>) -> (Option<Record>, T)) -> T {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (next, out) = f(map.get(key));
        match next {
            Some(r) => map.insert(key.to_vec(), r),
            None => map.remove(key),
        };
        out
    }
}

/// A rate-limit store on a [`VersionedMap`], deciding exactly as the in-memory store.
#[derive(Debug)]
pub(crate) struct MapStore<C> {
    map: VersionedMap,
    clock: C,
    /// Every policy seen, by fingerprint: a key's state written under one is carried to
    /// another (a change of plan, a live change of limits) with `Policy::carry_from`.
    policies: Mutex<HashMap<u64, Policy>>,
}

impl<C: Clock> MapStore<C> {
    /// An empty store reading its time from `clock`.
    pub(crate) fn new(clock: C) -> Self {
        MapStore {
            map: VersionedMap::default(),
            clock,
            policies: Mutex::default(),
        }
    }

    fn remember(&self, policy: &Policy) {
        let mut known = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        known
            .entry(policy.fingerprint())
            .or_insert_with(|| policy.clone());
    }

    /// Runs `op` on `key`'s state under `policy`, atomically: the state is carried over
    /// from the policy that wrote it when that was another, and a state back to fresh is
    /// deleted (so a key costs nothing once it is idle). With `write` false (a preview)
    /// the stored value is left as it was, even when it would be carried over.
    fn with_state<K: KeyBytes, T>(
        &self,
        key: &K,
        policy: &Policy,
        write: bool,
        op: impl FnOnce(&mut [u64], u64) -> T,
    ) -> T {
        self.remember(policy);
        let mut bytes = Vec::new();
        key.write_key(&mut bytes);
        let now = self.clock.now();
        let fingerprint = policy.fingerprint();
        self.map.update(&bytes, |found| {
            let mut words = vec![0; policy.state_words()];
            if let Some(r) = found {
                if r.fingerprint == fingerprint {
                    words.copy_from_slice(&r.words);
                } else if let Some(old) = self.policy(r.fingerprint) {
                    let carried = policy.carry_from(&old, &r.words, now);
                    words.copy_from_slice(&carried[..policy.state_words()]);
                }
            }
            let out = op(&mut words, now);
            if !write {
                return (found.cloned(), out);
            }
            let next = (!policy.is_fresh(&words, now)).then_some(Record { fingerprint, words });
            (next, out)
        })
    }

    fn policy(&self, fingerprint: u64) -> Option<Policy> {
        let known = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        known.get(&fingerprint).cloned()
    }
}

impl<K: KeyBytes + 'static, C: Clock> Store<K> for MapStore<C> {
    fn decide(&self, key: &K, policy: &Policy, cost: u64) -> StoreFuture<Decision> {
        StoreFuture::ready(Ok(
            self.with_state(key, policy, true, |s, now| policy.decide(s, now, cost))
        ))
    }

    fn preview(&self, key: &K, policy: &Policy, cost: u64) -> StoreFuture<Decision> {
        StoreFuture::ready(Ok(
            self.with_state(key, policy, false, |s, now| policy.peek(s, now, cost))
        ))
    }

    // The backend answers without I/O here, so the layers need not poll a future. A
    // network backend leaves this out and answers `decide` with `StoreFuture::boxed`.
    fn decide_now(&self, key: &K, policy: &Policy, cost: u64) -> Option<Decision> {
        Some(self.with_state(key, policy, true, |s, now| policy.decide(s, now, cost)))
    }

    fn refund(&self, key: &K, policy: &Policy, cost: u64) {
        self.with_state(key, policy, true, |s, now| policy.refund(s, now, cost));
    }

    fn settle(&self, key: &K, policy: &Policy, reserved: u64, actual: u64) -> StoreFuture<()> {
        self.with_state(key, policy, true, |s, now| {
            if actual > reserved {
                policy.charge(s, now, actual - reserved);
            } else {
                policy.refund(s, now, reserved - actual);
            }
        });
        StoreFuture::ready(Ok(()))
    }

    fn ban(&self, key: &K, policy: &Policy, ban: Duration) -> StoreFuture<()> {
        let ns = u64::try_from(ban.as_nanos()).unwrap_or(u64::MAX);
        self.with_state(key, policy, true, |s, now| policy.ban(s, now, ns));
        StoreFuture::ready(Ok(()))
    }

    fn reset(&self, key: &K) -> StoreFuture<()> {
        let mut bytes = Vec::new();
        key.write_key(&mut bytes);
        self.map.update(&bytes, |_| (None, ()));
        StoreFuture::ready(Ok::<(), StoreError>(()))
    }

    fn policies_installed(&self, set: &PolicySet) -> Result<(), ConfigError> {
        set.policies().for_each(|p| self.remember(p));
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    use tollgate::{clock::ManualClock, key::Global, store::conformance, RateLimitLayer};
    use tower::{service_fn, ServiceBuilder, ServiceExt};

    println!("the conformance checks on MapStore:");
    conformance::check(|clock| Ok::<_, StoreError>(MapStore::new(clock))).await?;
    println!("  passed");

    println!("MapStore behind a layer (3 per minute, one global key):");
    let clock = ManualClock::new();
    let limit = RateLimitLayer::builder()
        .key(Global::new())
        .policy("3/min")
        .build_with(MapStore::new(clock.clone()))?;
    let svc =
        ServiceBuilder::new()
            .layer(limit)
            .service(service_fn(|_: http::Request<()>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(String::from("ok")))
            }));
    let mut statuses = Vec::new();
    // Four at once, then one more once a unit is back (20 s at 3 per minute).
    for advance in [0, 0, 0, 0, 20] {
        clock.advance(Duration::from_secs(advance));
        let res = svc.clone().oneshot(http::Request::new(())).await?;
        statuses.push(res.status().as_u16());
    }
    println!("  {statuses:?}");
    assert_eq!(statuses, [200, 200, 200, 429, 200]);
    Ok(())
}

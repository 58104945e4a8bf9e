//! [`RedisStore`]: the shared store, deciding every request on Redis.

use std::{fmt, future::Future, sync::Arc, time::Duration};

use super::batch::Call;
use super::failure::FailurePolicy;
use super::fallback::Fallback;
use super::local_state::Unsynced;
use super::negative::NegativeCache;
use super::script::{self, Args, Mode};
use super::send::{self, Batcher};
use crate::clock::Clock;
use crate::decision::{Decision, Outcome, Source};
use crate::error::{ConfigError, StoreError};
use crate::key::KeyBytes;
use crate::observe::StoreMetrics;
use crate::policy::{Policy, PolicySet};
use crate::redis::{
    policies_claim, within, Breaker, BreakerState, Claim, Fleet, KeyNames, RedisConnection,
};
use crate::store::{Budget, CheckFuture, Store, StoreFuture};

/// The shared store: every instance decides through one Lua script on Redis, so a limit
/// holds across the fleet. Cheap to clone. See the [module docs](super).
#[derive(Clone)]
pub struct RedisStore {
    pub(super) inner: Arc<Shared>,
}

pub(super) struct Shared {
    pub(super) conn: RedisConnection,
    /// The store's identity on its connection, with what it applies.
    pub(super) claim: Claim,
    /// The connection's batcher.
    pub(super) batcher: Arc<Batcher>,
    /// The policy of the store's own methods.
    pub(super) policy: Policy,
    pub(super) names: KeyNames,
    pub(super) deadline: Duration,
    pub(super) breaker: Breaker,
    pub(super) failure: FailurePolicy,
    /// The local fallback, with a local failure policy.
    pub(super) fallback: Option<Arc<Fallback>>,
    /// This instance's lease in the namespace's fleet, with a local failure policy.
    pub(super) fleet: Option<Arc<Fleet>>,
    pub(super) metrics: StoreMetrics,
    pub(super) negative: Option<NegativeCache>,
    /// Whether decisions take their time from `clock` instead of the server's `TIME`.
    pub(super) overrides: bool,
    pub(super) clock: Arc<dyn Clock>,
    /// Whether calls go through the connection's batcher.
    pub(super) batching: bool,
    /// `policy`'s limits as script arguments.
    pub(super) limits: Arc<[u64]>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.inner;
        f.debug_struct("RedisStore")
            .field("policy", &s.policy)
            .field("prefix", &String::from_utf8_lossy(s.names.prefix()))
            .field("deadline", &s.deadline)
            .field("failure", &s.failure)
            .field("breaker", &s.breaker.state())
            .field("fallback_share", &s.fallback.as_ref().map(|f| f.share()))
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// A script call: `mode` with `cost` under `limits`, through the general script
    /// when `general`, at the store clock's time when it overrides the server's.
    fn script_call(&self, mode: Mode, cost: u64, limits: Arc<[u64]>, general: bool) -> Call {
        Call::Script(Args {
            mode,
            cost,
            now_ns: self.overrides.then(|| self.clock.now()),
            limits,
            general,
            floor: Vec::new(),
        })
    }

    /// One call on `key` under `deadline` (the store's, or less: a request's budget) and
    /// the breaker.
    async fn guarded_call(
        &self,
        key: &[u8],
        call: Call,
        deadline: Duration,
    ) -> Result<Vec<i64>, StoreError> {
        // Timed only for the operation histogram, which exists with the `metrics` feature.
        #[cfg(feature = "metrics")]
        let started = std::time::Instant::now();
        // The breaker's two steps around the call, rather than `Breaker::call`: one
        // future less around every decision's.
        let result = match self.breaker.enter() {
            Some(entered) => {
                let result = within(deadline, self.send(key, &call)).await;
                if let Some(state) = entered.finish(&result) {
                    self.metrics.breaker(state.gauge());
                }
                result
            }
            None => Err(StoreError::CircuitOpen),
        };
        // A refusal of the open breaker took no time.
        #[cfg(feature = "metrics")]
        let elapsed = match &result {
            Err(StoreError::CircuitOpen) => 0.0,
            _ => started.elapsed().as_secs_f64(),
        };
        #[cfg(not(feature = "metrics"))]
        let elapsed = 0.0;
        self.metrics.operation(elapsed, result.as_ref().err());
        result
    }

    /// Sends `call` on `key`, through the connection's batcher when batching.
    fn send<'a>(
        &'a self,
        key: &'a [u8],
        call: &'a Call,
    ) -> impl Future<Output = Result<Vec<i64>, StoreError>> + 'a {
        send::request(&self.conn, &self.batcher, key, call, self.batching)
    }

    /// Deletes one key, under the deadline.
    async fn delete(&self, key: &[u8]) -> Result<(), StoreError> {
        within(self.deadline, self.send(key, &Call::Delete))
            .await
            .map(|_| ())
    }

    /// `policy`'s limits as script arguments: the store's own policy's, computed once,
    /// for any policy with the same limits (they make the same arguments).
    fn limits(&self, policy: &Policy) -> Result<Arc<[u64]>, ConfigError> {
        let own = &self.policy;
        if policy.shadow_mask() == own.shadow_mask()
            && policy
                .limits()
                .iter()
                .map(|l| &l.params)
                .eq(own.limits().iter().map(|l| &l.params))
        {
            return Ok(self.limits.clone());
        }
        script::limit_args(policy).map(Arc::from)
    }

    /// Syncs a key the fallback decided, under the breaker and `deadline`; the time left
    /// of `deadline` after it.
    async fn sync_first(
        &self,
        fb: &Fallback,
        unsynced: Unsynced,
        deadline: Duration,
    ) -> Result<Duration, StoreError> {
        let started = tokio::time::Instant::now();
        self.breaker
            .call(
                deadline,
                || fb.sync(unsynced),
                |state| self.metrics.breaker(state.gauge()),
            )
            .await?;
        let left = deadline.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(StoreError::Timeout(self.deadline));
        }
        Ok(left)
    }

    /// One decision: the fast script for a single GCRA limit, the general one otherwise
    /// (or when the fast one finds a state written under other limits: `batch::one` and
    /// the batch script send it then, within the same call's deadline), or the failure
    /// policy's. The key is synced first when the fallback decided it since Redis last
    /// answered for it (so that Redis decides on a state that holds what was admitted
    /// meanwhile).
    async fn decide(
        self: Arc<Self>,
        key: Vec<u8>,
        policy: Policy,
        mode: Mode,
        cost: u64,
        budget: Option<Budget>,
    ) -> Result<Decision, StoreError> {
        // A refusal is remembered from when the call was sent (the conservative end);
        // only checks with the negative cache on can need that time.
        let cache = self.negative.as_ref().filter(|_| mode == Mode::Check);
        let sent = cache.map(|_| self.clock.now());
        let deadline = budget
            .as_ref()
            .map_or(self.deadline, |b| b.allow(self.deadline));
        let started = budget.as_ref().map(|_| tokio::time::Instant::now());
        // One async function for the whole decision: each one nested would hold its own
        // copies of the arguments in the future every decision moves into its box.
        let result = 'ask: {
            if deadline.is_zero() {
                // The request spent its budget on an earlier layer's call: no call, and no
                // failure of Redis's counted.
                break 'ask Err(StoreError::Timeout(self.deadline));
            }
            let mut deadline = deadline;
            if let Some((fb, unsynced)) = self
                .fallback
                .as_ref()
                .and_then(|fb| fb.take(&key).map(|u| (fb, u)))
            {
                // Boxed: only a key decided by the fallback takes this path, and every
                // decision's future would otherwise carry the sync's.
                match Box::pin(self.sync_first(fb, unsynced, deadline)).await {
                    Ok(left) => deadline = left,
                    Err(e) => break 'ask Err(e),
                }
            }
            let call = match self.limits(&policy) {
                Ok(limits) => self.script_call(mode, cost, limits, false),
                Err(e) => break 'ask Err(StoreError::backend(e)),
            };
            self.guarded_call(&key, call, deadline)
                .await
                .and_then(|reply| script::decode_decision(&reply, &policy, cost))
        };
        if let (Some(b), Some(started)) = (&budget, started) {
            b.spend(started.elapsed());
        }
        match result {
            Ok(d) => {
                if let Some(fb) = &self.fallback {
                    if mode == Mode::Check {
                        fb.record(&key, &policy, &d);
                    }
                    fb.answered();
                }
                if let (Some(n), Some(sent), Outcome::Denied { .. }) = (cache, sent, d.outcome) {
                    n.insert(key, policy.fingerprint(), cost, sent, self.clock.now(), d);
                }
                Ok(d)
            }
            Err(e) => Ok(self.on_failure(&key, &policy, mode, cost, &e)),
        }
    }

    fn on_failure(
        &self,
        key: &[u8],
        policy: &Policy,
        mode: Mode,
        cost: u64,
        e: &StoreError,
    ) -> Decision {
        if matches!(e, StoreError::CircuitOpen) {
            tracing::trace!(target: "tollgate::redis", "circuit open: failure policy decides");
        } else {
            tracing::debug!(target: "tollgate::redis", error = %e, policy = ?self.failure, "Redis call failed: failure policy decides");
        }
        let open = || {
            policy.without_state(
                Outcome::Allowed {
                    wait: Duration::ZERO,
                },
                Source::FailOpen,
            )
        };
        match self.failure {
            FailurePolicy::FailClosed { retry_after } => {
                policy.without_state(Outcome::Denied { retry_after }, Source::FailClosed)
            }
            _ => self
                .fallback
                .as_ref()
                .and_then(|fb| fb.decide(key, policy, mode, cost))
                .unwrap_or_else(open),
        }
    }
}

impl RedisStore {
    /// The policy of the store's own [`check`](Self::check) and [`peek`](Self::peek).
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// Decides for `key` under the store's policy and charges `cost` when admitted, as a
    /// layer would (deadline, breaker, negative cache and failure policy included).
    pub fn check<K: KeyBytes + ?Sized>(&self, key: &K, cost: u64) -> CheckFuture {
        self.call(
            self.redis_key(key),
            &self.inner.policy,
            Mode::Check,
            cost,
            None,
        )
    }

    /// [`RedisStore::check`] without charging anything.
    pub fn peek<K: KeyBytes + ?Sized>(&self, key: &K, cost: u64) -> CheckFuture {
        self.call(
            self.redis_key(key),
            &self.inner.policy,
            Mode::Peek,
            cost,
            None,
        )
    }

    /// The circuit breaker's state now.
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.breaker.state()
    }

    /// The share of each quota the local fallback applies now: the one given to
    /// [`FailurePolicy::LocalFallback`], or `1 / N` with [`FailurePolicy::FleetShare`]
    /// (`N` as last counted; 1 before the first count). `None` without a local fallback.
    pub fn fallback_share(&self) -> Option<f64> {
        self.inner.fallback.as_ref().map(|f| f.share())
    }

    /// The Redis key holding `key`'s state, under every policy: `<namespace>:v3:{#<sha1>}`,
    /// the braces written as they are and `<sha1>` the SHA-1 of the key's [`KeyBytes`] in
    /// hex (`myapp:v3:{#5fd4783125711c0c04c3fbff42b2cfdc8887a2df}` for `"203.0.113.7"`
    /// under the namespace `myapp`). With
    /// [`readable_keys`](super::RedisBuilder::readable_keys), the
    /// material is the key's bytes themselves when they are at most 64 printable ASCII
    /// bytes (without `{`, `}`, `#`, space).
    pub fn redis_key<K: KeyBytes + ?Sized>(&self, key: &K) -> Vec<u8> {
        self.inner.names.key(|out| key.write_key(out))
    }

    /// Gives back `cost` units charged to `key` and waits for Redis to confirm.
    /// ([`Store::refund`] sends the same call in the background and does not wait.) Errors
    /// are returned as they are: no failure policy applies.
    pub async fn refund_confirmed<K: KeyBytes + ?Sized>(
        &self,
        key: &K,
        cost: u64,
    ) -> Result<(), StoreError> {
        self.update(key, &self.inner.policy, Mode::Refund, cost)
            .await
    }

    /// One call that changes a key's state without deciding (refund, sync, ban), after
    /// forgetting the key's remembered refusals, which it may make stale.
    fn update<K: KeyBytes + ?Sized>(
        &self,
        key: &K,
        policy: &Policy,
        mode: Mode,
        units: u64,
    ) -> StoreFuture<()> {
        let k = self.redis_key(key);
        if let Some(n) = &self.inner.negative {
            n.remove(&k);
        }
        let limits = self.inner.limits(policy).map_err(StoreError::backend);
        let shared = self.inner.clone();
        StoreFuture::boxed(async move {
            let call = shared.script_call(mode, units, limits?, true);
            shared
                .guarded_call(&k, call, shared.deadline)
                .await
                .map(|_| ())
        })
    }

    fn call(
        &self,
        key: Vec<u8>,
        policy: &Policy,
        mode: Mode,
        cost: u64,
        budget: Option<&Budget>,
    ) -> CheckFuture {
        if mode == Mode::Check {
            if let Some(n) = &self.inner.negative {
                if let Some(d) = n.lookup(&key, policy.fingerprint(), cost, self.inner.clock.now())
                {
                    return CheckFuture::ready(Ok(d));
                }
            }
        }
        if let Some(fleet) = &self.inner.fleet {
            fleet.start();
        }
        let budget = budget.cloned();
        CheckFuture::boxed(
            self.inner
                .clone()
                .decide(key, policy.clone(), mode, cost, budget),
        )
    }
}

impl<K: KeyBytes + 'static> Store<K> for RedisStore {
    fn supports(&self, policy: &Policy) -> Result<(), ConfigError> {
        script::limit_args(policy).map(|_| ())
    }

    fn default_policy(&self) -> Option<Policy> {
        Some(self.inner.policy.clone())
    }

    /// Refused when another store of this connection with the same name applies other
    /// limits.
    fn policies_installed(&self, set: &PolicySet) -> Result<(), ConfigError> {
        let (fingerprint, words) = policies_claim(set.policies());
        self.inner.claim.update(fingerprint, words)
    }

    fn decide(&self, key: &K, policy: &Policy, cost: u64) -> CheckFuture {
        self.call(self.redis_key(key), policy, Mode::Check, cost, None)
    }

    /// The call's deadline is at most what `budget` has left; its wait is counted against
    /// it. With nothing left, the failure policy decides at once, without a call.
    fn decide_within(&self, key: &K, policy: &Policy, cost: u64, budget: &Budget) -> CheckFuture {
        self.call(self.redis_key(key), policy, Mode::Check, cost, Some(budget))
    }

    fn preview(&self, key: &K, policy: &Policy, cost: u64) -> CheckFuture {
        self.call(self.redis_key(key), policy, Mode::Peek, cost, None)
    }

    /// One script call: a charge whatever the limits (the script's sync mode) or a
    /// refund. No failure policy applies: an error is returned as it is.
    fn settle(&self, key: &K, policy: &Policy, reserved: u64, actual: u64) -> StoreFuture<()> {
        match actual.cmp(&reserved) {
            std::cmp::Ordering::Equal => StoreFuture::ready(Ok(())),
            std::cmp::Ordering::Greater => self.update(key, policy, Mode::Sync, actual - reserved),
            std::cmp::Ordering::Less => self.update(key, policy, Mode::Refund, reserved - actual),
        }
    }

    /// One script call (Lua numbers are exact below 2^53 ns, about 104 days). A ban Redis
    /// cannot take holds this instance's local fallback, when it has one: a pause asked
    /// for while Redis is away still pauses here.
    fn ban(&self, key: &K, policy: &Policy, ban: Duration) -> StoreFuture<()> {
        let ban = script::ban_ns(ban);
        let on_redis = self.update(key, policy, Mode::Ban, ban);
        let Some(fallback) = self.inner.fallback.clone() else {
            return on_redis;
        };
        let (key, policy) = (self.redis_key(key), policy.clone());
        StoreFuture::boxed(async move {
            if on_redis.await.is_err() {
                fallback.ban(&key, &policy, ban);
            }
            Ok(())
        })
    }

    /// Deletes the key's state (one `DEL`) and forgets its remembered refusals and its
    /// local fallback state.
    fn reset(&self, key: &K) -> StoreFuture<()> {
        let k = self.redis_key(key);
        if let Some(n) = &self.inner.negative {
            n.remove(&k);
        }
        if let Some(fb) = &self.inner.fallback {
            fb.local.forget(&k);
        }
        let shared = self.inner.clone();
        StoreFuture::boxed(async move { shared.delete(&k).await })
    }

    /// Sends the refund in the background (when called inside a tokio runtime; otherwise
    /// it is dropped).
    fn refund(&self, key: &K, policy: &Policy, cost: u64) {
        self.update(key, policy, Mode::Refund, cost)
            .detach("a refund");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `f` returns.
    fn future_size<A, F: Future>(_: impl FnOnce(A) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Every decision's future is moved whole into its box: the rare paths (the
    /// fallback's sync, the script's reload, the general script's retry) are boxed apart,
    /// and the layers do not each hold the call or its arguments, so that it stays small
    /// (the bound leaves room for the compiler's layout to drift; a rare path held inline
    /// again exceeds it: with the fallback's sync inline the future is 2 456 bytes).
    #[test]
    fn a_decisions_future_stays_small() {
        let policy = Policy::new(
            crate::algorithm::Limit::token_bucket(crate::quota::Quota::per_second(1).unwrap())
                .unwrap(),
        );
        let size = future_size(|s: Arc<Shared>| s.decide(Vec::new(), policy, Mode::Check, 1, None));
        assert!(size <= 1536, "{size} bytes");
    }
}

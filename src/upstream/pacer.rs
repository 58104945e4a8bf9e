//! The upstream layer's part of the core: a call waits for its partition's slot under
//! the limits in force for it (a pause, the configured limits, the quotas its upstream
//! announced), and its response is read for what the upstream says
//! ([`fields`](super::fields)).
//!
//! A partition's limits are one policy: first a pause (a token bucket too large to refuse
//! anything, which a pause bans), then the configured limits, then the learned quotas,
//! tightest first, as leaky queues at 95 % of a quota's rate with a burst served at once
//! (see [`Shared::learned_limit`]). Limits take a key's state over by position, so a
//! pause survives the quotas changing behind it. A pause is a [`Store::ban`]: on a shared
//! store it pauses every instance.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http::{HeaderMap, Request, StatusCode};
use tokio::time::Instant;

use super::fields::{self, Announced, Heard};
use crate::algorithm::Limit;
use crate::core::{Begin, Common, Core, Decide, Next, Part, RefundGuard};
use crate::decision::{Decision, Outcome, MAX_LIMITS};
use crate::error::{BoxError, ConfigError, RateLimited};
use crate::key::KeyBytes;
use crate::observe::{OncePerSecond, Sent, UpstreamMetrics};
use crate::options::OnStoreError;
use crate::policy::{Policy, PolicySet};
use crate::quota::Quota;
use crate::store::{Store, StoreFuture};

/// How many partitions' learned quotas are kept: past it, one is forgotten for each new
/// one (it applies the configured limits until its upstream speaks again).
const MAX_PARTITIONS: usize = 4096;

/// A learned quota is followed at this share of its rate (19/20), a margin for the clock
/// and the network between the upstream's count and ours.
const SHARE: (u64, u64) = (19, 20);

/// The longest window of a quota followed as a rate; longer ones are budgets.
const RATE_WINDOW_SECS: u64 = 60;

/// The upstream layer's part of the core.
#[allow(missing_debug_implementations)]
pub(crate) struct Pacer<St> {
    pub(crate) shared: Arc<Shared<St>>,
}

/// What every call of one layer shares.
#[allow(missing_debug_implementations)]
pub(crate) struct Shared<St> {
    pub(crate) store: St,
    /// The pause, then the configured limits: a partition's policy until it learns.
    base: Policy,
    /// The policy a pause bans until then.
    base_pausing: Policy,
    /// The pause alone: what a call that waited for its slot looks at before it goes.
    pause: Policy,
    learned: Mutex<HashMap<Box<[u8]>, Learned>>,
    pub(crate) max_wait: Duration,
    max_pause: Duration,
    label: Arc<str>,
    metrics: UpstreamMetrics,
    paused: OncePerSecond,
}

/// What a partition's upstream announced, and the policy it makes.
struct Learned {
    announced: Vec<Announced>,
    /// The longest `X-RateLimit-Reset` seen, in whole seconds: the window of its
    /// `X-RateLimit-Limit`, which that family does not say.
    x_window: u64,
    policy: Policy,
    /// The policy a pause bans: [`pausing`] of `policy`.
    pausing: Policy,
}

/// `policy` with every limit but the first (the pause) in shadow: what a pause bans.
fn pausing(policy: &Policy) -> Result<Policy, ConfigError> {
    let (pause, rest) = policy.limits().split_first().expect("a policy has a limit");
    Policy::from_limits(
        std::iter::once(pause.clone()).chain(rest.iter().map(|l| l.clone().shadow())),
    )
}

/// The limit a pause bans: it admits a million a second otherwise.
pub(crate) fn pause_limit() -> Result<Limit, ConfigError> {
    Limit::token_bucket(Quota::per_second(1_000_000)?)?.named("upstream-pause")
}

impl<St> Shared<St> {
    /// Checks the configured `limits` on `store` and installs them.
    pub(crate) fn new<K>(
        store: St,
        limits: Vec<Limit>,
        max_wait: Duration,
        max_pause: Duration,
        label: Arc<str>,
    ) -> Result<Self, ConfigError>
    where
        St: Store<Option<K>>,
    {
        if limits.len() >= MAX_LIMITS {
            return Err(ConfigError::PolicySet(format!(
                "an upstream limit takes at most {} configured limits ({} given): the \
                 pause and the quotas the upstream announces need the rest",
                MAX_LIMITS - 1,
                limits.len()
            )));
        }
        let pause = Policy::new(pause_limit()?);
        let base = Policy::from_limits(pause.limits().iter().cloned().chain(limits))?;
        store.supports(&base)?;
        store.policies_installed(&PolicySet::single(base.clone()))?;
        Ok(Shared {
            store,
            base_pausing: pausing(&base)?,
            base,
            pause,
            learned: Mutex::default(),
            max_wait,
            max_pause,
            metrics: UpstreamMetrics::new(&label),
            label,
            paused: OncePerSecond::default(),
        })
    }

    fn learned(&self) -> std::sync::MutexGuard<'_, HashMap<Box<[u8]>, Learned>> {
        self.learned.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The policy in force for `partition`.
    fn policy(&self, partition: &[u8]) -> Policy {
        match self.learned().get(partition) {
            Some(l) => l.policy.clone(),
            None => self.base.clone(),
        }
    }

    /// The policy a pause of `partition` bans, as `known` (its learned quotas) makes it.
    fn pausing_of(&self, known: Option<&Learned>) -> Policy {
        known.map_or_else(|| self.base_pausing.clone(), |l| l.pausing.clone())
    }

    /// Reads a response of `partition`'s upstream (its `key` in the store): a pause it
    /// asks for is banned into the store, quotas it announces are followed from the
    /// partition's next call. Returns what it said.
    pub(crate) fn hear<K>(
        &self,
        key: &Option<K>,
        partition: &[u8],
        status: StatusCode,
        headers: &HeaderMap,
    ) -> Heard
    where
        St: Store<Option<K>>,
    {
        let heard = fields::read(status, headers, SystemTime::now());
        let pausing = self.learn::<K>(partition, &heard);
        if let Some((pause, field)) = heard.pause {
            let pause = pause.min(self.max_pause);
            self.metrics.pause(field as usize);
            if self.paused.first(crate::observe::unix_secs()) {
                tracing::info!(target: "tollgate", limiter = %self.label, field = field.as_str(),
                    pause_ms = pause.as_millis() as u64, "the upstream asked for a pause");
            } else {
                tracing::debug!(target: "tollgate", limiter = %self.label, field = field.as_str(),
                    pause_ms = pause.as_millis() as u64, "the upstream asked for a pause");
            }
            self.store
                .ban(key, &pausing, pause)
                .detach("an upstream's pause");
        }
        heard
    }

    /// Pauses `key` for `pause`, at most `max_pause`.
    pub(crate) fn pause<K>(&self, key: &Option<K>, pause: Duration) -> StoreFuture<()>
    where
        St: Store<Option<K>>,
        K: KeyBytes,
    {
        let mut partition = Vec::new();
        key.write_key(&mut partition);
        let pausing = self.pausing_of(self.learned().get(&partition[..]));
        self.store.ban(key, &pausing, pause.min(self.max_pause))
    }

    /// Follows the quotas `heard` announced for `partition`; returns the policy a pause
    /// bans now.
    fn learn<K>(&self, partition: &[u8], heard: &Heard) -> Policy
    where
        St: Store<Option<K>>,
    {
        let mut learned = self.learned();
        let known = learned.get(partition);
        let mut x_window = known.map_or(0, |l| l.x_window);
        let announced = if !heard.policy.is_empty() {
            heard.policy.clone()
        } else if let Some((quota, reset)) = heard.x_limit {
            if let Some(reset) = reset {
                x_window = x_window.max(reset.ceil() as u64);
            }
            if x_window == 0 {
                return self.pausing_of(known);
            }
            vec![Announced {
                quota,
                window_secs: x_window,
            }]
        } else {
            return self.pausing_of(known);
        };
        if let Some(known) = known {
            if known.announced == announced {
                return known.pausing.clone();
            }
        }
        let policy = self.policy_with::<K>(&announced);
        let Ok(pausing) = pausing(&policy) else {
            return self.base_pausing.clone();
        };
        tracing::info!(target: "tollgate", limiter = %self.label, policy = %policy,
            "following the quotas the upstream announced");
        if learned.len() >= MAX_PARTITIONS && !learned.contains_key(partition) {
            if let Some(old) = learned.keys().next().cloned() {
                learned.remove(&old);
            }
        }
        learned.insert(
            partition.into(),
            Learned {
                announced,
                x_window,
                policy,
                pausing: pausing.clone(),
            },
        );
        pausing
    }

    /// The base policy with the `announced` quotas the store can decide, tightest rate
    /// first, as many as fit.
    fn policy_with<K>(&self, announced: &[Announced]) -> Policy
    where
        St: Store<Option<K>>,
    {
        let mut quotas = announced.to_vec();
        quotas.sort_by_key(|a| {
            // Ascending rate, quota / window, compared exactly.
            std::cmp::Reverse(Ratio(a.window_secs, a.quota))
        });
        quotas.dedup();
        let mut policy = self.base.clone();
        for a in quotas {
            if policy.limits().len() == MAX_LIMITS {
                break;
            }
            let Ok(limit) = self.learned_limit(a) else {
                continue;
            };
            if let Ok(wider) = policy.clone().and(limit) {
                if self.store.supports(&wider).is_ok() {
                    policy = wider;
                }
            }
        }
        policy
    }

    /// A learned quota as a limit: 95 % of its rate, queued up to the longest wait, with
    /// a burst served at once. A window of a minute or less is a rate: its burst is what
    /// the rate leaves of the quota in a window (a twentieth), so that no window of that
    /// length, wherever it starts, sees more than the quota (an upstream counting in
    /// windows refuses a whole quota sent at once after a rate's worth). A longer window
    /// is a budget: spent as fast as calls come, until the upstream says `r=0` (or
    /// `Remaining: 0`) and the partition pauses until its reset.
    fn learned_limit(&self, a: Announced) -> Result<Limit, ConfigError> {
        let overflow = || ConfigError::Overflow("an announced quota");
        let quota = Quota::new(
            a.quota.checked_mul(SHARE.0).ok_or_else(overflow)?,
            Duration::from_secs(a.window_secs.checked_mul(SHARE.1).ok_or_else(overflow)?),
        )?;
        let burst = if a.window_secs <= RATE_WINDOW_SECS {
            (a.quota * (SHARE.1 - SHARE.0) / SHARE.1).max(1)
        } else {
            a.quota
        };
        let interval = quota.emission_interval().as_nanos().max(1);
        let slots = u32::try_from(self.max_wait.as_nanos() / interval)
            .unwrap_or(u32::MAX)
            .saturating_add(1);
        let nodelay = u32::try_from(burst)
            .unwrap_or(u32::MAX)
            .min(u32::MAX - slots);
        let mut limit = Limit::leaky_queue_nodelay(quota, nodelay + slots, nodelay)?;
        if !self.max_wait.is_zero() {
            limit = limit.with_max_wait(self.max_wait)?;
        }
        limit.named(format!("upstream-{}-per-{}s", a.quota, a.window_secs))
    }
}

/// `a / b` ordered exactly (`b > 0`).
#[derive(PartialEq, Eq)]
struct Ratio(u64, u64);

impl PartialOrd for Ratio {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ratio {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (u128::from(self.0) * u128::from(other.1)).cmp(&(u128::from(other.0) * u128::from(self.1)))
    }
}

/// One call (or job) of one partition: what its wait and its response need.
pub(crate) struct Call<K, St> {
    shared: Arc<Shared<St>>,
    key: Option<K>,
    /// The key's bytes: where its learned quotas are found.
    partition: Box<[u8]>,
    on_error: OnStoreError,
}

/// How a call's wait ended.
pub(crate) enum Paced {
    /// Send it now.
    Go,
    /// Do not send it: no slot within the wait, or the store failed closed.
    Refuse(BoxError),
}

impl<K, St> Call<K, St>
where
    K: KeyBytes + Clone + Send + Sync + 'static,
    St: Store<Option<K>>,
{
    pub(crate) fn new(shared: &Arc<Shared<St>>, key: Option<K>, on_error: OnStoreError) -> Self {
        let mut partition = Vec::new();
        key.write_key(&mut partition);
        Call {
            shared: Arc::clone(shared),
            key,
            partition: partition.into(),
            on_error,
        }
    }

    /// Waits until the call may be sent: decides for one unit and sleeps through
    /// refusals (a pause, a full quota) and its slot as long as the layer's `max_wait`
    /// allows. `first` is a decision already made, with the policy it was made under. A call that waited for its slot looks
    /// for a pause before it goes: one begun meanwhile (asked of this instance or
    /// another) gives the slot back and is waited out.
    pub(crate) async fn pace(self: Arc<Self>, first: Option<(Policy, Decision)>) -> Paced {
        let shared = &self.shared;
        let until = Instant::now() + shared.max_wait;
        let mut decided = first;
        loop {
            let (policy, d) = match decided.take() {
                Some(first) => first,
                None => {
                    let policy = shared.policy(&self.partition);
                    match shared.store.decide(&self.key, &policy, 1).await {
                        Ok(d) => (policy, d),
                        Err(e) => return self.failed(e),
                    }
                }
            };
            let wait = match d.outcome() {
                Outcome::Allowed { wait } if Instant::now() + wait <= until => wait,
                Outcome::Allowed { wait } => {
                    // A slot past the wait: given back, refused with its time.
                    shared.store.refund(&self.key, &policy, 1);
                    let late = Outcome::Denied { retry_after: wait };
                    return self.refuse(Decision::without_state(
                        late,
                        d.source(),
                        d.limits().len(),
                    ));
                }
                Outcome::Denied { retry_after } if Instant::now() + retry_after <= until => {
                    tokio::time::sleep(retry_after).await;
                    continue;
                }
                _ => return self.refuse(d),
            };
            if !wait.is_zero() {
                let call = Arc::clone(&self);
                let slot =
                    RefundGuard::new(move || call.shared.store.refund(&call.key, &policy, 1));
                tokio::time::sleep(wait).await;
                if let Ok(paused) = shared.store.preview(&self.key, &shared.pause, 1).await {
                    if let Outcome::Denied { retry_after } = paused.outcome() {
                        drop(slot);
                        if Instant::now() + retry_after > until {
                            return self.refuse(paused);
                        }
                        tokio::time::sleep(retry_after).await;
                        continue;
                    }
                }
                slot.disarm();
            }
            shared.metrics.call(Sent::Upstream);
            return Paced::Go;
        }
    }

    fn refuse(&self, d: Decision) -> Paced {
        self.shared.metrics.call(Sent::Refused);
        Paced::Refuse(Box::new(RateLimited::new(d)))
    }

    fn failed(&self, e: crate::error::StoreError) -> Paced {
        match self.on_error {
            OnStoreError::FailClosed => {
                self.shared.metrics.call(Sent::FailClosed);
                Paced::Refuse(Box::new(e))
            }
            _ => {
                self.shared.metrics.call(Sent::FailOpen);
                Paced::Go
            }
        }
    }

    /// Waits for the call's turn and takes it (a job's turn).
    pub(crate) async fn acquire(self: Arc<Self>) -> Result<(), BoxError> {
        match self.pace(None).await {
            Paced::Go => Ok(()),
            Paced::Refuse(e) => Err(e),
        }
    }

    /// Reads the call's response.
    pub(crate) fn hear(&self, status: StatusCode, headers: &HeaderMap) -> Heard {
        self.shared
            .hear(&self.key, &self.partition, status, headers)
    }
}

/// What an admitted call leaves for its response: the reader of what its upstream says.
pub(crate) struct Learn(Arc<dyn Hear>);

impl Learn {
    /// Reads the response's status and fields.
    pub(crate) fn hear(&self, status: StatusCode, headers: &HeaderMap) {
        self.0.heard(status, headers);
    }
}

/// A call's response reader, its key's type erased.
trait Hear: Send + Sync {
    fn heard(&self, status: StatusCode, headers: &HeaderMap);
}

impl<K, St> Hear for Call<K, St>
where
    K: KeyBytes + Clone + Send + Sync + 'static,
    St: Store<Option<K>>,
{
    fn heard(&self, status: StatusCode, headers: &HeaderMap) {
        self.hear(status, headers);
    }
}

/// A call's wait, as the core's machine polls it.
pub(crate) struct Pace {
    wait: Pin<Box<dyn Future<Output = Paced> + Send>>,
    learn: Learn,
}

impl<B> Decide<Request<B>, BoxError, Learn> for Pace {
    type Answer = Paced;

    fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<Paced> {
        self.wait.as_mut().poll(cx)
    }

    fn next(self, paced: Paced, _: &mut Request<B>) -> Next<BoxError, Learn> {
        match paced {
            Paced::Go => Next::Proceed {
                wait: Duration::ZERO,
                extra: Some(self.learn),
                refund: None,
            },
            Paced::Refuse(e) => Next::Refuse(e),
        }
    }
}

impl<B, K, St> Part<Request<B>, K> for Pacer<St>
where
    K: KeyBytes + Clone + Send + Sync + 'static,
    St: Store<Option<K>>,
{
    type Answer = BoxError;
    type Extra = Learn;
    type Later = Pace;

    fn decide<X: Send + Sync + 'static>(
        core: &Arc<Core<X, Self>>,
        key: Option<K>,
        _: &mut Request<B>,
    ) -> Begin<BoxError, Learn, Pace> {
        let shared = &core.part.shared;
        let call = Arc::new(Call::new(shared, key, core.common.on_error()));
        let learn = Learn(Arc::clone(&call) as Arc<dyn Hear>);
        // The memory store decides at once: a call admitted now is sent now.
        let policy = shared.policy(&call.partition);
        let now = shared.store.decide_now(&call.key, &policy, 1);
        if let Some(d) = &now {
            if d.outcome()
                == (Outcome::Allowed {
                    wait: Duration::ZERO,
                })
            {
                shared.metrics.call(Sent::Upstream);
                return Begin::Now(Next::Proceed {
                    wait: Duration::ZERO,
                    extra: Some(learn),
                    refund: None,
                });
            }
        }
        Begin::Later(Pace {
            wait: Box::pin(call.pace(now.map(|d| (policy, d)))),
            learn,
        })
    }

    fn keyless(&self, _: &Common, _: &Request<B>, _: StatusCode) -> BoxError {
        Box::new(RateLimited::key_missing())
    }
}

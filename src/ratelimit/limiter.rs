//! The rate limits' part of the core (HTTP and generic): the cost, the store, the policies
//! (chosen per request, swapped live), key lists, shadow limits, bans, and what is
//! observed of every decision. Nothing here knows what a response is: each layer's
//! [flavour](Flavour) turns a decision into its own answer.
//!
//! A keyed request's way through it ([`Part::decide`]): its key's lists, its policy, its
//! cost and the store; the store's answer (at once, or later through the response future)
//! goes to `answered` (a failed store's answer under `OnStoreError`) and `respond`, which
//! observes and counts the decision and hands it to the flavour.

use std::{
    fmt,
    hash::Hash,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, OnceLock,
    },
    time::Duration,
};

use arc_swap::ArcSwap;

pub(crate) use super::flavour::{Flavour, Prepare, Settlement, Verdict};
pub(crate) use super::settings::Settings;
use crate::core::{Begin, Check, Common, Continuation, Core, Next, Part, RefundGuard};
use crate::cost::Cost;
use crate::decision::{Decision, Outcome, Source};
use crate::error::{ConfigError, StoreError};
use crate::observe::{key_hash, Observe, PolicyMetrics};
use crate::options::{KeyList, OnStoreError};
use crate::policy::{check_names, choose::Chooser, handle::Install, Policy, PolicySet};
use crate::store::Store;

/// Up to this many policies, a set's policies are all prepared when it is installed (their
/// series shown from the start); a larger set prepares its fallback then and any other
/// policy at its first decision.
const PREPARED_AT_ONCE: usize = 64;

/// A policy set as installed: each policy with what the flavour prepared for it and its
/// metrics, made when the set is installed for a set of up to [`PREPARED_AT_ONCE`]
/// policies, else for the fallback then and for any other policy at its first decision,
/// so that a large set (a policy per tenant) costs memory, and series in a metrics
/// recorder, in proportion to its text and to the policies in use.
pub(crate) struct Installed<P> {
    pub(crate) set: PolicySet,
    prepared: Box<[OnceLock<Box<Prepared<P>>>]>,
}

/// What a policy of an installed set needs to answer: the flavour's prepared fields and
/// the policy's metrics.
struct Prepared<P> {
    fields: P,
    metrics: PolicyMetrics,
}

impl<P> Installed<P> {
    /// Policy `i`'s prepared fields and metrics, made now if this is its first use.
    #[inline]
    fn prepared<F: Prepare<Prepared = P>>(
        &self,
        i: usize,
        flavour: &F,
        observe: &Observe,
    ) -> &Prepared<P> {
        let slot = &self.prepared[i];
        match slot.get() {
            Some(p) => p,
            None => self.prepare(i, flavour, observe),
        }
    }

    #[cold]
    fn prepare<F: Prepare<Prepared = P>>(
        &self,
        i: usize,
        flavour: &F,
        observe: &Observe,
    ) -> &Prepared<P> {
        self.prepared[i].get_or_init(|| {
            let e = self.set.entry(i);
            Box::new(Prepared {
                fields: flavour.prepare(e.name.as_deref(), &e.policy),
                metrics: observe.policy(e.name.as_deref()),
            })
        })
    }
}

/// A rate-limit layer's state: the core with the rate limits' part.
pub(crate) type RateCore<X, St, C, F> = Core<X, Limiter<St, C, F>>;

/// The rate limits' part of a layer. See the [module docs](self).
pub(crate) struct Limiter<St, C, F: Prepare> {
    pub(crate) store: St,
    pub(crate) cost: C,
    pub(crate) flavour: F,
    /// The set the layer was built with, read with one load while no swap happened (the
    /// common case: no shared counter or lock is touched per request).
    first: Arc<Installed<F::Prepared>>,
    /// The set in force once a swap happened.
    installed: ArcSwap<Installed<F::Prepared>>,
    swapped: AtomicBool,
    /// Every name the selector can return, when they are a closed set.
    names: Option<&'static [&'static str]>,
    /// The store's check of a set (every policy supported), which it is then told it
    /// applies; with the key type fixed when the layer was built.
    accept: fn(&St, &PolicySet) -> Result<(), ConfigError>,
    pub(crate) observe: Observe,
    /// Keys never limited, and keys refused.
    allow_keys: Option<KeyList>,
    deny_keys: Option<KeyList>,
    ban: Option<Duration>,
    /// The selector of a policy per request, when the layer has one.
    chooser: Option<Chooser>,
}

impl<St, C, F: Prepare> fmt::Debug for Limiter<St, C, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("policies", &self.installed.load().set)
            .finish_non_exhaustive()
    }
}

impl<St, C, F: Prepare> Limiter<St, C, F> {
    /// A limiter for a key type `K`: checks every policy of the set against the store and
    /// the selector.
    pub(crate) fn new<K: 'static>(
        cost: C,
        store: St,
        flavour: F,
        set: PolicySet,
        settings: Settings,
    ) -> Result<Self, ConfigError>
    where
        St: Store<Option<K>>,
    {
        let accept: fn(&St, &PolicySet) -> Result<(), ConfigError> = |st, set| {
            for p in set.policies() {
                <St as Store<Option<K>>>::supports(st, p)?;
            }
            <St as Store<Option<K>>>::policies_installed(st, set)
        };
        for list in [&settings.allow_keys, &settings.deny_keys]
            .into_iter()
            .flatten()
        {
            list.check::<K>()?;
        }
        if let Some(chooser) = &settings.chooser {
            chooser.check::<K>()?;
        }
        let observe = Observe::new(settings.label(), settings.route_metrics);
        let ban = settings.ban;
        let installed = Arc::new(prepare(&flavour, &observe, set, settings.names, |set| {
            check_ban(set, ban)?;
            accept(&store, set)
        })?);
        Ok(Limiter {
            store,
            cost,
            flavour,
            installed: ArcSwap::new(Arc::clone(&installed)),
            first: installed,
            swapped: AtomicBool::new(false),
            names: settings.names,
            accept,
            observe,
            allow_keys: settings.allow_keys,
            deny_keys: settings.deny_keys,
            ban: settings.ban,
            chooser: settings.chooser,
        })
    }

    /// The policy set in force.
    pub(crate) fn policies(&self) -> PolicySet {
        self.installed.load().set.clone()
    }
}

/// A ban needs every policy of the set to be made of GCRA-based limits.
fn check_ban(set: &PolicySet, ban: Option<Duration>) -> Result<(), ConfigError> {
    if ban.is_some() {
        for p in set.policies() {
            p.can_ban()?;
        }
    }
    Ok(())
}

/// Validates `set` and prepares it for installing.
fn prepare<F: Prepare>(
    flavour: &F,
    observe: &Observe,
    set: PolicySet,
    names: Option<&'static [&'static str]>,
    accept: impl FnOnce(&PolicySet) -> Result<(), ConfigError>,
) -> Result<Installed<F::Prepared>, ConfigError> {
    check_names(&set, names)?;
    accept(&set)?;
    let installed = Installed {
        prepared: (0..set.len()).map(|_| OnceLock::new()).collect(),
        set,
    };
    // The series of a small set's policies show from the start; a large set's fallback's.
    let at_once = if installed.set.len() <= PREPARED_AT_ONCE {
        installed.set.len()
    } else {
        1
    };
    for i in 0..at_once {
        installed.prepared(i, flavour, observe);
    }
    Ok(installed)
}

impl<X, St, C, F> Install for Core<X, Limiter<St, C, F>>
where
    X: Send + Sync + 'static,
    St: Send + Sync + 'static,
    C: Send + Sync + 'static,
    F: Prepare,
{
    fn install(&self, set: PolicySet) -> Result<(), ConfigError> {
        let l = &self.part;
        let installed = prepare(&l.flavour, &l.observe, set, l.names, |set| {
            check_ban(set, l.ban)?;
            (l.accept)(&l.store, set)
        })?;
        l.installed.store(Arc::new(installed));
        l.swapped.store(true, Ordering::Release);
        tracing::info!(target: "tollgate", limiter = %l.observe.label(), "rate-limit policies swapped");
        Ok(())
    }

    fn current(&self) -> PolicySet {
        self.part.policies()
    }
}

/// What a key must be to be kept by a store and carried into a later decision.
pub(crate) trait StoredKey: Hash + Clone + Send + Sync + 'static {}

impl<K: Hash + Clone + Send + Sync + 'static> StoredKey for K {}

/// The rate limits' decision of a keyed request, for a layer whose answers are `F`'s.
impl<Req, K, St, C, F> Part<Req, K> for Limiter<St, C, F>
where
    Req: 'static,
    K: StoredKey,
    St: Store<Option<K>>,
    C: Cost<Req> + Send + Sync + 'static,
    F: Flavour<Req>,
{
    type Answer = F::Refusal;
    type Extra = F::Extra;
    type Later = Check<Req, F::Refusal, F::Extra>;

    /// The key's lists, its policy, its cost and the store.
    #[inline]
    fn decide<X: Send + Sync + 'static>(
        core: &Arc<Core<X, Self>>,
        key: Option<K>,
        req: &mut Req,
    ) -> Begin<F::Refusal, F::Extra, Self::Later> {
        let l = &core.part;
        let swapped;
        let installed = if l.swapped.load(Ordering::Acquire) {
            swapped = l.installed.load();
            &*swapped
        } else {
            &l.first
        };
        if let (Some(k), true) = (&key, l.allow_keys.is_some() || l.deny_keys.is_some()) {
            let listed =
                |list: &Option<KeyList>| list.as_ref().is_some_and(|list| list.contains(k));
            if listed(&l.deny_keys) {
                return Begin::Now(Next::Refuse(l.deny(req)));
            }
            if listed(&l.allow_keys) {
                l.observe.exempt();
                return Begin::Unlimited;
            }
        }
        // A selector's choice is made out of line: the common path, without one, stays
        // small.
        let index = match &l.chooser {
            None => 0,
            Some(chooser) => l.flavour.choose(chooser, req, key.as_ref(), &installed.set),
        };
        // Resolved for the key once: a partial rollout's limits, enforced or in shadow.
        let policy = installed.set.entry(index).policy.for_key(|| key_hash(&key));
        let cost = l.cost.cost(req);
        let at = At {
            installed,
            index,
            policy,
            cost,
        };
        // Read in place: a decision is a few cache lines, and moving it out costs a copy.
        if let Some(d) = &l.store.decide_now(&key, policy, cost) {
            return Begin::Now(respond(core, req, &at, key, d, false));
        }
        let mut check = match l.flavour.budget(req) {
            Some(budget) => l.store.decide_within(&key, policy, cost, &budget),
            None => l.store.decide(&key, policy, cost),
        };
        match check.take_ready() {
            Some(result) => Begin::Now(answered(core, req, &at, key, result)),
            None => {
                let (core, installed, policy) =
                    (Arc::clone(core), Arc::clone(installed), policy.clone());
                let then: Continuation<Req, F::Refusal, F::Extra> =
                    Box::new(move |result, req: &mut Req| {
                        let at = At {
                            installed: &installed,
                            index,
                            policy: &policy,
                            cost,
                        };
                        answered(&core, req, &at, key, result)
                    });
                Begin::Later(Check { check, then })
            }
        }
    }

    fn keyless(&self, _: &Common, req: &Req, status: http::StatusCode) -> F::Refusal {
        self.flavour.keyless(req, status)
    }
}

impl<St, C, F: Prepare> Limiter<St, C, F> {
    /// A request on a deny list: refused, counted and logged (`debug`).
    #[cold]
    pub(crate) fn deny<Req>(&self, req: &Req) -> F::Refusal
    where
        F: Flavour<Req>,
    {
        self.observe.denied(self.flavour.route(req));
        self.flavour.denied(req)
    }
}

/// The store's answer, or its failure under the `OnStoreError` policy.
fn answered<X, Req, K, St, C, F>(
    core: &Arc<Core<X, Limiter<St, C, F>>>,
    req: &mut Req,
    at: &At<'_, F::Prepared>,
    key: Option<K>,
    result: Result<Decision, StoreError>,
) -> Next<F::Refusal, F::Extra>
where
    X: Send + Sync + 'static,
    F: Flavour<Req>,
    K: StoredKey,
    St: Store<Option<K>>,
    C: Send + Sync + 'static,
{
    let e = match result {
        Ok(d) => return respond(core, req, at, key, &d, false),
        Err(e) => e,
    };
    let l = &core.part;
    let on_error = core.common.on_error();
    let name = at.installed.set.entry(at.index).name.as_deref();
    l.observe
        .store_failed(name, l.flavour.route(req), &e, on_error);
    match on_error {
        OnStoreError::FailOpen => {
            let open = Outcome::Allowed {
                wait: Duration::ZERO,
            };
            let d = at.policy.without_state(open, Source::FailOpen);
            // Observed above, as the store failure it is.
            respond(core, req, at, key, &d, true)
        }
        OnStoreError::FailClosed => Next::Refuse(l.flavour.failed(req, e)),
    }
}

/// The decision observed (unless `observed` already: a failed store's open answer) and
/// counted, then the flavour's refusal or admission, with the refund of a queued request
/// dropped before its turn.
#[inline]
fn respond<X, Req, K, St, C, F>(
    core: &Arc<Core<X, Limiter<St, C, F>>>,
    req: &mut Req,
    at: &At<'_, F::Prepared>,
    key: Option<K>,
    d: &Decision,
    observed: bool,
) -> Next<F::Refusal, F::Extra>
where
    X: Send + Sync + 'static,
    F: Flavour<Req>,
    K: StoredKey,
    St: Store<Option<K>>,
    C: Send + Sync + 'static,
{
    let l = &core.part;
    if let Outcome::Allowed { wait } = d.outcome() {
        if !wait.is_zero() && l.flavour.time_left(req).is_some_and(|left| wait > left) {
            return late(l, req, at, key, d, wait);
        }
    }
    let plain =
        d.is_allowed() && !d.shadowed() && matches!(d.source(), Source::Local | Source::Store);
    if !plain && !observed {
        let name = at.installed.set.entry(at.index).name.as_deref();
        l.observe.decided(name, &|| l.flavour.route(req), &key, d);
    }
    let prepared = at.installed.prepared(at.index, &l.flavour, &l.observe);
    let metrics = &prepared.metrics;
    metrics.decided(d, || l.flavour.matched_route(req));
    let v = at.verdict(d, &prepared.fields);
    match d.outcome() {
        Outcome::Allowed { wait } => {
            let settle = l.flavour.settles().then(|| {
                let (core, key, policy) = (Arc::clone(core), key.clone(), at.policy.clone());
                let reserved = at.cost;
                // This request took the last unit of an enforced limit: counted, it bans.
                let shadow = policy.shadow_mask();
                let ban = l.ban.filter(|_| {
                    d.limits()
                        .iter()
                        .enumerate()
                        .any(|(i, r)| shadow & (1 << i) == 0 && r.remaining() == 0)
                });
                Settlement {
                    reserved,
                    settle: Box::new(move |actual| {
                        let store = &core.part.store;
                        if actual != reserved {
                            store
                                .settle(&key, &policy, reserved, actual)
                                .detach("a settled cost");
                        }
                        if let (Some(ban), true) = (ban, actual > 0) {
                            store.ban(&key, &policy, ban).detach("a ban");
                        }
                    }),
                }
            });
            // Queued until the inner service has the request (the guard disarmed), or
            // until its units go back (the guard dropped first): either way the closure
            // drops, and with it the request's place in the queued gauge.
            let refund = (!wait.is_zero()).then(|| {
                let (core, policy, cost) = (Arc::clone(core), at.policy.clone(), at.cost);
                let queued = metrics.queued();
                RefundGuard::new(move || {
                    drop(queued);
                    core.part.store.refund(&key, &policy, cost)
                })
            });
            Next::Proceed {
                wait,
                extra: l.flavour.admit(req, &v, settle),
                refund,
            }
        }
        _ => Next::Refuse(l.flavour.refuse(req, &v)),
    }
}

/// A request the store queued whose slot comes after its deadline: its units go back at
/// once (the slot is free for the next request), and it is refused with the slot's wait
/// as its retry-after (then it is served at once, whatever deadline it carries), counted
/// and logged apart from the other refusals (`deadline`).
#[cold]
fn late<Req, K, St, C, F>(
    l: &Limiter<St, C, F>,
    req: &mut Req,
    at: &At<'_, F::Prepared>,
    key: Option<K>,
    d: &Decision,
    wait: Duration,
) -> Next<F::Refusal, F::Extra>
where
    F: Flavour<Req>,
    K: StoredKey,
    St: Store<Option<K>>,
{
    l.store.refund(&key, at.policy, at.cost);
    let prepared = at.installed.prepared(at.index, &l.flavour, &l.observe);
    prepared.metrics.late(|| l.flavour.matched_route(req));
    let name = at.installed.set.entry(at.index).name.as_deref();
    let late = late_decision(d, at.policy, wait);
    l.observe.late(name, &|| l.flavour.route(req), &key, &late);
    Next::Refuse(l.flavour.late(req, &at.verdict(&late, &prepared.fields)))
}

/// A queued request's decision turned into its refusal for a deadline: refused, to retry
/// when its slot would have come; the queues (the limits that make a request wait) are
/// the limits it violates, and report nothing left for it until then (`r=0`, `t` its
/// retry-after, as `Retry-After`). The other limits report what the admission left (a
/// request's units fewer than they have after its units went back: never more).
fn late_decision(d: &Decision, policy: &Policy, wait: Duration) -> Decision {
    let mut late = *d;
    late.outcome = Outcome::Denied { retry_after: wait };
    let limits = policy.limits();
    let shadow = policy.shadow_mask();
    for r in &mut late.limits[..usize::from(d.len)] {
        // A queue in shadow delays nothing.
        let queue = shadow & (1 << r.index()) == 0
            && limits.get(r.index()).is_none_or(|l| {
                matches!(
                    l.algorithm(),
                    crate::algorithm::Algorithm::LeakyQueue { .. }
                )
            });
        r.allowed = !queue;
        if queue {
            r.remaining = 0;
            r.next_after = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        }
    }
    late
}

/// Where a request stands once its policy is chosen: the set, the policy's index in it,
/// the policy as resolved for the key, and the request's cost.
pub(crate) struct At<'a, P> {
    installed: &'a Arc<Installed<P>>,
    index: usize,
    policy: &'a Policy,
    cost: u64,
}

impl<'a, P> At<'a, P> {
    /// What the flavour is told of decision `d` for this request, with the policy's
    /// prepared fields.
    fn verdict(&self, d: &'a Decision, prepared: &'a P) -> Verdict<'a, P> {
        Verdict {
            decision: d,
            name: self.installed.set.entry(self.index).name.as_deref(),
            prepared,
            // The response reports the limits enforced for this key.
            shadow_mask: self.policy.shadow_mask(),
        }
    }
}

//! The limiter's core, shared by the rate-limit layers (HTTP and generic): the key, the
//! cost, the store, the policies (chosen per request, swapped live), the missing-key and
//! store-failure policies, shadow limits, and what is observed of every decision. Nothing
//! here knows what a response is: each layer's [flavour](Flavour) turns a decision into
//! its own answer.
//!
//! A request's way through it: [`Limiter::begin`] screens the request, extracts its key,
//! picks its policy and asks the store; the store's answer (at once, or later through the
//! response future) goes to `answered` (a failed store's answer under `OnStoreError`) and
//! `respond`, which observes and counts the decision and hands it to the flavour.

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

pub(crate) use super::flavour::{Flavour, Prepare, Screen, Settlement, Verdict};
pub(crate) use super::settings::Settings;
use crate::core::machine::{Begin, Continuation, Next, RefundGuard};
use crate::cost::Cost;
use crate::decision::{Decision, Outcome, Source};
use crate::error::{ConfigError, StoreError};
use crate::key::KeyExtractor;
use crate::observe::KeylessWarning;
use crate::observe::{key_hash, Observe, PolicyMetrics};
use crate::options::{KeyList, MissingKey, OnStoreError};
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

/// The core of a layer. See the [module docs](self).
pub struct Limiter<X, St, C, F: Prepare> {
    pub(crate) key: X,
    pub(crate) store: St,
    pub(crate) cost: C,
    pub(crate) missing: MissingKey,
    pub(crate) on_error: OnStoreError,
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
    /// The extractor's misconfiguration, logged once per layer.
    warned: KeylessWarning,
    pub(crate) observe: Observe,
    /// Keys never limited, and keys refused.
    allow_keys: Option<KeyList>,
    deny_keys: Option<KeyList>,
    ban: Option<Duration>,
    /// The selector of a policy per request, when the layer has one.
    chooser: Option<Chooser>,
}

impl<X, St, C, F: Prepare> fmt::Debug for Limiter<X, St, C, F>
where
    X: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("key", &self.key)
            .field("policies", &self.installed.load().set)
            .field("missing_key", &self.missing)
            .field("on_store_error", &self.on_error)
            .finish_non_exhaustive()
    }
}

impl<X, St, C, F: Prepare> Limiter<X, St, C, F> {
    /// A limiter for a key type `K`: checks every policy of the set against the store and
    /// the selector.
    pub(crate) fn new<K: 'static>(
        key: X,
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
        let observe = Observe::new(settings.label, settings.route_metrics);
        let ban = settings.ban;
        let installed = Arc::new(prepare(&flavour, &observe, set, settings.names, |set| {
            check_ban(set, ban)?;
            accept(&store, set)
        })?);
        Ok(Limiter {
            key,
            store,
            cost,
            missing: settings.missing,
            on_error: settings.on_error,
            flavour,
            installed: ArcSwap::new(Arc::clone(&installed)),
            first: installed,
            swapped: AtomicBool::new(false),
            names: settings.names,
            accept,
            warned: KeylessWarning::default(),
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

impl<X, St, C, F> Install for Limiter<X, St, C, F>
where
    X: Send + Sync + 'static,
    St: Send + Sync + 'static,
    C: Send + Sync + 'static,
    F: Prepare,
{
    fn install(&self, set: PolicySet) -> Result<(), ConfigError> {
        let installed = prepare(&self.flavour, &self.observe, set, self.names, |set| {
            check_ban(set, self.ban)?;
            (self.accept)(&self.store, set)
        })?;
        self.installed.store(Arc::new(installed));
        self.swapped.store(true, Ordering::Release);
        tracing::info!(target: "tollgate", limiter = %self.observe.label(), "rate-limit policies swapped");
        Ok(())
    }

    fn current(&self) -> PolicySet {
        self.policies()
    }
}

/// What a key must be to be kept by a store and carried into a later decision.
pub(crate) trait StoredKey: Hash + Clone + Send + Sync + 'static {}

impl<K: Hash + Clone + Send + Sync + 'static> StoredKey for K {}

// The request's way: every method below may move the limiter (an `Arc` of it) into a
// continuation or a settlement, so the key extractor and the cost are shared by threads.
impl<X, St, C, F> Limiter<X, St, C, F>
where
    X: Send + Sync + 'static,
    C: Send + Sync + 'static,
    F: Prepare,
{
    /// Extracts the key, picks the policy, weighs the request and asks the store.
    #[inline]
    pub(crate) fn begin<Req, K>(self: &Arc<Self>, req: &mut Req) -> Begin<Req, F::Refusal, F::Extra>
    where
        F: Flavour<Req>,
        X: KeyExtractor<Req, Key = K>,
        K: StoredKey,
        St: Store<Option<K>>,
        C: Cost<Req>,
        Req: 'static,
    {
        let swapped;
        let installed = if self.swapped.load(Ordering::Acquire) {
            swapped = self.installed.load();
            &*swapped
        } else {
            &self.first
        };
        match self.flavour.screen(req) {
            Screen::Limit => {}
            Screen::Exempt => {
                self.observe.exempt();
                return Begin::Unlimited;
            }
            Screen::Deny => return Begin::Now(Next::Refuse(self.deny(req))),
        }
        let key = match self.key.extract(req) {
            Some(k) => {
                if self.allow_keys.is_some() || self.deny_keys.is_some() {
                    let listed = |l: &Option<KeyList>| l.as_ref().is_some_and(|l| l.contains(&k));
                    if listed(&self.deny_keys) {
                        return Begin::Now(Next::Refuse(self.deny(req)));
                    }
                    if listed(&self.allow_keys) {
                        self.observe.exempt();
                        return Begin::Unlimited;
                    }
                }
                Some(k)
            }
            None => match self.keyless(req) {
                MissingKey::Shared => None,
                MissingKey::Allow => return Begin::Unlimited,
                MissingKey::Reject(status) => {
                    return Begin::Now(Next::Refuse(self.flavour.keyless(req, status)))
                }
            },
        };
        // A selector's choice is made out of line: the common path, without one, stays
        // small.
        let index = match &self.chooser {
            None => 0,
            Some(chooser) => self
                .flavour
                .choose(chooser, req, key.as_ref(), &installed.set),
        };
        // Resolved for the key once: a partial rollout's limits, enforced or in shadow.
        let policy = installed.set.entry(index).policy.for_key(|| key_hash(&key));
        let cost = self.cost.cost(req);
        let at = At {
            installed,
            index,
            policy,
            cost,
        };
        // Read in place: a decision is a few cache lines, and moving it out costs a copy.
        if let Some(d) = &self.store.decide_now(&key, policy, cost) {
            return Begin::Now(self.respond(req, &at, key, d, false));
        }
        let mut check = self
            .flavour
            .with_budget(req, || self.store.decide(&key, policy, cost));
        match check.take_ready() {
            Some(result) => Begin::Now(self.answered(req, &at, key, result)),
            None => {
                let (me, installed, policy) =
                    (Arc::clone(self), Arc::clone(installed), policy.clone());
                let then: Continuation<Req, F::Refusal, F::Extra> =
                    Box::new(move |result, req: &mut Req| {
                        let at = At {
                            installed: &installed,
                            index,
                            policy: &policy,
                            cost,
                        };
                        me.answered(req, &at, key, result)
                    });
                Begin::Later(check, then)
            }
        }
    }

    /// A request on a deny list: refused, counted and logged (`debug`).
    #[cold]
    fn deny<Req>(&self, req: &Req) -> F::Refusal
    where
        F: Flavour<Req>,
    {
        self.observe.denied(self.flavour.route(req));
        self.flavour.denied(req)
    }

    /// A request without a key: logged once per layer when the extractor says why, then
    /// `MissingKey` decides.
    #[cold]
    fn keyless<Req>(&self, req: &Req) -> MissingKey
    where
        X: KeyExtractor<Req>,
    {
        self.warned.keyless(
            &self.key,
            req,
            self.observe.label(),
            self.missing,
            "rate-limit",
        );
        self.missing
    }

    /// The store's answer, or its failure under the `OnStoreError` policy.
    fn answered<Req, K>(
        self: &Arc<Self>,
        req: &mut Req,
        at: &At<'_, F::Prepared>,
        key: Option<K>,
        result: Result<Decision, StoreError>,
    ) -> Next<F::Refusal, F::Extra>
    where
        F: Flavour<Req>,
        K: StoredKey,
        St: Store<Option<K>>,
    {
        let e = match result {
            Ok(d) => return self.respond(req, at, key, &d, false),
            Err(e) => e,
        };
        let name = at.installed.set.entry(at.index).name.as_deref();
        self.observe
            .store_failed(name, self.flavour.route(req), &e, self.on_error);
        match self.on_error {
            OnStoreError::FailOpen => {
                let open = Outcome::Allowed {
                    wait: Duration::ZERO,
                };
                let d = at.policy.without_state(open, Source::FailOpen);
                // Observed above, as the store failure it is.
                self.respond(req, at, key, &d, true)
            }
            OnStoreError::FailClosed => Next::Refuse(self.flavour.failed(req, e)),
        }
    }

    /// The decision observed (unless `observed` already: a failed store's open answer) and
    /// counted, then the flavour's refusal or admission, with the refund of a queued
    /// request dropped before its turn.
    #[inline]
    fn respond<Req, K>(
        self: &Arc<Self>,
        req: &mut Req,
        at: &At<'_, F::Prepared>,
        key: Option<K>,
        d: &Decision,
        observed: bool,
    ) -> Next<F::Refusal, F::Extra>
    where
        F: Flavour<Req>,
        K: StoredKey,
        St: Store<Option<K>>,
    {
        if let Outcome::Allowed { wait } = d.outcome() {
            if !wait.is_zero() && self.flavour.time_left(req).is_some_and(|left| wait > left) {
                return self.late(req, at, key, d, wait);
            }
        }
        let plain =
            d.is_allowed() && !d.shadowed() && matches!(d.source(), Source::Local | Source::Store);
        if !plain && !observed {
            let name = at.installed.set.entry(at.index).name.as_deref();
            self.observe
                .decided(name, &|| self.flavour.route(req), &key, d);
        }
        let prepared = at
            .installed
            .prepared(at.index, &self.flavour, &self.observe);
        let metrics = &prepared.metrics;
        metrics.decided(d, || self.flavour.matched_route(req));
        let v = at.verdict(d, &prepared.fields);
        match d.outcome() {
            Outcome::Allowed { wait } => {
                let settle = self.flavour.settles().then(|| {
                    let (me, key, policy) = (Arc::clone(self), key.clone(), at.policy.clone());
                    let reserved = at.cost;
                    // This request took the last unit of an enforced limit: counted, it bans.
                    let shadow = policy.shadow_mask();
                    let ban = self.ban.filter(|_| {
                        d.limits()
                            .iter()
                            .enumerate()
                            .any(|(i, r)| shadow & (1 << i) == 0 && r.remaining() == 0)
                    });
                    Settlement {
                        reserved,
                        settle: Box::new(move |actual| {
                            if actual != reserved {
                                me.store
                                    .settle(&key, &policy, reserved, actual)
                                    .detach("a settled cost");
                            }
                            if let (Some(ban), true) = (ban, actual > 0) {
                                me.store.ban(&key, &policy, ban).detach("a ban");
                            }
                        }),
                    }
                });
                // Queued until the inner service has the request (the guard disarmed), or
                // until its units go back (the guard dropped first): either way the
                // closure drops, and with it the request's place in the queued gauge.
                let refund = (!wait.is_zero()).then(|| {
                    let (me, policy, cost) = (Arc::clone(self), at.policy.clone(), at.cost);
                    let queued = metrics.queued();
                    RefundGuard::new(move || {
                        drop(queued);
                        me.store.refund(&key, &policy, cost)
                    })
                });
                Next::Proceed {
                    wait,
                    extra: self.flavour.admit(req, &v, settle),
                    refund,
                }
            }
            _ => Next::Refuse(self.flavour.refuse(req, &v)),
        }
    }

    /// A request the store queued whose slot comes after its deadline: its units go back
    /// at once (the slot is free for the next request), and it is refused with the slot's
    /// wait as its retry-after (then it is served at once, whatever deadline it carries),
    /// counted and logged apart from the other refusals (`deadline`).
    #[cold]
    fn late<Req, K>(
        &self,
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
        self.store.refund(&key, at.policy, at.cost);
        let prepared = at
            .installed
            .prepared(at.index, &self.flavour, &self.observe);
        prepared.metrics.late(|| self.flavour.matched_route(req));
        let name = at.installed.set.entry(at.index).name.as_deref();
        let late = late_decision(d, at.policy, wait);
        self.observe
            .late(name, &|| self.flavour.route(req), &key, &late);
        Next::Refuse(self.flavour.late(req, &at.verdict(&late, &prepared.fields)))
    }
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

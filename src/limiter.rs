//! The limiter's core, shared by the HTTP layer and the generic one: the key, the cost,
//! the store, the policies (chosen per request, swapped live), the missing-key and
//! store-failure policies, shadow limits, and what is observed of every decision. Nothing
//! here knows what a response is: each layer turns a decision into its own answer. The
//! public items are the options both layers share: [`MissingKey`] and [`OnStoreError`].

use std::{
    any::{Any, TypeId},
    fmt,
    hash::{Hash, Hasher},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use arc_swap::ArcSwap;
use http::StatusCode;

use crate::{
    algorithm::Limit,
    cost::Cost,
    decision::{Decision, Outcome, Source},
    error::{ConfigError, StoreError},
    future::{Continuation, Next, RefundGuard},
    key::KeyExtractor,
    layer::DefaultStore,
    observe::{Observe, PolicyMetrics},
    policy::{check_names, handle::Install, IntoPolicy, Policy, PolicySet},
    store::{CheckFuture, MemoryStore, Store},
};

/// What to do with a request from which no key can be extracted. Never silently unlimited
/// unless you choose [`MissingKey::Allow`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// All keyless requests share one bucket of the same limit (the default): a missing
    /// `x-api-key` is limited like one anonymous client; a server started without
    /// `ConnectInfo` is limited as a whole, which shows at once instead of passing silently.
    #[default]
    Shared,
    /// Refuse keyless requests: with this status (e.g. `400`) and a problem body on HTTP,
    /// with [`KeyMissing`](crate::error::KeyMissing) on the generic layer. A `401` must
    /// carry `WWW-Authenticate` (RFC 9110): add it in your auth layer, which knows the
    /// scheme (see the `authenticated_user` example).
    Reject(StatusCode),
    /// Let keyless requests through unlimited.
    Allow,
}

/// What to do when the store fails (a custom store returned an error). The Redis store
/// applies its own failure policy and does not return errors here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnStoreError {
    /// Admit the request. The default, as at Stripe and in Envoy: a limiter outage must
    /// not become an API outage.
    #[default]
    FailOpen,
    /// Refuse it: `503` with a `temporary-reduced-capacity` problem body for HTTP, a
    /// [`StoreError`] for the generic middleware.
    FailClosed,
}

/// What a layer prepares for each policy when a set is installed (the HTTP layer's
/// formatted header values), so that no request formats them.
pub(crate) trait Prepare: Send + Sync + 'static {
    type Prepared: Send + Sync + 'static;

    fn prepare(&self, name: Option<&str>, policy: &Policy) -> Self::Prepared;
}

/// A decided request as a flavour sees it.
pub(crate) struct Verdict<'a, P> {
    pub(crate) decision: &'a Decision,
    pub(crate) name: Option<&'a str>,
    pub(crate) prepared: &'a P,
    /// The limits in shadow for this request's key, by index (bit `i`: limit `i`).
    pub(crate) shadow_mask: u8,
}

/// How a layer answers: what a refusal is (a response, an error) and what an admitted
/// request carries to its response.
pub(crate) trait Flavour<Req>: Prepare {
    type Refusal;
    type Extra;

    fn refuse(&self, req: &Req, v: &Verdict<'_, Self::Prepared>) -> Self::Refusal;
    /// What an admitted request carries to its response (none: the response goes out as
    /// the inner service made it), with the settlement of its cost when the layer settles
    /// costs from responses.
    fn admit(
        &self,
        req: &mut Req,
        v: &Verdict<'_, Self::Prepared>,
        settle: Option<Settlement>,
    ) -> Option<Self::Extra>;
    fn failed(&self, req: &Req, error: StoreError) -> Self::Refusal;
    fn keyless(&self, req: &Req, status: StatusCode) -> Self::Refusal;
    /// The answer to a request on a deny list.
    fn denied(&self, req: &Req) -> Self::Refusal;
    /// What the layer's own rules say of a request before its key is read (skipped, or
    /// its address on a list).
    fn screen(&self, req: &Req) -> Screen;
    /// Whether admitted requests settle their cost from their response.
    fn settles(&self) -> bool;
    /// The route, for events.
    fn route<'r>(&self, req: &'r Req) -> Option<&'r str>;
}

/// What a layer's exemption and deny rules say of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Screen {
    /// Limited as usual.
    Limit,
    /// Never limited: no state, no rate-limit fields.
    Exempt,
    /// Refused (`403` on HTTP).
    Deny,
}

/// The cost of an admitted request still to be settled from its response: call it with
/// the real cost; dropped, the reserved cost stays charged.
pub(crate) struct Settlement {
    /// The units charged when the request was admitted.
    pub(crate) reserved: u64,
    settle: Box<dyn FnOnce(u64) + Send>,
}

impl fmt::Debug for Settlement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settlement")
            .field("reserved", &self.reserved)
            .finish_non_exhaustive()
    }
}

impl Settlement {
    /// Charges or refunds the difference between `actual` and the reserved cost (and
    /// bans the key when the layer bans and this counted request exhausted its limit).
    pub(crate) fn settle(self, actual: u64) {
        (self.settle)(actual);
    }
}

/// Whether a key (of the list's type) is on the list.
type Contains = dyn Fn(&dyn Any) -> bool + Send + Sync;

/// A list of keys (allowed or denied) for a key type fixed when it was given, matched
/// without the limiter knowing that type.
#[derive(Clone)]
pub(crate) struct KeyList {
    key_type: TypeId,
    key_type_name: &'static str,
    contains: Arc<Contains>,
}

impl KeyList {
    pub(crate) fn new<K, I>(keys: I) -> Self
    where
        K: Hash + Eq + Send + Sync + 'static,
        I: IntoIterator<Item = K>,
    {
        let set: std::collections::HashSet<K> = keys.into_iter().collect();
        KeyList {
            key_type: TypeId::of::<K>(),
            key_type_name: std::any::type_name::<K>(),
            contains: Arc::new(move |k| k.downcast_ref::<K>().is_some_and(|k| set.contains(k))),
        }
    }

    fn check<K: 'static>(&self) -> Result<(), ConfigError> {
        if self.key_type == TypeId::of::<K>() {
            return Ok(());
        }
        Err(ConfigError::KeyList(format!(
            "a key list of {} for keys of type {}",
            self.key_type_name,
            std::any::type_name::<K>()
        )))
    }
}

impl fmt::Debug for KeyList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyList")
            .field("key_type", &self.key_type_name)
            .finish_non_exhaustive()
    }
}

/// A policy set as installed: each policy with what the flavour prepared for it and its
/// metrics.
pub(crate) struct Installed<P> {
    pub(crate) set: PolicySet,
    prepared: Vec<P>,
    metrics: Vec<PolicyMetrics>,
}

/// The core of a layer. See the [module docs](self).
pub(crate) struct Limiter<X, St, C, F: Prepare> {
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
}

/// How a request starts.
pub(crate) enum Begin<Req, O, H> {
    /// Decided: refuse, or proceed (perhaps after a wait).
    Now(Next<O, H>),
    /// The store answers later.
    Later(CheckFuture, Continuation<Req, O, H>),
    /// No limit applies (a keyless request under `MissingKey::Allow`).
    Unlimited,
}

/// What both layers' builders configure besides the key, the cost and the answers: the
/// policies, what to do without a key or a store, the layer's name and its memory budget.
/// Errors are kept (the first one) and reported when the layer is built.
#[derive(Debug)]
pub(crate) struct Settings {
    limits: Vec<Limit>,
    named: Vec<(String, Policy)>,
    set: Option<PolicySet>,
    /// Every name the selector can return, when they are a closed set.
    pub(crate) names: Option<&'static [&'static str]>,
    error: Option<ConfigError>,
    pub(crate) missing: MissingKey,
    pub(crate) on_error: OnStoreError,
    pub(crate) max_bytes: Option<usize>,
    pub(crate) label: Arc<str>,
    pub(crate) allow_keys: Option<KeyList>,
    pub(crate) deny_keys: Option<KeyList>,
    /// How long a key is refused once a counted response exhausts its limit.
    pub(crate) ban: Option<Duration>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            limits: Vec::new(),
            named: Vec::new(),
            set: None,
            names: None,
            error: None,
            missing: MissingKey::default(),
            on_error: OnStoreError::default(),
            max_bytes: None,
            label: "tollgate".into(),
            allow_keys: None,
            deny_keys: None,
            ban: None,
        }
    }
}

impl Settings {
    /// Keeps `error` for `build`, unless an earlier one is kept already.
    pub(crate) fn fail(&mut self, error: ConfigError) {
        self.error.get_or_insert(error);
    }

    pub(crate) fn limit(&mut self, limit: Result<Limit, ConfigError>) {
        match limit {
            Ok(l) => self.limits.push(l),
            Err(e) => self.fail(e),
        }
    }

    pub(crate) fn policy(&mut self, policy: impl IntoPolicy) {
        match policy.into_policy() {
            Ok(p) => self.limits.extend(p.limits().iter().cloned()),
            Err(e) => self.fail(e),
        }
    }

    pub(crate) fn named_policy(&mut self, name: String, policy: impl IntoPolicy) {
        match policy.into_policy() {
            Ok(p) => self.named.push((name, p)),
            Err(e) => self.fail(e),
        }
    }

    pub(crate) fn policies(&mut self, set: PolicySet) {
        self.set = Some(set);
    }

    /// The policy set described, or `None` when no limit was given.
    fn take_set(&mut self) -> Result<Option<PolicySet>, ConfigError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let limits = std::mem::take(&mut self.limits);
        let named = std::mem::take(&mut self.named);
        if let Some(set) = self.set.take() {
            if !limits.is_empty() || !named.is_empty() {
                return Err(ConfigError::PolicySet(
                    "policies(..) replaces limit(..) and named_policy(..): give one or the other"
                        .into(),
                ));
            }
            return Ok(Some(set));
        }
        if !named.is_empty() {
            return PolicySet::named(named, limits).map(Some);
        }
        if limits.is_empty() {
            return Ok(None);
        }
        Ok(Some(PolicySet::single(Policy::from_limits(limits)?)))
    }

    /// The set, and the in-memory store a layer builds for itself (under the layer's
    /// label and memory budget).
    pub(crate) fn memory_store<K>(&mut self) -> Result<(PolicySet, DefaultStore<K>), ConfigError>
    where
        K: Hash + Eq + Clone + Send + Sync + 'static,
    {
        let set = self.take_set()?.ok_or(ConfigError::NoLimits)?;
        let store = MemoryStore::for_layer(set.fallback().clone(), &self.label, self.max_bytes)?;
        Ok((set, store))
    }

    /// The set for a store of the user's: the limits given, or else the store's own.
    pub(crate) fn set_for<K, St: Store<Option<K>>>(
        &mut self,
        store: &St,
    ) -> Result<PolicySet, ConfigError> {
        if self.max_bytes.is_some() {
            return Err(ConfigError::Store(
                "max_bytes sizes the built-in store; set the budget on your store instead".into(),
            ));
        }
        match self.take_set()? {
            Some(set) => Ok(set),
            None => Ok(PolicySet::single(
                store.default_policy().ok_or(ConfigError::NoLimits)?,
            )),
        }
    }
}

/// A stable hash of a key: for events (keys never appear as they are) and for choosing
/// the keys a partly enforced limit applies to (the same choice in every process).
pub(crate) fn key_hash<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut h = siphasher::sip::SipHasher13::new_with_keys(0x746f_6c6c_6761_7465, 0x6b65_7973);
    key.hash(&mut h);
    h.finish()
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
            <St as Store<Option<K>>>::policies_installed(st, set);
            Ok(())
        };
        for list in [&settings.allow_keys, &settings.deny_keys]
            .into_iter()
            .flatten()
        {
            list.check::<K>()?;
        }
        let observe = Observe::new(settings.label);
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
    let mut prepared = Vec::with_capacity(set.len());
    let mut metrics = Vec::with_capacity(set.len());
    for i in 0..set.len() {
        let e = set.entry(i);
        prepared.push(flavour.prepare(e.name.as_deref(), &e.policy));
        metrics.push(observe.policy(e.name.as_deref()));
    }
    Ok(Installed {
        set,
        prepared,
        metrics,
    })
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

impl<X, St, C, F: Prepare> Limiter<X, St, C, F> {
    /// Extracts the key, picks the policy, weighs the request and asks the store.
    #[inline]
    pub(crate) fn begin<Req, K>(self: &Arc<Self>, req: &mut Req) -> Begin<Req, F::Refusal, F::Extra>
    where
        F: Flavour<Req>,
        X: KeyExtractor<Req, Key = K> + Send + Sync + 'static,
        K: Hash + Clone + Send + Sync + 'static,
        St: Store<Option<K>>,
        C: Cost<Req> + Send + Sync + 'static,
        Req: 'static,
        F::Refusal: 'static,
        F::Extra: 'static,
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
                    let listed = |l: &Option<KeyList>| l.as_ref().is_some_and(|l| (l.contains)(&k));
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
        let index = self.key.policy(req, key.as_ref(), &installed.set).0;
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
            return Begin::Now(self.conclude(req, &at, key, d));
        }
        let mut check = self.store.decide(&key, policy, cost);
        match check.take_ready() {
            Some(result) => Begin::Now(self.settle(req, &at, key, result)),
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
                        me.settle(req, &at, key, result)
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
    fn settle<Req, K>(
        self: &Arc<Self>,
        req: &mut Req,
        at: &At<'_, F::Prepared>,
        key: Option<K>,
        result: Result<Decision, StoreError>,
    ) -> Next<F::Refusal, F::Extra>
    where
        F: Flavour<Req>,
        K: Hash + Clone + Send + Sync + 'static,
        St: Store<Option<K>>,
        X: Send + Sync + 'static,
        C: Send + Sync + 'static,
    {
        let e = match result {
            Ok(d) => return self.conclude(req, at, key, &d),
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
                let d = Decision::without_state(open, Source::FailOpen, at.policy.limits().len());
                // Observed above, as the store failure it is.
                self.respond(req, at, key, &d)
            }
            OnStoreError::FailClosed => Next::Refuse(self.flavour.failed(req, e)),
        }
    }

    /// From a decision to the next step: what is observed of it, then the answer.
    #[inline]
    fn conclude<Req, K>(
        self: &Arc<Self>,
        req: &mut Req,
        at: &At<'_, F::Prepared>,
        key: Option<K>,
        d: &Decision,
    ) -> Next<F::Refusal, F::Extra>
    where
        F: Flavour<Req>,
        K: Hash + Clone + Send + Sync + 'static,
        St: Store<Option<K>>,
        X: Send + Sync + 'static,
        C: Send + Sync + 'static,
    {
        let plain =
            d.is_allowed() && !d.shadowed() && matches!(d.source(), Source::Local | Source::Store);
        if !plain {
            let name = at.installed.set.entry(at.index).name.as_deref();
            self.observe.decided(name, self.flavour.route(req), &key, d);
        }
        self.respond(req, at, key, d)
    }

    /// The decision counted, then the flavour's refusal or admission, with the refund of
    /// a queued request dropped before its turn.
    #[inline]
    fn respond<Req, K>(
        self: &Arc<Self>,
        req: &mut Req,
        at: &At<'_, F::Prepared>,
        key: Option<K>,
        d: &Decision,
    ) -> Next<F::Refusal, F::Extra>
    where
        F: Flavour<Req>,
        K: Hash + Clone + Send + Sync + 'static,
        St: Store<Option<K>>,
        X: Send + Sync + 'static,
        C: Send + Sync + 'static,
    {
        at.installed.metrics[at.index].decided(d);
        let v = Verdict {
            decision: d,
            name: at.installed.set.entry(at.index).name.as_deref(),
            prepared: &at.installed.prepared[at.index],
            // The response reports the limits enforced for this key.
            shadow_mask: at.policy.shadow_mask(),
        };
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
                let refund = (!wait.is_zero()).then(|| {
                    let (me, policy, cost) = (Arc::clone(self), at.policy.clone(), at.cost);
                    RefundGuard::new(move || me.store.refund(&key, &policy, cost))
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
}

/// Where a request stands once its policy is chosen: the set, the policy's index in it,
/// the policy as resolved for the key, and the request's cost.
pub(crate) struct At<'a, P> {
    installed: &'a Arc<Installed<P>>,
    index: usize,
    policy: &'a Policy,
    cost: u64,
}

/// A layer's one warning about keyless requests whose extractor says why (the server is
/// not set up to give it what it needs: no connection address, no matched route), since
/// such a setup quietly puts every client into one bucket. Shared by every layer kind.
#[derive(Debug, Default)]
pub(crate) struct KeylessWarning(AtomicBool);

impl KeylessWarning {
    #[cold]
    pub(crate) fn keyless<Req, X: KeyExtractor<Req>>(
        &self,
        key: &X,
        req: &Req,
        label: &str,
        missing: MissingKey,
        kind: &str,
    ) {
        if self.0.load(Ordering::Relaxed) {
            return;
        }
        if let Some(why) = key.misconfiguration(req) {
            if !self.0.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    target: "tollgate",
                    limiter = %label,
                    missing_key = ?missing,
                    "{kind} key missing: {why} (logged once per layer)"
                );
            }
        }
    }
}

/// Counts refusals in a window of one second: the first store failure of each second is
/// logged at `warn`, the others at `debug` (an outage would otherwise log every request).
#[derive(Debug, Default)]
pub(crate) struct OncePerSecond(AtomicU64);

impl OncePerSecond {
    /// Whether this is the first call in the current second of `now_secs`.
    pub(crate) fn first(&self, now_secs: u64) -> bool {
        self.0.swap(now_secs, Ordering::Relaxed) != now_secs
    }
}

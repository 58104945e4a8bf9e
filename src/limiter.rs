//! The limiter's core, shared by the HTTP layer and the generic one: the key, the cost,
//! the store, the policies (chosen per request, swapped live), the missing-key and
//! store-failure policies, shadow limits, and what is observed of every decision. Nothing
//! here knows what a response is: each layer turns a decision into its own answer. The
//! public items are the options both layers share: [`MissingKey`] and [`OnStoreError`].

use std::{
    fmt,
    hash::{Hash, Hasher},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, PoisonError, RwLock,
    },
    time::Duration,
};

use http::StatusCode;

use crate::{
    cost::Cost,
    decision::{Decision, Outcome, Source},
    error::{ConfigError, StoreError},
    future::{Continuation, Next, RefundGuard},
    key::KeyExtractor,
    observe::{Observe, PolicyMetrics},
    policy::{check_names, handle::Install, Policy, PolicySet},
    store::{CheckFuture, Store},
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
    fn admit(&self, req: &mut Req, v: &Verdict<'_, Self::Prepared>) -> Self::Extra;
    fn failed(&self, req: &Req, error: StoreError) -> Self::Refusal;
    fn keyless(&self, req: &Req, status: StatusCode) -> Self::Refusal;
    /// The route, for events.
    fn route<'r>(&self, req: &'r Req) -> Option<&'r str>;
}

/// A policy set as installed: each policy with what the flavour prepared for it and its
/// metrics.
pub(crate) struct Installed<P> {
    pub(crate) set: PolicySet,
    prepared: Vec<P>,
    metrics: Vec<PolicyMetrics>,
}

/// A service's copy of its limiter's installed set, taken again only when a swap changed
/// it: a request reads one atomic instead of a shared pointer.
pub(crate) struct Snapshot<P> {
    installed: Arc<Installed<P>>,
    version: u64,
}

impl<P> Clone for Snapshot<P> {
    fn clone(&self) -> Self {
        Snapshot {
            installed: Arc::clone(&self.installed),
            version: self.version,
        }
    }
}

/// The core of a layer. See the [module docs](self).
pub(crate) struct Limiter<X, St, C, F: Prepare> {
    pub(crate) key: X,
    pub(crate) store: St,
    pub(crate) cost: C,
    pub(crate) missing: MissingKey,
    pub(crate) on_error: OnStoreError,
    pub(crate) flavour: F,
    installed: RwLock<Arc<Installed<F::Prepared>>>,
    /// Counts installs; a [`Snapshot`] of an older count is taken again.
    version: AtomicU64,
    /// Every name the selector can return, when they are a closed set.
    names: Option<&'static [&'static str]>,
    /// The store's check of a policy, with the key type fixed when the layer was built.
    supports: fn(&St, &Policy) -> Result<(), ConfigError>,
    /// The store's `policies_installed`, likewise.
    installed_hook: fn(&St, &PolicySet),
    /// Whether the extractor's misconfiguration was logged already (once per layer).
    warned: AtomicBool,
    pub(crate) observe: Observe,
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

/// The parts of a limiter set when a layer is built.
pub(crate) struct Parts<X, St, C, F> {
    pub(crate) key: X,
    pub(crate) store: St,
    pub(crate) cost: C,
    pub(crate) missing: MissingKey,
    pub(crate) on_error: OnStoreError,
    pub(crate) flavour: F,
    pub(crate) set: PolicySet,
    pub(crate) names: Option<&'static [&'static str]>,
    pub(crate) label: Arc<str>,
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
            .field("policies", &self.current_installed().set)
            .field("missing_key", &self.missing)
            .field("on_store_error", &self.on_error)
            .finish_non_exhaustive()
    }
}

impl<X, St, C, F: Prepare> Limiter<X, St, C, F> {
    /// A limiter for a key type `K`: checks every policy of the set against the store and
    /// the selector.
    pub(crate) fn new<K>(parts: Parts<X, St, C, F>) -> Result<Self, ConfigError>
    where
        St: Store<Option<K>>,
    {
        let supports: fn(&St, &Policy) -> Result<(), ConfigError> =
            |st, p| <St as Store<Option<K>>>::supports(st, p);
        let installed_hook: fn(&St, &PolicySet) =
            |st, set| <St as Store<Option<K>>>::policies_installed(st, set);
        let observe = Observe::new(parts.label);
        let installed = prepare(&parts.flavour, &observe, parts.set, parts.names, |p| {
            supports(&parts.store, p)
        })?;
        parts.store.policies_installed(&installed.set);
        Ok(Limiter {
            key: parts.key,
            store: parts.store,
            cost: parts.cost,
            missing: parts.missing,
            on_error: parts.on_error,
            flavour: parts.flavour,
            installed: RwLock::new(Arc::new(installed)),
            version: AtomicU64::new(0),
            names: parts.names,
            supports,
            installed_hook,
            warned: AtomicBool::new(false),
            observe,
        })
    }

    /// The policy set in force.
    pub(crate) fn policies(&self) -> PolicySet {
        self.current_installed().set.clone()
    }

    fn current_installed(&self) -> Arc<Installed<F::Prepared>> {
        Arc::clone(
            &self
                .installed
                .read()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// The installed set, for a new service.
    pub(crate) fn snapshot(&self) -> Snapshot<F::Prepared> {
        // The count first: a swap between the two reads is seen again next time.
        let version = self.version.load(Ordering::Acquire);
        Snapshot {
            installed: self.current_installed(),
            version,
        }
    }
}

/// Validates `set` and prepares it for installing.
fn prepare<F: Prepare>(
    flavour: &F,
    observe: &Observe,
    set: PolicySet,
    names: Option<&'static [&'static str]>,
    supports: impl Fn(&Policy) -> Result<(), ConfigError>,
) -> Result<Installed<F::Prepared>, ConfigError> {
    check_names(&set, names)?;
    let mut prepared = Vec::with_capacity(set.len());
    let mut metrics = Vec::with_capacity(set.len());
    for i in 0..set.len() {
        let e = set.entry(i);
        supports(&e.policy)?;
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
        let installed = prepare(&self.flavour, &self.observe, set, self.names, |p| {
            (self.supports)(&self.store, p)
        })?;
        (self.installed_hook)(&self.store, &installed.set);
        *self
            .installed
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(installed);
        self.version.fetch_add(1, Ordering::Release);
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
    pub(crate) fn begin<Req, K>(
        self: &Arc<Self>,
        snapshot: &mut Snapshot<F::Prepared>,
        req: &mut Req,
    ) -> Begin<Req, F::Refusal, F::Extra>
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
        if self.version.load(Ordering::Acquire) != snapshot.version {
            *snapshot = self.snapshot();
        }
        let installed = &snapshot.installed;
        let key = match self.key.extract(req) {
            Some(k) => Some(k),
            None => match self.keyless(req) {
                MissingKey::Shared => None,
                MissingKey::Allow => return Begin::Unlimited,
                MissingKey::Reject(status) => {
                    return Begin::Now(Next::Refuse(self.flavour.keyless(req, status)))
                }
            },
        };
        let choice = self.key.policy(req, key.as_ref(), &installed.set);
        let index = choice.0;
        let policy = installed.set.entry(index).policy.for_key(|| key_hash(&key));
        let cost = self.cost.cost(req);
        if let Some(d) = self.store.decide_now(&key, policy, cost) {
            return Begin::Now(self.conclude(req, installed, index, key, cost, &d, false));
        }
        let mut check = self.store.decide(&key, policy, cost);
        match check.take_ready() {
            Some(result) => Begin::Now(self.settle(req, installed, index, key, cost, result)),
            None => {
                let (me, installed) = (Arc::clone(self), Arc::clone(installed));
                let then: Continuation<Req, F::Refusal, F::Extra> =
                    Box::new(move |result, req: &mut Req| {
                        me.settle(req, &installed, index, key, cost, result)
                    });
                Begin::Later(check, then)
            }
        }
    }

    /// A request without a key: logs once per layer when the extractor says why (the
    /// server is not set up to give it what it needs), then follows `MissingKey`.
    #[cold]
    fn keyless<Req>(&self, req: &Req) -> MissingKey
    where
        X: KeyExtractor<Req>,
    {
        if !self.warned.load(Ordering::Relaxed) {
            if let Some(why) = self.key.misconfiguration(req) {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        target: "tollgate",
                        limiter = %self.observe.label(),
                        missing_key = ?self.missing,
                        "rate-limit key missing: {why} (logged once per layer)"
                    );
                }
            }
        }
        self.missing
    }

    /// The store's answer, or its failure under the `OnStoreError` policy.
    fn settle<Req, K>(
        self: &Arc<Self>,
        req: &mut Req,
        installed: &Installed<F::Prepared>,
        index: usize,
        key: Option<K>,
        cost: u64,
        result: Result<Decision, StoreError>,
    ) -> Next<F::Refusal, F::Extra>
    where
        F: Flavour<Req>,
        K: Hash + Clone + Send + Sync + 'static,
        St: Store<Option<K>>,
        X: Send + Sync + 'static,
        C: Send + Sync + 'static,
    {
        match result {
            Ok(d) => self.conclude(req, installed, index, key, cost, &d, false),
            Err(e) => {
                let entry = installed.set.entry(index);
                let route = self.flavour.route(req);
                self.observe
                    .store_failed(entry.name.as_deref(), route, &e, self.on_error);
                match self.on_error {
                    OnStoreError::FailOpen => {
                        let d = Decision::without_state(
                            Outcome::Allowed {
                                wait: Duration::ZERO,
                            },
                            Source::FailOpen,
                            entry.policy.limits().len(),
                        );
                        // Counted and logged as the store failure above.
                        self.conclude(req, installed, index, key, cost, &d, true)
                    }
                    OnStoreError::FailClosed => Next::Refuse(self.flavour.failed(req, e)),
                }
            }
        }
    }

    /// From a decision to the next step: shadow limits, what is observed (unless the
    /// failure that led to it already was), the flavour's refusal or admission, and the
    /// refund of a queued request dropped before its turn.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn conclude<Req, K>(
        self: &Arc<Self>,
        req: &mut Req,
        installed: &Installed<F::Prepared>,
        index: usize,
        key: Option<K>,
        cost: u64,
        d: &Decision,
        observed: bool,
    ) -> Next<F::Refusal, F::Extra>
    where
        F: Flavour<Req>,
        K: Hash + Clone + Send + Sync + 'static,
        St: Store<Option<K>>,
        X: Send + Sync + 'static,
        C: Send + Sync + 'static,
    {
        let entry = installed.set.entry(index);
        // The store let through what only limits in shadow refused; the response reports
        // the limits enforced for this key.
        let policy = entry.policy.for_key(|| key_hash(&key));
        let shadow_mask = policy.shadow_mask();
        let metrics = &installed.metrics[index.min(installed.metrics.len() - 1)];
        metrics.decided(d);
        let plain =
            d.is_allowed() && !d.shadowed() && matches!(d.source(), Source::Local | Source::Store);
        if !plain && !observed {
            self.observe
                .decided(entry.name.as_deref(), self.flavour.route(req), &key, d);
        }
        let v = Verdict {
            decision: d,
            name: entry.name.as_deref(),
            prepared: &installed.prepared[index.min(installed.prepared.len() - 1)],
            shadow_mask,
        };
        match d.outcome() {
            Outcome::Allowed { wait } => {
                let refund = (!wait.is_zero()).then(|| {
                    let (me, policy) = (Arc::clone(self), policy.clone());
                    RefundGuard::new(move || me.store.refund(&key, &policy, cost))
                });
                Next::Proceed {
                    wait,
                    extra: self.flavour.admit(req, &v),
                    refund,
                }
            }
            _ => Next::Refuse(self.flavour.refuse(req, &v)),
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

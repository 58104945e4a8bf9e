//! What a layer's builder configures besides the key, the cost and the answers, kept
//! until the layer is built.

use std::{hash::Hash, sync::Arc, time::Duration};

use crate::algorithm::Limit;
use crate::core::CommonOptions;
use crate::error::ConfigError;
use crate::options::KeyList;
use crate::policy::{choose::Chooser, IntoPolicy, Policy, PolicySet};
use crate::store::{MemoryStore, Store};

/// What the rate-limit layers' builders (HTTP and generic) configure besides the key, the
/// cost and the answers: the policies, what to do without a key or a store, the layer's
/// name and its memory budget.
/// Errors are kept (the first one) and reported when the layer is built.
#[derive(Debug)]
pub(crate) struct Settings {
    limits: Vec<Limit>,
    named: Vec<(String, Policy)>,
    set: Option<PolicySet>,
    /// Every name the selector can return, when they are a closed set.
    pub(crate) names: Option<&'static [&'static str]>,
    error: Option<ConfigError>,
    /// The layer's name, what becomes of keyless requests and of store failures.
    pub(crate) common: CommonOptions,
    pub(crate) max_bytes: Option<usize>,
    pub(crate) allow_keys: Option<KeyList>,
    pub(crate) deny_keys: Option<KeyList>,
    /// How long a key is refused once a counted response exhausts its limit.
    pub(crate) ban: Option<Duration>,
    /// The selector of a policy per request, when one was given.
    pub(crate) chooser: Option<Chooser>,
    /// Whether decisions are counted by matched route too.
    pub(crate) route_metrics: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            limits: Vec::new(),
            named: Vec::new(),
            set: None,
            names: None,
            error: None,
            common: CommonOptions::new("tollgate"),
            max_bytes: None,
            allow_keys: None,
            deny_keys: None,
            ban: None,
            chooser: None,
            route_metrics: false,
        }
    }
}

impl Settings {
    /// The layer's name.
    pub(crate) fn label(&self) -> Arc<str> {
        self.common.label.as_str().into()
    }

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
    pub(crate) fn memory_store<K>(
        &mut self,
    ) -> Result<(PolicySet, MemoryStore<Option<K>>), ConfigError>
    where
        K: Hash + Eq + Clone + Send + Sync + 'static,
    {
        let set = self.take_set()?.ok_or(ConfigError::NoLimits)?;
        let store =
            MemoryStore::for_layer(set.fallback().clone(), &self.common.label, self.max_bytes)?;
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

//! [`PolicySet`]: named policies (plans) and the limits every one of them applies, and
//! [`PolicyName`], what a selector returns.

use std::{
    collections::{hash_map::Entry as Slot, HashMap},
    fmt,
    sync::Arc,
};

use crate::{algorithm::Limit, error::ConfigError};

use super::{limits::Policy, quote::echo};

/// Named policies, and the limits every one of them also applies. See the
/// [module docs](super).
///
/// The first policy is the fallback: what a selector's unknown name gets (see the layer
/// builders' `select`). A set without names holds one policy (a layer's `limit` calls).
/// Cheap to clone.
#[derive(Clone)]
pub struct PolicySet {
    inner: Arc<SetInner>,
}

struct SetInner {
    entries: Vec<Entry>,
    every: Vec<Limit>,
    /// Each name's position in `entries`: duplicates are found, and a large set searched,
    /// in time linear in its size.
    by_name: HashMap<Arc<str>, usize>,
}

/// Up to this many policies a name is looked up by scanning them (no hashing).
const SCAN: usize = 8;

/// One policy of a set.
pub(crate) struct Entry {
    pub(crate) name: Option<Arc<str>>,
    /// The limits every policy applies, then the policy's own.
    pub(crate) policy: Policy,
}

impl fmt::Debug for PolicySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        for e in &self.inner.entries {
            m.entry(&e.name.as_deref().unwrap_or("(unnamed)"), &e.policy);
        }
        m.finish()
    }
}

impl PartialEq for PolicySet {
    fn eq(&self, other: &Self) -> bool {
        self.inner.entries.len() == other.inner.entries.len()
            && self
                .inner
                .entries
                .iter()
                .zip(&other.inner.entries)
                .all(|(a, b)| a.name == b.name && a.policy == b.policy)
    }
}

fn check_name(name: &str) -> Result<(), ConfigError> {
    if name.is_empty() || name == "*" || !name.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return Err(ConfigError::PolicySet(format!(
            "policy name {} must be printable ASCII without spaces, and not \"*\"",
            echo(name)
        )));
    }
    Ok(())
}

impl PolicySet {
    /// A set of one unnamed policy.
    pub fn single(policy: impl Into<Policy>) -> Self {
        PolicySet {
            inner: Arc::new(SetInner {
                entries: vec![Entry {
                    name: None,
                    policy: policy.into(),
                }],
                every: Vec::new(),
                by_name: HashMap::new(),
            }),
        }
    }

    /// Named policies (the first is the fallback) and the limits every one of them also
    /// applies, first. A policy's limits without a name of their own take the policy's
    /// name (`pro`), or `pro-2` and so on when it has several.
    ///
    /// # Errors
    ///
    /// [`ConfigError::PolicySet`] for no policy, a duplicate or unusable name;
    /// [`ConfigError::TooManyLimits`] when a policy and the common limits exceed
    /// four.
    pub fn named<N: Into<String>>(
        policies: impl IntoIterator<Item = (N, Policy)>,
        every: impl IntoIterator<Item = Limit>,
    ) -> Result<Self, ConfigError> {
        let policies = policies.into_iter().map(|(n, p)| (n.into(), p, None));
        Self::build(policies, every.into_iter().collect())
    }

    /// From `(name, policy, line)` entries as read from text: `*` holds the common limits.
    pub(crate) fn from_entries(
        entries: Vec<(String, Policy, usize)>,
    ) -> Result<PolicySet, ConfigError> {
        let mut every = None;
        let mut named = Vec::with_capacity(entries.len());
        for (name, policy, line) in entries {
            if name != "*" {
                named.push((name, policy, Some(line)));
            } else if every.is_some() {
                return Err(ConfigError::Line {
                    line,
                    error: Box::new(ConfigError::PolicySet("\"*\" appears twice".into())),
                });
            } else {
                every = Some(policy.limits().to_vec());
            }
        }
        Self::build(named.into_iter(), every.unwrap_or_default())
    }

    /// The set of `policies` (each with the line of text it was read from, if it was) and
    /// the limits `every` one applies; an error names the line. Each name is checked
    /// against the earlier ones in a hash map, so a set of any size is built in linear
    /// time.
    fn build(
        policies: impl Iterator<Item = (String, Policy, Option<usize>)>,
        every: Vec<Limit>,
    ) -> Result<Self, ConfigError> {
        let mut entries: Vec<Entry> = Vec::with_capacity(policies.size_hint().0);
        let mut by_name = HashMap::with_capacity(policies.size_hint().0);
        for (name, policy, line) in policies {
            let at = |error: ConfigError| match line {
                Some(line) => ConfigError::Line {
                    line,
                    error: Box::new(error),
                },
                None => error,
            };
            check_name(&name).map_err(at)?;
            let name: Arc<str> = name.into();
            match by_name.entry(Arc::clone(&name)) {
                Slot::Occupied(_) => {
                    let twice = format!("policy {} appears twice", echo(&name));
                    return Err(at(ConfigError::PolicySet(twice)));
                }
                Slot::Vacant(slot) => slot.insert(entries.len()),
            };
            let own = policy.limits();
            let several = own.len() > 1;
            let limits = every
                .iter()
                .cloned()
                .chain(own.iter().enumerate().map(|(i, l)| {
                    // One limit takes the policy's name itself (shared, not copied).
                    let default = if several {
                        format!("{name}-{}", i + 1).into()
                    } else {
                        Arc::clone(&name)
                    };
                    l.clone().named_by_default(&default)
                }));
            let policy = Policy::from_limits(limits).map_err(|e| {
                at(ConfigError::PolicySet(format!(
                    "policy {}: {e}",
                    echo(&name)
                )))
            })?;
            entries.push(Entry {
                name: Some(name),
                policy,
            });
        }
        if entries.is_empty() {
            return Err(ConfigError::PolicySet("no policy in the set".into()));
        }
        Ok(PolicySet {
            inner: Arc::new(SetInner {
                entries,
                every,
                by_name,
            }),
        })
    }

    /// The names of the policies, the fallback first (none for a set of one unnamed
    /// policy).
    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.inner.entries.iter().filter_map(|e| e.name.as_deref())
    }

    /// The policy named `name` as it applies: the common limits first, then its own.
    pub fn policy(&self, name: &str) -> Option<&Policy> {
        self.index_of(name).map(|i| &self.inner.entries[i].policy)
    }

    /// The fallback policy (the first).
    pub fn fallback(&self) -> &Policy {
        &self.inner.entries[0].policy
    }

    /// Every policy as it applies, in order.
    pub fn policies(&self) -> impl Iterator<Item = &Policy> + '_ {
        self.inner.entries.iter().map(|e| &e.policy)
    }

    /// The limits every policy applies.
    pub fn every(&self) -> &[Limit] {
        &self.inner.every
    }

    #[inline]
    pub(crate) fn index_of(&self, name: &str) -> Option<usize> {
        let inner = &*self.inner;
        if inner.entries.len() <= SCAN {
            inner
                .entries
                .iter()
                .position(|e| e.name.as_deref() == Some(name))
        } else {
            inner.by_name.get(name).copied()
        }
    }

    #[inline]
    pub(crate) fn entry(&self, i: usize) -> &Entry {
        &self.inner.entries[i.min(self.inner.entries.len() - 1)]
    }

    pub(crate) fn len(&self) -> usize {
        self.inner.entries.len()
    }
}

impl From<Policy> for PolicySet {
    fn from(policy: Policy) -> Self {
        PolicySet::single(policy)
    }
}

impl From<Limit> for PolicySet {
    fn from(limit: Limit) -> Self {
        PolicySet::single(Policy::new(limit))
    }
}

/// A value that names a policy of a set: what a selector returns.
///
/// Strings name any policy; an unknown name gets the set's fallback. An enum of plans can
/// list every name it takes ([`PolicyName::all_names`]), and a layer then refuses to build
/// (or a swap to install) a set that lacks one of them.
///
/// ```
/// use tollgate::policy::PolicyName;
///
/// #[derive(Clone, Copy)]
/// enum Plan { Free, Pro }
///
/// impl PolicyName for Plan {
///     fn policy_name(&self) -> &str {
///         match self { Plan::Free => "free", Plan::Pro => "pro" }
///     }
///     fn all_names() -> Option<&'static [&'static str]> {
///         Some(&["free", "pro"])
///     }
/// }
/// ```
pub trait PolicyName {
    /// The name of the policy.
    fn policy_name(&self) -> &str;

    /// Every name values of this type can take, when they are a closed set.
    fn all_names() -> Option<&'static [&'static str]>
    where
        Self: Sized,
    {
        None
    }
}

impl PolicyName for &str {
    fn policy_name(&self) -> &str {
        self
    }
}

impl PolicyName for String {
    fn policy_name(&self) -> &str {
        self
    }
}

impl PolicyName for Arc<str> {
    fn policy_name(&self) -> &str {
        self
    }
}

impl<N: PolicyName> PolicyName for Option<N> {
    /// `None` names the fallback.
    fn policy_name(&self) -> &str {
        self.as_ref().map_or("", PolicyName::policy_name)
    }
}

/// The most names of a set an error lists.
const LISTED: usize = 10;

/// Checks that a set holds every name a closed selector can return.
pub(crate) fn check_names(
    set: &PolicySet,
    names: Option<&'static [&'static str]>,
) -> Result<(), ConfigError> {
    for n in names.unwrap_or_default() {
        if set.index_of(n).is_none() {
            let mut has: Vec<&str> = set.names().take(LISTED + 1).collect();
            if has.len() > LISTED {
                has[LISTED] = "...";
            }
            return Err(ConfigError::PolicySet(format!(
                "the selector can name {n:?}, which the set lacks (it has {})",
                has.join(", ")
            )));
        }
    }
    Ok(())
}

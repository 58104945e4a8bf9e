//! Policy tags: the small number a store keeps with each key's state to say which policy
//! wrote it, so that a state can be carried over when the key is decided under another.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU32, AtomicU64, Ordering},
        PoisonError, RwLock,
    },
};

use crate::{algorithm::MAX_WORDS, policy::Policy};

static STORE_IDS: AtomicU32 = AtomicU32::new(1);

/// Counts the sets layers installed, process-wide: the later a set, the larger its count.
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

/// One store's policies by tag: one tag per distinct set of parameters it has written
/// state under, so the table grows with the configurations used, not with requests. A
/// policy installed but never decided under is not kept: only its parameters' fingerprint
/// and the generation of the set it came in (a few dozen bytes, not the policy).
pub(crate) struct Tags {
    /// Process-unique, for the tag each policy caches.
    id: u32,
    registry: RwLock<Registry>,
}

#[derive(Default)]
struct Registry {
    by_fingerprint: HashMap<u64, u32>,
    policies: Vec<Policy>,
    /// By tag: the count of the last set installed with this policy (0: none).
    generations: Vec<u64>,
    /// By fingerprint, for the parameters installed but not yet decided under: the count
    /// of the last set installed with them, which their tag takes when they get one.
    pending: HashMap<u64, u64>,
}

impl Tags {
    pub(crate) fn new() -> Self {
        Tags {
            id: STORE_IDS.fetch_add(1, Ordering::Relaxed),
            registry: RwLock::new(Registry::default()),
        }
    }

    /// The tag of `policy`: cached in the policy, or registered (once per distinct set of
    /// parameters).
    #[inline]
    pub(crate) fn tag(&self, policy: &Policy) -> u32 {
        match policy.cached_tag(self.id) {
            Some(t) => t,
            None => self.register(policy),
        }
    }

    #[cold]
    fn register(&self, policy: &Policy) -> u32 {
        let mut r = self
            .registry
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let next = r.policies.len() as u32;
        let fingerprint = policy.fingerprint();
        let tag = *r.by_fingerprint.entry(fingerprint).or_insert(next);
        if tag == next {
            let generation = r.pending.remove(&fingerprint).unwrap_or(0);
            r.policies.push(policy.clone());
            r.generations.push(generation);
        }
        policy.cache_tag(self.id, tag);
        tag
    }

    /// Records that a layer installed these policies together (a set, built or swapped).
    pub(crate) fn installed<'a>(&self, policies: impl Iterator<Item = &'a Policy>) {
        let generation = GENERATIONS.fetch_add(1, Ordering::Relaxed);
        let mut r = self
            .registry
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        for p in policies {
            let fingerprint = p.fingerprint();
            match r.by_fingerprint.get(&fingerprint) {
                Some(&tag) => r.generations[tag as usize] = generation,
                None => {
                    r.pending.insert(fingerprint, generation);
                }
            }
        }
    }

    /// Whether the policy tagged `a` belongs to a set installed after that of `b`: a
    /// request decided under `b` began before a swap to `a`'s set. A policy no layer
    /// installed (one the upstream layer learned, one a store is asked about directly)
    /// belongs to no set, and is older than none: a request under it is a change of plan.
    pub(crate) fn newer(&self, a: u32, b: u32) -> bool {
        let r = self.registry.read().unwrap_or_else(PoisonError::into_inner);
        let g = |t: u32| r.generations.get(t as usize).copied().unwrap_or(0);
        g(b) != 0 && g(a) > g(b)
    }

    /// The policy a state tagged `tag` was written under.
    pub(crate) fn policy(&self, tag: u32) -> Option<Policy> {
        let r = self.registry.read().unwrap_or_else(PoisonError::into_inner);
        r.policies.get(tag as usize).cloned()
    }

    /// `state`, written under the policy tagged `tag`, as `policy`'s state at `now` (see
    /// [`Policy::carry_from`]); fresh when the tag is unknown.
    pub(crate) fn carry(
        &self,
        tag: u32,
        state: &[u64],
        policy: &Policy,
        now: u64,
    ) -> [u64; MAX_WORDS] {
        self.with(tag, |old| {
            old.map_or([0; MAX_WORDS], |old| policy.carry_from(old, state, now))
        })
    }

    /// Runs `f` on the policy tagged `tag` without cloning it.
    pub(crate) fn with<R>(&self, tag: u32, f: impl FnOnce(Option<&Policy>) -> R) -> R {
        let r = self.registry.read().unwrap_or_else(PoisonError::into_inner);
        f(r.policies.get(tag as usize))
    }
}

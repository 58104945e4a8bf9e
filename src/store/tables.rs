//! The memory store's tables: each key's state, in one word (a token bucket, one limit)
//! or several (several limits, windows), keyed by the key itself or by a digest of it; and
//! the decision made on a state in hand.

use std::{
    hash::Hash,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex, PoisonError,
    },
};

use siphasher::sip128::{Hasher128, SipHasher13};

use super::map::{self, Both, Entry, KeyHasher, ShardInner, ShardedMap};
use super::tags::Tags;
use crate::{algorithm::MAX_WORDS, decision::Decision, policy::Policy};

/// Counters of a [`MemoryStore`](super::MemoryStore).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Keys currently held.
    pub keys: usize,
    /// Bytes held: the tables' allocations and multi-limit states (at most the budget).
    pub bytes: usize,
    /// Keys dropped because their state was back to fresh (nothing lost).
    pub evicted_fresh: u64,
    /// Keys dropped to stay within the budget while they still carried state (they restart
    /// full).
    pub evicted_with_state: u64,
}

/// How keys are kept: as they are, or as digests.
pub(super) enum Keys<K> {
    Inline(Tables<K>, KeyHasher),
    Digest(Tables<Digest>, SipKeys),
}

/// A 96-bit keyed digest of a key's `Hash` output: twelve bytes, aligned to four, so that
/// with its tag and state an entry takes 24 bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Digest(pub(super) [u32; 3]);

/// The digest's random keys, drawn once per store.
#[derive(Clone, Copy)]
pub(crate) struct SipKeys(pub(super) u64, pub(super) u64);

impl SipKeys {
    pub(crate) fn random() -> Self {
        // std's RandomState is seeded from the OS once per thread; two fresh states give
        // two independent 64-bit outputs.
        let draw = |i: u64| std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), i);
        SipKeys(draw(0), draw(1))
    }

    #[inline]
    pub(crate) fn digest<K: Hash + ?Sized>(&self, key: &K) -> Digest {
        let mut h = SipHasher13::new_with_keys(self.0, self.1);
        key.hash(&mut h);
        let d = h.finish128();
        Digest([(d.h1 >> 32) as u32, d.h1 as u32, d.h2 as u32])
    }
}

impl Digest {
    #[inline]
    pub(crate) fn hash(&self) -> u64 {
        u64::from(self.0[0]) << 32 | u64::from(self.0[1])
    }
}

/// A single GCRA limit's state: the key, the tag of the policy it was written under, the
/// TAT.
pub(super) type One<S> = (S, u32, AtomicU64);
/// Any other policy's state: the key, and under its lock the tag and the words.
pub(super) type Many<S> = (S, Mutex<(u32, Box<[u64]>)>);

impl<S: Send + Sync> Entry for (S, u32, AtomicU64) {}
impl<S: Send + Sync> Entry for (S, Mutex<(u32, Box<[u64]>)>) {
    fn heap_bytes(&self) -> usize {
        let words = self
            .1
            .lock()
            .map_or_else(|e| e.into_inner().1.len(), |s| s.1.len());
        map::allocation_bytes(words * 8)
    }
}

pub(super) type Tables<S> = ShardedMap<One<S>, Many<S>>;
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Check,
    Peek,
    Refund,
    /// Charges whatever the limits say (a settled cost above its estimate).
    Force,
    /// Forgets the key's state.
    Reset,
    /// Refuses the key for `cost` ns.
    Ban,
}

/// A store and a policy: what every table operation needs.
pub(super) struct Ctx<'a> {
    pub(super) policy: &'a Policy,
    pub(super) tag: u32,
    pub(super) tags: &'a Tags,
    /// The policy's limits in shadow for the key.
    pub(super) shadow: u8,
}

impl Ctx<'_> {
    /// `state` (written under `tag`) as this policy's state at `now`.
    pub(super) fn own(&self, tag: u32, state: &[u64; MAX_WORDS], now: u64) -> [u64; MAX_WORDS] {
        if tag == self.tag {
            return *state;
        }
        self.tags.carry(tag, state, self.policy, now)
    }
}

/// How far a single-limit state is from fresh.
pub(super) fn residual_one<S>(now: u64) -> impl FnMut(&mut One<S>) -> u64 {
    move |e| e.2.get_mut().saturating_sub(now)
}

/// How far a multi-limit state is from fresh: 0 when fresh, else at least 1. A state
/// written under a policy the store no longer knows counts as fresh.
pub(super) fn residual_many<'a, S>(
    tags: &'a Tags,
    now: u64,
) -> impl FnMut(&mut Many<S>) -> u64 + 'a {
    move |e| {
        let (tag, words) = e.1.get_mut().unwrap_or_else(PoisonError::into_inner);
        tags.with(*tag, |policy| match policy {
            None => 0,
            Some(p) if p.is_fresh(words, now) => 0,
            Some(p) => (p.report(words, now).reset_after().as_nanos() as u64).max(1),
        })
    }
}

/// One operation on one key of a table, as the memory store asks it: with the store's
/// policy and its clock, read only once the key's state is in hand (see `Gcra::charge`).
pub(super) struct Call<'a, N> {
    pub(super) cx: &'a Ctx<'a>,
    pub(super) op: Op,
    pub(super) cost: u64,
    pub(super) now: N,
}

impl<N: Fn() -> u64 + Copy> Call<'_, N> {
    /// The decision for `key` in `t` (`rehash` hashes a key as the table does): the
    /// common cases under the shard's read lock.
    #[inline]
    pub(super) fn run<S, R>(self, t: &Tables<S>, key: &S, rehash: R) -> Decision
    where
        S: Eq + Clone + Send + Sync,
        R: Fn(&S) -> u64 + Copy,
    {
        let Call { cx, op, cost, now } = self;
        let hash = rehash(key);
        match (cx.policy.single_gcra(), op) {
            (Some(g), Op::Check) => {
                // The hot path: a known key under a single GCRA limit, written under this
                // same policy. The decision is built once, here, in the caller's slot.
                let found = {
                    let inner = t.read(hash);
                    inner
                        .one
                        .find(hash, |e| e.0 == *key && e.1 == cx.tag)
                        .map(|e| g.charge(&e.2, now, cost))
                };
                if let Some((outcome, report)) = found {
                    return Decision::single_in(outcome, report, cx.policy.name_tag(0), cx.shadow);
                }
            }
            (None, Op::Check) => {
                let inner = t.read(hash);
                if let Some(d) = Tables::in_many(cx, &inner, key, hash, now, |p, s, now| {
                    p.decide(s, now, cost)
                }) {
                    return d;
                }
            }
            (_, Op::Peek) => {
                let inner = t.read(hash);
                if let Some(e) = inner.one.find(hash, |e| e.0 == *key && e.1 == cx.tag) {
                    let tat = e.2.load(Ordering::Acquire);
                    return cx.policy.eval(&[tat], now(), cost).0;
                }
                if let Some(d) = Tables::in_many(cx, &inner, key, hash, now, |p, s, now| {
                    p.eval(s, now, cost).0
                }) {
                    return d;
                }
            }
            (g, Op::Refund) => {
                let inner = t.read(hash);
                if let (Some(g), Some(e)) =
                    (g, inner.one.find(hash, |e| e.0 == *key && e.1 == cx.tag))
                {
                    let _ = e.2.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                        Some(g.refund(t, cost))
                    });
                    return Decision::without_state(
                        crate::decision::Outcome::Allowed {
                            wait: std::time::Duration::ZERO,
                        },
                        crate::decision::Source::Local,
                        1,
                    );
                }
                if let Some(d) = Tables::in_many(cx, &inner, key, hash, now, |p, s, now| {
                    // The window the charge is in is decided under the key's lock.
                    p.refund(s, now, cost);
                    p.report(s, now)
                }) {
                    return d;
                }
            }
            // Rare: under the shard's write lock.
            (_, Op::Force | Op::Reset | Op::Ban) => {}
        }
        self.cold(t, key, hash, rehash)
    }

    /// Every other case, under the shard's write lock: a key not known yet, known under
    /// another policy (its state carried over first), or in the other table.
    #[cold]
    fn cold<S, R>(self, t: &Tables<S>, key: &S, hash: u64, rehash: R) -> Decision
    where
        S: Eq + Clone + Send + Sync,
        R: Fn(&S) -> u64 + Copy,
    {
        let Call { cx, op, cost, now } = self;
        let policy = cx.policy;
        // An unknown key asking for a cost no fresh bucket admits is refused without a
        // write (and without the write lock); not when limits in shadow may let it
        // through to be charged by the others.
        if op == Op::Check && policy.max_cost() < cost && cx.shadow == 0 {
            let inner = t.read(hash);
            let known = inner.one.find(hash, |e| e.0 == *key).is_some()
                || inner.many.find(hash, |e| e.0 == *key).is_some();
            if !known {
                return policy.eval(&[0; MAX_WORDS], now(), cost).0;
            }
        }
        if op == Op::Peek {
            // A look changes nothing: the state as this policy would see it.
            let inner = t.read(hash);
            let now = now();
            let state = Tables::found(&inner, key, hash)
                .map_or([0; MAX_WORDS], |(t, s)| cx.own(t, &s, now));
            return policy.eval(&state, now, cost).0;
        }
        let mut inner = t.write(hash);
        let now = now();
        let found = Tables::found(&inner, key, hash);
        let known = found.is_some();
        if let Ok(e) = inner.one.find_entry(hash, |e| e.0 == *key) {
            e.remove();
            t.removed(&mut inner, 0);
        } else if let Ok(e) = inner.many.find_entry(hash, |e| e.0 == *key) {
            let ((_, cell), _) = e.remove();
            let (_, words) = cell.into_inner().unwrap_or_else(PoisonError::into_inner);
            t.removed(&mut inner, map::allocation_bytes(words.len() * 8));
        }
        if op == Op::Reset {
            return policy.eval(&[0; MAX_WORDS], now, 0).0;
        }
        // The state stays under the policy that wrote it when that one belongs to a set
        // installed after this request's (it began before a swap): decided on the state as
        // its policy sees it, it is charged to the state as it is. Converting the state
        // back would cap it at the old limit, and the next request, converting it forward
        // again, would find units given back.
        let newer = found
            .filter(|&(tag, _)| op == Op::Check && tag != cx.tag && cx.tags.newer(tag, cx.tag))
            .and_then(|(tag, s)| Some((tag, cx.tags.policy(tag)?, s)));
        let (tag, owner, state, decision) = if let Some((t, p, mut s)) = newer {
            let d = policy.decide(&mut cx.own(t, &s, now), now, cost);
            if d.is_allowed() {
                p.charge(&mut s, now, cost);
            }
            (t, p, s, d)
        } else {
            let mut s = found.map_or([0; MAX_WORDS], |(t, s)| cx.own(t, &s, now));
            let d = match op {
                Op::Check => policy.decide(&mut s, now, cost),
                Op::Peek => policy.eval(&s, now, cost).0,
                Op::Refund => {
                    policy.refund(&mut s, now, cost);
                    policy.report(&s, now)
                }
                Op::Force => {
                    policy.charge(&mut s, now, cost);
                    policy.report(&s, now)
                }
                Op::Ban => {
                    policy.ban(&mut s, now, cost);
                    policy.report(&s, now)
                }
                Op::Reset => unreachable!("returned above"),
            };
            (cx.tag, policy.clone(), s, d)
        };
        // A state back to fresh is not stored; nor is an unknown key merely looked at.
        if owner.is_fresh(&state, now) || (!known && matches!(op, Op::Peek | Op::Refund)) {
            return decision;
        }
        let residuals = Both(residual_one::<S>(now), residual_many::<S>(cx.tags, now));
        if owner.single_gcra().is_some() {
            let entry = (key.clone(), tag, AtomicU64::new(state[0]));
            t.insert_one(&mut inner, hash, entry, |e| rehash(&e.0), residuals);
        } else {
            let words: Box<[u64]> = state[..owner.state_words()].into();
            let entry = (key.clone(), Mutex::new((tag, words)));
            t.insert_many(&mut inner, hash, entry, |e| rehash(&e.0), residuals);
        }
        decision
    }
}

impl<S: Eq + Clone + Send + Sync> Tables<S> {
    /// A multi-limit state written under this policy, updated under its lock.
    #[inline]
    pub(super) fn in_many(
        cx: &Ctx<'_>,
        inner: &ShardInner<One<S>, Many<S>>,
        key: &S,
        hash: u64,
        now: impl Fn() -> u64,
        f: impl FnOnce(&Policy, &mut [u64], u64) -> Decision,
    ) -> Option<Decision> {
        let cell = &inner.many.find(hash, |e| e.0 == *key)?.1;
        let mut s = cell.lock().unwrap_or_else(PoisonError::into_inner);
        if s.0 != cx.tag {
            return None;
        }
        // Under the key's lock, so no state written with a later clock is seen.
        Some(f(cx.policy, &mut s.1, now()))
    }

    /// The key's state from either table, with the tag of the policy that wrote it.
    pub(super) fn found(
        inner: &ShardInner<One<S>, Many<S>>,
        key: &S,
        hash: u64,
    ) -> Option<(u32, [u64; MAX_WORDS])> {
        let mut s = [0; MAX_WORDS];
        if let Some(e) = inner.one.find(hash, |e| e.0 == *key) {
            s[0] = e.2.load(Ordering::Acquire);
            return Some((e.1, s));
        }
        let e = inner.many.find(hash, |e| e.0 == *key)?;
        let cell = e.1.lock().unwrap_or_else(PoisonError::into_inner);
        s[..cell.1.len()].copy_from_slice(&cell.1);
        Some((cell.0, s))
    }

    pub(super) fn stats(&self) -> MemoryStats {
        let (keys, bytes) = self.usage();
        MemoryStats {
            keys,
            bytes,
            evicted_fresh: self.evictions.fresh.load(Ordering::Relaxed),
            evicted_with_state: self.evictions.with_state.load(Ordering::Relaxed),
        }
    }
}

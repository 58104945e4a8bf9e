//! [`Policy`]: the limits a request must pass together, how they decide, and how a key's
//! state carries over from one policy to another.

use std::{
    fmt,
    hash::{Hash, Hasher},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use crate::algorithm::{Enforcement, Gcra, Limit, Params, MAX_WORDS};
use crate::decision::{name_tag, Decision, LimitReport, NameTag, Outcome, Source, MAX_LIMITS};
use crate::error::ConfigError;

/// One or more limits that must all admit a request. See the [module docs](super).
///
/// Cheap to clone (the limits are shared).
#[derive(Clone)]
pub struct Policy {
    inner: Arc<Inner>,
}

struct Inner {
    limits: Vec<Limit>,
    offsets: [u8; MAX_LIMITS],
    /// The limits' names as their reports carry them.
    names: [NameTag; MAX_LIMITS],
    words: usize,
    fingerprint: u64,
    /// A store's tag for this policy, cached: `store id << 32 | tag` (0: none yet).
    tag: AtomicU64,
    /// The limits in shadow for every key (bit `i`: limit `i`).
    shadow: u8,
    /// With limits enforced for a share of keys: this policy with each of them resolved
    /// (enforced, or in shadow), indexed by the bits of those in shadow, in order.
    rollout: Option<Box<[Policy]>>,
}

impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner) || self.inner.limits == other.inner.limits
    }
}

impl Eq for Policy {}

impl Hash for Policy {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.inner.limits.hash(state);
    }
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("limits", &self.inner.limits)
            .finish()
    }
}

impl Policy {
    fn build(limits: Vec<Limit>) -> Result<Self, ConfigError> {
        if limits.is_empty() {
            return Err(ConfigError::NoLimits);
        }
        if limits.len() > MAX_LIMITS {
            return Err(ConfigError::TooManyLimits(limits.len()));
        }
        let mut offsets = [0u8; MAX_LIMITS];
        let mut names = [NameTag::default(); MAX_LIMITS];
        let mut words = 0;
        for (i, l) in limits.iter().enumerate() {
            offsets[i] = words as u8;
            names[i] = name_tag(l.name());
            words += l.params.words();
        }
        let mut shadow = 0;
        let mut shares = Vec::new();
        for (i, l) in limits.iter().enumerate() {
            match l.enforcement() {
                Enforcement::Keys(0) => shadow |= 1 << i,
                Enforcement::Keys(_) => shares.push(i),
                Enforcement::Enforced => {}
            }
        }
        let rollout = if shares.is_empty() {
            None
        } else {
            let variants = (0..1usize << shares.len())
                .map(|bits| {
                    let mut resolved = limits.clone();
                    for (b, &i) in shares.iter().enumerate() {
                        resolved[i] = resolved[i].clone().resolved(bits & (1 << b) == 0);
                    }
                    Policy::build(resolved)
                })
                .collect::<Result<Vec<_>, _>>()?;
            Some(variants.into_boxed_slice())
        };
        Ok(Policy {
            inner: Arc::new(Inner {
                fingerprint: fingerprint(&limits),
                limits,
                offsets,
                names,
                words,
                tag: AtomicU64::new(0),
                shadow,
                rollout,
            }),
        })
    }

    /// A policy of one limit.
    pub fn new(limit: Limit) -> Self {
        Policy::build(vec![limit]).expect("one limit is a valid policy")
    }

    /// A policy of several limits.
    pub fn from_limits(limits: impl IntoIterator<Item = Limit>) -> Result<Self, ConfigError> {
        Policy::build(limits.into_iter().collect())
    }

    /// Adds a limit that must also admit every request.
    pub fn and(self, limit: Limit) -> Result<Self, ConfigError> {
        let mut limits = self.inner.limits.clone();
        limits.push(limit);
        Policy::build(limits)
    }

    /// The limits, in order.
    pub fn limits(&self) -> &[Limit] {
        &self.inner.limits
    }

    /// How many `u64` words of state one key needs (all zero = fresh).
    pub fn state_words(&self) -> usize {
        self.inner.words
    }

    /// Largest cost any request can ever be admitted with.
    pub fn max_cost(&self) -> u64 {
        self.limits().iter().map(Limit::max_cost).min().unwrap_or(0)
    }

    /// Whether the single limit is GCRA-based (one state word, lock-free in memory).
    #[inline]
    pub(crate) fn single_gcra(&self) -> Option<&Gcra> {
        match (self.inner.limits.len(), &self.inner.limits[0].params) {
            (1, Params::Gcra(g)) => Some(g),
            _ => None,
        }
    }

    /// The limits in shadow for every key (bit `i`: limit `i`).
    #[inline]
    pub(crate) fn shadow_mask(&self) -> u8 {
        self.inner.shadow
    }

    /// The name of limit `i` as its reports carry it.
    #[inline]
    pub(crate) fn name_tag(&self, i: usize) -> NameTag {
        self.inner.names[i]
    }

    /// [`Decision::without_state`] for this policy, its reports named after its limits.
    pub(crate) fn without_state(&self, outcome: Outcome, source: Source) -> Decision {
        let mut d = Decision::without_state(outcome, source, self.limits().len());
        for (r, name) in d.limits.iter_mut().zip(self.inner.names) {
            r.name = name;
        }
        d
    }

    /// This policy as it applies to the key whose rollout hash is `key_hash`: every limit
    /// enforced or in shadow (a limit enforced for a share of keys is resolved for the
    /// key), so a store needs no key to decide it. The policy itself when no limit is
    /// enforced for a share of keys.
    #[inline]
    pub(crate) fn for_key(&self, key_hash: impl FnOnce() -> u64) -> &Policy {
        match &self.inner.rollout {
            None => self,
            Some(variants) => {
                let h = key_hash();
                let mut i = 0;
                let mut bit = 0;
                for l in self.limits() {
                    if let Enforcement::Keys(n) = l.enforcement() {
                        if n > 0 {
                            if !l.enforcement().enforced_for(h) {
                                i |= 1 << bit;
                            }
                            bit += 1;
                        }
                    }
                }
                &variants[i]
            }
        }
    }

    /// A stable identifier of the limits' parameters (not their names or enforcement):
    /// two policies with the same fingerprint read and write state the same way.
    pub fn fingerprint(&self) -> u64 {
        self.inner.fingerprint
    }

    /// The tag a store (`store`, a process-unique id) gives this policy, if cached.
    #[inline]
    pub(crate) fn cached_tag(&self, store: u32) -> Option<u32> {
        let t = self.inner.tag.load(Ordering::Relaxed);
        (t >> 32 == u64::from(store)).then_some(t as u32)
    }

    pub(crate) fn cache_tag(&self, store: u32, tag: u32) {
        self.inner
            .tag
            .store(u64::from(store) << 32 | u64::from(tag), Ordering::Relaxed);
    }

    fn slice<'a>(&self, s: &'a [u64], i: usize) -> &'a [u64] {
        &s[self.span(i)]
    }

    /// Where limit `i`'s words are in a state of this policy.
    #[inline]
    fn span(&self, i: usize) -> std::ops::Range<usize> {
        let off = self.inner.offsets[i] as usize;
        off..off + self.inner.limits[i].params.words()
    }

    /// Each limit with where its words are in a state of this policy, in order.
    pub(crate) fn spans(&self) -> impl Iterator<Item = (&Limit, std::ops::Range<usize>)> {
        self.limits()
            .iter()
            .enumerate()
            .map(|(i, l)| (l, self.span(i)))
    }

    /// Evaluates every limit without writing. Returns the decision and, when admitted,
    /// the new state.
    ///
    /// Limits in shadow ([`Limit::shadow`]) neither refuse nor delay: one that would
    /// refuse is not charged and marks the decision [`Decision::shadowed`], one that
    /// admits is charged; the others decide as if it were not there. A limit enforced for
    /// a share of keys is enforced here (layers resolve it per key first).
    pub(crate) fn eval(
        &self,
        state: &[u64],
        now: u64,
        cost: u64,
    ) -> (Decision, Option<[u64; MAX_WORDS]>) {
        let shadow = self.inner.shadow;
        debug_assert!(state.len() >= self.inner.words);
        let limits = self.limits();
        let mut reports = [LimitReport::default(); MAX_LIMITS];
        let mut next = [0u64; MAX_WORDS];
        let mut wait = Duration::ZERO;
        let mut retry: Option<Duration> = None;
        let mut exceeds = false;
        let mut would = Combine::default();
        for (i, limit) in limits.iter().enumerate() {
            let s = self.slice(state, i);
            let (o, n, mut r) = limit.eval(s, now, cost);
            r.index = i as u8;
            r.name = self.inner.names[i];
            reports[i] = r;
            let off = self.inner.offsets[i] as usize;
            let k = limit.params.words();
            let in_shadow = shadow & (1 << i) != 0;
            match o {
                Outcome::Allowed { wait: w } => {
                    if !in_shadow {
                        wait = wait.max(w);
                    }
                    next[off..off + k].copy_from_slice(&n.unwrap_or_default()[..k]);
                }
                _ if in_shadow => {
                    would.add(o);
                    next[off..off + k].copy_from_slice(s);
                }
                Outcome::Denied { retry_after } => {
                    retry = Some(retry.map_or(retry_after, |r| r.max(retry_after)));
                }
                Outcome::Exceeds => exceeds = true,
            }
        }
        let outcome = if exceeds {
            Outcome::Exceeds
        } else if let Some(retry_after) = retry {
            Outcome::Denied { retry_after }
        } else {
            Outcome::Allowed { wait }
        };
        let admitted = matches!(outcome, Outcome::Allowed { .. });
        if !admitted && limits.len() > 1 {
            // Nothing is charged: limits that would have admitted report their state as is.
            for (i, limit) in limits.iter().enumerate() {
                if reports[i].allowed {
                    reports[i] = LimitReport {
                        index: i as u8,
                        name: self.inner.names[i],
                        ..limit.eval(self.slice(state, i), now, 0).2
                    };
                }
            }
        }
        let decision = Decision {
            outcome,
            source: crate::decision::Source::Local,
            len: limits.len() as u8,
            limits: reports,
            shadow: if admitted {
                crate::decision::shadow_code(would.outcome())
            } else {
                0
            },
        };
        (decision, admitted.then_some(next))
    }

    /// Decides and, when admitted, charges `cost` to `state` (all limits or none).
    ///
    /// `state` must hold at least [`Policy::state_words`] words; `now` is in nanoseconds
    /// since the Unix epoch (windows are aligned to it), from a clock that does not go
    /// back.
    pub fn decide(&self, state: &mut [u64], now: u64, cost: u64) -> Decision {
        let (d, next) = self.eval(state, now, cost);
        if let Some(next) = next {
            let w = self.inner.words;
            state[..w].copy_from_slice(&next[..w]);
        }
        d
    }

    /// Decides without charging anything: what [`Policy::decide`] would answer now.
    pub fn peek(&self, state: &[u64], now: u64, cost: u64) -> Decision {
        self.eval(state, now, cost).0
    }

    /// The state as it stands: every limit's report for a request of no cost.
    pub(crate) fn report(&self, state: &[u64], now: u64) -> Decision {
        self.eval(state, now, 0).0
    }

    /// Charges `cost` units to every limit without a check, whatever they say: a cost
    /// settled above what was reserved ([`Store::settle`](crate::store::Store::settle)),
    /// or a request decided under another policy charged to the state this one wrote. A
    /// limit may go over, at most to twice its capacity (a bucket or queue one capacity
    /// below empty, a window twice its limit); the key then waits it out. See [a state in
    /// debt](crate::algorithm#a-state-in-debt).
    pub fn charge(&self, state: &mut [u64], now: u64, cost: u64) {
        for (limit, span) in self.spans() {
            limit.force(&mut state[span], now, cost);
        }
    }

    /// Refuses every enforced token-bucket, meter or queue limit until `ban` ns after
    /// `now` (a ban after too many failures: [`Store::ban`](crate::store::Store::ban));
    /// windows and limits in shadow are left as they are.
    pub fn ban(&self, state: &mut [u64], now: u64, ban: u64) {
        let shadow = self.shadow_mask();
        for (i, (limit, span)) in self.spans().enumerate() {
            if shadow & (1 << i) == 0 {
                limit.ban(&mut state[span], now, ban);
            }
        }
    }

    /// Whether every enforced limit can be banned: token bucket, meter or queue.
    pub(crate) fn can_ban(&self) -> Result<(), ConfigError> {
        match self.limits().iter().find(|l| l.params.words() != 1) {
            Some(l) => Err(ConfigError::PolicySet(format!(
                "a ban needs token-bucket, meter or queue limits; {:?} is a window",
                l.name()
            ))),
            None => Ok(()),
        }
    }

    /// Gives back `cost` units to every limit (a queued request dropped before its slot).
    pub fn refund(&self, state: &mut [u64], now: u64, cost: u64) {
        for (limit, span) in self.spans() {
            limit.refund(&mut state[span], now, cost);
        }
    }

    /// Whether `state` is indistinguishable from a fresh key at `now` (so it may be
    /// forgotten).
    pub fn is_fresh(&self, state: &[u64], now: u64) -> bool {
        self.limits()
            .iter()
            .enumerate()
            .all(|(i, l)| l.is_fresh(self.slice(state, i), now))
    }

    /// This policy's state for a key whose state under `old` was `state`, at `now` (see
    /// the [module docs](super): limits take over by position).
    pub fn carry_from(&self, old: &Policy, state: &[u64], now: u64) -> [u64; MAX_WORDS] {
        let mut out = [0; MAX_WORDS];
        for (i, (limit, span)) in self.spans().enumerate() {
            let Some(was) = old.limits().get(i) else {
                break;
            };
            let carried = limit.carry(was, old.slice(state, i), now);
            out[span.clone()].copy_from_slice(&carried[..span.len()]);
        }
        out
    }
}

/// What the limits in shadow that refused would have answered together: the longest
/// retry-after, or exceeding when one of them can never admit the cost.
#[derive(Default)]
pub(crate) struct Combine {
    retry: Option<Duration>,
    exceeds: bool,
}

impl Combine {
    pub(crate) fn add(&mut self, o: Outcome) {
        match o {
            Outcome::Denied { retry_after } => {
                self.retry = Some(self.retry.map_or(retry_after, |r| r.max(retry_after)));
            }
            Outcome::Exceeds => self.exceeds = true,
            Outcome::Allowed { .. } => {}
        }
    }

    pub(crate) fn outcome(&self) -> Option<Outcome> {
        if self.exceeds {
            Some(Outcome::Exceeds)
        } else {
            self.retry
                .map(|retry_after| Outcome::Denied { retry_after })
        }
    }
}

/// FNV-1a over the limits' parameters: stable across processes and builds.
fn fingerprint(limits: &[Limit]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut mix = |v: u64| {
        for b in v.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for l in limits {
        match l.params {
            Params::Gcra(g) => {
                mix(1);
                mix(g.t);
                mix(g.tau);
                mix(g.cap);
                mix(g.free);
            }
            Params::Fixed(w) => {
                mix(2);
                mix(w.w);
                mix(w.limit);
                mix(w.shift);
            }
            Params::Sliding(w) => {
                mix(3);
                mix(w.w);
                mix(w.limit);
                mix(w.shift);
            }
        }
    }
    h
}

impl From<Limit> for Policy {
    fn from(limit: Limit) -> Self {
        Policy::new(limit)
    }
}

/// What the layer builders take as a policy: a [`Policy`], a [`Limit`], or its text
/// (`"100/min"`, see the [module docs](super)), whose errors the builder reports when the
/// layer is built.
pub trait IntoPolicy {
    /// The policy, or what is wrong with the text.
    fn into_policy(self) -> Result<Policy, ConfigError>;
}

impl IntoPolicy for Policy {
    fn into_policy(self) -> Result<Policy, ConfigError> {
        Ok(self)
    }
}

impl IntoPolicy for Limit {
    fn into_policy(self) -> Result<Policy, ConfigError> {
        Ok(Policy::new(self))
    }
}

impl IntoPolicy for &str {
    fn into_policy(self) -> Result<Policy, ConfigError> {
        self.parse()
    }
}

impl IntoPolicy for String {
    fn into_policy(self) -> Result<Policy, ConfigError> {
        self.parse()
    }
}

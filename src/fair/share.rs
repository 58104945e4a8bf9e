//! The pool, a key's share, and the decision: a pure function of the states and the time,
//! which the in-memory store runs in Rust and the Redis store in Lua, step for step.

use std::time::Duration;

use crate::{error::ConfigError, quota::Quota};

/// Values the Redis script handles stay below 2^53 (exact as Lua doubles): intervals and
/// caps below 2^51, a share's interval clamped to [`MAX_SHARE_INTERVAL`].
const MAX_CAP: u64 = 1 << 51;
/// The longest interval a share is stretched to when the pool is oversubscribed (about
/// 18 minutes per request).
pub(crate) const MAX_SHARE_INTERVAL: u64 = 1 << 40;
/// Weights are guaranteed rates in thousandths of a unit per second.
const WEIGHT_SCALE: u128 = 1_000_000_000_000;

/// A key's part of a [pool](super): a guaranteed rate it gets whenever it asks for it
/// and the pool's guarantees fit, and a ceiling (a rate and a burst) it may borrow up to
/// while the pool has capacity to spare (a pool of burst 1 never does). Spare capacity is
/// shared among the keys asking for it in proportion to their guaranteed rates. See the
/// [module docs](super).
///
/// ```
/// use tollgate::{fair::Share, Quota};
///
/// // Guaranteed 4 per second, up to 16 per second when the pool has room.
/// let share = Share::new(Quota::per_second(4)?, Quota::per_second(16)?)?;
/// assert_eq!(share.guaranteed().limit(), 4);
/// assert_eq!(share.ceiling().limit(), 16);
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Share {
    guaranteed: Quota,
    ceiling: Quota,
    /// The guaranteed rate in thousandths of a unit per second (at least 1).
    pub(crate) weight: u64,
    /// The ceiling's emission interval and cap (burst × interval), in ns.
    pub(crate) ceil_t: u64,
    pub(crate) ceil_cap: u64,
}

impl Share {
    /// A share guaranteed `guaranteed` and capped at `ceiling` (its rate and burst). Of
    /// the guaranteed quota only the rate counts: it weighs the key in the sharing. The
    /// burst a key may send at its share is its part of half the pool's burst (at least
    /// one request), as the [module docs](super) say, not the guaranteed quota's burst.
    /// The ceiling's rate must be at least the guaranteed one; the guaranteed rate must be
    /// at least 0.001 per second.
    pub fn new(guaranteed: Quota, ceiling: Quota) -> Result<Self, ConfigError> {
        let g_t = nanos(guaranteed.emission_interval());
        let ceil_t = nanos(ceiling.emission_interval());
        if ceil_t > g_t {
            return Err(ConfigError::Fair(format!(
                "the ceiling ({}) is below the guaranteed rate ({})",
                ceiling.default_name(),
                guaranteed.default_name()
            )));
        }
        let weight = (WEIGHT_SCALE / u128::from(g_t)) as u64;
        if weight == 0 {
            return Err(ConfigError::Fair(format!(
                "the guaranteed rate {} is below 0.001 per second",
                guaranteed.default_name()
            )));
        }
        let ceil_cap = u128::from(ceiling.burst()) * u128::from(ceil_t);
        if ceil_cap >= u128::from(MAX_CAP) {
            return Err(ConfigError::Fair(format!(
                "the ceiling's burst {} spans more than 2^51 ns",
                ceiling.burst()
            )));
        }
        Ok(Share {
            guaranteed,
            ceiling,
            weight,
            ceil_t,
            ceil_cap: ceil_cap as u64,
        })
    }

    /// The guaranteed quota.
    pub fn guaranteed(&self) -> Quota {
        self.guaranteed
    }

    /// The ceiling.
    pub fn ceiling(&self) -> Quota {
        self.ceiling
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The pool's parameters, in ns.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pool {
    /// The pool's name (its Redis key's hash tag).
    pub(crate) label: std::sync::Arc<str>,
    /// Emission interval and cap (burst × interval).
    pub(crate) t: u64,
    pub(crate) cap: u64,
    /// The length of one activity period: a key counts as asking for its share for the
    /// period it last asked in and at most the next.
    pub(crate) period: u64,
}

impl Pool {
    pub(crate) fn new(label: &str, quota: Quota, period: Duration) -> Result<Self, ConfigError> {
        let t = nanos(quota.emission_interval());
        let cap = u128::from(quota.burst()) * u128::from(t);
        if cap >= u128::from(MAX_CAP) {
            return Err(ConfigError::Fair(format!(
                "the pool's burst {} spans more than 2^51 ns",
                quota.burst()
            )));
        }
        let period = nanos(period);
        if period < 1_000_000 || !period.is_multiple_of(1_000) || period > 86_400_000_000_000 {
            return Err(ConfigError::Fair(format!(
                "the activity period must be whole microseconds between 1 ms and a day; it is {period} ns"
            )));
        }
        Ok(Pool {
            label: label.into(),
            t,
            cap: cap as u64,
            period,
        })
    }
}

/// The pool's state. `tat` is the pool's theoretical arrival time (ns); `sums[0]` the
/// weights of the keys that asked in activity period `epoch`, `sums[1]` in the one
/// before.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PoolState {
    pub(crate) tat: u64,
    pub(crate) epoch: u64,
    pub(crate) sums: [u64; 2],
}

/// A key's state: its share's and its ceiling's theoretical arrival times (ns), the
/// activity period it last asked in, and the one it asked in before that, each plus one
/// (0: never).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeyState {
    pub(crate) share_tat: u64,
    pub(crate) ceil_tat: u64,
    pub(crate) seen: u64,
    pub(crate) before: u64,
}

/// What one request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FairDecision {
    pub(crate) admitted: bool,
    /// A refusal's exact wait (ns): until the key would be admitted if no other request
    /// came first.
    pub(crate) retry_after: u64,
    /// Requests the key could still send at once.
    pub(crate) remaining: u64,
    /// Until the key's share and ceiling are full again (ns).
    pub(crate) reset_after: u64,
    /// Until `remaining` grows by one (ns), the pool's active weight as it is; a refusal's
    /// retry-after; zero when it never does (it is the most the key may have).
    pub(crate) next_after: u64,
}

/// How long until a bound of cap `cap` at interval `t`, filled `fill` ahead of now, holds
/// `want` units; `None` when it never can.
fn until(fill: u64, t: u64, cap: u64, want: u64) -> Option<u64> {
    let need = u128::from(want) * u128::from(t);
    (need <= u128::from(cap))
        .then(|| (u128::from(fill) + need).saturating_sub(u128::from(cap)) as u64)
}

/// `max(0, tat - now)`.
fn fill(tat: u64, now: u64) -> u64 {
    tat.saturating_sub(now)
}

/// The interval of a key of weight `w` when the keys asking weigh `active` in all:
/// the pool's interval scaled by `active / w` (rounded up), never faster than the ceiling,
/// never slower than [`MAX_SHARE_INTERVAL`]; `active` is counted up to the point where
/// `pool_t × active` reaches 2^53.
pub(crate) fn share_interval(pool: &Pool, share: &Share, active: u64) -> u64 {
    let limit = ((1u64 << 53) - 1) / pool.t;
    let active = active.min(limit);
    let t = (u128::from(pool.t) * u128::from(active)).div_ceil(u128::from(share.weight));
    (t.min(u128::from(MAX_SHARE_INTERVAL)) as u64).max(share.ceil_t)
}

/// A key's share cap at share interval `t`: half the pool's burst (in time), so that the
/// keys' share bursts together take at most the half of the pool that borrowing leaves,
/// and at least one interval.
fn share_cap(pool: &Pool, t: u64) -> u64 {
    (pool.cap / 2).max(t)
}

/// How long until a refused key's share admits it if nothing else happens (ns), the
/// share's fill being `fill` now. The weight counted as active can only fall meanwhile,
/// and the share's interval with it: `active[0]` until the end of this activity period,
/// `active[1]` (what asked in this period, the key included) in the next, `active[2]`
/// (the key alone) from the one after. The wait is the earliest time one of them admits.
fn share_wait(pool: &Pool, share: &Share, active: [u64; 3], fill: u64, now: u64) -> u64 {
    let next = (now / pool.period + 1) * pool.period - now;
    let starts = [0, next, next + pool.period, u64::MAX];
    let mut wait = u64::MAX;
    for (i, &a) in active.iter().enumerate() {
        let t = share_interval(pool, share, a);
        let at = (fill + t).saturating_sub(share_cap(pool, t)).max(starts[i]);
        wait = wait.min(at);
        // Later periods start after `at`: none admits sooner.
        if at < starts[i + 1] {
            break;
        }
    }
    wait
}

/// Decides one request of one unit of a key of `share` at `now` (ns), updating both
/// states: the activity count first (a refused key is still asking), then the key's
/// ceiling, the pool, and either the key's share of the pool or the pool's spare half.
pub(crate) fn decide(
    pool: &Pool,
    share: &Share,
    p: &mut PoolState,
    k: &mut KeyState,
    now: u64,
) -> FairDecision {
    let epoch = now / pool.period;
    if p.epoch != epoch {
        p.sums = if p.epoch + 1 == epoch {
            [0, p.sums[0]]
        } else {
            [0, 0]
        };
        p.epoch = epoch;
    }
    // Periods are stored plus one (0: never).
    if k.seen != epoch + 1 {
        p.sums[0] += share.weight;
        k.before = k.seen;
        k.seen = epoch + 1;
    }
    let in_previous = k.before == epoch;
    let active = p.sums[0].max(p.sums[1] + if in_previous { 0 } else { share.weight });
    let share_t = share_interval(pool, share, active);
    let share_cap = share_cap(pool, share_t);

    let fc = fill(k.ceil_tat, now) + share.ceil_t;
    let fp = fill(p.tat, now) + pool.t;
    let fs = fill(k.share_tat, now) + share_t;
    let ceil_ok = fc <= share.ceil_cap;
    let pool_ok = fp <= pool.cap;
    let share_ok = fs <= share_cap;
    // Borrowing past the share: only while the pool keeps half its burst after it.
    let spare_ok = 2 * fp <= pool.cap;
    if ceil_ok && pool_ok && (share_ok || spare_ok) {
        k.ceil_tat = now + fc;
        p.tat = now + fp;
        if share_ok {
            k.share_tat = now + fs;
        }
        let fs = fill(k.share_tat, now);
        let by_share = share_cap.saturating_sub(fs) / share_t;
        let by_spare = (pool.cap / 2).saturating_sub(fp) / pool.t;
        let remaining = ((share.ceil_cap - fc) / share.ceil_t)
            .min((pool.cap - fp) / pool.t)
            .min(by_share.max(by_spare));
        // One more once the ceiling and the pool hold it, and the share or the spare half
        // (a pool of burst 1 never lends).
        let want = remaining + 1;
        let lend = (2 * pool.t <= pool.cap)
            .then(|| until(fp, pool.t, pool.cap / 2, want))
            .flatten();
        let either = match (until(fs, share_t, share_cap, want), lend) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let next_after = [
            until(fc, share.ceil_t, share.ceil_cap, want),
            until(fp, pool.t, pool.cap, want),
            either,
        ]
        .into_iter()
        .try_fold(0, |m, w| w.map(|w| m.max(w)))
        .unwrap_or(0);
        return FairDecision {
            admitted: true,
            retry_after: 0,
            remaining,
            reset_after: fc.max(fs),
            next_after,
        };
    }
    // A pool whose one interval is more than half its burst (a burst of 1) never lends.
    let spare_wait = if 2 * pool.t > pool.cap {
        u64::MAX
    } else {
        (2 * fp - pool.cap.min(2 * fp)).div_ceil(2)
    };
    let share_wait = share_wait(
        pool,
        share,
        [active, p.sums[0], share.weight],
        fill(k.share_tat, now),
        now,
    );
    let retry_after = (fc - share.ceil_cap.min(fc))
        .max(fp - pool.cap.min(fp))
        .max(share_wait.min(spare_wait));
    FairDecision {
        admitted: false,
        retry_after,
        remaining: 0,
        reset_after: fill(k.ceil_tat, now).max(fill(k.share_tat, now)),
        next_after: retry_after,
    }
}

/// Whether a key's state holds nothing the next decision needs: its times are past and
/// it is counted in neither activity period.
#[cfg(test)]
pub(crate) fn key_is_fresh(pool: &Pool, k: &KeyState, now: u64) -> bool {
    now >= key_fresh_at(pool, k)
}

/// When a key's state (left alone) comes to hold nothing the next decision needs: its
/// times past, and counted in neither activity period.
pub(crate) fn key_fresh_at(pool: &Pool, k: &KeyState) -> u64 {
    let next_period = k.seen.saturating_add(1).saturating_mul(pool.period);
    k.share_tat.max(k.ceil_tat).max(next_period)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn demo() -> (Pool, Share) {
        let pool = Pool::new(
            "fair",
            Quota::per_second(20).unwrap(),
            Duration::from_secs(1),
        )
        .unwrap();
        let share = Share::new(
            Quota::per_second(4).unwrap(),
            Quota::per_second(16).unwrap(),
        )
        .unwrap();
        (pool, share)
    }

    #[test]
    fn a_share_is_the_pool_split_by_weight_and_capped_by_the_ceiling() {
        let (pool, share) = demo();
        assert_eq!(share.weight, 4_000);
        // Alone: the pool's 20/s, held to the ceiling's 16/s.
        assert_eq!(share_interval(&pool, &share, 4_000), 62_500_000);
        // Two alike: 10/s each; five: 4/s; ten: 2/s.
        assert_eq!(share_interval(&pool, &share, 8_000), 100_000_000);
        assert_eq!(share_interval(&pool, &share, 20_000), 250_000_000);
        assert_eq!(share_interval(&pool, &share, 40_000), 500_000_000);
        assert_eq!(share_interval(&pool, &share, u64::MAX), MAX_SHARE_INTERVAL);
    }

    #[test]
    fn a_refusal_says_when_every_condition_holds_again() {
        let (pool, share) = demo();
        let (mut p, mut k) = (PoolState::default(), KeyState::default());
        let now = 10_000 * MS;
        let mut admitted = 0;
        while decide(&pool, &share, &mut p, &mut k, now).admitted {
            admitted += 1;
        }
        // A rested key alone: 8 at its share (half the pool's 1 s burst at 16/s), then 2
        // borrowed while the pool keeps half its burst.
        assert_eq!(admitted, 10);
        let d = decide(&pool, &share, &mut p, &mut k, now);
        assert!(!d.admitted);
        // Borrowing comes back first: the pool is back at half its burst in 50 ms (its
        // share in 62.5 ms).
        assert_eq!(d.retry_after, 50_000_000);
        assert!(!decide(&pool, &share, &mut p, &mut k, now + 50_000_000 - 1).admitted);
        assert!(decide(&pool, &share, &mut p, &mut k, now + 50_000_000).admitted);
    }

    #[test]
    fn refused_keys_still_count_as_asking() {
        let (pool, share) = demo();
        let mut p = PoolState::default();
        let mut keys = [KeyState::default(); 3];
        for k in &mut keys {
            decide(&pool, &share, &mut p, k, 5 * MS);
        }
        assert_eq!(p.sums, [12_000, 0]);
        // The next period: the three carry over as the previous period's.
        decide(&pool, &share, &mut p, &mut keys[0], 1_005 * MS);
        assert_eq!(p.sums, [4_000, 12_000]);
        // Two periods idle: nobody is counted.
        decide(&pool, &share, &mut p, &mut keys[0], 3_005 * MS);
        assert_eq!(p.sums, [4_000, 0]);
        assert!(key_is_fresh(&pool, &keys[1], 3_005 * MS));
        assert!(!key_is_fresh(&pool, &keys[0], 3_005 * MS));
    }
}

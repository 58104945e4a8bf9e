//! Exactness of the decision functions against plain reference models, under random
//! arrivals, costs and quotas.

use std::time::Duration;

use proptest::prelude::*;
use tollgate::{decision::Outcome, Limit, Policy, Quota};

/// Reference token bucket in exact integer arithmetic. The bucket's level is kept in
/// "nanosecond-units": a unit of capacity is `t` of them, so refill by elapsed time is exact
/// (rate = 1/t units per ns). Capacity `burst` units. A request of cost n needs n*t.
struct RefBucket {
    t: u128,
    cap: u128, // burst * t
    level: u128,
    last: u128,
}

impl RefBucket {
    fn new(t: u64, burst: u64) -> Self {
        RefBucket {
            t: t as u128,
            cap: burst as u128 * t as u128,
            level: burst as u128 * t as u128,
            last: 0,
        }
    }

    fn refill(&mut self, now: u128) {
        if now > self.last {
            self.level = (self.level + (now - self.last)).min(self.cap);
            self.last = now;
        }
    }

    /// Some(()) when admitted; Err(retry ns) when refused; Err(u128::MAX) if never.
    fn take(&mut self, now: u128, cost: u64) -> Result<u64, u128> {
        self.refill(now);
        let need = cost as u128 * self.t;
        if need > self.cap {
            return Err(u128::MAX);
        }
        if self.level >= need {
            self.level -= need;
            Ok((self.level / self.t) as u64)
        } else {
            Err(need - self.level)
        }
    }
}

fn arrivals() -> impl Strategy<Value = Vec<(u64, u64)>> {
    // (gap in ns, cost)
    prop::collection::vec((0u64..50_000_000, 1u64..4), 1..200)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// GCRA (token bucket) admits exactly what the reference token bucket admits, with the
    /// same remaining and retry-after.
    #[test]
    fn token_bucket_matches_reference(
        limit in 1u64..200,
        period_ms in 1u64..5_000,
        burst in 1u64..50,
        seq in arrivals(),
    ) {
        let quota = Quota::new(limit, Duration::from_millis(period_ms)).unwrap().with_burst(burst).unwrap();
        let t = quota.emission_interval().as_nanos() as u64;
        let policy = Policy::new(Limit::token_bucket(quota).unwrap());
        let mut state = [0u64];
        let mut reference = RefBucket::new(t, burst);
        let mut now = 0u64;
        for (gap, cost) in seq {
            now += gap;
            let d = policy.decide(&mut state, now, cost);
            match reference.take(now as u128, cost) {
                Ok(remaining) => {
                    prop_assert_eq!(d.outcome(), Outcome::Allowed { wait: Duration::ZERO });
                    prop_assert_eq!(d.remaining(), remaining);
                }
                Err(u128::MAX) => prop_assert_eq!(d.outcome(), Outcome::Exceeds),
                Err(retry) => {
                    prop_assert_eq!(d.retry_after(), Some(Duration::from_nanos(retry as u64)));
                }
            }
        }
    }

    /// The strict leaky meter is the reference bucket with capacity one unit.
    #[test]
    fn leaky_meter_matches_reference(
        limit in 1u64..200,
        period_ms in 1u64..5_000,
        seq in arrivals(),
    ) {
        let quota = Quota::new(limit, Duration::from_millis(period_ms)).unwrap();
        let t = quota.emission_interval().as_nanos() as u64;
        let policy = Policy::new(Limit::leaky_meter(quota).unwrap());
        let mut state = [0u64];
        let mut reference = RefBucket::new(t, 1);
        let mut now = 0u64;
        for (gap, cost) in seq {
            now += gap;
            let cost = if cost > 1 { 1 } else { cost };
            let d = policy.decide(&mut state, now, cost);
            prop_assert_eq!(d.is_allowed(), reference.take(now as u128, cost).is_ok());
        }
    }

    /// Retry-after is exact: refused 1 ns before it, admitted at it. Checked with peek, for
    /// every algorithm.
    #[test]
    fn retry_after_boundary_is_exact(
        alg in 0u8..5,
        limit in 1u64..50,
        period_ms in 1u64..3_000,
        burst in 1u64..20,
        seq in arrivals(),
    ) {
        let quota = Quota::new(limit, Duration::from_millis(period_ms)).unwrap();
        let limit = match alg {
            0 => Limit::token_bucket(quota.with_burst(burst).unwrap()),
            1 => Limit::leaky_meter(quota),
            2 => Limit::leaky_queue(quota, burst as u32),
            3 => Limit::fixed_window(quota),
            _ => Limit::sliding_window(quota),
        }.unwrap();
        let policy = Policy::new(limit);
        let mut state = vec![0u64; policy.state_words()];
        let mut now = 1u64;
        for (gap, cost) in seq {
            now += gap;
            let d = policy.decide(&mut state, now, cost);
            if let Some(retry) = d.retry_after() {
                let r = retry.as_nanos() as u64;
                prop_assert!(r > 0);
                prop_assert!(!policy.peek(&state, now + r - 1, cost).is_allowed(), "admitted 1 ns early");
                prop_assert!(policy.peek(&state, now + r, cost).is_allowed(), "refused at retry-after");
            }
            // next_after: one more unit becomes available exactly then.
            for l in d.limits() {
                let n = l.next_after().as_nanos() as u64;
                if n > 0 && d.is_allowed() {
                    let later = policy.peek(&state, now + n, 0);
                    prop_assert!(later.limits()[0].remaining() > l.remaining());
                }
            }
        }
    }

    /// In any window of length L no key is admitted more than burst + L * rate units.
    #[test]
    fn window_bound_holds(
        limit in 1u64..100,
        period_ms in 1u64..2_000,
        burst in 1u64..30,
        seq in arrivals(),
        window_ms in 1u64..5_000,
    ) {
        let quota = Quota::new(limit, Duration::from_millis(period_ms)).unwrap().with_burst(burst).unwrap();
        let t = quota.emission_interval().as_nanos();
        let policy = Policy::new(Limit::token_bucket(quota).unwrap());
        let mut state = [0u64];
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        let mut now = 0u64;
        for (gap, cost) in seq {
            now += gap;
            if policy.decide(&mut state, now, cost).is_allowed() {
                admitted.push((now, cost));
            }
        }
        let l = window_ms as u128 * 1_000_000;
        for (i, &(start, _)) in admitted.iter().enumerate() {
            let units: u128 = admitted[i..].iter().take_while(|(at, _)| ((at - start) as u128) < l).map(|&(_, c)| c as u128).sum();
            // burst + L * rate, with rate = 1/T per ns.
            prop_assert!(units * t <= burst as u128 * t + l, "{} units in {} ns", units, l);
        }
    }

    /// Fixed window: the count per aligned window never exceeds the limit and a request
    /// is refused only when it would.
    #[test]
    fn fixed_window_matches_reference(
        limit in 1u64..30,
        period_ms in 1u64..500,
        seq in arrivals(),
    ) {
        let w = period_ms * 1_000_000;
        let policy = Policy::new(Limit::fixed_window(Quota::new(limit, Duration::from_millis(period_ms)).unwrap()).unwrap());
        let mut state = vec![0; policy.state_words()];
        let (mut cur_win, mut count) = (u64::MAX, 0u64);
        let mut now = 0;
        for (gap, cost) in seq {
            now += gap;
            if now / w != cur_win { cur_win = now / w; count = 0; }
            let expect = count + cost <= limit;
            let d = policy.decide(&mut state, now, cost);
            if cost > limit {
                prop_assert_eq!(d.outcome(), Outcome::Exceeds);
            } else {
                prop_assert_eq!(d.is_allowed(), expect);
            }
            if d.is_allowed() { count += cost; prop_assert_eq!(d.remaining(), limit - count); }
        }
    }

    /// Sliding window: matches the weighted estimate computed in rationals.
    #[test]
    fn sliding_window_matches_reference(
        limit in 1u64..30,
        period_ms in 1u64..500,
        seq in arrivals(),
    ) {
        let w = period_ms as u128 * 1_000_000;
        let policy = Policy::new(Limit::sliding_window(Quota::new(limit, Duration::from_millis(period_ms)).unwrap()).unwrap());
        let mut state = vec![0; policy.state_words()];
        let mut counts: std::collections::HashMap<u128, u128> = Default::default();
        let mut now = 0u64;
        for (gap, cost) in seq {
            now += gap;
            let idx = now as u128 / w;
            let e = now as u128 % w;
            let prev = idx.checked_sub(1).map_or(0, |p| *counts.get(&p).unwrap_or(&0));
            let cur = *counts.get(&idx).unwrap_or(&0);
            // prev * (w - e) / w + cur + cost <= limit, multiplied by w.
            let expect = prev * (w - e) + (cur + cost as u128) * w <= limit as u128 * w;
            let d = policy.decide(&mut state, now, cost);
            if cost > limit {
                prop_assert_eq!(d.outcome(), Outcome::Exceeds);
            } else {
                prop_assert_eq!(d.is_allowed(), expect);
            }
            if d.is_allowed() { *counts.entry(idx).or_default() += cost as u128; }
        }
    }

    /// Several limits: admitted only if all admit; a refusal charges none of them.
    #[test]
    fn several_limits_all_or_none(
        seq in arrivals(),
    ) {
        let fast = Limit::token_bucket(Quota::per_second(10).unwrap().with_burst(5).unwrap()).unwrap();
        let slow = Limit::token_bucket(Quota::per_minute(20).unwrap()).unwrap();
        let both = Policy::new(fast.clone()).and(slow.clone()).unwrap();
        let (pf, ps) = (Policy::new(fast), Policy::new(slow));
        let (mut s, mut sf, mut ss) = ([0u64; 2], [0u64], [0u64]);
        let mut now = 0;
        for (gap, cost) in seq {
            now += gap;
            let a = pf.peek(&sf, now, cost).is_allowed();
            let b = ps.peek(&ss, now, cost).is_allowed();
            let d = both.decide(&mut s, now, cost);
            prop_assert_eq!(d.is_allowed(), a && b);
            if a && b {
                pf.decide(&mut sf, now, cost);
                ps.decide(&mut ss, now, cost);
            }
            prop_assert_eq!(s, [sf[0], ss[0]]);
        }
    }
}

/// Regression pin for the classic off-by-one (one extra request after a long idle, from
/// mixing up tolerance and capacity): after any idle time a bucket of burst B admits B, not
/// B + 1.
#[test]
fn long_idle_admits_exactly_burst() {
    let policy = Policy::new(
        Limit::token_bucket(Quota::per_second(10).unwrap().with_burst(5).unwrap()).unwrap(),
    );
    let mut s = [0u64];
    let now = 3_600_000_000_000; // one hour
    let admitted = (0..10)
        .filter(|_| policy.decide(&mut s, now, 1).is_allowed())
        .count();
    assert_eq!(admitted, 5);
}

/// A cost that can never fit is its own outcome, not a retry-after.
#[test]
fn cost_above_burst_exceeds() {
    let policy = Policy::new(Limit::token_bucket(Quota::per_second(10).unwrap()).unwrap());
    let mut s = [0u64];
    assert_eq!(policy.decide(&mut s, 0, 11).outcome(), Outcome::Exceeds);
    assert_eq!(
        policy.decide(&mut s, 0, 10).outcome(),
        Outcome::Allowed {
            wait: Duration::ZERO
        }
    );
    assert_eq!(policy.max_cost(), 10);
}

/// Peek does not consume.
#[test]
fn peek_does_not_consume() {
    let policy = Policy::new(Limit::token_bucket(Quota::per_second(1).unwrap()).unwrap());
    let mut s = [0u64];
    for _ in 0..5 {
        assert!(policy.peek(&s, 0, 1).is_allowed());
    }
    assert!(policy.decide(&mut s, 0, 1).is_allowed());
    assert!(!policy.peek(&s, 0, 1).is_allowed());
}

/// A refusal by the daily quota does not consume the per-second one.
#[test]
fn daily_refusal_does_not_consume_per_second() {
    let per_second =
        Limit::token_bucket(Quota::per_second(10).unwrap().with_burst(20).unwrap()).unwrap();
    let daily = Limit::token_bucket(Quota::per_day(30).unwrap().with_burst(30).unwrap()).unwrap();
    let policy = Policy::new(per_second).and(daily).unwrap();
    let mut s = [0u64; 2];
    // 20 at once (the per-second burst), then 10 more over the next second.
    let mut now = 1;
    for _ in 0..20 {
        assert!(policy.decide(&mut s, now, 1).is_allowed());
    }
    for _ in 0..10 {
        now += 100_000_000;
        assert!(policy.decide(&mut s, now, 1).is_allowed());
    }
    // The daily quota (30) is spent; the per-second bucket refills completely in 2 s.
    now += 5_000_000_000;
    let before = s[0];
    for _ in 0..100 {
        let d = policy.decide(&mut s, now, 1);
        assert!(!d.is_allowed());
        let violated: Vec<usize> = d.violated().map(|l| l.index()).collect();
        assert_eq!(violated, vec![1], "only the daily limit refuses");
        assert_eq!(d.limits()[0].remaining(), 20, "per-second bucket untouched");
    }
    assert_eq!(s[0], before, "per-second state never charged");
}

/// Regression: a request of cost 0 on a leaky queue with a backlog was admitted with the
/// backlog's wait, while a token bucket gave it none. A cost of 0 now spends nothing and
/// waits for nothing on every algorithm, and reports the state as it is.
#[test]
fn zero_cost_is_admitted_at_once_and_changes_nothing() {
    let q = Quota::per_second(10).unwrap();
    for limit in [
        Limit::token_bucket(q).unwrap(),
        Limit::leaky_meter(q).unwrap(),
        Limit::leaky_queue(q, 5).unwrap(),
        Limit::leaky_queue_nodelay(q, 5, 2).unwrap(),
        Limit::fixed_window(q).unwrap(),
        Limit::sliding_window(q).unwrap(),
    ] {
        let policy = Policy::new(limit.clone());
        let mut state = vec![0u64; policy.state_words()];
        let now = 1_000_000_000_000;
        // Fill it (the queue gets a backlog), until it refuses.
        while policy.decide(&mut state, now, 1).is_allowed() {}
        let before = state.clone();
        let probe = policy.decide(&mut state, now, 0);
        assert_eq!(
            probe.outcome(),
            Outcome::Allowed {
                wait: Duration::ZERO
            },
            "{limit:?}"
        );
        assert_eq!(state, before, "{limit:?}: a zero cost charged something");
        assert_eq!(probe.remaining(), 0, "{limit:?}");
        assert_eq!(policy.peek(&state, now, 0), probe);
    }
}

/// Fixed and sliding windows start at the offset past every multiple of the window since
/// the Unix epoch: UTC days by default, 05:00 UTC with a five-hour offset.
#[test]
fn window_offsets_move_the_window_start() {
    let day = 86_400_000_000_000u64;
    let five_h = 5 * 3_600_000_000_000u64;
    let at = 20_000 * day + 4 * 3_600_000_000_000; // 04:00 UTC
    for alg in [Limit::fixed_window, Limit::sliding_window] {
        let utc = Policy::new(alg(Quota::per_day(1).unwrap()).unwrap());
        let offset = Policy::new(
            alg(Quota::per_day(1).unwrap())
                .unwrap()
                .with_window_offset(Duration::from_nanos(five_h))
                .unwrap(),
        );
        let mut s = vec![0u64; utc.state_words()];
        assert!(utc.decide(&mut s, at, 1).is_allowed());
        let mut o = vec![0u64; offset.state_words()];
        assert!(offset.decide(&mut o, at, 1).is_allowed());
        if utc.state_words() == 2 {
            // Fixed: refused until the window's end, 20 h away at midnight or 1 h away at 05:00.
            assert_eq!(
                utc.decide(&mut s, at, 1).retry_after(),
                Some(Duration::from_nanos(day - 4 * 3_600_000_000_000))
            );
            assert_eq!(
                offset.decide(&mut o, at, 1).retry_after(),
                Some(Duration::from_nanos(3_600_000_000_000))
            );
        }
    }
    assert!(matches!(
        Limit::token_bucket(Quota::per_day(1).unwrap())
            .unwrap()
            .with_window_offset(Duration::from_secs(1)),
        Err(tollgate::ConfigError::OffsetNotApplicable(_))
    ));
}

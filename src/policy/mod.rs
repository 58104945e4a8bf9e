#![doc = include_str!("../docs/policies.md")]

pub(crate) mod choose;
pub(crate) mod handle;
mod limits;
mod print;
mod quote;
#[cfg(feature = "serde")]
mod serde;
mod set;
mod text;
mod watch;

pub use self::handle::PolicyHandle;
#[cfg(feature = "redis")]
pub(crate) use self::limits::Combine;
pub use self::limits::{IntoPolicy, Policy};
pub(crate) use self::set::check_names;
pub use self::set::{PolicyName, PolicySet};
pub use self::watch::{PolicyWatch, PolicyWatcher, WatchError, WatchStatus};

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::{Limit, MAX_WORDS};
    use crate::quota::Quota;

    fn tb(q: Quota) -> Limit {
        Limit::token_bucket(q).unwrap()
    }

    #[test]
    fn a_set_names_its_policies_limits_and_puts_the_common_ones_first() {
        let daily = Limit::fixed_window(Quota::per_day(1000).unwrap())
            .unwrap()
            .named("daily")
            .unwrap();
        let set = PolicySet::named(
            [
                ("free", Policy::new(tb(Quota::per_minute(10).unwrap()))),
                (
                    "pro",
                    Policy::from_limits([
                        tb(Quota::per_minute(100).unwrap()),
                        tb(Quota::per_second(5).unwrap()).named("burst").unwrap(),
                    ])
                    .unwrap(),
                ),
            ],
            [daily],
        )
        .unwrap();
        let names = |p: &Policy| {
            p.limits()
                .iter()
                .map(|l| l.name().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(set.policy("free").unwrap()), ["daily", "free"]);
        assert_eq!(
            names(set.policy("pro").unwrap()),
            ["daily", "pro-1", "burst"]
        );
        assert_eq!(set.fallback(), set.policy("free").unwrap());
        assert!(PolicySet::named(
            [("a b", Policy::new(tb(Quota::per_second(1).unwrap())))],
            []
        )
        .is_err());
        assert!(PolicySet::named(Vec::<(&str, Policy)>::new(), []).is_err());
    }

    /// The conversion of the module docs, exactly.
    #[test]
    fn state_is_carried_by_position() {
        let now = 1_000_000_000_000u64;
        let free = Policy::new(tb(Quota::per_minute(10).unwrap())); // T = 6 s, burst 10
        let pro = Policy::new(tb(Quota::per_minute(100).unwrap())); // T = 0.6 s, burst 100
        let mut s = [0u64; MAX_WORDS];
        for _ in 0..10 {
            assert!(free.decide(&mut s, now, 1).is_allowed());
        }
        // Upgrade: the 10 spent units stay spent: 90 left, not a fresh 100.
        let mut up = pro.carry_from(&free, &s, now);
        assert_eq!(pro.peek(&up, now, 0).remaining(), 90);
        // Half a unit drained counts as a whole one still outstanding.
        let later = now + 3_000_000_000;
        let up_later = pro.carry_from(&free, &s, later);
        assert_eq!(pro.peek(&up_later, later, 0).remaining(), 90);
        // Downgrade after 30 of 100: at most a full bucket (10), never a debt beyond it:
        // the next unit comes in one emission interval (6 s).
        for _ in 0..20 {
            assert!(pro.decide(&mut up, now, 1).is_allowed());
        }
        let down = free.carry_from(&pro, &up, now);
        let d = free.peek(&down, now, 1);
        assert_eq!(d.retry_after(), Some(Duration::from_secs(6)));
        // Same rate, another burst: the exact fill is kept (no rounding).
        let wide = Policy::new(tb(Quota::per_minute(10).unwrap().with_burst(20).unwrap()));
        let mut one = [0u64; MAX_WORDS];
        free.decide(&mut one, now, 1);
        let kept = wide.carry_from(&free, &one, now + 1);
        assert_eq!(kept[0], one[0]);
        // A window takes the bucket's outstanding units into the current window.
        let window = Policy::new(Limit::fixed_window(Quota::per_minute(10).unwrap()).unwrap());
        let w = window.carry_from(&free, &s, now);
        assert_eq!(window.peek(&w, now, 0).remaining(), 0);
        // And the same parameters keep the state word for word.
        assert_eq!(free.carry_from(&free.clone(), &s, later), s);
    }
}

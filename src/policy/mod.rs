//! Policies: the limits a request must pass, and named sets of them chosen per request.
//!
//! A [`Policy`] is one to four [`Limit`](crate::Limit)s that must all admit
//! a request (then all are charged, otherwise none). A [`PolicySet`] names several
//! policies (plans: `free`, `pro`) plus limits every one of them also applies (a daily
//! cap); a layer picks one per request with a selector, and a [`PolicyHandle`] swaps the
//! whole set while requests flow. Policies can be written as text:
//!
//! | text | limit |
//! |---|---|
//! | `100/s burst 200` | token bucket: 100 per second, bursts of 200 |
//! | `10/min` | token bucket: 10 per minute, bursts of 10 |
//! | `5/s meter` | strict leaky meter: 5 per second, evenly spaced |
//! | `queue 100/s 50` | leaky-bucket queue: 100 per second, up to 50 waiting (`nodelay 10`: the first 10 at once) |
//! | `1000/day window` | fixed window, UTC days (`offset 5h` moves the start) |
//! | `1000/h sliding` | sliding-window counter |
//! | `daily: 1000/day window` | a limit named `daily` in the `RateLimit` fields |
//! | `5/s shadow`, `5/s enforce 25%` | decided and charged, refusing for no key / a quarter of keys |
//!
//! Limits of one policy are separated by commas: `"minute: 100/min, daily: 10000/day window"`.
//!
//! # How a key keeps its state across policies
//!
//! A key has one state, for the policy it was last decided under. When a request of the
//! same key is decided under another policy (the key changed plan, or the set was swapped
//! for one with other quotas), each limit takes over the state of the limit at the same
//! position in the old policy (the limits every policy of a set applies come first, so
//! they always line up):
//!
//! - the same parameters: the state as it is;
//! - a token bucket (or meter, or queue) at the same rate: its exact fill, at most full;
//! - otherwise the old limit's outstanding units at that instant, rounded up to whole
//!   units, charged to the new limit at once, at most a full bucket or window.
//!
//! So an upgrade does not hand out a fresh burst (what was spent stays spent), and a
//! downgrade does not refuse more than the new limit would have after the same traffic
//! (the charge is capped at a full bucket: the wait never exceeds the new limit's own
//! refill time). A limit with no counterpart starts fresh.
//!
//! A request that began before a swap, still under the old set, does not convert the
//! state back: in memory it is decided on the state as its policy sees it and charged to
//! the state as the new set wrote it. (On Redis, such a request converts it back once.)
//! Policies that alternate for one key (chosen by route, say) share its state and convert
//! it at every change; to limit routes apart, key by route and client.
//!
//! ```
//! use tollgate::{policy::PolicySet, Policy};
//!
//! let plans = PolicySet::from_text(
//!     "free = 10/min\n\
//!      pro = 100/min\n\
//!      * = daily: 1000/day window",
//! )?;
//! let pro = plans.policy("pro").unwrap();
//! assert_eq!(pro.limits()[0].name(), "daily"); // every policy's limits first
//! assert_eq!(pro.limits()[1].name(), "pro");   // an unnamed limit takes its policy's name
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

pub(crate) mod choose;
pub(crate) mod handle;
mod limits;
#[cfg(feature = "serde")]
mod serde;
mod set;
mod text;

pub use self::handle::PolicyHandle;
pub(crate) use self::limits::Combine;
pub use self::limits::{IntoPolicy, Policy};
pub(crate) use self::set::check_names;
pub use self::set::{PolicyName, PolicySet};

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

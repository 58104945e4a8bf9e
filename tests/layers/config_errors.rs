//! Every invalid configuration is refused with its own `ConfigError`, never a panic.

use std::time::Duration;

use tollgate::{store::MemoryStore, ConfigError, Limit, Policy, Quota};

#[test]
fn zero_limit() {
    assert_eq!(Quota::per_second(0), Err(ConfigError::ZeroLimit));
}

#[test]
fn zero_period() {
    assert_eq!(Quota::new(1, Duration::ZERO), Err(ConfigError::ZeroPeriod));
}

#[test]
fn zero_burst() {
    assert_eq!(
        Quota::per_second(1).unwrap().with_burst(0),
        Err(ConfigError::ZeroBurst)
    );
}

#[test]
fn interval_below_resolution() {
    assert!(matches!(
        Quota::per_second(2_000_000_000),
        Err(ConfigError::IntervalBelowResolution { .. })
    ));
    assert!(
        Quota::per_second(1_000_000_000).is_ok(),
        "exactly 1 ns is fine"
    );
}

#[test]
fn overflow() {
    assert_eq!(
        Quota::new(1, Duration::from_secs(u64::MAX)),
        Err(ConfigError::Overflow("period"))
    );
    assert!(matches!(
        Quota::per_day(1).unwrap().with_burst(u64::MAX),
        Err(ConfigError::Overflow(_))
    ));
    assert!(matches!(
        Limit::leaky_queue(Quota::per_day(1).unwrap(), u32::MAX),
        Err(ConfigError::Overflow(_))
    ));
}

#[test]
fn burst_not_applicable() {
    let q = Quota::per_second(5).unwrap().with_burst(10).unwrap();
    assert!(matches!(
        Limit::leaky_meter(q),
        Err(ConfigError::BurstNotApplicable(_))
    ));
    assert!(matches!(
        Limit::fixed_window(q),
        Err(ConfigError::BurstNotApplicable(_))
    ));
    assert!(matches!(
        Limit::sliding_window(q),
        Err(ConfigError::BurstNotApplicable(_))
    ));
    assert!(matches!(
        Limit::leaky_queue(q, 3),
        Err(ConfigError::BurstNotApplicable(_))
    ));
}

#[test]
fn delay_exceeds_queue() {
    assert_eq!(
        Limit::leaky_queue_nodelay(Quota::per_second(5).unwrap(), 3, 4).unwrap_err(),
        ConfigError::DelayExceedsQueue {
            nodelay: 4,
            queue: 3
        }
    );
}

#[test]
fn no_limits_and_too_many() {
    assert_eq!(Policy::from_limits([]).unwrap_err(), ConfigError::NoLimits);
    let l = Limit::token_bucket(Quota::per_second(1).unwrap()).unwrap();
    let err = Policy::from_limits(std::iter::repeat_n(l, 4 + 1)).unwrap_err();
    assert_eq!(err, ConfigError::TooManyLimits(4 + 1));
}

#[test]
fn invalid_name() {
    let l = Limit::token_bucket(Quota::per_second(1).unwrap()).unwrap();
    assert!(matches!(
        l.clone().named("bad\nname"),
        Err(ConfigError::InvalidName(_))
    ));
    assert!(matches!(
        l.clone().named(""),
        Err(ConfigError::InvalidName(_))
    ));
    assert_eq!(l.named("per-second").unwrap().name(), "per-second");
}

#[test]
fn store_budget_too_small_for_one_key() {
    let s = MemoryStore::<u32>::new(Limit::token_bucket(Quota::per_second(1).unwrap()).unwrap());
    assert!(matches!(s.with_max_bytes(0), Err(ConfigError::Store(_))));
}

#[test]
fn errors_display_clearly() {
    assert_eq!(
        ConfigError::ZeroLimit.to_string(),
        "quota limit must be at least 1"
    );
}

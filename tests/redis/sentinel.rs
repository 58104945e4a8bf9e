//! Sentinel: a master, a replica and three sentinels, real processes. Two instances share
//! one hot key through `redis+sentinel://` URLs; the master is killed (SIGKILL) and the
//! sentinels promote the replica. Over the outage and the minute after it the fleet admits
//! within what one exact limiter admits (the bound of the Redis guide), no decision is a
//! refusal for want of Redis, no request waits past one deadline, and decisions come from
//! the new master within a second of the sentinels naming it.
//!
//! Decisions run on a manual clock shared by the instances (advanced with real time
//! during the failover, then through the following minute at once); deadlines, the
//! failover and the sentinels' timers are real.

use std::time::{Duration, Instant};

use crate::support::redis::SentinelGroup;
use tollgate::clock::{Clock, ManualClock};
use tollgate::decision::Source;
use tollgate::store::{RedisConnection, RedisStore};
use tollgate::{Limit, Policy, Quota};

const DEADLINE: Duration = Duration::from_millis(20);
/// What the machine may add to a deadline (a loaded 2-core machine's scheduling).
const MARGIN: Duration = Duration::from_millis(40);

fn limit() -> Limit {
    Limit::token_bucket(Quota::per_minute(20).unwrap()).unwrap()
}

/// Regression: Sentinel was not supported (redis-rs 1.8 resolves a Sentinel-managed
/// master once; a connection that reconnected to the same address after a failover kept
/// calling the old master).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_replaced_through_the_sentinels() {
    let Some(group) = SentinelGroup::start(1000, None) else {
        return;
    };
    let clock = ManualClock::at(Duration::from_secs(1_700_000_000));
    let mut stores = Vec::new();
    for _ in 0..2 {
        let conn = RedisConnection::connect(&group.url()).await.unwrap();
        stores.push(
            RedisStore::builder("hot", limit())
                .namespace("sentinel")
                .clock(clock.clone())
                .deadline(DEADLINE)
                .build(conn)
                .unwrap(),
        );
    }
    let start = Instant::now();
    while !stores.iter().all(|s| s.fallback_share() == Some(0.5)) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "fleet not counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let policy = Policy::new(limit());
    let mut exact_state = [0u64; 16];
    let mut exact = |now: u64| policy.decide(&mut exact_state, now, 1).is_allowed();
    let (mut admitted, mut exact_admitted, mut i) = (0u32, 0u32, 0usize);
    let mut slowest = Duration::ZERO;

    // Redis answers: a request every 100 ms.
    for _ in 0..24 {
        clock.advance(Duration::from_millis(100));
        let d = stores[i % 2].check("hot", 1).await.unwrap();
        i += 1;
        assert!(matches!(d.source(), Source::Store | Source::NegativeCache));
        exact(clock.now());
    }

    let old_master = group.master_port();
    group.master.pid(); // the master runs
    let mut group = group;
    let killed = Instant::now();
    group.master.kill();
    let mut switched = None;
    let mut back = None;
    let mut last_poll = Instant::now();
    // A request every 20 ms of real and manual time, until Redis has decided for 2 s.
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        clock.advance(Duration::from_millis(20));
        let asked = Instant::now();
        let d = stores[i % 2].check("hot", 1).await.unwrap();
        i += 1;
        slowest = slowest.max(asked.elapsed());
        assert!(
            matches!(
                d.source(),
                Source::Store | Source::Fallback | Source::NegativeCache
            ),
            "{:?}",
            d.source()
        );
        admitted += u32::from(d.is_allowed());
        exact_admitted += u32::from(exact(clock.now()));
        if switched.is_none() && last_poll.elapsed() >= Duration::from_millis(100) {
            last_poll = Instant::now();
            if group.master_port().is_some_and(|p| Some(p) != old_master) {
                switched = Some(killed.elapsed());
            }
        }
        if d.source() == Source::Store && back.is_none() && switched.is_some() {
            back = Some(killed.elapsed());
        }
        if back.is_some_and(|b| killed.elapsed() > b + Duration::from_secs(2)) {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "no failover: switched {switched:?}, back {back:?}"
        );
    }
    // The minute after.
    for _ in 0..120 {
        clock.advance(Duration::from_millis(500));
        let d = stores[i % 2].check("hot", 1).await.unwrap();
        i += 1;
        assert!(
            matches!(d.source(), Source::Store | Source::NegativeCache),
            "the new master decides: {:?}",
            d.source()
        );
        admitted += u32::from(d.is_allowed());
        exact_admitted += u32::from(exact(clock.now()));
    }
    let (switched, back) = (switched.unwrap(), back.unwrap());
    eprintln!(
        "sentinel failover: the sentinels named the new master {switched:?} after the kill, \
         Redis decided again {back:?} after it; {admitted} admitted over the outage and the \
         next minute, {exact_admitted} by one exact limiter; slowest decision {slowest:?}"
    );
    assert!(
        back <= switched + Duration::from_secs(1),
        "decisions from the new master {back:?} after the kill, the switch at {switched:?}"
    );
    assert!(
        f64::from(admitted) <= 1.2 * f64::from(exact_admitted),
        "{admitted} admitted against {exact_admitted}"
    );
    assert!(
        slowest <= DEADLINE + MARGIN,
        "a decision waited {slowest:?}"
    );
}

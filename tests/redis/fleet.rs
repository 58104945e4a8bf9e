//! The fleet count behind the default fallback share (`1 / N`): a fleet Redis will not let
//! count itself falls back at a floor the app sets, and says so; leases that cannot be real
//! are not counted.

use std::time::{Duration, Instant};

use crate::support::redis::RedisServer;
use crate::support::Events;
use tollgate::clock::ManualClock;
use tollgate::decision::Source;
use tollgate::store::{RedisConnection, RedisStore};
use tollgate::{Limit, Quota};

/// 5 a second, bursts of 10: over a 10 s outage two instances at half each admit at most
/// `2 · ½ · (10 + 5 · 10) = 60`.
fn limit() -> Limit {
    Limit::token_bucket(Quota::per_second(5).unwrap().with_burst(10).unwrap()).unwrap()
}

/// Waits (real time) until `cond` holds.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(10), "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What two instances admit of one hot key over 10 s (manual time, a request every 50 ms,
/// alternately) while Redis is stopped.
async fn admitted_during_an_outage(server: &RedisServer, stores: &[RedisStore]) -> u32 {
    let clock = stores_clock();
    // Redis answers first: the key is known, with its bucket full.
    for s in stores {
        assert_eq!(s.check("hot", 0).await.unwrap().source(), Source::Store);
    }
    server.stop();
    let mut admitted = 0;
    for i in 0..200 {
        clock.advance(Duration::from_millis(50));
        admitted += u32::from(stores[i % 2].check("hot", 1).await.unwrap().is_allowed());
    }
    server.cont();
    admitted
}

fn stores_clock() -> ManualClock {
    static CLOCK: std::sync::OnceLock<ManualClock> = std::sync::OnceLock::new();
    CLOCK
        .get_or_init(|| ManualClock::at(Duration::from_secs(1_700_000_000)))
        .clone()
}

/// Two instances on connections as `url`, the floor `floor`.
async fn fleet(url: &str, namespace: &str, floor: Option<u32>) -> Vec<RedisStore> {
    let mut stores = Vec::new();
    for _ in 0..2 {
        let mut b = RedisStore::builder("hot", limit())
            .namespace(namespace)
            .clock(stores_clock());
        if let Some(f) = floor {
            b = b.fleet_floor(f);
        }
        stores.push(
            b.build(RedisConnection::connect(url).await.unwrap())
                .unwrap(),
        );
    }
    stores
}

/// Regression: under a Redis user without `ZADD` the fleet's lease was refused at every
/// renewal, logged at `debug` only, and each instance fell back at the whole quota: two
/// instances admitted 99 in a 10 s outage against the 60 the guide documents for two.
#[tokio::test]
async fn a_fleet_that_cannot_be_counted_falls_back_at_its_floor_and_says_so() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let (events, _guard) = Events::capture();
    let ok = server.cli(&[
        "ACL", "SETUSER", "nozadd", "on", ">pw", "~*", "&*", "+@all", "-zadd",
    ]);
    assert!(ok.contains("OK"), "{ok}");
    let url = format!("redis://nozadd:pw@127.0.0.1:{}", server.port);

    let unfloored = fleet(&url, "nozadd-1", None).await;
    let stores = fleet(&url, "nozadd-2", Some(2)).await;
    // Each renewal is refused: the first one's warning comes within a second.
    until("the refused renewal is logged", || {
        events
            .at("WARN")
            .iter()
            .any(|l| l.contains("the fleet cannot be counted"))
    })
    .await;
    let warnings = |events: &Events| {
        events
            .at("WARN")
            .iter()
            .filter(|l| l.contains("the fleet cannot be counted"))
            .count()
    };
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    // Once per instance (connection) and namespace, not at every refused renewal.
    assert_eq!(warnings(&events), 4, "{:?}", events.at("WARN"));
    assert_eq!(
        unfloored[0].fallback_share(),
        Some(1.0),
        "no count, no floor"
    );
    assert_eq!(stores[0].fallback_share(), Some(0.5));
    assert_eq!(stores[1].fallback_share(), Some(0.5));

    let admitted = admitted_during_an_outage(&server, &stores).await;
    eprintln!("uncountable fleet, floor 2: {admitted} admitted in a 10 s outage (bound 60)");
    assert!(admitted <= 60, "{admitted} admitted, at most 60");
}

/// Regression: members written into the fleet's set by something else, scored to end far
/// in the future, were counted as instances: a thousand of them shrank each instance's
/// share to a thousandth (3 admitted of 50).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_that_cannot_be_real_are_not_counted() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let stores = fleet(&server.url(), "fakes", None).await;
    until("the fleet is counted", || {
        stores.iter().all(|s| s.fallback_share() == Some(0.5))
    })
    .await;
    let time = server.cli(&["TIME"]);
    let secs: u64 = time.lines().next().unwrap().trim().parse().unwrap();
    let far = (secs * 1000 + 3_600_000).to_string();
    let mut args = vec!["ZADD", "fakes:fleet:{members}"];
    let names: Vec<String> = (0..1000).map(|i| format!("fake-{i}")).collect();
    for n in &names {
        args.push(&far);
        args.push(n);
    }
    assert_eq!(server.cli(&args).trim(), "1000");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(stores[0].fallback_share(), Some(0.5));
    assert_eq!(stores[1].fallback_share(), Some(0.5));
    assert_eq!(server.cli(&["ZCARD", "fakes:fleet:{members}"]).trim(), "2");

    let admitted = admitted_during_an_outage(&server, &stores).await;
    eprintln!("fleet with 1000 fake leases: {admitted} admitted in a 10 s outage (bound 60)");
    assert!(
        admitted >= 50,
        "{admitted} admitted: the fakes shrank the share"
    );
}

/// After an outage the fleet admits what the limit allows, no less: each instance's units
/// are charged to the shared state over the time it spent them, not as a new debt. Two
/// instances, a key at rest when Redis stops, busy through the 10 s outage and the 20 s
/// after it (manual time, a request every 50 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_admits_the_limit_after_an_outage() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clock = ManualClock::at(Duration::from_secs(1_700_000_000));
    let mut stores = Vec::new();
    for _ in 0..2 {
        stores.push(
            RedisStore::builder("hot", limit())
                .namespace("after")
                .clock(clock.clone())
                .build(RedisConnection::connect(&server.url()).await.unwrap())
                .unwrap(),
        );
    }
    until("the fleet is counted", || {
        stores.iter().all(|s| s.fallback_share() == Some(0.5))
    })
    .await;
    let policy = tollgate::Policy::new(limit());
    let mut exact_state = [0u64; 16];
    let mut i = 0;
    let mut phases = Vec::new();
    for (steps, step_ms, stopped) in [
        (10, 500, false),
        (200, 50, true),
        (200, 50, false),
        (200, 50, false),
    ] {
        if stopped {
            server.stop();
        }
        let (mut admitted, mut exact) = (0, 0);
        for _ in 0..steps {
            clock.advance(Duration::from_millis(step_ms));
            admitted += u32::from(stores[i % 2].check("hot", 1).await.unwrap().is_allowed());
            i += 1;
            use tollgate::clock::Clock;
            exact += u32::from(policy.decide(&mut exact_state, clock.now(), 1).is_allowed());
        }
        if stopped {
            server.cont();
            // The breaker's probe, and the fallback's units charged back.
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        phases.push((admitted, exact));
    }
    eprintln!("before, during, and the two 10 s after the outage (fleet, exact): {phases:?}");
    let [_, during, after, later] = phases[..] else {
        unreachable!()
    };
    assert!(during.0 <= during.1, "{during:?}");
    for (fleet, exact) in [after, later] {
        assert!(
            fleet + 1 >= exact && fleet <= exact + 1,
            "{fleet} admitted against {exact}"
        );
    }
}

//! The Redis store decides exactly like the in-memory store; keys expire when fresh and
//! hold exact integers; quotas the script cannot decide exactly are refused.

use std::time::Duration;

use crate::support::equiv;
use crate::support::redis::{stored_words, Target};
use equiv::{compare, compare_concurrent, ops_strategy, policies_strategy};
use proptest::test_runner::{Config, TestRunner};
use tollgate::decision::Outcome;
use tollgate::decision::Source;
use tollgate::store::{RedisConnection, RedisStore};
use tollgate::ConfigError;
use tollgate::Limit;
use tollgate::Policy;
use tollgate::Quota;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// What both property tests start from: a runtime, a connection to the test server, a
/// runner of 100 cases, and start times around today's Unix time in µs, so window
/// alignment sees realistic magnitudes.
fn property_setup(
    target: &Target,
) -> (
    tokio::runtime::Runtime,
    RedisConnection,
    TestRunner,
    std::ops::Range<u64>,
) {
    let rt = runtime();
    let conn = rt
        .block_on(RedisConnection::connect(&target.url()))
        .unwrap();
    let runner = TestRunner::new(Config {
        cases: 100,
        ..Config::default()
    });
    (
        rt,
        conn,
        runner,
        1_750_000_000_000_000..1_760_000_000_000_000,
    )
}

#[test]
fn equivalent_to_memory_store() {
    let Some(target) = Target::get() else { return };
    let (rt, conn, mut runner, start) = property_setup(&target);
    runner
        .run(
            &(policies_strategy(), ops_strategy(), start),
            |(policies, ops, start)| rt.block_on(compare(&conn, &policies, start, &ops)),
        )
        .unwrap();
}

/// The batching path: up to `window` operations in flight at once on one connection, so
/// the batcher sends the first alone and the rest as batch calls; every decision must
/// still be the in-memory store's, made one after the other (the same key in every
/// request, so a batch that reordered or mixed up replies would be caught).
#[test]
fn equivalent_to_memory_store_through_batches() {
    let Some(target) = Target::get() else { return };
    let (rt, conn, mut runner, start) = property_setup(&target);
    runner
        .run(
            &(policies_strategy(), ops_strategy(), start, 2usize..64),
            |(policies, ops, start, window)| {
                rt.block_on(compare_concurrent(&conn, &policies, start, &ops, window))
            },
        )
        .unwrap();
}

/// Hand-picked boundaries: a full bucket admits exactly `burst`, retry-after is exact to
/// the nanosecond, windows reset at their edge.
#[test]
fn boundaries_match() {
    let Some(target) = Target::get() else { return };
    let rt = runtime();
    rt.block_on(async {
        let conn = RedisConnection::connect(&target.url()).await.unwrap();
        let policy = Policy::new(
            Limit::token_bucket(Quota::per_second(3).unwrap().with_burst(2).unwrap()).unwrap(),
        )
        .and(Limit::sliding_window(Quota::per_minute(5).unwrap()).unwrap())
        .unwrap()
        .and(Limit::fixed_window(Quota::new(4, Duration::from_millis(700)).unwrap()).unwrap())
        .unwrap();
        let t0 = 1_755_000_000_123_456u64;
        let mut ops = vec![(0, 1, 0, 0), (0, 1, 0, 0), (0, 1, 0, 0), (0, 1, 7, 0)];
        // Walk to exactly the retry-after of the third request and around it.
        for _ in 0..40 {
            ops.push((1, 1, 7, 0));
        }
        ops.extend([
            (333_333, 1, 0, 0),
            (0, 1, 0, 0),
            (59_000_000, 2, 0, 0),
            (1, 9, 0, 0),
            (0, 3, 9, 0),
            (0, 1, 0, 0),
        ]);
        compare(&conn, &[policy], t0, &ops).await.unwrap();
    });
}

/// Regression: a state in debt (a cost settled above its estimate, a sync) made both
/// scripts refuse a cost of 0, which the in-memory store admits (the client then read the
/// fast script's refusal as a bad reply and fell back); and a sync capped a ban's longer
/// debt down to two buckets.
#[test]
fn costs_of_zero_and_syncs_on_a_state_in_debt_match_memory() {
    let Some(target) = Target::get() else { return };
    let rt = runtime();
    rt.block_on(async {
        let conn = RedisConnection::connect(&target.url()).await.unwrap();
        let t0 = 1_755_000_000_123_456u64;
        let meter: Policy = "1/ms meter".parse().unwrap();
        let two: Policy = "1/ms, 2/ms".parse().unwrap();
        // Settled 2 above the estimate (op 10 with cost 1), then looked at with cost 0.
        compare(
            &conn,
            std::slice::from_ref(&meter),
            t0,
            &[(0, 1, 10, 0), (0, 0, 0, 0)],
        )
        .await
        .unwrap();
        compare(
            &conn,
            &[two],
            t0,
            &[(0, 1, 10, 0), (0, 0, 0, 0), (0, 0, 7, 0)],
        )
        .await
        .unwrap();
        // Banned for 17 ms (op 13 with cost 10), then charged over the estimate.
        compare(
            &conn,
            &[meter],
            t0,
            &[
                (0, 10, 13, 0),
                (0, 1, 10, 0),
                (0, 1, 0, 0),
                (16_000, 1, 0, 0),
            ],
        )
        .await
        .unwrap();
    });
}

/// A fill of 2^51 ns or more (after a ban of about 30 days): the fast replies of the batch
/// script and of the fast script travel in their long form (two values) then; checks admitted, refused and past
/// the burst, a cost of zero and peeks, decided in one batch behind the ban, still match
/// the in-memory store.
#[test]
fn fills_past_2_pow_51_through_batches_match_memory() {
    let Some(target) = Target::get() else { return };
    let rt = runtime();
    rt.block_on(async {
        let conn = RedisConnection::connect(&target.url()).await.unwrap();
        let t0 = 1_755_000_000_123_456u64;
        let bucket = Policy::new(
            Limit::token_bucket(Quota::per_second(5).unwrap().with_burst(3).unwrap()).unwrap(),
        );
        // Op 13: a ban of 1 500 000 000 * 1.7 ms, 2.55e15 ns (2^51 is 2.25e15).
        let ban = (0, 1_500_000_000, 13, 0);
        let after = [
            (0, 1, 0, 0),
            (0, 0, 0, 0),
            (0, 1, 7, 0),
            (0, 9, 0, 0),
            (1_000, 1, 0, 0),
            (0, 0, 7, 0),
        ];
        let mut ops = vec![(0, 1, 0, 0), (0, 1, 0, 0), ban];
        ops.extend(after);
        compare_concurrent(&conn, std::slice::from_ref(&bucket), t0, &ops, 16)
            .await
            .unwrap();
        // One call at a time: the fast script's own long form ({code, fill}).
        compare(&conn, std::slice::from_ref(&bucket), t0, &ops)
            .await
            .unwrap();
        // The same behind a short fill in the same batch, on a state a fast charge wrote.
        let mut ops = vec![(0, 1, 0, 0), (0, 1, 0, 0), (0, 1, 0, 0), ban, (0, 1, 0, 0)];
        ops.extend(after);
        compare_concurrent(&conn, &[bucket], t0, &ops, 16)
            .await
            .unwrap();
    });
}

#[test]
fn refuses_quotas_it_cannot_decide_exactly() {
    // No server needed: the policy is checked when the store is built.
    let Some(target) = Target::get() else { return };
    let rt = runtime();
    let conn = rt
        .block_on(RedisConnection::connect(&target.url()))
        .unwrap();
    let build = |l: Limit| RedisStore::builder("limit", Policy::new(l)).build(conn.clone());
    let sub_us = Limit::fixed_window(Quota::new(1, Duration::from_nanos(1_500)).unwrap()).unwrap();
    assert!(matches!(build(sub_us), Err(ConfigError::Store(_))));
    let big_window = Limit::sliding_window(Quota::per_day(100_000).unwrap()).unwrap();
    assert!(matches!(build(big_window), Err(ConfigError::Store(_))));
    let ok_window = Limit::sliding_window(Quota::per_day(20_000).unwrap()).unwrap();
    assert!(build(ok_window).is_ok());
    let long_bucket =
        Limit::token_bucket(Quota::per_day(1).unwrap().with_burst(30).unwrap()).unwrap();
    assert!(matches!(build(long_bucket), Err(ConfigError::Store(_))));
    let ok_bucket =
        Limit::token_bucket(Quota::per_day(10_000).unwrap().with_burst(10_000).unwrap()).unwrap();
    assert!(build(ok_bucket).is_ok());
    let limit = Limit::token_bucket(Quota::per_second(1).unwrap()).unwrap();
    assert!(RedisStore::builder("limit", limit.clone())
        .namespace("a{b")
        .build(conn.clone())
        .is_err());
    assert!(RedisStore::builder("limit", limit)
        .deadline(Duration::ZERO)
        .build(conn)
        .is_err());
}

async fn cmd<T: redis::FromRedisValue>(
    con: &mut redis::aio::MultiplexedConnection,
    args: &[&[u8]],
) -> T {
    let mut c = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query_async(con).await.unwrap()
}

/// A raw connection for inspecting keys, and the store's connection.
async fn connections(target: &Target) -> (redis::aio::MultiplexedConnection, RedisConnection) {
    let client = redis::Client::open(target.url()).unwrap();
    let con = client.get_multiplexed_async_connection().await.unwrap();
    let conn = RedisConnection::connect(&target.url()).await.unwrap();
    (con, conn)
}

/// A value the scripts did not write (another stored format, another tool's key) is read
/// as no state and replaced, through both scripts: the one-limit fast path and the general
/// one (several limits, and refunds).
#[test]
fn foreign_values_are_read_as_fresh_state() {
    let Some(target) = Target::get() else { return };
    let rt = runtime();
    rt.block_on(async {
        let (mut con, conn) = connections(&target).await;
        let one = Policy::new(
            Limit::token_bucket(Quota::per_second(10).unwrap().with_burst(5).unwrap()).unwrap(),
        );
        let two = one
            .clone()
            .and(Limit::fixed_window(Quota::per_minute(100).unwrap()).unwrap())
            .unwrap();
        for (policy, words) in [(one, 4), (two, 8)] {
            let store = RedisStore::builder("limit", policy)
                .namespace("foreign-test")
                .build(conn.clone())
                .unwrap();
            let key = format!("foreign-{}-{words}", std::process::id());
            let rkey = store.redis_key(key.as_str());
            for foreign in [
                &b"1700000000000000 300000000"[..], // decimal text, as `v1` was
                b"",
                &[7; 24],
                &[0xff; 16],                                             // NaN
                &[0, 0, 0, 0, 0, 0, 0xf0, 0x7f, 0, 0, 0, 0, 0, 0, 0, 0], // +inf, 0
                &[0, 0, 0, 0, 0, 0, 0xf0, 0xbf, 0, 0, 0, 0, 0, 0, 0, 0], // -1, 0
            ] {
                let _: () = cmd(&mut con, &[b"SET", &rkey, foreign]).await;
                let d = store.check(&key, 1).await.unwrap();
                assert!(d.is_allowed(), "{foreign:?}");
                assert_eq!(d.remaining(), 4, "{foreign:?} read as fresh");
                let raw: Vec<u8> = cmd(&mut con, &[b"GET", &rkey]).await;
                assert_eq!(stored_words(&raw).len(), words, "{foreign:?} replaced");
                let _: () = cmd(&mut con, &[b"SET", &rkey, foreign]).await;
                store.refund_confirmed(key.as_str(), 1).await.unwrap();
                let raw: Vec<u8> = cmd(&mut con, &[b"GET", &rkey]).await;
                assert_eq!(raw, foreign, "a refund of no state writes nothing");
            }
        }
    });
}

#[test]
fn ttl_is_time_to_fresh_and_values_are_integers() {
    let Some(target) = Target::get() else { return };
    let rt = runtime();
    rt.block_on(async {
        let (mut con, conn) = connections(&target).await;
        // 10/s, burst 5: three requests fill 300 ms.
        let policy = Policy::new(
            Limit::token_bucket(Quota::per_second(10).unwrap().with_burst(5).unwrap()).unwrap(),
        );
        let store = RedisStore::builder("limit", policy)
            .namespace("ttl-test")
            .build(conn.clone())
            .unwrap();
        let key = format!("ttl-{}", std::process::id());
        let rkey = store.redis_key(key.as_str());
        let mut last = None;
        for _ in 0..3 {
            last = Some(store.check(&key, 1).await.unwrap());
        }
        let last = last.unwrap();
        assert_eq!(last.source(), Source::Store);
        let pttl: i64 = cmd(&mut con, &[b"PTTL", &rkey]).await;
        let expect_ms = last.reset_after().as_nanos().div_ceil(1_000_000) as i64;
        assert!(
            (expect_ms - 2..=expect_ms).contains(&pttl),
            "PTTL {pttl} vs time to full {expect_ms} ms"
        );
        eprintln!("PTTL {pttl} ms, time to full {expect_ms} ms");

        // The stored value is integers as little-endian doubles: write time (µs), the
        // limit's descriptor (T and cap, ns) and fill (ns) = reset_after.
        let raw: Vec<u8> = cmd(&mut con, &[b"GET", &rkey]).await;
        let words = stored_words(&raw);
        assert_eq!(words.len(), 4, "{raw:?}");
        assert_eq!(words[1], 100_000_000, "{raw:?}");
        assert_eq!(words[2], 500_000_000, "{raw:?}");
        assert_eq!(words[3], last.reset_after().as_nanos() as u64, "{raw:?}");
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
        let server_us = secs * 1_000_000 + micros;
        assert!(
            server_us - words[0] < 1_000_000,
            "write time {} vs server {}",
            words[0],
            server_us
        );

        // Exhaust, then a refusal does not extend the TTL.
        while store.check(&key, 1).await.unwrap().is_allowed() {}
        let before: i64 = cmd(&mut con, &[b"PTTL", &rkey]).await;
        let raw_before: Vec<u8> = cmd(&mut con, &[b"GET", &rkey]).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let no_cache = RedisStore::builder("limit", store.policy().clone())
            .namespace("ttl-test")
            .negative_cache(0)
            .build(conn.clone())
            .unwrap();
        let refused = no_cache.check(&key, 1).await.unwrap();
        assert!(!refused.is_allowed());
        let after: i64 = cmd(&mut con, &[b"PTTL", &rkey]).await;
        let raw_after: Vec<u8> = cmd(&mut con, &[b"GET", &rkey]).await;
        assert_eq!(raw_before, raw_after, "a refusal writes nothing");
        assert!(
            after <= before - 15,
            "refusal extended the TTL: {before} -> {after}"
        );

        // A short quota: the key disappears once the bucket is full again.
        let short = RedisStore::builder(
            "short",
            Limit::token_bucket(Quota::per_second(100).unwrap()).unwrap(),
        )
        .namespace("ttl-test")
        .build(conn.clone())
        .unwrap();
        // (Another key: a key's state is one under every policy.)
        let key = format!("{key}-short");
        assert!(short.check(&key, 2).await.unwrap().is_allowed());
        let skey = short.redis_key(key.as_str());
        let exists: i64 = cmd(&mut con, &[b"EXISTS", &skey]).await;
        assert_eq!(exists, 1);
        tokio::time::sleep(Duration::from_millis(40)).await;
        let exists: i64 = cmd(&mut con, &[b"EXISTS", &skey]).await;
        assert_eq!(exists, 0, "idle key still there after its 20 ms to full");

        // Several limits: one key, all words integers.
        let multi = RedisStore::builder(
            "multi",
            Policy::new(Limit::token_bucket(Quota::per_second(5).unwrap()).unwrap())
                .and(Limit::sliding_window(Quota::per_minute(100).unwrap()).unwrap())
                .unwrap()
                .and(Limit::fixed_window(Quota::per_hour(1000).unwrap()).unwrap())
                .unwrap(),
        )
        .namespace("ttl-test")
        .build(conn)
        .unwrap();
        let d = multi.check(&key, 3).await.unwrap();
        assert!(d.is_allowed());
        let mkey = multi.redis_key(key.as_str());
        let raw: Vec<u8> = cmd(&mut con, &[b"GET", &mkey]).await;
        let words = stored_words(&raw);
        // Write time; per limit its descriptor and its state (a window's end, then counts).
        assert_eq!(words.len(), 1 + (2 + 1) + (2 + 3) + (2 + 2), "{raw:?}");
        assert_eq!(words[3], d.limits()[0].reset_after().as_nanos() as u64);
        assert_eq!(words[8], 3);
        assert_eq!(words[12], 3);
        let pttl: i64 = cmd(&mut con, &[b"PTTL", &mkey]).await;
        let expect_ms = d.reset_after().as_nanos().div_ceil(1_000_000) as i64;
        assert!(
            (expect_ms - 5..=expect_ms).contains(&pttl),
            "PTTL {pttl} vs {expect_ms}"
        );
    });
}

#[test]
fn exceeds_and_source() {
    let Some(target) = Target::get() else { return };
    let rt = runtime();
    rt.block_on(async {
        let conn = RedisConnection::connect(&target.url()).await.unwrap();
        let store = RedisStore::new(
            "limit",
            Limit::token_bucket(Quota::per_second(5).unwrap()).unwrap(),
            conn,
        )
        .unwrap();
        let key = format!("exc-{}", std::process::id());
        let d = store.check(&key, 6).await.unwrap();
        assert_eq!(d.outcome(), Outcome::Exceeds);
        assert_eq!(d.source(), Source::Store);
        let d = store.peek(&key, 5).await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 0);
    });
}

/// Regression (with `day_windows_end_at_utc_midnight`): memory day windows began at
/// process start while Redis followed the server's clock. Both now end at 00:00 UTC: a
/// refusal on each says the same retry-after.
#[test]
fn a_day_window_ends_at_the_same_instant_in_memory_and_on_redis() {
    let Some(target) = Target::get() else { return };
    let rt = runtime();
    rt.block_on(async {
        let conn = RedisConnection::connect(&target.url()).await.unwrap();
        let limit = Limit::fixed_window(Quota::per_day(1).unwrap()).unwrap();
        let redis = RedisStore::builder("limit", limit.clone())
            .namespace("day-test")
            .negative_cache(0)
            .build(conn)
            .unwrap();
        let memory = tollgate::store::MemoryStore::new(limit);
        let key = format!("day-{}", std::process::id());
        redis.check(&key, 1).await.unwrap();
        memory.check(&key, 1);
        let on_redis = redis.check(&key, 1).await.unwrap().retry_after().unwrap();
        let in_memory = memory.check(&key, 1).retry_after().unwrap();
        let apart = on_redis.abs_diff(in_memory);
        assert!(
            apart < Duration::from_secs(1),
            "Redis {on_redis:?} vs memory {in_memory:?}"
        );
        assert!(on_redis <= Duration::from_secs(86_400));
    });
}

/// Regression: key material of up to 64 printable bytes went into Redis key names as it
/// was, so API keys were readable with `SCAN` and `MONITOR`. Names hold a hash by default.
#[test]
fn api_keys_are_not_readable_in_key_names() {
    let Some(target) = Target::get() else { return };
    let rt = runtime();
    rt.block_on(async {
        let (mut con, conn) = connections(&target).await;
        let limit = Limit::token_bucket(Quota::per_second(5).unwrap()).unwrap();
        let store = RedisStore::builder("limit", limit.clone())
            .namespace("secret-test")
            .build(conn.clone())
            .unwrap();
        let secret = format!("sk_live_{}", std::process::id());
        assert!(store.check(&secret, 1).await.unwrap().is_allowed());
        let names: Vec<Vec<u8>> = cmd(&mut con, &[b"KEYS", b"secret-test:*"]).await;
        assert!(!names.is_empty());
        for n in &names {
            assert!(
                !String::from_utf8_lossy(n).contains(&secret),
                "{}",
                String::from_utf8_lossy(n)
            );
        }
        // The readable mode, for debugging, writes it as it is.
        let readable = RedisStore::builder("limit", limit)
            .namespace("secret-test")
            .readable_keys(true)
            .build(conn)
            .unwrap();
        let name = readable.redis_key(secret.as_str());
        assert!(String::from_utf8_lossy(&name).contains(&secret));
    });
}

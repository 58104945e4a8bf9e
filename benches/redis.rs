//! Redis store throughput: decisions per second through tollgate's `RedisStore` versus the
//! same redis-rs `ConnectionManager` calling a bare, hand-rolled GCRA script directly.
//! Both sides run 64 concurrent tasks on one connection for a fixed time, in interleaved
//! rounds; the table reports each side's median and the median of the per-round ratios.
//!
//! ```sh
//! cargo bench --features redis --bench redis      # starts its own redis-server
//! REDIS_URL=redis://127.0.0.1:6379 cargo bench --features redis --bench redis
//! ```
//!
//! Scenarios: one hot key admitted throughout; random keys (100 000 of them); and a hot key
//! that is refused, where tollgate's negative cache answers locally until the retry-after.

#[path = "../tests/support/redis.rs"]
mod support;

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use redis::aio::ConnectionManager;
use tollgate::{
    store::{RedisConnection, RedisStore},
    Limit, Quota,
};

const TASKS: usize = 64;
const ROUND: Duration = Duration::from_millis(1500);
const ROUNDS: usize = 7;
const KEYS: u64 = 100_000;

/// The script a team would write by hand: GCRA on one key, time from the server, TAT in µs.
const BARE_GCRA: &str = r"
local t = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local now = redis.call('TIME')
now = now[1] * 1000000 + now[2]
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local new_tat = tat + t
if new_tat - now > tau + t then
  return {0, new_tat - tau - t - now}
end
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil((new_tat - now) / 1000))
return {1, 0}
";

#[derive(Clone, Copy)]
enum Keys {
    Hot,
    Random,
}

fn key_for(keys: Keys, task: usize, i: u64) -> u64 {
    match keys {
        Keys::Hot => 7,
        // A cheap per-task pseudo-random walk over KEYS keys.
        Keys::Random => (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ task as u64) % KEYS,
    }
}

/// Runs `TASKS` tasks calling `decide` for `ROUND`; returns decisions per second.
async fn drive<F, Fut>(decide: F, keys: Keys) -> f64
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (decide, stop, done) = (decide.clone(), stop.clone(), done.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    decide(key_for(keys, task, i)).await;
                    i += 1;
                    // A locally answered decision never yields on its own: let the timer run.
                    if i.is_multiple_of(32) {
                        tokio::task::yield_now().await;
                    }
                }
                done.fetch_add(i, Ordering::Relaxed);
            })
        })
        .collect();
    tokio::time::sleep(ROUND).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let Some(target) = support::Target::get() else {
        println!("redis bench skipped: no redis-server (install it or set REDIS_URL)");
        return;
    };
    let client = redis::Client::open(target.url()).unwrap();
    let manager = ConnectionManager::new(client).await.unwrap();

    // Admit-everything quota for the allow scenarios, one unit per minute for the refused one.
    let open = Quota::per_second(1_000_000_000)
        .unwrap()
        .with_burst(1_000_000)
        .unwrap();
    let shut = Quota::per_minute(1).unwrap();
    let script = redis::Script::new(BARE_GCRA);
    // `TOLLGATE_REDIS_DEADLINE_MS` raises the store's deadline for runs under a profiler,
    // where round trips take far longer than the default 200 ms allows (a decision past its
    // deadline falls back to the local limiter and would be counted as tollgate's cost).
    let deadline = Duration::from_millis(
        std::env::var("TOLLGATE_REDIS_DEADLINE_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(200),
    );

    println!(
        "| scenario | tollgate RedisStore (decisions/s) | bare GCRA script (decisions/s) | ratio (median of rounds) | p25..p75 |"
    );
    println!("|---|---|---|---|---|");
    for (name, quota, keys) in [
        ("one hot key, admitted", open, Keys::Hot),
        ("100 000 random keys, admitted", open, Keys::Random),
        ("one hot key, refused (negative cache)", shut, Keys::Hot),
    ] {
        // `TOLLGATE_REDIS_SCENARIO=random` (say) runs only the matching scenarios.
        if let Ok(only) = std::env::var("TOLLGATE_REDIS_SCENARIO") {
            if !name.contains(&only) {
                continue;
            }
        }
        let store = Arc::new(
            RedisStore::builder(Limit::token_bucket(quota).unwrap())
                .namespace(format!("bench-{}", name.len()))
                .deadline(deadline)
                .build(RedisConnection::from(manager.clone()))
                .unwrap(),
        );
        let t_us = quota.emission_interval().as_micros().max(1) as u64;
        let tau_us = (quota.burst() - 1) * t_us;
        let (mut ours, mut bare) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let tollgate_side = {
                let store = store.clone();
                move |k: u64| {
                    let store = store.clone();
                    async move { store.check(&k, 1).await.unwrap().is_allowed() }
                }
            };
            let bare_side = {
                let (script, manager) = (script.clone(), manager.clone());
                move |k: u64| {
                    let (script, mut conn) = (script.clone(), manager.clone());
                    async move {
                        let r: (i64, i64) = script
                            .key(format!("bench-bare:{k}"))
                            .arg(t_us)
                            .arg(tau_us)
                            .invoke_async(&mut conn)
                            .await
                            .unwrap();
                        r.0 == 1
                    }
                }
            };
            // `TOLLGATE_REDIS_SIDE=tollgate` (or `bare`) runs one side only, for profilers.
            match std::env::var("TOLLGATE_REDIS_SIDE").as_deref() {
                Ok("tollgate") => {
                    ours.push(drive(tollgate_side, keys).await);
                    bare.push(1.0);
                    continue;
                }
                Ok("bare") => {
                    bare.push(drive(bare_side, keys).await);
                    ours.push(1.0);
                    continue;
                }
                _ => {}
            }
            // Interleave the order so drift on the machine hits both sides alike.
            if round % 2 == 0 {
                ours.push(drive(tollgate_side, keys).await);
                bare.push(drive(bare_side, keys).await);
            } else {
                bare.push(drive(bare_side, keys).await);
                ours.push(drive(tollgate_side, keys).await);
            }
        }
        // The ratio is the median of the per-round ratios: the two sides of a round ran
        // seconds apart, so drift on the machine cancels in each.
        let ratios = ours
            .iter()
            .zip(&bare)
            .map(|(o, b)| o / b)
            .collect::<Vec<_>>();
        let r = median(ratios.clone());
        let mut sorted = ratios;
        sorted.sort_by(f64::total_cmp);
        let (o, b) = (median(ours), median(bare));
        println!(
            "| {name} | {o:.0} | {b:.0} | {r:.2} | {:.2}..{:.2} |",
            sorted[ROUNDS / 4],
            sorted[ROUNDS - 1 - ROUNDS / 4]
        );
    }
}

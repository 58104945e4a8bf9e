//! Redis store throughput: decisions per second through tollgate's `RedisStore`, batching
//! (the default) and with batching off, versus the same redis-rs `ConnectionManager`
//! calling a bare, hand-rolled GCRA script directly, one call per decision. Every side
//! runs the row's concurrent tasks (64, or 1) on one connection for a fixed time, in
//! interleaved rounds; the table reports each side's median and the medians of the
//! per-round ratios.
//!
//! ```sh
//! cargo bench -p tollgate-benches --features redis --bench redis      # starts its own redis-server
//! REDIS_URL=redis://127.0.0.1:6379 cargo bench -p tollgate-benches --features redis --bench redis
//! ```
//!
//! Scenarios: one hot key admitted throughout; random keys (100 000 of them), with 64
//! callers and with one; a hot key that is refused, where tollgate's negative cache
//! answers locally until the retry-after; and random keys on a 3-shard Redis Cluster (its
//! own servers, batched per node against one call per decision).

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
use tollgate::store::{RedisConnection, RedisStore};
use tollgate::Limit;
use tollgate::Quota;

const ROUND: Duration = Duration::from_millis(1000);
const ROUNDS: usize = 7;
const KEYS: u64 = 100_000;

/// Decisions made so far, every side together: `bench/redis_instructions.sh` reads it
/// (printed on SIGUSR1) to divide its instruction counts by.
static DECISIONS: AtomicU64 = AtomicU64::new(0);

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

/// The server's CPU time so far, user plus system, in seconds (`INFO cpu`).
async fn server_cpu(conn: &mut ConnectionManager) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_user:")
                .or_else(|| l.strip_prefix("used_cpu_sys:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

/// One side's round: decisions per second, the server's CPU time per decision (µs) and
/// the decisions per script call.
#[derive(Clone, Copy)]
struct Run {
    rate: f64,
    server_us: f64,
    per_call: f64,
}

/// Script calls the server has run so far (`INFO commandstats`).
async fn script_calls(conn: &mut ConnectionManager) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// [`drive`], with the server's CPU time per decision.
async fn measure<F, Fut>(conn: &mut ConnectionManager, decide: F, keys: Keys, tasks: usize) -> Run
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let (before, calls) = (server_cpu(conn).await, script_calls(conn).await);
    let (rate, n) = drive(decide, keys, tasks).await;
    let cpu = server_cpu(conn).await - before;
    let calls = script_calls(conn).await - calls;
    Run {
        rate,
        server_us: cpu * 1e6 / n.max(1) as f64,
        per_call: n as f64 / calls.max(1) as f64,
    }
}

/// Runs `tasks` tasks calling `decide` for `ROUND`; returns decisions per second and the
/// decisions made.
async fn drive<F, Fut>(decide: F, keys: Keys, tasks: usize) -> (f64, u64)
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..tasks)
        .map(|task| {
            let (decide, stop, done) = (decide.clone(), stop.clone(), done.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    decide(key_for(keys, task, i)).await;
                    DECISIONS.fetch_add(1, Ordering::Relaxed);
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
    let n = done.load(Ordering::Relaxed);
    (n as f64 / start.elapsed().as_secs_f64(), n)
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
    // `TOLLGATE_REDIS_SIDE=batched` (or `unbatched`, `bare`) runs one side only, for
    // profilers; `TOLLGATE_REDIS_TASKS` then sets the number of callers (default 64) and
    // `TOLLGATE_REDIS_ROUNDS` the number of rounds (default 7).
    let only_side = std::env::var("TOLLGATE_REDIS_SIDE").ok();
    let only_tasks = std::env::var("TOLLGATE_REDIS_TASKS")
        .ok()
        .and_then(|n| n.parse().ok());
    let only_rounds = std::env::var("TOLLGATE_REDIS_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(ROUNDS);

    if only_side.is_some() {
        tokio::spawn(async {
            let kind = tokio::signal::unix::SignalKind::user_defined1();
            let mut signal = tokio::signal::unix::signal(kind).unwrap();
            while signal.recv().await.is_some() {
                eprintln!("decisions: {}", DECISIONS.load(Ordering::Relaxed));
            }
        });
    }

    let mut seen = std::collections::HashSet::new();
    println!(
        "| scenario | callers | batched (decisions/s) | unbatched | bare script | batched / unbatched (p25..p75) | batched / bare | unbatched / bare | server CPU µs per decision: batched / unbatched / bare (decisions per batched call) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (name, quota, keys, tasks) in [
        ("one hot key, admitted", open, Keys::Hot, 64),
        ("100 000 random keys, admitted", open, Keys::Random, 64),
        ("100 000 random keys, admitted", open, Keys::Random, 1),
        ("one hot key, refused (negative cache)", shut, Keys::Hot, 64),
    ] {
        // `TOLLGATE_REDIS_SCENARIO=random` (say) runs only the matching scenarios.
        if let Ok(only) = std::env::var("TOLLGATE_REDIS_SCENARIO") {
            if !name.contains(&only) {
                continue;
            }
        }
        let tasks = only_tasks.unwrap_or(tasks);
        if !seen.insert((name, tasks)) {
            continue;
        }
        let store = |batching: bool| {
            let url = target.url();
            async move {
                // Each store its own connection, as the bare script has its own.
                let conn = RedisConnection::connect(&url).await.unwrap();
                Arc::new(
                    RedisStore::builder("bench", Limit::token_bucket(quota).unwrap())
                        .namespace(format!("bench-{}", name.len()))
                        .deadline(deadline)
                        .batching(batching)
                        .build(conn)
                        .unwrap(),
                )
            }
        };
        let (batched, unbatched) = (store(true).await, store(false).await);
        let mut info = manager.clone();
        let t_us = quota.emission_interval().as_micros().max(1) as u64;
        let tau_us = (quota.burst() - 1) * t_us;
        let tollgate_side = |store: Arc<RedisStore>| {
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
        if let Some(side) = &only_side {
            for _ in 0..only_rounds {
                match side.as_str() {
                    "bare" => drive(bare_side.clone(), keys, tasks).await.0,
                    "unbatched" => drive(tollgate_side(unbatched.clone()), keys, tasks).await.0,
                    _ => drive(tollgate_side(batched.clone()), keys, tasks).await.0,
                };
            }
            continue;
        }
        let (mut b, mut u, mut bare) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            // Rotate the order so drift on the machine hits every side alike.
            for i in 0..3 {
                match (round + i) % 3 {
                    0 => b.push(
                        measure(&mut info, tollgate_side(batched.clone()), keys, tasks).await,
                    ),
                    1 => u.push(
                        measure(&mut info, tollgate_side(unbatched.clone()), keys, tasks).await,
                    ),
                    _ => bare.push(measure(&mut info, bare_side.clone(), keys, tasks).await),
                }
            }
        }
        // Ratios are medians of the per-round ratios: the sides of a round ran seconds
        // apart, so drift on the machine cancels in each.
        let ratios = |x: &[Run], y: &[Run]| {
            let mut r: Vec<f64> = x.iter().zip(y).map(|(a, b)| a.rate / b.rate).collect();
            r.sort_by(f64::total_cmp);
            r
        };
        let bu = ratios(&b, &u);
        let bb = ratios(&b, &bare);
        let ub = ratios(&u, &bare);
        let rate = |v: &[Run]| median(v.iter().map(|r| r.rate).collect());
        let cpu = |v: &[Run]| median(v.iter().map(|r| r.server_us).collect());
        println!(
            "| {name} | {tasks} | {:.0} | {:.0} | {:.0} | {:.2} ({:.2}..{:.2}) | {:.2} | {:.2} | {:.2} / {:.2} / {:.2} ({:.1}) |",
            rate(&b),
            rate(&u),
            rate(&bare),
            bu[ROUNDS / 2],
            bu[ROUNDS / 4],
            bu[ROUNDS - 1 - ROUNDS / 4],
            bb[ROUNDS / 2],
            ub[ROUNDS / 2],
            cpu(&b),
            cpu(&u),
            cpu(&bare),
            median(b.iter().map(|r| r.per_call).collect()),
        );
    }

    // The cluster row: batched per node against one call per decision.
    if std::env::var("TOLLGATE_REDIS_SCENARIO").is_ok_and(|only| !"cluster".contains(&only)) {
        return;
    }
    let Some(cluster) = support::RedisCluster::start() else {
        return;
    };
    let quota = open;
    let store = |batching: bool| {
        let urls = cluster.urls();
        async move {
            let conn = RedisConnection::connect_cluster(urls).await.unwrap();
            Arc::new(
                RedisStore::builder("bench-cluster", Limit::token_bucket(quota).unwrap())
                    .deadline(deadline)
                    .batching(batching)
                    .build(conn)
                    .unwrap(),
            )
        }
    };
    let (batched, unbatched) = (store(true).await, store(false).await);
    let side = |store: Arc<RedisStore>| {
        move |k: u64| {
            let store = store.clone();
            async move { store.check(&k, 1).await.unwrap().is_allowed() }
        }
    };
    // The servers' CPU time, summed over the nodes (`INFO cpu`), in seconds.
    let cluster_cpu = || -> f64 {
        cluster
            .nodes
            .iter()
            .map(|n| {
                n.cli(&["INFO", "cpu"])
                    .lines()
                    .filter_map(|l| {
                        l.strip_prefix("used_cpu_user:")
                            .or_else(|| l.strip_prefix("used_cpu_sys:"))
                    })
                    .filter_map(|v| v.trim().parse::<f64>().ok())
                    .sum::<f64>()
            })
            .sum()
    };
    let calls = || -> u64 { cluster.nodes.iter().map(|n| n.calls("evalsha")).sum() };
    let (mut b, mut u) = (Vec::new(), Vec::new());
    let (mut b_cpu, mut u_cpu, mut b_calls) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        for i in 0..2 {
            let (cpu0, calls0) = (cluster_cpu(), calls());
            let batched_side = (round + i) % 2 == 0;
            let (rate, n) = if batched_side {
                drive(side(batched.clone()), Keys::Random, 64).await
            } else {
                drive(side(unbatched.clone()), Keys::Random, 64).await
            };
            let us = (cluster_cpu() - cpu0) * 1e6 / n.max(1) as f64;
            if batched_side {
                b.push(rate);
                b_cpu.push(us);
                b_calls.push(n as f64 / (calls() - calls0).max(1) as f64);
            } else {
                u.push(rate);
                u_cpu.push(us);
            }
        }
    }
    let mut r: Vec<f64> = b.iter().zip(&u).map(|(x, y)| x / y).collect();
    r.sort_by(f64::total_cmp);
    println!(
        "| 3-shard cluster, 100 000 random keys, admitted | 64 | {:.0} | {:.0} | - | {:.2} ({:.2}..{:.2}) | - | - | {:.2} / {:.2} / - ({:.1}; servers summed) |",
        median(b),
        median(u),
        r[ROUNDS / 2],
        r[ROUNDS / 4],
        r[ROUNDS - 1 - ROUNDS / 4],
        median(b_cpu),
        median(u_cpu),
        median(b_calls),
    );
}

#![allow(unsafe_code)] // a counting global allocator: `GlobalAlloc` is an unsafe trait
//! Memory held, counted with a global allocator: what stored keys keep alive, what a flood
//! of keys holds against the byte budget, and what building layers leaves behind. The
//! tests take turns (one lock) so that each one's count is its own.

mod support;

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::{
        atomic::{AtomicIsize, Ordering},
        Mutex, MutexGuard,
    },
    time::{Duration, Instant},
};

use axum::{routing::get, Router};
/// The memory store's default budget, 32 MiB.
const DEFAULT_MAX_BYTES: usize = 32 << 20;

use tollgate::key::{Global, HeaderKey};
use tollgate::store::MemoryStore;
use tollgate::Limit;
use tollgate::Quota;
use tollgate::RateLimitLayer;

struct Counting;

/// Bytes allocated and not yet freed, by everything in this process.
static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

static TURN: Mutex<()> = Mutex::new(());

fn turn() -> MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

fn live() -> isize {
    LIVE.load(Ordering::SeqCst)
}

/// Waits (bounded) until the live bytes stop falling for 200 ms: connections closing and
/// their tasks ending free their buffers a little after the last response.
async fn settled() -> isize {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = live();
    let mut quiet = Instant::now();
    while Instant::now() < deadline && quiet.elapsed() < Duration::from_millis(200) {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = live();
        if now < last {
            quiet = Instant::now();
        }
        last = now;
    }
    last
}

/// Regression: `HeaderKey` stored a clone of the `HeaderValue`, which shares hyper's
/// connection read buffer, so every stored key kept that whole buffer alive (about 64 KB
/// per key with 60 KB of other headers). A key now keeps its own bytes only.
#[test]
fn header_keys_do_not_keep_request_buffers_alive() {
    let _turn = turn();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (keys, retained) = rt.block_on(async {
        let layer = RateLimitLayer::builder()
            .key(HeaderKey::new("x-api-key").unwrap())
            .token_bucket(Quota::per_minute(5).unwrap())
            .build()
            .unwrap();
        let app = Router::new()
            .route("/api", get(|| async { "ok" }))
            .layer(layer);
        let addr = support::serve(app).await;
        let url = format!("http://{addr}/api");
        let padding = "p".repeat(60_000);
        // Warm up: the store's first table, the server's first connection.
        let c = support::client();
        support::get(&c, &url, &[("x-api-key", "warm-up"), ("x-pad", &padding)]).await;
        drop(c);
        let before = settled().await;
        let n = 400;
        for i in 0..n {
            // A connection per request, closed after it, like distinct clients.
            let c = support::client();
            let key = format!("key-{i:06}");
            let got = support::get(&c, &url, &[("x-api-key", &key), ("x-pad", &padding)]).await;
            assert_eq!(got.status, 200);
        }
        (n, settled().await - before)
    });
    let per_key = retained / keys;
    let key_len = "key-000000".len() as isize;
    eprintln!("retained {retained} bytes for {keys} keys: {per_key} per key");
    assert!(
        per_key <= key_len + 128,
        "{per_key} bytes retained per key of {key_len} bytes"
    );
}

/// Regression: memory was bounded in keys (2^20 by default), not bytes: short `String`
/// keys cost about 99 bytes each, 104 MB at the cap. A flood now stays within the byte
/// budget, 32 MiB by default, evicting the keys closest to fresh and counting them.
#[test]
fn a_flood_of_string_keys_stays_within_the_default_budget() {
    let _turn = turn();
    let before = live();
    let store: MemoryStore<String> =
        MemoryStore::new(Limit::token_bucket(Quota::per_hour(10).unwrap()).unwrap());
    let n = 2_000_000u32;
    for i in 0..n {
        assert!(store.check(&format!("client-{i}"), 1).is_allowed());
    }
    let held = live() - before;
    let stats = store.stats();
    eprintln!(
        "{n} keys: {} held in {} MiB ({} B counted by the store), {} evicted with state",
        stats.keys,
        held >> 20,
        stats.bytes,
        stats.evicted_with_state
    );
    assert!(held as usize <= DEFAULT_MAX_BYTES, "{held} bytes held");
    assert!(stats.bytes <= DEFAULT_MAX_BYTES);
    // Every key still carried state (an hour to refill): each eviction is counted.
    assert_eq!(stats.evicted_with_state as usize, n as usize - stats.keys);
    assert!(stats.keys > 400_000, "{stats:?}");
}

/// Regression: the `RateLimit-Policy` value was leaked once per layer built, so layers
/// built at run time (per tenant, on reload, in tests) leaked without bound.
#[test]
fn building_and_dropping_layers_leaves_nothing_behind() {
    let _turn = turn();
    let build = || {
        let layer = RateLimitLayer::builder()
            .key(Global::new())
            .token_bucket(Quota::per_second(5).unwrap())
            .limit(Limit::fixed_window(Quota::per_day(1000).unwrap()).unwrap())
            .build()
            .unwrap();
        drop(layer);
    };
    for _ in 0..10 {
        build(); // first-use statics
    }
    // The least of three rounds: the test harness's own thread may allocate while a round
    // runs (recording another test's result), which a leak of even 1 B per layer outgrows.
    let grown = (0..3)
        .map(|_| {
            let before = live();
            for _ in 0..10_000 {
                build();
            }
            live() - before
        })
        .min()
        .unwrap();
    assert!(grown < 1024, "{grown} bytes left by 10 000 layers");
}

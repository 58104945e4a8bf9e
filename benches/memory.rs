//! Memory per key at 1 M keys: tollgate's [`MemoryStore`] against `governor`'s keyed
//! limiter (DashMap state), by key type: `u32`, `Ipv4Addr`, `Option<IpAddr>` (what a
//! `PeerIp` layer stores), a 13-byte `String` and a 24-byte `HeaderBytes` (what a
//! `HeaderKey` layer stores, an API key). tollgate keeps a key that owns no heap memory as
//! it is, and any other as a 12-byte digest; governor keeps every key as it is. A second
//! table gives how many keys tollgate's default budget (32 MiB) holds at most, by key type.
//!
//! A counting global allocator (wrapping [`System`]) tracks the live heap bytes; a figure is
//! the live bytes after building the limiter and inserting every key, minus the live bytes
//! before, divided by the number of keys. Every key is charged once against a quota of one
//! per hour, so every key carries state and none can be swept. The peak (the table's
//! resize, when old and new arrays are both alive) is printed too.
//!
//! Run with `cargo bench -p tollgate-benches --bench memory` (prints a table; no timing involved).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};

use governor::{Quota as GQuota, RateLimiter};
use tollgate::{key::HeaderBytes, store::MemoryStore, Limit, Quota};

/// Counts the live heap bytes and their high-water mark.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call forwards to `System` with the caller's arguments unchanged; the
// counters are only bookkeeping.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const KEYS: u32 = 1_000_000;

/// Live bytes per key held by what `fill` builds, and the peak per key while filling.
fn measure<T>(fill: impl FnOnce() -> T) -> (f64, f64) {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let held = fill();
    let after = LIVE.load(Ordering::Relaxed);
    let peak = PEAK.load(Ordering::Relaxed);
    drop(held);
    (
        (after - before) as f64 / f64::from(KEYS),
        (peak - before) as f64 / f64::from(KEYS),
    )
}

fn tollgate<K: Hash + Eq + Clone + Send + Sync + 'static>(key: fn(u32) -> K) -> (f64, f64) {
    measure(|| {
        // A budget large enough that 1 M keys of any type fit (the default is 32 MiB).
        let store = MemoryStore::new(Limit::token_bucket(Quota::per_hour(1).unwrap()).unwrap())
            .with_max_bytes(256 << 20)
            .unwrap();
        for i in 0..KEYS {
            assert!(store.check(&key(i), 1).is_allowed());
        }
        assert_eq!(store.len(), KEYS as usize);
        store
    })
}

fn governor<K: Hash + Eq + Clone + Send + Sync + 'static>(key: fn(u32) -> K) -> (f64, f64) {
    measure(|| {
        let limiter = RateLimiter::keyed(GQuota::per_hour(NonZeroU32::new(1).unwrap()));
        for i in 0..KEYS {
            assert!(limiter.check_key(&key(i)).is_ok());
        }
        assert_eq!(limiter.len(), KEYS as usize);
        limiter
    })
}

fn main() {
    // `cargo test --benches` runs this binary too; the table is only for `cargo bench`.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    println!("memory per key at {KEYS} keys (live heap bytes / keys; peak while filling)");
    println!("| key | tollgate B/key | governor B/key | ratio | tollgate peak | governor peak |");
    println!("|---|---|---|---|---|---|");
    type Row = (
        &'static str,
        fn() -> (f64, f64),
        fn() -> (f64, f64),
        fn() -> usize,
    );
    let rows: [Row; 5] = [
        (
            "u32",
            || tollgate(|i| i),
            || governor(|i| i),
            || capacity::<u32>(),
        ),
        (
            "Ipv4Addr",
            || tollgate(ipv4),
            || governor(ipv4),
            || capacity::<Ipv4Addr>(),
        ),
        (
            "Option<IpAddr>",
            || tollgate(|i| Some(IpAddr::V4(ipv4(i)))),
            || governor(|i| Some(IpAddr::V4(ipv4(i)))),
            || capacity::<Option<IpAddr>>(),
        ),
        (
            "String (13 B)",
            || tollgate(|i| format!("client-{i:06}")),
            || governor(|i| format!("client-{i:06}")),
            || capacity::<String>(),
        ),
        (
            "HeaderBytes (24 B)",
            || tollgate(api_key),
            || governor(api_key),
            || capacity::<HeaderBytes>(),
        ),
    ];
    let mut capacities = Vec::new();
    for (name, ours, theirs, cap) in rows {
        let (t, tp) = ours();
        let (g, gp) = theirs();
        println!(
            "| {name} | {t:.1} | {g:.1} | {:.2} | {tp:.1} | {gp:.1} |",
            t / g
        );
        capacities.push((name, cap()));
    }
    println!();
    println!("keys the default budget (32 MiB) holds at most");
    println!("| key | keys |");
    println!("|---|---|");
    for (name, keys) in capacities {
        println!("| {name} | {keys} |");
    }
}

fn ipv4(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(i.wrapping_mul(2_654_435_761))
}

fn api_key(i: u32) -> HeaderBytes {
    HeaderBytes::from(format!("sk_live_{i:016}").as_str())
}

/// The most keys of type `K` a store with the default budget holds at once.
fn capacity<K: Hash + Eq + Clone + Send + Sync + 'static>() -> usize {
    MemoryStore::<K>::new(Limit::token_bucket(Quota::per_hour(1).unwrap()).unwrap()).max_keys()
}

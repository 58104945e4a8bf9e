//! The Redis store (feature `redis`): one limit shared by every instance.
//!
//! [`RedisStore`] decides each request with one Lua script on Redis (`EVALSHA`, reloaded
//! after `NOSCRIPT`), reading, deciding and writing atomically on the server with the
//! server's clock, so instances with drifting clocks agree. It makes exactly the decisions
//! of the in-memory store (same outcome, wait, retry-after, remaining, reset and next
//! times) for every algorithm and for policies of several limits.
//!
//! ```no_run
//! use std::time::Duration;
//! use tollgate::store::{FailurePolicy, RedisConnection, RedisStore};
//! use tollgate::{Limit, Policy, Quota};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = Policy::new(Limit::token_bucket(Quota::per_second(100)?.with_burst(200)?)?);
//! let store = RedisStore::builder(policy)
//!     .namespace("myapp")
//!     .deadline(Duration::from_millis(20))
//!     .failure_policy(FailurePolicy::LocalFallback { share: 0.5 }) // 2 instances
//!     .build(RedisConnection::connect("redis://127.0.0.1:6379").await?)?;
//! let decision = store.check("203.0.113.7", 1).await?;
//! println!("{:?} from {:?}", decision.outcome(), decision.source());
//! # Ok(()) }
//! ```
//!
//! # Keys
//!
//! One client's state for one policy is ONE Redis key, holding every limit's state as
//! integers packed as little-endian doubles (8 bytes each; Lua's `struct` library, which
//! Redis bundles), so one call is atomic and slot-safe in a cluster:
//! `{namespace}:v3:{policy fingerprint, 16 hex digits}:{#sha1}`. The key name shows
//! neither an API key nor a client address: the material in braces is `#` and the SHA-1
//! (hex) of the key's [`KeyBytes`](crate::store::KeyBytes). SHA-1 is `sha1_smol`, which
//! redis-rs already uses for script hashes; a second preimage, the only attack that would
//! let one client share another's state, remains out of reach for it. The digest is not
//! keyed, so whoever can read key names can test a guess (an IPv4 address is quickly
//! enumerated); API keys and tokens, being long random strings, cannot be guessed that
//! way. [`RedisStoreBuilder::readable_keys`] writes short printable keys as they are, for
//! debugging. The braces are the cluster hash tag (never a constant one, so clients spread
//! over the shards). Instances configured alike share state because the fingerprint
//! covers the limits' parameters, not their names. A value of another length, or holding
//! a number no script writes (negative, 2^53 or more, NaN), is read as no state.
//!
//! # Exactness, and the quotas refused
//!
//! Lua numbers are doubles: integers are exact below 2^53. Time is integer microseconds
//! from `TIME` (about 1.7e15), or from the store's clock when one is set
//! ([`RedisStoreBuilder::clock`], for tests and simulations); a GCRA state is stored as `(written_at_us, fill_ns)` (the
//! TAT is `written_at_us * 1000 + fill`), never as an absolute nanosecond TAT; windows
//! are computed in microseconds with every product bounded. So
//! [`RedisStoreBuilder::build`] refuses, with [`ConfigError::Store`](crate::ConfigError):
//!
//! - a GCRA-based limit whose `(burst + queue) * emission interval` exceeds 2^51 ns
//!   (about 26 days);
//! - a window (or a window offset) that is not a whole number of microseconds, or a
//!   window longer than 2^52 ns (about 52 days);
//! - a window whose `limit * window_in_microseconds` exceeds 2^51 (a day-long window up
//!   to about 26 000 units, an hour-long one up to about 625 000).
//!
//! The key expires when its state is fresh again (time to a full bucket or past the
//! window, rounded up to the millisecond): a missing key is exactly a fresh one, expiry
//! loses nothing. A refusal writes nothing and does not extend the expiry.
//!
//! # Failure handling
//!
//! Every call has a deadline (default 20 ms, [`RedisStoreBuilder::deadline`]). After 3
//! consecutive failures or timeouts a circuit breaker opens ([`RedisStore::breaker_state`]);
//! while open no call goes out, so no request pays the deadline; after the cooldown
//! (default 500 ms, on the store's clock) one probe call goes through and closes it on
//! success. Meanwhile the
//! [`FailurePolicy`] decides: admit ([`Source::FailOpen`](crate::decision::Source::FailOpen)),
//! refuse ([`Source::FailClosed`](crate::decision::Source::FailClosed)) or decide from a local
//! in-memory store at a share of each quota
//! ([`Source::Fallback`](crate::decision::Source::Fallback), the default, share 1.0). Breaker
//! transitions are `tracing` events (target `tollgate::redis`): `warn` when it opens,
//! `info` when it half-opens and closes; failed calls are `debug` events.
//!
//! # Batching
//!
//! Concurrent decisions through one connection are coalesced
//! ([`RedisStoreBuilder::batching`], on by default). A request that finds no call of its
//! [`RedisConnection`] in flight goes out at once, alone, as the plain script call (from
//! the caller's own task), so an idle caller never waits for a batch. Requests made while
//! a call is in flight queue; when it completes, the queue (up to 128 requests) goes out
//! as one `EVALSHA` of a batch script, which decides them in arrival order: each request
//! is decided exactly as its own call would be (the fast script's requests by the same
//! arithmetic inline, the others by the general script), and a later request sees an
//! earlier one's write (the same key twice included). Redis then parses one command,
//! enters Lua once, reads `TIME` once, reads every key with one `MGET` and writes each
//! key once at the end (its last state and TTL: time stands still inside a script, so
//! that is the state the separate calls would have left); each key and each list of
//! limits is sent once, and the requests travel in one binary argument. Once 32 requests
//! wait behind a batch call, they go out as a second call without waiting for it; at most
//! two calls are in flight, each one command, and a connection's commands reach Redis in
//! the order they are sent, so requests are decided in the order they were made.
//!
//! Deadline, breaker and failure policy stay per request: each caller waits under its
//! own deadline (a reply arriving after it is ignored, and a request whose caller gave up
//! before its batch left is not sent), each request counts in the breaker on its own, and
//! a failed batch call fails every request in it, each through the failure policy. As
//! the writes come last, a batch that fails on the server writes nothing.
//!
//! Stores built on clones of one [`RedisConnection`] share its batcher. A Redis Cluster
//! connection is never batched (one call's keys would have to share a slot): there every
//! decision stays one call. The figures are in `BENCHMARKS.md`.
//!
//! # Negative cache
//!
//! A refused key is remembered locally until its retry-after, counted from when the call
//! was sent (so never later than Redis's own answer); until then a request of the same or
//! a larger cost is refused locally ([`Source::NegativeCache`](crate::decision::Source::NegativeCache))
//! without a Redis call; a smaller cost still asks Redis. This is exact for every
//! algorithm: a refused request becomes admissible exactly at its retry-after (for
//! windows, at the window edge or when the sliding estimate has decayed enough), and other
//! instances' consumption can only push that later. The exception is a refund by another
//! instance, which can make a request admissible earlier than remembered here. The map is
//! bounded ([`RedisStoreBuilder::negative_cache`], default 10 000 keys): expired entries
//! are swept as it grows, and when it is full of live ones the entry ending soonest goes.
//!
//! # Local-first mode
//!
//! [`LocalFirstStore`] takes Redis off the request path: each instance decides from its
//! own state and reconciles with Redis in the background every 100-200 ms. See its docs
//! for the overshoot bound.
//!
//! # Choosing a mode
//!
//! - **Per request** ([`RedisStore`], batched by default): a limit shared by every instance
//!   is enforced exactly while Redis answers within the deadline. Choose it for limits
//!   that many instances hit at once (a global capacity, a tenant's total), with a
//!   [`FailurePolicy::LocalFallback`] at `1/N` so that an overloaded Redis degrades to
//!   about the limit instead of to no limit.
//! - **Local-first** ([`LocalFirstStore`]): microseconds per decision and Redis off the
//!   request path at any load, but a key that every instance serves can be admitted up
//!   to `N` times between syncs. Choose it for per-client limits, whose keys are many and
//!   each mostly small next to the limit.
//!
//! `benches/market_open.rs` replays seed 000's market-open herd against each (figures in
//! `BENCHMARKS.md`): past Redis's capacity, fail-open admitted 3.3x the global limit, a
//! fallback at `1/N` 1.4-1.5x, local-first 2.2x with 4 instances at any load.
//!
//! # Deployment caveat
//!
//! The fallback, the negative cache and local-first mode are per instance. With `N`
//! instances, a fallback share of `1.0` admits up to `N` times the limit while Redis is
//! down: set the share to `1 / N` when that matters.

mod batch;
mod builder;
mod failure;
mod local_first;
mod local_state;
mod local_sync;
mod negative;
mod script;
mod store;

pub use crate::redis::{BreakerState, RedisConnection};
pub use builder::RedisStoreBuilder;
pub use failure::FailurePolicy;
pub use local_first::LocalFirstStore;
pub use store::RedisStore;

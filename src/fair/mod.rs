//! Fair sharing with borrowing (HTB): a pool shared by keys that each have a guaranteed
//! rate and may borrow the pool's spare capacity up to a ceiling.
//!
//! A per-key limit gives every client a floor but caps it even when the server is idle.
//! Linux's hierarchical token bucket (`tc` HTB) lets a child class borrow its parent's
//! spare capacity; [`FairLimitLayer`] does the same for requests. A **pool** (a rate and a
//! burst) bounds what every key together is admitted; each key has a [`Share`]: a
//! **guaranteed** rate and a **ceiling**.
//!
//! ```
//! use axum::{routing::get, Router};
//! use tollgate::{fair::Share, key::HeaderKey, FairLimitLayer, Quota};
//!
//! // A pool of 20 per second (burst 20); each API key is guaranteed 4 per second and
//! // may borrow up to 16 per second while the pool has room.
//! let fair = FairLimitLayer::builder(
//!     HeaderKey::new("x-api-key")?,
//!     Quota::per_second(20)?.with_burst(20)?,
//! )
//! .share(Share::new(Quota::per_second(4)?, Quota::per_second(16)?)?)
//! .build()?;
//! let app: Router = Router::new()
//!     .route("/fair", get(|| async { "ok" }))
//!     .layer(fair);
//! # Ok::<(), tollgate::ConfigError>(())
//! ```
//!
//! # What each key gets
//!
//! Keys that asked in the current or the previous activity period (1 s by default,
//! [`FairLimitBuilder::activity_period`]) are *active*, refused ones included. A request
//! is admitted when all of these hold:
//!
//! 1. the key is under its **ceiling** (a token bucket of the ceiling's rate and burst);
//! 2. the **pool** has room (a token bucket of the pool's rate and burst): whatever the
//!    keys do, the pool never admits more than its rate plus its burst, guaranteed traffic
//!    included;
//! 3. the key is under its **share** of the pool, the pool's rate split among the active
//!    keys in proportion to their guaranteed rates (a token bucket of that rate and of the
//!    guaranteed quota's burst), *or* the pool keeps at least half its burst after this
//!    request (**borrowing** what nobody else is using).
//!
//! So:
//!
//! - **Alone**, a key gets the whole pool up to its ceiling (16 of the 20 per second
//!   above); a rested key sends up to half the pool's burst at once (10 above).
//! - **While the guaranteed rates of the active keys fit in the pool**, each key's share is
//!   at least its guaranteed rate: a key under its guaranteed rate is admitted whenever the
//!   pool has room, and the others' shares and the pool's half-burst reserve keep room
//!   for it. Two greedy keys get 10 per second each, five get 4.
//! - **When more keys are active than the pool can guarantee** (ten keys guaranteed 4 per
//!   second on a 20 per second pool), the pool's limit still holds: it is shared in
//!   proportion to the guarantees (2 per second each), and no key gets its full guarantee.
//! - Capacity a key leaves unused (below its share, or held back by its ceiling) is spare:
//!   the others borrow it while the pool stays above half its burst.
//!
//! Under contention the spare capacity goes to the keys in proportion to their guaranteed
//! rates (HTB's quantum). Measured in `tests/fair.rs` under a manual clock, with greedy
//! keys asking every 5 ms for 12 s (counted over the last 10), on memory and on Redis
//! (which decide alike, request by request): one key alone gets 16.0/s; 2 and 5 keys
//! guaranteed 4/s get 10.0/s and 4.0/s each; 10 get 2.0/s each; 6/s and 2/s guaranteed
//! get 15.0/s and 5.0/s; three 6/s and three 2/s keys on the 20/s pool get 5.0/s and
//! 1.6-1.7/s (5/3 is 16.7 requests in 10 s). Every key is within one request over the
//! 10 s of its proportional part, the tolerance the tests assert; the pool's total never
//! passes its rate plus its burst in any window. Each request costs one unit.
//!
//! A key counts as asking from its first request, and for one to two activity periods
//! after its last; what a key that stopped leaves is borrowed at once while the pool keeps
//! half its burst. Measured: of two greedy keys, one stopping takes the other from 10/s
//! to the pool's 20/s in the next second (its ceiling's banked burst of 16 lasting 4 s),
//! then to its ceiling's 16/s; the first asking again brings both back to 10/s at once.
//!
//! # Headers
//!
//! Every response of a limited request carries the key's share in `RateLimit-Policy`:
//! `"fair";q=4;w=1;borrow=12` (the guaranteed quota, and what the ceiling lets it
//! borrow on top in the same window, an extension parameter clients that do not know it
//! ignore), and `RateLimit: "fair";r=N;t=S`, where `r` is what the key could send at once
//! now. A refusal is `429` with the exact `Retry-After` (the time until every condition
//! above could hold again, rounded up to seconds) and a problem body; a gRPC call gets
//! `RESOURCE_EXHAUSTED` with a `RetryInfo`, as from [`RateLimitLayer`](crate::RateLimitLayer).
//!
//! Refusals are `INFO` events (target `tollgate`) with the layer's label, and decisions
//! are counted in `tollgate.rate_limit.requests` with `tollgate.policy` = `fair`
//! (feature `metrics`). A failed store follows [`FairLimitBuilder::on_store_error`]
//! (by default the request is let through without fields), logged at `WARN` for the
//! first failure of each second.
//!
//! # Stores
//!
//! [`MemoryFair`] (the default) holds the pool and the keys' states in this process;
//! `RedisFair` (feature `redis`) shares them across instances, deciding the pool and
//! the key in one Lua script call, atomically on the Redis server's clock, with the same
//! arithmetic as the memory store (the tests compare them decision by decision). Each
//! call has a deadline (default 20 ms), and after 3 failed or late calls in a row a
//! circuit breaker stops calling Redis for 500 ms (`RedisFairBuilder::breaker`), so that
//! during an outage requests get the layer's `OnStoreError` answer at once; one probe
//! call then closes it again if Redis answers.
//!
//! In a Redis Cluster a pool's key and its keys' states carry one hash tag (the pool's
//! label), so they live on one shard: a script may only touch keys of one slot, and the
//! pool must be decided with the key atomically. Every request of a pool therefore goes to
//! one node, which bounds the pool's decisions per second by that node's CPU (one script
//! call each, about as costly as a rate limit's); spread load by splitting traffic into
//! several pools (a label per tenant or region), not by adding nodes.

mod answer;
mod future;
mod layer;
mod memory;
#[cfg(feature = "redis")]
mod redis;
mod service;
mod share;
mod store;

pub use layer::{FairLimitBuilder, FairLimitLayer};
pub use memory::MemoryFair;
#[cfg(feature = "redis")]
pub use redis::{RedisFair, RedisFairBuilder};
pub use service::FairLimit;
pub use share::Share;
pub use store::FairStore;

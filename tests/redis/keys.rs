//! Redis key names are what the Redis guide (`src/docs/redis.md`) says they are: one key
//! per client and limit (store name) under every policy,
//! `<namespace>:<name>:rate:v4:{#<sha1>}`.
//!
//! Regression: the guide gave `{namespace}:v3:{policy fingerprint}:{#sha1}`, a layout the
//! store no longer writes.

use std::time::Duration;

use crate::support::redis::Target;
use tollgate::store::{RedisConnection, RedisStore};
use tollgate::{Limit, Policy, Quota};

const GUIDE: &str = include_str!("../../src/docs/redis.md");

/// The guide's example: the key `"203.0.113.7"` under the namespace `myapp`.
const HASHED: &str = "myapp:api:rate:v4:{#5fd4783125711c0c04c3fbff42b2cfdc8887a2df}";
const READABLE: &str = "myapp:api:rate:v4:{203.0.113.7}";

#[tokio::test]
async fn key_names_are_the_documented_ones_under_every_policy() {
    let Some(target) = Target::get() else { return };
    let conn = RedisConnection::connect(&target.url()).await.unwrap();
    assert!(
        GUIDE.contains(&format!("`{HASHED}`")),
        "the guide's example name"
    );
    assert!(
        GUIDE.contains(&format!("`{READABLE}`")),
        "the guide's readable name"
    );
    assert!(
        GUIDE.contains("`<namespace>:<name>:rate:v4:{#<sha1>}`"),
        "the guide's form"
    );

    let minute = Policy::new(Limit::token_bucket(Quota::per_minute(100).unwrap()).unwrap());
    let daily = "10/s, daily: 1000/day window".parse::<Policy>().unwrap();
    let ip = "203.0.113.7";
    for policy in [minute, daily] {
        let store = RedisStore::builder("api", policy.clone())
            .namespace("myapp")
            .deadline(Duration::from_secs(5))
            .build(conn.clone())
            .unwrap();
        assert_eq!(
            String::from_utf8(store.redis_key(ip)).unwrap(),
            HASHED,
            "{policy:?}"
        );
        // The name the state is written under is that one.
        assert!(store.check(ip, 1).await.unwrap().is_allowed());
        let mut con = redis::Client::open(target.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let names: Vec<String> = redis::cmd("KEYS")
            .arg("myapp:*")
            .query_async(&mut con)
            .await
            .unwrap();
        // The client's state under one name; the only other key is the fleet's
        // membership (the guide's other key), which the store registers in the
        // background, so it may not be there yet.
        let fleet = "myapp:fleet:{members}";
        let state: Vec<&String> = names.iter().filter(|n| n.as_str() != fleet).collect();
        assert_eq!(state, [HASHED], "{policy:?}");
        assert!(
            GUIDE.contains("`{namespace}:fleet:{members}`"),
            "the guide's fleet key"
        );

        let readable = RedisStore::builder("api", policy)
            .namespace("myapp")
            .readable_keys(true)
            .build(conn.clone())
            .unwrap();
        assert_eq!(String::from_utf8(readable.redis_key(ip)).unwrap(), READABLE);
    }
}

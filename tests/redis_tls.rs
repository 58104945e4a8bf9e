//! `rediss://` without a TLS feature of redis-rs: `connect` refuses the URL with an error
//! that names the missing feature (the Redis guide's "Connections" section says which
//! features to enable), never a panic and never a plain-text connection.
#![cfg(feature = "redis")]

use tollgate::store::RedisConnection;

#[tokio::test]
async fn a_tls_url_without_a_tls_feature_is_a_clear_error() {
    for url in [
        "rediss://127.0.0.1:6380/",
        "rediss://:secret@127.0.0.1:6380/0#insecure",
    ] {
        let err = RedisConnection::connect(url).await.unwrap_err().to_string();
        assert!(
            err.contains("can't connect with TLS, the feature is not enabled"),
            "{url}: {err}"
        );
    }
    let err = RedisConnection::connect_cluster(["rediss://127.0.0.1:7000/"])
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("TLS"), "{err}");
}

//! TLS to Redis, for real: a server and a Sentinel group speaking only TLS on the ports the
//! client uses, with certificates the test makes (a CA and a server certificate for
//! `localhost` and `127.0.0.1`), reached through redis-rs's rustls feature as the Redis
//! guide tells apps to enable it. The client verifies the server against the test's CA
//! (given to rustls's native roots through `SSL_CERT_FILE`).

use std::time::{Duration, Instant};

use crate::support;
use crate::support::redis::{RedisServer, SentinelGroup, TlsFiles};
use tollgate::decision::Source;
use tollgate::store::{RedisConnection, RedisStore};
use tollgate::{Limit, Quota};

/// The CA the client trusts, and rustls's crypto provider, once per process.
fn trust(files: &TlsFiles) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let ca = files.path("ca.crt");
    ONCE.call_once(|| {
        std::env::set_var("SSL_CERT_FILE", ca);
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Tests in this binary share one CA (rustls reads the roots once).
static FILES: std::sync::OnceLock<Option<TlsFiles>> = std::sync::OnceLock::new();
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn files() -> Option<&'static TlsFiles> {
    let f = FILES.get_or_init(TlsFiles::generate).as_ref()?;
    trust(f);
    Some(f)
}

fn limit() -> Limit {
    Limit::token_bucket(Quota::per_second(5).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decides_over_tls() {
    let _serial = SERIAL.lock().await;
    let Some(files) = files() else { return };
    let tls_port = support::redis::port();
    let mut args = files.args(tls_port);
    // Also on 127.0.0.2, an address the certificate does not name.
    args.extend(["--bind".into(), "127.0.0.1".into(), "127.0.0.2".into()]);
    let Some(server) =
        RedisServer::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>())
    else {
        return;
    };
    let conn = RedisConnection::connect(&format!("rediss://localhost:{tls_port}/0"))
        .await
        .unwrap();
    let store = RedisStore::builder("tls", limit()).build(conn).unwrap();
    for n in 0..5 {
        let d = store.check("client", 1).await.unwrap();
        assert_eq!(d.source(), Source::Store);
        assert!(d.is_allowed(), "request {n}");
    }
    assert!(!store.check("client", 1).await.unwrap().is_allowed());
    // The state is on the server, written over TLS.
    assert!(server.cli(&["DBSIZE"]).trim() != "0");
    // A certificate the client does not trust is refused, never used in the clear.
    let untrusted = RedisConnection::connect(&format!("rediss://127.0.0.2:{tls_port}/0")).await;
    let err = untrusted.expect_err("a name the certificate does not cover");
    assert!(err.to_string().contains("certificate"), "{err}");
}

/// Sentinel over TLS: the sentinels and the master speak TLS (`rediss+sentinel://`); a
/// failover finds the new master over TLS too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finds_the_master_through_sentinels_over_tls() {
    let _serial = SERIAL.lock().await;
    let Some(files) = files() else { return };
    let Some(mut group) = SentinelGroup::start(1000, Some(files)) else {
        return;
    };
    let conn = RedisConnection::connect(&group.url()).await.unwrap();
    let store = RedisStore::builder("tls", limit())
        .deadline(Duration::from_millis(50))
        .build(conn)
        .unwrap();
    assert_eq!(store.check("a", 1).await.unwrap().source(), Source::Store);
    let old = group.master_port();
    group.master.kill();
    let killed = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let d = store.check("b", 1).await.unwrap();
        if d.source() == Source::Store && group.master_port() != old {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "no decision from the new master over TLS"
        );
    }
    eprintln!(
        "sentinel over TLS: the new master decided {:?} after the kill",
        killed.elapsed()
    );
}

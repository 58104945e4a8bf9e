//! The tollgate demo: one router, a policy per route, every response carrying the IETF
//! `RateLimit` / `RateLimit-Policy` fields, refusals with `Retry-After` and a problem+json
//! body.
//!
//! ```sh
//! cargo run --example demo            # in-memory store, serves on 127.0.0.1:3000 (or $PORT)
//! # the same limits shared by every instance through Redis:
//! TOLLGATE_REDIS_URL=redis://127.0.0.1:6379 cargo run --example demo --features redis
//! # or through Sentinel, the master found by its name:
//! TOLLGATE_REDIS_URL=redis+sentinel://127.0.0.1:26379/mymaster cargo run --example demo --features redis
//! ```
//!
//! - `GET /token`:   5 per second, burst 10, per client IP (token bucket)
//! - `GET /strict`:  5 per second, no burst, per client IP (strict leaky meter)
//! - `GET /queue`:   5 per second, queue of 10, per client IP (delayed, excess refused);
//!   a request whose slot would come after its deadline (`grpc-timeout`, or Envoy's
//!   `x-envoy-expected-rq-timeout-ms`) is refused at once, and its slot goes to the next
//! - `GET /api`:     5 per second, burst 5, per `x-api-key` header (a request without
//!   the header is refused with `400`, as every layer refuses a request without a key by
//!   default)
//! - `GET /plan`:    plans per `x-api-key`, in one layer: keys starting with `pro_` get 100
//!   per minute, other keys 10 per minute, and every key also 1 000 per UTC day; a
//!   request without a key is refused with `401` (problem+json, `WWW-Authenticate`)
//! - `GET /shadow`:  5 per second per client IP in shadow: never refused, but a request
//!   the limit would have refused carries a `tollgate-shadow` header, and the handler says
//!   so (it reads the `Decision` from the request's extensions)
//! - `POST /login`:  a form (`user=...&password=...`) or a JSON body
//!   `{"user": "...", "password": "..."}`; the password `correct horse` answers 200, any
//!   other 401. At most 5 failures in any 15 minutes per user (the key is read from the
//!   body, either kind); successes are not counted; a body without `user` gets `400`
//! - `POST /admin/unban/{user}`: forgets a user's failed logins (an admin route: put it
//!   behind your own authentication)
//! - `GET /export`:  at most 2 requests in flight per client IP (the handler takes
//!   500 ms); a third at once is refused with `429` and
//!   `RateLimit-Policy: "export";q=2;qu="concurrent-requests"`
//! - `GET /fair`:    fair sharing per `x-api-key`: a pool of 20 per second (burst 20);
//!   each key is guaranteed 4 per second and may borrow up to 16 per second while the
//!   pool has room (alone a key gets 16/s; two busy keys 10/s each; ten 2/s each)
//! - `GET /health`:  never limited, no rate-limit fields
//! - every route: requests from `127.0.0.66` are denied (`403`), and each client IP gets
//!   at most 100 per second, burst 200, across the whole site (the `edge` layer)
//! - every connection: the server listens behind connection limits (`tollgate::listener`),
//!   its defaults and a rate: decided at accept before any byte is read, at most 64
//!   connections open per client IP and three quarters of the descriptor limit in all,
//!   50 new connections per second per IP (burst 100); a head within 10 s, heads and
//!   bodies at 240 bytes a second or more, 75 s idle between requests; when full, the
//!   connection that has made the least progress gives way
//! - `GET /metrics`: every layer's decisions (labelled `token`, `strict`, `queue`, `api`,
//!   `plan`, `shadow`, `login`, `fair`, `edge`) in the Prometheus text format (feature `metrics`,
//!   a default)
//!
//! ```sh
//! curl -i -H 'x-api-key: free_demo' http://127.0.0.1:3000/plan   # "daily" and "free" limits
//! curl -i -H 'x-api-key: pro_demo' http://127.0.0.1:3000/plan    # "daily" and "pro" limits
//! curl -i http://127.0.0.1:3000/plan                             # 401
//! for i in $(seq 8); do curl -s -w '%{http_code} %header{tollgate-shadow}\n' -o /dev/null http://127.0.0.1:3000/shadow; done
//! curl -s http://127.0.0.1:3000/metrics | grep tollgate_rate_limit_requests
//! for i in $(seq 7); do curl -s -o /dev/null -w '%{http_code} ' -d 'user=eve&password=guess' http://127.0.0.1:3000/login; done
//! curl -X POST http://127.0.0.1:3000/admin/unban/eve
//! curl -i --interface 127.0.0.66 http://127.0.0.1:3000/token   # 403 (Linux: all of 127/8 is local)
//! ```

use std::{collections::HashMap, hash::Hash, net::SocketAddr, sync::Arc};

use axum::extract::{FromRequest, Path, Request};
use axum::http::{header::CONTENT_TYPE, header::WWW_AUTHENTICATE, HeaderValue, StatusCode};
use axum::middleware;
use axum::response::Response;
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::Extension;
use axum::Router;
use axum::{Form, Json};
use tollgate::fair::{FairStore, MemoryFair, Share};
use tollgate::inflight::{InFlightStore, MemoryInFlight};
use tollgate::key::KeyBytes;
use tollgate::key::MissingKey;
use tollgate::key::{BodyField, BodyFieldLayer, HeaderBytes, HeaderKey, PeerIp, RequestHead};
use tollgate::listener::ConnectionLimits;
use tollgate::policy::IntoPolicy;
use tollgate::store::MemoryStore;
use tollgate::store::Store;
use tollgate::ConfigError;
use tollgate::Decision;
use tollgate::FairLimitLayer;
use tollgate::InFlightLimitLayer;
use tollgate::Limit;
use tollgate::Quota;
use tollgate::RateLimitLayer;

/// Where limits live: this process, or Redis when `TOLLGATE_REDIS_URL` is set.
#[derive(Clone)]
struct Stores {
    #[cfg(feature = "redis")]
    redis: Option<tollgate::store::RedisConnection>,
}

impl Stores {
    async fn from_env() -> Result<Self, Box<dyn std::error::Error>> {
        #[cfg(feature = "redis")]
        if let Ok(url) = std::env::var("TOLLGATE_REDIS_URL") {
            println!("store: Redis at {url}");
            let conn = tollgate::store::RedisConnection::connect(&url).await?;
            return Ok(Stores { redis: Some(conn) });
        }
        if std::env::var("TOLLGATE_REDIS_URL").is_ok() {
            return Err("TOLLGATE_REDIS_URL is set: run with --features redis".into());
        }
        println!("store: in memory");
        Ok(Stores {
            #[cfg(feature = "redis")]
            redis: None,
        })
    }

    /// Where the fair-sharing pool `name` lives: this process, or Redis.
    fn fair<K>(&self, name: &str) -> Result<Arc<dyn FairStore<K>>, ConfigError>
    where
        K: Hash + Eq + Clone + Send + Sync + KeyBytes + 'static,
    {
        #[cfg(feature = "redis")]
        if let Some(conn) = &self.redis {
            let store = tollgate::fair::RedisFair::builder(name)
                .namespace("tollgate-demo")
                .build(conn.clone())?;
            return Ok(Arc::new(store));
        }
        Ok(Arc::new(MemoryFair::new()))
    }

    /// Where the in-flight limit `name` counts its requests: this process, or leases in
    /// Redis.
    fn in_flight<K>(&self, name: &str) -> Result<Arc<dyn InFlightStore<K>>, ConfigError>
    where
        K: Hash + Eq + Clone + Send + Sync + KeyBytes + 'static,
    {
        #[cfg(feature = "redis")]
        if let Some(conn) = &self.redis {
            let store = tollgate::inflight::RedisInFlight::builder(name)
                .namespace("tollgate-demo")
                .build(conn.clone())?;
            return Ok(Arc::new(store));
        }
        Ok(Arc::new(MemoryInFlight::new()))
    }

    /// A store for the layer labelled `label`, whose own policy is `policy` (what a layer
    /// given no limit of its own applies). Each layer gets its own store, and on Redis its
    /// own name: stores share a key's state only under one name, so layers keyed alike
    /// (the per-IP routes; `/api` and `/plan` by `x-api-key`) stay apart.
    fn store<K>(
        &self,
        label: &str,
        policy: impl IntoPolicy,
    ) -> Result<Arc<dyn Store<Option<K>>>, ConfigError>
    where
        K: Hash + Eq + Clone + Send + Sync + KeyBytes + 'static,
    {
        let policy = policy.into_policy()?;
        #[cfg(feature = "redis")]
        if let Some(conn) = &self.redis {
            let store = tollgate::store::RedisStore::builder(label, policy)
                .namespace("tollgate-demo")
                .build(conn.clone())?;
            return Ok(Arc::new(store));
        }
        // On tokio's clock, named after its layer in metrics.
        Ok(Arc::new(MemoryStore::new(policy).with_label(label)))
    }
}

/// A slow export: 500 ms of work.
async fn export() -> &'static str {
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    "export: done\n"
}

/// A `401` must carry `WWW-Authenticate` (RFC 9110); the limiter's refusal of a request
/// without a key has none, so `/plan` adds its challenge around the limiter.
async fn challenge(mut res: Response) -> Response {
    if res.status() == StatusCode::UNAUTHORIZED {
        res.headers_mut()
            .entry(WWW_AUTHENTICATE)
            .or_insert(HeaderValue::from_static("ApiKey header=\"x-api-key\""));
    }
    res
}

/// Reads the decision the `/shadow` layer puts into the extensions (`expose_decision`).
async fn shadow(Extension(d): Extension<Decision>) -> &'static str {
    if d.shadowed() {
        "shadow: ok, but the shadow limit (5/s) would have refused this request\n"
    } else {
        "shadow: ok, within the shadow limit (5/s)\n"
    }
}

/// `POST /login` with a form, `user=...&password=...`, or a JSON body,
/// `{"user": "...", "password": "..."}`.
async fn login(req: Request) -> (StatusCode, &'static str) {
    let form = req.headers().get(CONTENT_TYPE).is_some_and(|t| {
        t.as_bytes()
            .starts_with(b"application/x-www-form-urlencoded")
    });
    let password = if form {
        Form::<HashMap<String, String>>::from_request(req, &())
            .await
            .ok()
            .and_then(|Form(mut f)| f.remove("password"))
    } else {
        Json::<serde_json::Value>::from_request(req, &())
            .await
            .ok()
            .and_then(|Json(v)| v["password"].as_str().map(str::to_owned))
    };
    if password.as_deref() == Some("correct horse") {
        (StatusCode::OK, "login: welcome\n")
    } else {
        (StatusCode::UNAUTHORIZED, "login: wrong password\n")
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Metric handles are registered when a layer (or a store) is built: install the
    // recorder before anything else.
    #[cfg(feature = "metrics")]
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;

    let stores = Stores::from_env().await?;
    let five = Quota::per_second(5)?;
    let per_ip = |label: &str, limit: Limit| -> Result<_, ConfigError> {
        RateLimitLayer::builder()
            .key(PeerIp::new())
            .label(label)
            .build_with(stores.store(label, limit)?)
    };
    let token = per_ip("token", Limit::token_bucket(five.with_burst(10)?)?)?;
    let strict = per_ip("strict", Limit::leaky_meter(five)?)?;
    let queue = per_ip("queue", Limit::leaky_queue(five, 10)?)?;
    let api = RateLimitLayer::builder()
        .key(HeaderKey::new("x-api-key")?)
        .label("api")
        .build_with(stores.store("api", Limit::token_bucket(five.with_burst(5)?)?)?)?;

    // Plans: one layer, one state per key. The layer decides every request under the plan
    // `select` picks; the store's own policy (required to build one) is the fallback plan.
    let (free, pro, daily) = ("10/min", "100/min", "daily: 1000/day window");
    let plan = RateLimitLayer::builder()
        .key(HeaderKey::new("x-api-key")?)
        .named_policy("free", free) // the first is the fallback
        .named_policy("pro", pro)
        .policy(daily) // every plan's limit too
        .select(
            |_head: &RequestHead<'_>, key: Option<&HeaderBytes>| match key {
                Some(k) if k.starts_with(b"pro_") => "pro",
                _ => "free",
            },
        )
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
        .label("plan")
        .build_with(stores.store("plan", format!("{daily}, free: {free}"))?)?;

    // Shadow: decided and charged, never refusing; the store carries the policy.
    let shadow_limit = RateLimitLayer::builder()
        .key(PeerIp::new())
        .shadow_header("tollgate-shadow")
        .expose_decision(true)
        .label("shadow")
        .build_with(stores.store("shadow", "5/s shadow")?)?;

    // Failed logins: at most 5 in any 15 minutes per user (five tries given back one
    // every 15 minutes), the user read from the body (a form or JSON); a
    // request is charged when admitted and refunded unless its answer is a 401, so
    // concurrent guesses cannot overrun the limit.
    let failed_logins = RateLimitLayer::builder()
        .key(BodyField::key())
        .count_when(|res| res.status() == StatusCode::UNAUTHORIZED)
        .label("login")
        .build_with(stores.store("login", "1/15min burst 5")?)?;
    let unban = {
        let failed_logins = failed_logins.clone();
        move |Path(user): Path<String>| async move {
            match failed_logins.reset(BodyField::from(user.as_str())).await {
                Ok(()) => (StatusCode::OK, format!("{user}: failed logins forgotten\n")),
                Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
            }
        }
    };

    // Slow exports: at most 2 in flight per client IP.
    let exports = InFlightLimitLayer::builder(PeerIp::new(), 2)
        .label("export")
        .build_with(stores.in_flight("export")?)?;

    // Fair sharing per API key: a 20/s pool, each key guaranteed 4/s, up to 16/s.
    let fair = FairLimitLayer::builder(
        HeaderKey::new("x-api-key")?,
        Quota::per_second(20)?.with_burst(20)?,
    )
    .share(Share::new(Quota::per_second(4)?, Quota::per_second(16)?)?)
    .build_with(stores.fair("fair")?)?;

    // Every route: a deny list and a site-wide cap per client IP; health checks exempt.
    let edge = RateLimitLayer::builder()
        .key(PeerIp::new())
        .deny_ips(["127.0.0.66"])
        .skip(|head| head.uri().path() == "/health")
        .label("edge")
        .build_with(stores.store("edge", "100/s burst 200")?)?;

    let app = Router::new()
        .route(
            "/token",
            get(|| async { "token bucket: ok\n" }).layer(token),
        )
        .route(
            "/strict",
            get(|| async { "strict meter: ok\n" }).layer(strict),
        )
        .route("/queue", get(|| async { "queue: served\n" }).layer(queue))
        .route("/api", get(|| async { "api: ok\n" }).layer(api))
        .route(
            "/plan",
            get(|| async { "plan: ok\n" })
                .layer(plan)
                .layer(middleware::map_response(challenge)), // added last: wraps the limiter
        )
        .route("/shadow", get(shadow).layer(shadow_limit))
        .route(
            "/login",
            post(login).layer(
                tower::ServiceBuilder::new()
                    .layer(BodyFieldLayer::new("user")) // reads the body first
                    .layer(failed_logins),
            ),
        )
        .route("/admin/unban/{user}", post(unban))
        .route("/export", get(export).layer(exports))
        .route("/fair", get(|| async { "fair: ok\n" }).layer(fair))
        .route("/health", get(|| async { "healthy\n" }));
    #[cfg(feature = "metrics")]
    let app = app.route(
        "/metrics",
        get(move || {
            let prometheus = prometheus.clone();
            async move {
                prometheus.run_upkeep();
                (
                    [("content-type", "text/plain; version=0.0.4")],
                    prometheus.render(),
                )
            }
        }),
    );

    let app = app.layer(edge);

    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    // In front of everything, before TLS or HTTP: the listener's defaults (slow and idle
    // clients closed, caps per IP and in all, the stalest connection giving way when
    // full), and a rate of new connections per IP.
    let (new_per_second, burst) = (50, 100);
    let listener = ConnectionLimits::new()
        .limit(Limit::token_bucket(
            Quota::per_second(new_per_second)?.with_burst(burst)?,
        )?)
        .bind(("127.0.0.1", port))
        .await?;
    let addr = axum::serve::Listener::local_addr(&listener)?;
    let total = listener
        .max_connections()
        .map_or("no cap".to_owned(), |n| n.to_string());
    println!("tollgate demo listening on http://{addr}");
    println!(
        "connections: at most 64 open per client IP and {total} in all, {new_per_second} new per second per IP (burst {burst}); heads within 10 s, heads and bodies at 240 B/s or more, 75 s idle; the stalest gives way when full"
    );
    println!();
    println!("Try:");
    println!("  for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}} ' http://{addr}/token; done; echo");
    println!(
        "  curl -i http://{addr}/strict; curl -i http://{addr}/strict   # the second one is 429"
    );
    println!("  for i in $(seq 12); do curl -s -w ' %{{time_total}}s\\n' http://{addr}/queue & done; wait");
    println!(
        "  # deadlines: slots 200 ms apart; those past the caller's 300 ms are refused at once:"
    );
    println!("  for i in $(seq 4); do curl -s -o /dev/null -w '%{{http_code}} %{{time_total}}s\\n' -H 'x-envoy-expected-rq-timeout-ms: 300' http://{addr}/queue & done; wait");
    println!("  curl -i -H 'grpc-timeout: 100m' http://{addr}/queue; curl -i -H 'grpc-timeout: 100m' http://{addr}/queue   # the second: 429");
    println!("  curl -i -H 'x-api-key: demo' http://{addr}/api");
    println!(
        "  # plans: a free key gets 10/min (the 11th is 429), a pro_ key 100/min, both 1000/day:"
    );
    println!("  for i in $(seq 11); do curl -s -o /dev/null -w '%{{http_code}} ' -H 'x-api-key: free_demo' http://{addr}/plan; done; echo");
    println!("  curl -i -H 'x-api-key: free_demo' http://{addr}/plan   # RateLimit-Policy names \"daily\" and \"free\"");
    println!("  for i in $(seq 11); do curl -s -o /dev/null -w '%{{http_code}} ' -H 'x-api-key: pro_demo' http://{addr}/plan; done; echo");
    println!("  curl -i http://{addr}/plan   # no key: 401 with a problem+json body");
    println!("  # shadow: all 200, the last 3 carry the tollgate-shadow header:");
    println!("  for i in $(seq 8); do curl -s -o /dev/null -w '%{{http_code}} %header{{tollgate-shadow}}\\n' http://{addr}/shadow; done");
    if cfg!(feature = "metrics") {
        println!("  curl http://{addr}/metrics   # tollgate_rate_limit_requests by layer, policy and result");
    }
    println!("  # failed logins: 401 x5, then 429 (successes are not counted):");
    println!("  for i in $(seq 7); do curl -s -o /dev/null -w '%{{http_code}} ' -d '{{\"user\":\"eve\",\"password\":\"guess\"}}' -H 'content-type: application/json' http://{addr}/login; done; echo");
    println!("  curl -X POST http://{addr}/admin/unban/eve");
    println!("  # at most 2 exports in flight per client: 200 200 429");
    println!("  for i in 1 2 3; do curl -s -o /dev/null -w '%{{http_code}}\\n' http://{addr}/export & sleep 0.05; done; wait");
    println!(
        "  # fair sharing: one key alone gets 16/s; RateLimit-Policy: \"fair\";q=16;w=1;borrow=12"
    );
    println!("  curl -i -H 'x-api-key: a' http://{addr}/fair");
    println!("  curl -i http://{addr}/health   # never limited, no rate-limit fields");
    println!("Requests from 127.0.0.66 are denied with 403 on every route (a deny list): curl -i --interface 127.0.0.66 http://{addr}/token");
    println!();
    println!("Every response carries RateLimit-Policy and RateLimit; refusals add Retry-After and a problem+json body.");
    // `tap_io` lets axum hand the peer address to `ConnectInfo` (which `PeerIp` reads).
    axum::serve(
        listener.tap_io(|_| ()),
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

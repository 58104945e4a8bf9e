//! Shared helpers for the integration tests: each test binary (`tests/<area>/main.rs`)
//! includes this module once, as `support`.
#![allow(dead_code, unreachable_pub)]

#[cfg(feature = "redis")]
pub mod equiv;
pub mod redis;
pub mod sf;

use std::net::SocketAddr;

use axum::Router;

/// Serves `app` on a fresh loopback port with `ConnectInfo`, returning its address.
/// Without tollgate's `axum` feature, `PeerIp` cannot read `ConnectInfo`: the peer address
/// is then also put into the extensions as a plain `SocketAddr`, which it reads.
pub async fn serve(app: Router) -> SocketAddr {
    #[cfg(not(feature = "axum"))]
    let app = app.layer(axum::middleware::map_request(
        |mut req: axum::extract::Request| async move {
            let info = req
                .extensions()
                .get::<axum::extract::ConnectInfo<SocketAddr>>()
                .copied();
            if let Some(axum::extract::ConnectInfo(peer)) = info {
                req.extensions_mut().insert(peer);
            }
            req
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// The status `app` answers a `GET path` with, sending the headers `headers`.
pub async fn status_of(app: &Router, path: &str, headers: &[(&str, &str)]) -> http::StatusCode {
    use tower::ServiceExt;
    let mut req = http::Request::get(path);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = app
        .clone()
        .oneshot(req.body(axum::body::Body::empty()).unwrap())
        .await
        .unwrap();
    resp.status()
}

/// A plain HTTP client.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder().build().unwrap()
}

/// One response's status, headers and body: from `get` (a request over a socket, the
/// status as a number) or `send` (a request through a router in process, the status as a
/// `StatusCode`).
#[derive(Debug)]
pub struct Got<Status = u16> {
    pub status: Status,
    pub headers: http::HeaderMap,
    pub body: String,
}

impl<Status> Got<Status> {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

/// `GET url` with `headers`, over a socket.
pub async fn get(client: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> Got {
    let mut req = client.get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.text().await.unwrap();
    Got {
        status,
        headers,
        body,
    }
}

/// `req` through `app`, in process.
pub async fn send(app: &Router, req: http::Request<axum::body::Body>) -> Got<http::StatusCode> {
    use tower::ServiceExt;
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let body = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .unwrap();
    Got {
        status,
        headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

/// `tracing` events of this thread, as `LEVEL target: message field=value ...` lines.
#[derive(Clone, Default)]
pub struct Events(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

thread_local! {
    static CAPTURING: std::cell::RefCell<Option<Events>> = const { std::cell::RefCell::new(None) };
}

/// Restores the thread's previous capture when dropped.
pub struct CaptureGuard(Option<Events>);

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        let previous = self.0.take();
        CAPTURING.with(|c| *c.borrow_mut() = previous);
    }
}

/// The process-wide subscriber: it is interested in every callsite and hands each event
/// to the capture of the thread it happens on, if any. A thread-local default alone is
/// not enough: a callsite first hit by another test, on another thread, while that
/// default was being installed, can cache "never" for good, and the event is lost.
struct ToCapturingThread;

impl tracing::Subscriber for ToCapturingThread {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::always()
    }
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        CAPTURING.with(|c| {
            if let Some(events) = c.borrow().as_ref() {
                events.record(event);
            }
        });
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

impl Events {
    /// Records this thread's events until the guard is dropped.
    pub fn capture() -> (Self, CaptureGuard) {
        static INSTALL: std::sync::Once = std::sync::Once::new();
        INSTALL.call_once(|| {
            // Fails only if another global subscriber is set, which these tests never do.
            tracing::subscriber::set_global_default(ToCapturingThread)
                .expect("no other global subscriber in the tests");
        });
        // A callsite registered while the subscriber above was being installed may hold
        // "never"; every registration after it asks that subscriber, which says "always".
        tracing::callsite::rebuild_interest_cache();
        let events = Events::default();
        let previous = CAPTURING.with(|c| c.borrow_mut().replace(events.clone()));
        (events, CaptureGuard(previous))
    }

    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// The lines at `level` ("WARN", "INFO", ...).
    pub fn at(&self, level: &str) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|l| l.starts_with(level))
            .collect()
    }
}

struct Line(String);

impl tracing::field::Visit for Line {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        if field.name() == "message" {
            let _ = write!(self.0, " {value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

impl Events {
    /// Records one event as a line: level, target, message and fields.
    fn record(&self, event: &tracing::Event<'_>) {
        let meta = event.metadata();
        let mut line = Line(format!("{} {}:", meta.level(), meta.target()));
        event.record(&mut line);
        self.0.lock().unwrap().push(line.0);
    }
}

/// A store whose every call fails at once (a custom store's backend being down), for a
/// layer of `1/s` keyed by `Global` or `MissingKey::Shared`.
pub struct FailingStore;

impl tollgate::store::Store<Option<()>> for FailingStore {
    fn default_policy(&self) -> Option<tollgate::Policy> {
        Some("1/s".parse().unwrap())
    }
    fn decide(
        &self,
        _: &Option<()>,
        _: &tollgate::Policy,
        _: u64,
    ) -> tollgate::store::StoreFuture<tollgate::Decision> {
        tollgate::store::StoreFuture::ready(Err(down()))
    }
    fn preview(
        &self,
        key: &Option<()>,
        policy: &tollgate::Policy,
        cost: u64,
    ) -> tollgate::store::StoreFuture<tollgate::Decision> {
        self.decide(key, policy, cost)
    }
    fn refund(&self, _: &Option<()>, _: &tollgate::Policy, _: u64) {}
    fn settle(
        &self,
        _: &Option<()>,
        _: &tollgate::Policy,
        _: u64,
        _: u64,
    ) -> tollgate::store::StoreFuture<()> {
        tollgate::store::StoreFuture::ready(Err(down()))
    }
    fn reset(&self, _: &Option<()>) -> tollgate::store::StoreFuture<()> {
        tollgate::store::StoreFuture::ready(Err(down()))
    }
    fn ban(
        &self,
        _: &Option<()>,
        _: &tollgate::Policy,
        _: std::time::Duration,
    ) -> tollgate::store::StoreFuture<()> {
        tollgate::store::StoreFuture::ready(Err(down()))
    }
}

fn down() -> tollgate::error::StoreError {
    tollgate::error::StoreError::backend("connection refused")
}

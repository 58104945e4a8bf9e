//! Shared helpers for the integration tests.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;

use axum::Router;

/// Serves `app` on a fresh loopback port with `ConnectInfo`, returning its address.
pub async fn serve(app: Router) -> SocketAddr {
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

/// A plain HTTP client.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder().build().unwrap()
}

/// One response's status, named headers and body.
#[derive(Debug)]
pub struct Got {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
}

impl Got {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

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

/// `tracing` events of this thread, as `LEVEL target: message field=value ...` lines.
#[derive(Clone, Default)]
pub struct Events(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Events {
    /// Records this thread's events until the guard is dropped.
    pub fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let events = Events::default();
        let guard = tracing::subscriber::set_default(events.clone());
        // A callsite first hit by a test without a subscriber, on another thread, may
        // have cached "never"; recompute every callsite's interest with this one live.
        tracing::callsite::rebuild_interest_cache();
        (events, guard)
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

impl tracing::Subscriber for Events {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let meta = event.metadata();
        let mut line = Line(format!("{} {}:", meta.level(), meta.target()));
        event.record(&mut line);
        self.0.lock().unwrap().push(line.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

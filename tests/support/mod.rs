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

//! Connection limits at accept (`tollgate::listener`): a burst of new connections from one
//! address is cut at its rate while another address connects; open connections are capped
//! per address (trusted addresses exempt) and in total; when full, the connection that
//! has made the least progress gives way; a connection whose request head is late or
//! slow, whose body is slow, or that idles between requests is closed. Real sockets on
//! loopback: all of 127/8 is local on Linux, so each test's clients come from addresses
//! of their own. Floods under a descriptor limit: `flood.rs`.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use axum::{routing::get, Router};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tollgate::listener::{ConnectionLimits, LimitedListener, WhenFull};
use tollgate::{Limit, Quota};

const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n";

/// Serves on `listener` a router answering `GET /` with `ok`, `POST /` with its body's
/// length, and `GET /slow` with `ok` after a second; returns its address.
fn serve(listener: LimitedListener) -> SocketAddr {
    let addr = axum::serve::Listener::local_addr(&listener).unwrap();
    let app = Router::new()
        .route(
            "/",
            get(|| async { "ok" }).post(|body: String| async move { body.len().to_string() }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                "ok"
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn limited(limits: ConnectionLimits) -> SocketAddr {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve(limits.build(tcp).unwrap())
}

/// A connection to `to` from the loopback address `from`.
async fn connect(from: &str, to: SocketAddr) -> io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from.parse::<IpAddr>().unwrap(), 0))?;
    socket.connect(to).await
}

/// Sends a request on the connection `s`: whether an answer `200` came back (`false`: the
/// connection was reset or closed without one, as a refused connection is; the reset can
/// come before `connect` returns).
async fn answered(s: io::Result<TcpStream>) -> bool {
    let Ok(mut s) = s else { return false };
    let _ = s.write_all(REQUEST).await;
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "neither answered nor closed in 5 s");
    got.starts_with(b"HTTP/1.1 200")
}

/// The case: a burst of new connections from one address is cut at its limit (5,
/// then refused), while another address connects. On a plain `TcpListener` all ten
/// were served.
#[tokio::test]
async fn a_burst_of_new_connections_is_cut_at_its_rate_while_another_address_connects() {
    let to = limited(
        ConnectionLimits::new().limit(Limit::token_bucket(Quota::per_hour(5).unwrap()).unwrap()),
    )
    .await;
    let mut burst = Vec::new();
    for _ in 0..10 {
        burst.push(connect("127.0.0.1", to).await);
    }
    let other = connect("127.0.0.2", to).await;
    let mut served = 0;
    for s in burst {
        served += usize::from(answered(s).await);
    }
    assert_eq!(served, 5, "the burst is cut at the limit");
    assert!(answered(other).await, "another address is served");
    assert!(!answered(connect("127.0.0.1", to).await).await);
}

/// Open connections are capped per address, an exempt address is not, and the total
/// holds for every address; a closed connection gives its place back.
#[tokio::test]
async fn open_connections_are_capped_per_address_and_in_total() {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listener = ConnectionLimits::new()
        .max_per_address(2)
        .max_total(5)
        .when_full(WhenFull::Refuse)
        .exempt(["127.0.0.5/32"])
        .build(tcp)
        .unwrap();
    let to = serve(listener);
    // Connections that say nothing yet, each holding its place.
    let a1 = connect("127.0.0.3", to).await.unwrap();
    let a2 = connect("127.0.0.3", to).await;
    let a3 = connect("127.0.0.3", to).await;
    assert!(!answered(a3).await, "a third from one address is refused");
    let mut exempt = Vec::new();
    for _ in 0..3 {
        exempt.push(connect("127.0.0.5", to).await.unwrap());
    }
    // Five open: the total is reached, for an exempt address too.
    assert!(!answered(connect("127.0.0.4", to).await).await);
    assert!(!answered(connect("127.0.0.5", to).await).await);
    drop(exempt);
    drop(a1);
    // The closes reach the server's connection tasks shortly.
    let mut back = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if answered(connect("127.0.0.4", to).await).await {
            back = true;
            break;
        }
    }
    assert!(back, "closed connections gave their places back");
    assert!(answered(a2).await);
}

/// A connection that trickles its head is closed at the deadline; one whose head came
/// in time is served however slowly it is read after. On a plain listener the trickling
/// connection stayed open.
#[tokio::test]
async fn a_late_head_is_closed_at_the_deadline() {
    let deadline = Duration::from_millis(300);
    let to = limited(ConnectionLimits::new().head_timeout(deadline)).await;
    let mut slow = connect("127.0.0.6", to).await.unwrap();
    let start = Instant::now();
    slow.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let closed = async {
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if slow.write_all(b"x").await.is_err() {
                return;
            }
            let mut b = [0u8; 1];
            let read = tokio::time::timeout(Duration::from_millis(1), slow.read(&mut b)).await;
            if let Ok(Ok(0) | Err(_)) = read {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), closed)
        .await
        .expect("the trickling connection was closed");
    let took = start.elapsed();
    assert!(took >= deadline, "closed at {took:?}, before the deadline");

    let mut prompt = connect("127.0.0.6", to).await.unwrap();
    prompt.write_all(REQUEST).await.unwrap();
    tokio::time::sleep(deadline * 2).await;
    let mut got = Vec::new();
    prompt.read_to_end(&mut got).await.unwrap();
    assert!(got.starts_with(b"HTTP/1.1 200"));
}

/// Reads until the server closes the connection (at most 5 s): how long that took from
/// `since`.
async fn closed_after(s: &mut TcpStream, since: Instant) -> Duration {
    let mut buf = [0u8; 1024];
    let read = async { while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {} };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("the connection was not closed in 5 s");
    since.elapsed()
}

/// Reads one response to a kept-alive request (its head, then `content-length` bytes):
/// its status line.
async fn response(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if got.len() >= end + 4 + len {
                return head.lines().next().unwrap().to_owned();
            }
        }
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before a whole response");
        got.extend_from_slice(&buf[..n]);
    }
}

/// Regression: empty lines before a request line (`\r\n\r\n`, `\n\n`) were taken for a
/// whole head, which switched the head deadline off: the connection was held for good.
/// They are not a head (RFC 9112 §2.2): the deadline still runs.
#[tokio::test]
async fn empty_lines_do_not_switch_the_head_deadline_off() {
    let deadline = Duration::from_millis(300);
    let to = limited(ConnectionLimits::new().head_timeout(deadline)).await;
    for empty in [
        &b"\r\n\r\n"[..],
        b"\n\n",
        b"\r\n\r\n\r\n\r\nGET / HTTP/1.1\r\n",
    ] {
        let mut s = connect("127.0.0.7", to).await.unwrap();
        let start = Instant::now();
        s.write_all(empty).await.unwrap();
        let took = closed_after(&mut s, start).await;
        assert!(
            took >= deadline - Duration::from_millis(50),
            "closed at {took:?}"
        );
    }
    // A request after empty lines is served.
    let mut s = connect("127.0.0.7", to).await.unwrap();
    s.write_all(b"\r\n\r\nGET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(response(&mut s).await, "http/1.1 200 ok");
}

/// Regression: the first half of the HTTP/2 preface (`PRI * HTTP/2.0` and an empty line)
/// was taken for a whole head.
#[tokio::test]
async fn half_an_http2_preface_is_a_late_head() {
    let deadline = Duration::from_millis(300);
    let to = limited(ConnectionLimits::new().head_timeout(deadline)).await;
    let mut s = connect("127.0.0.8", to).await.unwrap();
    let start = Instant::now();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\n").await.unwrap();
    let took = closed_after(&mut s, start).await;
    assert!(
        took >= deadline - Duration::from_millis(50),
        "closed at {took:?}"
    );
}

/// A head trickled below the minimum rate is closed once it lags the grace, well before
/// the head timeout; one at 500 bytes a second keeps up and is served.
#[tokio::test]
async fn a_head_below_the_minimum_rate_is_closed_after_the_grace() {
    let grace = Duration::from_millis(300);
    let to = limited(ConnectionLimits::new().min_head_rate(240, grace)).await;
    let mut slow = connect("127.0.0.9", to).await.unwrap();
    let start = Instant::now();
    slow.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let trickle = async {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if slow.write_all(b"x").await.is_err() {
                return start.elapsed();
            }
        }
    };
    // 16 bytes pay for 67 ms, then 10 bytes a second lag: closed near 0.4 s (the error
    // may show on the write after).
    let took = tokio::time::timeout(Duration::from_secs(5), trickle)
        .await
        .unwrap();
    assert!(
        took >= grace && took < Duration::from_secs(2),
        "closed at {took:?}"
    );

    let mut s = connect("127.0.0.9", to).await.unwrap();
    let mut head = b"GET / HTTP/1.1\r\nhost: a\r\n".to_vec();
    head.extend_from_slice(&b"x-padding: 0123456789abcdef\r\n".repeat(20));
    head.extend_from_slice(b"\r\n");
    for part in head.chunks(50) {
        s.write_all(part).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(response(&mut s).await, "http/1.1 200 ok");
}

/// A body below the minimum rate is closed once it lags the grace; one fast enough is
/// read whole.
#[tokio::test]
async fn a_body_below_the_minimum_rate_is_closed_after_the_grace() {
    let grace = Duration::from_millis(300);
    let to = limited(ConnectionLimits::new().min_body_rate(1000, grace)).await;
    let mut s = connect("127.0.0.11", to).await.unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 100\r\n\r\n")
        .await
        .unwrap();
    let start = Instant::now();
    let trickle = async {
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if s.write_all(b"x").await.is_err() {
                return start.elapsed();
            }
        }
    };
    let took = tokio::time::timeout(Duration::from_secs(5), trickle)
        .await
        .unwrap();
    assert!(
        took >= grace && took < Duration::from_secs(2),
        "closed at {took:?}"
    );

    let mut s = connect("127.0.0.11", to).await.unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 1000\r\n\r\n")
        .await
        .unwrap();
    for _ in 0..10 {
        s.write_all(&[b'x'; 100]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(response(&mut s).await, "http/1.1 200 ok");
}

/// A request that waits for `100 Continue` waits on the server: a handler slow to read
/// its body does not make the client's body late.
#[tokio::test]
async fn a_body_awaiting_100_continue_is_the_servers_turn() {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listener = ConnectionLimits::new()
        .min_body_rate(1000, Duration::from_millis(200))
        .build(tcp)
        .unwrap();
    let to = axum::serve::Listener::local_addr(&listener).unwrap();
    let app = Router::new().route(
        "/",
        axum::routing::put(|body: axum::body::Body| async move {
            tokio::time::sleep(Duration::from_millis(600)).await;
            let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
            bytes.len().to_string()
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let mut s = connect("127.0.0.12", to).await.unwrap();
    s.write_all(b"PUT / HTTP/1.1\r\nhost: a\r\nexpect: 100-continue\r\ncontent-length: 5\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(response(&mut s).await, "http/1.1 100 continue");
    s.write_all(b"hello").await.unwrap();
    assert_eq!(response(&mut s).await, "http/1.1 200 ok");
}

/// A kept-alive connection is served again within the idle timeout, and closed once it
/// idles past it.
#[tokio::test]
async fn a_kept_alive_connection_is_closed_after_the_idle_timeout() {
    let idle = Duration::from_millis(400);
    let to = limited(ConnectionLimits::new().idle_timeout(idle)).await;
    let mut s = connect("127.0.0.13", to).await.unwrap();
    for _ in 0..3 {
        s.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(response(&mut s).await, "http/1.1 200 ok");
        tokio::time::sleep(idle / 2).await;
    }
    let start = Instant::now();
    let took = closed_after(&mut s, start).await + idle / 2;
    assert!(
        took >= idle - Duration::from_millis(50),
        "closed after {took:?} idle"
    );
}

/// An HTTP/2 connection with no stream open idles: closed after the idle timeout.
#[tokio::test]
async fn an_idle_http2_connection_is_closed_after_the_idle_timeout() {
    let idle = Duration::from_millis(400);
    let to = limited(ConnectionLimits::new().idle_timeout(idle)).await;
    let mut s = connect("127.0.0.14", to).await.unwrap();
    let start = Instant::now();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let mut frame = [0u8; 9];
    s.read_exact(&mut frame).await.unwrap();
    assert_eq!(frame[3], 4, "the server's SETTINGS: it speaks HTTP/2");
    let took = closed_after(&mut s, start).await;
    assert!(
        took >= idle - Duration::from_millis(50),
        "closed after {took:?}"
    );
}

/// When the listener is full, a new connection is admitted in the place of the one that
/// has made the least progress while the server waits on it (here, the one silent the
/// longest); a connection in the server's turn never gives way, and when every one is in
/// it, the new connection is refused.
#[tokio::test]
async fn when_full_the_connection_with_the_least_progress_gives_way() {
    let to = limited(ConnectionLimits::new().max_total(3)).await;
    let mut oldest = connect("127.0.0.15", to).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut busy = connect("127.0.0.16", to).await.unwrap();
    busy.write_all(b"GET /slow HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut newer = connect("127.0.0.17", to).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;

    // Full: a new client is served, in the place of the oldest silent connection.
    assert!(answered(connect("127.0.0.18", to).await).await);
    closed_after(&mut oldest, Instant::now()).await;
    // Full again (the client served has gone): the next one takes the place of the
    // silent one that came first; the busy one is answered.
    let _filler = connect("127.0.0.19", to).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(answered(connect("127.0.0.18", to).await).await);
    closed_after(&mut newer, Instant::now()).await;
    assert_eq!(response(&mut busy).await, "http/1.1 200 ok");

    // Every place in the server's turn: a new connection is refused.
    let mut busy: Vec<_> = Vec::new();
    for i in 0..3 {
        let mut s = connect(&format!("127.0.0.{}", 20 + i), to).await.unwrap();
        s.write_all(b"GET /slow HTTP/1.1\r\nhost: a\r\n\r\n")
            .await
            .unwrap();
        busy.push(s);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!answered(connect("127.0.0.18", to).await).await);
    for mut s in busy {
        assert_eq!(response(&mut s).await, "http/1.1 200 ok");
    }
}

/// `bind` reports a bad setting as `InvalidInput`, with the `ConfigError` inside; a good
/// one listens, its total cap from the descriptor limit unless set.
#[tokio::test]
async fn bind_reports_a_bad_setting_and_listens_with_a_good_one() {
    let err = ConnectionLimits::new()
        .exempt(["10.0.0.0/33"])
        .bind("127.0.0.1:0")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    let inner = err
        .get_ref()
        .and_then(|e| e.downcast_ref::<tollgate::ConfigError>());
    assert!(
        matches!(inner, Some(tollgate::ConfigError::InvalidCidr(_))),
        "{err}"
    );

    let listener = ConnectionLimits::new()
        .max_total(7)
        .bind("127.0.0.1:0")
        .await
        .unwrap();
    assert_eq!(listener.max_connections(), Some(7));
    let to = serve(listener);
    assert!(answered(connect("127.0.0.24", to).await).await);
}

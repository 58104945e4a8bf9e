//! The price of a refusal at each depth, and what the connection limits cost an admitted
//! connection, from one server on loopback.
//!
//! The server runs on a thread of its own (a current-thread runtime), serving one axum app
//! on three listeners: a plain `TcpListener`, a `LimitedListener` whose limits admit every
//! connection (a rate, both caps and a head deadline, all checked), and a
//! `LimitedListener` that refuses every connection after an address's first. The clients
//! run on another thread, 32 at a time, each from a loopback address of its own, in a
//! closed loop. A row gives, per operation, the server thread's CPU time (its
//! `CLOCK_THREAD_CPUTIME_ID`, read on that thread) and the operations per second of wall
//! time, each the median of the rounds (the rows take turns in every round):
//!
//! - `refused at accept`: a new connection refused by the listener (reset at accept);
//! - `429, new connection`: a new connection whose request is refused by a rate-limit
//!   layer (`429`), then closed;
//! - `429, keep-alive`: a request refused with `429` on an open connection;
//! - `accepted, plain` and `accepted, limited`: a new connection with one request
//!   answered `200`, on the plain and on the limited listener: the difference is the
//!   listener's cost per accepted connection.
//!
//! Then the listener's own cost, without HTTP: 1 000 connections already made (and
//! waiting in the backlog) accepted one after another and dropped, through a plain
//! `TcpListener` and through a `LimitedListener` with every limit on, timed with this
//! thread's CPU time; the medians over the rounds, and the difference per connection.
//! Last, the same when full: 768 connections already waiting for their requests (a task
//! reading each), then 1 000 more accepted, each left waiting too; the limited listener's
//! cap is 768, so each new one evicts the connection waiting the longest.
//!
//! `cargo bench -p tollgate-benches --bench listener` (`TOLLGATE_ROUNDS`, default 7; `TOLLGATE_ROUND_MS`,
//! default 500).

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::{routing::get, Router};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tollgate::listener::ConnectionLimits;
use tollgate::{Limit, Quota, RateLimitLayer};

const CLIENTS: u32 = 32;

/// This thread's CPU time.
fn cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Every limit on, none reached: a rate, both caps and a head deadline.
fn every_limit() -> ConnectionLimits {
    let rate = Quota::per_second(1_000_000)
        .unwrap()
        .with_burst(1_000_000)
        .unwrap();
    ConnectionLimits::new()
        .limit(Limit::token_bucket(rate).unwrap())
        .max_per_address(10_000)
        .max_total(100_000)
        .head_timeout(Duration::from_secs(10))
}

/// The server: its three addresses, and a way to read its thread's CPU time.
struct Server {
    plain: SocketAddr,
    limited: SocketAddr,
    refusing: SocketAddr,
    probe: mpsc::UnboundedSender<oneshot::Sender<Duration>>,
}

impl Server {
    fn start() -> Server {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let limit = RateLimitLayer::builder().policy("1/hour").build().unwrap();
                let app = Router::new()
                    .route("/", get(|| async { "ok" }))
                    .route("/limited", get(|| async { "ok" }).layer(limit));
                let bind = || async {
                    let s = TcpSocket::new_v4().unwrap();
                    s.set_reuseaddr(true).unwrap();
                    s.bind("127.0.0.1:0".parse().unwrap()).unwrap();
                    s.listen(4096).unwrap()
                };
                let plain = bind().await;
                let limited = every_limit().build(bind().await).unwrap();
                let refusing = ConnectionLimits::new()
                    .limit(Limit::token_bucket(Quota::per_hour(1).unwrap()).unwrap())
                    .label("refusing")
                    .build(bind().await)
                    .unwrap();
                let local = |l: &dyn Fn() -> io::Result<SocketAddr>| l().unwrap();
                let (probe, mut probes) = mpsc::unbounded_channel::<oneshot::Sender<Duration>>();
                tx.send(Server {
                    plain: local(&|| plain.local_addr()),
                    limited: local(&|| axum::serve::Listener::local_addr(&limited)),
                    refusing: local(&|| axum::serve::Listener::local_addr(&refusing)),
                    probe,
                })
                .unwrap();
                let a = app.clone();
                tokio::spawn(async move { axum::serve(plain, a).await });
                let a = app.clone();
                tokio::spawn(async move { axum::serve(limited, a).await });
                tokio::spawn(async move { axum::serve(refusing, app).await });
                while let Some(reply) = probes.recv().await {
                    let _ = reply.send(cpu());
                }
            });
        });
        rx.recv().unwrap()
    }

    async fn cpu(&self) -> Duration {
        let (tx, rx) = oneshot::channel();
        self.probe.send(tx).unwrap();
        rx.await.unwrap()
    }
}

/// What a client does once, closed loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    RefusedAtAccept,
    TooManyNew,
    TooManyKeepAlive,
    AcceptedPlain,
    AcceptedLimited,
}

impl Op {
    const ALL: [Op; 5] = [
        Op::RefusedAtAccept,
        Op::TooManyNew,
        Op::TooManyKeepAlive,
        Op::AcceptedPlain,
        Op::AcceptedLimited,
    ];

    fn name(self) -> &'static str {
        match self {
            Op::RefusedAtAccept => "refused at accept",
            Op::TooManyNew => "429, new connection",
            Op::TooManyKeepAlive => "429, keep-alive",
            Op::AcceptedPlain => "accepted, plain",
            Op::AcceptedLimited => "accepted, limited",
        }
    }
}

const CLOSE: &[u8] = b"GET / HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n";
const LIMITED_CLOSE: &[u8] = b"GET /limited HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n";
const LIMITED_KEEP: &[u8] = b"GET /limited HTTP/1.1\r\nhost: bench\r\n\r\n";

async fn connect(from: IpAddr, to: SocketAddr) -> io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.bind(SocketAddr::new(from, 0))?;
    s.connect(to).await
}

/// Writes `req` and reads to the end; the status line's code.
async fn exchange(mut s: TcpStream, req: &[u8]) -> io::Result<u16> {
    s.write_all(req).await?;
    let mut got = Vec::with_capacity(512);
    s.read_to_end(&mut got).await?;
    Ok(status(&got))
}

fn status(response: &[u8]) -> u16 {
    std::str::from_utf8(response.get(9..12).unwrap_or_default())
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Reads one response of a keep-alive connection (its head, then `content-length` bytes).
async fn one_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<u16> {
    buf.clear();
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end])
                .unwrap_or_default()
                .to_ascii_lowercase();
            let len: usize = head
                .split("\r\n")
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let mut chunk = [0u8; 1024];
                let n = s.read(&mut chunk).await?;
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Ok(status(buf));
        }
        let mut chunk = [0u8; 1024];
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// One client's loop of `op` until `stop`, counting operations done as expected.
async fn client(
    op: Op,
    from: IpAddr,
    server: Arc<Addrs>,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) {
    let mut keep: Option<TcpStream> = None;
    let mut buf = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let ok = match op {
            Op::RefusedAtAccept => match connect(from, server.refusing).await {
                Err(_) => true,
                Ok(mut s) => {
                    let mut b = [0u8; 1];
                    // An address's first connection is admitted: say nothing, drop it.
                    matches!(
                        tokio::time::timeout(Duration::from_millis(50), s.read(&mut b)).await,
                        Ok(Ok(0) | Err(_))
                    )
                }
            },
            Op::TooManyNew => matches!(
                exchange(connect(from, server.limited).await.unwrap(), LIMITED_CLOSE).await,
                Ok(429)
            ),
            Op::TooManyKeepAlive => {
                if keep.is_none() {
                    keep = Some(connect(from, server.limited).await.unwrap());
                }
                let s = keep.as_mut().unwrap();
                s.write_all(LIMITED_KEEP).await.unwrap();
                matches!(one_response(s, &mut buf).await, Ok(429 | 200))
            }
            Op::AcceptedPlain => matches!(
                exchange(connect(from, server.plain).await.unwrap(), CLOSE).await,
                Ok(200)
            ),
            Op::AcceptedLimited => matches!(
                exchange(connect(from, server.limited).await.unwrap(), CLOSE).await,
                Ok(200)
            ),
        };
        if ok {
            done.fetch_add(1, Ordering::Relaxed);
        }
    }
}

struct Addrs {
    plain: SocketAddr,
    limited: SocketAddr,
    refusing: SocketAddr,
}

/// One round of `op`: operations done, the server's CPU time and the wall time.
async fn round(
    server: &Server,
    addrs: &Arc<Addrs>,
    op: Op,
    length: Duration,
) -> (u64, Duration, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|i| {
            // Each client its own address: 127.1.<op>.<i>.
            let from = IpAddr::V4(Ipv4Addr::new(127, 1, op as u8, 1 + i as u8));
            tokio::spawn(client(op, from, addrs.clone(), stop.clone(), done.clone()))
        })
        .collect();
    // Warm up (connections made, first connections admitted), then measure.
    tokio::time::sleep(length / 5).await;
    let (n0, cpu0, t0) = (
        done.load(Ordering::Relaxed),
        server.cpu().await,
        Instant::now(),
    );
    tokio::time::sleep(length).await;
    let (n1, cpu1, wall) = (
        done.load(Ordering::Relaxed),
        server.cpu().await,
        t0.elapsed(),
    );
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
    }
    (n1 - n0, cpu1 - cpu0, wall)
}

/// A listener on a fresh port with a backlog that holds a round's connections.
fn backlog_listener() -> tokio::net::TcpListener {
    let s = TcpSocket::new_v4().unwrap();
    s.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    s.listen(4096).unwrap()
}

/// Accepts `n` connections waiting at `listener` and drops them: this thread's CPU time per
/// connection, in microseconds.
async fn accept_all<L: axum::serve::Listener>(listener: &mut L, n: usize) -> f64 {
    let start = cpu();
    for _ in 0..n {
        drop(std::hint::black_box(listener.accept().await));
    }
    (cpu() - start).as_secs_f64() * 1e6 / n as f64
}

/// Makes `n` connections to `to`, from 16 loopback addresses.
async fn connections(to: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        let from = IpAddr::V4(Ipv4Addr::new(127, 2, 0, 1 + (i % 16) as u8));
        v.push(connect(from, to).await.unwrap());
    }
    v
}

/// The listener's own cost per accepted connection: plain and limited, in microseconds
/// of CPU, medians over `rounds`.
async fn accept_cost(rounds: usize) -> (f64, f64) {
    const N: usize = 1000;
    let mut plain = backlog_listener();
    let mut limited = every_limit().build(backlog_listener()).unwrap();
    let plain_addr = plain.local_addr().unwrap();
    let limited_addr = axum::serve::Listener::local_addr(&limited).unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        for side in [r % 2, 1 - r % 2] {
            if side == 0 {
                let clients = connections(plain_addr, N).await;
                a.push(accept_all(&mut plain, N).await);
                drop(clients);
            } else {
                let clients = connections(limited_addr, N).await;
                b.push(accept_all(&mut limited, N).await);
                drop(clients);
            }
        }
    }
    (median(a), median(b))
}

/// Accepts `n` connections waiting at `listener`, each left waiting for its request as a
/// server leaves it (a task reading it); this thread's CPU time per connection, in
/// microseconds, once every task has waited (or, evicted, closed).
async fn accept_and_wait<L>(listener: &mut L, n: usize) -> f64
where
    L: axum::serve::Listener,
{
    let start = cpu();
    for _ in 0..n {
        let (mut io, _) = listener.accept().await;
        tokio::spawn(async move {
            let mut b = [0u8; 64];
            let _ = io.read(&mut b).await;
        });
    }
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    (cpu() - start).as_secs_f64() * 1e6 / n as f64
}

/// The listener's cost per accepted connection when full: `FULL` connections already
/// waiting for their requests, then 1 000 more accepted, each waiting in turn. The limited
/// listener's cap is `FULL`, so each new one evicts the one waiting the longest (a scan of
/// the slots, its task woken, its stream closed); the plain listener holds them all. In
/// microseconds of CPU, medians over `rounds`.
async fn full_cost(rounds: usize) -> (f64, f64) {
    const FULL: usize = 768;
    const N: usize = 1000;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        for side in [r % 2, 1 - r % 2] {
            let tcp = backlog_listener();
            let to = tcp.local_addr().unwrap();
            let (held, more);
            if side == 0 {
                let mut plain = tcp;
                held = connections(to, FULL).await;
                accept_and_wait(&mut plain, FULL).await;
                more = connections(to, N).await;
                a.push(accept_and_wait(&mut plain, N).await);
            } else {
                let mut limited = every_limit().max_total(FULL as u32).build(tcp).unwrap();
                held = connections(to, FULL).await;
                accept_and_wait(&mut limited, FULL).await;
                more = connections(to, N).await;
                b.push(accept_and_wait(&mut limited, N).await);
                assert_eq!(limited.open_connections(), FULL, "evicted ones closed");
            }
            drop((held, more));
            // Let the waiting tasks see their connections close.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    (median(a), median(b))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::var("TOLLGATE_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(7);
    let length = Duration::from_millis(
        std::env::var("TOLLGATE_ROUND_MS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(500),
    );
    let server = Server::start();
    let addrs = Arc::new(Addrs {
        plain: server.plain,
        limited: server.limited,
        refusing: server.refusing,
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut per_op: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); Op::ALL.len()];
    rt.block_on(async {
        for r in 0..rounds {
            // Take turns: the order rotates every round.
            for k in 0..Op::ALL.len() {
                let i = (k + r) % Op::ALL.len();
                let (n, cpu, wall) = round(&server, &addrs, Op::ALL[i], length).await;
                if n > 0 {
                    per_op[i].0.push(cpu.as_secs_f64() * 1e6 / n as f64);
                    per_op[i].1.push(n as f64 / wall.as_secs_f64());
                }
            }
        }
    });
    println!("| per operation | server CPU (us) | operations/s |");
    println!("|---|---:|---:|");
    let mut cpu_of = [0.0; 5];
    for (i, op) in Op::ALL.iter().enumerate() {
        let (cpu, rate) = per_op[i].clone();
        if cpu.is_empty() {
            println!("| {} | - | - |", op.name());
            continue;
        }
        cpu_of[i] = median(cpu);
        println!("| {} | {:.1} | {:.0} |", op.name(), cpu_of[i], median(rate));
    }
    println!();
    println!(
        "a 429 on a new connection costs the server {:.1}x a refusal at accept; on a keep-alive connection {:.1}x",
        cpu_of[1] / cpu_of[0],
        cpu_of[2] / cpu_of[0]
    );
    println!(
        "accepted connections with one request each: {:.1} us of server CPU plain, {:.1} limited",
        cpu_of[3], cpu_of[4]
    );
    let (plain, limited) = rt.block_on(accept_cost(rounds));
    println!(
        "accept and drop alone: {plain:.2} us plain, {limited:.2} us limited: the listener's cost per accepted connection is {:.2} us",
        limited - plain
    );
    let (plain, limited) = rt.block_on(full_cost(rounds));
    println!(
        "accept when full (768 waiting), each new connection waiting in turn: {plain:.2} us plain (holding them all), {limited:.2} us limited (evicting one each): {:.2} us more per connection",
        limited - plain
    );
}

//! The listener under a flood of slow connections, as the README's quick start serves
//! (`ConnectionLimits::new()`, its defaults): a server in a process of its own limited to
//! 1 024 descriptors; 2 000 connections from 2 000 loopback addresses (all of 127/8 is
//! local on Linux), each doing one of the things that hold a connection open; a normal
//! client opening a fresh connection every 200 ms from the start, and a slow but
//! legitimate client whose head arrives at 500 bytes a second. Each variant is a test of
//! its own; they take turns (each starts its own server). With `--nocapture` each prints
//! its figures; `TOLLGATE_FLOOD_TRACE=1` prints every request of the normal client too.

use std::io::{self, BufRead};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tollgate::listener::ConnectionLimits;

/// The flooding connections.
const FLOOD: u32 = 2000;
/// How long the normal client measures, from the attack's first 200 ms.
const MEASURE: Duration = Duration::from_secs(5);
const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n";

/// The variants take turns: each holds thousands of sockets.
static TURN: Mutex<()> = Mutex::new(());

/// The server: `ConnectionLimits::new().bind(..)` in front of an app that answers `GET /`
/// and reads a `POST /`'s body; run in a child process by [`Server::start`] under
/// `ulimit -n 1024`. It prints its port and serves until its standard input closes.
#[test]
#[ignore = "run by the flood tests in a child process"]
fn flood_server() {
    if std::env::var_os("TOLLGATE_FLOOD_SERVER").is_none() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = ConnectionLimits::new().bind("127.0.0.1:0").await.unwrap();
        let app = Router::new().route(
            "/",
            get(|| async { "ok" }).post(|body: String| async move { body.len().to_string() }),
        );
        let port = axum::serve::Listener::local_addr(&listener).unwrap().port();
        println!("port {port} max {:?}", listener.max_connections());
        std::thread::spawn(|| {
            let _ = io::Read::read_to_end(&mut io::stdin(), &mut Vec::new());
            std::process::exit(0);
        });
        axum::serve(listener, app).await.unwrap();
    });
}

struct Server {
    child: Child,
    to: SocketAddr,
    max: String,
}

impl Server {
    fn start() -> Server {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#"ulimit -n 1024 && exec "$0" --ignored --exact flood::flood_server --nocapture --test-threads 1"#)
            .arg(&exe)
            .env("TOLLGATE_FLOOD_SERVER", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = io::BufReader::new(child.stdout.take().unwrap()).lines();
        // The harness's `test flood::flood_server ... ` comes first on the line.
        let line = lines
            .find_map(|l| Some(l.ok()?.split_once("port ")?.1.to_owned()))
            .expect("the server's port");
        let mut words = line.split(' ');
        let port: u16 = words.next().unwrap().parse().unwrap();
        let max = words.skip(1).collect::<Vec<_>>().join(" ");
        Server {
            child,
            to: SocketAddr::from(([127, 0, 0, 1], port)),
            max,
        }
    }

    /// The descriptors the server's process holds now.
    fn descriptors(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|d| d.count())
            .unwrap_or(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// This process holds the flood's sockets: its soft descriptor limit raised to its hard
/// one.
fn room_for_the_flood() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    let need = u64::from(FLOOD) + 512;
    if limit.current.is_some_and(|c| c < need) {
        limit.current = limit.maximum;
        setrlimit(Resource::Nofile, limit).unwrap();
    }
    let now = getrlimit(Resource::Nofile).current;
    assert!(
        now.is_none_or(|c| c >= need),
        "the flood needs {need} descriptors in the test process; its hard limit is {now:?}"
    );
}

async fn connect(from: IpAddr, to: SocketAddr) -> io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

/// The flood's connections made, and its signal to stop.
#[derive(Default)]
struct Counts {
    connections: AtomicUsize,
    stop: AtomicBool,
}

/// What a flooding connection does.
#[derive(Clone, Copy, Debug)]
enum Flood {
    /// A request line and a field, then a byte a second, never the end of the head.
    TrickledHead,
    /// Empty lines (`\r\n\r\n`, or `\n\n` for every other one), then nothing.
    EmptyLines,
    /// A request answered, then the connection held idle.
    IdleKeepAlive,
    /// A `POST` with `content-length: 1000`, its body a byte a second.
    TrickledBody,
    /// The HTTP/2 preface and a `SETTINGS` frame (or, every other one, only
    /// `PRI * HTTP/2.0` and its empty line), then nothing.
    Http2Idle,
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// One flooding client: connects from `from` (the `i`th of the flood, a quarter of a
/// millisecond after the one before: the whole flood within its first half second), holds
/// the connection as `flood` says until the server closes it, then connects again a second
/// later.
async fn flooder(flood: Flood, i: u32, from: IpAddr, to: SocketAddr, count: Arc<Counts>) {
    tokio::time::sleep(Duration::from_micros(250) * i).await;
    while !count.stop.load(Ordering::Relaxed) {
        let Ok(mut s) = connect(from, to).await else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        count.connections.fetch_add(1, Ordering::Relaxed);
        let first: &[u8] = match flood {
            Flood::TrickledHead => b"GET / HTTP/1.1\r\nhost: test\r\n",
            Flood::EmptyLines if i.is_multiple_of(2) => b"\r\n\r\n",
            Flood::EmptyLines => b"\n\n",
            Flood::IdleKeepAlive => b"GET / HTTP/1.1\r\nhost: test\r\n\r\n",
            Flood::TrickledBody => b"POST / HTTP/1.1\r\nhost: test\r\ncontent-length: 1000\r\n\r\n",
            Flood::Http2Idle if i.is_multiple_of(2) => PREFACE,
            Flood::Http2Idle => b"PRI * HTTP/2.0\r\n\r\n",
        };
        let trickles = matches!(flood, Flood::TrickledHead | Flood::TrickledBody);
        if s.write_all(first).await.is_ok() {
            // Until the server closes the connection (a read of nothing, or an error),
            // reading what it sends (a response, HTTP/2 settings) and trickling.
            let mut buf = [0u8; 512];
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            while !count.stop.load(Ordering::Relaxed) {
                tokio::select! {
                    r = s.read(&mut buf) => if !matches!(r, Ok(n) if n > 0) { break },
                    _ = tick.tick() => if trickles && s.write_all(b"x").await.is_err() { break },
                }
            }
        }
        drop(s);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A normal client's request on a fresh connection: how long until its whole answer, if
/// it was a `200` within a second.
async fn normal(to: SocketAddr) -> Option<Duration> {
    let start = Instant::now();
    let exchange = async {
        let mut s = connect(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), to).await?;
        s.write_all(REQUEST).await?;
        let mut got = Vec::new();
        s.read_to_end(&mut got).await?;
        Ok::<_, io::Error>(got)
    };
    match tokio::time::timeout(Duration::from_secs(1), exchange).await {
        Ok(Ok(got)) if got.starts_with(b"HTTP/1.1 200") => Some(start.elapsed()),
        _ => None,
    }
}

/// A legitimate client on a slow link: a 1 500-byte head sent at 500 bytes a second (50
/// bytes every 100 ms); whether it was answered `200`.
async fn slow_link(to: SocketAddr) -> bool {
    let mut head = b"GET / HTTP/1.1\r\nhost: test\r\nconnection: close\r\n".to_vec();
    while head.len() < 1500 - 30 {
        head.extend_from_slice(b"x-padding: 0123456789abcdef\r\n");
    }
    head.extend_from_slice(b"\r\n");
    let Ok(mut s) = connect(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3)), to).await else {
        return false;
    };
    for part in head.chunks(50) {
        if s.write_all(part).await.is_err() {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
    matches!(read, Ok(Ok(_))) && got.starts_with(b"HTTP/1.1 200")
}

/// What one attack showed.
struct Outcome {
    answered: Vec<Duration>,
    asked: usize,
    slow_link: bool,
    descriptors: usize,
    connections: usize,
}

/// Runs `flood` from `addresses` against a fresh server, with the normal client and the
/// slow link, and prints the figures.
fn attack(flood: Flood, addresses: impl Fn(u32) -> IpAddr) -> Outcome {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    room_for_the_flood();
    let mut server = Server::start();
    assert_eq!(server.max, "Some(768)", "3/4 of 1 024 descriptors");
    let to = server.to;
    let count = Arc::new(Counts::default());

    // The flood on a runtime of its own; the clients measured on another, so that the
    // flood's tasks do not delay them.
    let flood_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for i in 0..FLOOD {
        flood_rt.spawn(flooder(flood, i, addresses(i), to, count.clone()));
    }
    let clients = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let attack_start = Instant::now();
    let (answered, asked, slow_link, descriptors, from) = clients.block_on(async {
        // Once the flood has made its connections, within its first second.
        while count.connections.load(Ordering::Relaxed) < FLOOD as usize
            && attack_start.elapsed() < Duration::from_secs(1)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let from = attack_start.elapsed();
        let slow = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            slow_link(to).await
        });
        let mut answered = Vec::new();
        let mut asked = 0;
        let mut descriptors = 0;
        let start = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        while start.elapsed() < MEASURE {
            tick.tick().await;
            asked += 1;
            let got = normal(to).await;
            if std::env::var_os("TOLLGATE_FLOOD_TRACE").is_some() {
                eprintln!("\ntrace {:?} {got:?}", start.elapsed());
            }
            answered.extend(got);
            descriptors = descriptors.max(server.descriptors());
        }
        (answered, asked, slow.await.unwrap(), descriptors, from)
    });
    count.stop.store(true, Ordering::Relaxed);
    flood_rt.shutdown_timeout(Duration::from_millis(100));
    let max = std::mem::take(&mut server.max);
    drop(server);

    let mut sorted = answered.clone();
    sorted.sort();
    let at = |q: f64| {
        sorted.get(((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1)))
    };
    eprintln!(
        "{flood:?} ({FLOOD} connections, server max_total {}): from {from:?} into the attack, \
         normal client answered {}/{asked}, p50 {:?}, p99 {:?}; slow link (500 B/s head) \
         answered: {slow_link}; server descriptors at most {descriptors} of 1024",
        max,
        answered.len(),
        at(0.5),
        at(0.99),
    );
    Outcome {
        answered,
        asked,
        slow_link,
        descriptors,
        connections: count.connections.load(Ordering::Relaxed),
    }
}

/// Each of 2 000 connections from an address of its own: 127.1.x.y.
fn distinct(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 1, (i / 250) as u8, 1 + (i % 250) as u8))
}

fn assert_held(o: &Outcome) {
    assert!(
        o.connections >= FLOOD as usize,
        "the flood was not under way: {} connections",
        o.connections
    );
    assert_eq!(
        o.answered.len(),
        o.asked,
        "the normal client was not answered every time"
    );
    let within = o
        .answered
        .iter()
        .filter(|t| **t <= Duration::from_millis(100))
        .count();
    assert!(
        within * 10 >= o.asked * 9,
        "{within} of {} answers within 100 ms",
        o.asked
    );
    assert!(o.slow_link, "the slow link's request was not answered");
    assert!(o.descriptors <= 1024);
}

#[test]
fn a_distributed_flood_of_trickled_heads_does_not_lock_out_a_normal_client() {
    assert_held(&attack(Flood::TrickledHead, distinct));
}

/// Regression: empty lines were taken for a whole head, which switched the head
/// deadline off for good.
#[test]
fn a_distributed_flood_of_empty_lines_does_not_lock_out_a_normal_client() {
    assert_held(&attack(Flood::EmptyLines, distinct));
}

#[test]
fn a_distributed_flood_of_idle_keep_alive_connections_does_not_lock_out_a_normal_client() {
    assert_held(&attack(Flood::IdleKeepAlive, distinct));
}

#[test]
fn a_distributed_flood_of_trickled_bodies_does_not_lock_out_a_normal_client() {
    assert_held(&attack(Flood::TrickledBody, distinct));
}

#[test]
fn a_distributed_flood_of_idle_http2_connections_does_not_lock_out_a_normal_client() {
    assert_held(&attack(Flood::Http2Idle, distinct));
}

/// 2 000 trickled heads from one address: its per-address cap refuses all but 64.
#[test]
fn a_flood_of_trickled_heads_from_one_address_does_not_lock_out_a_normal_client() {
    assert_held(&attack(Flood::TrickledHead, |_| {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 10))
    }));
}

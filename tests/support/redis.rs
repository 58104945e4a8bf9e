//! Test helper: a private `redis-server` (or a 3-node cluster) on free loopback ports.
//!
//! `REDIS_URL` set: tests that only need a server use it. `redis-server` missing: tests
//! print "skipping: redis-server not found" and pass, unless `TOLLGATE_REQUIRE_REDIS=1`.
#![allow(dead_code, unreachable_pub)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Whether `redis-server` can run here. Panics when it cannot and
/// `TOLLGATE_REQUIRE_REDIS=1`.
pub fn available() -> bool {
    let ok = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        if std::env::var("TOLLGATE_REQUIRE_REDIS").as_deref() == Ok("1") {
            panic!("redis-server not found and TOLLGATE_REQUIRE_REDIS=1");
        }
        // Written to the process's stderr directly: libtest captures only the `print!`
        // family, so this line shows in a normal `cargo test` run.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "skipping: redis-server not found (install it, or set REDIS_URL; TOLLGATE_REQUIRE_REDIS=1 makes this a failure)"
        );
    }
    ok
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

static SEQ: AtomicU32 = AtomicU32::new(0);

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "tollgate-{tag}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn wait_ready(port: u16) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            let out = cli_at(port, &["PING"]);
            if out.trim() == "PONG" {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("redis-server on port {port} did not start");
}

/// Runs `redis-cli -p port args..` and returns its stdout.
pub fn cli_at(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
}

/// A `redis-server` this test owns.
pub struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a private server; `None` (after printing why) when redis-server is missing.
    pub fn start() -> Option<Self> {
        Self::start_with(&[])
    }

    /// Starts a private server with extra arguments.
    pub fn start_with(extra: &[&str]) -> Option<Self> {
        if !available() {
            return None;
        }
        let mut s = RedisServer {
            port: free_port(),
            dir: temp_dir("redis"),
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        s.spawn();
        Some(s)
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", self.dir.to_str().unwrap()])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server spawns");
        self.child = Some(child);
        wait_ready(self.port);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn cli(&self, args: &[&str]) -> String {
        cli_at(self.port, args)
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts again on the same port (after [`RedisServer::kill`]).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn stop(&self) {
        signal(self.pid(), "-STOP");
    }

    pub fn cont(&self) {
        signal(self.pid(), "-CONT");
    }

    /// Script calls (`EVALSHA` and `EVAL`) the server has run, once their count has
    /// stopped moving: calls sent while it was stopped run when it resumes.
    pub fn settled_script_calls(&self) -> u64 {
        let count = || self.calls("evalsha") + self.calls("eval");
        let mut last = count();
        loop {
            std::thread::sleep(Duration::from_millis(200));
            let now = count();
            if now == last {
                return now;
            }
            last = now;
        }
    }

    /// `INFO commandstats` calls of one command (e.g. `evalsha`).
    pub fn calls(&self, command: &str) -> u64 {
        let info = self.cli(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|r| r.split(',').next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            signal(c.id(), "-CONT");
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A server for tests that only need one: `REDIS_URL` when set (no process control),
/// otherwise a private one.
pub enum Target {
    External(String),
    Owned(RedisServer),
}

impl Target {
    pub fn get() -> Option<Self> {
        if let Ok(url) = std::env::var("REDIS_URL") {
            return Some(Target::External(url));
        }
        RedisServer::start().map(Target::Owned)
    }

    pub fn url(&self) -> String {
        match self {
            Target::External(u) => u.clone(),
            Target::Owned(s) => s.url(),
        }
    }
}

/// A 3-node Redis Cluster (no replicas) on free loopback ports.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Option<Self> {
        if !available() {
            return None;
        }
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let dir = temp_dir("cluster");
            let conf = dir.join("nodes.conf");
            let mut s = RedisServer {
                port: free_port(),
                dir,
                child: None,
                extra: vec![
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-config-file".into(),
                    conf.to_str().unwrap().into(),
                    "--cluster-node-timeout".into(),
                    "2000".into(),
                ],
            };
            s.spawn();
            nodes.push(s);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = Command::new("redis-cli")
            .args(&args)
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        // Wait until every node agrees the cluster is up.
        let start = Instant::now();
        loop {
            let ok = nodes
                .iter()
                .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"));
            if ok {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "cluster did not become ok"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(RedisCluster { nodes })
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}

/// A stored value's words: 8-byte little-endian doubles, each a whole number.
pub fn stored_words(raw: &[u8]) -> Vec<u64> {
    assert_eq!(raw.len() % 8, 0, "{raw:?}");
    raw.chunks_exact(8)
        .map(|c| {
            let w = f64::from_le_bytes(c.try_into().unwrap());
            assert!(w >= 0.0 && w.fract() == 0.0 && w < 2f64.powi(53), "{w}");
            w as u64
        })
        .collect()
}

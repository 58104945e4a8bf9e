//! Test helper: a private `redis-server` (or a 3-node cluster, or a Sentinel-managed
//! primary and replica) on free loopback ports.
//!
//! `REDIS_URL` set: tests that only need a server use it. `redis-server` missing: tests
//! print "skipping: redis-server not found" and pass, unless `TOLLGATE_REQUIRE_REDIS=1`.
//! `TOLLGATE_REDIS_SERVER` and `TOLLGATE_REDIS_CLI` name other programs to run instead
//! (`valkey-server` and `valkey-cli`: the same tests against Valkey).
#![allow(dead_code, unreachable_pub)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The server program: `redis-server`, or `TOLLGATE_REDIS_SERVER`.
pub fn server_program() -> String {
    std::env::var("TOLLGATE_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

/// The command-line client: `redis-cli`, or `TOLLGATE_REDIS_CLI`.
pub fn cli_program() -> String {
    std::env::var("TOLLGATE_REDIS_CLI").unwrap_or_else(|_| "redis-cli".into())
}

/// Whether `redis-server` can run here. Panics when it cannot and
/// `TOLLGATE_REQUIRE_REDIS=1`.
pub fn available() -> bool {
    let ok = Command::new(server_program())
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
    let out = Command::new(cli_program())
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
        let child = Command::new(server_program())
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
        let out = Command::new(cli_program())
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

/// A TCP proxy in front of a local Redis: new connections go to the port it points to now
/// (a name that follows the master, as a DNS name, a Kubernetes Service or a TCP proxy
/// does), and what clients send can be held for a while (a slow server).
pub struct Proxy {
    pub addr: std::net::SocketAddr,
    target: std::sync::Arc<std::sync::atomic::AtomicU16>,
    delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Proxy {
    /// A proxy to `127.0.0.1:port`, serving on a free port (inside a tokio runtime).
    pub async fn start(port: u16) -> Proxy {
        use std::sync::atomic::{AtomicU16, AtomicU64};
        use std::sync::Arc;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let target = Arc::new(AtomicU16::new(port));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let (t, d) = (target.clone(), delay_ms.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let port = t.load(Ordering::Relaxed);
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                    continue;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let delay = d.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        let n = match client_read.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let ms = delay.load(Ordering::Relaxed);
                        if ms > 0 {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                        }
                        if server_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                });
            }
        });
        Proxy {
            addr,
            target,
            delay_ms,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// New connections go to `127.0.0.1:port` from now on; open ones stay where they are.
    pub fn point_to(&self, port: u16) {
        self.target.store(port, Ordering::Relaxed);
    }

    /// Holds each chunk a client sends for `ms` before passing it on (0: at once).
    pub fn delay(&self, ms: u64) {
        self.delay_ms.store(ms, Ordering::Relaxed);
    }
}

/// Certificates for TLS tests, made with `openssl`: a CA, and a server certificate it
/// signed for `localhost` and `127.0.0.1`.
pub struct TlsFiles {
    pub dir: PathBuf,
}

impl TlsFiles {
    /// Makes the files in a temporary folder; `None` (after printing why) without
    /// `openssl`, unless `TOLLGATE_REQUIRE_REDIS=1`.
    pub fn generate() -> Option<TlsFiles> {
        let dir = temp_dir("tls");
        let run = |args: &[&str]| {
            Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let ext = "subjectAltName=DNS:localhost,IP:127.0.0.1";
        std::fs::write(dir.join("san.ext"), ext).unwrap();
        let ok = run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=tollgate test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ]) && run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ]) && run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            "server.crt",
        ]);
        if !ok {
            if std::env::var("TOLLGATE_REQUIRE_REDIS").as_deref() == Ok("1") {
                panic!("openssl could not make test certificates and TOLLGATE_REQUIRE_REDIS=1");
            }
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "skipping: openssl not found");
            return None;
        }
        Some(TlsFiles { dir })
    }

    pub fn path(&self, file: &str) -> String {
        self.dir.join(file).to_str().unwrap().to_owned()
    }

    /// The server's TLS settings (as `redis.conf` lines), listening on `tls_port`.
    pub fn conf(&self, tls_port: u16) -> Vec<String> {
        vec![
            format!("tls-port {tls_port}"),
            format!("tls-cert-file {}", self.path("server.crt")),
            format!("tls-key-file {}", self.path("server.key")),
            format!("tls-ca-cert-file {}", self.path("ca.crt")),
            "tls-auth-clients no".into(),
            "tls-replication yes".into(),
        ]
    }

    /// [`TlsFiles::conf`] as command-line arguments.
    pub fn args(&self, tls_port: u16) -> Vec<String> {
        self.conf(tls_port)
            .iter()
            .flat_map(|line| {
                let (k, v) = line.split_once(' ').unwrap();
                [format!("--{k}"), v.to_owned()]
            })
            .collect()
    }
}

impl Drop for TlsFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A free loopback port.
pub fn port() -> u16 {
    free_port()
}

/// One `redis-server --sentinel` with its own configuration file.
pub struct Sentinel {
    pub port: u16,
    dir: PathBuf,
    child: Child,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A master, one replica and three sentinels watching them as `mymaster` (quorum 2,
/// down after `down_after_ms`), on free loopback ports. With `tls`, every node and
/// sentinel speaks TLS on its `tls_port` (the plain ports stay open for `redis-cli`), and
/// the sentinels name the masters' TLS ports.
pub struct SentinelGroup {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<Sentinel>,
    /// The TLS ports of master and replica, and of each sentinel, when TLS is on.
    pub tls_ports: Option<(u16, u16, Vec<u16>)>,
}

impl SentinelGroup {
    pub fn start(down_after_ms: u64, tls: Option<&TlsFiles>) -> Option<Self> {
        if !available() {
            return None;
        }
        let (m_tls, r_tls) = (free_port(), free_port());
        let tls_args = |p| tls.map(|t| t.args(p)).unwrap_or_default();
        let margs = tls_args(m_tls);
        let master =
            RedisServer::start_with(&margs.iter().map(String::as_str).collect::<Vec<_>>())?;
        let (mport_for_replicas, data_port) = match tls {
            Some(_) => (m_tls, m_tls),
            None => (master.port, master.port),
        };
        let mut rargs = tls_args(r_tls);
        rargs.extend([
            "--replicaof".into(),
            "127.0.0.1".into(),
            mport_for_replicas.to_string(),
        ]);
        let replica =
            RedisServer::start_with(&rargs.iter().map(String::as_str).collect::<Vec<_>>())?;
        let start = Instant::now();
        while !replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up")
        {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the replica did not sync"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut sentinels = Vec::new();
        let mut sentinel_tls = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let dir = temp_dir("sentinel");
            let mut conf = vec![
                format!("port {port}"),
                "bind 127.0.0.1".into(),
                format!("dir {}", dir.to_str().unwrap()),
                format!("sentinel monitor mymaster 127.0.0.1 {data_port} 2"),
                format!("sentinel down-after-milliseconds mymaster {down_after_ms}"),
                "sentinel failover-timeout mymaster 5000".into(),
                "sentinel parallel-syncs mymaster 1".into(),
            ];
            if let Some(t) = tls {
                let p = free_port();
                conf.extend(t.conf(p));
                sentinel_tls.push(p);
            }
            let file = dir.join("sentinel.conf");
            std::fs::write(&file, conf.join("\n") + "\n").unwrap();
            let child = Command::new(server_program())
                .arg(&file)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server --sentinel spawns");
            wait_ready(port);
            sentinels.push(Sentinel { port, dir, child });
        }
        let group = SentinelGroup {
            master,
            replica,
            sentinels,
            tls_ports: tls.map(|_| (m_tls, r_tls, sentinel_tls)),
        };
        // Every sentinel has found the replica (through the master).
        let start = Instant::now();
        while !group
            .sentinels
            .iter()
            .all(|s| cli_at(s.port, &["SENTINEL", "REPLICAS", "mymaster"]).contains("127.0.0.1"))
        {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "sentinels found no replica"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(group)
    }

    /// `redis+sentinel://` (or, with TLS, `rediss+sentinel://`) naming every sentinel.
    pub fn url(&self) -> String {
        match &self.tls_ports {
            None => {
                let hosts: Vec<String> = self
                    .sentinels
                    .iter()
                    .map(|s| format!("127.0.0.1:{}", s.port))
                    .collect();
                format!("redis+sentinel://{}/mymaster", hosts.join(","))
            }
            Some((_, _, ports)) => {
                let hosts: Vec<String> = ports.iter().map(|p| format!("localhost:{p}")).collect();
                format!("rediss+sentinel://{}/mymaster", hosts.join(","))
            }
        }
    }

    /// The port the sentinels name as the master's now.
    pub fn master_port(&self) -> Option<u16> {
        let out = cli_at(
            self.sentinels[0].port,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"],
        );
        out.lines().nth(1).and_then(|p| p.trim().parse().ok())
    }
}

//! In a real browser: a page served from one origin calls a rate-limited API on another
//! (another port) and reads the limit's fields and its 429 in its own script, through
//! the `tower_http` example's layers (its `app.rs`, included below).
//!
//! Headless Chromium (Debian's `chromium` package; `TOLLGATE_CHROMIUM` names another
//! binary). Without it the test prints why and passes, unless `TOLLGATE_REQUIRE_BROWSER=1`
//! (as in CI), which makes a missing browser a failure.
#![cfg(feature = "axum")]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use axum::http::{HeaderValue, Method};
use axum::routing::get;
use axum::Router;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tollgate::key::PeerIp;
use tollgate::RateLimitLayer;
use tower_http::cors::CorsLayer;

#[allow(dead_code)]
#[path = "../examples/tower_http/app.rs"]
mod app;

/// The Chromium binary to run, or `None` after saying why the test is skipped.
fn chromium() -> Option<PathBuf> {
    let candidates = std::env::var_os("TOLLGATE_CHROMIUM")
        .map(PathBuf::from)
        .into_iter()
        .chain(["/usr/bin/chromium", "/usr/bin/chromium-browser"].map(PathBuf::from));
    for path in candidates {
        if path.is_file() {
            return Some(path);
        }
    }
    if std::env::var("TOLLGATE_REQUIRE_BROWSER").as_deref() == Ok("1") {
        panic!("chromium not found and TOLLGATE_REQUIRE_BROWSER=1 (apt-get install chromium)");
    }
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "skipping: chromium not found (apt-get install chromium, or set TOLLGATE_CHROMIUM; TOLLGATE_REQUIRE_BROWSER=1 makes this a failure)"
    );
    None
}

/// A headless Chromium on `url`, in a process group of its own, killed (with every
/// process it started) when dropped.
struct Browser {
    child: Child,
    profile: PathBuf,
}

impl Browser {
    fn open(binary: &PathBuf, url: &str) -> Browser {
        use std::os::unix::process::CommandExt as _;
        let profile =
            std::env::temp_dir().join(format!("tollgate-chromium-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&profile);
        std::fs::create_dir_all(&profile).expect("a profile directory");
        let log = std::fs::File::create(profile.join("chromium.log")).expect("a log file");
        let child = Command::new(binary)
            .args([
                "--headless",
                // Root in a container has no user namespace to sandbox the renderer in.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("chromium starts");
        Browser { child, profile }
    }

    /// The end of what the browser wrote to stderr, to say why a page did not report.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.profile.join("chromium.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The whole group: the browser's renderer and GPU processes too.
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

async fn serve(router: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let make = router.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, make).await });
    addr
}

/// What the page's script read from each API's three answers.
fn calls<'a>(findings: &'a Value, api: &str) -> &'a [Value] {
    findings[api]
        .as_array()
        .unwrap_or_else(|| panic!("no findings for {api}: {findings}"))
}

fn field<'a>(call: &'a Value, name: &str) -> Option<&'a str> {
    call[name].as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_another_origin_reads_the_fields_and_the_429() {
    let Some(binary) = chromium() else { return };

    // The page's origin is known before the APIs are built: its port is bound first.
    let page_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let page_addr = page_listener.local_addr().unwrap();
    let origin = HeaderValue::try_from(format!("http://{page_addr}")).unwrap();

    // The example's API, its CORS layer exposing the rate-limit fields.
    let exposed = serve(app::api(app::cors(origin.clone())).unwrap()).await;
    // Controls, to show the browser enforces what the example guards against: the same
    // stack with a CorsLayer that exposes nothing, and one with CORS inside the limit.
    let plain = CorsLayer::new()
        .allow_origin(origin.clone())
        .allow_methods([Method::GET]);
    let unexposed = serve(app::api(plain).unwrap()).await;
    let limit = RateLimitLayer::builder()
        .key(PeerIp::new())
        .policy(app::POLICY)
        .build()
        .unwrap();
    let inside = serve(
        Router::new()
            .route("/api/hello", get(|| async { "hello\n" }))
            .layer(app::cors(origin.clone()))
            .layer(limit), // added last: outermost, so its 429 skips CorsLayer
    )
    .await;

    let apis = [exposed, unexposed, inside].map(|a| format!("http://{a}"));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let site = app::site(app::page(&apis), move |report| {
        let _ = tx.send(report);
    });
    tokio::spawn(async move { axum::serve(page_listener, site).await });

    let browser = Browser::open(&binary, &format!("http://{page_addr}/"));
    let report = match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
        Ok(Some(report)) => report,
        _ => panic!(
            "the page did not report within 30 s; chromium said:\n{}",
            browser.log_tail()
        ),
    };
    drop(browser);
    let findings: Value = serde_json::from_str(&report).unwrap();

    // The example's stack: the script reads every field, and the 429 with Retry-After.
    let seen = calls(&findings, &apis[0]);
    let statuses: Vec<_> = seen.iter().map(|c| c["status"].as_u64()).collect();
    assert_eq!(statuses, [Some(200), Some(200), Some(429)], "{findings}");
    for (call, remaining) in seen.iter().zip(["r=1", "r=0", "r=0"]) {
        let ratelimit =
            field(call, "ratelimit").unwrap_or_else(|| panic!("RateLimit unreadable: {call}"));
        assert!(
            ratelimit.starts_with("\"2-per-1m\";") && ratelimit.contains(remaining),
            "{call}"
        );
        let policy =
            field(call, "policy").unwrap_or_else(|| panic!("RateLimit-Policy unreadable: {call}"));
        assert!(policy.contains("q=2;w=60"), "{call}");
    }
    let retry_after: u64 = field(&seen[2], "retry_after")
        .unwrap_or_else(|| panic!("Retry-After unreadable: {}", seen[2]))
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry_after), "{}", seen[2]);

    // Not exposed: the script sees the statuses, but none of the fields.
    let seen = calls(&findings, &apis[1]);
    let statuses: Vec<_> = seen.iter().map(|c| c["status"].as_u64()).collect();
    assert_eq!(statuses, [Some(200), Some(200), Some(429)], "{findings}");
    for call in seen {
        for name in ["ratelimit", "policy", "retry_after"] {
            assert!(
                call[name].is_null(),
                "{name} readable without being exposed: {call}"
            );
        }
    }

    // CORS inside the limit: the refusal carries no CORS field, so the script gets a
    // network error instead of the 429.
    let seen = calls(&findings, &apis[2]);
    assert_eq!(seen[1]["status"].as_u64(), Some(200), "{findings}");
    assert!(field(&seen[2], "error").is_some(), "{findings}");
}

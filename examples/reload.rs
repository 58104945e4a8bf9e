//! Policies reloaded from a file when it changes, without dropping any key's state.
//!
//! ```sh
//! cargo run --example reload                                # 127.0.0.1:3000 (or $PORT)
//! POLICIES=/etc/myapp/policies.txt cargo run --example reload
//! TOLLGATE_EXAMPLE_SELFTEST=1 cargo run --example reload    # drive itself and check
//! ```
//!
//! Requests are limited per `x-api-key` by a policy set read from a text file (`$POLICIES`,
//! default `policies.txt`, written with defaults when missing) in the format of
//! `PolicySet::from_text`: `name = policy` lines, `* = ...` for limits every policy also
//! applies, `#` comments. Keys starting with `pro_` get the `pro` policy, others `free`
//! (a set without the name a key asks for gives it its first policy).
//!
//! The layer's built-in watcher (`PolicyHandle::watch_file`) looks at the file's metadata
//! every 200 ms and, once a change has settled for one look, reads the file and installs
//! its set. Every key keeps its state: a key that spent its 5 of `free = 5/min` and then
//! sees `free = 20/min` has 15 left, not a fresh 20 (see "How a key keeps its state across
//! policies" in the `policy` module docs). A file that does not parse, is not UTF-8, is
//! too large, or is not a regular file (a directory, a FIFO) is reported (for a text, the
//! line at fault, quoted cut short) and the set in force stays until the file is fixed.
//! Parsing and installing run on a blocking thread, in time linear in the file's size
//! (300,000 policies take about a second), so requests are served meanwhile.
//!
//! Replace the file atomically when you can: write the new version beside it and rename
//! it over the old one (`mv policies.txt.new policies.txt`; most editors save this way).
//! A file rewritten in place is read once it has stopped changing for 200 ms.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::{routing::get, Router};
use tokio::sync::watch;
use tollgate::key::{HeaderBytes, HeaderKey, RequestHead};
use tollgate::policy::{PolicyHandle, PolicySet, PolicyWatch};
use tollgate::RateLimitLayer;

/// What a missing policy file is created with.
const DEFAULT_POLICIES: &str = "\
# tollgate policies, one `name = policy` a line; the first is the fallback.
# `* = ...` holds limits every policy also applies. Saved changes apply within half a second.
free = 10/min
pro = 100/min
* = daily: 1000/day window
";

/// How often the file is looked at.
const POLL: Duration = Duration::from_millis(200);

/// `pro_...` keys get the `pro` policy, every other key `free`.
fn plan(_: &RequestHead<'_>, key: Option<&HeaderBytes>) -> &'static str {
    match key {
        Some(k) if k.starts_with(b"pro_") => "pro",
        _ => "free",
    }
}

/// The app limited by `set`, and the handle that swaps its policies.
fn app(set: PolicySet) -> Result<(Router, PolicyHandle), tollgate::ConfigError> {
    let layer = RateLimitLayer::builder()
        .key(HeaderKey::new("x-api-key")?)
        .policies(set)
        .select(plan)
        .label("reload")
        .build()?;
    let handle = layer.policy_handle();
    let app = Router::new()
        .route("/", get(|| async { "ok\n" }))
        .layer(layer);
    Ok((app, handle))
}

/// What the file watcher has done so far.
#[derive(Clone, Debug, Default)]
struct Reloads {
    applied: u64,
    refused: u64,
    last_error: Option<String>,
}

/// The most policy names a reload lists.
const LISTED: usize = 5;

/// A set's names for a log line: the first few, and how many there are.
fn names(set: &PolicySet) -> String {
    let count = set.names().count();
    let mut shown: Vec<&str> = set.names().take(LISTED).collect();
    if count > LISTED {
        shown.push("...");
    }
    let noun = if count == 1 { "policy" } else { "policies" };
    format!("{count} {noun}: {}", shown.join(", "))
}

/// Watches `path` and installs its policies whenever it changes; every outcome is printed
/// and published on `report`.
fn watch_file(
    path: &Path,
    handle: &PolicyHandle,
    report: watch::Sender<Reloads>,
) -> Result<PolicyWatch, tollgate::policy::WatchError> {
    handle
        .watch_file(path)
        .interval(POLL)
        .on_reload(move |outcome| match outcome {
            Ok(set) => {
                println!("reloaded ({})", names(set));
                report.send_modify(|r| r.applied += 1);
            }
            Err(error) => {
                eprintln!("not reloaded, the policies in force stay: {error}");
                report.send_modify(|r| {
                    r.refused += 1;
                    r.last_error = Some(error.to_string());
                });
            }
        })
        .start()
}

/// Reads the policy file, writing the defaults first when it does not exist.
fn read_or_create(path: &Path) -> io::Result<String> {
    match std::fs::read_to_string(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::write(path, DEFAULT_POLICIES)?;
            println!("{}: created with the default policies", path.display());
            Ok(DEFAULT_POLICIES.to_owned())
        }
        r => r,
    }
}

/// Builds the app from the file at `path`, starts its watcher and serves on
/// `127.0.0.1:port`.
async fn start(
    path: PathBuf,
    port: u16,
) -> Result<(SocketAddr, PolicyHandle, watch::Receiver<Reloads>), Box<dyn std::error::Error>> {
    let text = read_or_create(&path)?;
    let set = PolicySet::from_text(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let (app, handle) = app(set)?;
    let (report, reloads) = watch::channel(Reloads::default());
    watch_file(&path, &handle, report)?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((addr, handle, reloads))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var("TOLLGATE_EXAMPLE_SELFTEST").as_deref() == Ok("1") {
        return selftest().await;
    }
    let path = PathBuf::from(std::env::var("POLICIES").unwrap_or_else(|_| "policies.txt".into()));
    let port = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let (addr, _handle, _reloads) = start(path.clone(), port).await?;
    println!(
        "limits per x-api-key from {} on http://{addr}",
        path.display()
    );
    println!("  for i in $(seq 11); do curl -s -o /dev/null -w '%{{http_code}} ' -H 'x-api-key: free_demo' http://{addr}/; done; echo");
    println!("  curl -i -H 'x-api-key: pro_demo' http://{addr}/   # RateLimit-Policy shows the pro quota");
    println!(
        "  # edit {} (say, free = 20/min): the next response shows the new quota, and",
        path.display()
    );
    println!("  # what a key spent stays spent; a line that does not parse is reported here.");
    std::future::pending::<()>().await;
    Ok(())
}

/// Removes the self-test's policy file however the test ends.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn selftest() -> Result<(), Box<dyn std::error::Error>> {
    let file = TempFile(std::env::temp_dir().join(format!(
        "tollgate-reload-selftest-{}.txt",
        std::process::id()
    )));
    let path = file.0.clone();
    std::fs::write(&path, "free = 5/min\n")?;
    let (addr, handle, mut reloads) = start(path.clone(), 0).await?;

    let client = reqwest::Client::new();
    let url = format!("http://{addr}/");
    let expect = |codes: &[u16], ok: usize| {
        assert_eq!(
            codes,
            [vec![200; ok], vec![429]].concat(),
            "{ok} admitted, then refused"
        );
    };

    // 5 per minute: 5 pass, the 6th is refused.
    let (codes, before) = send(&client, &url, 6).await?;
    println!("free = 5/min:  {codes:?}  RateLimit-Policy: {before}");
    expect(&codes, 5);
    assert_eq!(before, r#""free";q=5;w=60"#);

    // 20 per minute, the same key: the 5 units it spent stay spent, so 15 pass, not 20.
    // (The refill of 20/min is one unit per 3 s: the requests take milliseconds.)
    std::fs::write(&path, "free = 20/min\n")?;
    let r = handled(&mut reloads, 1, WAIT).await?;
    assert_eq!((r.applied, r.refused), (1, 0));
    let twenty = PolicySet::from_text("free = 20/min")?;
    assert_eq!(handle.current(), twenty);
    let (codes, after) = send(&client, &url, 16).await?;
    println!("free = 20/min: {codes:?}  RateLimit-Policy: {after}");
    expect(&codes, 15);
    assert_eq!(after, r#""free";q=20;w=60"#);

    // A file that does not parse: refused, the error names its line, 20/min stays.
    std::fs::write(&path, "free = 20/mni\n")?;
    let r = handled(&mut reloads, 2, WAIT).await?;
    assert_eq!((r.applied, r.refused), (1, 1));
    let error = r.last_error.unwrap_or_default();
    let at = format!("{}: line 1:", path.display());
    assert!(error.starts_with(&at), "{error}");
    assert!(error.contains("\"mni\""), "{error}");
    assert_eq!(handle.current(), twenty);
    let (codes, kept) = send(&client, &url, 1).await?;
    println!("free = 20/mni: {codes:?}  RateLimit-Policy: {kept}  (refused: {error})");
    assert_eq!(
        codes,
        [429],
        "the key's state is still the 20/min one, spent"
    );
    assert_eq!(kept, after);

    // A file that is not UTF-8: refused and said so, 20/min stays.
    std::fs::write(&path, b"free = 30/min\n\xff\n")?;
    let r = handled(&mut reloads, 3, WAIT).await?;
    assert_eq!((r.applied, r.refused), (1, 2));
    let error = r.last_error.unwrap_or_default();
    let not_utf8 = format!("{}: not UTF-8 (byte 15 is not valid)", path.display());
    assert_eq!(error, not_utf8);
    assert_eq!(handle.current(), twenty);
    println!("not UTF-8:     refused ({error})");

    // One line of 10 MB that does not parse: the error quotes it cut short.
    std::fs::write(&path, format!("free = {}", "9".repeat(10 << 20)))?;
    let r = handled(&mut reloads, 4, WAIT).await?;
    assert_eq!((r.applied, r.refused), (1, 3));
    let error = r.last_error.unwrap_or_default();
    assert!(
        error.len() < 400 + path.as_os_str().len(),
        "{} bytes: {}",
        error.len(),
        &error[..400]
    );
    assert!(error.contains("... (10485760 bytes)"), "{error}");
    assert_eq!(handle.current(), twenty);
    println!("10 MB line:    refused ({} bytes of error)", error.len());

    // 300,000 policies: read and installed in seconds (checking each name against every
    // earlier one took minutes), `free` still the fallback.
    let many: String = (0..300_000).map(|i| format!("p{i} = 5/s\n")).collect();
    std::fs::write(&path, format!("free = 20/min\n{many}"))?;
    let r = handled(&mut reloads, 5, Duration::from_secs(60)).await?;
    assert_eq!((r.applied, r.refused), (2, 3));
    assert_eq!(handle.current().names().count(), 300_001);
    let (_, policy) = send(&client, &url, 1).await?;
    println!("300,001 policies: RateLimit-Policy: {policy}");
    assert_eq!(policy, after);

    println!("selftest ok");
    Ok(())
}

/// `n` requests of the self-test's key: their statuses and the last `RateLimit-Policy`.
async fn send(
    client: &reqwest::Client,
    url: &str,
    n: usize,
) -> Result<(Vec<u16>, String), reqwest::Error> {
    let mut codes = Vec::with_capacity(n);
    let mut policy = String::new();
    for _ in 0..n {
        let res = client
            .get(url)
            .header("x-api-key", "selftest_key")
            .send()
            .await?;
        codes.push(res.status().as_u16());
        let field = res.headers().get("ratelimit-policy");
        policy = field.and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    }
    Ok((codes, policy))
}

/// How long the self-test waits for the watcher to handle a small change.
const WAIT: Duration = Duration::from_secs(5);

/// Waits until the watcher has handled its `n`th change (applied or refused), at most
/// `wait`.
async fn handled(
    reloads: &mut watch::Receiver<Reloads>,
    n: u64,
    wait: Duration,
) -> Result<Reloads, Box<dyn std::error::Error>> {
    let change = reloads.wait_for(|r| r.applied + r.refused >= n);
    let r = tokio::time::timeout(wait, change)
        .await
        .map_err(|_| format!("change {n} not picked up within {wait:?}"))??;
    Ok(r.clone())
}

//! [`PolicyWatcher`]: a layer's policies reloaded from a file when it changes. See the
//! [module docs](super#watching-a-policy-file).

use std::fmt;
use std::fs::{File, Metadata};
use std::hash::Hasher;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use tokio::task::AbortHandle;
use tokio::time::MissedTickBehavior;

use super::handle::Install;
use super::{PolicyHandle, PolicySet};
use crate::error::ConfigError;

/// How often the file's metadata is read, by default.
const INTERVAL: Duration = Duration::from_secs(1);
/// The largest file read, by default.
const MAX_BYTES: u64 = 16 << 20;
/// Modification times can be as coarse as 2 s (FAT; 1 s elsewhere): a file modified less
/// than this long ago is read again even when its metadata looks unchanged, since a second
/// write within one tick of its clock can leave the metadata as it was.
const COARSE: Duration = Duration::from_secs(3);

/// Why a policy file was not applied. The set in force stays.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WatchError {
    /// [`PolicyWatcher::start`] was called outside a tokio runtime.
    NoRuntime,
    /// The file could not be read: it does not exist, or may not be read.
    Io {
        /// The file.
        path: PathBuf,
        /// What kind of failure.
        kind: io::ErrorKind,
        /// The operating system's words for it.
        message: String,
    },
    /// The path names something other than a regular file: a directory, a FIFO, a socket,
    /// a device. It is never opened for reading, so nothing at the path can stall the
    /// watcher.
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it names (`a directory`, `a FIFO`, ...).
        what: &'static str,
    },
    /// The file is larger than the watcher reads ([`PolicyWatcher::max_bytes`]).
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size, in bytes.
        len: u64,
        /// The most the watcher reads.
        max: u64,
    },
    /// The file is not UTF-8.
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// The first byte that is not valid, counted from 1.
        byte: usize,
    },
    /// The text does not parse as a policy set, or the layer refused the set (a policy its
    /// store cannot decide, a name its selector can return that the set lacks).
    Refused {
        /// The file.
        path: PathBuf,
        /// Why: the line and the part at fault, for a text that does not parse.
        error: ConfigError,
    },
}

impl fmt::Display for WatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoRuntime => f.write_str("a policy file watcher needs a tokio runtime"),
            Self::Io { path, message, .. } => write!(f, "{}: {message}", path.display()),
            Self::NotAFile { path, what } => {
                write!(f, "{}: {what}, not a regular file", path.display())
            }
            Self::TooLarge { path, len, max } => write!(
                f,
                "{}: {len} bytes, larger than the {max} the watcher reads",
                path.display()
            ),
            Self::NotUtf8 { path, byte } => write!(
                f,
                "{}: not UTF-8 (byte {byte} is not valid)",
                path.display()
            ),
            Self::Refused { path, error } => write!(f, "{}: {error}", path.display()),
        }
    }
}

impl std::error::Error for WatchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Refused { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// What a watcher has done so far. See [`PolicyWatch::status`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WatchStatus {
    /// Versions of the file installed.
    pub applied: u64,
    /// Versions of the file not installed, and failures to read it.
    pub failed: u64,
    /// Why the latest version was not installed; `None` once one is (or when the file
    /// holds the set in force).
    pub error: Option<WatchError>,
}

/// What a watcher tells its [`on_reload`](PolicyWatcher::on_reload) callback.
type OnReload = dyn Fn(Result<&PolicySet, &WatchError>) + Send + Sync;

/// Watches a policy file and installs its set whenever it changes: the settings, and
/// [`start`](PolicyWatcher::start). Made by [`PolicyHandle::watch_file`]; see the
/// [module docs](super#watching-a-policy-file).
///
/// Every `interval` (default 1 s) the watcher reads the file's metadata (its identity,
/// size and times; the file itself only when they change). A change is read once the
/// metadata has stayed the same for one interval, so a file being written is read when
/// its writer pauses; a file replaced by a rename (write a temporary file, then rename it
/// over the old one) is read whole. The text is parsed as [`PolicySet::from_text`] does
/// and installed as [`PolicyHandle::swap`] does, on a blocking thread (a large set takes
/// a while). A file that cannot be read, is larger than
/// [`max_bytes`](PolicyWatcher::max_bytes) (default 16 MiB), is not a regular file (a
/// directory, a FIFO: never opened), is not UTF-8 or does not parse is not installed: the
/// set in force stays, a `WARN` event (target `tollgate`) says why, and so do the
/// callback and [`PolicyWatch::status`]. A version the same as the set in force is not
/// installed again.
#[must_use]
pub struct PolicyWatcher {
    handle: Weak<dyn Install>,
    path: PathBuf,
    interval: Duration,
    max_bytes: u64,
    on_reload: Option<Arc<OnReload>>,
}

impl fmt::Debug for PolicyWatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyWatcher")
            .field("path", &self.path)
            .field("interval", &self.interval)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

impl PolicyHandle {
    /// A watcher of the policy file at `path`, which installs its set in this handle's
    /// layer whenever it changes; [`PolicyWatcher::start`] runs it. See the
    /// [module docs](super#watching-a-policy-file).
    pub fn watch_file(&self, path: impl Into<PathBuf>) -> PolicyWatcher {
        PolicyWatcher {
            handle: Arc::downgrade(&self.inner),
            path: path.into(),
            interval: INTERVAL,
            max_bytes: MAX_BYTES,
            on_reload: None,
        }
    }
}

impl PolicyWatcher {
    /// How often the file's metadata is read (default 1 s); a change is installed one to
    /// two intervals after the file stops changing. At least 1 ms.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// The largest file read, in bytes (default 16 MiB); a larger one is not read.
    pub fn max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// Called with each outcome: the set installed, or why a version of the file (or a
    /// failure to read it) was not. Runs on the watcher's task: keep it short.
    pub fn on_reload(
        mut self,
        f: impl Fn(Result<&PolicySet, &WatchError>) + Send + Sync + 'static,
    ) -> Self {
        self.on_reload = Some(Arc::new(f));
        self
    }

    /// Starts watching, on the current tokio runtime. The watcher runs until the layer is
    /// dropped or [`PolicyWatch::stop`] is called (dropping the [`PolicyWatch`] does not
    /// stop it).
    ///
    /// # Errors
    ///
    /// [`WatchError::NoRuntime`] outside a tokio runtime.
    pub fn start(self) -> Result<PolicyWatch, WatchError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| WatchError::NoRuntime)?;
        let status = Arc::new(Mutex::new(WatchStatus::default()));
        let task = runtime.spawn(run(self, Arc::clone(&status)));
        Ok(PolicyWatch {
            status,
            task: task.abort_handle(),
        })
    }
}

/// A running policy file watcher. See [`PolicyWatcher`].
#[derive(Debug)]
pub struct PolicyWatch {
    status: Arc<Mutex<WatchStatus>>,
    task: AbortHandle,
}

impl PolicyWatch {
    /// What the watcher has done so far, and why the latest version of the file was not
    /// installed, if it was not.
    pub fn status(&self) -> WatchStatus {
        lock(&self.status).clone()
    }

    /// Stops watching; the set in force stays.
    pub fn stop(&self) {
        self.task.abort();
    }

    /// Whether the watcher still runs (it ends once its layer is dropped).
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What says a file changed: where it is on disk, its size and its times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    id: (u64, u64),
    len: u64,
    modified: Option<SystemTime>,
    changed: (i64, i64),
}

impl Stamp {
    fn of(meta: &Metadata) -> Self {
        #[cfg(unix)]
        let (id, changed) = {
            use std::os::unix::fs::MetadataExt;
            ((meta.dev(), meta.ino()), (meta.ctime(), meta.ctime_nsec()))
        };
        #[cfg(not(unix))]
        let (id, changed) = ((0, 0), (0, 0));
        Stamp {
            id,
            len: meta.len(),
            modified: meta.modified().ok(),
            changed,
        }
    }

    /// Whether the file was modified so recently that its times may not show a second
    /// write.
    fn recent(&self) -> bool {
        self.modified
            .and_then(|m| m.elapsed().ok())
            .is_none_or(|age| age < COARSE)
    }
}

/// When to read the file, from its metadata at each tick: once it has stayed the same for
/// one tick after a change, so that a file being written is read when its writer pauses.
#[derive(Debug, Default)]
struct Debounce {
    /// The metadata at the last tick.
    seen: Option<Stamp>,
    /// The metadata when the file was last read.
    read_at: Option<Stamp>,
}

impl Debounce {
    /// Whether to read the file now, its metadata being `stamp` (`recent`: modified within
    /// its clock's resolution, when a write may not show in it; then it is read at every
    /// tick it has not changed, and the bytes read say whether it did).
    fn read_now(&mut self, stamp: Stamp, recent: bool) -> bool {
        if self.read_at == Some(stamp) && !recent {
            return false;
        }
        if self.seen != Some(stamp) {
            self.seen = Some(stamp);
            return false;
        }
        true
    }

    /// The file was read at `stamp`.
    fn read(&mut self, stamp: Stamp) {
        self.read_at = Some(stamp);
    }

    /// The file could not be looked at: once it can, it is read as a new file.
    fn lost(&mut self) {
        *self = Debounce::default();
    }
}

/// What a path names, when it is not a regular file.
fn not_a_file(meta: &Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() {
        return None;
    }
    if t.is_dir() {
        return Some("a directory");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return Some("a FIFO");
        }
        if t.is_socket() {
            return Some("a socket");
        }
        if t.is_block_device() || t.is_char_device() {
            return Some("a device");
        }
    }
    Some("not a regular file")
}

fn io_error(path: &Path, e: &io::Error) -> WatchError {
    WatchError::Io {
        path: path.to_owned(),
        kind: e.kind(),
        message: e.to_string(),
    }
}

/// The file's metadata, if it is a regular file of at most `max` bytes.
fn probe(path: &Path, max: u64) -> Result<Stamp, WatchError> {
    let meta = std::fs::metadata(path).map_err(|e| io_error(path, &e))?;
    check(path, &meta, max)?;
    Ok(Stamp::of(&meta))
}

fn check(path: &Path, meta: &Metadata, max: u64) -> Result<(), WatchError> {
    if let Some(what) = not_a_file(meta) {
        return Err(WatchError::NotAFile {
            path: path.to_owned(),
            what,
        });
    }
    if meta.len() > max {
        return Err(WatchError::TooLarge {
            path: path.to_owned(),
            len: meta.len(),
            max,
        });
    }
    Ok(())
}

/// The file's bytes, at most `max`. Opened without blocking (a FIFO put at the path since
/// it was looked at does not wait for a writer), and checked again once open.
fn read(path: &Path, max: u64) -> Result<Vec<u8>, WatchError> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file: File = options.open(path).map_err(|e| io_error(path, &e))?;
    let meta = file.metadata().map_err(|e| io_error(path, &e))?;
    check(path, &meta, max)?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(path, &e))?;
    if bytes.len() as u64 > max {
        return Err(WatchError::TooLarge {
            path: path.to_owned(),
            len: bytes.len() as u64,
            max,
        });
    }
    Ok(bytes)
}

/// A hash of a version's bytes: a version read again is not installed (or reported)
/// again.
fn digest(bytes: &[u8]) -> u64 {
    let mut h = siphasher::sip::SipHasher13::new_with_keys(0x706f_6c69_6379, 0x6669_6c65);
    h.write(bytes);
    h.finish()
}

/// What a read of the file came to.
enum Outcome {
    /// The same bytes as the version read last.
    Unchanged,
    /// The set the file holds is the one in force.
    InForce,
    Installed(PolicySet),
    Failed(WatchError),
}

/// Reads, parses and installs a version of the file (on a blocking thread).
fn load(path: &Path, max: u64, last: Option<u64>, install: &dyn Install) -> (Option<u64>, Outcome) {
    let bytes = match read(path, max) {
        Ok(b) => b,
        Err(e) => return (last, Outcome::Failed(e)),
    };
    let hash = digest(&bytes);
    if last == Some(hash) {
        return (last, Outcome::Unchanged);
    }
    let text = match std::str::from_utf8(&bytes) {
        Ok(t) => t,
        Err(e) => {
            let byte = e.valid_up_to() + 1;
            let error = WatchError::NotUtf8 {
                path: path.to_owned(),
                byte,
            };
            return (Some(hash), Outcome::Failed(error));
        }
    };
    let refused = |error| WatchError::Refused {
        path: path.to_owned(),
        error,
    };
    let outcome = match PolicySet::from_text(text) {
        Err(e) => Outcome::Failed(refused(e)),
        Ok(set) if set == install.current() => Outcome::InForce,
        Ok(set) => match install.install(set.clone()) {
            Ok(()) => Outcome::Installed(set),
            Err(e) => Outcome::Failed(refused(e)),
        },
    };
    (Some(hash), outcome)
}

/// The watcher's task: see [`PolicyWatcher`].
async fn run(watcher: PolicyWatcher, status: Arc<Mutex<WatchStatus>>) {
    let PolicyWatcher {
        handle,
        path,
        interval,
        max_bytes,
        on_reload,
    } = watcher;
    let path = Arc::new(path);
    let report = |outcome: Result<&PolicySet, &WatchError>| {
        {
            let mut s = lock(&status);
            match outcome {
                Ok(_) => {
                    s.applied += 1;
                    s.error = None;
                }
                Err(e) => {
                    s.failed += 1;
                    s.error = Some(e.clone());
                }
            }
        }
        match outcome {
            Ok(set) => tracing::info!(
                target: "tollgate",
                path = %path.display(),
                policies = set.len(),
                "policy file installed"
            ),
            Err(e) => tracing::warn!(
                target: "tollgate",
                error = %e,
                "policy file not installed; the policies in force stay"
            ),
        }
        if let Some(f) = &on_reload {
            f(outcome);
        }
    };
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut debounce = Debounce::default();
    let mut last_hash = None;
    // Why the version read last was not installed, if it was not.
    let mut content_error: Option<WatchError> = None;
    // The failure to look at the file last reported, so that it is reported once.
    let mut failing: Option<WatchError> = None;
    loop {
        tick.tick().await;
        if handle.strong_count() == 0 {
            return;
        }
        let probed = {
            let path = Arc::clone(&path);
            tokio::task::spawn_blocking(move || probe(&path, max_bytes)).await
        };
        let stamp = match probed {
            Ok(Ok(stamp)) => stamp,
            Ok(Err(e)) => {
                debounce.lost();
                if failing.as_ref() != Some(&e) {
                    report(Err(&e));
                    failing = Some(e);
                }
                continue;
            }
            Err(_) => continue,
        };
        if failing.take().is_some() {
            // The file is back: what is known of its version stands until it is read.
            lock(&status).error = content_error.clone();
        }
        if !debounce.read_now(stamp, stamp.recent()) {
            continue;
        }
        let Some(install) = handle.upgrade() else {
            return;
        };
        let loaded = {
            let path = Arc::clone(&path);
            tokio::task::spawn_blocking(move || load(&path, max_bytes, last_hash, &*install)).await
        };
        let Ok((hash, outcome)) = loaded else {
            continue;
        };
        debounce.read(stamp);
        last_hash = hash;
        match outcome {
            Outcome::Unchanged => {}
            Outcome::InForce => {
                content_error = None;
                lock(&status).error = None;
            }
            Outcome::Installed(set) => {
                content_error = None;
                report(Ok(&set));
            }
            Outcome::Failed(e) => {
                report(Err(&e));
                content_error = Some(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(len: u64) -> Stamp {
        Stamp {
            id: (1, 2),
            len,
            modified: None,
            changed: (0, 0),
        }
    }

    #[test]
    fn a_change_is_read_once_it_stays_the_same_for_a_tick() {
        let mut d = Debounce::default();
        // A new file: seen, then read at the next tick.
        assert!(!d.read_now(stamp(10), false));
        assert!(d.read_now(stamp(10), false));
        d.read(stamp(10));
        assert!(!d.read_now(stamp(10), false));
        // Being written: every tick sees another size; read once it stops.
        for len in [11, 12, 13, 13] {
            assert!(!d.read_now(stamp(len), false), "{len}");
            if len == 13 {
                break;
            }
        }
        assert!(d.read_now(stamp(13), false));
        d.read(stamp(13));
        // Modified within its clock's resolution: read at every tick (the bytes decide).
        assert!(d.read_now(stamp(13), true));
        assert!(!d.read_now(stamp(13), false));
        // Gone and back: a new file.
        d.lost();
        assert!(!d.read_now(stamp(13), false));
        assert!(d.read_now(stamp(13), false));
    }

    /// A FIFO is opened without waiting for a writer, and refused once open: the watcher
    /// reads the path only after checking what it names, and this covers a FIFO put there
    /// in between.
    #[cfg(unix)]
    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let path = std::env::temp_dir().join(format!("tollgate-fifo-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let made = std::process::Command::new("mkfifo").arg(&path).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", path.display());
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || tx.send(read(&p, 1024)));
        let got = rx.recv_timeout(Duration::from_secs(10));
        let _ = std::fs::remove_file(&path);
        match got {
            Ok(Err(WatchError::NotAFile { what, .. })) => assert_eq!(what, "a FIFO"),
            other => panic!("{other:?}"),
        }
    }
}

//! The config the daemon runs on, kept equal to the folder on disk.
//!
//! A watcher on the config folder (notify, debounced), a slow poll behind it, and every
//! request that reads the config compare the folder's [`fingerprint`] with the running
//! config's. On a difference the whole folder is loaded and validated again and, only if
//! all of it is valid, swapped in at once — what SIGHUP does, unconditionally. A broken
//! edit keeps the running config and becomes the *problem*: logged once, shown by
//! `status`, and returned to any command that needs the config, so a command never acts
//! on a file's old content while its new content is on disk.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use notify::{RecursiveMode, Watcher};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::config::{self, fingerprint, Config, ConfigError};

/// How long the folder must be quiet after an event before it is read (an editor's save
/// is several events).
const DEBOUNCE: Duration = Duration::from_millis(300);

/// The longest a burst of events delays the check (a file that is written all the time
/// must not hold back an edit beside it).
const MAX_QUIET_WAIT: Duration = Duration::from_secs(1);

/// How often the folder is checked without any event (events can be missed: a full
/// inotify queue, a network file system).
const POLL: Duration = Duration::from_secs(5);

/// An edit that could not be loaded; the running config stays until it is fixed.
#[derive(Debug)]
pub struct Problem {
    fingerprint: String,
    pub errors: Vec<ConfigError>,
    pub since: DateTime<Utc>,
}

/// What a reload did.
pub enum Reload {
    /// The folder is as the running config was read from.
    Unchanged,
    Swapped,
    Broken(Arc<Problem>),
}

pub struct LiveConfig {
    dir: PathBuf,
    running: RwLock<Arc<Config>>,
    loaded_at: RwLock<DateTime<Utc>>,
    problem: Mutex<Option<Arc<Problem>>>,
    /// One reload at a time: two callers noticing the same edit load it once.
    reloading: Mutex<()>,
    /// Woken when a new config is swapped in: the trigger tasks follow it.
    pub swapped: Notify,
}

fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

impl LiveConfig {
    pub fn new(dir: PathBuf, config: Config) -> LiveConfig {
        LiveConfig {
            dir,
            running: RwLock::new(Arc::new(config)),
            loaded_at: RwLock::new(Utc::now()),
            problem: Mutex::new(None),
            reloading: Mutex::new(()),
            swapped: Notify::new(),
        }
    }

    /// The config the daemon runs on now (the last valid one).
    pub fn running(&self) -> Arc<Config> {
        self.running
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn loaded_at(&self) -> DateTime<Utc> {
        *self.loaded_at.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The edit that could not be loaded, while the folder still holds it.
    pub fn problem(&self) -> Option<Arc<Problem>> {
        self.problem
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The config as the folder holds it now, reloading first if it changed; or the
    /// errors that keep the running config in place.
    pub fn fresh(&self) -> Result<Arc<Config>, Arc<Problem>> {
        match self.reload(false, "config edited") {
            Reload::Unchanged | Reload::Swapped => Ok(self.running()),
            Reload::Broken(problem) => Err(problem),
        }
    }

    /// The config as the folder holds it now, or the running one while an edit is broken
    /// (a trigger keeps firing on the last valid config).
    pub fn fresh_or_running(&self) -> Arc<Config> {
        self.fresh().unwrap_or_else(|_| self.running())
    }

    /// Loads the folder again if it changed (always, with `force`), and swaps it in if it
    /// is valid. `why` starts each log line.
    pub fn reload(&self, force: bool, why: &str) -> Reload {
        let _one = self.reloading.lock().unwrap_or_else(|p| p.into_inner());
        let running = self.running();
        let now = fingerprint(&running.root);
        if !force && now == running.fingerprint {
            *self.problem.lock().unwrap_or_else(|p| p.into_inner()) = None;
            return Reload::Unchanged;
        }
        if let Some(p) = self.problem().filter(|p| p.fingerprint == now && !force) {
            return Reload::Broken(p);
        }
        match config::load_dir(&self.dir) {
            Ok(config) => {
                let workflows = config.workflows.len();
                *self.running.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
                *self.loaded_at.write().unwrap_or_else(|p| p.into_inner()) = Utc::now();
                *self.problem.lock().unwrap_or_else(|p| p.into_inner()) = None;
                self.swapped.notify_one();
                tracing::info!(workflows, "{why}: config reloaded");
                Reload::Swapped
            }
            Err(errors) => {
                for e in &errors {
                    tracing::error!("{why}: {e}");
                }
                tracing::error!(
                    "{why}: {} error(s): keeping the running config (loaded {})",
                    errors.len(),
                    stamp(self.loaded_at())
                );
                let problem = Arc::new(Problem {
                    fingerprint: now,
                    errors,
                    since: Utc::now(),
                });
                *self.problem.lock().unwrap_or_else(|p| p.into_inner()) = Some(problem.clone());
                Reload::Broken(problem)
            }
        }
    }

    /// The problem as an error for a person: every error, and what the daemon does.
    pub fn explain(&self, problem: &Problem) -> anyhow::Error {
        let list: Vec<String> = problem.errors.iter().map(|e| e.to_string()).collect();
        anyhow::anyhow!(
            "the config in {} has {} error(s) since {}; the daemon keeps running the config loaded {} until they are fixed (see `steward validate`):\n{}",
            self.dir.display(),
            list.len(),
            stamp(problem.since),
            stamp(self.loaded_at()),
            list.join("\n")
        )
    }

    /// Follows the folder until `stop`: each burst of file events (and every [`POLL`])
    /// leads to one reload check.
    pub async fn follow(self: Arc<Self>, stop: CancellationToken) {
        let (tx, mut events) = mpsc::channel::<()>(1);
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if event.is_ok() {
                let _ = tx.try_send(());
            }
        })
        .and_then(|mut w| w.watch(&self.dir, RecursiveMode::Recursive).map(|_| w));
        let _watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(
                    "cannot watch {} for edits ({e}); checking it every {}s instead",
                    self.dir.display(),
                    POLL.as_secs()
                );
                None
            }
        };
        let mut open = true;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                got = events.recv(), if open => {
                    if got.is_none() {
                        open = false; // no watcher: the poll carries on alone
                        continue;
                    }
                    // Wait for the folder to be quiet (an editor's save is several events),
                    // but not past MAX_QUIET_WAIT if something keeps writing there.
                    let burst = tokio::time::Instant::now();
                    while burst.elapsed() < MAX_QUIET_WAIT {
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            more = events.recv() => if more.is_none() { break },
                            _ = tokio::time::sleep(DEBOUNCE) => break,
                        }
                    }
                }
                _ = tokio::time::sleep(POLL) => {}
            }
            let live = self.clone();
            let _ = tokio::task::spawn_blocking(move || live.reload(false, "config change")).await;
        }
    }
}

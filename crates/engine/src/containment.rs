//! Containment: each step in a cgroup of its own (cgroup v2), so that a child which
//! leaves the step's process group (`setsid`, a double fork, a daemonizing tool) still
//! dies with its step.
//!
//! Process groups remain the first line: a step is signalled as a group (SIGTERM, then
//! SIGKILL after the grace). Where steward may create cgroups under its own (a systemd
//! unit with `Delegate=yes`, or root), every step also runs in
//! `<own cgroup>/steward-<pid>-<n>`, and when the step ends the
//! whole cgroup is killed (`cgroup.kill`); the emptied cgroup is kept for a later step.
//! Where it may not, steward says so in `steward status` and at start-up, and relies on
//! process groups alone.
//!
//! A step is started straight into its cgroup (`clone3(CLONE_INTO_CGROUP)`, see
//! [`crate::process`]). Without it (kernels before 5.7, CPUs other than x86_64 and
//! aarch64) the step is moved in just after its spawn returns, so a program that forks a
//! new session within microseconds of its `exec` could in principle start that child
//! before the move.
//!
//! `STEWARD_CONTAINMENT=process-group` turns cgroups off.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How steps are contained on this machine, decided once per process.
#[derive(Debug, Clone)]
pub enum Containment {
    /// Steps get cgroups under this folder.
    Cgroup(PathBuf),
    /// Process groups only, and why.
    ProcessGroups(String),
}

static CONTAINMENT: OnceLock<Containment> = OnceLock::new();
static SEQ: AtomicU64 = AtomicU64::new(0);
/// Empty cgroups kept for the next steps: creating and removing one per step costs more
/// than the step's own spawn.
static POOL: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
const POOL_MAX: usize = 16;

/// This process's containment (detected at first use).
pub fn current() -> &'static Containment {
    CONTAINMENT.get_or_init(detect)
}

/// One line for `steward status` and the start-up log.
pub fn describe() -> String {
    match current() {
        Containment::Cgroup(base) => format!(
            "cgroup v2: each step runs in its own cgroup under {} and the whole cgroup is killed when the step ends (a child that calls setsid dies too)",
            base.display()
        ),
        Containment::ProcessGroups(why) => format!(
            "process groups only ({why}): a step's child that leaves its process group (setsid) can outlive the step"
        ),
    }
}

fn detect() -> Containment {
    if std::env::var("STEWARD_CONTAINMENT").as_deref() == Ok("process-group") {
        return Containment::ProcessGroups("STEWARD_CONTAINMENT=process-group".into());
    }
    let Some(base) = own_cgroup_dir() else {
        return Containment::ProcessGroups("no cgroup v2 hierarchy is mounted".into());
    };
    let probe = base.join(format!("steward-{}-probe", std::process::id()));
    match std::fs::create_dir(&probe) {
        Ok(()) => {
            let _ = std::fs::remove_dir(&probe);
            sweep_leftovers(&base);
            Containment::Cgroup(base)
        }
        Err(e) => Containment::ProcessGroups(format!(
            "cannot create cgroups under {}: {e}; under systemd set Delegate=yes",
            base.display()
        )),
    }
}

/// `<cgroup2 mount><own path>` from /proc/self/mountinfo and /proc/self/cgroup.
fn own_cgroup_dir() -> Option<PathBuf> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let own = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    for line in mountinfo.lines() {
        // id parent dev root mountpoint options [optional...] - fstype source superopts
        let (left, right) = line.split_once(" - ")?;
        if right.split(' ').next() != Some("cgroup2") {
            continue;
        }
        let fields: Vec<&str> = left.split(' ').collect();
        let (root, mountpoint) = (fields.get(3)?, fields.get(4)?);
        // Inside a cgroup namespace the mount's root is a prefix of our own path.
        let rel = own
            .strip_prefix(root)
            .unwrap_or(own)
            .trim_start_matches('/');
        return Some(Path::new(mountpoint).join(rel));
    }
    None
}

/// Removes cgroups left by a steward that died (SIGKILL, power cut), killing what is
/// still in them: their steps' runs were recorded as interrupted at restart.
fn sweep_leftovers(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("steward-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let alive = Path::new(&format!("/proc/{pid}")).exists();
        if !alive {
            let cg = StepCgroup { path: entry.path() };
            cg.kill();
            cg.remove_blocking(Duration::from_millis(500));
        }
    }
}

fn pool() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    POOL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Removes the kept empty cgroups; called as steward exits (a crash leaves them to the
/// next start's sweep).
pub fn release_all() {
    for path in pool().drain(..) {
        StepCgroup { path }.remove_blocking(Duration::ZERO);
    }
}

/// One step's cgroup.
#[derive(Debug)]
pub struct StepCgroup {
    path: PathBuf,
}

impl StepCgroup {
    /// A fresh cgroup for a step, or None where cgroups are not used (or creating one
    /// failed, which is logged: the step still runs, contained by its process group).
    pub fn create() -> Option<StepCgroup> {
        let Containment::Cgroup(base) = current() else {
            return None;
        };
        if let Some(path) = pool().pop() {
            return Some(StepCgroup { path });
        }
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let path = base.join(format!("steward-{}-{n}", std::process::id()));
        match std::fs::create_dir(&path) {
            Ok(()) => Some(StepCgroup { path }),
            Err(e) => {
                tracing::warn!(
                    "cannot create cgroup {}: {e}; this step is contained by its process group only",
                    path.display()
                );
                None
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The cgroup's folder, open, for `clone3(CLONE_INTO_CGROUP)`.
    pub fn open(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(&self.path)?;
        Ok(dir.into())
    }

    /// Moves a process (and so every child it starts from now on) into the cgroup.
    pub fn adopt(&self, pid: u32) -> std::io::Result<()> {
        std::fs::write(self.path.join("cgroup.procs"), pid.to_string())
    }

    /// SIGKILLs every process in the cgroup.
    pub fn kill(&self) {
        if std::fs::write(self.path.join("cgroup.kill"), "1").is_ok() {
            return;
        }
        // Kernels before 5.14 have no cgroup.kill: kill the members one by one.
        for _ in 0..10 {
            let pids = self.members();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    fn members(&self) -> Vec<i32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    fn empty(&self) -> bool {
        match std::fs::read_to_string(self.path.join("cgroup.events")) {
            Ok(events) => events.lines().any(|l| l == "populated 0"),
            Err(_) => self.members().is_empty(),
        }
    }

    /// Kills everything left in the cgroup, waits (at most `limit`) for the killed
    /// processes to be gone, and keeps the empty cgroup for a later step, unless it had to
    /// be killed: a cgroup once killed kills every process later started into it with
    /// `clone3` (seen on Linux 6.18), so it is removed instead.
    pub async fn finish(self, limit: Duration) {
        // The common case: the step and its children are gone already.
        let killed = !self.empty();
        if killed {
            self.kill();
        }
        let deadline = Instant::now() + limit;
        while !self.empty() {
            if Instant::now() >= deadline {
                tracing::warn!(
                    "processes in {} outlived SIGKILL for {limit:?}; leaving it",
                    self.path.display()
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if killed {
            self.remove_blocking(Duration::ZERO);
        } else {
            self.recycle();
        }
    }

    /// Keeps an empty cgroup for a later step (or removes it when enough are kept).
    pub fn recycle(self) {
        let mut pool = pool();
        if pool.len() < POOL_MAX {
            pool.push(self.path);
        } else {
            drop(pool);
            self.remove_blocking(Duration::ZERO);
        }
    }

    fn remove_blocking(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            match std::fs::remove_dir(&self.path) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(e) if Instant::now() >= deadline => {
                    tracing::warn!("cannot remove cgroup {}: {e}", self.path.display());
                    return;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }
}

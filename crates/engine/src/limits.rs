//! A step's resource caps — `memory_max`, `pids_max`, `cpu_weight` from its `[budget]` —
//! held by the kernel's cgroup controllers. Each capped step gets a cgroup of its own in
//! each controller it needs: on cgroup v2 where the controller is there to use, else in the
//! controller's cgroup v1 hierarchy (hosts that mount `memory`, `pids` and `cpu` as v1).
//! The child joins them itself, by writing `0` to each `cgroup.procs` opened for it, just
//! before its exec (see [`crate::process`]), so everything it forks is capped too.
//!
//! Only steps whose workflow sets a cap pay for this (joining a cgroup costs a kernel RCU
//! grace period, milliseconds).

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The caps of one step (none set: nothing to do).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Limits {
    /// Bytes of memory (RAM) the step's processes may use together.
    pub memory_max: Option<u64>,
    /// Processes (and threads) the step may have at once.
    pub pids_max: Option<u64>,
    /// CPU weight, 1–10000 (100 is the default share), when the CPU is contended.
    pub cpu_weight: Option<u32>,
}

impl Limits {
    pub fn any(&self) -> bool {
        self.memory_max.is_some() || self.pids_max.is_some() || self.cpu_weight.is_some()
    }

    /// `memory 64 MiB, 20 processes, CPU weight 50` (empty with no caps).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(bytes) = self.memory_max {
            parts.push(format!("memory {} MiB", bytes >> 20));
        }
        if let Some(n) = self.pids_max {
            parts.push(format!("{n} processes"));
        }
        if let Some(w) = self.cpu_weight {
            parts.push(format!("CPU weight {w}"));
        }
        parts.join(", ")
    }
}

/// One controller's folder for steward's steps, where it can be used.
#[derive(Debug, Clone)]
struct Controller {
    /// Steward's own cgroup in the controller's hierarchy.
    base: PathBuf,
}

/// Where the controller `name` (memory, pids, cpu) is mounted as cgroup v1, joined with
/// steward's own cgroup in it.
fn v1_controller(name: &str) -> Option<Controller> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut right = right.split(' ');
        if right.next() != Some("cgroup") {
            return None;
        }
        let superopts = right.nth(1)?;
        superopts.split(',').any(|o| o == name).then(|| {
            let fields: Vec<&str> = left.split(' ').collect();
            (fields.get(3).copied(), fields.get(4).copied())
        })
    })?;
    let (Some(root), Some(mountpoint)) = mount else {
        return None;
    };
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let own = cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers.split(',').any(|c| c == name).then_some(path)
    })?;
    let rel = own
        .strip_prefix(root)
        .unwrap_or(own)
        .trim_start_matches('/');
    let base = Path::new(mountpoint).join(rel);
    base.is_dir().then_some(Controller { base })
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// The cgroups holding one step's caps; removed when dropped (after the step ended).
#[derive(Debug)]
pub struct LimitGroups {
    dirs: Vec<PathBuf>,
    procs: Vec<OwnedFd>,
    memory: Option<PathBuf>,
}

/// A cap that cannot be held on this machine.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LimitError(String);

impl LimitGroups {
    /// Creates the cgroups for `limits` and opens their `cgroup.procs` for the child.
    pub fn create(limits: &Limits) -> Result<LimitGroups, LimitError> {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("steward-{}-limit-{n}", std::process::id());
        let mut groups = LimitGroups {
            dirs: Vec::new(),
            procs: Vec::new(),
            memory: None,
        };
        let mut wants: Vec<(&str, Vec<(&str, String)>)> = Vec::new();
        if let Some(bytes) = limits.memory_max {
            // Swap counts too where the host accounts for it, so swapping is no way out.
            wants.push((
                "memory",
                vec![
                    ("memory.limit_in_bytes", bytes.to_string()),
                    ("memory.memsw.limit_in_bytes", bytes.to_string()),
                ],
            ));
        }
        if let Some(pids) = limits.pids_max {
            wants.push(("pids", vec![("pids.max", pids.to_string())]));
        }
        if let Some(weight) = limits.cpu_weight {
            // cgroup v1 shares: 1024 is the default weight of 100.
            let shares = (u64::from(weight) * 1024 / 100).max(2);
            wants.push(("cpu", vec![("cpu.shares", shares.to_string())]));
        }
        for (controller, files) in wants {
            let Some(c) = v1_controller(controller) else {
                return Err(LimitError(format!(
                    "no {controller} controller that steward can use on this machine"
                )));
            };
            let dir = c.base.join(&name);
            std::fs::create_dir(&dir)
                .map_err(|e| LimitError(format!("cannot create {}: {e}", dir.display())))?;
            groups.dirs.push(dir.clone());
            for (i, (file, value)) in files.iter().enumerate() {
                let written = std::fs::write(dir.join(file), value);
                // The swap limit is optional (a host without swap accounting lacks it).
                if let (Err(e), 0) = (written, i) {
                    return Err(LimitError(format!("cannot set {file}: {e}")));
                }
            }
            let procs = std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.procs"))
                .map_err(|e| {
                    LimitError(format!("cannot open {}/cgroup.procs: {e}", dir.display()))
                })?;
            groups.procs.push(procs.into());
            if controller == "memory" {
                groups.memory = Some(dir);
            }
        }
        Ok(groups)
    }

    /// The `cgroup.procs` descriptors the child writes `0` into (close-on-exec).
    pub fn procs_fds(&self) -> Vec<RawFd> {
        self.procs.iter().map(|f| f.as_raw_fd()).collect()
    }

    /// Whether the kernel killed a process of the step for going over `memory_max`.
    pub fn memory_exhausted(&self) -> bool {
        let Some(dir) = &self.memory else {
            return false;
        };
        let text = std::fs::read_to_string(dir.join("memory.oom_control")).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 0)
    }
}

impl Drop for LimitGroups {
    fn drop(&mut self) {
        self.procs.clear();
        let dirs = std::mem::take(&mut self.dirs);
        // Empty once the step and its children are gone (the step's end killed them), but
        // the kernel may take a moment to say so: retried off the async threads.
        if dirs.iter().all(|d| std::fs::remove_dir(d).is_ok()) {
            return;
        }
        std::thread::spawn(move || {
            for _ in 0..100 {
                if dirs
                    .iter()
                    .all(|d| std::fs::remove_dir(d).is_ok() || !d.exists())
                {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        });
    }
}

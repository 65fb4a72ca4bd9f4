//! Starting a step: the program resolved against the step's PATH, fd 3 set to its
//! control pipe, straight into its cgroup where cgroups are used (see
//! [`crate::process`]), else with posix_spawn and a move into the cgroup right after.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use tokio::process::Command;

use crate::containment::StepCgroup;
use crate::process::{Launch, StepProcess};

/// What starts a step's process: [`Processes`] for real; a stand-in (such as
/// [`super::TestLauncher`]) where the supervisor's and the engine's rules are tested
/// without processes.
pub trait Launcher: Send + Sync {
    /// Starts the step: its process, the read end of its control pipe (its fd 3), and
    /// the cgroup it runs in, if any.
    fn spawn(&self, step: Spawn<'_>) -> std::io::Result<Spawned>;
}

/// A step to start: its argv, folder, whole environment, confinement, and the
/// `cgroup.procs` of its caps to join before its exec.
pub struct Spawn<'a> {
    pub argv: &'a [String],
    pub cwd: &'a Path,
    pub env: &'a [(String, String)],
    pub sandbox: crate::sandbox::ChildConfinement,
    pub join: &'a [RawFd],
}

/// A started step: its process, its control pipe's read end, its cgroup.
pub type Spawned = (StepProcess, OwnedFd, Option<StepCgroup>);

/// Real processes, started as [`crate::process`] says.
pub struct Processes;

impl Launcher for Processes {
    fn spawn(&self, step: Spawn<'_>) -> std::io::Result<Spawned> {
        spawn(step.argv, step.cwd, step.env, step.sandbox, step.join)
    }
}

fn spawn(
    argv: &[String],
    cwd: &Path,
    env: &[(String, String)],
    sandbox: crate::sandbox::ChildConfinement,
    join: &[RawFd],
) -> std::io::Result<Spawned> {
    let Some((program, args)) = argv.split_first() else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "empty command",
        ));
    };
    // Both ends are close-on-exec; only fd 3 crosses into the child.
    let (ctl_read, ctl_write) = std::io::pipe()?;
    let ctl_write_fd = ctl_write.as_raw_fd();
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str());
    let program = resolve_program(program, path);
    // Where steps get cgroups: straight into one (see `process`).
    let mut cgroup = StepCgroup::create();
    if let Some(cg) = cgroup.take() {
        match cg.open() {
            Ok(dir) => {
                let launch = Launch {
                    program: &program,
                    argv: std::iter::once(program.as_os_str().as_bytes())
                        .chain(args.iter().map(|a| a.as_bytes()))
                        .collect(),
                    env,
                    cwd,
                    control: ctl_write_fd,
                    sandbox,
                    join,
                };
                match crate::process::spawn_into_cgroup(&launch, &dir) {
                    Some(Ok(child)) => {
                        drop(ctl_write);
                        return Ok((child, OwnedFd::from(ctl_read), Some(cg)));
                    }
                    Some(Err(e)) => {
                        cg.recycle();
                        return Err(e);
                    }
                    None => cgroup = Some(cg),
                }
            }
            Err(e) => {
                tracing::warn!(
                    "cannot open cgroup {}: {e}; moving the step into it after it starts",
                    cg.path().display()
                );
                cgroup = Some(cg);
            }
        }
    }
    let mut cmd = Command::new(&program);
    cmd.args(args)
        .current_dir(cwd)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // A sandbox is applied between fork and exec, which posix_spawn cannot do.
    let join = join.to_vec();
    let cwd_c = std::ffi::CString::new(cwd.as_os_str().as_bytes()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a NUL byte in the step's folder",
        )
    })?;
    let child = match RESERVED_FD3
        .get()
        .filter(|_| sandbox.is_none() && join.is_empty())
    {
        // The fast path: std spawns with posix_spawn, which a pre_exec hook would turn
        // into a fork of this whole process (half the throughput). The control pipe is put
        // on our reserved fd 3 for the moment of the spawn, under a lock, so exactly this
        // child inherits it there.
        Some(placeholder) => {
            let _one_at_a_time = spawn_lock();
            // SAFETY: plain fd syscalls on descriptors this module owns (fd 3 is reserved).
            if unsafe { libc::dup2(ctl_write_fd, 3) } == -1 {
                return Err(std::io::Error::last_os_error());
            }
            let spawned = cmd.spawn();
            // SAFETY: as above; fd 3 goes back to /dev/null, close-on-exec.
            unsafe {
                libc::dup2(*placeholder, 3);
                libc::fcntl(3, libc::F_SETFD, libc::FD_CLOEXEC);
            }
            spawned
        }
        None => {
            // SAFETY: the closure only calls dup2, fcntl, prctl and landlock_restrict_self,
            // which are async-signal-safe, and touches no memory shared with the parent.
            unsafe {
                cmd.pre_exec(move || {
                    if ctl_write_fd == 3 {
                        if libc::fcntl(3, libc::F_SETFD, 0) == -1 {
                            return Err(std::io::Error::last_os_error());
                        }
                    } else if libc::dup2(ctl_write_fd, 3) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    crate::process::join_cgroups(&join)
                        .map_err(std::io::Error::from_raw_os_error)?;
                    crate::sandbox::restrict_self(sandbox, cwd_c.as_ptr())
                        .map_err(std::io::Error::from_raw_os_error)
                });
            }
            cmd.spawn()
        }
    };
    let child = match child {
        Ok(child) => StepProcess::from_tokio(child),
        Err(e) => {
            // A failed spawn leaves no cgroup in use.
            if let Some(cg) = cgroup {
                cg.recycle();
            }
            return Err(e);
        }
    };
    // The parent's write end must close now, or fd 3 never reaches EOF.
    drop(ctl_write);
    // Without clone3: moved into its cgroup just after it started (pid 0 would move
    // steward itself, but a child just spawned always has its pid).
    if let Some(cg) = cgroup.as_ref().filter(|_| child.pid > 0) {
        if let Err(e) = cg.adopt(child.pid) {
            tracing::warn!(
                "cannot move step {} into its cgroup: {e}; it is contained by its process group only",
                child.pid
            );
        }
    }
    Ok((child, OwnedFd::from(ctl_read), cgroup))
}

/// A /dev/null descriptor (not fd 3) that fd 3 is pointed back at between spawns; set
/// once [`reserve_control_fd`] holds fd 3 for steward.
static RESERVED_FD3: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
static SPAWN_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Held while starting any other child process, so none can inherit a step's control
/// pipe during the moment it sits on fd 3.
pub fn spawn_lock() -> std::sync::MutexGuard<'static, ()> {
    SPAWN_LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Called first thing in `main`: if fd 3 is free, steward keeps it (on /dev/null) so steps
/// can be started with posix_spawn and still find their control pipe on fd 3. If fd 3 is
/// already taken (inherited), steps fall back to a pre-exec dup.
pub fn reserve_control_fd() {
    use std::os::fd::IntoRawFd;
    let open = || std::fs::File::open("/dev/null").map(IntoRawFd::into_raw_fd);
    match open() {
        Ok(3) => {
            if let Ok(other) = open() {
                let _ = RESERVED_FD3.set(other);
            }
        }
        Ok(fd) => close_fd(fd), // fd 3 was taken: leave everything as it is

        Err(_) => {}
    }
}

fn close_fd(fd: i32) {
    use std::os::fd::FromRawFd;
    // SAFETY: `fd` was just opened by us and is owned by nobody else.
    drop(unsafe { std::fs::File::from_raw_fd(fd) });
}

/// A bare program name resolved against the step's PATH (std would otherwise fall back to
/// fork when PATH is set explicitly); a name with a `/`, or one not found, is left as is.
fn resolve_program(program: &str, path: Option<&str>) -> std::path::PathBuf {
    if program.contains('/') {
        return program.into();
    }
    for dir in path.unwrap_or("").split(':').filter(|d| !d.is_empty()) {
        let candidate = Path::new(dir).join(program);
        if let Ok(m) = std::fs::metadata(&candidate) {
            use std::os::unix::fs::PermissionsExt;
            if m.is_file() && m.permissions().mode() & 0o111 != 0 {
                return candidate;
            }
        }
    }
    program.into()
}

//! A step's child process, and the one way to start it that needs code of our own:
//! straight into its cgroup.
//!
//! Where steps get cgroups ([`crate::containment`]), a step is started with
//! `clone3(CLONE_INTO_CGROUP)`: it is in its cgroup from its first instruction, so nothing
//! it starts, however early, escapes the cgroup. Moving a process that is already running
//! (writing its pid to `cgroup.procs`) would also work, but each move waits for an RCU
//! grace period (7–20 ms measured on a small VM) while holding a lock that stalls every
//! fork on the machine, and it leaves a window before the move. The clone is done the way
//! `posix_spawn` does it (shared memory, its own small stack, the parent waiting until the
//! exec): a plain fork would copy steward's page tables and make every page it writes
//! afterwards fault once, which halved throughput. Elsewhere (no cgroups, a kernel before
//! 5.7, a CPU other than x86_64 or aarch64) the step is started by tokio's `Command`.
//!
//! Either way the step supervisor gets the same [`StepProcess`]: pid, pipes, wait, kill.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest};

pub type Input = Box<dyn AsyncWrite + Send + Unpin>;
pub type Output = Box<dyn AsyncRead + Send + Unpin>;

/// How the process itself ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exit code {c}"),
            Exit::Signal(s) => match nix::sys::signal::Signal::try_from(*s) {
                Ok(sig) => write!(f, "killed by {sig}"),
                Err(_) => write!(f, "killed by signal {s}"),
            },
        }
    }
}

/// A running step: its pid (also its process group id), its pipes, and how to wait for it.
pub struct StepProcess {
    pub pid: u32,
    pub stdin: Option<Input>,
    pub stdout: Option<Output>,
    pub stderr: Option<Output>,
    child: Child,
}

enum Child {
    Tokio(tokio::process::Child),
    Pidfd(PidfdChild),
}

impl StepProcess {
    /// A child started by tokio (its pipes taken out of it).
    pub fn from_tokio(mut child: tokio::process::Child) -> StepProcess {
        StepProcess {
            pid: child.id().unwrap_or(0),
            stdin: child.stdin.take().map(|s| Box::new(s) as Input),
            stdout: child.stdout.take().map(|s| Box::new(s) as Output),
            stderr: child.stderr.take().map(|s| Box::new(s) as Output),
            child: Child::Tokio(child),
        }
    }

    /// Waits for the process to exit and reaps it.
    pub async fn wait(&mut self) -> io::Result<Exit> {
        match &mut self.child {
            Child::Tokio(c) => c.wait().await.map(exit_of),
            Child::Pidfd(c) => c.wait().await,
        }
    }

    /// SIGKILLs the process itself (its group and cgroup are the caller's to sweep).
    pub fn start_kill(&mut self) {
        match &mut self.child {
            Child::Tokio(c) => {
                let _ = c.start_kill();
            }
            Child::Pidfd(c) => c.kill(),
        }
    }
}

fn exit_of(status: std::process::ExitStatus) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => Exit::Code(c),
        (None, Some(s)) => Exit::Signal(s),
        (None, None) => Exit::Code(-1),
    }
}

/// A child started by [`spawn_into_cgroup`], waited for through its pidfd.
struct PidfdChild {
    pid: libc::pid_t,
    pidfd: AsyncFd<OwnedFd>,
    reaped: bool,
}

impl PidfdChild {
    async fn wait(&mut self) -> io::Result<Exit> {
        loop {
            // A pidfd is readable once its process has exited.
            let mut ready = self.pidfd.readable().await?;
            match reap(ready.get_inner().as_raw_fd(), libc::WNOHANG)? {
                Some(exit) => {
                    self.reaped = true;
                    return Ok(exit);
                }
                None => ready.clear_ready(),
            }
        }
    }

    fn kill(&self) {
        if !self.reaped {
            // The pid cannot have been reused: the child is not reaped yet.
            // SAFETY: plain kill(2).
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }
}

/// `waitid` on a pidfd; None if the process has not exited (with WNOHANG).
fn reap(pidfd: RawFd, flags: libc::c_int) -> io::Result<Option<Exit>> {
    // SAFETY: siginfo_t is plain data; waitid fills it (or leaves si_pid 0).
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pidfd and a valid pointer to `info`.
    let rc = unsafe {
        libc::waitid(
            libc::P_PIDFD,
            pidfd as libc::id_t,
            &mut info,
            libc::WEXITED | flags,
        )
    };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: waitid succeeded, so the fields for a SIGCHLD are set.
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    Ok(Some(match info.si_code {
        libc::CLD_EXITED => Exit::Code(status),
        _ => Exit::Signal(status),
    }))
}

impl Drop for PidfdChild {
    /// Like tokio's `kill_on_drop`: a step whose supervisor is dropped dies, and is reaped
    /// off the async threads so no zombie stays behind.
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        self.kill();
        let Ok(fd) = self.pidfd.get_ref().try_clone() else {
            return;
        };
        std::thread::spawn(move || reap(fd.as_raw_fd(), 0));
    }
}

mod clone3;

pub use clone3::*;

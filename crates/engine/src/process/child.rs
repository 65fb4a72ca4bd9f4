//! A started step as steward holds it, whichever way it was started: its pid and pipes,
//! its wait and its kill (a pidfd where `clone3` started it, tokio's child elsewhere).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite};

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
    StandIn(Box<dyn StandIn>),
}

/// What stands in for a process in tests of the supervisor and the engine (a scripted
/// child, as watchexec's `TestChild`): something that ends, and can be killed.
pub trait StandIn: Send {
    /// Resolves when the stand-in has ended (called again after, it resolves at once).
    fn wait(&mut self) -> std::pin::Pin<Box<dyn std::future::Future<Output = Exit> + Send + '_>>;
    /// Ends it as a SIGKILL would.
    fn kill(&mut self);
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

    /// A child `clone3` started, waited for through its pidfd: its stdin, and its stdout
    /// and stderr.
    pub(super) fn from_pidfd(
        pid: libc::pid_t,
        pidfd: AsyncFd<OwnedFd>,
        [stdin]: [Input; 1],
        [stdout, stderr]: [Output; 2],
    ) -> StepProcess {
        StepProcess {
            pid: pid as u32,
            stdin: Some(stdin),
            stdout: Some(stdout),
            stderr: Some(stderr),
            child: Child::Pidfd(PidfdChild {
                pid,
                pidfd,
                reaped: false,
            }),
        }
    }

    /// A stand-in for a process: pid 0 (no process group to signal), its pipes as given.
    pub fn stand_in(
        stdin: Input,
        stdout: Output,
        stderr: Output,
        child: Box<dyn StandIn>,
    ) -> StepProcess {
        StepProcess {
            pid: 0,
            stdin: Some(stdin),
            stdout: Some(stdout),
            stderr: Some(stderr),
            child: Child::StandIn(child),
        }
    }

    /// Waits for the process to exit and reaps it.
    pub async fn wait(&mut self) -> io::Result<Exit> {
        match &mut self.child {
            Child::Tokio(c) => c.wait().await.map(exit_of),
            Child::Pidfd(c) => c.wait().await,
            Child::StandIn(c) => Ok(c.wait().await),
        }
    }

    /// SIGKILLs the process itself (its group and cgroup are the caller's to sweep).
    pub fn start_kill(&mut self) {
        match &mut self.child {
            Child::Tokio(c) => {
                let _ = c.start_kill();
            }
            Child::Pidfd(c) => c.kill(),
            Child::StandIn(c) => c.kill(),
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

/// A child started by [`super::spawn_into_cgroup`], waited for through its pidfd.
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
pub(super) fn reap(pidfd: RawFd, flags: libc::c_int) -> io::Result<Option<Exit>> {
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

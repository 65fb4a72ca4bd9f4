//! Starting a step straight into its cgroup: `clone3(CLONE_INTO_CGROUP)` the way
//! `posix_spawn` clones (shared memory, a small stack of its own, the parent waiting until
//! the exec), and the child's few steps before its exec.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::child::*;

/// The kernel's `struct clone_args` (the first 88 bytes, which include `cgroup`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Linux 5.7's flag (libc's constant is an overflowing `c_int`).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Set once `clone3` has proved unusable here (old kernel, seccomp), so it is not retried.
static UNSUPPORTED: AtomicBool = AtomicBool::new(false);

/// What a step is started with: the program (a path), its argv (the first entry is argv[0]),
/// its whole environment, its working folder and the descriptor that becomes its fd 3.
pub struct Launch<'a> {
    pub program: &'a Path,
    pub argv: Vec<&'a [u8]>,
    pub env: &'a [(String, String)],
    pub cwd: &'a Path,
    pub control: RawFd,
    /// The confinement the child applies just before exec.
    pub sandbox: crate::sandbox::ChildConfinement,
    /// `cgroup.procs` files the child joins (writes `0` into) before exec: its caps.
    pub join: &'a [RawFd],
}

/// Starts a step in the cgroup `cgroup` (an open cgroup v2 folder), in a process group of
/// its own, with piped stdin, stdout and stderr. None if `clone3` cannot be used on this
/// machine (the caller starts the step the other way); otherwise the spawn's result, with
/// the exec's own error (no such program, not executable) when it failed.
pub fn spawn_into_cgroup(launch: &Launch<'_>, cgroup: &OwnedFd) -> Option<io::Result<StepProcess>> {
    if UNSUPPORTED.load(Ordering::Relaxed) {
        return None;
    }
    match prepare(launch).and_then(|prepared| clone_and_exec(&prepared, launch, cgroup)) {
        Err(Clone3::Refused(e)) => {
            // Not there at all (before Linux 5.7, or filtered by seccomp): stop trying.
            // Anything else is this one cgroup's problem; the fallback will report it.
            let missing = matches!(
                e.raw_os_error(),
                Some(libc::ENOSYS | libc::EINVAL | libc::E2BIG | libc::EPERM | libc::EOPNOTSUPP)
            );
            if missing && !UNSUPPORTED.swap(true, Ordering::Relaxed) {
                tracing::warn!("clone3 into a cgroup is not available ({e}); steps are moved into their cgroups just after they start");
            }
            None
        }
        Err(Clone3::Failed(e)) => Some(Err(e)),
        Ok(p) => Some(Ok(p)),
    }
}

enum Clone3 {
    /// clone3 itself was refused: fall back.
    Refused(io::Error),
    /// The spawn failed for a reason of the step's own (bad program, no such folder).
    Failed(io::Error),
}

impl From<io::Error> for Clone3 {
    fn from(e: io::Error) -> Self {
        Clone3::Failed(e)
    }
}

/// Everything the child needs, built before the clone: the child may make system calls
/// only (it runs on a borrowed stack in memory other threads are using).
struct Prepared {
    program: CString,
    argv: Vec<CString>,
    env: Vec<CString>,
    cwd: CString,
}

fn cstring(bytes: &[u8]) -> Result<CString, Clone3> {
    CString::new(bytes).map_err(|_| {
        Clone3::Failed(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a NUL byte in the command, its environment or its folder",
        ))
    })
}

fn prepare(launch: &Launch<'_>) -> Result<Prepared, Clone3> {
    Ok(Prepared {
        program: cstring(launch.program.as_os_str().as_bytes())?,
        argv: launch
            .argv
            .iter()
            .map(|a| cstring(a))
            .collect::<Result<_, _>>()?,
        env: launch
            .env
            .iter()
            .map(|(k, v)| cstring(format!("{k}={v}").as_bytes()))
            .collect::<Result<_, _>>()?,
        cwd: cstring(launch.cwd.as_os_str().as_bytes())?,
    })
}

/// A pipe whose ends are both above fd 3 (so the child's dup2s onto 0–3 cannot clobber
/// one another) and close-on-exec.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = std::io::pipe()?;
    Ok((above_3(r.into())?, above_3(w.into())?))
}

fn above_3(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 3 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own; the result is ours.
    let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 4) };
    if new == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `new` was just returned by fcntl and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

fn clone_and_exec(
    p: &Prepared,
    launch: &Launch<'_>,
    cgroup: &OwnedFd,
) -> Result<StepProcess, Clone3> {
    let mut argv: Vec<*const libc::c_char> = p.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = p.env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let (stdin_r, stdin_w) = pipe()?;
    let (stdout_r, stdout_w) = pipe()?;
    let (stderr_r, stderr_w) = pipe()?;
    // Keep the control pipe clear of the dup2 targets too.
    let control_dup = if launch.control > 3 {
        None
    } else {
        // SAFETY: as in `above_3`; the duplicate is owned by `control_dup`.
        let fd = unsafe { libc::fcntl(launch.control, libc::F_DUPFD_CLOEXEC, 4) };
        if fd == -1 {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: `fd` was just returned by fcntl.
        Some(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let mut child = ChildPlan {
        program: p.program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: p.cwd.as_ptr(),
        fds: [
            stdin_r.as_raw_fd(),
            stdout_w.as_raw_fd(),
            stderr_w.as_raw_fd(),
            control_dup
                .as_ref()
                .map_or(launch.control, |d| d.as_raw_fd()),
        ],
        sandbox: launch.sandbox,
        join: join_fds(launch.join),
        errno: 0,
    };
    let mut stack = vec![0u8; CHILD_STACK];
    let base = stack.as_mut_ptr() as u64;
    // The kernel starts the child at `stack + stack_size`, which must be 16-byte aligned.
    let top = (base + CHILD_STACK as u64) & !15;
    let mut pidfd: RawFd = -1;
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP | (libc::CLONE_PIDFD | libc::CLONE_VM | libc::CLONE_VFORK) as u64,
        pidfd: &mut pidfd as *mut RawFd as u64,
        exit_signal: libc::SIGCHLD as u64,
        stack: base,
        stack_size: top - base,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: `args` names `stack`, which outlives the call, and `child` is a valid plan.
    let pid = unsafe { clone_child(&args, &mut child) };
    drop(stack);
    if pid < 0 {
        return Err(Clone3::Refused(io::Error::from_raw_os_error(-pid as i32)));
    }
    let pid = pid as libc::pid_t;
    // SAFETY: the child is gone from this memory (exec'd or exited); a volatile read, as
    // the compiler did not see it write.
    let errno = unsafe { std::ptr::read_volatile(&child.errno) };
    // SAFETY: CLONE_PIDFD stored a new descriptor (close-on-exec) for us in `pidfd`.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop((stdin_r, stdout_w, stderr_w, control_dup));
    if errno != 0 {
        // The exec (or the set-up before it) failed and the child exited: reap it.
        let _ = reap(pidfd.as_raw_fd(), 0);
        return Err(Clone3::Failed(io::Error::from_raw_os_error(errno)));
    }
    // SAFETY: an OwnedFd keeps its one descriptor open for as long as it is owned.
    let pidfd = unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) }
        .map_err(|e| Clone3::Failed(e.into_parts().1))?;
    let input = tokio::net::unix::pipe::Sender::from_owned_fd(stdin_w)?;
    let out = tokio::net::unix::pipe::Receiver::from_owned_fd(stdout_r)?;
    let err = tokio::net::unix::pipe::Receiver::from_owned_fd(stderr_r)?;
    Ok(StepProcess::from_pidfd(
        pid,
        pidfd,
        [Box::new(input)],
        [Box::new(out), Box::new(err)],
    ))
}

/// Clones the child: on a thread that carries its socket filter when one is idle (the
/// child inherits the filter rather than installing it, see
/// [`crate::sandbox::filtered`]), else on this one. Returns the child's pid, or -errno.
///
/// # Safety
/// As [`clone3_vfork`].
unsafe fn clone_child(args: &CloneArgs, child: &mut ChildPlan) -> isize {
    if let Some(filter) = child.sandbox.filter() {
        let own = child.sandbox;
        child.sandbox = own.with_filter_inherited();
        let mut job = (args as *const CloneArgs, child as *mut ChildPlan);
        let on_filtered = crate::sandbox::filtered::call(
            filter,
            clone_job,
            &mut job as *mut (*const CloneArgs, *mut ChildPlan) as *mut libc::c_void,
        );
        if let Some(pid) = on_filtered {
            return pid;
        }
        child.sandbox = own;
    }
    clone_blocking_signals(args, child)
}

/// [`clone_blocking_signals`] as a job for another thread: `job` points to the pair of
/// its arguments.
///
/// # Safety
/// As [`clone3_vfork`], with `job` a valid `(*const CloneArgs, *mut ChildPlan)`.
unsafe fn clone_job(job: *mut libc::c_void) -> isize {
    let (args, child) = *(job as *const (*const CloneArgs, *mut ChildPlan));
    clone_blocking_signals(&*args, &mut *child)
}

/// [`clone3_vfork`] with every signal blocked on this thread around it: no signal handler
/// may run in the child, which shares this memory (the child unblocks them once its
/// handlers are reset).
///
/// # Safety
/// As [`clone3_vfork`].
unsafe fn clone_blocking_signals(args: &CloneArgs, child: &mut ChildPlan) -> isize {
    // sigset_t is plain data, filled by sigfillset.
    let mut all: libc::sigset_t = std::mem::zeroed();
    let mut old: libc::sigset_t = std::mem::zeroed();
    libc::sigfillset(&mut all);
    libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    // The child runs `child_main` on its stack while this thread is suspended
    // (CLONE_VFORK) until it execs or exits; it reads `child`, which outlives the call,
    // and writes only `child.errno`.
    let pid = clone3_vfork(args, child as *mut ChildPlan as *mut libc::c_void);
    libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    pid
}

/// Most cgroups a child joins for its caps (memory, pids, cpu).
const MAX_JOIN: usize = 3;

fn join_fds(fds: &[RawFd]) -> [RawFd; MAX_JOIN] {
    let mut out = [-1; MAX_JOIN];
    for (slot, fd) in out.iter_mut().zip(fds) {
        *slot = *fd;
    }
    out
}

/// In a child before exec: joins each cgroup by writing `0` (this process) to its
/// `cgroup.procs`. Only system calls.
///
/// # Safety
/// Each descriptor is -1 or an open `cgroup.procs`.
pub unsafe fn join_cgroups(fds: &[RawFd]) -> Result<(), i32> {
    for &fd in fds.iter().filter(|fd| **fd >= 0) {
        if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
            return Err(*libc::__errno_location());
        }
    }
    Ok(())
}

/// The child's stack: it only wires descriptors, resets signals and execs.
const CHILD_STACK: usize = 64 << 10;

/// What the child reads (and, on failure, writes `errno` into) in the shared memory.
#[repr(C)]
struct ChildPlan {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    /// Become the child's fds 0, 1, 2 and 3; each is above 3.
    fds: [RawFd; 4],
    /// The confinement to apply just before exec.
    sandbox: crate::sandbox::ChildConfinement,
    /// `cgroup.procs` descriptors to join (-1: unused).
    join: [RawFd; MAX_JOIN],
    errno: libc::c_int,
}

/// `clone3` as `posix_spawn` uses it: the child shares this memory (CLONE_VM) and runs
/// `child_main(plan)` on its own stack while the parent waits (CLONE_VFORK), so nothing
/// of the parent is copied. Returns the child's pid, or -errno.
///
/// # Safety
/// `args` must name a stack of its own for the child, and `plan` a valid `ChildPlan`.
#[cfg(target_arch = "x86_64")]
unsafe fn clone3_vfork(args: &CloneArgs, plan: *mut libc::c_void) -> isize {
    let ret: isize;
    // The child starts after `syscall` on the new stack with the parent's registers: it
    // calls `child_main(plan)`, which never returns.
    std::arch::asm!(
        "syscall",
        "test rax, rax",
        "jnz 2f",
        "mov rdi, r12",
        "call r13",
        "ud2",
        "2:",
        inlateout("rax") libc::SYS_clone3 as isize => ret,
        in("rdi") args as *const CloneArgs,
        in("rsi") std::mem::size_of::<CloneArgs>(),
        in("r12") plan,
        in("r13") child_main as unsafe extern "C" fn(*mut libc::c_void) -> !,
        lateout("rcx") _,
        lateout("r11") _,
        options(nostack),
    );
    ret
}

#[cfg(target_arch = "aarch64")]
unsafe fn clone3_vfork(args: &CloneArgs, plan: *mut libc::c_void) -> isize {
    let ret: isize;
    std::arch::asm!(
        "svc 0",
        "cbnz x0, 2f",
        "mov x0, x19",
        "blr x20",
        "brk #0",
        "2:",
        inlateout("x0") args as *const CloneArgs => ret,
        in("x1") std::mem::size_of::<CloneArgs>(),
        in("x8") libc::SYS_clone3,
        in("x19") plan,
        in("x20") child_main as unsafe extern "C" fn(*mut libc::c_void) -> !,
        options(nostack),
    );
    ret
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
unsafe fn clone3_vfork(_args: &CloneArgs, _plan: *mut libc::c_void) -> isize {
    -(libc::ENOSYS as isize)
}

/// In the child: wire up fds 0–3, a process group of its own, default signal handling,
/// the working folder, its sandbox, then exec. Only system calls: this runs in the parent's memory.
unsafe extern "C" fn child_main(plan: *mut libc::c_void) -> ! {
    let plan = &mut *(plan as *mut ChildPlan);
    let fail = |plan: &mut ChildPlan| -> ! {
        plan.errno = *libc::__errno_location();
        if plan.errno == 0 {
            plan.errno = libc::EINVAL;
        }
        libc::_exit(127)
    };
    for (to, from) in plan.fds.into_iter().enumerate() {
        // dup2 clears close-on-exec on the copy; every source is above 3.
        if libc::dup2(from, to as RawFd) == -1 {
            fail(plan);
        }
    }
    if libc::setpgid(0, 0) == -1 {
        fail(plan);
    }
    // Handlers are steward's code: reset them before any signal can be taken here. Ignored
    // signals stay ignored across exec, so SIGPIPE (which Rust ignores) is reset too.
    for sig in 1..=libc::SIGRTMAX() {
        let mut sa: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut sa) == 0
            && (sa.sa_sigaction != libc::SIG_DFL && sa.sa_sigaction != libc::SIG_IGN
                || sig == libc::SIGPIPE)
        {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
    }
    let mut none: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut none);
    libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    if libc::chdir(plan.cwd) == -1 {
        fail(plan);
    }
    if join_cgroups(&plan.join).is_err() {
        fail(plan);
    }
    // Last, so everything above is done unconfined (but for a socket filter inherited from
    // the cloning thread, which refuses only sockets); the exec is already confined.
    if let Err(errno) = crate::sandbox::restrict_self(plan.sandbox, plan.cwd) {
        *libc::__errno_location() = errno;
        fail(plan);
    }
    libc::execve(plan.program, plan.argv, plan.envp);
    fail(plan)
}

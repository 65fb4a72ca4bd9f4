//! Mount namespaces made ahead, so a step does not pay for one while it starts.
//!
//! A step's namespace (see [`super::tmp`]) costs about 25 µs to copy from the host's mount
//! tree at `unshare` and about 50 µs to tear down when its last process exits; both
//! happened inside every confined step's start and end. Here one thread of steward's own
//! keeps a few fresh namespaces ready: it holds a *base* namespace — the host's mounts,
//! private, with the system's secrets masked — and copies it (`unshare` from inside it)
//! into namespaces that no process has entered yet, each held by a descriptor. A step's
//! child joins one with `setns`, mounts its private `/tmp` in it and execs; no namespace
//! ever serves two steps. When the step is over its descriptor is handed back to the
//! thread, which drops it, so the teardown happens off the step's path.
//!
//! The base is made again when the host's mounts change (`/proc/self/mountinfo` reports
//! it through `poll`) or the list of secrets does, so a step sees a mount made after the
//! daemon started. When the pool is empty (a burst of steps) or cannot be made, a step's
//! child makes its namespace itself, as before ([`super::tmp::enter`]): same result.
//! `STEWARD_SANDBOX_POOL=0` turns the pool off, to see and test that road.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

use super::system::Mask;

/// How many namespaces are kept ready.
const AHEAD: usize = 4;

/// A namespace made for one step. Dropping it hands it to the pool's thread to be
/// released there.
#[derive(Debug)]
pub struct Ready(Option<OwnedFd>);

impl Ready {
    pub fn fd(&self) -> RawFd {
        self.0.as_ref().map_or(-1, |f| f.as_raw_fd())
    }
}

impl Drop for Ready {
    fn drop(&mut self) {
        if let (Some(fd), Some(pool)) = (self.0.take(), POOL.get().and_then(Option::as_ref)) {
            pool.retire_all(vec![fd]);
        }
    }
}

/// A ready namespace with `masks` masked, or None when there is none right now (the
/// child makes its own). The first call starts the pool and waits for its first namespace
/// (a fraction of a millisecond), so the first step takes the same road as the rest.
/// When the host's mounts or the secrets changed since the ready ones were made, they are
/// dropped, the maker starts again from a new base, and this step makes its own.
pub fn take(masks: &'static [Mask]) -> Option<Ready> {
    let pool = POOL.get_or_init(|| start(masks)).as_ref()?;
    let (mut stock, _) = pool
        .stocked
        .wait_timeout_while(pool.lock(), std::time::Duration::from_secs(2), |s| {
            s.made == 0 && !s.stopped
        })
        .unwrap_or_else(|p| p.into_inner());
    // Only here is mountinfo polled: a poll reports a change once.
    if mounts_changed(&pool.mountinfo) || !std::ptr::eq(stock.masks, masks) {
        stock.generation += 1;
        stock.masks = masks;
        let stale = std::mem::take(&mut stock.ready);
        drop(stock);
        pool.retire_all(stale);
        pool.wake.notify_one();
        return None;
    }
    let fd = stock.ready.pop();
    drop(stock);
    pool.wake.notify_one();
    fd.map(|fd| Ready(Some(fd)))
}

struct Stock {
    ready: Vec<OwnedFd>,
    retired: Vec<OwnedFd>,
    /// The secrets the ready namespaces mask.
    masks: &'static [Mask],
    /// Counts the changes of the host's mounts or of `masks`: a namespace made from an
    /// older base is not kept.
    generation: u64,
    /// How many namespaces the maker has made.
    made: u64,
    /// The maker has stopped.
    stopped: bool,
}

struct Pool {
    stock: Mutex<Stock>,
    /// Wakes the thread: a namespace taken or retired, or the base is stale.
    wake: Condvar,
    /// Wakes the first taker: the first namespace is ready, or the thread stopped.
    stocked: Condvar,
    /// Wakes the releaser: namespaces retired.
    retire: Condvar,
    /// The host's `mountinfo`, polled for changes.
    mountinfo: OwnedFd,
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, Stock> {
        self.stock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands namespaces to the releaser; past `MAX_RETIRED` waiting (it cannot keep up),
    /// they are released here instead.
    fn retire_all(&self, fds: Vec<OwnedFd>) {
        if fds.is_empty() {
            return;
        }
        let mut stock = self.lock();
        if stock.retired.len() >= MAX_RETIRED {
            drop(stock);
            drop(fds);
            return;
        }
        stock.retired.extend(fds);
        self.retire.notify_one();
    }
}

/// Most retired namespaces waiting for the releaser.
const MAX_RETIRED: usize = 256;

static POOL: OnceLock<Option<Pool>> = OnceLock::new();

fn start(masks: &'static [Mask]) -> Option<Pool> {
    if std::env::var("STEWARD_SANDBOX_POOL").as_deref() == Ok("0") {
        return None;
    }
    // The process's mountinfo: its main thread's, which stays in the host's namespace.
    let mountinfo = match open(c"/proc/self/mountinfo") {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!("mount namespaces are not made ahead (cannot watch the mounts: {e}); each confined step makes its own");
            return None;
        }
    };
    // Read once so the first poll reports only later changes.
    mounts_changed(&mountinfo);
    let maker = thread("steward-mntns", |pool| {
        if let Err(e) = keep(pool) {
            tracing::warn!(
                "mount namespaces are no longer made ahead ({e}); each confined step makes its own"
            );
            let stale = {
                let mut stock = pool.lock();
                stock.stopped = true;
                pool.stocked.notify_all();
                std::mem::take(&mut stock.ready)
            };
            pool.retire_all(stale);
        }
    });
    let releaser = maker.and_then(|()| thread("steward-mntns-free", release));
    match releaser {
        Ok(()) => Some(Pool {
            stock: Mutex::new(Stock {
                ready: Vec::new(),
                retired: Vec::new(),
                masks,
                generation: 0,
                made: 0,
                stopped: false,
            }),
            wake: Condvar::new(),
            stocked: Condvar::new(),
            retire: Condvar::new(),
            mountinfo,
        }),
        Err(e) => {
            tracing::warn!("cannot start the threads that make mount namespaces ahead: {e}");
            None
        }
    }
}

/// Starts a thread of the pool's, running `work` once the pool exists.
fn thread(name: &str, work: fn(&'static Pool)) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || loop {
            // The static is set once `start` returns; wait for it.
            match POOL.get() {
                Some(Some(pool)) => return work(pool),
                Some(None) => return,
                None => std::thread::yield_now(),
            }
        })
        .map(drop)
}

/// Releases retired namespaces. Each release waits out an RCU grace period (most of a
/// millisecond here, asleep): on a thread of its own, it neither delays a step nor keeps
/// the maker from refilling.
fn release(pool: &'static Pool) {
    loop {
        let retired = {
            let mut stock = pool.lock();
            while stock.retired.is_empty() {
                stock = pool.retire.wait(stock).unwrap_or_else(|p| p.into_inner());
            }
            std::mem::take(&mut stock.retired)
        };
        drop(retired);
    }
}

/// The maker's thread: keeps `AHEAD` namespaces ready, from a base of the current
/// generation. Runs for the life of the process, unless a system call fails.
fn keep(pool: &Pool) -> std::io::Result<()> {
    // A thread may change its mount namespace only once its filesystem context (root,
    // working folder) is its own, not shared with steward's other threads.
    // SAFETY: a plain system call on a constant; only this thread is affected.
    if unsafe { libc::unshare(libc::CLONE_FS) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    // This thread starts in the host's namespace; it keeps a way back to it.
    let host = open(c"/proc/thread-self/ns/mnt")?;
    let mut base: Option<Base> = None;
    loop {
        let (generation, masks) = {
            let mut stock = pool.lock();
            let current = |s: &Stock| base.as_ref().is_some_and(|b| b.generation == s.generation);
            while stock.ready.len() >= AHEAD && current(&stock) {
                stock = pool.wake.wait(stock).unwrap_or_else(|p| p.into_inner());
            }
            (stock.generation, stock.masks)
        };
        if base.as_ref().is_none_or(|b| b.generation != generation) {
            base = Some(Base::make(&host, masks, generation)?);
        }
        let fresh = base.as_ref().map(Base::copy).transpose()?;
        let mut stock = pool.lock();
        match fresh {
            Some(fd) if stock.generation == generation => {
                stock.ready.push(fd);
                stock.made += 1;
                if stock.made == 1 {
                    pool.stocked.notify_all();
                }
            }
            // Made from a base that went stale meanwhile.
            stale => {
                drop(stock);
                pool.retire_all(stale.into_iter().collect());
            }
        }
    }
}

/// The namespace every step's is copied from, with the secrets masked in it.
struct Base {
    fd: OwnedFd,
    generation: u64,
}

impl Base {
    /// From the host's namespace: a copy, private, with `masks` masked.
    fn make(host: &OwnedFd, masks: &'static [Mask], generation: u64) -> std::io::Result<Base> {
        enter(host)?;
        // SAFETY: this thread's own namespace; the masks outlive the call.
        if unsafe { super::tmp::enter(std::ptr::null(), masks.as_ptr(), masks.len()) } == -1 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Base {
            fd: open(c"/proc/thread-self/ns/mnt")?,
            generation,
        })
    }

    /// A fresh namespace copied from the base, entered by no process yet.
    fn copy(&self) -> std::io::Result<OwnedFd> {
        enter(&self.fd)?;
        // SAFETY: a plain system call on a constant.
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } == -1 {
            return Err(std::io::Error::last_os_error());
        }
        open(c"/proc/thread-self/ns/mnt")
    }
}

fn enter(ns: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: a namespace descriptor we hold; only this thread's namespace changes.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNS) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn open(path: &std::ffi::CStr) -> std::io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated path; the descriptor returned is ours.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd == -1 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just opened, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether the host's mounts changed since the last call (the kernel flags an open
/// `mountinfo` with POLLPRI when they do, and clears the flag as it reports it).
fn mounts_changed(mountinfo: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: mountinfo.as_raw_fd(),
        events: libc::POLLPRI,
        revents: 0,
    };
    // SAFETY: one pollfd on this stack; no wait.
    unsafe { libc::poll(&mut p, 1, 0) > 0 && p.revents & (libc::POLLPRI | libc::POLLERR) != 0 }
}

/// In a step's child: joins the namespace `ns`, goes back to `cwd` (joining one moves a
/// process to its root) and mounts `tmp` (when not null) over `/tmp`. 0, or -1 with
/// errno set. Only system calls.
///
/// # Safety
/// Call only in a freshly cloned child that shares no filesystem context; `cwd` and `tmp`
/// are null or NUL-terminated paths.
pub unsafe fn join(ns: RawFd, cwd: *const libc::c_char, tmp: *const libc::c_char) -> libc::c_int {
    if libc::setns(ns, libc::CLONE_NEWNS) == -1 {
        return -1;
    }
    if !cwd.is_null() && libc::chdir(cwd) == -1 {
        return -1;
    }
    super::tmp::mount_tmp(tmp)
}

//! Threads that carry a step's socket filter already installed, so a child cloned from
//! one inherits the filter rather than installing it. Installing costs about 50 µs a step
//! whatever the program's size (the kernel allocates and compiles it, and frees it when the
//! step exits); inheriting costs a reference count. A seccomp filter, like the
//! no-new-privileges flag it needs, belongs to a thread and passes to every child cloned
//! from it, so such a thread is fit for nothing but cloning confined children.
//!
//! Each filter ([`super::net::filter`]) gets up to [`PER_FILTER`] threads, started when
//! first wanted. A clone goes to an idle one; when none is idle (or one could not be made),
//! the caller clones on its own thread and the child installs the filter itself: the same
//! confinement either way. `STEWARD_SANDBOX_POOL=0` turns these threads off, with the
//! namespaces made ahead, to see and test that road.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, sync_channel, Sender, SyncSender};
use std::sync::{Arc, Mutex};

use super::net::Filter;

/// Threads kept for one filter: one per concurrent spawn a 2-core machine sees.
pub const PER_FILTER: usize = 2;

/// A function to run on a filtered thread, and its argument.
struct Job {
    f: unsafe fn(*mut libc::c_void) -> isize,
    arg: *mut libc::c_void,
    reply: SyncSender<isize>,
}

// SAFETY: `arg` is used only while the caller waits for the reply, so what it points to
// outlives the use; the caller's promise (see `call`).
unsafe impl Send for Job {}

struct Worker {
    /// The filter this thread carries, by address (filters live for good).
    filter: usize,
    busy: AtomicBool,
    jobs: Mutex<Sender<Job>>,
}

/// The workers made so far, and the filters none could be made for.
#[derive(Default)]
struct Workers {
    list: Vec<Arc<Worker>>,
    refused: Vec<usize>,
}

static WORKERS: Mutex<Workers> = Mutex::new(Workers {
    list: Vec::new(),
    refused: Vec::new(),
});

/// Runs `f(arg)` on an idle thread that carries `filter`, and returns what it returned;
/// None when there is none (run it on this thread, and install the filter in the child).
///
/// # Safety
/// `f` must be safe to call with `arg` on another thread while this one waits.
pub unsafe fn call(
    filter: &'static Filter,
    f: unsafe fn(*mut libc::c_void) -> isize,
    arg: *mut libc::c_void,
) -> Option<isize> {
    if std::env::var("STEWARD_SANDBOX_POOL").as_deref() == Ok("0") {
        return None;
    }
    let worker = idle(filter)?;
    let (reply, answer) = sync_channel(1);
    let sent = worker
        .jobs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send(Job { f, arg, reply });
    let result = sent.ok().and_then(|()| answer.recv().ok());
    worker.busy.store(false, Ordering::Release);
    result
}

/// An idle worker for `filter`, claimed; a new one while there are fewer than
/// [`PER_FILTER`].
fn idle(filter: &'static Filter) -> Option<Arc<Worker>> {
    let key = filter as *const Filter as usize;
    let mut workers = WORKERS.lock().unwrap_or_else(|p| p.into_inner());
    if workers.refused.contains(&key) {
        return None;
    }
    let mut mine = workers.list.iter().filter(|w| w.filter == key);
    if let Some(w) = mine.clone().find(|w| {
        w.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }) {
        return Some(Arc::clone(w));
    }
    if mine.by_ref().count() >= PER_FILTER {
        return None;
    }
    match start(filter) {
        Ok(worker) => {
            workers.list.push(Arc::clone(&worker));
            Some(worker)
        }
        Err(e) => {
            tracing::warn!("confined steps install their socket filter themselves: cannot keep a thread that carries it ({e})");
            workers.refused.push(key);
            None
        }
    }
}

/// A worker thread with `filter` installed, claimed for its first job.
fn start(filter: &'static Filter) -> std::io::Result<Arc<Worker>> {
    let (jobs, inbox) = channel::<Job>();
    let (ready, installed) = sync_channel(1);
    std::thread::Builder::new()
        .name("steward-seccomp".into())
        .spawn(move || {
            // SAFETY: prctl and seccomp on constants and a filter that lives for good;
            // they restrict this thread only, which does nothing but run jobs.
            let status = unsafe {
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == -1
                    || libc::syscall(
                        libc::SYS_seccomp,
                        libc::SECCOMP_SET_MODE_FILTER,
                        0u32,
                        &filter.fprog,
                    ) == -1
                {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(())
                }
            };
            let ok = status.is_ok();
            let _ = ready.send(status);
            if !ok {
                return;
            }
            for job in inbox {
                // SAFETY: the caller of `call` vouched for `f` and `arg`.
                let result = unsafe { (job.f)(job.arg) };
                let _ = job.reply.send(result);
            }
        })?;
    installed
        .recv()
        .map_err(|_| std::io::Error::other("the thread ended before installing the filter"))??;
    Ok(Arc::new(Worker {
        filter: filter as *const Filter as usize,
        busy: AtomicBool::new(true),
        jobs: Mutex::new(jobs),
    }))
}

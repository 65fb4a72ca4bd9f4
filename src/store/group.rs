//! Group commit: concurrent runs share the store's flushes. A flush asked for while
//! another is under way waits for it, and then — its write came after that flush began —
//! for the next one, which one of the waiters makes for all who asked meanwhile. An idle
//! store flushes at once: no added latency, and no thread of its own.
//!
//! A flush blocks its caller for as long as the disk takes. Called on one of the async
//! runtime's workers (an operator's command, a trigger's record), it first hands that
//! worker's other tasks to another thread ([`off_runtime`]), so a slow disk does not stall
//! the triggers and the control socket; a run's own durable points go to the blocking pool.

use std::sync::{Condvar, Mutex};

/// The flushes asked for and made, shared by every handle on one store.
#[derive(Default)]
pub struct GroupFlush {
    state: Mutex<State>,
    done: Condvar,
}

#[derive(Default)]
struct State {
    /// Flushes asked for so far; each asker's number is its place.
    asked: u64,
    /// Every asker up to this number has its writes on disk.
    flushed: u64,
    /// A flush is under way.
    flushing: bool,
}

impl GroupFlush {
    #[cfg(test)]
    fn asked(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).asked
    }

    /// Returns once everything written before the call is on disk, by `flush` made here
    /// or by another caller's. An error is the caller's own flush's: one that failed for
    /// a group makes each of its waiters try again itself.
    pub fn flush<E>(&self, flush: impl Fn() -> Result<(), E>) -> Result<(), E> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.asked += 1;
        let mine = s.asked;
        loop {
            if s.flushed >= mine {
                return Ok(());
            }
            if !s.flushing {
                s.flushing = true;
                let covers = s.asked;
                drop(s);
                let made = flush();
                s = self.state.lock().unwrap_or_else(|p| p.into_inner());
                s.flushing = false;
                if made.is_ok() {
                    s.flushed = s.flushed.max(covers);
                }
                self.done.notify_all();
                made?;
                continue;
            }
            s = self.done.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Runs `f`, which blocks, where it cannot hold up other tasks: on a worker of a
/// multi-threaded runtime through `block_in_place`; elsewhere (a blocking-pool thread, a
/// plain thread, a single-threaded runtime such as a CLI command's) as it is.
pub fn off_runtime<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    let on_workers =
        Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread);
    if on_workers {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Barrier};

    #[test]
    fn an_idle_caller_flushes_at_once_and_each_caller_is_covered() {
        let group = GroupFlush::default();
        let made = AtomicU64::new(0);
        for _ in 0..3 {
            group
                .flush(|| {
                    made.fetch_add(1, Ordering::SeqCst);
                    Ok::<(), ()>(())
                })
                .unwrap();
        }
        assert_eq!(made.load(Ordering::SeqCst), 3, "one flush per lone caller");
    }

    #[test]
    fn callers_arriving_during_a_flush_share_the_next_one() {
        let group = Arc::new(GroupFlush::default());
        let made = Arc::new(AtomicU64::new(0));
        let callers = 16;
        let start = Arc::new(Barrier::new(callers));
        let threads: Vec<_> = (0..callers)
            .map(|_| {
                let (group, made, start) = (group.clone(), made.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    group
                        .flush(|| {
                            // The first flush lasts until every caller has asked: a slow
                            // disk, with all the others gathered behind it.
                            if made.fetch_add(1, Ordering::SeqCst) == 0 {
                                let deadline =
                                    std::time::Instant::now() + std::time::Duration::from_secs(30);
                                while group.asked() < callers as u64
                                    && std::time::Instant::now() < deadline
                                {
                                    std::thread::yield_now();
                                }
                            }
                            Ok::<(), ()>(())
                        })
                        .unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // The first, and one for the fifteen that asked while it ran.
        assert_eq!(made.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_failed_flush_is_its_callers_error_and_the_next_caller_flushes_again() {
        let group = GroupFlush::default();
        let fail = std::sync::atomic::AtomicBool::new(true);
        let tried = AtomicU64::new(0);
        let flush = || {
            tried.fetch_add(1, Ordering::SeqCst);
            if fail.swap(false, Ordering::SeqCst) {
                Err("disk")
            } else {
                Ok(())
            }
        };
        assert_eq!(group.flush(flush), Err("disk"));
        assert_eq!(group.flush(flush), Ok(()));
        assert_eq!(tried.load(Ordering::SeqCst), 2);
    }
}

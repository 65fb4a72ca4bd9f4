//! Group commit: concurrent runs share the store's flushes. A flush asked for while
//! another is under way waits for it, and then — its write came after that flush began —
//! for the next one, which one of the waiters makes for all who asked meanwhile. An idle
//! store flushes at once: no added latency, and no thread of its own.
//!
//! A flush is short beside a run (0.2 ms against milliseconds), so runs seldom meet at
//! one by chance. When several other runs are in flight, the one about to flush waits up
//! to [`GATHER`] for them to ask too (PostgreSQL's `commit_delay` among
//! `commit_siblings`), and no longer once all of them have asked.
//!
//! A flush blocks its caller for as long as the disk takes. Called on one of the async
//! runtime's workers (an operator's command, a trigger's record), it first hands that
//! worker's other tasks to another thread ([`off_runtime`]), so a slow disk does not stall
//! the triggers and the control socket; a run's own durable points go to the blocking pool.

use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// The longest a flush waits for other runs to ask for it too.
pub const GATHER: Duration = Duration::from_micros(500);
/// How many other runs must be in flight before a flush waits for them.
pub const GATHER_AMONG: usize = 2;

/// The flushes asked for and made, shared by every handle on one store.
pub struct GroupFlush {
    state: Mutex<State>,
    done: Condvar,
    /// How long a flush waits for the other runs in flight ([`GATHER`]).
    gather: Duration,
}

impl Default for GroupFlush {
    fn default() -> Self {
        GroupFlush {
            state: Mutex::default(),
            done: Condvar::default(),
            gather: GATHER,
        }
    }
}

#[derive(Default)]
struct State {
    /// Flushes asked for so far; each asker's number is its place.
    asked: u64,
    /// Every asker up to this number has its writes on disk.
    flushed: u64,
    /// A flush is under way (or about to be: its maker is gathering askers).
    flushing: bool,
    /// The flush about to be made is waiting for askers (each new one wakes it).
    gathering: bool,
}

impl GroupFlush {
    #[cfg(test)]
    fn asked(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).asked
    }

    /// Returns once everything written before the call is on disk, by `flush` made here
    /// or by another caller's. An error is the caller's own flush's: one that failed for
    /// a group makes each of its waiters try again itself. `others`: how many other runs
    /// are in flight; with [`GATHER_AMONG`] or more, the flush made here waits for them to
    /// ask (see above).
    pub fn flush_among<E>(
        &self,
        others: usize,
        flush: impl Fn() -> Result<(), E>,
    ) -> Result<(), E> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.asked += 1;
        let mine = s.asked;
        if s.gathering {
            self.done.notify_all(); // the one gathering counts this asker
        }
        loop {
            if s.flushed >= mine {
                return Ok(());
            }
            if !s.flushing {
                s.flushing = true;
                if others >= GATHER_AMONG {
                    s = self.gather(s, others);
                }
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

    /// Waits, up to the gathering window, until `others` more have asked since the last flush.
    fn gather<'a>(
        &self,
        mut s: std::sync::MutexGuard<'a, State>,
        others: usize,
    ) -> std::sync::MutexGuard<'a, State> {
        s.gathering = true;
        let (mut s, _) = self
            .done
            .wait_timeout_while(s, self.gather, |s| s.asked - s.flushed <= others as u64)
            .unwrap_or_else(|p| p.into_inner());
        s.gathering = false;
        s
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
                .flush_among(0, || {
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
                        .flush_among(0, || {
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
        assert_eq!(group.flush_among(0, flush), Err("disk"));
        assert_eq!(group.flush_among(0, flush), Ok(()));
        assert_eq!(tried.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn with_others_in_flight_a_flush_waits_for_them_and_makes_one_for_all() {
        // A window far longer than the test: the flush is made once all four have asked.
        let group = Arc::new(GroupFlush {
            gather: std::time::Duration::from_secs(60),
            ..GroupFlush::default()
        });
        let made = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (group, made) = (group.clone(), made.clone());
                std::thread::spawn(move || {
                    group
                        .flush_among(3, || {
                            made.fetch_add(1, Ordering::SeqCst);
                            Ok::<(), ()>(())
                        })
                        .unwrap();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(made.load(Ordering::SeqCst), 1, "one flush for the four");
    }

    #[test]
    fn a_flush_waits_no_longer_than_its_window_for_others_that_do_not_ask() {
        let group = GroupFlush::default();
        let made = AtomicU64::new(0);
        let asked = std::time::Instant::now();
        group
            .flush_among(5, || {
                made.fetch_add(1, Ordering::SeqCst);
                Ok::<(), ()>(())
            })
            .unwrap();
        assert_eq!(made.load(Ordering::SeqCst), 1);
        assert!(asked.elapsed() >= GATHER, "it waited for the others first");
    }

    #[test]
    fn with_fewer_others_than_gather_among_a_flush_is_made_at_once() {
        // A window that would hang the test if it were waited out.
        let group = GroupFlush {
            gather: std::time::Duration::from_secs(3600),
            ..GroupFlush::default()
        };
        let made = AtomicU64::new(0);
        group
            .flush_among(GATHER_AMONG - 1, || {
                made.fetch_add(1, Ordering::SeqCst);
                Ok::<(), ()>(())
            })
            .unwrap();
        assert_eq!(made.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_flush_on_the_only_runtime_worker_lets_other_tasks_run_meanwhile() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let told = rt.block_on(async move {
            let flushing = tokio::spawn(async move {
                // The "flush" blocks until another task of the same runtime has run.
                off_runtime(|| rx.recv_timeout(std::time::Duration::from_secs(30)).is_ok())
            });
            tokio::task::yield_now().await;
            tokio::spawn(async move {
                let _ = tx.send(());
            });
            flushing.await.unwrap()
        });
        assert!(told, "the other task never ran while the flush blocked");
    }

    #[test]
    fn off_a_runtime_a_flush_runs_where_it_is_called() {
        let caller = std::thread::current().id();
        assert_eq!(off_runtime(|| std::thread::current().id()), caller);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(
            rt.block_on(async { off_runtime(|| std::thread::current().id()) }),
            caller
        );
    }
}

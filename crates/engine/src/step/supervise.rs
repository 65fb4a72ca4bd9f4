//! One step from start to end, as a state machine in the watchexec manner: each
//! [`StepState`] holds what that stage needs, and [`run_step`] moves it on until the
//! step is [`StepState::Finished`].
//!
//! ```text
//! Pending ──► Running ──► Stopping ──► Draining ──► Finished
//!    └──────────────────────────────────────────────────┘ (it could not start)
//! ```

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::launch::Spawn;
use super::outcome::{Ending, StepOutcome};
use super::pipes::{read_capped, read_control};
use super::request::{Metered, Metering, StepRequest};
use crate::budget::{Breach, BudgetGuard};
use crate::containment::StepCgroup;
use crate::control::{self, Message};
use crate::limits::LimitGroups;
use crate::process::{Exit, StepProcess};

/// How much of stdout is kept (the rest is drained and dropped).
pub const STDOUT_CAP: usize = 1 << 20;
/// How much of the end of stderr is kept.
pub const STDERR_TAIL: usize = 16 << 10;

/// Where a step stands.
enum StepState {
    /// Not started yet.
    Pending,
    /// Its process runs, watched until it exits, breaches a cap, stalls, times out or
    /// is cancelled.
    Running(Box<Running>),
    /// It ended as `ending` says: what is left of its group is stopped and swept.
    Stopping {
        running: Box<Running>,
        ending: Ending,
    },
    /// Its group is gone: what it wrote just before (control lines, metered charges,
    /// output) is read, for a while.
    Draining(Box<Running>),
    /// Done (or it never started).
    Finished(StepOutcome),
}

/// A started step: its process, the readers of its pipes, and what must die with it.
struct Running {
    child: StepProcess,
    pgid: Option<Pid>,
    contained: Contained,
    limit_groups: Option<LimitGroups>,
    /// A confined step (and all it starts) may not command the daemon over its socket
    /// while this is held.
    _confined: Option<crate::sandbox::Registration>,
    activity: Arc<Notify>,
    stdout: Option<JoinHandle<Vec<u8>>>,
    stderr: Option<JoinHandle<Vec<u8>>>,
    control: mpsc::Receiver<Result<Message, control::ParseError>>,
    control_reader: JoinHandle<()>,
    control_open: bool,
    metered: Option<Metered>,
    out: StepOutcome,
}

/// What watching and stopping a running step go by, from its request.
struct Rules {
    timeout: Option<Duration>,
    stall_timeout: Option<Duration>,
    kill_grace: Duration,
    cancel: CancellationToken,
    memory_max: Option<u64>,
}

/// Runs one step to its end. `guard` is the attempt's budget (None for commit).
pub async fn run_step(
    mut req: StepRequest<'_>,
    mut guard: Option<&mut BudgetGuard>,
) -> StepOutcome {
    let started = Instant::now();
    let rules = Rules {
        timeout: req.timeout,
        stall_timeout: req.stall_timeout,
        kill_grace: req.kill_grace,
        cancel: req.cancel.clone(),
        memory_max: req.limits.memory_max,
    };
    let mut state = StepState::Pending;
    loop {
        state = match state {
            StepState::Pending => start(&mut req, started),
            StepState::Running(mut running) => {
                let ending = running.watch(&rules, &mut guard, started).await;
                StepState::Stopping { running, ending }
            }
            StepState::Stopping {
                mut running,
                ending,
            } => {
                running.stop(&rules, ending).await;
                StepState::Draining(running)
            }
            StepState::Draining(mut running) => {
                running.drain(&mut guard).await;
                let mut out = std::mem::replace(&mut running.out, StepOutcome::new(Ending::Exited));
                out.duration = started.elapsed();
                StepState::Finished(out)
            }
            StepState::Finished(out) => return out,
        }
    }
}

/// A step that could not start, with how long trying took.
fn not_started(why: String, started: Instant) -> StepState {
    let mut out = StepOutcome::new(Ending::SpawnFailed(why));
    out.duration = started.elapsed();
    StepState::Finished(out)
}

/// Makes the step's cgroups for its caps, starts its process in them, and starts reading
/// its pipes (the context written to its stdin meanwhile).
fn start(req: &mut StepRequest<'_>, started: Instant) -> StepState {
    if req.cancel.is_cancelled() {
        return StepState::Finished(StepOutcome::new(Ending::Cancelled));
    }
    let limit_groups = if req.limits.any() {
        match LimitGroups::create(&req.limits) {
            Ok(groups) => Some(groups),
            Err(e) => {
                return not_started(
                    format!(
                        "cannot hold the [budget] caps (memory_max, pids_max, cpu_weight): {e}"
                    ),
                    started,
                )
            }
        }
    } else {
        None
    };
    let join = limit_groups
        .as_ref()
        .map(|g| g.procs_fds())
        .unwrap_or_default();
    let confinement = req
        .sandbox
        .map_or(crate::sandbox::ChildConfinement::NONE, |s| s.child());
    let (mut child, control_fd, cgroup) = match req.launcher.spawn(Spawn {
        argv: req.argv,
        cwd: req.cwd,
        env: req.env,
        sandbox: confinement,
        join: &join,
    }) {
        Ok(spawned) => spawned,
        Err(e) => {
            let program = req.argv.first().map(String::as_str).unwrap_or("");
            return not_started(format!("cannot start {program}: {e}"), started);
        }
    };
    // The group id is the child's pid (it was started in a process group of its own).
    // Never 0: killpg(0) would signal steward's own group.
    let pgid = (child.pid > 0).then(|| Pid::from_raw(child.pid as i32));
    let confined = req
        .sandbox
        .map(|_| crate::sandbox::register(cgroup.as_ref().map(|c| c.path()), child.pid as i32));
    // Should this future be dropped before the step ends (a runtime shutting down), the
    // group and cgroup still die with it, not only the child's own pid.
    let contained = Contained { pgid, cgroup };
    let activity = Arc::new(Notify::new());
    if let Some(mut stdin) = child.stdin.take() {
        let bytes = std::mem::take(&mut req.stdin);
        tokio::spawn(async move {
            // A step that never reads its stdin is fine: ignore EPIPE.
            let _ = stdin.write_all(&bytes).await;
        });
    }
    let stdout = child
        .stdout
        .take()
        .map(|s| tokio::spawn(read_capped(s, STDOUT_CAP, false, activity.clone())));
    let stderr = child
        .stderr
        .take()
        .map(|s| tokio::spawn(read_capped(s, STDERR_TAIL, true, activity.clone())));
    let (control_tx, control) = mpsc::channel(256);
    let control_reader = tokio::spawn(read_control(control_fd, control_tx, activity.clone()));
    StepState::Running(Box::new(Running {
        child,
        pgid,
        contained,
        limit_groups,
        _confined: confined,
        activity,
        stdout,
        stderr,
        control,
        control_reader,
        control_open: true,
        metered: req.metered.take(),
        out: StepOutcome::new(Ending::Exited),
    }))
}

impl Running {
    /// Watches the step until it ends: its exit, a charge over a cap (reported on fd 3
    /// or metered by steward), its runtime cap, its timeout, a stall, or a cancel.
    async fn watch(
        &mut self,
        req: &Rules,
        guard: &mut Option<&mut BudgetGuard>,
        started: Instant,
    ) -> Ending {
        let runtime_deadline = guard.as_ref().map(|g| g.deadline());
        let timeout_deadline = req.timeout.map(|t| started + t);
        let far = started + Duration::from_secs(365 * 24 * 3600);
        let mut last_progress = Instant::now();
        loop {
            if let (Some(m), Some(g)) = (&self.metered, &guard) {
                m.headroom.publish(g.left());
            }
            let stall_at = req.stall_timeout.map(|s| last_progress + s);
            tokio::select! {
                status = self.child.wait() => {
                    self.out.exit = status.ok();
                    return Ending::Exited;
                }
                charge = recv_metered(&mut self.metered), if self.metered.is_some() => match charge {
                    Some(m) => {
                        last_progress = Instant::now();
                        if let Some(breach) = guard.as_mut().and_then(|g| metering(g, m)) {
                            return Ending::Breach(breach);
                        }
                    }
                    None => self.metered = None,
                },
                msg = self.control.recv(), if self.control_open => match msg {
                    Some(msg) => {
                        last_progress = Instant::now();
                        if let Some(breach) = self.out.apply(msg, guard) {
                            return Ending::Breach(breach);
                        }
                    }
                    None => self.control_open = false,
                },
                _ = self.activity.notified() => last_progress = Instant::now(),
                _ = tokio::time::sleep_until(runtime_deadline.unwrap_or(far)), if runtime_deadline.is_some() => {
                    if let Some(g) = guard.as_ref() {
                        return Ending::Breach(g.runtime_breach());
                    }
                }
                _ = tokio::time::sleep_until(timeout_deadline.unwrap_or(far)), if timeout_deadline.is_some() => {
                    return Ending::TimedOut(req.timeout.unwrap_or_default());
                }
                _ = tokio::time::sleep_until(stall_at.unwrap_or(far)), if stall_at.is_some() => {
                    return Ending::Stalled(req.stall_timeout.unwrap_or_default());
                }
                _ = req.cancel.cancelled() => return Ending::Cancelled,
            }
        }
    }

    /// Stops what is left of the step's group (TERM, the grace, KILL) unless it exited by
    /// itself, then sweeps its group and cgroup; a kill by the kernel for memory is a
    /// breach like any cap.
    async fn stop(&mut self, req: &Rules, ending: Ending) {
        if ending != Ending::Exited {
            // A cancelled run already had the daemon's grace period: stop it promptly.
            let grace = if ending == Ending::Cancelled {
                req.kill_grace.min(CANCEL_GRACE)
            } else {
                req.kill_grace
            };
            self.out.exit = stop_group(&mut self.child, self.pgid, grace).await;
        }
        // Sweep: a grandchild left behind (even one that ignores SIGTERM) dies with its
        // step, and so does one that left the group (setsid) where the step has a cgroup.
        if let Some(pgid) = self.contained.pgid.take() {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
        if let Some(cgroup) = self.contained.cgroup.take() {
            cgroup.finish(CGROUP_DRAIN).await;
        }
        self.out.ending = ending;
        if let (Some(groups), Some(bytes)) = (&self.limit_groups, req.memory_max) {
            if self.out.ending == Ending::Exited && groups.memory_exhausted() {
                let mib = format!("{}MiB", bytes >> 20);
                self.out.ending = Ending::Breach(crate::budget::Breach {
                    cap: crate::budget::Cap::Memory,
                    used: mib.clone(),
                    limit: mib,
                });
            }
        }
    }

    /// Reads what the step wrote just before its end, for at most [`DRAIN_WAIT`]: its last
    /// control lines and metered charges still count (a last charge over a cap is a
    /// breach), and its output is kept.
    async fn drain(&mut self, guard: &mut Option<&mut BudgetGuard>) {
        let until = tokio::time::Instant::now() + DRAIN_WAIT;
        while self.control_open {
            match tokio::time::timeout_at(until, self.control.recv()).await {
                Ok(Some(msg)) => {
                    if let Some(breach) = self.out.apply(msg, guard) {
                        self.breached(breach);
                    }
                }
                _ => self.control_open = false,
            }
        }
        // The metered charges of calls that ended with the step: its lease is given up
        // (no new call is accepted), and the feed read until the last call has settled.
        if let Some(m) = &mut self.metered {
            m.lease = None;
        }
        while let Some(m) = self.metered.as_mut() {
            let Ok(Some(charge)) = tokio::time::timeout_at(until, m.charges.recv()).await else {
                break;
            };
            if let Some(breach) = guard.as_mut().and_then(|g| metering(g, charge)) {
                self.breached(breach);
            }
        }
        self.control_reader.abort();
        if let Some(task) = self.stdout.take() {
            if let Ok(Ok(bytes)) = tokio::time::timeout_at(until, task).await {
                self.out.stdout = String::from_utf8_lossy(&bytes).into_owned();
            }
        }
        if let Some(task) = self.stderr.take() {
            if let Ok(Ok(bytes)) = tokio::time::timeout_at(until, task).await {
                self.out.stderr_tail = String::from_utf8_lossy(&bytes).into_owned();
            }
        }
    }

    /// A breach found while draining ends a step that had exited by itself.
    fn breached(&mut self, breach: crate::budget::Breach) {
        if self.out.ending == Ending::Exited {
            self.out.ending = Ending::Breach(breach);
        }
    }
}

/// SIGTERM → SIGKILL for a run the daemon cancels (it has had its grace already).
const CANCEL_GRACE: Duration = Duration::from_millis(500);
/// How long to wait for pipes to reach EOF once the group is gone.
const DRAIN_WAIT: Duration = Duration::from_millis(500);

/// What must die with a step: its process group and its cgroup. Normally the step's end
/// sweeps both and empties this; a drop with anything left kills it.
struct Contained {
    pgid: Option<Pid>,
    cgroup: Option<StepCgroup>,
}

impl Drop for Contained {
    fn drop(&mut self) {
        if let Some(pgid) = self.pgid.take() {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
        if let Some(cgroup) = self.cgroup.take() {
            cgroup.kill();
        }
    }
}

/// The longest a step's end waits for its killed cgroup to empty.
const CGROUP_DRAIN: Duration = Duration::from_secs(1);

/// SIGTERM the group, wait out the grace, then SIGKILL; returns how the child ended.
async fn stop_group(child: &mut StepProcess, pgid: Option<Pid>, grace: Duration) -> Option<Exit> {
    if let Some(pgid) = pgid {
        let _ = killpg(pgid, Signal::SIGTERM);
    }
    if let Ok(status) = tokio::time::timeout(grace, child.wait()).await {
        return status.ok();
    }
    if let Some(pgid) = pgid {
        let _ = killpg(pgid, Signal::SIGKILL);
    }
    child.start_kill();
    child.wait().await.ok()
}

/// The next metered charge; pending forever when there is no feed (its arm is off then).
async fn recv_metered(metered: &mut Option<Metered>) -> Option<Metering> {
    match metered {
        Some(m) => m.charges.recv().await,
        None => std::future::pending().await,
    }
}

/// Counts one metering in the guard; a breach if it took the budget over a cap (a
/// refused spend always does).
fn metering(guard: &mut BudgetGuard, m: Metering) -> Option<Breach> {
    match m {
        Metering::Charge(resource, amount) => guard.meter(resource, amount),
        Metering::Refused(cap, asked) => Some(guard.refused(cap, asked)),
    }
}

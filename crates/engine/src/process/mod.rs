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

mod child;
mod clone3;

pub use child::{Exit, Input, Output, StandIn, StepProcess};
pub use clone3::{join_cgroups, spawn_into_cgroup, Launch};

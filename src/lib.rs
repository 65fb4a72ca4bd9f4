//! steward: governed, unattended automation.
//!
//! # Theory of operation
//!
//! Something fires a **workflow** (a config file under `config/workflows/`, see
//! [`config`]). Every fire becomes one **governed run** ([`governed`]): the maker
//! (`run`), then a separate checker (`verify`), then — only when the workflow is live and
//! the checker said `pass` — `commit`, the one step allowed a side effect. Each step is a
//! child process in its own process group ([`step`]) — and, where cgroups v2 allow, in a
//! cgroup of its own from its first instruction ([`containment`], [`process`]) — that gets
//! the run context on stdin and may report charges on fd 3 ([`control`]); the [`budget`]
//! guard kills the group the moment a cap is crossed.
//!
//! Every run ends in one of seven terminal states and leaves a record in the sled
//! [`store`] (with its idempotency key, and a dead-letter or review entry where it
//! belongs) and one line per step in `runlog.jsonl` ([`runlog`]), with secrets masked by
//! the [`redact`] module. The [`cli`] is the operator's handle on all of it; `steward new`
//! writes a workflow skeleton ([`scaffold`]).
//!
//! The [`daemon`] is the long-running home of all this: its [`trigger`] tasks (cron,
//! file drops, queues, webhooks) turn events into fires, a dispatcher applies overlap
//! policy and a global cap, missed schedules are caught up through queue markers
//! ([`drain`]), and operators reach it through the [`control_socket`].

pub mod agency;
pub mod agent;
pub mod api;
pub mod budget;
pub mod cli;
pub mod config;
pub mod containment;
pub mod control;
pub mod control_socket;
pub mod daemon;
pub mod drain;
pub mod governed;
pub mod helper;
pub mod live;
pub mod process;
pub mod redact;
pub mod runlog;
pub mod runner;
pub mod scaffold;
pub mod secret;
pub mod service;
pub mod step;
pub mod store;
pub mod template;
pub mod trigger;

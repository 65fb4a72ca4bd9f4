//! steward: governed, unattended automation.
//!
//! This crate is the binary's: the wire ([`api`]), the service, the control socket, the
//! dashboard, the daemon and the CLI. The features are the `steward-features` crate
//! (`crates/features`) and the run engine the `steward-engine` crate (`crates/engine`),
//! both re-exported here under the same paths ([`runner`], [`governed`], [`agent`],
//! [`trigger`], …). The engine knows no feature and no feature knows the binary: the
//! features reach the engine through its hooks, installed by [`hooks`] and the daemon.
//!
//! # Theory of operation
//!
//! Something fires a **workflow** (a config file under `config/workflows/`, see
//! [`config`]) and asks the [`runner`] for a run: the one road every run takes, from a
//! trigger, a catch-up or a drain of queue markers ([`catchup`], [`drain`]), an operator's
//! command, a review approval or an agency case turn ([`agency`]). The runner alone
//! applies the overlap policy, the global cap, the live/dry decision ([`live`]: the file,
//! the go-live approval, an edit since, forced dry-run, `--live`, and the reason), the
//! in-flight list and shutdown grace, then hands the run to the engine ([`governed`]).
//!
//! A **governed run** is a state machine: the maker (`run`), then a separate checker
//! (`verify`), then — only when live and the checker said `pass` — `commit`, the one step
//! allowed a side effect. Each step is a child process in its own process group
//! ([`step`]) — and, where cgroups v2 allow, in a cgroup of its own from its first
//! instruction ([`containment`], [`process`]) — that gets the run context on stdin and may
//! report charges on fd 3 ([`control`]); the [`budget`] guard kills the group the moment a
//! cap is crossed.
//!
//! Every run ends in one of seven terminal states — `success`, `clean-no-op`, `blocked`,
//! `approval-required`, `exhausted`, `stagnated`, `failed` — or is recorded as
//! `interrupted` (steward stopped it), `skipped` (overlap) or `missed` (steward was down);
//! `running` is the only other state a record can be in. It leaves a record in the sled
//! [`store`] (with its idempotency key, and a dead-letter or review entry where it
//! belongs) and one line per step in `runlog.jsonl` ([`runlog`]), with secrets masked by
//! the [`redact`] module. Digest agents ([`agent`]) are governed runs whose steps are
//! steward's own.
//!
//! The [`cli`] turns arguments into a typed request ([`api`]) and sends it to the
//! [`daemon`] over the [`control_socket`], or answers it itself with the same
//! [`service`] when no daemon runs. The daemon's [`trigger`] tasks (cron, file drops,
//! queues, webhooks) turn events into fires; signals become events in one place.
//!
//! Over time, not just one run: after each run the engine checks the workflow's breaker
//! and spend window (either pauses it) and raises what the end calls for through
//! [`alert`] to the `[[notify]]` channels; the daemon's dead-man's switch ([`expect`])
//! alerts a slot with no successful run; `steward why` reads the run records as a
//! per-slot [`ledger`].

pub mod api;
pub mod cli;
pub mod control_socket;
pub mod daemon;
pub mod dashboard;
pub mod scaffold;
pub mod service;

// The features (crates/features) and the run engine (crates/engine), under the same
// paths as this crate's own modules.
pub use steward_engine::{
    alerts, budget, calendar, containment, control, governed, helper, limits, live, metering,
    metrics, process, redact, runlog, runner, sandbox, schedule, secret, step, store, template,
    throttle, workflow,
};
pub use steward_features::{
    agency, agent, alert, catchup, chain, cluster, config, drain, expect, gateway, hooks, ledger,
    listener, mail, trigger,
};

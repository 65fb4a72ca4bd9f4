//! steward's run engine: everything one governed run needs, and nothing a feature adds.
//!
//! # Theory of operation
//!
//! Something fires a **workflow** (its file, read by [`workflow`]) and asks the
//! [`runner`] for a run: the one road every run takes. The runner alone applies the
//! overlap policy, the global cap, the live/dry decision ([`live`]: the file, the go-live
//! approval, an edit since, forced dry-run, `--live`, and the reason), the in-flight list
//! and shutdown grace, then hands the run to the engine ([`governed`]).
//!
//! A **governed run** is a state machine: the maker (`run`), then a separate checker
//! (`verify`), then — only when live and the checker said `pass` — `commit`, the one step
//! allowed a side effect. Each step is a child process in its own process group
//! ([`step`], itself a state machine) — and, where cgroups v2 allow, in a cgroup of its
//! own from its first instruction ([`containment`], [`process`]), confined by the
//! [`sandbox`] and held to the [`limits`] — that gets the run context on stdin and may
//! report charges on fd 3 ([`control`]); the [`budget`] guard kills the group the moment
//! a cap is crossed.
//!
//! Every run ends in a terminal record in the [`store`] (one [`store::Backend`]
//! interface: sled on one machine, an in-memory one for tests, a cluster member's above)
//! and one line per step in `runlog.jsonl` ([`runlog`]), secrets masked by [`redact`].
//!
//! The features above the engine reach it through hooks, never the other way round: a
//! model gateway through [`metering::ModelGateway`], alerts through [`alerts::Alerts`],
//! a run's end through [`governed::RunEnded`], a digest agent's summary through
//! [`governed::Summarize`], and a step's process through [`step::Launcher`] (a
//! [`step::TestLauncher`] in tests).

pub mod alerts;
pub mod budget;
pub mod calendar;
pub mod containment;
pub mod control;
pub mod governed;
pub mod helper;
pub mod limits;
pub mod live;
pub mod metering;
pub mod metrics;
pub mod process;
pub mod redact;
pub mod runlog;
pub mod runner;
pub mod sandbox;
pub mod schedule;
pub mod secret;
pub mod step;
pub mod store;
pub mod template;
pub mod throttle;
pub mod workflow;

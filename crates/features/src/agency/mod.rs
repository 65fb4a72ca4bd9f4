//! Agency cases: a standing team with a mandate, advanced one governed turn at a time.
//!
//! A case is an append-only event stream in the store, each event sealed with the hash
//! of the one before (a chain `steward case verify` replays). `advance` folds the stream
//! — never inferring what the events do not show — checks the measurable gate (turns,
//! acts, spend against the limits) *before* asking the planner, constrains the planner's
//! proposal to the roster and each member's scope ceiling, and appends one turn event at
//! the folded version before anything is dispatched: the append is the lease, so a racing
//! driver gets a version conflict and dispatches nothing. The dispatched member runs as
//! its own governed run, with budget caps no wider than what the case has left; its run
//! id is the receipt, and a case resolves only with receipts.
//!
//! The parts: [`case`] (events, the chain, the fold, appends), [`turn`] (one turn:
//! limits, planner, roster, the lease), `member` (the member's governed run).

pub mod case;
mod limits;
mod member;
mod outcome;
mod planner;
pub mod turn;

pub use crate::config::agency::Agency;
pub use case::{
    approve, decode, fold, load, open, verify_chain, BrokenCase, Case, CaseError, CaseStatus,
    Dispatch, Event, Receipt,
};
pub use outcome::{render, Turn, TurnStatus, SCHEMA};
pub use planner::{PlannerError, Proposal};
pub use turn::advance;

//! The service: one handler per [`Request`], the same in the daemon and in the CLI.
//!
//! The daemon's control socket hands each request it reads to [`Service::handle`]; with
//! no daemon, the CLI builds a `Service` on its own store and calls the same method.
//! Every run a handler asks for goes through the [`Runner`]. What only a running daemon
//! can say (its uptime, its webhook address, its live config) comes through the
//! [`Daemon`] trait, which the daemon implements: the service never imports the daemon.

mod cases;
mod context;
mod runs;
mod why;
mod workflows;

use context::Handled;
pub use context::{load_config, Daemon, RunningConfig, Service};
pub use workflows::unread_queue_warning;

use crate::api::{Request, Response};

impl Service {
    /// Answers one request.
    pub async fn handle(&self, request: Request) -> Response {
        match self.dispatch(request).await {
            Ok(r) => r,
            Err(e) if is_live_refusal(&e) => Response::Refused {
                message: format!("{e:#}"),
            },
            Err(e) => Response::error(format!("{e:#}")),
        }
    }

    async fn dispatch(&self, request: Request) -> Handled {
        use Request as R;
        match request {
            R::Status => workflows::status(self),
            R::Enqueue { queue, payload } => workflows::enqueue(self, &queue, &payload),
            R::List => workflows::list(self),
            R::GoLive { workflow } => workflows::go_live(self, &workflow),
            R::Pause { workflow, reason } => workflows::pause(self, &workflow, reason.as_deref()),
            R::Resume { workflow } => workflows::resume(self, &workflow),
            R::Why {
                workflow,
                at,
                since,
            } => why::why(self, &workflow, at, since),
            R::DryRun { workflow } => workflows::dry_run(self, &workflow),
            R::InDoubtList => workflows::in_doubt(self),
            R::InDoubtResolve {
                workflow,
                key,
                committed,
            } => workflows::settle(self, &workflow, &key, committed),
            R::Run {
                workflow,
                live,
                payload,
            } => runs::run(self, &workflow, live, payload).await,
            R::Digest { agent, preview } => runs::digest(self, &agent, preview).await,
            R::Drain { dry_run } => runs::drain(self, dry_run).await,
            R::Runs {
                workflow,
                state,
                limit,
            } => runs::list(self, workflow, state, limit),
            R::Show { run } => runs::show(self, &run),
            R::DeadLetterList => runs::dead_letters(self),
            R::DeadLetterShow { run } => runs::dead_letter(self, &run),
            R::DeadLetterRetry { run } => runs::retry(self, &run).await,
            R::DeadLetterPurge { runs, all } => runs::purge(self, runs, all),
            R::Review => runs::review(self),
            R::Approve { run } => runs::approve(self, &run).await,
            R::Reject { run, reason } => runs::reject(self, &run, reason.as_deref()),
            R::CaseOpen {
                agency,
                case_id,
                signal,
            } => cases::open(self, &agency, &case_id, signal).map(Response::from),
            R::CaseAdvance {
                case_id,
                driver,
                member_result,
                run,
            } => cases::advance(self, &case_id, &driver, member_result, run)
                .await
                .map(Response::from),
            R::CaseApprove { case_id, by } => {
                cases::approve(self, &case_id, &by).map(Response::from)
            }
            R::CaseStatus { case_id } => cases::status(self, &case_id).map(Response::from),
            R::CaseVerify { case_id } => cases::verify(self, &case_id).map(Response::from),
            R::CaseList => cases::list(self).map(Response::from),
        }
    }
}

/// Whether the request failed because the go-live rules refused a live run or commit
/// (its own exit code, not "steward failed").
fn is_live_refusal(e: &anyhow::Error) -> bool {
    use crate::governed::EngineError;
    use crate::runner::RunError;
    e.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<RunError>(),
            Some(RunError::Live(_) | RunError::Engine(EngineError::NotLive(_)))
        ) || matches!(
            cause.downcast_ref::<EngineError>(),
            Some(EngineError::NotLive(_))
        ) || cause.is::<crate::live::LiveRefused>()
    })
}

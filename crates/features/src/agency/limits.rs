//! A case's limits, checked before any judgment: a breached `[limits]` cap fails the
//! turn; the agency's spend `[limits.window]` reached holds it.

use serde_json::json;

use super::case::{append, load, log, predicates, reload, Case, CaseError, EventKind};
use super::outcome::{turn, Turn, TurnStatus};
use crate::governed::Engine;

/// A breached limit fails the turn, whatever the planner would say.
pub(super) fn over_limit(
    engine: &Engine,
    case: &Case,
    driver: &str,
) -> Result<Option<Turn>, CaseError> {
    let (preds, breached) = predicates(case);
    if breached.is_empty() {
        return Ok(None);
    }
    let reason = format!("limit reached: {}", breached.join(", "));
    append(
        engine,
        case,
        &format!("{}:{}:{driver}", case.case_id, case.turns + 1),
        EventKind::Turn,
        json!({ "decision": "fail", "reason": reason, "predicates": preds }),
    )?;
    log(
        engine,
        &case.agency.id,
        &case.case_id,
        "failed",
        reason.clone(),
    );
    let case = reload(engine, &case.case_id)?;
    Ok(Some(turn(
        &case,
        TurnStatus::Failed,
        Some(reason),
        "nothing: the case is closed",
    )))
}

/// The agency's `[limits.window]` reached: the turn is held (nothing appended, the case
/// stays open) and `budget_window` is alerted, until older spend leaves the window.
pub(super) fn over_window(engine: &Engine, case: &Case) -> Result<Option<Turn>, CaseError> {
    let Some(w) = &case.agency.limits.window else {
        return Ok(None);
    };
    let period = w.period();
    let since = crate::store::run_id_prefix(
        chrono::Utc::now()
            - chrono::Duration::from_std(period).unwrap_or(chrono::Duration::days(1)),
    );
    let mut spent = 0.0;
    for id in engine.store.case_ids()? {
        let Some((other, _)) = load(engine, &id)? else {
            continue;
        };
        if other.agency.id == case.agency.id {
            spent += other
                .receipts
                .iter()
                .filter(|r| r.run_id.as_str() >= since.as_str())
                .map(|r| r.spend_usd)
                .sum::<f64>();
        }
    }
    if spent + super::case::EPS < w.spend_usd {
        return Ok(None);
    }
    let reason = format!(
        "agency spend window reached: {spent:.2} of {:.2} USD over all its cases in the last {}",
        w.spend_usd,
        humantime::format_duration(period)
    );
    log(
        engine,
        &case.agency.id,
        &case.case_id,
        "held",
        reason.clone(),
    );
    engine.alerts.raise(crate::alert::Alert::new(
        crate::alert::Event::BudgetWindow,
        &case.agency.id,
        format!("{reason}: no case of the agency takes a turn until the window has room"),
    ));
    Ok(Some(turn(
        case,
        TurnStatus::Held,
        Some(reason),
        "wait until older spend leaves the window (or raise [limits.window] spend_usd), then advance",
    )))
}

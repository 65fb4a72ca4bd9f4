//! Handlers about agency cases: `case open | advance | approve | status | verify | list`.

use anyhow::anyhow;
use serde_json::Value;

use super::context::Service;
use crate::agency::{self, CaseError, Receipt};
use crate::api::{CaseResponse, CaseRow};

/// What a case handler answers.
type Answered = anyhow::Result<CaseResponse>;

pub(super) fn open(service: &Service, agency_id: &str, case_id: &str, signal: Value) -> Answered {
    let config = service.config()?;
    let a = config.agencies.get(agency_id).ok_or_else(|| {
        let known: Vec<&str> = config.agencies.keys().map(String::as_str).collect();
        anyhow!(
            "no agency `{agency_id}` in {} (agencies: {})",
            config.root.join("agencies").display(),
            crate::config::list_or_none(&known)
        )
    })?;
    let case = agency::open(&service.engine, a, case_id, signal)?;
    Ok(CaseResponse::CaseOpened {
        case: Box::new(case),
        mandate: a.mandate.clone(),
    })
}

pub(super) async fn advance(
    service: &Service,
    case_id: &str,
    driver: &str,
    member_result: Option<Receipt>,
    run: bool,
) -> Answered {
    let config = service.config()?;
    match agency::advance(
        &service.runner,
        &config,
        case_id,
        driver,
        member_result,
        run,
    )
    .await
    {
        Ok(turn) => Ok(CaseResponse::Turn {
            turn: Box::new(turn),
        }),
        Err(e @ CaseError::Conflict { .. }) => Ok(CaseResponse::TurnConflict {
            message: e.to_string(),
        }),
        Err(e) => Err(e.into()),
    }
}

pub(super) fn approve(service: &Service, case_id: &str, by: &str) -> Answered {
    let case = agency::approve(&service.engine, case_id, by)?;
    Ok(CaseResponse::CaseApproved {
        case_id: case.case_id,
        turn: case.turns,
    })
}

pub(super) fn status(service: &Service, case_id: &str) -> Answered {
    let (case, _) =
        agency::load(&service.engine, case_id)?.ok_or_else(|| anyhow!("no case {case_id}"))?;
    Ok(CaseResponse::Case {
        case: Box::new(case),
    })
}

pub(super) fn verify(service: &Service, case_id: &str) -> Answered {
    let raw = service.engine.store.case_events(case_id)?;
    if raw.is_empty() {
        return Err(anyhow!("no case {case_id}"));
    }
    let events = raw.len();
    let broken = agency::decode(raw).and_then(|e| agency::verify_chain(&e));
    Ok(CaseResponse::CaseChain {
        case_id: case_id.to_string(),
        events,
        broken: broken.err().map(|e| e.to_string()),
    })
}

pub(super) fn list(service: &Service) -> Answered {
    let mut cases = Vec::new();
    for id in service.engine.store.case_ids()? {
        match agency::load(&service.engine, &id) {
            Ok(Some((c, _))) => cases.push(CaseRow {
                case_id: id,
                agency: Some(c.agency.id.clone()),
                status: serde_json::to_value(c.status)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default(),
                turns: c.turns,
                acts: c.acts,
                spend_usd: c.spend_usd,
                error: None,
            }),
            Ok(None) => {}
            Err(e) => cases.push(CaseRow {
                case_id: id,
                agency: None,
                status: "unreadable".into(),
                turns: 0,
                acts: 0,
                spend_usd: 0.0,
                error: Some(e.to_string()),
            }),
        }
    }
    Ok(CaseResponse::Cases { cases })
}

//! What a step of a workflow with `[gateway]` gets of the model gateway: a key that works
//! while the step runs, the variables the provider SDKs read, and a meter feed into its
//! budget. Each call the gateway ends is charged to the attempt's guard, counted in the
//! run's totals and `/metrics`, and written to the runlog as one line.

use std::sync::{Arc, Mutex};

use serde_json::json;

use super::Engine;
use crate::budget::{BudgetGuard, Headroom};
use crate::metering::keys::{Event, Grant, Upstream};
use crate::metering::reserve::Refusal;
use crate::metering::{Call, Provider};
use crate::metrics::ModelCallFigures;
use crate::redact::Redactor;
use crate::runlog::Entry;
use crate::secret::SecretMissing;
use crate::step::{Metered, Metering, StepKind};
use crate::store::{ModelSpend, RunRecord};
use crate::workflow::gateway::GatewayUse;
use crate::workflow::Workflow;

/// One step's use of the gateway. Its key rides in `metered`'s lease: revoked when the
/// step's process ends.
pub(super) struct GatewayStep {
    /// `OPENAI_BASE_URL`, `OPENAI_API_KEY`, … for the step's environment.
    pub(super) vars: Vec<(String, String)>,
    pub(super) metered: Option<Metered>,
    /// The gateway's port, for the sandbox's network rules.
    pub(super) port: u16,
}

/// The variable names a provider's SDK reads.
fn var_names(provider: Provider) -> (&'static str, &'static str) {
    match provider {
        Provider::Openai => ("OPENAI_BASE_URL", "OPENAI_API_KEY"),
        Provider::Anthropic => ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"),
    }
}

/// Why a step that calls models through the gateway cannot have it: the step does not
/// start.
#[derive(Debug, thiserror::Error)]
pub(super) enum NoGateway {
    #[error("the workflow has no [gateway]")]
    NotConfigured,
    #[error(
        "this workflow calls models through the gateway ([gateway]), and no gateway is running here"
    )]
    NotRunning,
    #[error("the step has no budget to meter its model calls against")]
    NoBudget,
    #[error(transparent)]
    Upstream(#[from] SecretMissing),
    #[error("cannot issue the step's gateway key: {0}")]
    Key(std::io::Error),
}

impl Engine {
    /// Issues `kind`'s key for the run and wires its calls to `guard`. Err says why the
    /// step cannot have the gateway (none running, a real key missing).
    pub(super) fn open_gateway(
        &self,
        wf: &Workflow,
        rec: &RunRecord,
        kind: StepKind,
        guard: &BudgetGuard,
        redactor: &Redactor,
        spend: Arc<Mutex<ModelSpend>>,
    ) -> Result<GatewayStep, NoGateway> {
        let Some(using) = &wf.gateway else {
            return Err(NoGateway::NotConfigured);
        };
        let Some(gateway) = &self.gateway else {
            return Err(NoGateway::NotRunning);
        };
        let upstreams = upstreams(using)?;
        let (charges_tx, charges) = tokio::sync::mpsc::unbounded_channel();
        let headroom = Headroom::new(guard.left());
        let sink = {
            let log = CallLog {
                engine: self.clone(),
                entry: self.entry(rec, "model_call", ""),
                redactor: redactor.clone(),
                spend: spend.clone(),
            };
            Arc::new(move |event: Event<'_>| {
                match &event {
                    Event::Call(call) => {
                        for (resource, amount) in &call.charges {
                            let _ = charges_tx.send(Metering::Charge(*resource, *amount));
                        }
                    }
                    Event::Refused(r) => {
                        let _ = charges_tx.send(Metering::Refused(r.cap, r.asked));
                    }
                }
                log.record(&event);
            })
        };
        let issued = gateway
            .registry()
            .issue(Grant {
                run_id: rec.run_id.clone(),
                workflow: wf.id.clone(),
                step: kind.name().to_string(),
                upstreams,
                models: using.models.clone(),
                pricing: using.pricing.clone(),
                budget: Some(headroom.clone()),
                log_bodies: using.log_bodies,
                sink,
            })
            .map_err(NoGateway::Key)?;
        let mut vars = Vec::new();
        for provider in &using.providers {
            let (base, key) = var_names(*provider);
            vars.push((base.to_string(), gateway.base_url(*provider)));
            vars.push((key.to_string(), issued.key.clone()));
        }
        Ok(GatewayStep {
            vars,
            metered: Some(Metered {
                charges,
                headroom,
                lease: Some(Box::new(issued)),
            }),
            port: gateway.addr().port(),
        })
    }
}

/// The real upstreams of a workflow's providers, their keys read from the daemon's
/// environment (or systemd credentials) now, so a key rotated there takes effect at the
/// next step.
fn upstreams(using: &GatewayUse) -> Result<Vec<(Provider, Upstream)>, SecretMissing> {
    using
        .upstreams
        .iter()
        .map(|u| {
            let what = format!(
                "[gateway.upstream.{}] key_env {}",
                u.provider.name(),
                u.key_env
            );
            let key = crate::secret::require(&u.key_env, &what)?;
            Ok((
                u.provider,
                Upstream {
                    base_url: u.api_base.clone(),
                    key,
                },
            ))
        })
        .collect()
}

/// Where a step's calls are recorded: the runlog, `/metrics`, the run's totals.
struct CallLog {
    engine: Engine,
    /// The run's runlog entry, its status and detail filled per call.
    entry: Entry,
    redactor: Redactor,
    spend: Arc<Mutex<ModelSpend>>,
}

impl CallLog {
    fn record(&self, event: &Event<'_>) {
        let mut e = self.entry.clone();
        e.ts = chrono::Utc::now();
        match event {
            Event::Call(call) => self.call(&mut e, call),
            Event::Refused(r) => self.refused(&mut e, r),
        }
        if let Err(err) = self.engine.runlog.record(&e, &self.redactor) {
            tracing::warn!(run = %e.run_id, "cannot write a model call to the runlog: {err}");
        }
    }

    fn call(&self, e: &mut Entry, call: &Call) {
        let usage = call.metered.usage.unwrap_or_default();
        let tokens = |r| {
            call.charges
                .iter()
                .find(|(res, _)| *res == r)
                .map_or(0, |(_, t)| *t as u64)
        };
        let charged = tokens(crate::control::Resource::Tokens);
        let status: &'static str = if call.cut {
            "cut"
        } else if call.status >= 400 || call.status == 0 {
            "error"
        } else {
            "ok"
        };
        {
            let mut s = self.spend.lock().unwrap_or_else(|p| p.into_inner());
            s.calls += 1;
            s.input_tokens += usage.input;
            s.cached_input_tokens += usage.cached_input;
            s.output_tokens += usage.output;
            s.tool_calls += call.metered.tool_calls;
            s.cost_usd += call.cost_usd.unwrap_or(0.0);
            if call.metered.usage.is_none() {
                s.unreported += 1;
                s.reserved_tokens += charged;
            }
            if call.cut {
                s.cut += 1;
            }
        }
        self.engine.metrics.model_call(
            &e.workflow,
            &call.model,
            status,
            ModelCallFigures {
                input_tokens: usage.input,
                cached_input_tokens: usage.cached_input,
                output_tokens: usage.output,
                cost_usd: call.cost_usd.unwrap_or(0.0),
            },
        );
        e.status = status.to_string();
        e.duration_ms = Some(call.latency_ms);
        let usage_said = match (call.metered.usage, call.cut) {
            (_, true) => format!("cut at the cap: charged its reservation of {charged} tokens"),
            (Some(_), false) => "reported".to_string(),
            (None, false) => {
                format!("none reported: charged its reservation of {charged} tokens")
            }
        };
        e.detail =
            format!(
            "{} {} {}: HTTP {}, {} in ({} cached), {} out, {} tool call(s){}; usage {usage_said}",
            call.provider.name(),
            call.model,
            call.endpoint,
            call.status,
            usage.input + usage.cached_input,
            usage.cached_input,
            usage.output,
            call.metered.tool_calls,
            call.cost_usd.map(|c| format!(", ${c:.6}")).unwrap_or_default(),
        );
        let mut data = json!({
            "provider": call.provider.name(),
            "model": call.model,
            "endpoint": call.endpoint,
            "status": call.status,
            "input_tokens": usage.input,
            "cached_input_tokens": usage.cached_input,
            "output_tokens": usage.output,
            "tool_calls": call.metered.tool_calls,
            "cost_usd": call.cost_usd,
            "latency_ms": call.latency_ms,
            "charged_tokens": charged,
            "usage": if call.metered.usage.is_some() { "reported" } else { "reservation" },
            "cut": call.cut,
        });
        if let Some((request, answer)) = &call.bodies {
            data["request"] = request.clone();
            data["response"] = answer.clone().into();
        }
        e.data = Some(data);
    }

    fn refused(&self, e: &mut Entry, r: &Refusal) {
        self.spend.lock().unwrap_or_else(|p| p.into_inner()).refused += 1;
        self.engine
            .metrics
            .model_call(&e.workflow, &r.model, "refused", Default::default());
        e.status = "refused".into();
        e.detail = format!(
            "{} {}: refused before it was forwarded (HTTP 429): {}",
            r.provider.name(),
            r.model,
            r.why
        );
        e.data = Some(json!({
            "provider": r.provider.name(),
            "model": r.model,
            "cap": r.cap.name(),
            "asked": r.asked,
        }));
    }
}

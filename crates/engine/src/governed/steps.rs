//! One step of a run (run, verify or commit) as the engine records it: started through
//! the step supervisor, its secrets masked, every control line, sub-step and note
//! written to the runlog, and one line for how it ended.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::env::{scratch_dir, scrub, StepEnv};
use super::gateway::{GatewayStep, NoGateway};
use super::outcome::verdict_of;
use super::{Engine, Result};
use crate::budget::BudgetGuard;
use crate::control::Resource;
use crate::metering::agent_cli::{self, UsageFrom};
use crate::step::{run_step, Ending, Exit, StepKind, StepOutcome, StepRequest};
use crate::store::RunRecord;
use crate::workflow::{StepCommand, Workflow};

impl Engine {
    /// Runs one step, records it in the runlog and keeps its stderr tail and notes.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn step(
        &self,
        wf: &Workflow,
        rec: &mut RunRecord,
        kind: StepKind,
        cmd: &StepCommand,
        ctx: &Value,
        vars: &[(String, String)],
        guard: Option<&mut BudgetGuard>,
        timeout: Option<Duration>,
        env: &StepEnv,
        cancel: &CancellationToken,
    ) -> Result<StepOutcome> {
        let argv = &cmd.argv[..];
        let scratch = scratch_dir(&self.state_dir, &rec.run_id);
        // The folder (and its tmp/) exists before any step of the run starts.
        std::fs::create_dir_all(scratch.join("tmp"))?;
        let spend = Arc::new(Mutex::new(rec.model_spend.clone().unwrap_or_default()));
        let mut gateway = None;
        if kind != StepKind::Commit && wf.gateway.is_some() {
            let opened = match guard.as_deref() {
                Some(g) => self.open_gateway(wf, rec, kind, g, &env.redactor, spend.clone()),
                None => Err(NoGateway::NoBudget),
            };
            match opened {
                Ok(g) => gateway = Some(g),
                Err(why) => return self.not_started(rec, kind, why.to_string(), env),
            }
        }
        let program = argv.first().map(Path::new);
        let confinement = match self.confinement(wf, rec, kind, &scratch, program, gateway.as_ref())
        {
            Ok(c) => c,
            Err(why) => return self.not_started(rec, kind, why.to_string(), env),
        };
        let with_gateway;
        let vars = match &mut gateway {
            Some(g) => {
                with_gateway = crate::step::with_vars(vars, std::mem::take(&mut g.vars));
                &with_gateway[..]
            }
            None => vars,
        };
        let req = StepRequest {
            kind,
            argv,
            cwd: &wf.cwd,
            env: vars,
            stdin: serde_json::to_vec(ctx).unwrap_or_default(),
            timeout,
            kill_grace: wf.caps.kill_grace,
            stall_timeout: if kind == StepKind::Commit {
                None
            } else {
                wf.caps.stall_timeout
            },
            cancel: cancel.clone(),
            sandbox: confinement.as_ref(),
            limits: if kind == StepKind::Commit {
                Default::default()
            } else {
                wf.limits
            },
            metered: gateway.as_mut().and_then(|g| g.metered.take()),
            launcher: self.launcher.as_ref(),
        };
        let figures_before = guard.is_some();
        let mut guard = guard;
        let mut out = run_step(req, guard.as_deref_mut()).await;
        scrub(&mut out, &env.redactor);
        if gateway.is_some() {
            rec.model_spend = Some(spend.lock().unwrap_or_else(|p| p.into_inner()).clone());
        }
        if let (Some(format), Some(g)) = (cmd.usage_from, guard.as_deref_mut()) {
            self.meter_cli_output(rec, format, &mut out, g, env)?;
        }
        self.note_misreported(rec, guard.as_deref(), env)?;

        self.record_reports(rec, kind, &out, env)?;
        let (status, detail) = step_line(kind, &out);
        let mut e = self.entry(rec, kind.name(), status);
        e.detail = detail;
        e.duration_ms = Some(out.duration.as_millis() as u64);
        if figures_before {
            e.figures = guard.map(|g| g.figures());
        }
        if let Ending::Breach(b) = &out.ending {
            e.data = Some(json!({"cap": b.cap.name(), "used": b.used, "limit": b.limit}));
        }
        self.runlog.record(&e, &env.redactor)?;
        Ok(out)
    }

    /// The kernel confinement a maker or checker starts under (none for a commit or a
    /// workflow with the sandbox off), its line kept on the record. Err says why the step
    /// cannot start.
    fn confinement(
        &self,
        wf: &Workflow,
        rec: &mut RunRecord,
        kind: StepKind,
        scratch: &Path,
        program: Option<&Path>,
        gateway: Option<&GatewayStep>,
    ) -> std::result::Result<Option<crate::sandbox::Confinement>, crate::sandbox::SandboxError>
    {
        if kind == StepKind::Commit || !wf.sandbox.enabled {
            if !wf.sandbox.enabled {
                rec.sandbox = Some("off".into());
            }
            return Ok(None);
        }
        let mut policy = wf.sandbox.policy(scratch, program);
        if let Some(g) = gateway {
            policy.net = policy.net.with_port(g.port);
        }
        match crate::sandbox::confine(&policy, wf.sandbox.require) {
            Ok(c) => {
                rec.sandbox = Some(sandbox_line(&c.state, &policy.net, &c.notes));
                Ok(Some(c))
            }
            Err(e) => {
                rec.sandbox = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// What the step reported besides its verdict: control lines ignored, sub-steps and
    /// notes (each a runlog line), and its stderr tail on the record.
    fn record_reports(
        &self,
        rec: &mut RunRecord,
        kind: StepKind,
        out: &StepOutcome,
        env: &StepEnv,
    ) -> Result<()> {
        for line in &out.malformed {
            let mut e = self.entry(rec, kind.name(), "control-ignored");
            e.detail = line.clone();
            self.runlog.record(&e, &env.redactor)?;
        }
        for (name, status, detail) in &out.steps {
            let mut e = self.entry(rec, name, status);
            e.detail = detail.clone();
            self.runlog.record(&e, &env.redactor)?;
        }
        for note in &out.notes {
            let mut e = self.entry(rec, kind.name(), "note");
            e.detail = note.clone();
            self.runlog.record(&e, &env.redactor)?;
            rec.notes.push(note.clone());
        }
        if !out.stderr_tail.is_empty() {
            rec.stderr
                .insert(kind.name().to_string(), out.stderr_tail.clone());
        }
        Ok(())
    }

    /// A step that could not start (its sandbox or its gateway could not be had): one
    /// runlog line, and the outcome of a spawn that failed.
    fn not_started(
        &self,
        rec: &RunRecord,
        kind: StepKind,
        why: String,
        env: &StepEnv,
    ) -> Result<StepOutcome> {
        let mut entry = self.entry(rec, kind.name(), "error");
        entry.detail = why.clone();
        self.runlog.record(&entry, &env.redactor)?;
        let mut out = StepOutcome::new(Ending::SpawnFailed(why));
        out.duration = Duration::ZERO;
        Ok(out)
    }

    /// The second meter: what an agent CLI printed of its own spend (`usage_from`),
    /// charged as metered; over a cap, the step ends exhausted like any breach.
    fn meter_cli_output(
        &self,
        rec: &RunRecord,
        format: UsageFrom,
        out: &mut StepOutcome,
        guard: &mut BudgetGuard,
        env: &StepEnv,
    ) -> Result<()> {
        let mut e = self.entry(rec, "usage_from", "metered");
        let Some(spend) = agent_cli::read(format, &out.stdout) else {
            e.status = "none".into();
            e.detail = format!("{}: its output told no usage", format.name());
            self.runlog.record(&e, &env.redactor)?;
            return Ok(());
        };
        let mut charges = vec![
            (Resource::Tokens, spend.usage.total() as f64),
            (Resource::ToolCalls, spend.tool_calls as f64),
        ];
        if let Some(cost) = spend.cost_usd {
            charges.push((Resource::CostUsd, cost));
        }
        for (resource, amount) in charges {
            if let Some(breach) = guard.meter(resource, amount) {
                if out.ending == Ending::Exited {
                    out.ending = Ending::Breach(breach);
                }
            }
        }
        e.detail = format!(
            "{}: {} in ({} cached), {} out, {} tool call(s){}",
            format.name(),
            spend.usage.input + spend.usage.cached_input,
            spend.usage.cached_input,
            spend.usage.output,
            spend.tool_calls,
            spend
                .cost_usd
                .map(|c| format!(", ${c:.6}"))
                .unwrap_or_default()
        );
        e.figures = Some(guard.figures());
        self.runlog.record(&e, &env.redactor)?;
        Ok(())
    }

    /// Records, once per change, that the maker's fd-3 reports fell short of the meter.
    fn note_misreported(
        &self,
        rec: &mut RunRecord,
        guard: Option<&BudgetGuard>,
        env: &StepEnv,
    ) -> Result<()> {
        let Some(note) = guard.and_then(BudgetGuard::misreported) else {
            return Ok(());
        };
        if rec.misreported.as_ref() != Some(&note) {
            let mut e = self.entry(rec, "budget", "misreported");
            e.detail = format!("the maker's fd-3 reports fell short of the gateway's meter: {note}; the budget counted the meter");
            self.runlog.record(&e, &env.redactor)?;
            rec.misreported = Some(note);
        }
        Ok(())
    }
}

/// The run record's line for a confined step: its state and its network.
fn sandbox_line(state: &str, net: &crate::sandbox::Net, notes: &[String]) -> String {
    let net = match net {
        _ if state.contains("no TCP rules") => {
            "network not confined (this kernel has no TCP rules)".to_string()
        }
        crate::sandbox::Net::None => "no network".to_string(),
        crate::sandbox::Net::Any => "network open (net = \"any\")".to_string(),
        crate::sandbox::Net::Ports(p) => format!(
            "TCP to port {} only",
            p.iter().map(u16::to_string).collect::<Vec<_>>().join(", ")
        ),
    };
    let mut line = format!("{state}; {net}");
    for note in notes {
        line.push_str("; ");
        line.push_str(note);
    }
    line
}

/// A step's runlog status and detail, from how it ended.
fn step_line(kind: StepKind, out: &StepOutcome) -> (&'static str, String) {
    match &out.ending {
        Ending::Exited => match (kind, out.exit) {
            (StepKind::Verify, _) => ("done", format!("verdict {}", verdict_of(out).0.name())),
            (_, Some(Exit::Code(0))) => ("ok", String::new()),
            (_, Some(exit)) => ("error", exit.to_string()),
            (_, None) => ("error", "exit status unknown".to_string()),
        },
        Ending::Breach(b) => (
            "breach",
            format!("budget exhausted: {b}; process group killed"),
        ),
        Ending::Stalled(d) => (
            "stalled",
            format!(
                "no progress for {:.1}s; process group killed",
                d.as_secs_f64()
            ),
        ),
        Ending::TimedOut(d) => (
            "timeout",
            format!(
                "still running after {:.1}s; process group killed",
                d.as_secs_f64()
            ),
        ),
        Ending::SpawnFailed(e) => ("error", e.clone()),
        Ending::Cancelled => (
            "cancelled",
            "steward stopped the run; process group killed".to_string(),
        ),
    }
}

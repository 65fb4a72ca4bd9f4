//! Metrics: what steward has done, as Prometheus counts them.
//!
//! Counters and histograms are kept in memory as runs end ([`Metrics::run_ended`], called
//! by the engine's one `finish`), so they only rise while the process lives (a restart
//! resets them, as Prometheus expects of a counter). Sizes that the store or the folders
//! hold (dead letters, review, keys in doubt, queue depths, the last success of each
//! workflow) are set just before each scrape from a [`Snapshot`]. The text comes from the
//! `prometheus-client` crate: the classic format for a plain request (what `promtool` and
//! every Prometheus accept), OpenMetrics when asked for it.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::store::{RunRecord, RunState};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    workflow: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkflowLabel {
    workflow: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PauseLabels {
    workflow: String,
    cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SpendLabels {
    workflow: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    workflow: String,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelTokenLabels {
    workflow: String,
    model: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelCallLabels {
    workflow: String,
    model: String,
    status: &'static str,
}

/// One model call through the gateway, as [`Metrics::model_call`] counts it.
#[derive(Debug, Clone, Copy, Default)]
pub struct ModelCallFigures {
    pub input_tokens: u64,
    pub cached_input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

type FloatGauge = Gauge<f64, AtomicU64>;
type FloatCounter = Counter<f64, AtomicU64>;

/// Seconds, from 50 ms to about 14 hours.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.05, 2.0, 20))
}

/// steward's metrics; one per engine, shared by clones.
pub struct Metrics {
    registry: Registry,
    runs: Family<RunLabels, Counter>,
    duration: Family<WorkflowLabel, Histogram, fn() -> Histogram>,
    lag: Family<WorkflowLabel, Histogram, fn() -> Histogram>,
    spend: Family<SpendLabels, FloatCounter>,
    model_calls: Family<ModelCallLabels, Counter>,
    model_tokens: Family<ModelTokenLabels, Counter>,
    model_cost: Family<ModelLabels, FloatCounter>,
    queue_depth: Family<QueueLabel, Gauge>,
    last_success: Family<WorkflowLabel, FloatGauge>,
    paused: Family<PauseLabels, Gauge>,
    dead_letters: Gauge,
    review_waiting: Gauge,
    keys_in_doubt: Gauge,
    in_flight: Gauge,
    forced_dry_run: Gauge,
    uptime: FloatGauge,
}

/// What the store and the folders hold at a scrape.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub dead_letters: usize,
    pub review_waiting: usize,
    pub keys_in_doubt: usize,
    pub in_flight: usize,
    pub forced_dry_run: bool,
    pub uptime_s: f64,
    /// Items waiting per queue.
    pub queues: Vec<(String, usize)>,
    /// Each workflow's last successful run's end, in Unix seconds.
    pub last_success: Vec<(String, f64)>,
    /// Each paused workflow, with who paused it (`operator`, `breaker`, `budget`).
    pub paused: Vec<(String, &'static str)>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("steward");
        let m = Metrics {
            runs: Family::default(),
            duration: Family::new_with_constructor(seconds_histogram as fn() -> Histogram),
            lag: Family::new_with_constructor(seconds_histogram as fn() -> Histogram),
            spend: Family::default(),
            model_calls: Family::default(),
            model_tokens: Family::default(),
            model_cost: Family::default(),
            queue_depth: Family::default(),
            last_success: Family::default(),
            paused: Family::default(),
            dead_letters: Gauge::default(),
            review_waiting: Gauge::default(),
            keys_in_doubt: Gauge::default(),
            in_flight: Gauge::default(),
            forced_dry_run: Gauge::default(),
            uptime: FloatGauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "runs",
            "Runs ended, by workflow and final state",
            m.runs.clone(),
        );
        registry.register(
            "run_duration_seconds",
            "How long ended runs took, from start to end",
            m.duration.clone(),
        );
        registry.register(
            "trigger_lag_seconds",
            "From the slot (or the fire) to the run's start",
            m.lag.clone(),
        );
        registry.register(
            "budget_spend",
            "Budget spent by ended runs, by kind (tokens, tool_calls, cost_usd, runtime_seconds)",
            m.spend.clone(),
        );
        registry.register(
            "model_calls",
            "Model calls through the gateway, by workflow, model and status (ok, error, cut, refused)",
            m.model_calls.clone(),
        );
        registry.register(
            "model_tokens",
            "Tokens metered by the gateway, by workflow, model and kind (input, cached_input, output)",
            m.model_tokens.clone(),
        );
        registry.register(
            "model_cost_usd",
            "USD metered by the gateway at the [gateway.pricing] rates, by workflow and model",
            m.model_cost.clone(),
        );
        registry.register(
            "queue_depth",
            "Items waiting in each queue",
            m.queue_depth.clone(),
        );
        registry.register(
            "last_success_timestamp_seconds",
            "When each workflow's last successful run ended (Unix time)",
            m.last_success.clone(),
        );
        registry.register(
            "paused",
            "1 for each paused workflow, labelled by what paused it (operator, breaker, budget)",
            m.paused.clone(),
        );
        registry.register(
            "dead_letters",
            "Entries in the dead-letter queue",
            m.dead_letters.clone(),
        );
        registry.register(
            "review_waiting",
            "Runs waiting for an operator's approval",
            m.review_waiting.clone(),
        );
        registry.register(
            "keys_in_doubt",
            "Idempotency keys in doubt after a crash",
            m.keys_in_doubt.clone(),
        );
        registry.register("runs_in_flight", "Runs running now", m.in_flight.clone());
        registry.register(
            "forced_dry_run",
            "1 while SIGUSR1 forces every workflow dry",
            m.forced_dry_run.clone(),
        );
        registry.register(
            "uptime_seconds",
            "Seconds since the daemon started",
            m.uptime.clone(),
        );
        registry.register(
            "build",
            "steward's version",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            }),
        );
        Metrics { registry, ..m }
    }

    /// Counts one model call through the gateway as it ends (or is refused: `status`
    /// `refused`, figures zero).
    pub fn model_call(
        &self,
        workflow: &str,
        model: &str,
        status: &'static str,
        f: ModelCallFigures,
    ) {
        self.model_calls
            .get_or_create(&ModelCallLabels {
                workflow: workflow.to_string(),
                model: model.to_string(),
                status,
            })
            .inc();
        for (kind, n) in [
            ("input", f.input_tokens),
            ("cached_input", f.cached_input_tokens),
            ("output", f.output_tokens),
        ] {
            self.model_tokens
                .get_or_create(&ModelTokenLabels {
                    workflow: workflow.to_string(),
                    model: model.to_string(),
                    kind,
                })
                .inc_by(n);
        }
        self.model_cost
            .get_or_create(&ModelLabels {
                workflow: workflow.to_string(),
                model: model.to_string(),
            })
            .inc_by(f.cost_usd);
    }

    /// Counts a run that ended (any final state, skipped and missed included).
    pub fn run_ended(&self, rec: &RunRecord) {
        if rec.state == RunState::Running {
            return;
        }
        let workflow = rec.workflow.clone();
        self.runs
            .get_or_create(&RunLabels {
                workflow: workflow.clone(),
                state: rec.state.name().to_string(),
            })
            .inc();
        let label = WorkflowLabel {
            workflow: workflow.clone(),
        };
        if let Some(ended) = rec.ended_at {
            let took = (ended - rec.started_at).num_milliseconds().max(0) as f64 / 1000.0;
            self.duration.get_or_create(&label).observe(took);
        }
        if let Some(lag) = trigger_lag(rec) {
            self.lag.get_or_create(&label).observe(lag);
        }
        let f = &rec.figures;
        for (kind, amount) in [
            ("tokens", f.tokens as f64),
            ("tool_calls", f.tool_calls as f64),
            ("cost_usd", f.cost_usd),
            ("runtime_seconds", f.runtime_ms as f64 / 1000.0),
        ] {
            if amount > 0.0 && amount.is_finite() {
                self.spend
                    .get_or_create(&SpendLabels {
                        workflow: workflow.clone(),
                        kind,
                    })
                    .inc_by(amount);
            }
        }
    }

    /// Sets what the store and the folders hold now.
    pub fn set_snapshot(&self, s: &Snapshot) {
        self.dead_letters.set(s.dead_letters as i64);
        self.review_waiting.set(s.review_waiting as i64);
        self.keys_in_doubt.set(s.keys_in_doubt as i64);
        self.in_flight.set(s.in_flight as i64);
        self.forced_dry_run.set(i64::from(s.forced_dry_run));
        self.uptime.set(s.uptime_s);
        // A queue or workflow edited away leaves the page, not a stale value.
        self.queue_depth.clear();
        for (queue, depth) in &s.queues {
            self.queue_depth
                .get_or_create(&QueueLabel {
                    queue: queue.clone(),
                })
                .set(*depth as i64);
        }
        self.paused.clear();
        for (workflow, cause) in &s.paused {
            self.paused
                .get_or_create(&PauseLabels {
                    workflow: workflow.clone(),
                    cause,
                })
                .set(1);
        }
        self.last_success.clear();
        for (workflow, at) in &s.last_success {
            self.last_success
                .get_or_create(&WorkflowLabel {
                    workflow: workflow.clone(),
                })
                .set(*at);
        }
    }

    /// The metrics as text: OpenMetrics when `openmetrics`, else the classic format.
    pub fn encode(&self, openmetrics: bool) -> String {
        let mut out = String::new();
        let written = if openmetrics {
            prometheus_client::encoding::text::encode(&mut out, &self.registry)
        } else {
            prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
        };
        if let Err(e) = written {
            tracing::warn!("cannot encode the metrics: {e}");
        }
        out
    }
}

/// The `Content-Type` of each format.
pub fn content_type(openmetrics: bool) -> &'static str {
    if openmetrics {
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    } else {
        prometheus_client::encoding::prometheus_text::CONTENT_TYPE
    }
}

/// Seconds from the slot a schedule fired for (or the fire, for other triggers) to the
/// run's start.
fn trigger_lag(rec: &RunRecord) -> Option<f64> {
    let at = ["scheduled_for", "fired_at"]
        .iter()
        .find_map(|k| rec.trigger.get(k)?.as_str())?;
    let at = chrono::DateTime::parse_from_rfc3339(at).ok()?;
    let lag = (rec.started_at - at.with_timezone(&chrono::Utc)).num_milliseconds();
    Some(lag.max(0) as f64 / 1000.0)
}

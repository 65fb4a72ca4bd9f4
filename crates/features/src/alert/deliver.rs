//! One alert to one channel: an email through the `[smtp]` relay (lettre, as the digests)
//! or a webhook POST (reqwest), tried up to [`ATTEMPTS`] times with backoff. Each outcome
//! is a runlog `alert` line; the channel is named by its label, never by its full URL.

use std::sync::Arc;
use std::time::Duration;

use lettre::message::Mailbox;
use lettre::{AsyncTransport, Message};
use serde_json::json;

use crate::alerts::Alert;
use crate::config::notify::{ChannelKind, NotifyChannel, WebhookFormat};
use crate::config::Smtp;
use crate::redact::Redactor;
use crate::runlog::{Entry, RunLog};

/// Attempts per alert and channel (the waits between them add up to about a minute).
pub const ATTEMPTS: u32 = 7;

/// How long one webhook request may take.
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a delivery is kept while it is owed.
pub struct Ledger {
    pub owed: super::owed::Owed,
    pub key: String,
    pub channel: String,
}

impl Ledger {
    fn attempted(&self, alert: &Alert, made: u32) {
        self.owed.attempted(
            &self.key,
            &super::owed::Pending {
                channel: self.channel.clone(),
                alert: alert.clone(),
                attempts_made: made,
            },
        );
    }
}

/// Delivers `alert` to `channel`, retrying with backoff; gives up after [`ATTEMPTS`] in
/// all (`made` were made before a restart). Settled in the ledger when sent or given up.
pub async fn with_retries(
    channel: NotifyChannel,
    smtp: Option<Smtp>,
    alert: Alert,
    log: RunLog,
    made: u32,
    ledger: Ledger,
) {
    deliver(channel, smtp, &alert, log, made, &ledger).await;
    ledger.owed.done(&ledger.key);
}

async fn deliver(
    channel: NotifyChannel,
    smtp: Option<Smtp>,
    alert: &Alert,
    log: RunLog,
    made: u32,
    ledger: &Ledger,
) {
    let alert = alert.clone();
    let label = channel.label();
    // A webhook whose URL variable is unset cannot succeed by waiting: dropped, not retried.
    if let (ChannelKind::Webhook, None, Some(var)) = (channel.kind, &channel.url, &channel.url_env)
    {
        if crate::secret::lookup(var).is_none_or(|v| v.is_empty()) {
            let detail = format!(
                "{} to {label}: env var {var} is not set: dropped",
                alert.event
            );
            tracing::warn!(channel = %label, workflow = %alert.workflow, "{detail}");
            record(&log, &alert, 1, "dropped", detail);
            return;
        }
    }
    for attempt in (made + 1).max(1)..=ATTEMPTS.max(made + 1) {
        let result = match channel.kind {
            ChannelKind::Email => email(&channel, smtp.as_ref(), &alert).await,
            ChannelKind::Webhook => webhook(&channel, &alert).await,
        };
        let (status, detail) = match &result {
            Ok(()) => ("sent", format!("{} to {label}", alert.event)),
            Err(e) if attempt < ATTEMPTS => {
                ledger.attempted(&alert, attempt);
                let wait = backoff(attempt - 1);
                tracing::warn!(channel = %label, event = %alert.event, workflow = %alert.workflow, "alert not delivered (attempt {attempt} of {ATTEMPTS}): {e}; retrying in {}s", wait.as_secs());
                record(
                    &log,
                    &alert,
                    attempt,
                    "retrying",
                    format!(
                        "{} to {label}: {e}; retrying in {}s",
                        alert.event,
                        wait.as_secs()
                    ),
                );
                tokio::time::sleep(wait).await;
                continue;
            }
            Err(e) => (
                "failed",
                format!(
                    "{} to {label}: {e}; gave up after {ATTEMPTS} attempts",
                    alert.event
                ),
            ),
        };
        if result.is_ok() {
            tracing::info!(channel = %label, event = %alert.event, workflow = %alert.workflow, "alert sent");
        } else {
            tracing::error!(channel = %label, event = %alert.event, workflow = %alert.workflow, "{detail}");
        }
        record(&log, &alert, attempt, status, detail);
        return;
    }
}

pub(super) fn record(log: &RunLog, alert: &Alert, attempt: u32, status: &str, detail: String) {
    let e = Entry {
        ts: chrono::Utc::now(),
        run_id: alert.run_id.clone().unwrap_or_default(),
        workflow: alert.workflow.clone(),
        attempt,
        step: "alert".into(),
        status: status.into(),
        figures: None,
        duration_ms: None,
        detail,
        data: Some(json!({ "event": alert.event, "id": alert.id, "held_back": alert.held_back })),
    };
    if let Err(e) = log.record(&e, &Redactor::default()) {
        tracing::error!("cannot write the runlog: {e}");
    }
}

/// Why one attempt to deliver an alert failed (the URL and its token never in it).
#[derive(Debug, thiserror::Error)]
pub enum Undelivered {
    #[error("smtp not configured ([smtp] in steward.toml)")]
    NoSmtp,
    #[error(transparent)]
    Transport(#[from] crate::mail::NoTransport),
    #[error("smtp.from is not an address: {0}")]
    BadFrom(lettre::address::AddressError),
    #[error("bad address `{to}`: {error}")]
    BadTo {
        to: String,
        error: lettre::address::AddressError,
    },
    #[error("cannot build the message: {0}")]
    Message(#[from] lettre::error::Error),
    #[error("{0}")]
    Smtp(#[from] lettre::transport::smtp::Error),
    #[error("env var {0} is not set")]
    UrlUnset(String),
    #[error("no url")]
    NoUrl,
    #[error("cannot build an HTTP client: {0}")]
    Client(Arc<reqwest::Error>),
    /// What kind of failure, only: reqwest's own text can quote the URL.
    #[error("{0}")]
    Request(String),
    #[error("the receiver answered {0}")]
    Answered(reqwest::StatusCode),
}

async fn email(
    channel: &NotifyChannel,
    smtp: Option<&Smtp>,
    alert: &Alert,
) -> Result<(), Undelivered> {
    let smtp = smtp.ok_or(Undelivered::NoSmtp)?;
    let transport = crate::mail::transport(smtp)?;
    let from: Mailbox = smtp.from.parse().map_err(Undelivered::BadFrom)?;
    let mut msg = Message::builder()
        .from(from)
        .subject(crate::mail::one_line(&alert.subject(), 200))
        .user_agent(format!("steward/{}", env!("CARGO_PKG_VERSION")));
    for to in &channel.to {
        msg = msg.to(to.parse().map_err(|error| Undelivered::BadTo {
            to: to.clone(),
            error,
        })?);
    }
    let msg = msg.body(alert.text())?;
    transport.send(msg).await?;
    Ok(())
}

async fn webhook(channel: &NotifyChannel, alert: &Alert) -> Result<(), Undelivered> {
    let url = match (&channel.url, &channel.url_env) {
        (Some(u), _) => u.clone(),
        (None, Some(var)) => {
            crate::secret::lookup(var).ok_or_else(|| Undelivered::UrlUnset(var.clone()))?
        }
        (None, None) => return Err(Undelivered::NoUrl),
    };
    let client = client()?;
    // The same id on every attempt, before and after a restart: a receiver drops repeats.
    let json_body = |v: serde_json::Value| {
        client
            .post(&url)
            .header("Content-Type", "application/json")
            .header("Idempotency-Key", &alert.id)
            .body(v.to_string())
    };
    let req = match channel.format {
        WebhookFormat::Json => json_body(json!({
            "id": alert.id,
            "event": alert.event,
            "workflow": alert.workflow,
            "message": alert.message,
            "run_id": alert.run_id,
            "at": alert.at,
            "held_back": alert.held_back,
            "text": alert.text(),
        })),
        WebhookFormat::Slack => json_body(json!({ "text": alert.text() })),
        WebhookFormat::Discord => json_body(json!({ "content": alert.text() })),
        WebhookFormat::Ntfy => client
            .post(&url)
            .header("Idempotency-Key", &alert.id)
            .header("Title", crate::mail::one_line(&alert.subject(), 200))
            .header("Tags", alert.event.name())
            .body(alert.text()),
    };
    // The error's own text can quote the URL (and its token): say only what kind it was.
    let resp = req
        .send()
        .await
        .map_err(|e| Undelivered::Request(describe(&e)))?;
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(Undelivered::Answered(resp.status()))
    }
}

/// One HTTP client for every webhook delivery: building one reads the system's root
/// certificates, too much to do per attempt.
fn client() -> Result<&'static reqwest::Client, Undelivered> {
    static CLIENT: std::sync::OnceLock<Result<reqwest::Client, Arc<reqwest::Error>>> =
        std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .timeout(WEBHOOK_TIMEOUT)
                .user_agent(concat!("steward/", env!("CARGO_PKG_VERSION")))
                .build()
                .map_err(Arc::new)
        })
        .as_ref()
        .map_err(|e| Undelivered::Client(e.clone()))
}

fn describe(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else {
        "the request failed"
    };
    // The innermost cause (an io error such as "Connection refused") names no URL.
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    if std::ptr::eq(cause as *const _ as *const u8, e as *const _ as *const u8) {
        kind.into()
    } else {
        format!("{kind}: {cause}")
    }
}

/// Waits between delivery attempts: 1 s, 2 s, 4 s, … (seven attempts over about a minute).
pub fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.min(5))
}

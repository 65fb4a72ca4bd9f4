//! A webhook trigger's `format`: whose signature scheme its endpoint checks (the checks
//! themselves are the webhook listener's, above the engine).

use serde::{Deserialize, Serialize};

/// `format` of a webhook trigger: whose signature scheme the endpoint checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// `X-Steward-Timestamp` and `X-Steward-Signature: sha256=<hex HMAC of "ts.body">`.
    #[default]
    Steward,
    /// `X-Hub-Signature-256: sha256=<hex HMAC of the body>`; id `X-GitHub-Delivery`.
    Github,
    /// `Stripe-Signature: t=<ts>,v1=<hex HMAC of "ts.body">`; id the event's `id`.
    Stripe,
    /// `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64 HMAC of
    /// "id.ts.body">` with the base64 key of a `whsec_…` secret; id `webhook-id`.
    Standard,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Steward => "steward",
            Format::Github => "github",
            Format::Stripe => "stripe",
            Format::Standard => "standard",
        }
    }

    /// The request headers a run sees in `trigger.headers`: the sender's descriptive
    /// ones. Signatures, credentials and anything else stay out of the run's context.
    pub fn run_headers(self) -> &'static [&'static str] {
        match self {
            Format::Steward => &["content-type", "user-agent", "x-steward-timestamp"],
            Format::Github => &[
                "content-type",
                "user-agent",
                "x-github-event",
                "x-github-delivery",
                "x-github-hook-id",
                "x-github-hook-installation-target-id",
                "x-github-hook-installation-target-type",
            ],
            Format::Stripe => &["content-type", "user-agent"],
            Format::Standard => &[
                "content-type",
                "user-agent",
                "webhook-id",
                "webhook-timestamp",
            ],
        }
    }
}

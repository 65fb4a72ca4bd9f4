//! `[[notify]]` in `steward.toml`: the channels alerts go to (email over the `[smtp]`
//! relay the digests use, or a webhook), and which events each one wants.

use serde::{Deserialize, Serialize};

pub use crate::alerts::Event;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelKind {
    Email,
    Webhook,
}

/// The body a webhook gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WebhookFormat {
    /// steward's own object: event, workflow, message, run_id, at, held_back.
    #[default]
    Json,
    /// `{"text": …}` for a Slack incoming webhook.
    Slack,
    /// `{"content": …}` for a Discord webhook.
    Discord,
    /// The message as the body with a `Title` header, POSTed to an ntfy topic URL.
    Ntfy,
}

/// The default time one channel waits between two alerts of one workflow and event.
pub const DEFAULT_EVERY: &str = "15m";

/// One `[[notify]]` table.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyChannel {
    pub kind: ChannelKind,
    /// Email: the recipients.
    #[serde(default)]
    pub to: Vec<String>,
    /// Webhook: where to POST (http or https).
    #[serde(default)]
    pub url: Option<String>,
    /// Webhook: the env var holding the URL, to keep a token out of the file.
    #[serde(default)]
    pub url_env: Option<String>,
    #[serde(default)]
    pub format: WebhookFormat,
    pub events: Vec<Event>,
    /// At most one alert of a workflow and event per this long (`"15m"`, the default);
    /// the ones held back are counted and reported when it has passed.
    #[serde(default)]
    pub every: Option<String>,
}

impl NotifyChannel {
    /// How long the channel waits between alerts of one workflow and event.
    pub fn every(&self) -> std::time::Duration {
        self.every
            .as_deref()
            .and_then(|e| humantime::parse_duration(e).ok())
            .unwrap_or(std::time::Duration::from_secs(15 * 60))
    }

    /// The channel as logs may name it: the recipients, or the webhook's scheme, host and
    /// port only (a path or query can carry a token).
    pub fn label(&self) -> String {
        match self.kind {
            ChannelKind::Email => format!("email to {}", self.to.join(", ")),
            ChannelKind::Webhook => match (&self.url, &self.url_env) {
                (Some(url), _) => format!("webhook {}", redact_url(url)),
                (None, Some(var)) => format!("webhook ${var}"),
                (None, None) => "webhook".into(),
            },
        }
    }

    /// What is wrong with the table, as (key, problem); `smtp` says whether `[smtp]` is set.
    pub fn problems(&self, smtp: bool) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if self.events.is_empty() {
            out.push((
                "events",
                format!(
                    "lists no event: name one or more of {}",
                    Event::ALL.map(Event::name).join(", ")
                ),
            ));
        }
        if let Some(e) = &self.every {
            if humantime::parse_duration(e).is_err() {
                out.push((
                    "every",
                    format!("`{e}` is not a duration (e.g. \"30s\", \"15m\", \"1h\")"),
                ));
            }
        }
        match self.kind {
            ChannelKind::Email => {
                if self.to.is_empty() {
                    out.push((
                        "to",
                        "an email channel needs `to = [\"ops@example.org\"]`".into(),
                    ));
                }
                for to in &self.to {
                    if to.parse::<lettre::message::Mailbox>().is_err() {
                        out.push(("to", format!("`{to}` is not an email address")));
                    }
                }
                if !smtp {
                    out.push((
                        "kind",
                        "an email channel needs the [smtp] table (host, from) in steward.toml"
                            .into(),
                    ));
                }
                if self.url.is_some() || self.url_env.is_some() {
                    out.push(("url", "an email channel takes `to`, not `url`".into()));
                }
            }
            ChannelKind::Webhook => match (&self.url, &self.url_env) {
                (Some(_), Some(_)) => {
                    out.push(("url_env", "give `url` or `url_env`, not both".into()))
                }
                (None, None) => out.push((
                    "url",
                    "a webhook channel needs `url` or `url_env` (the env var holding the URL)"
                        .into(),
                )),
                (Some(url), None) => {
                    if let Err(e) = check_url(url) {
                        out.push(("url", e.to_string()));
                    }
                }
                (None, Some(_)) => {}
            },
        }
        out
    }
}

/// Why a webhook channel's `url` cannot be used (its path and query never shown).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadUrl {
    /// The URL as [`redact_url`] shows it.
    #[error("`{0}` is not an http(s) URL")]
    NotHttp(String),
    #[error("not a URL: {0}")]
    Unparsable(String),
}

/// An http or https URL, or why not.
pub fn check_url(url: &str) -> Result<(), BadUrl> {
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Ok(()),
        Ok(u) => Err(BadUrl::NotHttp(redact_url(u.as_str()))),
        Err(e) => Err(BadUrl::Unparsable(e.to_string())),
    }
}

/// `https://hooks.example.org/…`: scheme, host and port, never the path, query or user.
pub fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(u) => {
            let host = u.host_str().unwrap_or("?");
            let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
            let rest = if u.path() == "/" && u.query().is_none() {
                ""
            } else {
                "/…"
            };
            format!("{}://{host}{port}{rest}", u.scheme())
        }
        Err(_) => "(an unparsable URL)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_named_without_its_path_query_or_user() {
        assert_eq!(
            redact_url("https://user:pw@hooks.slack.com/services/T0/B0/SECRET?x=1"),
            "https://hooks.slack.com/…"
        );
        assert_eq!(
            redact_url("http://127.0.0.1:9000/"),
            "http://127.0.0.1:9000"
        );
        assert!(!redact_url("ntfy://x/tok").contains("tok"));
    }

    #[test]
    fn a_channel_names_what_it_lacks() {
        let email: NotifyChannel =
            toml::from_str("kind = \"email\"\nevents = []\nevery = \"soon\"").unwrap();
        let keys: Vec<&str> = email.problems(false).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["events", "every", "to", "kind"]);
        let hook: NotifyChannel =
            toml::from_str("kind = \"webhook\"\nurl = \"ftp://x/y\"\nevents = [\"overdue\"]")
                .unwrap();
        assert_eq!(hook.problems(true).len(), 1);
        assert!(toml::from_str::<NotifyChannel>("kind = \"pager\"\nevents = []").is_err());
    }
}

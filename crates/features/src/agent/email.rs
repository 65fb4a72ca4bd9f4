//! Step 11, maybe_email: the digest to every recipient parsed from
//! `VAULT/_config/email-distribution.md`, one message each, over SMTP (lettre):
//! STARTTLS, implicit TLS, or plain (loopback only). Credentials come from env vars.
//! Results are per recipient; nothing here touches the written digest.

use std::path::{Path, PathBuf};

use lettre::message::header::{HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart};
use lettre::{AsyncTransport, Message};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::config::Smtp;

/// Why a digest has no one to mail; its words are the `email_failed=` reason.
#[derive(Debug, thiserror::Error)]
pub enum NoRecipients {
    #[error("distribution list missing")]
    Missing,
    #[error("distribution list unreadable: {0}")]
    Unreadable(std::io::Error),
    #[error("distribution list empty")]
    Empty,
}

/// Recipients from the distribution list, display names kept (`Ada <ada@example.org>`).
pub fn recipients(vault: &Path) -> Result<Vec<String>, NoRecipients> {
    let path = vault.join("_config").join("email-distribution.md");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(NoRecipients::Missing),
        Err(e) => return Err(NoRecipients::Unreadable(e)),
    };
    let mut out: Vec<(String, Mailbox)> = Vec::new();
    for line in text.lines() {
        for word in line.split(|c: char| {
            c.is_whitespace()
                || matches!(c, '<' | '>' | ',' | ';' | '(' | ')' | '[' | ']' | '`' | '*')
        }) {
            let word = word.trim_matches(|c: char| c == '.' || c == ':' || c == '"' || c == '\'');
            let word = word.strip_prefix("mailto:").unwrap_or(word);
            let Ok(address) = word.parse::<lettre::Address>() else {
                continue;
            };
            if !word.contains('@') || out.iter().any(|(w, _)| w.eq_ignore_ascii_case(word)) {
                continue;
            }
            let name = display_name(line, word);
            out.push((word.to_string(), Mailbox::new(name, address)));
        }
    }
    if out.is_empty() {
        return Err(NoRecipients::Empty);
    }
    Ok(out.into_iter().map(|(_, m)| m.to_string()).collect())
}

/// The name in `- Ada Lovelace <ada@example.org>`: the text before `<address>`, without
/// the list marker and quotes; None when there is none.
fn display_name(line: &str, address: &str) -> Option<String> {
    let at = line.find(&format!("<{address}>"))?;
    let name = line[..at]
        .trim()
        .trim_start_matches(['-', '*', '+'])
        .trim()
        .trim_matches(['"', '\'', '`'])
        .trim();
    let numbered = name
        .split_once(". ")
        .filter(|(n, _)| n.parse::<u32>().is_ok());
    let name = numbered.map_or(name, |(_, rest)| rest).trim();
    (!name.is_empty() && !name.contains('@') && !name.chars().any(char::is_control))
        .then(|| name.to_string())
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Delivery {
    pub sent: usize,
    pub total: usize,
    /// Recipients who already had this very digest (same content): not sent again.
    #[serde(default)]
    pub already_sent: usize,
    /// `recipient: reason` for each one that failed.
    pub failures: Vec<String>,
    /// Set when nothing could be sent at all (config or connection).
    pub error: Option<String>,
}

/// One digest to mail: whose, its subject line and its markdown (frontmatter included).
pub struct Digest<'a> {
    pub agent: &'a str,
    pub subject: &'a str,
    pub markdown: &'a str,
}

impl Digest<'_> {
    /// The digest without its YAML frontmatter: what a reader sees.
    fn body(&self) -> &str {
        let text = self.markdown;
        text.strip_prefix("---\n")
            .and_then(|rest| rest.split_once("\n---\n").map(|(_, body)| body))
            .unwrap_or(text)
            .trim_start()
    }

    /// sha256 of the digest's text: a send is keyed by it and the recipient.
    fn hash(&self) -> String {
        hex::encode(Sha256::digest(self.body().as_bytes()))
    }

    /// The same markdown as HTML. Raw HTML in it (text from a feed, decoded) is shown as
    /// text, never passed on as markup.
    fn html(&self) -> String {
        use pulldown_cmark::{Event, Options, Parser};
        let events = Parser::new_ext(self.body(), Options::ENABLE_TABLES).map(|e| match e {
            Event::Html(t) | Event::InlineHtml(t) => Event::Text(t),
            other => other,
        });
        let mut html =
            String::from("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"></head><body>\n");
        pulldown_cmark::html::push_html(&mut html, events);
        html.push_str("</body></html>\n");
        html
    }
}

/// Who already got which digest: `state/agents/<agent>/sent.jsonl`, a line per send.
pub struct SentLog {
    path: PathBuf,
    sent: Vec<(String, String)>,
}

#[derive(Serialize, Deserialize)]
struct SentLine {
    digest: String,
    to: String,
    at: String,
}

impl SentLog {
    pub fn open(path: PathBuf) -> SentLog {
        let sent = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<SentLine>(l).ok())
            .map(|l| (l.digest, l.to.to_ascii_lowercase()))
            .collect();
        SentLog { path, sent }
    }

    fn has(&self, digest: &str, to: &str) -> bool {
        let to = to.to_ascii_lowercase();
        self.sent.iter().any(|(d, t)| d == digest && *t == to)
    }

    fn record(&mut self, digest: &str, to: &str) -> std::io::Result<()> {
        use std::io::Write;
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let line = serde_json::to_string(&SentLine {
            digest: digest.to_string(),
            to: to.to_string(),
            at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        })?;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        writeln!(f, "{line}")?;
        f.sync_data()?;
        self.sent
            .push((digest.to_string(), to.to_ascii_lowercase()));
        Ok(())
    }
}

/// Sends the digest to each recipient who has not had this very digest yet; never fails
/// as a whole: the outcome says what happened.
pub async fn send(
    smtp: Option<&Smtp>,
    to: &[String],
    digest: &Digest<'_>,
    log: &mut SentLog,
) -> Delivery {
    let mut d = Delivery {
        total: to.len(),
        ..Default::default()
    };
    let Some(smtp) = smtp else {
        d.error = Some("smtp not configured ([smtp] in steward.toml)".into());
        return d;
    };
    let transport = match crate::mail::transport(smtp) {
        Ok(t) => t,
        Err(e) => {
            d.error = Some(e.to_string());
            return d;
        }
    };
    let from: Mailbox = match smtp.from.parse() {
        Ok(f) => f,
        Err(e) => {
            d.error = Some(format!("smtp.from `{}` is not an address: {e}", smtp.from));
            return d;
        }
    };
    let domain = from.email.domain().to_string();
    // One line, no control characters: nothing from a feed can inject a header.
    let subject = crate::mail::one_line(digest.subject, 200);
    let hash = digest.hash();
    let list_id = crate::mail::one_line(
        smtp.list_id
            .as_deref()
            .unwrap_or(&format!("<{}.steward.{domain}>", digest.agent)),
        300,
    );
    let html = digest.html();
    for rcpt in to {
        let address = rcpt
            .parse::<Mailbox>()
            .map(|m| m.email.to_string())
            .unwrap_or_else(|_| rcpt.clone());
        if log.has(&hash, &address) {
            d.already_sent += 1;
            continue;
        }
        let result = async {
            let to: Mailbox = rcpt.parse().map_err(|e| format!("bad address: {e}"))?;
            // The same digest to the same reader always has the same id: a duplicate
            // that slips through anyway is one message to their mail system.
            let rcpt_hash = hex::encode(Sha256::digest(address.to_ascii_lowercase().as_bytes()));
            let mut msg = Message::builder()
                .from(from.clone())
                .to(to)
                .subject(subject.clone())
                .message_id(Some(format!(
                    "<{}.{}@{domain}>",
                    &hash[..24],
                    &rcpt_hash[..12]
                )))
                .user_agent(format!("steward/{}", env!("CARGO_PKG_VERSION")))
                .raw_header(HeaderValue::new(
                    HeaderName::new_from_ascii_str("List-Id"),
                    list_id.clone(),
                ));
            if let Some(u) = &smtp.list_unsubscribe {
                msg = msg.raw_header(HeaderValue::new(
                    HeaderName::new_from_ascii_str("List-Unsubscribe"),
                    crate::mail::one_line(u, 500),
                ));
            }
            let msg = msg
                .multipart(MultiPart::alternative_plain_html(
                    digest.body().to_string(),
                    html.clone(),
                ))
                .map_err(|e| format!("cannot build message: {e}"))?;
            transport.send(msg).await.map_err(|e| e.to_string())
        }
        .await;
        match result {
            Ok(_) => {
                d.sent += 1;
                if let Err(e) = log.record(&hash, &address) {
                    tracing::warn!("sent to {address}, but cannot note it in the sent log: {e}");
                }
            }
            Err(e) => d.failures.push(format!("{rcpt}: {e}")),
        }
    }
    if d.sent == 0 && d.failures.len() == d.total - d.already_sent && !d.failures.is_empty() {
        d.error = Some(format!(
            "smtp: {}",
            d.failures[0].split_once(": ").map_or("", |x| x.1)
        ));
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipients_are_parsed_from_a_markdown_list() {
        let dir = tempfile::tempdir().unwrap();
        let missing = recipients(dir.path()).unwrap_err();
        assert!(matches!(missing, NoRecipients::Missing), "{missing:?}");
        assert_eq!(missing.to_string(), "distribution list missing");
        std::fs::create_dir_all(dir.path().join("_config")).unwrap();
        let list = dir.path().join("_config/email-distribution.md");
        std::fs::write(&list, "# Digest readers\n\nNobody yet.\n").unwrap();
        let empty = recipients(dir.path()).unwrap_err();
        assert!(matches!(empty, NoRecipients::Empty), "{empty:?}");
        assert_eq!(empty.to_string(), "distribution list empty");
        std::fs::write(&list, "- Ada <ada@example.org>\n- bob@example.org (ops)\n* `carol@example.org`\n- ada@example.org again\n").unwrap();
        assert_eq!(
            recipients(dir.path()).unwrap(),
            [
                "Ada <ada@example.org>",
                "bob@example.org",
                "carol@example.org"
            ]
        );
    }

    #[test]
    fn the_html_part_shows_markup_from_a_feed_as_text_and_drops_the_frontmatter() {
        let d = Digest {
            agent: "a",
            subject: "s",
            markdown: "---\nagent: a\n---\n# a\n\n- <script>alert(1)</script> and <b>bold</b>\n",
        };
        let html = d.html();
        assert!(
            !html.contains("<script>") && !html.contains("<b>"),
            "{html}"
        );
        assert!(html.contains("&lt;script&gt;"), "{html}");
        assert!(!d.body().contains("agent: a"));
        assert_eq!(d.hash().len(), 64);
    }
}

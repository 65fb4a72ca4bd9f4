//! Step 11, maybe_email: the digest to every recipient parsed from
//! `VAULT/_config/email-distribution.md`, one message each, over SMTP (lettre):
//! STARTTLS, implicit TLS, or plain (loopback only). Credentials come from env vars.
//! Results are per recipient; nothing here touches the written digest.

use std::path::Path;
use std::time::Duration;

use lettre::message::{header::ContentType, Mailbox};
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use serde::{Deserialize, Serialize};

use crate::config::{Smtp, SmtpSecurity};

/// Recipients from the distribution list; Err is the `email_failed=` reason.
pub fn recipients(vault: &Path) -> Result<Vec<String>, String> {
    let path = vault.join("_config").join("email-distribution.md");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err("distribution list missing".into())
        }
        Err(e) => return Err(format!("distribution list unreadable: {e}")),
    };
    let mut out: Vec<String> = Vec::new();
    for line in text.lines() {
        for word in line.split(|c: char| {
            c.is_whitespace()
                || matches!(c, '<' | '>' | ',' | ';' | '(' | ')' | '[' | ']' | '`' | '*')
        }) {
            let word = word.trim_matches(|c: char| c == '.' || c == ':' || c == '"' || c == '\'');
            let word = word.strip_prefix("mailto:").unwrap_or(word);
            if word.contains('@')
                && word.parse::<lettre::Address>().is_ok()
                && !out.iter().any(|w| w.eq_ignore_ascii_case(word))
            {
                out.push(word.to_string());
            }
        }
    }
    if out.is_empty() {
        return Err("distribution list empty".into());
    }
    Ok(out)
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Delivery {
    pub sent: usize,
    pub total: usize,
    /// `recipient: reason` for each one that failed.
    pub failures: Vec<String>,
    /// Set when nothing could be sent at all (config or connection).
    pub error: Option<String>,
}

/// Sends `body` to each recipient; never fails as a whole: the outcome says what happened.
pub async fn send(smtp: Option<&Smtp>, to: &[String], subject: &str, body: &str) -> Delivery {
    let mut d = Delivery {
        total: to.len(),
        ..Default::default()
    };
    let Some(smtp) = smtp else {
        d.error = Some("smtp not configured ([smtp] in steward.toml)".into());
        return d;
    };
    let transport = match transport(smtp) {
        Ok(t) => t,
        Err(e) => {
            d.error = Some(e);
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
    // One line, no control characters: nothing from a feed can inject a header.
    let subject: String = subject
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    for rcpt in to {
        let result = async {
            let to: Mailbox = rcpt.parse().map_err(|e| format!("bad address: {e}"))?;
            let msg = Message::builder()
                .from(from.clone())
                .to(to)
                .subject(subject.clone())
                .header(ContentType::TEXT_PLAIN)
                .body(body.to_string())
                .map_err(|e| format!("cannot build message: {e}"))?;
            transport.send(msg).await.map_err(|e| e.to_string())
        }
        .await;
        match result {
            Ok(_) => d.sent += 1,
            Err(e) => d.failures.push(format!("{rcpt}: {e}")),
        }
    }
    if d.sent == 0 && d.failures.len() == d.total && d.total > 0 {
        d.error = Some(format!(
            "smtp: {}",
            d.failures[0].split_once(": ").map_or("", |x| x.1)
        ));
    }
    d
}

fn transport(smtp: &Smtp) -> Result<AsyncSmtpTransport<Tokio1Executor>, String> {
    let mut b = match smtp.security {
        SmtpSecurity::Plain => {
            let loopback = matches!(smtp.host.as_str(), "localhost" | "127.0.0.1" | "::1");
            if !loopback {
                return Err(format!(
                    "smtp.security = \"plain\" is allowed only for loopback, not {}",
                    smtp.host
                ));
            }
            AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&smtp.host)
        }
        SmtpSecurity::Starttls => AsyncSmtpTransport::<Tokio1Executor>::starttls_relay(&smtp.host)
            .map_err(|e| format!("smtp: {e}"))?,
        SmtpSecurity::Tls => AsyncSmtpTransport::<Tokio1Executor>::relay(&smtp.host)
            .map_err(|e| format!("smtp: {e}"))?,
    };
    if let Some(port) = smtp.port {
        b = b.port(port);
    }
    b = b.timeout(Some(Duration::from_secs(30)));
    if let Some(user_env) = &smtp.username_env {
        let user = crate::secret::require(user_env, &format!("smtp username {user_env}"))
            .map_err(|e| e.to_string())?;
        let pass_env = smtp
            .password_env
            .as_deref()
            .unwrap_or("STEWARD_SMTP_PASSWORD");
        let pass = crate::secret::require(pass_env, &format!("smtp password {pass_env}"))
            .map_err(|e| e.to_string())?;
        b = b.credentials(Credentials::new(user, pass));
    }
    Ok(b.build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipients_are_parsed_from_a_markdown_list() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            recipients(dir.path()),
            Err("distribution list missing".into())
        );
        std::fs::create_dir_all(dir.path().join("_config")).unwrap();
        let list = dir.path().join("_config/email-distribution.md");
        std::fs::write(&list, "# Digest readers\n\nNobody yet.\n").unwrap();
        assert_eq!(
            recipients(dir.path()),
            Err("distribution list empty".into())
        );
        std::fs::write(&list, "- Ada <ada@example.org>\n- bob@example.org (ops)\n* `carol@example.org`\n- ada@example.org again\n").unwrap();
        assert_eq!(
            recipients(dir.path()).unwrap(),
            ["ada@example.org", "bob@example.org", "carol@example.org"]
        );
    }
}

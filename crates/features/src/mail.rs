//! The SMTP relay `[smtp]` in steward.toml names, as a lettre transport: STARTTLS,
//! implicit TLS, or plain (loopback only), credentials from env vars. Digests and alerts
//! both send through it, and both keep header values to one line with [`one_line`].

use std::time::Duration;

use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, Tokio1Executor};

use crate::config::{Smtp, SmtpSecurity};

/// Why no SMTP transport could be made from `[smtp]`.
#[derive(Debug, thiserror::Error)]
pub enum NoTransport {
    #[error("smtp.security = \"plain\" is allowed only for loopback, not {0}")]
    PlainNotLoopback(String),
    #[error("smtp: {0}")]
    Relay(#[from] lettre::transport::smtp::Error),
    #[error(transparent)]
    Secret(#[from] crate::secret::SecretMissing),
}

/// A transport for `smtp`, or why there is none (the reason a send reports).
pub fn transport(smtp: &Smtp) -> Result<AsyncSmtpTransport<Tokio1Executor>, NoTransport> {
    let mut b = match smtp.security {
        SmtpSecurity::Plain => {
            let loopback = matches!(smtp.host.as_str(), "localhost" | "127.0.0.1" | "::1");
            if !loopback {
                return Err(NoTransport::PlainNotLoopback(smtp.host.clone()));
            }
            AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&smtp.host)
        }
        SmtpSecurity::Starttls => AsyncSmtpTransport::<Tokio1Executor>::starttls_relay(&smtp.host)?,
        SmtpSecurity::Tls => AsyncSmtpTransport::<Tokio1Executor>::relay(&smtp.host)?,
    };
    if let Some(port) = smtp.port {
        b = b.port(port);
    }
    b = b.timeout(Some(Duration::from_secs(30)));
    if let Some(user_env) = &smtp.username_env {
        let user = crate::secret::require(user_env, &format!("smtp username {user_env}"))?;
        let pass_env = smtp
            .password_env
            .as_deref()
            .unwrap_or("STEWARD_SMTP_PASSWORD");
        let pass = crate::secret::require(pass_env, &format!("smtp password {pass_env}"))?;
        b = b.credentials(Credentials::new(user, pass));
    }
    Ok(b.build())
}

/// A header value from config, a feed or a run: one line, no control characters, at most
/// `cap` characters (nothing it carries can add a header).
pub fn one_line(text: &str, cap: usize) -> String {
    text.chars().filter(|c| !c.is_control()).take(cap).collect()
}

//! The dashboard's secrets: the token a person opens it with (`state/dashboard.token`),
//! the session cookie and CSRF token derived from it, and `/metrics`' own token.

use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use subtle::ConstantTimeEq;

use crate::config::dashboard::MetricsAccess;

/// The token file of a state folder.
pub fn token_path(state: &Path) -> PathBuf {
    state.join("dashboard.token")
}

pub fn metrics_token_path(state: &Path) -> PathBuf {
    state.join("metrics.token")
}

/// The secrets of one dashboard: the token a person opens it with, and what derives from it.
pub struct Keys {
    pub(super) token: String,
    pub(super) session: String,
    pub(super) csrf: String,
    pub(super) metrics: Option<String>,
}

impl Keys {
    /// Reads the tokens, creating each (random, 0600) the first time.
    pub fn load_or_create(state: &Path, access: MetricsAccess) -> Result<Keys, TokenError> {
        let token = read_or_create(&token_path(state))?;
        let metrics = match access {
            MetricsAccess::Token => Some(read_or_create(&metrics_token_path(state))?),
            MetricsAccess::Loopback => None,
        };
        Ok(Keys {
            session: derive(&token, "session"),
            csrf: derive(&token, "csrf"),
            token,
            metrics,
        })
    }

    /// The CSRF token every form carries.
    pub fn csrf(&self) -> &str {
        &self.csrf
    }
}

fn derive(token: &str, purpose: &str) -> String {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(token.as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(purpose.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// Equal, in time that does not depend on where they differ.
pub(super) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// Why a dashboard token could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("no randomness for a token: {0}")]
    NoRandomness(String),
    #[error("cannot create {}: {why}", .path.display())]
    Create {
        path: std::path::PathBuf,
        why: std::io::Error,
    },
    #[error("cannot write {}: {why}", .path.display())]
    Write {
        path: std::path::PathBuf,
        why: std::io::Error,
    },
}

/// The token in `path`, or a new random one written there with mode 0600.
fn read_or_create(path: &Path) -> Result<String, TokenError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Ok(text) = std::fs::read_to_string(path) {
        let token = text.trim().to_string();
        if token.len() >= 32 {
            return Ok(token);
        }
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| TokenError::NoRandomness(e.to_string()))?;
    let token = hex::encode(bytes);
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|why| TokenError::Create {
            path: path.to_path_buf(),
            why,
        })?;
    writeln!(file, "{token}").map_err(|why| TokenError::Write {
        path: path.to_path_buf(),
        why,
    })?;
    Ok(token)
}

//! Secrets by name: from steward's environment, or from a systemd credential file
//! (`LoadCredential=NAME:/path` puts it at `$CREDENTIALS_DIRECTORY/NAME`). Config files
//! name secrets, never hold them, and the values are redacted from every log.

use std::path::Path;

/// The secret called `name`: the env var if set, else the credential file of that name.
pub fn lookup(name: &str) -> Option<String> {
    if let Ok(v) = std::env::var(name) {
        return Some(v);
    }
    let dir = std::env::var_os("CREDENTIALS_DIRECTORY")?;
    // A credential name is a file name: nothing that could climb out of the folder.
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return None;
    }
    let text = std::fs::read_to_string(Path::new(&dir).join(name)).ok()?;
    Some(text.strip_suffix('\n').unwrap_or(&text).to_string())
}

/// The secret called `name`, or an error that says what it is for (`what`) and where to
/// put it.
pub fn require(name: &str, what: &str) -> Result<String, SecretMissing> {
    lookup(name).ok_or_else(|| SecretMissing {
        name: name.to_string(),
        what: what.to_string(),
    })
}

/// A secret that is neither in the environment nor a systemd credential.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what} is not set ({})", where_to_set(.name))]
pub struct SecretMissing {
    pub name: String,
    /// What needs it, for the message (`smtp password SMTP_PASS`).
    pub what: String,
}

/// Where to put a secret, for error messages.
pub fn where_to_set(name: &str) -> String {
    format!("set env var {name} or a systemd credential of that name (LoadCredential={name}:FILE)")
}

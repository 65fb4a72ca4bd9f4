//! A workflow's config: one TOML file under `config/workflows/`, read and checked
//! ([`parse`]) into a [`Workflow`] — its trigger, budget, steps, retries, sandbox
//! ([`sandbox`]), model gateway use ([`gateway`]) — with each error naming the file, line
//! and column and what was expected ([`file`]). The config folder around the workflows
//! (agents, agencies, `steward.toml`) is read above the engine.

pub mod file;
pub mod gateway;
pub mod parse;
pub mod sandbox;
pub mod types;
pub mod webhook;

pub use file::{line_col, list_or_none, parse_toml, read_toml, toml_files, valid_id, ConfigError};
pub use parse::{load_file, parse_workflow};
pub use sandbox::{Sandbox, SandboxSettings};
pub use types::*;

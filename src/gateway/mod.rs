//! The metered model gateway (issue 26, in progress): steward between each run and its
//! model provider, counting what is really spent rather than what the maker reports.
//!
//! Landed so far: [`meter`] reads the spend out of provider responses (whole JSON and
//! server-sent event streams, OpenAI's and Anthropic's shapes) and prices it; [`keys`]
//! issues the per-run keys a step shows instead of the real one; [`forward`] serves the
//! provider APIs on loopback, checks key and model, forwards with the real key and meters
//! each call as it passes; [`reserve`] reserves a call's worst case, lowers its output
//! limit to what the budget leaves, and says what a finished call charges. The meter and
//! the listener are tested with the official SDKs against a provider stand-in.
//!
//! Still to come: the daemon starting it for workflows that opt in with `[gateway]`,
//! feeding each step's budget (`StepRequest::metered`) through [`reserve`], and cutting
//! a stream at the cap.

pub mod forward;
pub mod keys;
pub mod meter;
pub mod reserve;

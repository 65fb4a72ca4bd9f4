//! The metered model gateway (issue 26, in progress): steward between each run and its
//! model provider, counting what is really spent rather than what the maker reports.
//!
//! Landed so far: [`meter`], which reads the spend out of provider responses (whole JSON
//! and server-sent event streams, OpenAI's and Anthropic's shapes) and prices it. The
//! listener that forwards a run's calls with the real key, the per-run keys and the
//! charging of the run's budget build on it.

pub mod meter;

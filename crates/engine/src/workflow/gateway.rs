//! `[gateway]`: the metered model gateway (see [`crate::gateway`]).
//!
//! In `steward.toml`, where the real providers are, their prices, and where the gateway
//! listens:
//!
//! ```toml
//! [gateway]
//! listen = "127.0.0.1:0"        # loopback only; port 0 picks a free one (the default)
//! log_bodies = false            # true: the runlog keeps each call's prompt and answer
//!
//! [gateway.upstream.openai]     # any OpenAI-compatible server: vLLM, llama.cpp, Ollama
//! base_url = "https://api.openai.com/v1"
//! key_env = "OPENAI_API_KEY"    # the real key, from the daemon's environment
//!
//! [gateway.pricing."gpt-4o-mini"]   # USD per million tokens
//! input = 0.15
//! output = 0.60
//! cached_input = 0.075
//! ```
//!
//! In a workflow, which providers and models its maker and checker may call:
//!
//! ```toml
//! [gateway]
//! providers = ["openai"]
//! models = ["gpt-4o-mini"]
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::metering::meter::{Price, Provider};

/// `[gateway]` in steward.toml.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GatewaySettings {
    /// Where the gateway listens: a loopback address (default `127.0.0.1:0`, a free port;
    /// steps are told the address, so no fixed port is needed).
    #[serde(default)]
    pub listen: Option<String>,
    #[serde(default)]
    pub upstream: UpstreamTable,
    /// USD per million tokens, per model name as a request gives it.
    #[serde(default)]
    pub pricing: BTreeMap<String, Price>,
    /// Keep each call's prompt and answer in the runlog (default: counts only).
    #[serde(default)]
    pub log_bodies: bool,
}

/// `[gateway.upstream.*]`: one table per provider.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTable {
    #[serde(default)]
    pub openai: Option<UpstreamSettings>,
    #[serde(default)]
    pub anthropic: Option<UpstreamSettings>,
}

/// One provider: where it is, and which of the daemon's variables holds its key.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSettings {
    /// As the provider's SDK takes it: OpenAI's ends in `/v1`
    /// (`https://api.openai.com/v1`, `http://127.0.0.1:11434/v1` for Ollama), Anthropic's
    /// does not (`https://api.anthropic.com`).
    #[serde(default)]
    pub base_url: Option<String>,
    /// The variable (or systemd credential) holding the real key.
    #[serde(default)]
    pub key_env: Option<String>,
}

/// Where a provider is and where its key is, with the defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UpstreamRef {
    pub provider: Provider,
    /// The base URL the gateway forwards to, ending in `/v1` for both providers.
    pub api_base: String,
    pub key_env: String,
}

impl GatewaySettings {
    /// The listen address (validated at load: loopback).
    pub fn listen_addr(&self) -> String {
        self.listen.clone().unwrap_or_else(|| "127.0.0.1:0".into())
    }

    /// Where `provider`'s calls go: its `[gateway.upstream.*]` table over the defaults
    /// (the provider's own API, its key in `OPENAI_API_KEY` or `ANTHROPIC_API_KEY`).
    pub fn upstream(&self, provider: Provider) -> UpstreamRef {
        let (table, base, key) = match provider {
            Provider::Openai => (
                &self.upstream.openai,
                "https://api.openai.com/v1",
                "OPENAI_API_KEY",
            ),
            Provider::Anthropic => (
                &self.upstream.anthropic,
                "https://api.anthropic.com",
                "ANTHROPIC_API_KEY",
            ),
        };
        let table = table.clone().unwrap_or_default();
        let base = table.base_url.unwrap_or_else(|| base.to_string());
        let base = base.trim_end_matches('/');
        let api_base = match provider {
            Provider::Openai => base.to_string(),
            Provider::Anthropic => format!("{base}/v1"),
        };
        UpstreamRef {
            provider,
            api_base,
            key_env: table.key_env.unwrap_or_else(|| key.to_string()),
        }
    }

    /// What is wrong with the table, as (key, problem).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        match self.listen_addr().parse::<std::net::SocketAddr>() {
            Ok(a) if a.ip().is_loopback() => {}
            Ok(a) => out.push((
                "listen".into(),
                format!("{a} is not a loopback address: the gateway serves the steps of this machine only"),
            )),
            Err(e) => out.push((
                "listen".into(),
                format!("expected an address such as \"127.0.0.1:0\": {e}"),
            )),
        }
        for provider in [Provider::Openai, Provider::Anthropic] {
            let base = self.upstream(provider).api_base;
            if !(base.starts_with("http://") || base.starts_with("https://")) {
                out.push((
                    "base_url".into(),
                    format!("`{base}` is not an http:// or https:// URL"),
                ));
            }
        }
        for (model, p) in &self.pricing {
            let prices = [Some(p.input), Some(p.output), p.cached_input];
            if prices.iter().flatten().any(|v| !v.is_finite() || *v < 0.0) {
                out.push((
                    model.clone(),
                    "prices are USD per million tokens: finite and not negative".into(),
                ));
            }
        }
        out
    }
}

/// `[gateway]` in a workflow: what its maker and checker may call, with what steward.toml
/// says of those providers and models resolved at load.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GatewayUse {
    pub providers: Vec<Provider>,
    pub models: Vec<String>,
    /// The upstream of each provider in `providers`.
    pub upstreams: Vec<UpstreamRef>,
    /// The price of each model in `models`.
    pub pricing: BTreeMap<String, Price>,
    pub log_bodies: bool,
}

impl GatewayUse {
    /// The use as a file gives it; [`GatewayUse::resolve`] adds what steward.toml says.
    pub fn new(mut providers: Vec<Provider>, models: Vec<String>) -> GatewayUse {
        providers.dedup();
        GatewayUse {
            providers,
            models,
            upstreams: Vec::new(),
            pricing: BTreeMap::new(),
            log_bodies: false,
        }
    }

    /// Fills in what steward.toml says (called once the settings are known).
    pub fn resolve(&mut self, settings: &GatewaySettings) {
        self.upstreams = self
            .providers
            .iter()
            .map(|p| settings.upstream(*p))
            .collect();
        self.pricing = self
            .models
            .iter()
            .filter_map(|m| Some((m.clone(), *settings.pricing.get(m)?)))
            .collect();
        self.log_bodies = settings.log_bodies;
    }

    /// One line for `steward validate`: providers, where each goes, the models and
    /// their prices, and any real key missing from this environment.
    pub fn summary(&self) -> String {
        let upstreams: Vec<String> = self
            .upstreams
            .iter()
            .map(|u| {
                let unset = if crate::secret::lookup(&u.key_env).is_none() {
                    format!(", ${} not set here: its calls will fail", u.key_env)
                } else {
                    String::new()
                };
                format!("{} at {}{unset}", u.provider.name(), u.api_base)
            })
            .collect();
        let models: Vec<String> = self
            .models
            .iter()
            .map(|m| match self.pricing.get(m) {
                Some(p) => format!("{m} (${}/${} per Mtok in/out)", p.input, p.output),
                None => m.clone(),
            })
            .collect();
        format!(
            "gateway: {}; models {}",
            upstreams.join(", "),
            models.join(", ")
        )
    }

    /// The models that have no price: their cost could not be held to `max_cost_usd`.
    pub fn unpriced(&self) -> Vec<&str> {
        self.models
            .iter()
            .filter(|m| !self.pricing.contains_key(*m))
            .map(String::as_str)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_default_to_the_providers_and_take_sdk_style_base_urls() {
        let s: GatewaySettings = toml::from_str(
            "[upstream.anthropic]\nbase_url = \"http://127.0.0.1:9/\"\nkey_env = \"K\"\n",
        )
        .unwrap();
        assert_eq!(
            s.upstream(Provider::Openai).api_base,
            "https://api.openai.com/v1"
        );
        assert_eq!(s.upstream(Provider::Openai).key_env, "OPENAI_API_KEY");
        let a = s.upstream(Provider::Anthropic);
        assert_eq!(
            (a.api_base.as_str(), a.key_env.as_str()),
            ("http://127.0.0.1:9/v1", "K")
        );
        assert!(s.problems().is_empty());
    }

    #[test]
    fn a_listen_address_off_loopback_and_a_negative_price_are_problems() {
        let s: GatewaySettings =
            toml::from_str("listen = \"0.0.0.0:80\"\n[pricing.m]\ninput = -1.0\noutput = 1.0\n")
                .unwrap();
        let keys: Vec<String> = s.problems().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["listen", "m"]);
    }
}

//! Three daemons of one cluster on one machine: one config folder, a state folder each,
//! one `nats-server` (see [`super::nats`]). What the cluster tests and the cluster's crash
//! harness start.

use super::nats::NatsServer;
use super::{Daemon, Env, Spec};

/// Three daemons on one config folder (the first `Env`'s), each with a state folder of
/// its own, on `server`. The live workflows are approved once, through the first state
/// folder: approvals are the cluster's.
pub struct Three {
    pub env: Env,
    pub views: Vec<Env>,
    pub daemons: Vec<Daemon>,
}

pub fn three(server: &NatsServer, workflows: &[Spec]) -> Three {
    three_with(server, workflows, |_| {})
}

/// [`three`], with `setup` applied to the config folder before the daemons start.
pub fn three_with(server: &NatsServer, workflows: &[Spec], setup: impl FnOnce(&Env)) -> Three {
    let env = Env::new();
    std::fs::write(
        env.config.join("steward.toml"),
        format!(
            "[cluster]\nnats = \"{}\"\nack_wait = \"5s\"\nheartbeat = \"2s\"\n",
            server.url()
        ),
    )
    .unwrap();
    for w in workflows {
        env.workflow(w);
    }
    setup(&env);
    let views: Vec<Env> = (0..3)
        .map(|i| Env {
            dir: tempfile::tempdir().unwrap(),
            config: env.config.clone(),
            state: env.path(&format!("state-{i}")),
        })
        .collect();
    // One approval, through one daemon's state folder, holds for the whole cluster.
    for w in workflows {
        let out = views[0].steward(&["go-live", &w.id]);
        assert_eq!(out.code, 0, "{out}");
    }
    let daemons = views.iter().map(|v| v.daemon(&[])).collect();
    Three {
        env,
        views,
        daemons,
    }
}

impl Three {
    /// What every commit saw on its stdin (the run's context), from the marks folder.
    pub fn commits(&self) -> Vec<serde_json::Value> {
        std::fs::read_dir(self.env.path("commits"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| std::fs::read(e.path()).ok())
                    .filter_map(|b| serde_json::from_slice(&b).ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn logs(&self) -> String {
        self.daemons
            .iter()
            .map(|d| d.log_text())
            .collect::<Vec<_>>()
            .join("\n----\n")
    }
}

/// A commit that keeps its context as `MARKS/commits/RUN_ID.json` (written whole, then
/// renamed, so a reader never sees half of one).
pub const KEEP_CONTEXT: &str = "mkdir -p \"$MARKS/commits\"\ncat > \"$MARKS/commits/.$STEWARD_RUN_ID\"\nmv \"$MARKS/commits/.$STEWARD_RUN_ID\" \"$MARKS/commits/$STEWARD_RUN_ID.json\"\n";

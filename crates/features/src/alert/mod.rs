//! Alerts: telling a person when something is wrong, so they need not ask.
//!
//! Whatever notices an exception (the engine after a run ends, the daemon's start-up and
//! its dead-man's check) calls [`Alerts::raise`], which never waits. For every
//! `[[notify]]` channel that wants the event it either hands the alert to a delivery task
//! or holds it back: a channel sends at most one alert per workflow and event per its
//! `every` (default 15 minutes). What it holds back it counts, and when the wait is over
//! a timer task sends the newest with how many came before it. Each delivery is its own
//! task, retried with backoff (`deliver`), so a channel that is down delays neither a
//! run nor another channel; an alert held back costs a lock and a map lookup. Each
//! outcome is a runlog `alert` line naming the channel by its label (a webhook's scheme,
//! host and port only: its path may hold a token).
//!
//! What alerting owes survives a restart (`owed`): a delivery is kept in the store
//! before its first attempt and resumes, with the attempts it has left, after a stop or a
//! crash; each carries a stable event id (`Idempotency-Key`) so a receiver can drop the
//! repeat a crash between sending and recording may cause. The rate windows are kept
//! too, so a restart neither repeats an alert inside its `every` nor forgets one held.

mod deliver;
mod owed;

pub use crate::alerts::{Alert, Alerts, Event};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::time::Instant;

use crate::alerts::Raise;
use crate::config::notify::NotifyChannel;
use crate::config::Smtp;
use crate::runlog::RunLog;

/// The daemon's dispatcher: what [`Alerts`] raised through it goes to the channels.
struct Dispatcher {
    inner: Arc<Inner>,
}

/// The channels alerts go to now, and the relay email channels use.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Channels {
    pub list: Vec<NotifyChannel>,
    pub smtp: Option<Smtp>,
}

impl Channels {
    /// The `[[notify]]` channels of a config, with the relay its email channels use.
    pub fn of(config: &crate::config::Config) -> Channels {
        Channels {
            list: config.settings.notify.clone(),
            smtp: config.settings.smtp.clone(),
        }
    }
}

/// The channels with the id each is gated under.
struct Current {
    channels: Channels,
    ids: Vec<String>,
}

impl Current {
    fn new(channels: Channels) -> Current {
        let ids = channels.list.iter().map(channel_id).collect();
        Current { channels, ids }
    }
}

use owed::GateKey;

fn channel_id(channel: &NotifyChannel) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(format!("{channel:?}").as_bytes())[..8])
}

/// One channel's memory of one workflow and event.
struct Gate {
    last_sent: Instant,
    /// `last_sent` on the wall clock, as the store keeps it.
    last_sent_at: chrono::DateTime<chrono::Utc>,
    held: u32,
    /// The newest alert held back, sent (with the count) once the wait is over.
    latest: Option<Alert>,
}

struct Inner {
    rt: tokio::runtime::Handle,
    current: watch::Receiver<Arc<Current>>,
    gates: Mutex<HashMap<GateKey, Gate>>,
    runlog: RunLog,
    owed: owed::Owed,
}

impl Gate {
    /// A window opened by a send at `at` (wall clock), held nothing yet.
    fn sent_at(at: chrono::DateTime<chrono::Utc>) -> Gate {
        let ago = (chrono::Utc::now() - at).to_std().unwrap_or_default();
        Gate {
            last_sent: Instant::now().checked_sub(ago).unwrap_or_else(Instant::now),
            last_sent_at: at,
            held: 0,
            latest: None,
        }
    }

    fn saved(&self) -> owed::SavedGate {
        owed::SavedGate {
            last_sent: self.last_sent_at,
            held: self.held,
            latest: self.latest.clone(),
        }
    }
}

impl Raise for Dispatcher {
    fn wants(&self, event: Event) -> bool {
        self.inner
            .current
            .borrow()
            .channels
            .list
            .iter()
            .any(|ch| ch.events.contains(&event))
    }

    fn raise(&self, alert: Alert) {
        let inner = &self.inner;
        let current = inner.current.borrow().clone();
        let mut gates = inner.gates.lock().unwrap_or_else(|p| p.into_inner());
        for (i, channel) in current.channels.list.iter().enumerate() {
            if !channel.events.contains(&alert.event) {
                continue;
            }
            let key = (current.ids[i].clone(), alert.workflow.clone(), alert.event);
            let every = channel.every();
            // Held back by this daemon's window, or by a send kept in the store (another
            // daemon's of the cluster) within it.
            let now = chrono::Utc::now();
            let open = match gates.get(&key) {
                Some(g) if g.last_sent.elapsed() < every => Err(g.last_sent_at),
                _ => inner.owed.take_window(&key, every, now),
            };
            match open {
                Err(sent_at) => {
                    let g = gates
                        .entry(key.clone())
                        .or_insert_with(|| Gate::sent_at(sent_at));
                    if g.latest.is_none() {
                        // The first one held back: release them when the wait is over.
                        inner.release_at(key.clone(), g.last_sent + every);
                    }
                    g.held += 1;
                    g.latest = Some(alert.clone());
                    inner.owed.save_gate(&key, &g.saved());
                    tracing::debug!(channel = %channel.label(), workflow = %alert.workflow, event = %alert.event, "alert held back ({} so far)", g.held);
                    deliver::record(
                        &inner.runlog,
                        &alert,
                        0,
                        "held",
                        format!(
                            "{} to {}: held back by its every ({} so far)",
                            alert.event,
                            channel.label(),
                            g.held
                        ),
                    );
                }
                Ok(()) => {
                    let gate = Gate::sent_at(now);
                    inner.owed.save_gate(&key, &gate.saved());
                    gates.insert(key.clone(), gate);
                    inner.deliver(
                        channel.clone(),
                        current.ids[i].clone(),
                        current.channels.smtp.clone(),
                        alert.clone(),
                        None,
                    );
                }
            }
        }
    }
}

impl Inner {
    /// Delivers `alert` to `channel` (of id `channel_id`) in a task of its own: kept in
    /// the store first, unless `resumed` (its key and the attempts already made).
    fn deliver(
        &self,
        channel: NotifyChannel,
        channel_id: String,
        smtp: Option<Smtp>,
        alert: Alert,
        resumed: Option<(String, u32)>,
    ) {
        let runlog = self.runlog.clone();
        let owed = self.owed.clone();
        let (key, made, fresh) = match resumed {
            Some((key, made)) => (key, made, false),
            None => {
                let pending = owed::Pending {
                    channel: channel_id.clone(),
                    alert: alert.clone(),
                    attempts_made: 0,
                };
                (owed.keep(&pending), 0, true)
            }
        };
        self.rt.spawn(async move {
            if fresh {
                let o = owed.clone();
                let _ = tokio::task::spawn_blocking(move || o.flush()).await;
            }
            let ledger = deliver::Ledger {
                owed,
                key,
                channel: channel_id,
            };
            deliver::with_retries(channel, smtp, alert, runlog, made, ledger).await
        });
    }

    fn release_at(self: &Arc<Self>, key: GateKey, wake: Instant) {
        let this = self.clone();
        self.rt.spawn(async move {
            tokio::time::sleep_until(wake).await;
            this.release(&key);
        });
    }

    /// A channel's wait for a workflow and event is over: send the newest alert it held
    /// back, with how many came before it — unless another daemon of the cluster sent one
    /// within the window meanwhile: then wait for the end of that one.
    fn release(self: &Arc<Self>, key: &GateKey) {
        let current = self.current.borrow().clone();
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        let Some(gate) = gates.get_mut(key) else {
            return;
        };
        if gate.latest.is_none() {
            return;
        }
        // A channel edited away in the meantime gets nothing.
        let Some(i) = current.ids.iter().position(|id| *id == key.0) else {
            gate.latest = None;
            return;
        };
        let channel = current.channels.list[i].clone();
        let now = chrono::Utc::now();
        if let Err(sent_at) = self.owed.take_window(key, channel.every(), now) {
            let behind = Gate::sent_at(sent_at);
            (gate.last_sent, gate.last_sent_at) = (behind.last_sent, behind.last_sent_at);
            self.release_at(key.clone(), gate.last_sent + channel.every());
            return;
        }
        let Some(mut latest) = gate.latest.take() else {
            return;
        };
        latest.held_back = gate.held.saturating_sub(1);
        *gate = Gate::sent_at(now);
        self.owed.save_gate(key, &gate.saved());
        self.deliver(
            channel,
            key.0.clone(),
            current.channels.smtp.clone(),
            latest,
            None,
        );
    }

    /// At start-up: the rate windows as they were, and the deliveries still owed, resumed
    /// with the attempts they have left.
    fn restore(self: &Arc<Self>) {
        let current = self.current.borrow().clone();
        let now_wall = chrono::Utc::now();
        let now = Instant::now();
        {
            let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
            for (key, saved) in self.owed.gates() {
                let Some(i) = current.ids.iter().position(|id| *id == key.0) else {
                    continue;
                };
                let ago = (now_wall - saved.last_sent).to_std().unwrap_or_default();
                let last_sent = now.checked_sub(ago).unwrap_or(now);
                if saved.latest.is_some() {
                    self.release_at(key.clone(), last_sent + current.channels.list[i].every());
                }
                gates.insert(
                    key,
                    Gate {
                        last_sent,
                        last_sent_at: saved.last_sent,
                        held: saved.held,
                        latest: saved.latest,
                    },
                );
            }
        }
        for (key, pending) in self.owed.pending() {
            match current.ids.iter().position(|id| *id == pending.channel) {
                Some(i) => {
                    tracing::info!(workflow = %pending.alert.workflow, event = %pending.alert.event, "alert still owed from before the restart: resuming its delivery");
                    self.deliver(
                        current.channels.list[i].clone(),
                        pending.channel.clone(),
                        current.channels.smtp.clone(),
                        pending.alert,
                        Some((key, pending.attempts_made)),
                    );
                }
                None => {
                    deliver::record(
                        &self.runlog,
                        &pending.alert,
                        pending.attempts_made,
                        "dropped",
                        format!(
                            "{}: owed from before the restart, but its channel is no longer in steward.toml",
                            pending.alert.event
                        ),
                    );
                    self.owed.done(&key);
                }
            }
        }
    }
}

/// The sending side of the channel list, for a config reload.
pub struct ChannelsUpdate(watch::Sender<Arc<Current>>);

impl ChannelsUpdate {
    pub fn set(&self, channels: Channels) {
        self.0.send_if_modified(|now| {
            let changed = now.channels != channels;
            if changed {
                *now = Arc::new(Current::new(channels));
            }
            changed
        });
    }
}

/// Starts alerting on the current runtime (deliveries and timers are its tasks); outside
/// one, alerts are off and the error says so. With a store, what was owed before a
/// restart is resumed ([`owed`]).
pub fn start(
    channels: Channels,
    runlog: RunLog,
    store: Option<crate::store::Store>,
) -> (Alerts, ChannelsUpdate) {
    let (tx, rx) = watch::channel(Arc::new(Current::new(channels)));
    let alerts = match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            let inner = Arc::new(Inner {
                rt,
                current: rx,
                gates: Mutex::new(HashMap::new()),
                runlog,
                owed: owed::Owed::new(store),
            });
            inner.restore();
            Alerts::to(Arc::new(Dispatcher { inner }))
        }
        Err(e) => {
            tracing::error!("alerts are off: no async runtime to deliver them on ({e})");
            Alerts::default()
        }
    };
    (alerts, ChannelsUpdate(tx))
}

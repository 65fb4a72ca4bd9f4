//! Alerts: telling a person when something is wrong, so they need not ask.
//!
//! Whatever notices an exception (the engine after a run ends, the daemon's start-up and
//! its dead-man's check) calls [`Alerts::raise`], which never waits: the alert goes onto
//! a bounded queue for one dispatcher task. The dispatcher hands each alert to every
//! `[[notify]]` channel that wants its event, at most one per workflow and event per the
//! channel's `every` (default 15 minutes); what it holds back it counts, and when the
//! wait is over it sends one alert saying how many were held back. Each delivery is its
//! own task, retried with backoff ([`deliver`]), so a channel that is down delays
//! neither a run nor another channel. Each outcome is a runlog `alert` line naming the
//! channel by its label (a webhook's scheme, host and port only: its path may hold a token).

mod deliver;
mod message;

pub use message::Alert;

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

pub use crate::config::notify::Event;
use crate::config::notify::NotifyChannel;
use crate::config::Smtp;
use crate::runlog::RunLog;

/// Alerts waiting for the dispatcher at most; beyond, an alert is dropped and logged.
const QUEUE: usize = 1024;

/// Where alerts are raised; clones share the dispatcher. `Alerts::default()` sends
/// nothing (the CLI's own process, tests of the engine alone).
#[derive(Clone, Default)]
pub struct Alerts {
    tx: Option<mpsc::Sender<Alert>>,
    channels: Option<watch::Receiver<Arc<Channels>>>,
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

impl Alerts {
    /// Whether any channel wants `event` (so a caller can skip the work of finding out).
    pub fn wants(&self, event: Event) -> bool {
        self.channels
            .as_ref()
            .is_some_and(|c| c.borrow().list.iter().any(|ch| ch.events.contains(&event)))
    }

    /// Queues an alert for the channels that want it; never waits.
    pub fn raise(&self, alert: Alert) {
        let Some(tx) = &self.tx else { return };
        if !self.wants(alert.event) {
            return;
        }
        if let Err(e) = tx.try_send(alert) {
            tracing::error!("alert dropped ({e}): the alert queue is full or closed");
        }
    }
}

/// The sending side of the channel list, for a config reload.
pub struct ChannelsUpdate(watch::Sender<Arc<Channels>>);

impl ChannelsUpdate {
    pub fn set(&self, channels: Channels) {
        self.0.send_if_modified(|now| {
            let changed = **now != channels;
            if changed {
                *now = Arc::new(channels);
            }
            changed
        });
    }
}

/// Starts the dispatcher on the current runtime.
pub fn start(channels: Channels, runlog: RunLog) -> (Alerts, ChannelsUpdate) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let (ctx, crx) = watch::channel(Arc::new(channels));
    tokio::spawn(Dispatcher::new(crx.clone(), runlog).run(rx));
    (
        Alerts {
            tx: Some(tx),
            channels: Some(crx),
        },
        ChannelsUpdate(ctx),
    )
}

/// One channel's memory of one workflow and event.
struct Gate {
    last_sent: Instant,
    held: u32,
    /// The newest alert held back, sent (with the count) once the wait is over.
    latest: Option<Alert>,
}

/// (channel id, workflow, event). The id is a hash of the whole channel table: two
/// webhooks on one host are two channels, and no URL is kept where a log could show it.
type GateKey = (String, String, Event);

fn channel_id(channel: &NotifyChannel) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(format!("{channel:?}").as_bytes())[..8])
}

struct Dispatcher {
    channels: watch::Receiver<Arc<Channels>>,
    runlog: RunLog,
    gates: HashMap<GateKey, Gate>,
}

impl Dispatcher {
    fn new(channels: watch::Receiver<Arc<Channels>>, runlog: RunLog) -> Dispatcher {
        Dispatcher {
            channels,
            runlog,
            gates: HashMap::new(),
        }
    }

    async fn run(mut self, mut alerts: mpsc::Receiver<Alert>) {
        let (due_tx, mut due) = mpsc::unbounded_channel::<GateKey>();
        loop {
            tokio::select! {
                alert = alerts.recv() => match alert {
                    Some(a) => self.take(a, &due_tx),
                    None => return,
                },
                Some(key) = due.recv() => self.release(key),
            }
        }
    }

    /// A new alert: to each channel that wants it, now or held back.
    fn take(&mut self, alert: Alert, due: &mpsc::UnboundedSender<GateKey>) {
        let channels = self.channels.borrow().clone();
        for channel in channels
            .list
            .iter()
            .filter(|c| c.events.contains(&alert.event))
        {
            let key = (channel_id(channel), alert.workflow.clone(), alert.event);
            let every = channel.every();
            match self.gates.get_mut(&key) {
                Some(g) if g.last_sent.elapsed() < every => {
                    if g.latest.is_none() {
                        // The first one held back: release them all when the wait is over.
                        let wake = g.last_sent + every;
                        let (due, key) = (due.clone(), key.clone());
                        tokio::spawn(async move {
                            tokio::time::sleep_until(wake).await;
                            let _ = due.send(key);
                        });
                    }
                    g.held += 1;
                    g.latest = Some(alert.clone());
                    tracing::info!(channel = %channel.label(), workflow = %alert.workflow, event = %alert.event, "alert held back ({} so far)", g.held);
                }
                _ => {
                    self.gates.insert(
                        key,
                        Gate {
                            last_sent: Instant::now(),
                            held: 0,
                            latest: None,
                        },
                    );
                    self.send(channel.clone(), channels.smtp.clone(), alert.clone());
                }
            }
        }
    }

    /// A channel's wait for a workflow and event is over: send what it held back.
    fn release(&mut self, key: GateKey) {
        let channels = self.channels.borrow().clone();
        let Some(gate) = self.gates.get_mut(&key) else {
            return;
        };
        let Some(mut latest) = gate.latest.take() else {
            return;
        };
        // The newest is sent; the ones before it are the count.
        latest.held_back = gate.held.saturating_sub(1);
        gate.held = 0;
        gate.last_sent = Instant::now();
        if let Some(channel) = channels.list.iter().find(|c| channel_id(c) == key.0) {
            self.send(channel.clone(), channels.smtp.clone(), latest);
        }
    }

    fn send(&self, channel: NotifyChannel, smtp: Option<Smtp>, alert: Alert) {
        let runlog = self.runlog.clone();
        tokio::spawn(deliver::with_retries(channel, smtp, alert, runlog));
    }
}

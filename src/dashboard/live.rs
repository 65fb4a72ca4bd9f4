//! The live log: `runlog.jsonl` as it grows, streamed to the page as Server-Sent Events
//! (one event per record, rendered as `steward logs` renders it). The file is the
//! source, so what the page shows is what the log holds, already redacted; a rotation is
//! followed to the new file.

use std::convert::Infallible;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::Response;
use futures_util::Stream;
use minijinja::context;

use super::context::Dashboard;

/// Records sent when the page opens, before the new ones.
const BACKLOG_BYTES: u64 = 16 << 10;
const POLL: Duration = Duration::from_millis(300);

pub async fn page(State(d): State<Arc<Dashboard>>) -> Response {
    super::render::render(&d, "live.html", context! { title => "Live log" })
}

/// Where the stream has read to.
struct Tail {
    path: PathBuf,
    offset: u64,
    /// A partial last line, kept until its newline arrives.
    partial: Vec<u8>,
    stop: tokio_util::sync::CancellationToken,
}

impl Tail {
    /// Complete new lines since the last read (from the start again after a rotation).
    fn read_new(&mut self) -> Vec<String> {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return Vec::new();
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        if len < self.offset {
            self.offset = 0;
            self.partial.clear();
        }
        if len == self.offset || file.seek(SeekFrom::Start(self.offset)).is_err() {
            return Vec::new();
        }
        let mut bytes = Vec::new();
        if file.take(4 << 20).read_to_end(&mut bytes).is_err() {
            return Vec::new();
        }
        self.offset += bytes.len() as u64;
        self.partial.extend_from_slice(&bytes);
        let Some(end) = self.partial.iter().rposition(|b| *b == b'\n') else {
            return Vec::new();
        };
        let complete: Vec<u8> = self.partial.drain(..=end).collect();
        complete
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(
                |l| match serde_json::from_slice::<crate::runlog::Entry>(l) {
                    Ok(e) => crate::runlog::render(&e),
                    Err(_) => String::from_utf8_lossy(l).into_owned(),
                },
            )
            .collect()
    }
}

pub async fn stream(
    State(d): State<Arc<Dashboard>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let path = crate::runlog::RunLog::path(&d.service.state_dir);
    let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let mut tail = Tail {
        path,
        offset: len.saturating_sub(BACKLOG_BYTES),
        partial: Vec::new(),
        stop: d.stop.clone(),
    };
    let mid_line = tail.offset > 0;
    let mut backlog = tail.read_new();
    // A backlog that starts mid-file starts mid-line: that first piece is dropped.
    if mid_line && !backlog.is_empty() {
        backlog.remove(0);
    }
    backlog.reverse();
    let events =
        futures_util::stream::unfold((tail, backlog), |(mut tail, mut queue)| async move {
            loop {
                if let Some(line) = queue.pop() {
                    return Some((Ok(Event::default().data(line)), (tail, queue)));
                }
                let mut lines = tail.read_new();
                if !lines.is_empty() {
                    lines.reverse();
                    queue = lines;
                    continue;
                }
                tokio::select! {
                    _ = tail.stop.cancelled() => return None,
                    _ = tokio::time::sleep(POLL) => {}
                }
            }
        });
    Sse::new(events).keep_alive(KeepAlive::default())
}

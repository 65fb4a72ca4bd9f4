//! A step's pipes: stdout and stderr read to their end under a size cap, and the fd-3
//! control channel read line by line, each line parsed as it comes.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{mpsc, Notify};

use crate::control::{self, Message};

/// Reads to EOF, keeping the first `cap` bytes (or the last, with `tail`).
pub(super) async fn read_capped<R: AsyncRead + Unpin>(
    mut r: R,
    cap: usize,
    tail: bool,
    activity: Arc<Notify>,
) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 8192];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        activity.notify_one();
        kept.extend_from_slice(&buf[..n]);
        if kept.len() > cap {
            if tail {
                let excess = kept.len() - cap;
                kept.drain(..excess);
            } else {
                kept.truncate(cap);
            }
        }
    }
    kept
}

/// Reads fd-3 lines, bounded in length, and sends each parsed message.
pub(super) async fn read_control(
    fd: OwnedFd,
    tx: mpsc::Sender<Result<Message, control::ParseError>>,
    activity: Arc<Notify>,
) {
    let Ok(mut pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return;
    };
    let mut line: Vec<u8> = Vec::new();
    let mut overlong = false;
    let mut buf = vec![0u8; 4096];
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        activity.notify_one();
        for &b in &buf[..n] {
            if b == b'\n' {
                let msg = if overlong {
                    Err(control::ParseError(format!(
                        "control line longer than {} bytes dropped",
                        control::MAX_LINE
                    )))
                } else {
                    control::parse(&String::from_utf8_lossy(&line))
                };
                line.clear();
                overlong = false;
                if tx.send(msg).await.is_err() {
                    return;
                }
            } else if line.len() < control::MAX_LINE {
                line.push(b);
            } else {
                overlong = true;
            }
        }
    }
    if !line.is_empty() {
        let _ = tx
            .send(control::parse(&String::from_utf8_lossy(&line)))
            .await;
    }
}

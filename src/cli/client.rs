//! The CLI's side of the control socket: sends one [`Request`] to a running daemon and
//! reads its [`Response`].

use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::api::{self, Request, RequestBody, Response, ResponseBody};
use crate::control_socket::socket_path;

/// Sends a request to the daemon on `state`, if one runs there; None means no daemon.
pub fn forward(state: &Path, request: &Request) -> Result<Option<Response>> {
    use std::io::{BufRead, BufReader, Write};
    let path = socket_path(state);
    let mut stream = match std::os::unix::net::UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None)
        }
        Err(e) => {
            return Err(e).with_context(|| format!("cannot reach the daemon at {}", path.display()))
        }
    };
    let bytes = api::encode(RequestBody {
        request: request.clone(),
    });
    // A refusal is written before the request is read: if sending fails, the answer
    // may still be waiting, so read it before reporting the failed send.
    let sent = stream.write_all(&bytes);
    let mut line = String::new();
    let read = BufReader::new(stream).read_line(&mut line);
    if line.trim().is_empty() {
        sent.with_context(|| format!("cannot talk to the daemon at {}", path.display()))?;
        read.context("the daemon closed the control socket without answering")?;
        bail!("the daemon closed the control socket without answering (is it stopping?)");
    }
    let ResponseBody { response } =
        api::decode(&line).context("unreadable reply from the daemon")?;
    Ok(Some(response))
}

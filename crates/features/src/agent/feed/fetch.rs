//! Getting a source's bytes: over HTTP(S) (reqwest, rustls: timeouts, a size cap, gzip,
//! conditional GET, a bounded redirect chain, a User-Agent naming steward), from a local
//! file, or from a command's stdout.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Largest document read from any source.
pub const MAX_FEED_BYTES: usize = 5 << 20;

/// Most redirects followed for one feed.
const MAX_REDIRECTS: usize = 5;

/// What a server said about a feed last time, to send back (conditional GET).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Validators {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_modified: Option<String>,
}

/// Why a source could not be read: the reason a digest shows for it.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error("http client: {0}")]
    Client(reqwest::Error),
    #[error("timed out after {0:.0}s")]
    TimedOut(f64),
    #[error("cannot connect")]
    CannotConnect,
    #[error("more than {MAX_REDIRECTS} redirects")]
    Redirects,
    #[error("fetch failed: {0}")]
    Fetch(reqwest::Error),
    #[error("HTTP {0}")]
    Status(u16),
    #[error("larger than {} MiB", MAX_FEED_BYTES >> 20)]
    TooLarge,
    #[error("cannot read {path}: {error}")]
    Unreadable {
        path: std::path::PathBuf,
        error: std::io::Error,
    },
    #[error("{0}")]
    Command(String),
    #[error("command exited with {0}")]
    CommandFailed(i32),
    #[error("no url, path or command")]
    NoSource,
    #[error("not a feed ({0})")]
    NotAFeed(feed_rs::parser::ParseFeedError),
}

/// An HTTP answer: the body (None for 304 Not Modified) and what to remember.
pub struct HttpAnswer {
    pub body: Option<Vec<u8>>,
    /// The `charset` of the answer's `Content-Type`, if it named one.
    pub charset: Option<String>,
    pub validators: Validators,
    pub moved_to: Option<String>,
}

pub async fn http(
    url: &str,
    timeout: Duration,
    sent: Option<&Validators>,
) -> Result<HttpAnswer, FeedError> {
    let moved = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let policy = {
        let moved = moved.clone();
        reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
            }
            let permanent = matches!(attempt.status().as_u16(), 301 | 308);
            let mut m = moved.lock().unwrap_or_else(|p| p.into_inner());
            // Only a chain of permanent redirects moves the feed for good.
            if permanent && (attempt.previous().len() == 1 || m.is_some()) {
                *m = Some(attempt.url().to_string());
            } else {
                *m = None;
            }
            attempt.follow()
        })
    };
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .user_agent(concat!(
            "steward/",
            env!("CARGO_PKG_VERSION"),
            " (feed reader)"
        ))
        .redirect(policy)
        .build()
        .map_err(FeedError::Client)?;
    let fail = |e: reqwest::Error| {
        if e.is_timeout() {
            FeedError::TimedOut(timeout.as_secs_f64())
        } else if e.is_connect() {
            FeedError::CannotConnect
        } else if e.is_redirect() {
            FeedError::Redirects
        } else {
            FeedError::Fetch(e)
        }
    };
    let mut request = client.get(url);
    if let Some(v) = sent {
        if let Some(etag) = &v.etag {
            request = request.header(reqwest::header::IF_NONE_MATCH, etag);
        }
        if let Some(lm) = &v.last_modified {
            request = request.header(reqwest::header::IF_MODIFIED_SINCE, lm);
        }
    }
    let mut resp = request.send().await.map_err(fail)?;
    let moved_to = moved.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let header = |name: reqwest::header::HeaderName| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    if resp.status() == reqwest::StatusCode::NOT_MODIFIED {
        // Nothing new, and the validators stay what they were.
        return Ok(HttpAnswer {
            body: None,
            charset: None,
            validators: sent.cloned().unwrap_or_default(),
            moved_to,
        });
    }
    if !resp.status().is_success() {
        return Err(FeedError::Status(resp.status().as_u16()));
    }
    let charset = header(reqwest::header::CONTENT_TYPE).and_then(|t| charset_of(&t));
    let validators = Validators {
        etag: header(reqwest::header::ETAG),
        last_modified: header(reqwest::header::LAST_MODIFIED),
    };
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(fail)? {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_FEED_BYTES {
            return Err(FeedError::TooLarge);
        }
    }
    Ok(HttpAnswer {
        body: Some(body),
        charset,
        validators,
        moved_to,
    })
}

pub fn file(path: &Path) -> Result<Vec<u8>, FeedError> {
    let unreadable = |error| FeedError::Unreadable {
        path: path.to_path_buf(),
        error,
    };
    let f = std::fs::File::open(path).map_err(unreadable)?;
    let mut bytes = Vec::new();
    f.take(MAX_FEED_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() > MAX_FEED_BYTES {
        return Err(FeedError::TooLarge);
    }
    Ok(bytes)
}

pub async fn command(argv: &[String], cwd: &Path, timeout: Duration) -> Result<Vec<u8>, FeedError> {
    let out = crate::helper::run(argv, cwd, None, timeout)
        .await
        .map_err(|e| FeedError::Command(e.to_string()))?;
    if out.code != 0 {
        return Err(FeedError::CommandFailed(out.code));
    }
    if out.stdout.len() > MAX_FEED_BYTES {
        return Err(FeedError::TooLarge);
    }
    Ok(out.stdout)
}

/// The `charset` parameter of a `Content-Type` value.
fn charset_of(content_type: &str) -> Option<String> {
    use mediatype::ReadParams;
    let media = mediatype::MediaType::parse(content_type).ok()?;
    media
        .get_param(mediatype::names::CHARSET)
        .map(|v| v.unquoted_str().to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_charset_is_read_from_the_content_type() {
        assert_eq!(
            super::charset_of("application/rss+xml; charset=\"ISO-8859-1\"").as_deref(),
            Some("ISO-8859-1")
        );
        assert_eq!(
            super::charset_of("text/xml;charset=utf-8").as_deref(),
            Some("utf-8")
        );
        assert_eq!(super::charset_of("text/xml"), None);
        assert_eq!(super::charset_of("not a type"), None);
    }
}

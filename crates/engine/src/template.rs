//! The idempotency key template: minijinja over the run context, strict about undefined
//! values (a key that silently rendered empty would make every fire collide), and
//! bounded: at most [`FUEL`] instructions, a result of at most [`MAX_KEY_BYTES`], and —
//! off the runtime's threads, through [`render_bounded`] — at most [`TIME_CAP`] of wall
//! time. A template past any bound fails its run with an error naming the template; it
//! never holds a thread the daemon needs.

use std::time::Duration;

use minijinja::{Environment, Error, ErrorKind, UndefinedBehavior, Value};

/// Instructions a key template may execute: far more than any key needs, far fewer than
/// a loop that would hold a thread for long (a few milliseconds of work).
pub const FUEL: u64 = 100_000;

/// The longest a key template may take, measured by whoever waits for it.
pub const TIME_CAP: Duration = Duration::from_secs(2);

/// The longest key a template may render.
pub const MAX_KEY_BYTES: usize = 4096;

/// Why a key template did not give a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// minijinja's message without its template dump; `bound`: a bound stopped it (out
    /// of fuel, a key too long).
    #[error("{message}")]
    Failed { message: String, bound: bool },
    #[error("rendered to an empty string")]
    Empty,
    #[error("the template panicked: {0}")]
    Panicked(String),
    #[error("took longer than {}s", TIME_CAP.as_secs())]
    TooSlow,
    /// What failed, named: the workflow's template and the template itself, shortened.
    #[error("{what} `{template}`: {error}")]
    Named {
        what: String,
        template: String,
        error: Box<TemplateError>,
    },
}

impl TemplateError {
    fn of(e: &Error) -> TemplateError {
        TemplateError::Failed {
            message: describe(e),
            bound: is_bound(e),
        }
    }
}

fn environment(undefined: UndefinedBehavior) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(undefined);
    env.set_fuel(Some(FUEL));
    env.add_filter("date", date_filter);
    env
}

/// `{{ trigger.scheduled_for | date }}` → `2026-06-20`; `| date("%Y-%m")` takes a chrono format.
fn date_filter(value: String, format: Option<String>) -> Result<String, Error> {
    let ts = chrono::DateTime::parse_from_rfc3339(&value).map_err(|e| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("date: `{value}` is not an RFC 3339 time ({e})"),
        )
    })?;
    let format = format.unwrap_or_else(|| "%Y-%m-%d".to_string());
    let items: Vec<_> = chrono::format::StrftimeItems::new(&format).collect();
    if items
        .iter()
        .any(|i| matches!(i, chrono::format::Item::Error))
    {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("date: bad format `{format}`"),
        ));
    }
    Ok(ts.format_with_items(items.into_iter()).to_string())
}

/// Checks that `source` compiles; the message is minijinja's, without the template dump.
pub fn check(source: &str) -> Result<(), TemplateError> {
    let env = environment(UndefinedBehavior::Strict);
    env.template_from_str(source)
        .map(|_| ())
        .map_err(|e| TemplateError::of(&e))
}

/// Renders `source` over `context`. An undefined value, an empty result, a result over
/// [`MAX_KEY_BYTES`] or a template that runs out of [`FUEL`] is an error.
pub fn render(source: &str, context: &serde_json::Value) -> Result<String, TemplateError> {
    render_with(source, context, UndefinedBehavior::Strict)
}

fn render_with(
    source: &str,
    context: &serde_json::Value,
    undefined: UndefinedBehavior,
) -> Result<String, TemplateError> {
    let env = environment(undefined);
    let tmpl = env
        .template_from_str(source)
        .map_err(|e| TemplateError::of(&e))?;
    let mut out = Capped(Vec::new());
    tmpl.render_captured_to(Value::from_serialize(context), &mut out)
        .map_err(|e| TemplateError::of(&e))?;
    let out = String::from_utf8_lossy(&out.0).trim().to_string();
    if out.is_empty() {
        return Err(TemplateError::Empty);
    }
    Ok(out)
}

/// Whether rendering stopped at a bound: out of fuel, or a key too long.
fn is_bound(e: &Error) -> bool {
    e.kind() == ErrorKind::OutOfFuel || e.kind() == ErrorKind::WriteFailure
}

/// [`render`] on a blocking thread, waited for at most [`TIME_CAP`]: what the daemon
/// calls, so no template runs on a runtime thread. The error names `what` (the
/// workflow's template) and the template itself.
pub async fn render_bounded(
    what: &str,
    source: &str,
    context: &serde_json::Value,
) -> Result<String, TemplateError> {
    let (owned, ctx) = (source.to_string(), context.clone());
    let job = tokio::task::spawn_blocking(move || render(&owned, &ctx));
    let result = match tokio::time::timeout(TIME_CAP, job).await {
        Ok(Ok(result)) => result,
        Ok(Err(e)) => Err(TemplateError::Panicked(e.to_string())),
        Err(_) => Err(TemplateError::TooSlow),
    };
    result.map_err(|e| TemplateError::Named {
        what: what.to_string(),
        template: shorten(source),
        error: Box::new(e),
    })
}

/// Renders `source` once over a sample context, undefined values allowed: what `steward
/// validate` does to find a template that runs past its bounds before any run does.
/// Only a bound is reported: a sample cannot tell a real fire's values.
pub fn try_sample(source: &str, context: &serde_json::Value) -> Result<(), TemplateError> {
    match render_with(source, context, UndefinedBehavior::Chainable) {
        Err(e @ TemplateError::Failed { bound: true, .. }) => Err(e),
        _ => Ok(()),
    }
}

/// A template as an error shows it: one line, at most 60 characters.
fn shorten(source: &str) -> String {
    let line: String = source.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(60) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line,
    }
}

/// A writer that refuses to grow past [`MAX_KEY_BYTES`].
struct Capped(Vec<u8>);

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_KEY_BYTES {
            return Err(std::io::Error::other(format!(
                "the key is longer than {MAX_KEY_BYTES} bytes"
            )));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn describe(e: &Error) -> String {
    if e.kind() == ErrorKind::OutOfFuel {
        return format!("ran past its budget of {FUEL} instructions (a loop too long for a key)");
    }
    if let Some(io) = std::error::Error::source(e).and_then(|s| s.downcast_ref::<std::io::Error>())
    {
        return io.to_string();
    }
    match e.detail() {
        Some(detail) => format!("{} ({detail})", e.kind()),
        None => e.kind().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_fields_and_dates() {
        let ctx = json!({"workflow": "w", "trigger": {"scheduled_for": "2026-06-20T07:00:00Z"}});
        assert_eq!(
            render("{{ workflow }}:{{ trigger.scheduled_for | date }}", &ctx).as_deref(),
            Ok("w:2026-06-20")
        );
    }

    #[test]
    fn undefined_is_an_error_not_an_empty_key() {
        let ctx = json!({"trigger": {}});
        assert!(render("{{ trigger.sha256 }}", &ctx).is_err());
    }

    #[test]
    fn a_loop_runs_out_of_fuel_instead_of_holding_the_thread() {
        let looping =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let started = std::time::Instant::now();
        let e = render(looping, &json!({})).unwrap_err();
        assert!(e.to_string().contains("budget"), "{e}");
        assert!(
            matches!(e, TemplateError::Failed { bound: true, .. }),
            "{e:?}"
        );
        assert!(started.elapsed() < TIME_CAP, "{:?}", started.elapsed());
        assert!(try_sample(looping, &json!({})).is_err());
    }

    #[test]
    fn a_key_longer_than_the_cap_is_an_error() {
        let e = render("{{ 'x' * 5000 }}", &json!({})).unwrap_err();
        assert!(e.to_string().contains("longer than"), "{e}");
        assert!(
            matches!(e, TemplateError::Failed { bound: true, .. }),
            "{e:?}"
        );
    }

    #[test]
    fn a_sample_render_allows_what_only_a_real_fire_defines() {
        assert!(try_sample("{{ trigger.payload.invoice }}", &json!({"trigger": {}})).is_ok());
    }

    #[test]
    fn syntax_errors_are_reported() {
        assert!(check("{{ trigger.sha256 ").is_err());
        assert!(check("{{ trigger.sha256 }}").is_ok());
    }
}

//! The idempotency key template: minijinja over the run context, strict about undefined
//! values (a key that silently rendered empty would make every fire collide).

use minijinja::{Environment, Error, ErrorKind, UndefinedBehavior, Value};

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
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
pub fn check(source: &str) -> Result<(), String> {
    let env = environment();
    env.template_from_str(source)
        .map(|_| ())
        .map_err(|e| describe(&e))
}

/// Renders `source` over `context`. An undefined value or an empty result is an error.
pub fn render(source: &str, context: &serde_json::Value) -> Result<String, String> {
    let env = environment();
    let tmpl = env.template_from_str(source).map_err(|e| describe(&e))?;
    let out = tmpl
        .render(Value::from_serialize(context))
        .map_err(|e| describe(&e))?;
    let out = out.trim().to_string();
    if out.is_empty() {
        return Err("rendered to an empty string".to_string());
    }
    Ok(out)
}

fn describe(e: &Error) -> String {
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
    fn syntax_errors_are_reported() {
        assert!(check("{{ trigger.sha256 ").is_err());
        assert!(check("{{ trigger.sha256 }}").is_ok());
    }
}

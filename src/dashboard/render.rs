//! The templates (compiled into the binary) and how a page is rendered from them.

use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use minijinja::{context, Environment, Value};

use super::context::Dashboard;

pub fn templates() -> Environment<'static> {
    let mut env = Environment::new();
    for (name, source) in [
        ("base.html", include_str!("templates/base.html")),
        ("overview.html", include_str!("templates/overview.html")),
        ("runs.html", include_str!("templates/runs.html")),
        ("run.html", include_str!("templates/run.html")),
        (
            "dead_letter.html",
            include_str!("templates/dead_letter.html"),
        ),
        ("review.html", include_str!("templates/review.html")),
        ("cases.html", include_str!("templates/cases.html")),
        ("case.html", include_str!("templates/case.html")),
        ("live.html", include_str!("templates/live.html")),
    ] {
        // The templates are part of the binary: one that does not compile is a build bug
        // that the page tests catch.
        if let Err(e) = env.add_template(name, source) {
            tracing::error!("dashboard template {name}: {e}");
        }
    }
    env
}

/// Renders `name` with the page's context plus what every page needs.
pub(super) fn render(d: &Dashboard, name: &str, page: Value) -> Response {
    let ctx =
        context! { csrf => d.keys.csrf(), page => page, version => env!("CARGO_PKG_VERSION") };
    match d.templates.get_template(name).and_then(|t| t.render(ctx)) {
        Ok(html) => ([(header::CACHE_CONTROL, "no-store")], Html(html)).into_response(),
        Err(e) => {
            // The details (with the values the template saw) go to the log, not the page.
            tracing::error!("dashboard: cannot render {name}: {e:#}");
            error_page(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("cannot render {name}: {e}"),
            )
        }
    }
}

pub(super) fn error_page(status: StatusCode, message: &str) -> Response {
    (
        status,
        [(header::CACHE_CONTROL, "no-store")],
        format!("{message}\n"),
    )
        .into_response()
}

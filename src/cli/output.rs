//! Writing to stdout the Unix way: a reader that has gone away (`steward logs | head -1`)
//! ends the output quietly instead of a panic.

/// Prints to stdout. A reader that has gone away (`steward logs | head -1`) is not an
/// error: the command has said all anyone will read, and ends with its own exit code.
/// Returns false once the reader is gone.
pub(super) fn print_out(text: &str) -> bool {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .is_ok()
}

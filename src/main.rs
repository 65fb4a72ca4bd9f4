//! The `steward` binary: parses the command line and hands over to the library.

fn main() {
    // Before anything opens a file: keep fd 3 for the steps' control channel.
    steward::step::reserve_control_fd();
    let code = steward::cli::main();
    steward::containment::release_all();
    std::process::exit(code);
}

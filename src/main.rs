//! The `steward` binary: parses the command line and hands over to the library.

fn main() {
    std::process::exit(steward::cli::main());
}

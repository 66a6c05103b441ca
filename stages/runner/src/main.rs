//! `pipeline`: runs embodyflow pipeline files (see the library docs).
fn main() -> std::process::ExitCode {
    embodyflow_core::cli::main_with(embodyflow_runner::run)
}

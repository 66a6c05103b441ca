//! `table`: inspect schemas, import JSON lines, print and validate tables.
fn main() -> std::process::ExitCode {
    embodyflow_core::cli::main_with(embodyflow_table::run)
}

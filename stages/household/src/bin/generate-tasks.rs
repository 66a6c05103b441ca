//! `generate-tasks`: household planning tasks as a tasks table.
fn main() -> std::process::ExitCode {
    embodyflow_core::cli::main_with(embodyflow_household::generate::run)
}

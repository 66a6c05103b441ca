//! `report`: step-credit analyses as Markdown and PNG.
fn main() -> std::process::ExitCode {
    embodyflow_core::cli::main_with(embodyflow_report::run)
}

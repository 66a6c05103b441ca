//! `teacher-logp`: teacher- and student-context log-probs of rollout responses.
fn main() -> std::process::ExitCode {
    embodyflow_core::cli::main_with(embodyflow_teacher_logp::run)
}

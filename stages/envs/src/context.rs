//! Text contexts built around a task's prompt: the student context (what the
//! policy reads) and the teacher context of OPSD-style forward_proxy step
//! rewards (the same problem plus the ground-truth plan, "privileged
//! information"), from templates that live in config, not in code.
//!
//! A template is text with placeholders:
//! - `{prompt}`: the environment's prompt for the task ([`TaskEnv::prompt`]);
//! - `{instruction}`: the task's instruction alone;
//! - `{reference_plan}`: the ground-truth plan, one `action_id: action_name`
//!   line per step (teacher templates only).
//!
//! Other braces are kept as they are (prompts and templates hold JSON), so
//! only `{name}` with a lowercase name counts as a placeholder, and an unknown
//! one is an error. The defaults follow the seeds' OPSD template
//! (`step-reward-gigpo-opsd-notes` §9.3: a header, begin/end markers around
//! the reference plan, a transition line) with the problem in front, so the
//! teacher context differs from the student context only by the reference
//! block:
//!
//! ```
//! use embodyflow_envs::context::{ContextTemplates, reference_plan};
//! use embodyflow_core::schemas::PlanAction;
//! let templates = ContextTemplates::default();
//! templates.check().unwrap();
//! let plan = [PlanAction { action_id: 12, action_name: "find a Mug".into() }];
//! let teacher = templates.render_teacher("Task: ...\n", "put a mug away", &reference_plan(&plan)).unwrap();
//! assert!(teacher.contains("=== Reference Plan Begin ===\n12: find a Mug\n"));
//! assert_eq!(templates.render_student("Task: ...\n", "put a mug away").unwrap(), "Task: ...\n");
//! ```
//!
//! [`TaskEnv::prompt`]: crate::TaskEnv::prompt

use std::fmt::Write as _;

use embodyflow_core::config::ConfigKeys;
use embodyflow_core::schemas::PlanAction;
use embodyflow_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// The default teacher context: the problem, then the reference plan.
pub const REFERENCE_TEMPLATE: &str = "{prompt}\nHere is a reference successful plan:\n=== Reference Plan Begin ===\n{reference_plan}=== Reference Plan End ===\nNow answer the task above.\n";

/// The default student context: the policy's own prompt.
pub const STUDENT_TEMPLATE: &str = "{prompt}";

const PLACEHOLDERS: [&str; 3] = ["prompt", "instruction", "reference_plan"];

/// The two templates of a teacher-student contrast, and the name recorded with
/// each row they produce. Each field's doc comment is its key's meaning
/// (`template.*` of the stages that read templates).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct ContextTemplates {
    /// Template name, recorded in the template column of teacher_logp.
    pub name: String,
    /// Teacher context template (must hold {reference_plan}).
    pub teacher: String,
    /// Student context template (must not hold {reference_plan}).
    pub student: String,
}

impl Default for ContextTemplates {
    fn default() -> Self {
        ContextTemplates {
            name: "reference_plan_v1".into(),
            teacher: REFERENCE_TEMPLATE.into(),
            student: STUDENT_TEMPLATE.into(),
        }
    }
}

/// The placeholders of `template`, in order, or an error naming an unknown one.
fn placeholders<'a>(template: &'a str, which: &str) -> Result<Vec<&'a str>> {
    let mut found = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        rest = &rest[open + 1..];
        let name_len = rest
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(rest.len());
        if name_len > 0 && rest[name_len..].starts_with('}') {
            let name = &rest[..name_len];
            if !PLACEHOLDERS.contains(&name) {
                return Err(Error::Usage(format!(
                    "template.{which}: unknown placeholder `{{{name}}}` (known: {})",
                    PLACEHOLDERS.map(|p| format!("{{{p}}}")).join(", ")
                )));
            }
            found.push(name);
        }
    }
    Ok(found)
}

impl ContextTemplates {
    /// Checks both templates: known placeholders only; the problem
    /// (`{prompt}` or `{instruction}`) in both; the reference plan in the
    /// teacher's and not in the student's.
    pub fn check(&self) -> Result<()> {
        let teacher = placeholders(&self.teacher, "teacher")?;
        let student = placeholders(&self.student, "student")?;
        if !teacher.contains(&"reference_plan") {
            return Err(Error::Usage(
                "template.teacher lacks the `{reference_plan}` placeholder: the teacher context must show the ground-truth plan".into(),
            ));
        }
        if student.contains(&"reference_plan") {
            return Err(Error::Usage(
                "template.student holds `{reference_plan}`: the student context must not see the ground-truth plan".into(),
            ));
        }
        for (which, found) in [("teacher", &teacher), ("student", &student)] {
            if !found.iter().any(|p| *p == "prompt" || *p == "instruction") {
                return Err(Error::Usage(format!(
                    "template.{which} lacks the problem: put `{{prompt}}` or `{{instruction}}` in it"
                )));
            }
        }
        if self.name.trim().is_empty() {
            return Err(Error::Usage("template.name is empty".into()));
        }
        Ok(())
    }

    /// The teacher context of a task.
    pub fn render_teacher(
        &self,
        prompt: &str,
        instruction: &str,
        reference: &str,
    ) -> Result<String> {
        render(&self.teacher, prompt, instruction, Some(reference))
    }

    /// The student context of a task.
    pub fn render_student(&self, prompt: &str, instruction: &str) -> Result<String> {
        render(&self.student, prompt, instruction, None)
    }
}

fn render(
    template: &str,
    prompt: &str,
    instruction: &str,
    reference: Option<&str>,
) -> Result<String> {
    let mut out = String::with_capacity(template.len() + prompt.len() + 256);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(after.len());
        let name = &after[..name_len];
        if name_len > 0 && after[name_len..].starts_with('}') {
            match (name, reference) {
                ("prompt", _) => out.push_str(prompt),
                ("instruction", _) => out.push_str(instruction),
                ("reference_plan", Some(plan)) => out.push_str(plan),
                _ => {
                    return Err(Error::Usage(format!(
                        "placeholder `{{{name}}}` cannot be filled here"
                    )));
                }
            }
            rest = &after[name_len + 1..];
        } else {
            out.push('{');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// A ground-truth plan as reference text: one `action_id: action_name` line per step.
pub fn reference_plan(actions: &[PlanAction]) -> String {
    let mut text = String::new();
    for action in actions {
        let _ = writeln!(text, "{}: {}", action.action_id, action.action_name);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_braces_are_text_and_placeholders_are_filled() {
        let templates = ContextTemplates {
            teacher: "{prompt} {\"a\": 1} {reference_plan}{instruction}".into(),
            ..ContextTemplates::default()
        };
        templates.check().unwrap();
        assert_eq!(
            templates.render_teacher("P", "I", "R\n").unwrap(),
            "P {\"a\": 1} R\nI"
        );
    }

    #[test]
    fn bad_templates_say_what_is_wrong() {
        let check = |teacher: &str, student: &str| {
            ContextTemplates {
                teacher: teacher.into(),
                student: student.into(),
                ..ContextTemplates::default()
            }
            .check()
            .unwrap_err()
            .to_string()
        };
        assert!(check("{prompt}", "{prompt}").contains("lacks the `{reference_plan}`"));
        assert!(
            check("{prompt}{reference_plan}", "{prompt}{reference_plan}").contains("must not see")
        );
        assert!(
            check("{prompt}{reference_plan}{plan}", "{prompt}")
                .contains("unknown placeholder `{plan}`")
        );
        assert!(
            check("{reference_plan}", "{prompt}").contains("template.teacher lacks the problem")
        );
    }
}

//! `estimator = "grpo_step"`, and StepOPSD on top of grpo, dr_grpo or
//! grpo_step (`stepopsd.enabled`): credit on the tokens of each plan step.
//!
//! ```text
//! grpo_step:  A_token = A^E + omega * A^S_token     (A^S on the step.credit_target tokens)
//! StepOPSD:   A <- stepopsd(A, teacher_logp - student_logp, alpha_clip, lambda_mix)
//! ```
//!
//! A^E is the group-normalised outcome of [`crate::grpo`] (centred only under
//! dr_grpo). A^S comes from `step.kind = rule` (+1 / -1 per plan step from the
//! rewards table's `step_match`) or `forward_proxy` (the teacher_logp table's
//! contrast on the `step.score_source` tokens), optionally scaled by a gate
//! (`residual_contrast`, or a judge's `step_gates` rows with `prompt`); it is
//! spread over the `step.credit_target` tokens (`action_name`, `action_id` or
//! `semantic`). Tokens are aligned with plan steps by the policy's tokenizer
//! (`--policy CKPT` or `step.tokenizer`). The maths lives in
//! `embodyflow_algos::{spans, step_adv}`; this module loads the tables it
//! needs, runs it over the rows of each steps batch in parallel and counts
//! what happened ([`StepDiagnostics`]: responses with non-zero A^S, parse
//! failures, offset fallbacks, span check failures and sign-flip ratios). A
//! response without a plan, or a step without a teacher_logp row, gets A^S = 0.
//!
//! E.g. a response whose two plan steps the rule marks right then wrong, in a
//! trajectory with A^E = 0.5 and omega = 0.5: the first step's action-name
//! tokens get 0.5 + 0.5 * 1 = 1.0, the second's 0.5 - 0.5 = 0.0, every other
//! token 0.5.
//!
//! `step.position_norm = true` (rule only) normalises the rule score of plan
//! step k over the group's trajectories that have a rule match at k, GiGPO's
//! step level with position k as the anchor (the step-reward notes'
//! optional upgrade): `A^S_k^i = (r_k^i - mean_j r_k^j) / (std_j + eps)`, unbiased std,
//! eps = `grpo.eps`; a position only one trajectory reaches gets 0. E.g. a
//! group whose matches are [1, 1] and [1, 0]: step 0 is right in both (A^S =
//! 0 for both), step 1 gets ±1 / (sqrt(2) + eps).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use arrow::array::{
    Array, BooleanArray, Float32Array, Int8Array, Int32Array, ListArray, RecordBatch, StringArray,
};
use embodyflow_algos::gigpo::{StepNorm, step_advantages, step_groups};
use embodyflow_algos::grpo::GroupNorm;
use embodyflow_algos::spans::{Aligner, OffsetMethod, StepPart};
use embodyflow_algos::step_adv::{
    Distribution, GateParams, ProxyParams, ScoreNorm, Squash, auc, combine,
    forward_proxy_step_scores, prompt_gate, residual_contrast_step_scores, rule_step_scores,
    spread_step_scores, stepopsd,
};
use embodyflow_core::config::{ConfigKeys, ensure, finite, in_range, positive};
use embodyflow_core::dataset::{TableReader, column};
use embodyflow_core::schemas::{AdvantageRow, TableName};
use embodyflow_core::stage::Summary;
use embodyflow_core::{Error, Result};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;

use crate::config::{Config, Section};
use crate::episodes::{self, Episodes, Groups, GrpoConfig, StepCounts};
use crate::estimator::{Build, Counts, Estimate, Estimator, Reported, StepsInput};
use crate::grpo;
use crate::outcome::Outcome;
use crate::output::AdvantagesOut;
use embodyflow_core::section::SectionConfig;

/// `estimator = "grpo_step"`.
pub(crate) static GRPO_STEP: Estimator = Estimator {
    name: "grpo_step",
    about: "grpo plus omega times a step advantage on each plan step's tokens",
    sections: &[episodes::GRPO, STEP, STEPOPSD],
    group_relative: true,
    reads: grpo_step_reads,
    check: |config| {
        let step: StepConfig = config.section("step");
        if step.gate == Gate::ResidualContrast && step.kind != StepKind::ForwardProxy {
            return Err(Error::BadValue {
                key: "step.gate".into(),
                reason: "residual_contrast gates the teacher-student contrast: it needs step.kind = forward_proxy".into(),
            });
        }
        Ok(())
    },
    build: |build| {
        let norm = build.config.section::<GrpoConfig>("grpo").norm(true);
        let step = build.config.section("step");
        Ok(Box::new(StepPath::load(build, norm, Some(step))?))
    },
};

/// The `step` section (grpo_step's A^S).
pub(crate) const STEP: Section = Section::of::<StepConfig>("step");

/// The `stepopsd` section: StepOPSD reweights the estimators that declare
/// it, and `stepopsd.enabled` with any other is refused.
pub(crate) const STEPOPSD: Section =
    Section::of::<StepOpsdConfig>("stepopsd").switched_by("enabled", "StepOPSD reweights");

/// Where A^S comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// +1 / -1 from the rule match against the ground-truth plan.
    Rule,
    /// The teacher-student log-prob contrast (needs the teacher_logp table).
    ForwardProxy,
}

/// Which gate scales each step's A^S.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gate {
    /// No gate.
    None,
    /// Residual contrast gates from the teacher-student contrast (forward_proxy).
    ResidualContrast,
    /// A judge's step_gates rows.
    Prompt,
}

/// `step.*` settings (grpo_step).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct StepConfig {
    /// Source of A^S: rule or forward_proxy.
    pub kind: StepKind,
    /// Weight omega of A^S in A = A^E + omega * A^S.
    pub omega: f32,
    /// Tokens that receive a step's A^S: action_name, action_id or both.
    pub credit_target: StepPart,
    /// forward_proxy: tokens whose log-probs score a step.
    pub score_source: StepPart,
    /// forward_proxy: score of a step: contrast (tanh of the teacher-student
    /// contrast) or prob.
    pub squash: Squash,
    /// forward_proxy: tanh temperature.
    pub score_tau: f32,
    /// forward_proxy: normalisation within a response: none or per_response.
    pub score_norm: ScoreNorm,
    /// Steps with fewer score tokens get A^S = 0.
    pub min_score_tokens: usize,
    /// Gate on each step's A^S: none, residual_contrast or prompt.
    pub gate: Gate,
    /// residual_contrast: importance z-score where the decision gate is 1/2.
    pub gate_threshold: f32,
    /// residual_contrast: decision sigmoid temperature.
    pub gate_tau: f32,
    /// residual_contrast: budget softmax temperature.
    pub budget_tau: f32,
    /// rule: normalise each plan step's score over the group's trajectories
    /// at the same step k.
    pub position_norm: bool,
    /// Policy tokenizer.json (unset: --policy CKPT/tokenizer.json).
    pub tokenizer: Option<PathBuf>,
}

impl Default for StepConfig {
    fn default() -> Self {
        StepConfig {
            kind: StepKind::Rule,
            omega: 1.0,
            credit_target: StepPart::ActionName,
            score_source: StepPart::ActionName,
            squash: Squash::Contrast,
            score_tau: 1.0,
            score_norm: ScoreNorm::None,
            min_score_tokens: 1,
            gate: Gate::None,
            gate_threshold: 0.0,
            gate_tau: 1.0,
            budget_tau: 1.0,
            position_norm: false,
            tokenizer: None,
        }
    }
}

impl SectionConfig<Config> for StepConfig {
    /// The `step.*` ranges: a finite non-negative omega, positive
    /// temperatures, a finite gate threshold; `step.position_norm` only with
    /// the rule's scores.
    fn check(&self, _: &Config) -> Result<()> {
        if self.position_norm && self.kind != StepKind::Rule {
            return Err(Error::BadValue {
                key: "step.position_norm".into(),
                reason: "normalises the rule's step scores per plan step: it needs step.kind = rule (forward_proxy scores exist only per response)".into(),
            });
        }
        ensure(
            self.omega.is_finite() && self.omega >= 0.0,
            "step.omega",
            "a finite number of at least 0",
            self.omega,
        )?;
        positive("step.score_tau", f64::from(self.score_tau))?;
        finite("step.gate_threshold", f64::from(self.gate_threshold))?;
        positive("step.gate_tau", f64::from(self.gate_tau))?;
        positive("step.budget_tau", f64::from(self.budget_tau))
    }
}

/// `stepopsd.*` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct StepOpsdConfig {
    /// StepOPSD: reweight the final advantage.
    pub enabled: bool,
    /// StepOPSD: weight w clipped to [1 - alpha_clip, 1 + alpha_clip].
    pub alpha_clip: f32,
    /// StepOPSD: mix between A (0) and w * A (1).
    pub lambda_mix: f32,
}

impl Default for StepOpsdConfig {
    fn default() -> Self {
        StepOpsdConfig {
            enabled: false,
            alpha_clip: 0.2,
            lambda_mix: 0.5,
        }
    }
}

impl SectionConfig<Config> for StepOpsdConfig {
    /// The `stepopsd.*` ranges: both in [0, 1] (the clip keeps w >= 0).
    fn check(&self, _: &Config) -> Result<()> {
        in_range("stepopsd.alpha_clip", f64::from(self.alpha_clip), 0.0, 1.0)?;
        in_range("stepopsd.lambda_mix", f64::from(self.lambda_mix), 0.0, 1.0)
    }
}

/// What grpo and dr_grpo read besides the steps: the teacher's log-probs
/// when StepOPSD reweights them (`stepopsd.enabled`).
pub(crate) fn stepopsd_reads(config: &Config) -> Vec<TableName> {
    let stepopsd: StepOpsdConfig = config.section("stepopsd");
    if stepopsd.enabled {
        vec![TableName::TeacherLogp]
    } else {
        Vec::new()
    }
}

/// What grpo_step reads besides the steps: the teacher's log-probs under
/// StepOPSD or `step.kind = forward_proxy`, the step gates under
/// `step.gate = prompt`.
fn grpo_step_reads(config: &Config) -> Vec<TableName> {
    let step: StepConfig = config.section("step");
    let mut reads = stepopsd_reads(config);
    if step.kind == StepKind::ForwardProxy && !reads.contains(&TableName::TeacherLogp) {
        reads.push(TableName::TeacherLogp);
    }
    if step.gate == Gate::Prompt {
        reads.push(TableName::StepGates);
    }
    reads
}

/// The step path with everything it reads besides the steps: the policy's
/// tokenizer, the rule matches, and the teacher log-probs and prompt gates
/// when the settings need them.
pub(crate) struct StepPath {
    tokenizer: Tokenizer,
    rule: HashMap<String, RuleInfo>,
    teacher: Option<TeacherLogps>,
    gates: Option<StepGates>,
    /// grpo_step settings, `None` for grpo / dr_grpo with StepOPSD.
    step: Option<StepConfig>,
    stepopsd: StepOpsdConfig,
    norm: GroupNorm,
    estimator: &'static str,
}

impl StepPath {
    /// Loads the tokenizer ([`tokenizer_path`]), the teacher_logp and
    /// step_gates inputs the settings need, and the rule matches from the
    /// rewards, before any row (the settings themselves were checked with the
    /// config). `step` is grpo_step's A^S settings, `None` for grpo or
    /// dr_grpo reweighted by StepOPSD.
    pub(crate) fn load(
        build: &Build<'_>,
        norm: GroupNorm,
        step: Option<StepConfig>,
    ) -> Result<StepPath> {
        let name = build.estimator.name;
        let tokenizer_path = tokenizer_path(build.config, build.policy).ok_or_else(|| {
            Error::Usage(format!("estimator {name} needs the policy's tokenizer: pass --policy CKPT or --set step.tokenizer=PATH"))
        })?;
        let tokenizer = Tokenizer::from_file(&tokenizer_path)
            .map_err(|e| Error::BadInput(format!("tokenizer {}: {e}", tokenizer_path.display())))?;
        let stepopsd: StepOpsdConfig = build.config.section("stepopsd");
        let reads = (build.estimator.reads)(build.config);
        let teacher = if reads.contains(&TableName::TeacherLogp) {
            Some(read_teacher(&(build.input)(TableName::TeacherLogp)?)?)
        } else {
            None
        };
        let gates = if reads.contains(&TableName::StepGates) {
            Some(read_gates(&(build.input)(TableName::StepGates)?)?)
        } else {
            None
        };
        Ok(StepPath {
            tokenizer,
            rule: read_rule_info(build.rewards)?,
            teacher,
            gates,
            step,
            stepopsd,
            norm,
            estimator: name,
        })
    }
}

/// The policy's tokenizer.json: `step.tokenizer`, else `policy`/tokenizer.json
/// (`None` without either).
pub(crate) fn tokenizer_path(config: &Config, policy: Option<&Path>) -> Option<PathBuf> {
    let step: StepConfig = config.section("step");
    step.tokenizer
        .or_else(|| policy.map(|p| p.join("tokenizer.json")))
}

impl Estimate for StepPath {
    /// Streams the steps once, aligning and scoring every owned step row;
    /// a teacher_logp input without a row for any step is bad input (it
    /// belongs to another rollout set).
    fn write(&self, input: &StepsInput<'_>, out: &mut AdvantagesOut) -> Result<Reported> {
        let episode_adv =
            Outcome::new(self.estimator, grpo::kernel(self.norm)).advantages(input)?;
        let aligner = Aligner::new(&self.tokenizer);
        let position_scores = self
            .step
            .as_ref()
            .is_some_and(|s| s.position_norm)
            .then(|| position_normalised(&self.rule, input.episodes, self.norm.eps));
        let inputs = StepInputs {
            aligner: &aligner,
            rule: &self.rule,
            position_scores: position_scores.as_ref(),
            teacher: self.teacher.as_ref(),
            gates: self.gates.as_ref(),
            step: self.step.as_ref(),
            stepopsd: &self.stepopsd,
            estimator: self.estimator,
        };
        let mut diagnostics = StepDiagnostics::default();
        let mut counts = StepCounts::new(input.episodes);
        input.for_each_batch("step advantages", |batch| {
            let rows = step_batch(
                batch,
                input.episodes,
                input.groups,
                &episode_adv,
                &inputs,
                &mut counts,
                &mut diagnostics,
            )?;
            out.write_rows(&rows)
        })?;
        counts.check()?;
        if self.teacher.is_some()
            && diagnostics.responses > 0
            && diagnostics.teacher_missing == diagnostics.responses
        {
            return Err(Error::BadInput(format!(
                "none of the {} steps has a teacher_logp row: the teacher_logp input belongs to another rollout set; run teacher-logp on this one",
                diagnostics.responses
            )));
        }
        diagnostics.finish();
        Ok(Some(Box::new(StepReport { step: diagnostics })))
    }
}

/// `step.position_norm`: each trajectory's rule scores normalised over its
/// group's trajectories at the same plan step k (those with a rule match
/// that long); a position one trajectory alone reaches gets 0.
pub(crate) fn position_normalised(
    rule: &HashMap<String, RuleInfo>,
    episodes: &Episodes,
    eps: f64,
) -> HashMap<String, Vec<f32>> {
    // Flattened over the trajectories with a rule match: each plan step's
    // score, group and position.
    let mut lengths = Vec::new();
    let (mut scores, mut groups, mut positions) = (Vec::new(), Vec::new(), Vec::new());
    for episode in episodes.list.iter().filter(|e| !e.faulted) {
        let Some(m) = rule
            .get(&episode.trajectory_id)
            .and_then(|r| r.step_match.as_ref())
        else {
            continue;
        };
        lengths.push((episode.trajectory_id.as_str(), m.len()));
        scores.extend(rule_step_scores(m));
        groups.extend(std::iter::repeat_n(episode.group, m.len()));
        positions.extend(0..m.len());
    }
    let (dense, _) = step_groups(&groups, &positions);
    let normalised = step_advantages(&scores, &dense, StepNorm::Std, eps);
    let mut end = 0;
    lengths
        .into_iter()
        .map(|(id, n)| {
            end += n;
            (id.to_string(), normalised[end - n..end].to_vec())
        })
        .collect()
}

/// Per trajectory: rule matches and success.
pub(crate) struct RuleInfo {
    /// Step matches, when the task had a ground-truth plan.
    pub step_match: Option<Vec<i8>>,
    /// Whether the trajectory succeeded.
    pub success: bool,
}

/// Reads step_match and success of every trajectory from rewards.
pub(crate) fn read_rule_info(rewards: &TableReader) -> Result<HashMap<String, RuleInfo>> {
    let mut info = HashMap::new();
    for batch in rewards.batches(Some(&["trajectory_id", "success", "step_match"]), 65_536)? {
        let batch = batch?;
        let ids = column::<StringArray>(&batch, "trajectory_id");
        let success = column::<BooleanArray>(&batch, "success");
        let matches = column::<ListArray>(&batch, "step_match");
        for i in 0..batch.num_rows() {
            let step_match = (!matches.is_null(i)).then(|| {
                let values = matches.value(i);
                values
                    .as_any()
                    .downcast_ref::<Int8Array>()
                    .expect("list<i8>")
                    .values()
                    .to_vec()
            });
            info.insert(
                ids.value(i).to_string(),
                RuleInfo {
                    step_match,
                    success: success.value(i),
                },
            );
        }
    }
    Ok(info)
}

/// Prompt gates per (trajectory, plan step).
pub(crate) type StepGates = HashMap<(String, i32), f32>;

/// Reads the step_gates table into combined gates.
pub(crate) fn read_gates(table: &TableReader) -> Result<StepGates> {
    let mut map = HashMap::new();
    let columns = [
        "trajectory_id",
        "plan_step",
        "decision_gate",
        "redundancy_gate",
        "causal_gate",
    ];
    for batch in table.batches(Some(&columns), 65_536)? {
        let batch = batch?;
        let ids = column::<StringArray>(&batch, "trajectory_id");
        let steps = column::<Int32Array>(&batch, "plan_step");
        let (d, r, c) = (
            column::<Float32Array>(&batch, "decision_gate"),
            column::<Float32Array>(&batch, "redundancy_gate"),
            column::<Float32Array>(&batch, "causal_gate"),
        );
        for i in 0..batch.num_rows() {
            let gate = prompt_gate(d.value(i), r.value(i), c.value(i));
            if !gate.is_finite() {
                return Err(Error::BadInput(format!(
                    "step_gates: trajectory `{}` plan step {}: gate is {gate}",
                    ids.value(i),
                    steps.value(i)
                )));
            }
            map.insert((ids.value(i).to_string(), steps.value(i)), gate);
        }
    }
    Ok(map)
}

/// Teacher and student log-probs per (trajectory, step).
pub(crate) type TeacherLogps = HashMap<(String, i32), (Vec<f32>, Vec<f32>)>;

/// Reads the teacher_logp table.
pub(crate) fn read_teacher(table: &TableReader) -> Result<TeacherLogps> {
    let mut map = HashMap::new();
    for batch in table.batches(
        Some(&[
            "trajectory_id",
            "step_index",
            "teacher_logp",
            "student_logp",
        ]),
        16_384,
    )? {
        let batch = batch?;
        let ids = column::<StringArray>(&batch, "trajectory_id");
        let steps = column::<Int32Array>(&batch, "step_index");
        let list = |name| {
            let array = column::<ListArray>(&batch, name);
            move |i: usize| {
                array
                    .value(i)
                    .as_any()
                    .downcast_ref::<Float32Array>()
                    .expect("list<f32>")
                    .values()
                    .to_vec()
            }
        };
        let (teacher, student) = (list("teacher_logp"), list("student_logp"));
        for i in 0..batch.num_rows() {
            map.insert(
                (ids.value(i).to_string(), steps.value(i)),
                (teacher(i), student(i)),
            );
        }
    }
    Ok(map)
}

/// Flipped and total credit-target tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct FlipCount {
    /// Tokens where sign(A) != sign(A^E).
    pub flipped: u64,
    /// Credit-target tokens counted.
    pub tokens: u64,
}

impl FlipCount {
    fn add(&mut self, other: FlipCount) {
        self.flipped += other.flipped;
        self.tokens += other.tokens;
    }

    /// flipped / tokens (0 without tokens).
    pub fn ratio(&self) -> f64 {
        if self.tokens == 0 {
            0.0
        } else {
            self.flipped as f64 / self.tokens as f64
        }
    }
}

/// The step path's counts, `step` in `diagnostics.json`.
#[derive(Debug, Serialize)]
pub(crate) struct StepReport {
    /// What the step path saw.
    pub step: StepDiagnostics,
}

impl Counts for StepReport {
    fn lines(&self, summary: &mut Summary) {
        add_step_lines(summary, &self.step);
    }
}

fn add_step_lines(summary: &mut Summary, step: &StepDiagnostics) {
    let ratio = |flips: &FlipCount| format!("{:.4} ({} tokens)", flips.ratio(), flips.tokens);
    summary
        .add(
            "responses with non-zero A^S",
            format!("{} of {}", step.responses_with_step_adv, step.responses),
        )
        .add("plan parse failures (A^S = 0)", step.parse_failures)
        .add(
            "offset fallbacks / span check failures",
            format!("{} / {}", step.offset_fallbacks, step.span_verify_failures),
        )
        .add(
            "step-count mismatches with the rule match",
            step.step_count_mismatches,
        )
        .add(
            "steps without a teacher_logp row (A^S = 0)",
            step.teacher_missing,
        )
        .add("sign-flip ratio: all", ratio(&step.sign_flips))
        .add(
            "sign-flip ratio: where A^E != 0",
            ratio(&step.sign_flips_episode_adv_nonzero),
        )
        .add(
            "sign-flip ratio: success / failure",
            format!(
                "{:.4} / {:.4}",
                step.sign_flips_success.ratio(),
                step.sign_flips_failure.ratio()
            ),
        )
        .add(
            "sign-flip ratio: rule-correct / rule-wrong",
            format!(
                "{:.4} / {:.4}",
                step.sign_flips_rule_correct.ratio(),
                step.sign_flips_rule_wrong.ratio()
            ),
        );
    if let (Some(right), Some(wrong)) = (&step.step_adv_rule_correct, &step.step_adv_rule_wrong) {
        let describe = |d: &Distribution| {
            format!(
                "{:.3} ± {:.3} (p10 {:.3}, p50 {:.3}, p90 {:.3}; {} steps)",
                d.mean, d.std, d.p10, d.p50, d.p90, d.count
            )
        };
        summary
            .add("A^S on rule-correct steps", describe(right))
            .add("A^S on rule-wrong steps", describe(wrong))
            .add(
                "AUC of A^S (correct vs wrong)",
                step.step_adv_auc
                    .map_or("n/a".into(), |a| format!("{a:.3}")),
            );
    }
}

/// What the step path saw.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StepDiagnostics {
    /// Responses processed.
    pub responses: u64,
    /// Responses with at least one non-zero A^S token.
    pub responses_with_step_adv: u64,
    /// Responses where no plan was found (A^S = 0).
    pub parse_failures: u64,
    /// Responses whose offsets came from incremental decoding.
    pub offset_fallbacks: u64,
    /// Step elements whose tokens failed the decode check.
    pub span_verify_failures: u64,
    /// Responses whose plan has another number of steps than their rule match (A^S = 0).
    pub step_count_mismatches: u64,
    /// Responses without a teacher_logp row (teacher-logp skipped them: A^S = 0, no StepOPSD).
    pub teacher_missing: u64,
    /// Sign flips over all credit-target tokens.
    pub sign_flips: FlipCount,
    /// ... of trajectories whose A^E != 0 (in a group where every rollout
    /// scored the same, A^E = 0 and any non-zero A counts as a flip above).
    pub sign_flips_episode_adv_nonzero: FlipCount,
    /// ... of successful trajectories.
    pub sign_flips_success: FlipCount,
    /// ... of failed trajectories.
    pub sign_flips_failure: FlipCount,
    /// ... of rule-correct steps.
    pub sign_flips_rule_correct: FlipCount,
    /// ... of rule-wrong steps.
    pub sign_flips_rule_wrong: FlipCount,
    /// forward_proxy: A^S of rule-correct steps.
    pub step_adv_rule_correct: Option<Distribution>,
    /// forward_proxy: A^S of rule-wrong steps.
    pub step_adv_rule_wrong: Option<Distribution>,
    /// forward_proxy: AUC of A^S separating rule-correct from rule-wrong steps.
    pub step_adv_auc: Option<f64>,
    #[serde(skip)]
    scores_correct: Vec<f32>,
    #[serde(skip)]
    scores_wrong: Vec<f32>,
}

impl StepDiagnostics {
    fn add(&mut self, other: &StepDiagnostics) {
        self.responses += other.responses;
        self.responses_with_step_adv += other.responses_with_step_adv;
        self.parse_failures += other.parse_failures;
        self.offset_fallbacks += other.offset_fallbacks;
        self.span_verify_failures += other.span_verify_failures;
        self.step_count_mismatches += other.step_count_mismatches;
        self.teacher_missing += other.teacher_missing;
        self.sign_flips.add(other.sign_flips);
        self.sign_flips_episode_adv_nonzero
            .add(other.sign_flips_episode_adv_nonzero);
        self.sign_flips_success.add(other.sign_flips_success);
        self.sign_flips_failure.add(other.sign_flips_failure);
        self.sign_flips_rule_correct
            .add(other.sign_flips_rule_correct);
        self.sign_flips_rule_wrong.add(other.sign_flips_rule_wrong);
        self.scores_correct.extend_from_slice(&other.scores_correct);
        self.scores_wrong.extend_from_slice(&other.scores_wrong);
    }

    /// Summarises the collected forward_proxy step scores.
    pub fn finish(&mut self) {
        if !self.scores_correct.is_empty() || !self.scores_wrong.is_empty() {
            self.step_adv_rule_correct = Some(Distribution::of(&self.scores_correct));
            self.step_adv_rule_wrong = Some(Distribution::of(&self.scores_wrong));
            self.step_adv_auc = auc(&self.scores_correct, &self.scores_wrong);
        }
    }
}

/// Everything the step path reads besides the steps.
pub(crate) struct StepInputs<'a> {
    /// Aligns tokens with plan steps (the policy's tokenizer).
    pub aligner: &'a Aligner<'a>,
    /// Rule matches and success per trajectory.
    pub rule: &'a HashMap<String, RuleInfo>,
    /// `step.position_norm`: the rule scores normalised per plan step over
    /// the group ([`position_normalised`]).
    pub position_scores: Option<&'a HashMap<String, Vec<f32>>>,
    /// Teacher log-probs, when forward_proxy or StepOPSD needs them.
    pub teacher: Option<&'a TeacherLogps>,
    /// Prompt gates, when `step.gate = prompt`.
    pub gates: Option<&'a StepGates>,
    /// grpo_step settings, `None` for plain GRPO with StepOPSD.
    pub step: Option<&'a StepConfig>,
    /// StepOPSD settings.
    pub stepopsd: &'a StepOpsdConfig,
    /// Estimator name written into the rows.
    pub estimator: &'a str,
}

fn sign(x: f32) -> i8 {
    if x > 0.0 {
        1
    } else if x < 0.0 {
        -1
    } else {
        0
    }
}

/// StepOPSD's mix of each token's advantage with the teacher-student
/// log-prob gap `t - s` on the credit-target tokens (0 elsewhere).
fn mix_stepopsd(
    advantages: &mut [f32],
    credit: &[Vec<usize>],
    t: &[f32],
    s: &[f32],
    config: &StepOpsdConfig,
) {
    let mut on_step = vec![false; advantages.len()];
    credit.iter().flatten().for_each(|&i| on_step[i] = true);
    for (i, a) in advantages.iter_mut().enumerate() {
        let delta = if on_step[i] { t[i] - s[i] } else { 0.0 };
        *a = stepopsd(*a, delta, config.alpha_clip, config.lambda_mix);
    }
}

/// Counts the credit-target tokens whose final advantage's sign differs
/// from the episode advantage's, overall and by episode outcome and rule
/// verdict of their plan step.
fn count_sign_flips(
    diag: &mut StepDiagnostics,
    credit: &[Vec<usize>],
    advantages: &[f32],
    episode_adv: f32,
    rule: Option<&RuleInfo>,
    plan_steps: usize,
) {
    let success = rule.is_some_and(|r| r.success);
    let step_match = rule
        .and_then(|r| r.step_match.as_ref())
        .filter(|m| m.len() == plan_steps);
    for (k, tokens) in credit.iter().enumerate() {
        let count = FlipCount {
            flipped: tokens
                .iter()
                .filter(|&&t| sign(advantages[t]) != sign(episode_adv))
                .count() as u64,
            tokens: tokens.len() as u64,
        };
        diag.sign_flips.add(count);
        if episode_adv != 0.0 {
            diag.sign_flips_episode_adv_nonzero.add(count)
        }
        if success {
            diag.sign_flips_success.add(count)
        } else {
            diag.sign_flips_failure.add(count)
        }
        match step_match.map(|m| m[k]) {
            Some(1) => diag.sign_flips_rule_correct.add(count),
            Some(_) => diag.sign_flips_rule_wrong.add(count),
            None => {}
        }
    }
}

/// A step's teacher and student log-probs, checked: one per response token, finite.
fn checked_teacher<'t>(
    trajectory_id: &str,
    step_index: i32,
    t: &'t [f32],
    s: &'t [f32],
    n: usize,
) -> Result<(&'t [f32], &'t [f32])> {
    if t.len() != n || s.len() != n {
        return Err(Error::BadInput(format!(
            "trajectory `{trajectory_id}` step {step_index}: teacher_logp has {} and student_logp {} entries, expected {n} (one per response token)",
            t.len(),
            s.len()
        )));
    }
    if let Some(bad) = t.iter().chain(s).find(|v| !v.is_finite()) {
        return Err(Error::BadInput(format!(
            "trajectory `{trajectory_id}` step {step_index}: a log-prob is {bad}, expected a finite number"
        )));
    }
    Ok((t, s))
}

/// One step row: its advantages and what happened.
fn step_row(
    trajectory_id: &str,
    step_index: i32,
    ids: &[u32],
    episode_adv: f32,
    inputs: &StepInputs<'_>,
) -> Result<(AdvantageRow, StepDiagnostics)> {
    let mut diag = StepDiagnostics {
        responses: 1,
        ..StepDiagnostics::default()
    };
    let n = ids.len();
    let teacher = match inputs.teacher {
        None => None,
        Some(map) => {
            match map.get(&(trajectory_id.to_string(), step_index)) {
                // teacher-logp skips (and counts) steps without a ground-truth
                // plan: no step data, A^S = 0. A rollout set without any
                // teacher rows is an error of the caller (see `run`).
                None => {
                    diag.teacher_missing = 1;
                    None
                }
                Some((t, s)) => Some(checked_teacher(trajectory_id, step_index, t, s, n)?),
            }
        }
    };
    let alignment = inputs.aligner.align(ids);
    diag.offset_fallbacks = u64::from(alignment.method == Some(OffsetMethod::IncrementalDecode));
    diag.span_verify_failures = alignment.verify_failures as u64;
    let steps = alignment.steps.unwrap_or_default();
    diag.parse_failures = u64::from(alignment.plan.is_none());
    let rule = inputs.rule.get(trajectory_id);
    let credit_part = inputs
        .step
        .map_or(StepPart::ActionName, |s| s.credit_target);
    let credit: Vec<Vec<usize>> = steps.iter().map(|s| s.tokens(credit_part)).collect();

    // A^S for grpo_step.
    let step_adv: Option<Vec<f32>> = match inputs.step {
        None => None,
        Some(config) => {
            let mut scores: Vec<f32> = match config.kind {
                StepKind::Rule => match rule.and_then(|r| r.step_match.as_ref()) {
                    Some(m) if m.len() == steps.len() => match inputs.position_scores {
                        Some(normalised) => normalised[trajectory_id].clone(),
                        None => rule_step_scores(m),
                    },
                    Some(_) if !steps.is_empty() => {
                        diag.step_count_mismatches = 1;
                        vec![0.0; steps.len()]
                    }
                    _ => vec![0.0; steps.len()],
                },
                StepKind::ForwardProxy => {
                    // No teacher row for this step: no step data.
                    let Some((t, s)) = teacher else {
                        return Ok(zero_step_row(
                            trajectory_id,
                            step_index,
                            n,
                            episode_adv,
                            inputs,
                            diag,
                        ));
                    };
                    let source: Vec<Vec<usize>> = steps
                        .iter()
                        .map(|st| st.tokens(config.score_source))
                        .collect();
                    let params = ProxyParams {
                        squash: config.squash,
                        score_tau: config.score_tau,
                        score_norm: config.score_norm,
                        min_score_tokens: config.min_score_tokens,
                    };
                    if config.gate == Gate::ResidualContrast {
                        let gate = GateParams {
                            threshold: config.gate_threshold,
                            gate_tau: config.gate_tau,
                            budget_tau: config.budget_tau,
                        };
                        residual_contrast_step_scores(t, s, &source, params, gate)
                    } else {
                        forward_proxy_step_scores(t, s, &source, params)
                    }
                }
            };
            if let Some(gates) = inputs.gates {
                for (k, score) in scores.iter_mut().enumerate() {
                    let Some(gate) = gates.get(&(trajectory_id.to_string(), k as i32)) else {
                        return Err(Error::BadInput(format!(
                            "trajectory `{trajectory_id}` plan step {k} has no step_gates row; run the step judge on this rollout set"
                        )));
                    };
                    *score *= gate;
                }
            }
            if config.kind == StepKind::ForwardProxy
                && let Some(m) = rule
                    .and_then(|r| r.step_match.as_ref())
                    .filter(|m| m.len() == scores.len())
            {
                for (&score, &matched) in scores.iter().zip(m) {
                    if matched == 1 {
                        diag.scores_correct.push(score)
                    } else {
                        diag.scores_wrong.push(score)
                    }
                }
            }
            Some(spread_step_scores(n, &credit, &scores))
        }
    };
    let omega = inputs.step.map_or(0.0, |s| s.omega);
    let mut advantages: Vec<f32> = match &step_adv {
        Some(a_s) => combine(episode_adv, omega, a_s),
        None => vec![episode_adv; n],
    };
    if inputs.stepopsd.enabled
        && let Some((t, s)) = teacher
    {
        mix_stepopsd(&mut advantages, &credit, t, s, inputs.stepopsd);
    }
    diag.responses_with_step_adv = u64::from(
        step_adv
            .as_ref()
            .is_some_and(|a| a.iter().any(|&x| x != 0.0)),
    );
    count_sign_flips(
        &mut diag,
        &credit,
        &advantages,
        episode_adv,
        rule,
        steps.len(),
    );
    let row = AdvantageRow {
        trajectory_id: trajectory_id.to_string(),
        step_index,
        advantages,
        returns: None,
        episode_adv,
        step_adv,
        estimator: inputs.estimator.to_string(),
    };
    Ok((row, diag))
}

/// The row of a step without step data: A = A^E on every token, A^S = 0.
fn zero_step_row(
    trajectory_id: &str,
    step_index: i32,
    n: usize,
    episode_adv: f32,
    inputs: &StepInputs<'_>,
    diag: StepDiagnostics,
) -> (AdvantageRow, StepDiagnostics) {
    let row = AdvantageRow {
        trajectory_id: trajectory_id.to_string(),
        step_index,
        advantages: vec![episode_adv; n],
        returns: None,
        episode_adv,
        step_adv: Some(vec![0.0; n]),
        estimator: inputs.estimator.to_string(),
    };
    (row, diag)
}

/// The advantages rows of one steps batch on the step path, in input order:
/// the rows of owned groups, scored in parallel.
fn step_batch(
    batch: &RecordBatch,
    episodes: &Episodes,
    groups: &Groups,
    episode_adv: &[f32],
    inputs: &StepInputs<'_>,
    counts: &mut StepCounts<'_>,
    diagnostics: &mut StepDiagnostics,
) -> Result<Vec<AdvantageRow>> {
    let ids = column::<StringArray>(batch, "trajectory_id");
    let index = column::<Int32Array>(batch, "step_index");
    let responses = column::<ListArray>(batch, "response_ids");
    let located = counts.locate(ids)?;
    if episodes.has_token_rewards() {
        counts.count_tokens(&located, responses);
    }
    let work: Vec<(usize, usize)> = located
        .into_iter()
        .enumerate()
        .filter(|&(_, e)| groups.owns(&episodes.list[e]))
        .collect();
    let results: Vec<Result<(AdvantageRow, StepDiagnostics)>> = work
        .par_iter()
        .map(|&(i, e)| {
            let list = responses.value(i);
            let tokens = list
                .as_any()
                .downcast_ref::<Int32Array>()
                .expect("list<i32>");
            let token_ids: Vec<u32> = tokens
                .values()
                .iter()
                .map(|&t| u32::try_from(t).unwrap_or(u32::MAX))
                .collect();
            step_row(
                ids.value(i),
                index.value(i),
                &token_ids,
                episode_adv[e],
                inputs,
            )
        })
        .collect();
    let mut rows = Vec::with_capacity(results.len());
    for result in results {
        let (row, diag) = result?;
        diagnostics.add(&diag);
        rows.push(row);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use embodyflow_algos::spans::test_tokenizer;
    use embodyflow_core::schemas::StepRow;

    use super::*;
    use crate::diagnostics::AdvantageStats;
    use crate::estimator::Report;
    use crate::testdata::{Fixture, exact, one_trajectory_run, step, with_and_without_fault};

    /// [`Fixture::run`] with the step path's counts read back.
    fn run_step(
        f: &Fixture,
        path: &StepPath,
        groups: &Groups,
        batch_rows: usize,
    ) -> Result<(Vec<AdvantageRow>, AdvantageStats, Option<StepDiagnostics>)> {
        let (rows, stats, reported) = f.run(path, groups, batch_rows)?;
        let counts = reported.map(|report| {
            let report: &dyn Report = &*report;
            let report: &dyn std::any::Any = report;
            let report = report.downcast_ref::<StepReport>().expect("a step report");
            report.step.clone()
        });
        Ok((rows, stats, counts))
    }

    #[test]
    fn the_step_counts_follow_the_runs_keys_and_lines() {
        let run = one_trajectory_run("grpo_step", &AdvantageStats::default());
        let report = StepReport {
            step: StepDiagnostics::default(),
        };
        let mut summary = run.summary("0/1");
        report.add_lines(&mut summary);
        let markdown = summary.to_markdown();
        assert!(markdown.contains("sign-flip ratio: all"), "{markdown}");
        assert!(report.to_json(&run).contains("\"step\": {"));
    }

    fn plan(steps: &[(i32, &str)]) -> String {
        let items: Vec<String> = steps
            .iter()
            .map(|(id, n)| format!("{{\"action_id\": {id}, \"action_name\": \"{n}\"}}"))
            .collect();
        format!("{{\"executable_plan\": [{}]}}<|im_end|>", items.join(", "))
    }

    /// Per trajectory: its text and rule match (`None`: no plan).
    fn answers() -> Vec<(&'static str, &'static str, f32, String, Option<Vec<i8>>)> {
        let right = plan(&[(12, "find a Mug"), (4, "pick up the Mug")]);
        let half = plan(&[(12, "find a Mug"), (7, "find a Sink")]);
        let broken = "{\"executable_plan\": [{\"action_id\": 12".to_string();
        vec![
            ("a", "g0", 1.0, right.clone(), Some(vec![1, 1])),
            ("b", "g0", 0.0, half.clone(), Some(vec![1, 0])),
            ("c", "g0", 0.0, broken.clone(), None),
            ("d", "g1", 1.0, half, Some(vec![1, 0])),
            ("e", "g1", 0.5, broken, None),
            ("f", "g1", 0.0, right, Some(vec![1, 1])),
        ]
    }

    fn fixture(tokenizer: &Tokenizer) -> Fixture {
        let (trajectories, steps) = inputs(tokenizer);
        Fixture::new(&trajectories, &steps)
    }

    /// The trajectories and steps of [`answers`], tokenised.
    fn inputs(
        tokenizer: &Tokenizer,
    ) -> (Vec<(&'static str, &'static str, f32, i32)>, Vec<StepRow>) {
        let answers = answers();
        let steps: Vec<StepRow> = answers
            .iter()
            .rev()
            .map(|(id, _, _, text, _)| {
                let ids: Vec<i32> = tokenizer
                    .encode(text.as_str(), false)
                    .unwrap()
                    .get_ids()
                    .iter()
                    .map(|&t| t as i32)
                    .collect();
                StepRow {
                    old_logprobs: vec![-1.0; ids.len()],
                    response_ids: ids,
                    ..step(id, 0, 0)
                }
            })
            .collect();
        let trajectories = answers
            .iter()
            .map(|&(id, group, score, _, _)| (id, group, score, 1))
            .collect();
        (trajectories, steps)
    }

    fn rule_path(teacher: Option<TeacherLogps>) -> StepPath {
        let rule = answers()
            .into_iter()
            .map(|(id, _, score, _, step_match)| {
                let info = RuleInfo {
                    step_match,
                    success: score == 1.0,
                };
                (id.to_string(), info)
            })
            .collect();
        StepPath {
            tokenizer: test_tokenizer(),
            rule,
            teacher,
            gates: None,
            step: Some(StepConfig {
                omega: 0.5,
                ..StepConfig::default()
            }),
            stepopsd: StepOpsdConfig::default(),
            norm: GroupNorm::default(),
            estimator: "grpo_step",
        }
    }

    #[test]
    fn golden_a_group_with_a_faulted_member_equals_the_group_without_it() {
        let (trajectories, steps) = inputs(&test_tokenizer());
        for position_norm in [false, true] {
            let mut path = rule_path(None);
            path.step.as_mut().unwrap().position_norm = position_norm;
            // b (half right, score 0) ended by a fault: g0 is a and c.
            let (with, without) = with_and_without_fault(&trajectories, &steps, "b", &path, true);
            assert_eq!(with.len(), 5, "b has no row");
            assert_eq!(
                exact(&with),
                exact(&without),
                "position_norm = {position_norm}"
            );
        }
    }

    #[test]
    fn rule_credit_lands_on_action_names_whatever_the_batch() {
        let tokenizer = test_tokenizer();
        let f = fixture(&tokenizer);
        let path = rule_path(None);
        let (rows, stats, diagnostics) = run_step(&f, &path, &f.all_groups(), 4).unwrap();
        let diagnostics = diagnostics.unwrap();
        assert_eq!(rows.len(), 6);
        assert_eq!(stats.steps, 6);
        assert_eq!(diagnostics.responses, 6);
        assert_eq!(diagnostics.parse_failures, 2);
        assert_eq!(diagnostics.responses_with_step_adv, 4);
        for row in &rows {
            let step_adv = row.step_adv.as_ref().unwrap();
            for (a, s) in row.advantages.iter().zip(step_adv) {
                assert_eq!(*a, row.episode_adv + 0.5 * s);
            }
            // The tokens credited +1 or -1 spell the plan's action names.
            let text = &answers()
                .into_iter()
                .find(|a| a.0 == row.trajectory_id)
                .unwrap()
                .3;
            let ids = tokenizer
                .encode(text.as_str(), false)
                .unwrap()
                .get_ids()
                .to_vec();
            let credited = |sign: f32| -> String {
                let picked: Vec<u32> = step_adv
                    .iter()
                    .zip(&ids)
                    .filter(|&(&s, _)| s == sign)
                    .map(|(_, &id)| id)
                    .collect();
                tokenizer.decode(&picked, false).unwrap()
            };
            let (up, down) = (credited(1.0), credited(-1.0));
            match row.trajectory_id.as_str() {
                "c" | "e" => assert!(up.is_empty() && down.is_empty(), "{row:?}"),
                "a" | "f" => {
                    assert!(
                        up.contains("find a Mug") && up.contains("pick up the Mug"),
                        "{up}"
                    );
                    assert!(down.is_empty(), "{down}");
                }
                _ => {
                    assert!(up.contains("find a Mug") && !up.contains("Sink"), "{up}");
                    assert!(down.contains("find a Sink"), "{down}");
                }
            }
        }
        for batch_rows in [1, 2, 64] {
            let again = run_step(&f, &path, &f.all_groups(), batch_rows).unwrap();
            assert_eq!(again, (rows.clone(), stats, Some(diagnostics.clone())));
        }
    }

    #[test]
    fn position_norm_compares_each_plan_step_with_the_group_at_that_step() {
        let tokenizer = test_tokenizer();
        let f = fixture(&tokenizer);
        let mut path = rule_path(None);
        let plain = run_step(&f, &path, &f.all_groups(), 4).unwrap().0;
        path.step.as_mut().unwrap().position_norm = true;
        let (rows, _, _) = run_step(&f, &path, &f.all_groups(), 4).unwrap();
        // g0: a [1, 1], b [1, 0] (c has no plan); g1: d [1, 0], f [1, 1].
        // Step 0 is right everywhere: 0. Step 1: +-1 / (sqrt(2) + 1e-6).
        let d = (1.0 / (2.0f64.sqrt() + 1e-6)) as f32;
        let normalised = position_normalised(&path.rule, &f.episodes, 1e-6);
        assert_eq!(normalised["a"], [0.0, d]);
        assert_eq!(normalised["b"], [0.0, -d]);
        assert_eq!(normalised["d"], [0.0, -d]);
        assert_eq!(normalised["f"], [0.0, d]);
        assert!(!normalised.contains_key("c"));
        for (row, before) in rows.iter().zip(&plain) {
            let step_adv = row.step_adv.as_ref().unwrap();
            let old = before.step_adv.as_ref().unwrap();
            // The plain +1 / -1 tokens of step 1 now carry +-d, step 0's carry 0:
            // the credited tokens are the same, only their values change.
            let values: Vec<f32> = step_adv.iter().copied().filter(|&s| s != 0.0).collect();
            match row.trajectory_id.as_str() {
                "a" | "f" => assert!(!values.is_empty() && values.iter().all(|&s| s == d)),
                "b" | "d" => assert!(!values.is_empty() && values.iter().all(|&s| s == -d)),
                _ => assert!(values.is_empty()),
            }
            for ((s, o), a) in step_adv.iter().zip(old).zip(&row.advantages) {
                assert!(*s == 0.0 || *o != 0.0, "credit only where the rule put it");
                assert_eq!(*a, row.episode_adv + 0.5 * s);
            }
        }
        // A position only one trajectory reaches gets 0.
        let lone = HashMap::from([(
            "a".to_string(),
            RuleInfo {
                step_match: Some(vec![1, 0, 1]),
                success: true,
            },
        )]);
        assert_eq!(position_normalised(&lone, &f.episodes, 1e-6)["a"], [0.0; 3]);
    }

    #[test]
    fn only_owned_groups_are_scored_and_written() {
        let tokenizer = test_tokenizer();
        let f = fixture(&tokenizer);
        let groups = Groups {
            kept: vec![true, true],
            owned: vec![false, true],
        };
        let (rows, stats, diagnostics) = run_step(&f, &rule_path(None), &groups, 4).unwrap();
        let ids: Vec<&str> = rows.iter().map(|r| r.trajectory_id.as_str()).collect();
        assert_eq!(ids, ["d", "e", "f"]);
        assert_eq!(stats.steps, 3);
        assert_eq!(diagnostics.unwrap().responses, 3);
    }

    #[test]
    fn a_teacher_table_of_another_rollout_set_is_bad_input() {
        let tokenizer = test_tokenizer();
        let f = fixture(&tokenizer);
        let other = TeacherLogps::from([(("zz".to_string(), 0), (vec![-1.0], vec![-1.0]))]);
        let error = f
            .run(&rule_path(Some(other)), &f.all_groups(), 4)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("none of the 6 steps has a teacher_logp row"),
            "{error}"
        );
    }
}

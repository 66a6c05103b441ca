//! The `teacher-logp` stage: the log-prob of every response token of a
//! rollout set under two contexts of one teacher model, for forward_proxy
//! step rewards and StepOPSD (docs/src/algorithms/grpo-step.md, `step-reward-gigpo-opsd-notes`
//! §6.2, §9.3):
//!
//! ```text
//! teacher context = template.teacher (the problem + the ground-truth plan) + <|plan|> + response
//! student context = template.student (the problem alone)                  + <|plan|> + response
//! contrast d_t    = teacher_logp_t - student_logp_t
//! ```
//!
//! Both contexts go through the *same* model (the seeds' Finding 2: mixing a
//! separate teacher with the policy's old log-probs is not a clean contrast),
//! teacher-forcing the rollout's exact response ids, so the two log-prob
//! lists align 1:1 with the response tokens and with the step spans
//! `compute-advantages` finds. The teacher is `--teacher self` (the policy
//! checkpoint) or another checkpoint whose tokenizer must equal the
//! policy's: of the policy's network, or a vision-language teacher of a
//! Hugging Face text policy (its rollouts scored by a teacher that also sees
//! the task's scene image). `{prompt}` in a template is the prompt the policy actually saw
//! (the rollout's `prompt_ids`, decoded; for a Hugging Face policy the user
//! message's text, read out with the policy's chat template, and each
//! context rendered with the teacher's, so a teacher of another template
//! but the same tokenizer reads what the policy read), `{instruction}` the task's
//! instruction and `{reference_plan}` its `gt_actions` (see
//! [`embodyflow_envs::context`]).
//!
//! A step whose task has no ground-truth plan is skipped and counted (an
//! error under `--strict`), as is a step whose teacher context and response do
//! not fit in the teacher's `n_ctx` and one whose response holds the image
//! or video placeholder of a teacher that reads images; `compute-advantages` gives such steps no
//! step advantage. A response id outside the teacher's vocabulary, a tokenizer
//! that differs from the policy's or a template without its placeholder is an
//! error before anything is written. Each batch of `batch_rows` steps runs
//! its teacher and student contexts through the model together (one forward
//! pass of 2 x `batch_rows` sequences). Steps are batched in [`batch_order`]:
//! a group's G steps (one task, one prompt: the same two contexts) side by
//! side, so they share a batch and the scorer encodes each context once for
//! all of them. Entropies are not computed (nothing here reads them).
//!
//! ```text
//! teacher-logp --policy runs/it3/policy --teacher self --input runs/it3/rollouts \
//!     --input data/train --out runs/it3/teacher
//! teacher-logp --policy runs/it3/policy --teacher runs/generalist/policy --input runs/it3/rollouts \
//!     --input data/train --out runs/it3/teacher-generalist --device cuda:0
//! ```

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use embodyflow_core::cli::{PolicyArg, StageArgs, TeacherArg};
use embodyflow_core::config::{ConfigKeys, at_least, keys_of, positive};
use embodyflow_core::schemas::{StepRow, TableName, TaskRow, TeacherLogpRow, TrajectoryRow};
use embodyflow_core::spec;
use embodyflow_core::stage::{OutputConfig, Stage, StageConfig, Summary};
use embodyflow_core::{Error, progress};
use embodyflow_envs::TaskEnv;
use embodyflow_envs::context::{ContextTemplates, reference_plan};
use embodyflow_models::ModelError;
use embodyflow_models::checkpoint::{Checkpoint, PolicyNet};
use embodyflow_models::gpt::Gpt;
use embodyflow_models::hf::HfNet;
use embodyflow_models::images::decode_images;
use embodyflow_models::net::NetSpec;
use embodyflow_models::policy::{Entropy, PlanNet, RgbImage, score_responses};
use embodyflow_models::registry::policy_net;
use embodyflow_models::vl::VlPolicy;
use serde::{Deserialize, Serialize};

/// Command line of `teacher-logp`.
#[derive(Debug, clap::Parser)]
#[command(
    name = spec::TEACHER_LOGP.name,
    version,
    about = spec::TEACHER_LOGP.purpose,
    after_help = spec::TEACHER_LOGP.help_with_config::<Config>()
)]
pub struct Args {
    #[command(flatten)]
    stage: StageArgs,
    #[command(flatten)]
    policy: PolicyArg,
    /// `self` (the policy is its own teacher) or a teacher checkpoint directory.
    #[command(flatten)]
    teacher: TeacherArg,
    /// Fail on a step whose task has no ground-truth plan instead of skipping it.
    #[arg(long)]
    strict: bool,
}

/// The stage's config. Each field's doc comment is its key's meaning
/// (`--help`; `template.*`: [`ContextTemplates`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Teacher and student context templates.
    #[keys(section)]
    pub template: ContextTemplates,
    /// Steps per forward pass (each a teacher and a student sequence).
    pub batch_rows: usize,
    /// Log-probs of logits / temperature (1: the model's own distribution).
    pub temperature: f64,
    /// Output layout.
    #[keys(skip)]
    pub output: OutputConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            template: ContextTemplates::default(),
            batch_rows: 16,
            temperature: 1.0,
            output: OutputConfig::default(),
        }
    }
}

impl StageConfig for Config {
    fn key_docs() -> Vec<(String, &'static str)> {
        keys_of::<Config>()
    }

    fn output(&self) -> &OutputConfig {
        &self.output
    }

    fn validate(&self) -> embodyflow_core::Result<()> {
        self.template.check().map_err(|e| Error::BadValue {
            key: "template".into(),
            reason: e.to_string(),
        })?;
        at_least("batch_rows", self.batch_rows, 1)?;
        positive("temperature", self.temperature)
    }
}

/// One step to score: both contexts (ending in `<|plan|>`) and the response.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Trajectory of the step.
    pub trajectory_id: String,
    /// Step index.
    pub step_index: i32,
    /// Teacher context ids.
    pub teacher_context: Vec<i32>,
    /// Student context ids.
    pub student_context: Vec<i32>,
    /// The rollout's response ids.
    pub response: Vec<i32>,
    /// The images both contexts carry, when the teacher reads images: those
    /// the policy saw (`steps.observation`), or for a policy that recorded
    /// none (a text policy) the task's scene image drawn again from its row
    /// ([`TaskEnv::image`]).
    pub images: Vec<RgbImage>,
}

/// Steps left out, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skipped {
    /// The task has no ground-truth plan.
    pub no_reference: usize,
    /// The teacher context and the response exceed the teacher's `n_ctx`.
    pub too_long: usize,
    /// The response holds the token a teacher that reads images takes for
    /// an image placeholder (a text policy may sample it), which has no
    /// image to stand for.
    pub image_placeholder: usize,
    /// The response holds the video placeholder of a teacher that reads
    /// images (`<|video_pad|>`), which no video fills.
    pub video_placeholder: usize,
}

/// Builds the two contexts of every step, checking the response ids against
/// the teacher's vocabulary. The task text is read out of the prompt the
/// policy saw with the policy's prompt format (its chat template), and the
/// contexts are rendered with the teacher's: a teacher of another template
/// (same tokenizer) reads the text the policy read. A teacher that reads
/// images gets the step's recorded images or, when it has none, the task's
/// scene image ([`TaskEnv::image`]); one that reads text only gets none.
pub fn build_jobs<P: PlanNet, T: PlanNet>(
    policy: &Checkpoint<P>,
    teacher: &Checkpoint<T>,
    templates: &ContextTemplates,
    trajectories: &[TrajectoryRow],
    steps: &[StepRow],
    tasks: &HashMap<&str, &TaskRow>,
    strict: bool,
) -> Result<(Vec<Job>, Skipped), ModelError> {
    let vocab = T::vocab_size(teacher.model.config());
    let n_ctx = teacher.model.max_len();
    let task_of: HashMap<&str, &str> = trajectories
        .iter()
        .map(|t| (t.trajectory_id.as_str(), t.task_id.as_str()))
        .collect();
    let mut jobs = Vec::with_capacity(steps.len());
    let mut skipped = Skipped::default();
    for step in steps {
        let at = || {
            format!(
                "trajectory `{}` step {}",
                step.trajectory_id, step.step_index
            )
        };
        let task_id = task_of.get(step.trajectory_id.as_str()).ok_or_else(|| {
            Error::BadInput(format!("{} has no row in the trajectories table", at()))
        })?;
        let task = tasks.get(task_id).ok_or_else(|| {
            Error::BadInput(format!(
                "{}: task `{task_id}` is not in the input tasks table",
                at()
            ))
        })?;
        if let Some(&bad) = step
            .response_ids
            .iter()
            .find(|&&id| id < 0 || i64::from(id) >= vocab)
        {
            return Err(Error::BadInput(format!(
                "{}: response id {bad} is outside the teacher's vocabulary of {vocab} tokens",
                at()
            ))
            .into());
        }
        if teacher
            .model
            .image_token()
            .is_some_and(|image| step.response_ids.contains(&image))
        {
            skipped.image_placeholder += 1;
            continue;
        }
        if teacher
            .model
            .video_token()
            .is_some_and(|video| step.response_ids.contains(&video))
        {
            skipped.video_placeholder += 1;
            continue;
        }
        let Some(actions) = task.gt_actions.as_deref() else {
            if strict {
                return Err(Error::BadInput(format!(
                    "{}: task `{task_id}` has no ground-truth plan (gt_actions) for the teacher context",
                    at()
                ))
                .into());
            }
            skipped.no_reference += 1;
            continue;
        };
        let images = match &step.observation {
            Some(bytes) => decode_images(bytes)
                .map_err(|e| Error::BadInput(format!("{}: steps.observation: {e}", at())))?,
            None => Vec::new(),
        };
        policy
            .model
            .check_images(&step.prompt_ids, &images)
            .map_err(|e| Error::BadInput(format!("{}: prompt_ids: {e}", at())))?;
        let images = if images.is_empty() && teacher.model.image_token().is_some() {
            scene_image(task)?
        } else {
            images
        };
        let prompt = policy.prompt_text(&step.prompt_ids)?;
        let context = |text: String| {
            teacher
                .prompt(&text, images.clone())
                .map_err(|e| Error::BadInput(format!("{}: the teacher's prompt: {e}", at())))
        };
        let teacher_context = context(templates.render_teacher(
            &prompt,
            &task.instruction,
            &reference_plan(actions),
        )?)?;
        let student_context = context(templates.render_student(&prompt, &task.instruction)?)?;
        let (images, teacher_context, student_context) = (
            teacher_context.images,
            teacher_context.ids,
            student_context.ids,
        );
        if teacher_context.len().max(student_context.len()) + step.response_ids.len() > n_ctx {
            skipped.too_long += 1;
            continue;
        }
        jobs.push(Job {
            trajectory_id: step.trajectory_id.clone(),
            step_index: step.step_index,
            teacher_context,
            student_context,
            response: step.response_ids.clone(),
            images,
        });
    }
    Ok((jobs, skipped))
}

/// The scene image of `task` as the policy saw it when collecting (run 0 of
/// [`TaskEnv::from_row`]); none for a task without one.
fn scene_image(task: &TaskRow) -> Result<Vec<RgbImage>, ModelError> {
    let env = TaskEnv::from_row(task, 0)?;
    Ok(env
        .image()
        .map(|image| RgbImage::new(image.height, image.width, image.rgb))
        .transpose()?
        .into_iter()
        .collect())
}

/// Orders jobs for batching: the steps of one group (one task, one prompt:
/// the same teacher and student contexts) next to each other, groups in the
/// order of their first step (a stable grouping: steps in key order, whose
/// trajectory ids start with their group's, stay as they are), so a batch
/// holds whole groups and the scorer encodes each context once for all its
/// steps. Sorting by response length instead would scatter a group over
/// batches and encode its contexts once per batch; within a batch the order
/// changes nothing (a batch is padded to its longest response). A step's
/// log-probs depend, by float rounding, on the steps batched with it, so a
/// run and its shards order the whole job list this way before cutting it
/// into batches.
pub fn batch_order(jobs: &mut [Job]) {
    let mut first: HashMap<(&[i32], &[i32]), usize> = HashMap::new();
    let group: Vec<usize> = jobs
        .iter()
        .enumerate()
        .map(|(index, job)| {
            *first
                .entry((&job.teacher_context, &job.student_context))
                .or_insert(index)
        })
        .collect();
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&index| group[index]);
    let ordered: Vec<Job> = order.iter().map(|&index| jobs[index].clone()).collect();
    jobs.clone_from_slice(&ordered);
}

/// Teacher and student log-probs of each job's response tokens, `batch_rows`
/// jobs (2 x `batch_rows` sequences) per forward pass.
pub fn score_jobs<M: PlanNet>(
    teacher: &Checkpoint<M>,
    jobs: &[Job],
    batch_rows: usize,
    temperature: f64,
) -> Vec<(Vec<f32>, Vec<f32>)> {
    let bar = progress::bar(jobs.len() as u64, "teacher-forcing");
    let mut out = Vec::with_capacity(jobs.len());
    for chunk in jobs.chunks(batch_rows.max(1)) {
        let contexts: Vec<(&[i32], &[RgbImage])> = chunk
            .iter()
            .map(|j| (j.teacher_context.as_slice(), j.images.as_slice()))
            .chain(
                chunk
                    .iter()
                    .map(|j| (j.student_context.as_slice(), j.images.as_slice())),
            )
            .collect();
        let responses: Vec<&[i32]> = chunk
            .iter()
            .chain(chunk)
            .map(|j| j.response.as_slice())
            .collect();
        let logprobs = tch::no_grad(|| {
            score_responses(teacher, &contexts, &responses, temperature, Entropy::Skip)
                .logprobs
                .to_device(tch::Device::Cpu)
        });
        let width = logprobs.size()[1] as usize;
        let flat = Vec::<f32>::try_from(logprobs.flatten(0, -1)).expect("float log-probs");
        let row = |r: usize, len: usize| flat[r * width..r * width + len].to_vec();
        for (i, job) in chunk.iter().enumerate() {
            let n = job.response.len();
            out.push((row(i, n), row(chunk.len() + i, n)));
        }
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    out
}

/// Mean, standard deviation, min and max of the per-token contrast
/// `teacher - student` over all scored tokens.
pub fn contrast_stats(scores: &[(Vec<f32>, Vec<f32>)]) -> Option<(f64, f64, f64, f64)> {
    let diffs = || {
        scores
            .iter()
            .flat_map(|(t, s)| t.iter().zip(s).map(|(t, s)| f64::from(t - s)))
    };
    let n = diffs().count();
    if n == 0 {
        return None;
    }
    let mean = diffs().sum::<f64>() / n as f64;
    let var = diffs().map(|d| (d - mean).powi(2)).sum::<f64>() / n as f64;
    let min = diffs().fold(f64::INFINITY, f64::min);
    let max = diffs().fold(f64::NEG_INFINITY, f64::max);
    Some((mean, var.sqrt(), min, max))
}

fn same_tokenizer<P: PolicyNet, T: PolicyNet>(
    policy: &Checkpoint<P>,
    teacher: &Checkpoint<T>,
    policy_dir: &Path,
    teacher_dir: &Path,
) -> Result<(), ModelError> {
    let ours = policy.tokenizer.get_vocab(true);
    let theirs = teacher.tokenizer.get_vocab(true);
    let differing = ours
        .iter()
        .filter(|(token, id)| theirs.get(*token) != Some(id))
        .count()
        + theirs.keys().filter(|t| !ours.contains_key(*t)).count();
    if differing > 0 {
        return Err(ModelError::BadCheckpoint {
            file: teacher_dir.join("tokenizer.json"),
            reason: format!(
                "the teacher's tokenizer differs from the policy's ({}) ({differing} tokens differ; {} vs {} tokens): response ids would mean other text to the teacher",
                policy_dir.join("tokenizer.json").display(),
                theirs.len(),
                ours.len()
            ),
        });
    }
    Ok(())
}

/// Runs the stage.
pub fn run(args: Args) -> Result<(), ModelError> {
    let stage =
        Stage::<Config>::start(&spec::TEACHER_LOGP, env!("CARGO_PKG_VERSION"), &args.stage)?;
    stage.check_outputs(&[TableName::TeacherLogp])?;
    embodyflow_models::with_policy_net!(
        &args.policy.policy,
        plan: |P| score_with_teacher::<P>(&stage, &args),
        // A VLA is refused by the plan policy's loader, naming the kinds.
        closed_loop: |_P| load_and_score::<Gpt, Gpt>(&stage, &args),
    )?
}

/// The stage on a plan policy of network `P`: its teacher is a checkpoint
/// of the same network (or the policy itself), except that a Hugging Face
/// decoder may learn from a vision-language teacher.
fn score_with_teacher<P: PlanNet>(stage: &Stage<Config>, args: &Args) -> Result<(), ModelError> {
    if NetSpec::of::<P>().is::<HfNet>()
        && args.teacher.teacher.as_os_str() != "self"
        && policy_net(&args.teacher.teacher)?.is::<VlPolicy>()
    {
        return load_and_score::<HfNet, VlPolicy>(stage, args);
    }
    load_and_score::<P, P>(stage, args)
}

/// Loads a policy of network `P` and, unless it is its own teacher, a
/// teacher of network `T`: ours ([`Gpt`]) for both, a Hugging Face decoder
/// ([`HfNet`]) or vision-language model ([`VlPolicy`]) with a teacher of the
/// same kind, or a Hugging Face decoder with a vision-language teacher.
fn load_and_score<P: PlanNet, T: PlanNet>(
    stage: &Stage<Config>,
    args: &Args,
) -> Result<(), ModelError> {
    let device = embodyflow_models::device::tch_device(args.stage.device)?;
    let policy = Checkpoint::<P>::load_kind(&args.policy.policy, device)?;
    if args.teacher.teacher.as_os_str() == "self" {
        return score_steps(stage, args, &policy, &policy, "self".to_string());
    }
    let teacher = Checkpoint::<T>::load_kind(&args.teacher.teacher, device)?;
    same_tokenizer(
        &policy,
        &teacher,
        &args.policy.policy,
        &args.teacher.teacher,
    )?;
    let name = teacher.manifest.id.clone();
    score_steps(stage, args, &policy, &teacher, name)
}

/// The stage with a loaded policy and teacher.
fn score_steps<P: PlanNet, T: PlanNet>(
    stage: &Stage<Config>,
    args: &Args,
    policy: &Checkpoint<P>,
    teacher: &Checkpoint<T>,
    teacher_name: String,
) -> Result<(), ModelError> {
    let config = &stage.config;
    let trajectories: Vec<TrajectoryRow> = stage.input(TableName::Trajectories)?.read_rows()?;
    let steps: Vec<StepRow> = stage.input(TableName::Steps)?.read_rows()?;
    let task_rows: Vec<TaskRow> = stage.input(TableName::Tasks)?.read_rows()?;
    let tasks: HashMap<&str, &TaskRow> =
        task_rows.iter().map(|t| (t.task_id.as_str(), t)).collect();
    let (mut jobs, skipped) = build_jobs(
        policy,
        teacher,
        &config.template,
        &trajectories,
        &steps,
        &tasks,
        args.strict,
    )?;
    batch_order(&mut jobs);
    // A shard scores whole batches of the unsharded run: a step's log-probs
    // depend on the steps batched with it (`ShardSpec::owned_batches`).
    let mut owned = vec![false; jobs.len()];
    for batch in args
        .stage
        .shard
        .owned_batches(jobs.len(), config.batch_rows, |i| {
            format!("{}/{}", jobs[i].trajectory_id, jobs[i].step_index)
        })
    {
        owned[batch].fill(true);
    }
    let jobs: Vec<Job> = jobs
        .into_iter()
        .zip(owned)
        .filter_map(|(job, owned)| owned.then_some(job))
        .collect();
    let started = Instant::now();
    let scores = score_jobs(teacher, &jobs, config.batch_rows, config.temperature);
    let seconds = started.elapsed().as_secs_f64();
    let rows: Vec<TeacherLogpRow> = jobs
        .iter()
        .zip(&scores)
        .map(|(job, (t, s))| TeacherLogpRow {
            trajectory_id: job.trajectory_id.clone(),
            step_index: job.step_index,
            teacher_logp: t.clone(),
            student_logp: s.clone(),
            teacher: teacher_name.clone(),
            template: config.template.name.clone(),
        })
        .collect();
    let mut writer = stage.writer(TableName::TeacherLogp)?;
    writer.write_rows(&rows)?;
    stage.finish(writer)?;

    let response_tokens: usize = jobs.iter().map(|j| j.response.len()).sum();
    let all_tokens: usize = jobs
        .iter()
        .map(|j| j.teacher_context.len() + j.student_context.len() + 2 * j.response.len())
        .sum();
    let mut summary = Summary::new("teacher-logp");
    summary
        .add(
            "teacher",
            format!("{teacher_name} ({})", args.teacher.teacher.display()),
        )
        .add("policy", &policy.manifest.id)
        .add("template", &config.template.name)
        .add("steps scored", rows.len())
        .add("skipped: no ground-truth plan", skipped.no_reference)
        .add(
            "skipped: context + response longer than n_ctx",
            skipped.too_long,
        )
        .add(
            "skipped: response holds the teacher's image placeholder",
            skipped.image_placeholder,
        )
        .add(
            "skipped: response holds the teacher's video placeholder",
            skipped.video_placeholder,
        );
    if let Some((mean, std, min, max)) = contrast_stats(&scores) {
        summary.add(
            "contrast teacher - student per token",
            format!("mean {mean:.3}, std {std:.3}, min {min:.2}, max {max:.2}"),
        );
    }
    summary.add(
        "throughput",
        format!(
            "{:.0} response tokens/s per context pair, {:.0} tokens/s counting contexts ({response_tokens} response tokens in {seconds:.1} s)",
            response_tokens as f64 / seconds.max(1e-9),
            all_tokens as f64 / seconds.max(1e-9),
        ),
    );
    stage.commit(&summary)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use embodyflow_core::config::refused_key;

    #[test]
    fn config_values_are_checked_when_loaded() {
        assert_eq!(refused_key::<Config>(&[]), None, "the defaults pass");
        assert_eq!(
            refused_key::<Config>(&["temperature=0.5", "batch_rows=1"]),
            None
        );
        for (set, key) in [
            ("temperature=0", "temperature"),
            ("temperature=-1", "temperature"),
            ("batch_rows=0", "batch_rows"),
            ("template.teacher={prompt}", "template"),
            ("template.student={prompt} {reference_plan}", "template"),
            ("template.student={promt}", "template"),
        ] {
            assert_eq!(refused_key::<Config>(&[set]).as_deref(), Some(key), "{set}");
        }
    }
    use embodyflow_core::schemas::PlanAction;
    use embodyflow_models::testing::tiny_policy;
    use embodyflow_models::tokenizer::encode;

    fn rollout(
        policy: &Checkpoint,
        gt: Option<Vec<PlanAction>>,
    ) -> (Vec<TrajectoryRow>, Vec<StepRow>, TaskRow) {
        let task = TaskRow {
            task_id: "t0".into(),
            suite: "household".into(),
            env: "household".into(),
            split: "train".into(),
            task_type: None,
            seed: 0,
            instruction: "find a Mug".into(),
            observation: None,
            gt_actions: gt,
        };
        let mut prompt = encode(&policy.tokenizer, "Task: find a Mug\n").unwrap();
        prompt.push(policy.special.plan);
        let response = encode(&policy.tokenizer, "pick up the Mug").unwrap();
        let trajectory = TrajectoryRow {
            source_row: None,
            infra_fault: None,
            failure_reason: None,
            trajectory_id: "r0".into(),
            group_id: "g0".into(),
            task_id: "t0".into(),
            sample_index: 0,
            iteration: 0,
            policy: "p".into(),
            temperature: 1.0,
            num_steps: 1,
            env_steps: 1,
            complete: true,
            response_text: None,
            seed: 0,
            ever_grasped: None,
        };
        let step = StepRow::one_shot(
            "r0".into(),
            prompt,
            response.clone(),
            vec![0.0; response.len()],
        );
        (vec![trajectory], vec![step], task)
    }

    fn mug_plan() -> Option<Vec<PlanAction>> {
        Some(vec![PlanAction {
            action_id: 3,
            action_name: "pick up the Mug".into(),
        }])
    }

    #[test]
    fn student_context_reproduces_the_policys_own_log_probs_and_contrast_is_batch_free() {
        let policy = tiny_policy(128);
        let (trajectories, steps, task) = rollout(&policy, mug_plan());
        let tasks = HashMap::from([("t0", &task)]);
        let (jobs, skipped) = build_jobs(
            &policy,
            &policy,
            &ContextTemplates::default(),
            &trajectories,
            &steps,
            &tasks,
            true,
        )
        .unwrap();
        assert_eq!(skipped, Skipped::default());
        assert_eq!(
            jobs[0].student_context, steps[0].prompt_ids,
            "{{prompt}} is what the policy saw"
        );
        assert!(jobs[0].teacher_context.len() > jobs[0].student_context.len());
        let scores = score_jobs(&policy, &jobs, 4, 1.0);
        let own = tch::no_grad(|| {
            score_responses(
                &policy,
                &[&steps[0].prompt_ids],
                &[&steps[0].response_ids],
                1.0,
                Entropy::Skip,
            )
            .logprobs
        });
        let own = Vec::<f32>::try_from(own.flatten(0, -1)).unwrap();
        let (teacher, student) = &scores[0];
        for (a, b) in student.iter().zip(&own) {
            assert!((a - b).abs() < 1e-5, "{student:?} vs {own:?}");
        }
        assert_ne!(
            teacher, student,
            "the reference plan changes the teacher's log-probs"
        );
        // The same job alone and next to a longer one gives the same numbers.
        let mut longer = jobs[0].clone();
        longer.teacher_context.splice(0..0, [5, 6, 7, 8]);
        let pair = score_jobs(&policy, &[jobs[0].clone(), longer], 2, 1.0);
        for (a, b) in pair[0].0.iter().zip(teacher) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    /// A group's steps (the same contexts, other responses) are batched
    /// side by side, and scoring them together (each context encoded once)
    /// gives each step's log-probs alone.
    #[test]
    fn a_groups_steps_batch_together_and_score_as_alone() {
        let policy = tiny_policy(128);
        let (trajectories, steps, task) = rollout(&policy, mug_plan());
        let tasks = HashMap::from([("t0", &task)]);
        let (jobs, _) = build_jobs(
            &policy,
            &policy,
            &ContextTemplates::default(),
            &trajectories,
            &steps,
            &tasks,
            true,
        )
        .unwrap();
        let sample = |index: i32, response: Vec<i32>| Job {
            step_index: index,
            response,
            ..jobs[0].clone()
        };
        let other = Job {
            teacher_context: jobs[0].teacher_context[2..].to_vec(),
            student_context: jobs[0].student_context[1..].to_vec(),
            ..sample(9, vec![30, 31, 32])
        };
        let mut batch = vec![
            sample(0, jobs[0].response.clone()),
            other,
            sample(2, vec![40]),
            sample(3, vec![50, 51, 52, 53, 54, 55]),
        ];
        batch_order(&mut batch);
        let order: Vec<i32> = batch.iter().map(|j| j.step_index).collect();
        assert_eq!(
            order,
            [0, 2, 3, 9],
            "the group together, in order of first appearance"
        );
        let together = score_jobs(&policy, &batch, 4, 1.0);
        for (job, (teacher, student)) in batch.iter().zip(&together) {
            let alone = &score_jobs(&policy, std::slice::from_ref(job), 1, 1.0)[0];
            assert_eq!(teacher.len(), job.response.len());
            for (a, b) in teacher
                .iter()
                .chain(student)
                .zip(alone.0.iter().chain(&alone.1))
            {
                assert!((a - b).abs() < 1e-5, "step {}: {a} vs {b}", job.step_index);
            }
        }
    }

    #[test]
    fn steps_without_a_plan_or_room_are_skipped_and_strict_fails() {
        let policy = tiny_policy(128);
        let (trajectories, steps, task) = rollout(&policy, None);
        let tasks = HashMap::from([("t0", &task)]);
        let templates = ContextTemplates::default();
        let (jobs, skipped) = build_jobs(
            &policy,
            &policy,
            &templates,
            &trajectories,
            &steps,
            &tasks,
            false,
        )
        .unwrap();
        assert!(jobs.is_empty());
        assert_eq!(skipped.no_reference, 1);
        let error = build_jobs(
            &policy,
            &policy,
            &templates,
            &trajectories,
            &steps,
            &tasks,
            true,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            error.contains("trajectory `r0` step 0") && error.contains("no ground-truth plan"),
            "{error}"
        );

        let short = tiny_policy(24);
        let (trajectories, steps, task) = rollout(&short, mug_plan());
        let tasks = HashMap::from([("t0", &task)]);
        let (jobs, skipped) = build_jobs(
            &short,
            &short,
            &templates,
            &trajectories,
            &steps,
            &tasks,
            true,
        )
        .unwrap();
        assert!(jobs.is_empty());
        assert_eq!(skipped.too_long, 1);
    }

    /// A vision-language teacher (here its own policy) skips and counts a
    /// response holding its image or video placeholder, scoring the
    /// others; a prompt holding the video placeholder is an error naming
    /// the step and the token.
    #[test]
    fn responses_holding_a_vision_placeholder_are_skipped_and_video_prompts_refused() {
        use embodyflow_models::images::encode_images;
        let dir = tempfile::tempdir().unwrap();
        embodyflow_models::testing::write_tiny_vl_policy(dir.path(), "qwen2_5_vl");
        let policy = Checkpoint::<VlPolicy>::load_kind(dir.path(), tch::Device::Cpu).unwrap();
        let (trajectory, _, task) = rollout(&tiny_policy(128), mug_plan());
        let image = RgbImage::new(32, 32, (0..32 * 32 * 3).map(|i| i as u8).collect()).unwrap();
        let prompt = policy.prompt("find a Mug", vec![image]).unwrap();
        let observation = encode_images(&prompt.images).unwrap();
        let (image, video) = (
            policy.model.image_token().unwrap(),
            policy.model.video_token().unwrap(),
        );
        let responses = [vec![20, 21, image], vec![20, video, 22], vec![20, 21, 22]];
        let trajectories: Vec<TrajectoryRow> = (0..responses.len())
            .map(|i| TrajectoryRow {
                trajectory_id: format!("r{i}"),
                ..trajectory[0].clone()
            })
            .collect();
        let mut steps: Vec<StepRow> = responses
            .iter()
            .enumerate()
            .map(|(i, response)| StepRow {
                observation: observation.clone(),
                ..StepRow::one_shot(
                    format!("r{i}"),
                    prompt.ids.clone(),
                    response.clone(),
                    vec![0.0; response.len()],
                )
            })
            .collect();
        let tasks = HashMap::from([("t0", &task)]);
        let build = |steps: &[StepRow]| {
            build_jobs(
                &policy,
                &policy,
                &ContextTemplates::default(),
                &trajectories,
                steps,
                &tasks,
                true,
            )
        };
        let (jobs, skipped) = build(&steps).unwrap();
        assert_eq!(
            (skipped.image_placeholder, skipped.video_placeholder),
            (1, 1)
        );
        let scored: Vec<&str> = jobs.iter().map(|j| j.trajectory_id.as_str()).collect();
        assert_eq!(scored, ["r2"]);
        steps[2].prompt_ids.insert(2, video);
        let error = build(&steps).err().unwrap();
        assert_eq!(
            embodyflow_core::Classify::kind(&error),
            embodyflow_core::ErrorKind::BadInput
        );
        let error = error.to_string();
        assert!(
            error.contains("trajectory `r2` step 0") && error.contains("`<|video_pad|>`"),
            "{error}"
        );
    }

    #[test]
    fn response_ids_outside_the_vocabulary_are_an_error() {
        let policy = tiny_policy(128);
        let (trajectories, mut steps, task) = rollout(&policy, mug_plan());
        steps[0].response_ids.push(100_000);
        let tasks = HashMap::from([("t0", &task)]);
        let error = build_jobs(
            &policy,
            &policy,
            &ContextTemplates::default(),
            &trajectories,
            &steps,
            &tasks,
            false,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            error.contains("response id 100000 is outside the teacher's vocabulary"),
            "{error}"
        );
    }

    #[test]
    fn contrast_statistics() {
        let scores = vec![
            (vec![0.0, -1.0], vec![-1.0, -1.0]),
            (vec![-2.0], vec![-1.0]),
        ];
        let (mean, std, min, max) = contrast_stats(&scores).unwrap();
        assert!((mean - 0.0).abs() < 1e-12);
        assert!((std - (2.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!((min, max), (-1.0, 1.0));
        assert!(contrast_stats(&[]).is_none());
    }
}

/// The fields' doc comments document exactly the config's keys.
#[cfg(test)]
mod config_keys {
    #[test]
    fn every_config_key_has_a_one_line_meaning() {
        embodyflow_core::config::check_key_docs::<super::Config>().unwrap();
    }
}

//! Rollouts from other trainers: `table import --format verl|trl` turns a
//! JSON-lines dump of veRL or TRL into our tasks, trajectories, steps and
//! rewards tables, so score-rewards and compute-advantages rescore it
//! unchanged; `table export ADV --format verl` writes the advantages back in
//! rows a veRL or TRL user joins with their batch.
//!
//! **veRL** (`trainer.rollout_data_dir` / `validation_data_dir`):
//! `RayPPOTrainer._dump_generations(inputs, outputs, gts, scores,
//! reward_extra_infos_dict, dump_path)` writes `<global_step>.jsonl`, one
//! `json.dumps(entry, ensure_ascii=False)` per sample with the keys `input`
//! (the prompt decoded with `skip_special_tokens=True`), `output` (the
//! response, decoded the same way), `gts` (`reward_model.ground_truth`, may
//! be null), `score` (`token_level_scores.sum(-1)`), `step`, then every
//! reward extra info (`acc`, `pred`, `reward`, …) — read in
//! `verl/trainer/ppo/ray_trainer.py` at volcengine/verl commit b178a3cd
//! (2026-01-29; `gts` came after v0.4). veRL does not dump the `uid`
//! (`_log_rollout_data` adds `request_id` to the dict after copying it, so
//! that is not dumped either): a dump has one when a reward function returns
//! it as an extra info, or give the grouping: `--group-size n` takes `n =
//! rollout.n` consecutive rows, right for validation dumps (`repeat(...,
//! interleave=True)`) and training dumps with `trainer.balance_batch=false`;
//! training dumps are written after `_balance_batch` reorders the batch, so
//! there `--group-by-prompt` (rows of one step with the same prompt) is the
//! grouping; a dataset with a prompt twice in one batch would merge its two
//! groups.
//!
//! **TRL / prime-rl / open-instruct** JSON lines: `prompt` (a string),
//! `completion` (a string, or TRL's conversational `[{"role": "assistant",
//! "content": …}]` with one message), `reward`, optional `step`; a prompt
//! given as chat messages needs a chat template and is refused (exit 2), not
//! rendered by guess.
//!
//! Column mapping (`source key -> table.column`):
//!
//! | veRL | TRL | goes to |
//! |---|---|---|
//! | `input` | `prompt` | `tasks.instruction`; `steps.prompt_ids` (tokenised, no special tokens added) |
//! | `output` | `completion` | `trajectories.response_text`; `steps.response_ids` (tokenised, no special tokens added) |
//! | `score` | `reward` | `rewards.score` = `rewards.accuracy`; `complete` = `success` = `score > 0` |
//! | `step` | `step` (optional, else 0) | `trajectories.iteration` |
//! | `uid` or `--group-column` | `--group-column` | `task_id` = the uid; `group_id` = `it<step>/<uid>/d0` |
//! | `gts` | — | `tasks.gt_actions` when it is a plan (a list of `{action_id, action_name}`, an object with such an `executable_plan`, or a string holding either as JSON); else null and counted |
//!
//! With `--group-size N`, N consecutive rows form a group whose uid is `r<index
//! of the group's first row, 0-based>`; with `--group-by-prompt` (the default
//! for TRL without `--group-column`), rows with the same prompt do, uid `p<line
//! of its first row>`. `trajectory_id` = `<group_id>/s<k>`, k the
//! row's place in its group in file order (`sample_index`). Constants the
//! dumps do not hold: `suite` = the format, `env` = `imported`, `split` =
//! `--split` (train), `seed` = 0, `policy` = `imported:<format>:<dump file name>`,
//! `temperature` = `--temperature` (1.0), `num_steps` = `env_steps` = 1,
//! `old_logprobs` = 0.0 per token (the dumps have none: advantages do not
//! read them; update-policy refuses a trajectory whose `policy` starts with
//! [`embodyflow_core::IMPORTED_POLICY_PREFIX`]),
//! `parse_ok` = true, `reward_fn` = the format. Every other key is reported
//! (`unmapped key `acc`: 12 rows`), never imported by guess. Char offsets for
//! span alignment come from the same tokenizer: give it to compute-advantages
//! as `step.tokenizer`.
//!
//! Bad input, exit 2 and nothing written (every row is read and checked
//! before a table is staged; the four tables are committed together): a row
//! that is not a JSON object, a mapped key missing or of the wrong type
//! (named by file, line and key), a non-finite score, a uid whose rows have
//! different prompts or `gts` (naming the uid, the key and both lines), a tokenizer that does
//! not load (naming the file), `--group-size N` on a dump whose row count is
//! not a multiple of N.
//!
//! ```text
//! table import --format verl --from rollouts/3.jsonl --tokenizer ckpt/ --out runs/verl3 \
//!     --group-by-prompt
//! score-rewards --input runs/verl3 --out runs/verl3/r1 --set reward.fn=embodied_r1
//! compute-advantages --input runs/verl3/trajectories --input runs/verl3/steps \
//!     --input runs/verl3/r1/rewards --out runs/verl3/adv --set estimator=grpo
//! table export runs/verl3/adv/advantages --format verl \
//!     --trajectories runs/verl3/trajectories --rewards runs/verl3/r1/rewards --out adv.jsonl
//! ```
//!
//! `--format verl` export: one JSON object per advantages row, `uid`
//! (`trajectories.task_id`), `step` (`iteration`), `sample_index`,
//! `trajectory_id`, `step_index`, `rescored` (the rewards table's score, with
//! `--rewards`), `advantage` (`episode_adv`), `token_advantages` (per response
//! token), `estimator`. Joined with the dump in pandas:
//!
//! ```text
//! import pandas as pd
//! dump = pd.read_json("rollouts/3.jsonl", lines=True)
//! dump["sample_index"] = dump.groupby(["step", "uid"]).cumcount()
//! adv = pd.read_json("adv.jsonl", lines=True)
//! rows = dump.merge(adv, on=["uid", "step", "sample_index"], validate="one_to_one")
//! print(rows[["uid", "sample_index", "score", "rescored", "advantage"]].to_csv(index=False))
//! ```
//! (With `--group-size N`, set `dump["uid"] = "r" + (dump.index // N * N).astype(str)` first.)

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use embodyflow_core::commit::Commit;
use embodyflow_core::dataset::{TableReader, TableWriter, WriteOptions};
use embodyflow_core::error::{Classify, ErrorKind};
use embodyflow_core::manifest::{Manifest, Producer};
use embodyflow_core::schemas::{
    AdvantageRow, PlanAction, RewardRow, Row, StepRow, TableName, TaskRow, TrajectoryRow,
};
use embodyflow_core::{Error, Result};
use serde_json::{Map, Value};

/// The trainer whose dump is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    /// veRL's `rollout_data_dir` / `validation_data_dir` JSON lines.
    Verl,
    /// TRL / prime-rl / open-instruct JSON lines (prompt, completion, reward).
    Trl,
}

impl Source {
    /// The format's name (`verl`, `trl`).
    pub fn name(self) -> &'static str {
        match self {
            Source::Verl => "verl",
            Source::Trl => "trl",
        }
    }

    /// Keys of the prompt, the response, the score and the step.
    fn keys(self) -> [&'static str; 4] {
        match self {
            Source::Verl => ["input", "output", "score", "step"],
            Source::Trl => ["prompt", "completion", "reward", "step"],
        }
    }
}

/// Bad dumps and tokenizers; all are bad input (exit 2, nothing written).
#[derive(Debug, thiserror::Error)]
pub enum ForeignError {
    /// The dump cannot be read.
    #[error("--from {file}: cannot read it: {reason}")]
    Read {
        /// The dump.
        file: PathBuf,
        /// The I/O error.
        reason: String,
    },
    /// A line is not one JSON object.
    #[error("{file}:{line}: not a JSON object: {reason}")]
    NotJson {
        /// The dump.
        file: PathBuf,
        /// 1-based line.
        line: usize,
        /// Why.
        reason: String,
    },
    /// A mapped key is missing.
    #[error("{file}:{line}: key `{key}` is missing; the {format} mapping needs it{hint}")]
    MissingKey {
        /// The dump.
        file: PathBuf,
        /// 1-based line.
        line: usize,
        /// The key.
        key: String,
        /// `verl` or `trl`.
        format: &'static str,
        /// What to do about it.
        hint: &'static str,
    },
    /// A mapped key holds a value of another type.
    #[error("{file}:{line}: key `{key}` is {found}, expected {expected}")]
    WrongType {
        /// The dump.
        file: PathBuf,
        /// 1-based line.
        line: usize,
        /// The key.
        key: String,
        /// What the mapping needs.
        expected: &'static str,
        /// The value found (shortened).
        found: String,
    },
    /// A group's rows have different prompts (or veRL ground truths).
    #[error("{file}: group `{uid}` mixes values of `{key}`: line {first} and line {other} differ")]
    Mixed {
        /// The dump.
        file: PathBuf,
        /// The group's uid.
        uid: String,
        /// The prompt key, or `gts`.
        key: &'static str,
        /// Line of the group's first row.
        first: usize,
        /// Line of the row with another value.
        other: usize,
    },
    /// The tokenizer does not load.
    #[error("--tokenizer {file}: does not load as a Hugging Face tokenizer.json: {reason}")]
    Tokenizer {
        /// The tokenizer file.
        file: PathBuf,
        /// The loader's error.
        reason: String,
    },
    /// `--group-size N` on a dump whose row count is not a multiple of N.
    #[error(
        "{file}: {rows} rows are not groups of --group-size {size} (the last group would have {rest}); is N the run's rollout.n?"
    )]
    GroupSize {
        /// The dump.
        file: PathBuf,
        /// Rows in the dump.
        rows: usize,
        /// The group size asked.
        size: usize,
        /// Rows left in the last group.
        rest: usize,
    },
    /// The dump holds no row.
    #[error("{file}: no rows")]
    Empty {
        /// The dump.
        file: PathBuf,
    },
}

impl Classify for ForeignError {
    fn kind(&self) -> ErrorKind {
        ErrorKind::BadInput
    }
}

impl From<ForeignError> for Error {
    fn from(e: ForeignError) -> Error {
        Error::BadInput(e.to_string())
    }
}

/// How rows form groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grouping {
    /// By the value of this key (veRL's `uid` by default).
    Column(String),
    /// N consecutive rows (veRL's interleaved `rollout.n` repeat).
    Size(NonZeroUsize),
    /// Rows with the same prompt (TRL's default; veRL training dumps,
    /// whose rows `balance_batch` reordered).
    Prompt,
}

/// What `table import --format verl|trl` needs.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// Dump format.
    pub source: Source,
    /// The JSON-lines dump.
    pub from: PathBuf,
    /// `tokenizer.json`, or a directory holding one.
    pub tokenizer: PathBuf,
    /// How rows form groups.
    pub grouping: Grouping,
    /// `tasks.split` of the imported tasks.
    pub split: String,
    /// `trajectories.temperature` (the dumps do not hold it).
    pub temperature: f32,
}

/// One row of the dump, checked.
#[derive(Debug)]
struct DumpRow {
    line: usize,
    prompt: String,
    response: String,
    score: f32,
    step: i32,
    uid: String,
    gts: Option<Value>,
}

/// What an import wrote and left out.
#[derive(Debug)]
pub struct ImportSummary {
    /// Rows imported (trajectories).
    pub rows: usize,
    /// Groups (uid x step).
    pub groups: usize,
    /// Tasks (uids).
    pub tasks: usize,
    /// Tasks with a gold plan from `gts`.
    pub gold_plans: usize,
    /// Rows whose non-null `gts` is not a plan.
    pub gts_not_plans: usize,
    /// Keys not mapped and the number of rows holding each.
    pub unmapped: BTreeMap<String, usize>,
}

impl std::fmt::Display for ImportSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} rows, {} groups, {} tasks ({} with a gold plan)",
            self.rows, self.groups, self.tasks, self.gold_plans
        )?;
        if self.gts_not_plans > 0 {
            write!(
                f,
                "\ngts: {} rows hold no plan (a list of {{action_id, action_name}} or an executable_plan): their tasks have no gt_actions",
                self.gts_not_plans
            )?;
        }
        for (key, count) in &self.unmapped {
            write!(f, "\nunmapped key `{key}`: {count} rows (not imported)")?;
        }
        Ok(())
    }
}

fn shorten(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(40) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

/// Loads `path` (a `tokenizer.json`, or a directory holding one).
pub fn load_tokenizer(path: &Path) -> std::result::Result<tokenizers::Tokenizer, ForeignError> {
    let file = if path.is_dir() {
        path.join("tokenizer.json")
    } else {
        path.to_path_buf()
    };
    tokenizers::Tokenizer::from_file(&file).map_err(|e| ForeignError::Tokenizer {
        file,
        reason: e.to_string(),
    })
}

/// Reads and checks every row of the dump.
fn read_dump(
    options: &ImportOptions,
) -> std::result::Result<(Vec<DumpRow>, BTreeMap<String, usize>), ForeignError> {
    let file = &options.from;
    let read_err = |e: std::io::Error| ForeignError::Read {
        file: file.clone(),
        reason: e.to_string(),
    };
    let reader = BufReader::new(std::fs::File::open(file).map_err(read_err)?);
    let [prompt_key, response_key, score_key, step_key] = options.source.keys();
    let format = options.source.name();
    let mut mapped = vec![prompt_key, response_key, score_key, step_key];
    if let Grouping::Column(c) = &options.grouping {
        mapped.push(c);
    }
    if options.source == Source::Verl {
        mapped.push("gts");
    }
    let (mut rows, mut unmapped) = (Vec::new(), BTreeMap::new());
    for (index, line) in reader.lines().enumerate() {
        let line_no = index + 1;
        let text = line.map_err(read_err)?;
        if text.trim().is_empty() {
            continue;
        }
        let object: Map<String, Value> =
            serde_json::from_str(&text).map_err(|e| ForeignError::NotJson {
                file: file.clone(),
                line: line_no,
                reason: e.to_string(),
            })?;
        for key in object.keys() {
            if !mapped.contains(&key.as_str()) {
                *unmapped.entry(key.clone()).or_insert(0) += 1;
            }
        }
        let missing = |key: &str, hint: &'static str| ForeignError::MissingKey {
            file: file.clone(),
            line: line_no,
            key: key.to_string(),
            format,
            hint,
        };
        let wrong = |key: &str, expected: &'static str, value: &Value| ForeignError::WrongType {
            file: file.clone(),
            line: line_no,
            key: key.to_string(),
            expected,
            found: shorten(value),
        };
        let get = |key: &str| object.get(key).ok_or_else(|| missing(key, ""));
        let prompt = match get(prompt_key)? {
            Value::String(s) => s.clone(),
            other => {
                return Err(wrong(
                    prompt_key,
                    "a string (a prompt of chat messages needs a chat template: render it first)",
                    other,
                ));
            }
        };
        let response = match get(response_key)? {
            Value::String(s) => s.clone(),
            Value::Array(messages) if options.source == Source::Trl => match messages.as_slice() {
                [message]
                    if message.get("role").and_then(Value::as_str) == Some("assistant")
                        && message.get("content").is_some_and(Value::is_string) =>
                {
                    message["content"].as_str().unwrap_or_default().to_string()
                }
                _ => {
                    return Err(wrong(
                        response_key,
                        "a string or one assistant message with string content",
                        &Value::Array(messages.clone()),
                    ));
                }
            },
            other => return Err(wrong(response_key, "a string", other)),
        };
        let score_value = get(score_key)?;
        let score = score_value
            .as_f64()
            .map(|s| s as f32)
            .filter(|s| s.is_finite())
            .ok_or_else(|| wrong(score_key, "a finite number (f32)", score_value))?;
        let step = match (object.get(step_key), options.source) {
            (None, Source::Trl) => 0,
            (None, Source::Verl) => return Err(missing(step_key, "")),
            (Some(value), _) => value
                .as_i64()
                .and_then(|s| i32::try_from(s).ok())
                .ok_or_else(|| wrong(step_key, "an integer (i32)", value))?,
        };
        let uid = match &options.grouping {
            Grouping::Column(key) => match object.get(key.as_str()) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
                Some(other) => return Err(wrong(key, "a string or an integer", other)),
                None => {
                    return Err(missing(
                        key,
                        " (veRL dumps `uid` only when the reward function returns it: pass \
                         --group-by-prompt for a training dump, --group-size N (rollout.n \
                         consecutive rows) for a validation dump, or --group-column KEY)",
                    ));
                }
            },
            Grouping::Size(n) => format!("r{}", rows.len() / n.get() * n.get()),
            Grouping::Prompt => String::new(),
        };
        let gts = object.get("gts").filter(|_| options.source == Source::Verl);
        rows.push(DumpRow {
            line: line_no,
            prompt,
            response,
            score,
            step,
            uid,
            gts: gts.cloned(),
        });
    }
    if rows.is_empty() {
        return Err(ForeignError::Empty { file: file.clone() });
    }
    if let Grouping::Size(n) = options.grouping
        && rows.len() % n.get() != 0
    {
        return Err(ForeignError::GroupSize {
            file: file.clone(),
            rows: rows.len(),
            size: n.get(),
            rest: rows.len() % n.get(),
        });
    }
    if options.grouping == Grouping::Prompt {
        let mut first: HashMap<&str, usize> = HashMap::new();
        let uids: Vec<String> = rows
            .iter()
            .map(|r| format!("p{}", first.entry(&r.prompt).or_insert(r.line)))
            .collect();
        for (row, uid) in rows.iter_mut().zip(uids) {
            row.uid = uid;
        }
    }
    Ok((rows, unmapped))
}

/// A gold plan from a veRL `gts` value: a list of `{action_id, action_name}`,
/// an object with such an `executable_plan`, or a string holding either.
fn gold_plan(value: &Value) -> Option<Vec<PlanAction>> {
    let parsed;
    let value = match value {
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text).ok()?;
            &parsed
        }
        other => other,
    };
    let items = match value {
        Value::Array(items) => items,
        Value::Object(map) => map.get("executable_plan")?.as_array()?,
        _ => return None,
    };
    items
        .iter()
        .map(|item| {
            Some(PlanAction {
                action_id: item.get("action_id")?.as_i64()?,
                action_name: item.get("action_name")?.as_str()?.to_string(),
            })
        })
        .collect()
}

fn ids(
    tokenizer: &tokenizers::Tokenizer,
    text: &str,
    file: &Path,
    line: usize,
    key: &str,
) -> std::result::Result<Vec<i32>, ForeignError> {
    let encoding = tokenizer
        .encode(text, false)
        .map_err(|e| ForeignError::WrongType {
            file: file.to_path_buf(),
            line,
            key: key.to_string(),
            expected: "text the tokenizer encodes",
            found: e.to_string(),
        })?;
    Ok(encoding.get_ids().iter().map(|&id| id as i32).collect())
}

/// Imports a veRL or TRL dump into `out/{tasks,trajectories,steps,rewards}`,
/// all four committed together; nothing is written on bad input.
pub fn import(
    options: &ImportOptions,
    out: &Path,
    write: WriteOptions,
    overwrite: bool,
) -> Result<ImportSummary> {
    let tokenizer = load_tokenizer(&options.tokenizer)?;
    let (rows, unmapped) = read_dump(options)?;
    let file = &options.from;
    let [prompt_key, response_key, ..] = options.source.keys();
    let format = options.source.name();
    let policy = format!(
        "{}{format}:{}",
        embodyflow_core::IMPORTED_POLICY_PREFIX,
        file.file_name().unwrap_or_default().to_string_lossy()
    );

    let mut tasks: Vec<TaskRow> = Vec::new();
    let (mut trajectories, mut steps, mut rewards) = (Vec::new(), Vec::new(), Vec::new());
    // uid -> its first row (the task's)
    let mut task_of: HashMap<&str, &DumpRow> = HashMap::new();
    let mut group_sizes: HashMap<(i32, &str), i32> = HashMap::new();
    let mut gts_not_plans = 0;
    for row in &rows {
        match task_of.get(row.uid.as_str()) {
            Some(&first) => {
                let key = if first.prompt != row.prompt {
                    Some(prompt_key)
                } else if first.gts != row.gts {
                    Some("gts")
                } else {
                    None
                };
                if let Some(key) = key {
                    return Err(ForeignError::Mixed {
                        file: file.clone(),
                        uid: row.uid.clone(),
                        key,
                        first: first.line,
                        other: row.line,
                    }
                    .into());
                }
            }
            None => {
                task_of.insert(&row.uid, row);
                tasks.push(TaskRow {
                    task_id: row.uid.clone(),
                    suite: format.into(),
                    env: "imported".into(),
                    split: options.split.clone(),
                    task_type: None,
                    seed: 0,
                    instruction: row.prompt.clone(),
                    observation: None,
                    gt_actions: row.gts.as_ref().and_then(gold_plan),
                });
            }
        }
        if row
            .gts
            .as_ref()
            .is_some_and(|g| !g.is_null() && gold_plan(g).is_none())
        {
            gts_not_plans += 1;
        }
        let sample = group_sizes.entry((row.step, &row.uid)).or_insert(0);
        let group_id = format!("it{}/{}/d0", row.step, row.uid);
        let trajectory_id = format!("{group_id}/s{sample}");
        trajectories.push(TrajectoryRow {
            trajectory_id: trajectory_id.clone(),
            group_id: group_id.clone(),
            task_id: row.uid.clone(),
            sample_index: *sample,
            iteration: row.step,
            policy: policy.clone(),
            temperature: options.temperature,
            num_steps: 1,
            env_steps: 1,
            complete: row.score > 0.0,
            response_text: Some(row.response.clone()),
            seed: 0,
            ever_grasped: None,
            failure_reason: None,
        });
        *sample += 1;
        let prompt_ids = ids(&tokenizer, &row.prompt, file, row.line, prompt_key)?;
        let response_ids = ids(&tokenizer, &row.response, file, row.line, response_key)?;
        let old_logprobs = vec![0.0; response_ids.len()];
        steps.push(StepRow::one_shot(
            trajectory_id.clone(),
            prompt_ids,
            response_ids,
            old_logprobs,
        ));
        rewards.push(RewardRow {
            trajectory_id,
            group_id,
            score: row.score,
            format: 0.0,
            accuracy: row.score,
            success: row.score > 0.0,
            parse_ok: true,
            pred_actions: None,
            step_match: None,
            step_valid: None,
            reward_fn: format.into(),
            ever_grasped: None,
            token_rewards: None,
        });
    }

    let producer = Producer {
        stage: "table import".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        config: serde_json::json!({
            "format": format,
            "from": file,
            "tokenizer": options.tokenizer,
            "grouping": format!("{:?}", options.grouping),
            "split": options.split,
            "temperature": options.temperature,
        }),
        seed: 0,
        shard: "0/1".into(),
    };
    let mut commit = Commit::new(out);
    stage(&mut commit, out, &tasks, write, overwrite, &producer)?;
    stage(&mut commit, out, &trajectories, write, overwrite, &producer)?;
    stage(&mut commit, out, &steps, write, overwrite, &producer)?;
    stage(&mut commit, out, &rewards, write, overwrite, &producer)?;
    commit.apply()?;
    Ok(ImportSummary {
        rows: rows.len(),
        groups: group_sizes.len(),
        tasks: tasks.len(),
        gold_plans: tasks.iter().filter(|t| t.gt_actions.is_some()).count(),
        gts_not_plans,
        unmapped,
    })
}

fn stage<R: Row>(
    commit: &mut Commit,
    out: &Path,
    rows: &[R],
    write: WriteOptions,
    overwrite: bool,
    producer: &Producer,
) -> Result<Manifest> {
    let mut writer = TableWriter::create(out, R::TABLE, write, overwrite)?;
    writer.write_rows(rows)?;
    let (manifest, staged) = writer.finish_staged(producer, &[])?.into_parts();
    commit.absorb(staged)?;
    Ok(manifest)
}

/// Writes the advantages table at `dir` as JSON lines keyed by `uid`
/// (`trajectories.task_id`), `step` and `sample_index` (module doc), with
/// the rewards table's score as `rescored` when `rewards` is given; returns
/// the number of rows. A closed pipe ends the export quietly.
pub fn export_verl(
    dir: &Path,
    trajectories: &Path,
    rewards: Option<&Path>,
    out: &mut impl Write,
    label: &str,
) -> Result<u64> {
    let advantages: Vec<AdvantageRow> =
        TableReader::open(dir, TableName::Advantages)?.read_rows()?;
    let keys: HashMap<String, TrajectoryRow> =
        TableReader::open(trajectories, TableName::Trajectories)?
            .read_rows::<TrajectoryRow>()?
            .into_iter()
            .map(|t| (t.trajectory_id.clone(), t))
            .collect();
    let scores: Option<HashMap<String, f32>> = match rewards {
        Some(path) => Some(
            TableReader::open(path, TableName::Rewards)?
                .read_rows::<RewardRow>()?
                .into_iter()
                .map(|r| (r.trajectory_id, r.score))
                .collect(),
        ),
        None => None,
    };
    let mut rows = 0;
    for row in &advantages {
        let unknown = |table: &Path| {
            Error::BadInput(format!(
                "advantages row of trajectory `{}` (step {}): no such trajectory in {}",
                row.trajectory_id,
                row.step_index,
                table.display()
            ))
        };
        let trajectory = keys
            .get(&row.trajectory_id)
            .ok_or_else(|| unknown(trajectories))?;
        let mut object = Map::new();
        object.insert("uid".into(), trajectory.task_id.clone().into());
        object.insert("step".into(), trajectory.iteration.into());
        object.insert("sample_index".into(), trajectory.sample_index.into());
        object.insert("trajectory_id".into(), row.trajectory_id.clone().into());
        object.insert("step_index".into(), row.step_index.into());
        if let (Some(scores), Some(path)) = (&scores, rewards) {
            let score = scores
                .get(&row.trajectory_id)
                .ok_or_else(|| unknown(path))?;
            object.insert("rescored".into(), f64::from(*score).into());
        }
        object.insert("advantage".into(), f64::from(row.episode_adv).into());
        object.insert(
            "token_advantages".into(),
            row.advantages.iter().map(|&a| f64::from(a)).collect(),
        );
        object.insert("estimator".into(), row.estimator.clone().into());
        let text = crate::json_text(&Value::Object(object), true) + "\n";
        match out.write_all(text.as_bytes()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(rows),
            other => other.map_err(|e| Error::io(label, e))?,
        }
        rows += 1;
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gold_plans_come_from_lists_objects_and_strings() {
        let plan = vec![PlanAction {
            action_id: 3,
            action_name: "find a Mug".into(),
        }];
        let list = serde_json::json!([{"action_id": 3, "action_name": "find a Mug"}]);
        assert_eq!(gold_plan(&list), Some(plan.clone()));
        let object = serde_json::json!({"executable_plan": list.clone(), "x": 1});
        assert_eq!(gold_plan(&object), Some(plan.clone()));
        assert_eq!(gold_plan(&Value::String(object.to_string())), Some(plan));
        assert_eq!(gold_plan(&serde_json::json!("42")), None);
        assert_eq!(gold_plan(&serde_json::json!([{"action_id": "3"}])), None);
    }
}

//! Rollouts from other trainers: `table import --format verl|trl|parquet`
//! turns a JSON-lines dump of veRL or TRL, or any Parquet file whose
//! columns are named on the command line, into our tasks, trajectories,
//! steps and rewards tables, so score-rewards and compute-advantages rescore
//! it unchanged; `table export ADV --format verl` writes the advantages back in
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
//! **TRL / prime-rl / open-instruct** JSON lines: `prompt`, `completion`,
//! `reward`, optional `step`. `prompt` is a string, or (TRL's
//! conversational format) a list of chat messages `{role, content, …}`;
//! `completion` is a string or one assistant message after a string prompt,
//! and a list of messages after a conversational one. Conversational rows
//! are rendered as TRL renders them, `trl/data_utils.py` `apply_chat_template`
//! (its prompt-completion case), read at huggingface/trl commit f2cd5771
//! (2026-07-24), with [`embodyflow_chat::ChatTemplate::render_prompt_completion`]:
//! the prompt with `add_generation_prompt=True` when its last message is
//! from `user` or `tool` (continuing the final message when it is from
//! `assistant`, another role refused), prompt + completion rendered whole,
//! the prompt cut to the common prefix of the two, the completion the rest
//! of the whole (e.g. `It is blue.<|im_end|>\n`). A row's
//! `chat_template_kwargs` object goes to the template as TRL passes it (on
//! a string-prompt row TRL ignores it: reported as unmapped). The template
//! is `--chat-template DIR`'s (`chat_template.jinja`, else
//! `tokenizer_config.json`), by default the `--tokenizer` directory's; a
//! conversational row with no template is refused (exit 2, naming the file,
//! the line and the template looked for), never rendered by guess. TRL's
//! `tools` (trainer arguments, not in the rows) are not passed.
//!
//! **Parquet** (`--format parquet --from F.parquet [G.parquet …]`): every
//! file is read in order (Snappy or zstd; other codecs are refused, named),
//! and `--column ROLE=COLUMN` names the column of each role: `prompt` and
//! `response` (text, or chat messages as `list<struct<role, content>>`,
//! rendered as above), `prompt_ids` and `response_ids` (`list<int>` token
//! ids, used as they are instead of tokenising the text; the text, when
//! also mapped, stays the instruction and response text), `reward`
//! (number), `token_rewards` (`list<float>`, veRL's `token_level_rewards`),
//! `response_mask` (`list<bool>` or `list<int>` of 0/1, veRL's
//! `response_mask` / a multi-turn `loss_mask`: false marks a hole, a tool or
//! observation token), `values` (`list<float>`, veRL's critic `values`, for
//! token-level GAE), `step` (integer; 0 when not mapped), `group` (string
//! or integer, the same as `--group-column COLUMN`). The three per-token
//! roles hold one entry per response token (the `response_ids` given, or
//! the response tokenised). With `token_rewards` the score is their sum: a
//! `reward` also mapped must agree with it within
//! [`TOKEN_SUM_TOLERANCE`] relative (absolute below 1), as compute-advantages
//! checks; without one the sum is the score. `reward` or `token_rewards`,
//! `prompt` or `prompt_ids`, and `response` or `response_ids` are needed;
//! the tokenizer only for text without ids. A row is read into the same
//! row model as a JSON line (its mapped cells as JSON values: text,
//! numbers, booleans, lists and structs of them), so the formats map alike
//! and only differ in how a row is read. Errors name the file, the column
//! and the 0-based row (`rollouts.parquet: row 2: column `question` is
//! null, expected a string …`); a mapped column missing names the file's
//! columns; unmapped columns are listed in the summary (`unmapped column
//! `extra`: 4 rows (not imported)`). Without text, `tasks.instruction` is
//! empty and `trajectories.response_text` null. With `--group-by-prompt`
//! (the default) the uid is `p<row of the prompt's first row, 0-based,
//! counted over all files>`, as for the JSON-lines formats.
//! The JSON-lines formats take no per-token roles: veRL's
//! `_dump_generations` writes the summed `score` alone and TRL's rows one
//! `reward`, so a key by another name would be a layout of our invention;
//! a dataframe of a veRL batch (`token_level_rewards`, `response_mask`,
//! `values`) comes in as Parquet.
//!
//! ```text
//! table import --format parquet --from rollouts-00.parquet rollouts-01.parquet \
//!     --column prompt=question --column response=answer --column reward=score \
//!     --column step=global_step --column group=uid --tokenizer ckpt/ --out runs/pq
//! ```
//!
//! Column mapping (`source key -> table.column`):
//!
//! | veRL | TRL | Parquet `--column` | goes to |
//! |---|---|---|---|
//! | `input` | `prompt` (rendered when chat messages) | `prompt=C` | `tasks.instruction`; `steps.prompt_ids` (tokenised, no special tokens added) |
//! | — | — | `prompt_ids=C` | `steps.prompt_ids` as given |
//! | `output` | `completion` (rendered when chat messages) | `response=C` | `trajectories.response_text`; `steps.response_ids` (tokenised, no special tokens added) |
//! | — | — | `response_ids=C` | `steps.response_ids` as given |
//! | `score` | `reward` | `reward=C` | `rewards.score` = `rewards.accuracy`; `complete` = `success` = `score > 0` |
//! | — | — | `token_rewards=C` | `rewards.token_rewards`; their sum is the score |
//! | — | — | `response_mask=C` | `steps.response_mask` (holes: advantage 0, out of update-policy's loss) |
//! | — | — | `values=C` | `steps.old_values` (token-level GAE's V_t) |
//! | `step` | `step` (optional, else 0) | `step=C` (else 0) | `trajectories.iteration` |
//! | `uid` or `--group-column` | `--group-column` | `group=C` or `--group-column` | `task_id` = the uid; `group_id` = `it<step>/<uid>/d0` |
//! | `gts` | — | — | `tasks.gt_actions` when it is a plan (a list of `{action_id, action_name}`, an object with such an `executable_plan`, or a string holding either as JSON); else null and counted |
//! | — | `chat_template_kwargs` | — | the chat template's extra variables |
//!
//! With `--group-size N`, N consecutive rows form a group whose uid is `r<index
//! of the group's first row, 0-based>`; with `--group-by-prompt` (the default
//! for TRL and Parquet without a group column), rows with the same prompt do, uid `p<index
//! of its first row, 0-based>`: one numbering, the dump's rows counted from 0 over all its
//! files, for both groupings and every format. `trajectory_id` = `<group_id>/s<k>`, k the
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
//! that is not a JSON object, a mapped key (column) missing, null or of the
//! wrong type (named by file, line or row, and key), chat messages that
//! cannot be rendered (no template, the template's own error, a last role
//! TRL refuses), text to tokenise without `--tokenizer`, a non-finite score, a per-token column
//! whose length is not the response's token count (naming the file, the row, the column and both
//! lengths), a score that is not the sum of the token rewards (naming both values), a uid whose rows have
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
//! (`trajectories.task_id`), `dump_row` (`trajectories.source_row`: the
//! dump's row the trajectory came from, 0-based over all its files in the
//! order given, the numbering of the `p<row>` / `r<row>` uids; absent for
//! trajectories collected here), `prompt_sha256` (with `--tasks`: the
//! SHA-256 of the task's instruction, the dump's prompt), `step`
//! (`iteration`), `sample_index`, `trajectory_id`, `step_index`,
//! `rescored` (the rewards table's score, with `--rewards`), `advantage`
//! (`episode_adv`), `token_advantages` (per response token), `estimator`.
//! Joined with the dump in pandas by the dump's row index, whatever the
//! grouping, every row checked against its prompt:
//!
//! ```text
//! import hashlib
//! import pandas as pd
//! files = ["rollouts/3.jsonl"]  # the --from files, in their order
//! dump = pd.concat([pd.read_json(f, lines=True) for f in files], ignore_index=True)
//! adv = pd.read_json("adv.jsonl", lines=True)
//! rows = dump.merge(adv, left_index=True, right_on="dump_row", suffixes=("_dump", ""),
//!                   validate="one_to_one")
//! sha = rows["input"].map(lambda p: hashlib.sha256(p.encode()).hexdigest())
//! assert (sha == rows["prompt_sha256"]).all(), "a row joined another prompt's advantages"
//! print(rows[["dump_row", "uid", "sample_index", "score", "rescored", "advantage"]].to_csv(index=False))
//! ```
//! (Parquet files: `pd.read_parquet(f)`, the prompt and score columns by their
//! names there; a conversational prompt's hash is of its rendered text,
//! `tasks.instruction`.) The join holds because the imported trajectories
//! of a table number the dump's rows, 0 to n - 1 each once: the export,
//! `table validate --deep` and `table import --table trajectories` refuse
//! a `source_row` repeated or out of that range ([`SourceRows`]), naming
//! the table, the row and the value.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray};
use arrow::datatypes::{
    DataType, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type,
    UInt16Type, UInt32Type, UInt64Type,
};
use embodyflow_chat::ChatTemplate;
use embodyflow_core::commit::Commit;
use embodyflow_core::dataset::{TableReader, TableWriter, WriteOptions};
use embodyflow_core::error::{Classify, ErrorKind};
use embodyflow_core::manifest::{Manifest, Producer};
use embodyflow_core::schemas::{
    AdvantageRow, PlanAction, RewardRow, Row, StepRow, TOKEN_SUM_TOLERANCE, TableName, TaskRow,
    TrajectoryRow, token_sum,
};
use embodyflow_core::{Error, Result};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{Map, Value};

/// The trainer whose dump is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    /// veRL's `rollout_data_dir` / `validation_data_dir` JSON lines.
    Verl,
    /// TRL / prime-rl / open-instruct JSON lines (prompt, completion, reward).
    Trl,
    /// Any Parquet file, its columns named with `--column ROLE=COLUMN`.
    Parquet,
}

impl Source {
    /// The format's name (`verl`, `trl`, `parquet`).
    pub fn name(self) -> &'static str {
        match self {
            Source::Verl => "verl",
            Source::Trl => "trl",
            Source::Parquet => "parquet",
        }
    }

    /// What a source value is called in messages: a JSON `key` or a Parquet `column`.
    fn noun(self) -> &'static str {
        match self {
            Source::Parquet => "column",
            Source::Verl | Source::Trl => "key",
        }
    }
}

/// The roles `--format parquet --column ROLE=COLUMN` maps a column to.
pub const ROLES: [&str; 10] = [
    "prompt",
    "prompt_ids",
    "response",
    "response_ids",
    "reward",
    "token_rewards",
    "response_mask",
    "values",
    "step",
    "group",
];

/// The source key (JSON key or Parquet column) of each role.
#[derive(Debug, Clone)]
struct Keys {
    prompt: Option<String>,
    prompt_ids: Option<String>,
    response: Option<String>,
    response_ids: Option<String>,
    /// The score's key; a Parquet mapping may give token rewards instead.
    score: Option<String>,
    token_rewards: Option<String>,
    response_mask: Option<String>,
    values: Option<String>,
    /// The step's key, and whether a row must have it.
    step: Option<(String, bool)>,
    gts: Option<String>,
}

impl Keys {
    fn of(options: &ImportOptions) -> Keys {
        let key = |k: &str| Some(k.to_string());
        match options.source {
            Source::Verl => Keys {
                prompt: key("input"),
                prompt_ids: None,
                response: key("output"),
                response_ids: None,
                score: key("score"),
                token_rewards: None,
                response_mask: None,
                values: None,
                step: Some(("step".into(), true)),
                gts: key("gts"),
            },
            Source::Trl => Keys {
                prompt: key("prompt"),
                prompt_ids: None,
                response: key("completion"),
                response_ids: None,
                score: key("reward"),
                token_rewards: None,
                response_mask: None,
                values: None,
                step: Some(("step".into(), false)),
                gts: None,
            },
            Source::Parquet => {
                let column = |role: &str| options.columns.get(role).cloned();
                Keys {
                    prompt: column("prompt"),
                    prompt_ids: column("prompt_ids"),
                    response: column("response"),
                    response_ids: column("response_ids"),
                    score: column("reward"),
                    token_rewards: column("token_rewards"),
                    response_mask: column("response_mask"),
                    values: column("values"),
                    step: column("step").map(|c| (c, true)),
                    gts: None,
                }
            }
        }
    }

    /// Every key the mapping reads (the group's too).
    fn all<'a>(&'a self, grouping: &'a Grouping) -> Vec<&'a str> {
        let mut keys: Vec<&str> = [
            &self.prompt,
            &self.prompt_ids,
            &self.response,
            &self.response_ids,
            &self.score,
            &self.token_rewards,
            &self.response_mask,
            &self.values,
            &self.gts,
        ]
        .into_iter()
        .flatten()
        .map(String::as_str)
        .collect();
        if let Some((step, _)) = &self.step {
            keys.push(step);
        }
        if let Grouping::Column(c) = grouping {
            keys.push(c);
        }
        keys
    }
}

/// Bad dumps, tokenizers and templates; all are bad input (exit 2, nothing written).
#[derive(Debug, thiserror::Error)]
pub enum ForeignError {
    /// The dump cannot be read.
    #[error("--from {file}: cannot read it: {reason}")]
    Read {
        /// The dump.
        file: PathBuf,
        /// The I/O or Parquet error.
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
    /// A mapped key is missing from a row.
    #[error("{at}: {noun} `{key}` is missing; the {format} mapping needs it{hint}")]
    MissingKey {
        /// `file:line` or `file: row r`.
        at: String,
        /// `key` or `column`.
        noun: &'static str,
        /// The key.
        key: String,
        /// The format's name.
        format: &'static str,
        /// What to do about it.
        hint: &'static str,
    },
    /// A mapped Parquet column the file does not have.
    #[error(
        "{file}: column `{column}` (--column {role}={column}) does not exist; its columns are: {columns}"
    )]
    NoColumn {
        /// The Parquet file.
        file: PathBuf,
        /// The role it was mapped to.
        role: String,
        /// The column.
        column: String,
        /// The file's columns, comma-separated.
        columns: String,
    },
    /// A mapped key holds a value of another type.
    #[error("{at}: {noun} `{key}` is {found}, expected {expected}")]
    WrongType {
        /// `file:line` or `file: row r`.
        at: String,
        /// `key` or `column`.
        noun: &'static str,
        /// The key.
        key: String,
        /// What the mapping needs.
        expected: &'static str,
        /// The value found (shortened), or the column's type.
        found: String,
    },
    /// A per-token column whose length is not the response's token count.
    #[error(
        "{at}: {noun} `{key}` has {found} entries, the response has {tokens} tokens ({tokens_of}); it needs one per response token"
    )]
    Length {
        /// `file: row r`.
        at: String,
        /// `key` or `column`.
        noun: &'static str,
        /// The per-token key.
        key: String,
        /// Its entries.
        found: usize,
        /// The response's tokens.
        tokens: usize,
        /// Where they come from: the ids' key, or the text's key tokenised.
        tokens_of: String,
    },
    /// A score that is not the sum of the row's token rewards.
    #[error(
        "{at}: {noun} `{score_key}` is {score}, the sum of {noun} `{key}` is {sum}; they must agree within {tolerance} relative (the score is the token rewards' sum)"
    )]
    TokenSum {
        /// `file: row r`.
        at: String,
        /// `key` or `column`.
        noun: &'static str,
        /// The score's key.
        score_key: String,
        /// The score.
        score: f32,
        /// The token rewards' key.
        key: String,
        /// Their sum.
        sum: f64,
        /// [`TOKEN_SUM_TOLERANCE`].
        tolerance: f64,
    },
    /// A group's rows have different prompts (or veRL ground truths).
    #[error("{file}: group `{uid}` mixes values of `{key}`: {first} and {other} differ")]
    Mixed {
        /// The dump holding the group's first row.
        file: PathBuf,
        /// The group's uid.
        uid: String,
        /// The prompt key, or `gts`.
        key: String,
        /// The group's first row (`line 3`, `row 2`).
        first: String,
        /// The row with another value (with its file when that differs).
        other: String,
    },
    /// The tokenizer does not load.
    #[error("--tokenizer {file}: does not load as a Hugging Face tokenizer.json: {reason}")]
    Tokenizer {
        /// The tokenizer file.
        file: PathBuf,
        /// The loader's error.
        reason: String,
    },
    /// Text to tokenise, and no `--tokenizer`.
    #[error("{at}: {noun} `{key}` is text; tokenising it needs --tokenizer (or map its token ids)")]
    NoTokenizer {
        /// `file: row r`.
        at: String,
        /// `key` or `column`.
        noun: &'static str,
        /// The key.
        key: String,
    },
    /// Chat messages that cannot be rendered: no template, or the template
    /// or TRL's rules refuse them.
    #[error("{at}: {noun} `{key}` is a list of chat messages and cannot be rendered: {reason}")]
    Template {
        /// `file:line` or `file: row r`.
        at: String,
        /// `key` or `column`.
        noun: &'static str,
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// `--chat-template DIR` does not load.
    #[error("--chat-template {reason}")]
    BadTemplate {
        /// The loader's error (it names the file).
        reason: String,
    },
    /// `--group-size N` on a dump whose row count is not a multiple of N.
    #[error(
        "{file}: {rows} rows are not groups of --group-size {size} (the last group would have {rest}); is N the run's rollout.n?"
    )]
    GroupSize {
        /// The (last) dump.
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

/// A `trajectories.source_row` that breaks the numbering of the dump: the
/// imported trajectories of a table come one from each row of their dump,
/// so their `source_row`s are 0 to n - 1 for n of them, each once. Another
/// value would make the documented join (`merge(..., validate="one_to_one")`
/// on `dump_row`) raise, or drop the row it names.
#[derive(Debug, thiserror::Error)]
pub enum SourceRowError {
    /// Two trajectories name the same dump row.
    #[error(
        "table `trajectories` at {table}: {at} (trajectory `{trajectory}`) has source_row {value}, as {first} (trajectory `{first_trajectory}`) has: each dump row is one trajectory, so no two trajectories share a source_row"
    )]
    Repeated {
        /// The table directory, or the imported file.
        table: PathBuf,
        /// `row r` (0-based) or `line l` (1-based).
        at: String,
        /// Its trajectory.
        trajectory: String,
        /// The value.
        value: i64,
        /// Where the value came first.
        first: String,
        /// That trajectory.
        first_trajectory: String,
    },
    /// A trajectory names a row beyond the dump its trajectories came from.
    #[error(
        "table `trajectories` at {table}: {at} (trajectory `{trajectory}`) has source_row {value}, outside 0..{count}: the table's {count} imported trajectories come one from each row of a dump of {count} rows, numbered 0 to {last}",
        last = count - 1
    )]
    OutOfRange {
        /// The table directory, or the imported file.
        table: PathBuf,
        /// `row r` (0-based) or `line l` (1-based).
        at: String,
        /// Its trajectory.
        trajectory: String,
        /// The value.
        value: i64,
        /// The trajectories that have a `source_row`.
        count: i64,
    },
}

impl Classify for SourceRowError {
    fn kind(&self) -> ErrorKind {
        ErrorKind::BadInput
    }
}

impl From<SourceRowError> for Error {
    fn from(e: SourceRowError) -> Error {
        Error::BadInput(e.to_string())
    }
}

/// Checks the `source_row`s of a trajectories table as its rows come
/// ([`SourceRows::add`]), then that they number the dump's rows
/// ([`SourceRows::finish`]): unique, and below the count of trajectories
/// that have one.
#[derive(Debug)]
pub struct SourceRows {
    table: PathBuf,
    place: fn(u64) -> String,
    /// source_row -> (the row index it came at, its trajectory).
    first: HashMap<i64, (u64, String)>,
}

impl SourceRows {
    /// For the table at `table` (a directory, or the file imported), whose
    /// rows `place` names from their index.
    pub fn new(table: &Path, place: fn(u64) -> String) -> SourceRows {
        SourceRows {
            table: table.to_path_buf(),
            place,
            first: HashMap::new(),
        }
    }

    /// The trajectory at `index` names dump row `source_row` (none when the
    /// pipeline collected it).
    pub fn add(
        &mut self,
        index: u64,
        trajectory: &str,
        source_row: Option<i64>,
    ) -> std::result::Result<(), SourceRowError> {
        let Some(value) = source_row else {
            return Ok(());
        };
        match self.first.entry(value) {
            std::collections::hash_map::Entry::Occupied(seen) => {
                let (first, first_trajectory) = seen.get();
                Err(SourceRowError::Repeated {
                    table: self.table.clone(),
                    at: (self.place)(index),
                    trajectory: trajectory.to_string(),
                    value,
                    first: (self.place)(*first),
                    first_trajectory: first_trajectory.clone(),
                })
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert((index, trajectory.to_string()));
                Ok(())
            }
        }
    }

    /// After every row: the first row (by index) whose value is not below
    /// the number of trajectories with a `source_row`.
    pub fn finish(self) -> std::result::Result<(), SourceRowError> {
        let count = self.first.len() as i64;
        let beyond = self
            .first
            .iter()
            .filter(|(value, _)| !(0..count).contains(*value))
            .min_by_key(|(_, (index, _))| *index);
        match beyond {
            None => Ok(()),
            Some((&value, (index, trajectory))) => Err(SourceRowError::OutOfRange {
                table: self.table.clone(),
                at: (self.place)(*index),
                trajectory: trajectory.clone(),
                value,
                count,
            }),
        }
    }
}

/// The `source_row`s of the trajectories table at `dir`, checked
/// ([`SourceRows`]); rows are named by their 0-based index.
pub fn check_source_rows(dir: &Path, reader: &TableReader) -> Result<()> {
    use arrow::array::{Int64Array, StringArray};
    let mut rows = SourceRows::new(dir, |i| format!("row {i}"));
    let mut index = 0u64;
    for batch in reader.batches(Some(&["trajectory_id", "source_row"]), 65_536)? {
        let batch = batch?;
        let ids: &StringArray = embodyflow_core::dataset::column(&batch, "trajectory_id");
        let values: &Int64Array = embodyflow_core::dataset::column(&batch, "source_row");
        for i in 0..batch.num_rows() {
            let value = values.is_valid(i).then(|| values.value(i));
            rows.add(index, ids.value(i), value)?;
            index += 1;
        }
    }
    Ok(rows.finish()?)
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

/// What `table import --format verl|trl|parquet` needs.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// Dump format.
    pub source: Source,
    /// The dump: one JSON-lines file, or Parquet files read in this order.
    pub from: Vec<PathBuf>,
    /// `tokenizer.json`, or a directory holding one (optional only for
    /// Parquet whose texts all come with token ids).
    pub tokenizer: Option<PathBuf>,
    /// A model directory whose chat template renders conversational rows
    /// (default: the tokenizer's directory).
    pub chat_template: Option<PathBuf>,
    /// Parquet: role (one of [`ROLES`] but `group`) -> column.
    pub columns: BTreeMap<String, String>,
    /// How rows form groups.
    pub grouping: Grouping,
    /// `tasks.split` of the imported tasks.
    pub split: String,
    /// `trajectories.temperature` (the dumps do not hold it).
    pub temperature: f32,
}

/// One row of a dump as read, before it is mapped: a JSON line, or a
/// Parquet row's mapped columns as JSON values.
struct RawRow {
    /// Index into [`ImportOptions::from`].
    file: usize,
    /// 1-based line (JSON lines) or 0-based row (Parquet) in its file.
    index: usize,
    object: Map<String, Value>,
}

/// One row of the dump, checked, rendered and tokenised.
#[derive(Debug)]
struct DumpRow {
    file: usize,
    index: usize,
    /// The 0-based row of the dump, counted over all its files: what
    /// `p<row>` names a prompt group by, as `r<row>` names a group of
    /// `--group-size` rows.
    row: usize,
    prompt: String,
    prompt_ids: Vec<i32>,
    response: Option<String>,
    response_ids: Vec<i32>,
    score: f32,
    /// veRL's token_level_rewards, one per response token.
    token_rewards: Option<Vec<f32>>,
    /// veRL's response_mask (false: a hole), one per response token.
    response_mask: Option<Vec<bool>>,
    /// The critic's values, one per response token.
    values: Option<Vec<f32>>,
    step: i32,
    uid: String,
    gts: Option<Value>,
    /// Whether TRL's `chat_template_kwargs` rendered its messages.
    kwargs_used: bool,
}

/// TRL's per-example keyword arguments of the chat template.
const KWARGS: &str = "chat_template_kwargs";

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
    /// Rows whose prompt and completion were chat messages, rendered with the template.
    pub rendered: usize,
    /// Rows with token rewards (`rewards.token_rewards`).
    pub token_rewards: usize,
    /// Rows with a response mask (`steps.response_mask`), and their hole tokens.
    pub masks: (usize, usize),
    /// Rows with critic values (`steps.old_values`).
    pub values: usize,
    /// Keys (columns) not mapped and the number of rows holding each.
    pub unmapped: BTreeMap<String, usize>,
    /// `key` or `column`.
    pub noun: &'static str,
}

impl std::fmt::Display for ImportSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} rows, {} groups, {} tasks ({} with a gold plan)",
            self.rows, self.groups, self.tasks, self.gold_plans
        )?;
        if self.rendered > 0 {
            write!(
                f,
                "\nchat messages: {} rows rendered with the chat template",
                self.rendered
            )?;
        }
        if self.token_rewards > 0 {
            write!(
                f,
                "\ntoken rewards: {} rows (rewards.token_rewards; the score is their sum)",
                self.token_rewards
            )?;
        }
        if self.masks.0 > 0 {
            write!(
                f,
                "\nresponse masks: {} rows, {} hole tokens (steps.response_mask)",
                self.masks.0, self.masks.1
            )?;
        }
        if self.values > 0 {
            write!(
                f,
                "\ncritic values: {} rows (steps.old_values)",
                self.values
            )?;
        }
        if self.gts_not_plans > 0 {
            write!(
                f,
                "\ngts: {} rows hold no plan (a list of {{action_id, action_name}} or an executable_plan): their tasks have no gt_actions",
                self.gts_not_plans
            )?;
        }
        for (key, count) in &self.unmapped {
            write!(
                f,
                "\nunmapped {} `{key}`: {count} rows (not imported)",
                self.noun
            )?;
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

/// The tokenizer and the chat template, the template loaded when a first
/// conversational row needs it (unless `--chat-template` named it).
struct Texts {
    tokenizer: Option<tokenizers::Tokenizer>,
    template: Option<std::result::Result<ChatTemplate, String>>,
    /// Where the template is looked up when it is first needed.
    template_dir: Option<PathBuf>,
    /// Token ids of the prompts tokenised so far.
    prompt_ids: HashMap<String, Vec<i32>>,
}

impl Texts {
    fn new(options: &ImportOptions) -> std::result::Result<Texts, ForeignError> {
        let tokenizer = options
            .tokenizer
            .as_deref()
            .map(load_tokenizer)
            .transpose()?;
        let template = match &options.chat_template {
            Some(dir) => Some(Ok(ChatTemplate::from_dir(dir).map_err(|e| {
                ForeignError::BadTemplate {
                    reason: e.to_string(),
                }
            })?)),
            None => None,
        };
        let template_dir = options.tokenizer.as_ref().map(|t| {
            if t.is_dir() {
                t.clone()
            } else {
                t.parent().unwrap_or(Path::new(".")).to_path_buf()
            }
        });
        Ok(Texts {
            tokenizer,
            template,
            template_dir,
            prompt_ids: HashMap::new(),
        })
    }

    fn template(&mut self) -> std::result::Result<&ChatTemplate, String> {
        let dir = &self.template_dir;
        self.template
            .get_or_insert_with(|| match dir {
                Some(dir) => ChatTemplate::from_dir(dir).map_err(|e| {
                    format!("{e} (give --chat-template DIR, a model directory with one)")
                }),
                None => Err("no chat template: give --chat-template DIR (a model directory with chat_template.jinja or tokenizer_config.json)".into()),
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// A prompt or response value: plain text, or chat messages.
enum Text {
    Plain(String),
    Chat(Value),
}

/// Whether `value` is a non-empty list of chat messages (objects with a `role`).
fn is_chat(value: &Value) -> bool {
    value.as_array().is_some_and(|m| {
        !m.is_empty()
            && m.iter()
                .all(|m| m.get("role").is_some_and(Value::is_string))
    })
}

/// The dump's rows as read: every JSON line of a JSON-lines dump, or the
/// mapped columns of every row of every Parquet file; and the keys
/// (columns) not mapped with the rows holding each.
fn read_raw(
    options: &ImportOptions,
    keys: &Keys,
) -> std::result::Result<(Vec<RawRow>, BTreeMap<String, usize>), ForeignError> {
    let mapped = keys.all(&options.grouping);
    let (mut rows, mut unmapped) = (Vec::new(), BTreeMap::new());
    for (index, file) in options.from.iter().enumerate() {
        if options.source == Source::Parquet {
            read_parquet(index, file, options, &mut rows, &mut unmapped)?;
        } else {
            read_lines(index, file, &mapped, &mut rows, &mut unmapped)?;
        }
    }
    Ok((rows, unmapped))
}

fn read_lines(
    index: usize,
    file: &Path,
    mapped: &[&str],
    rows: &mut Vec<RawRow>,
    unmapped: &mut BTreeMap<String, usize>,
) -> std::result::Result<(), ForeignError> {
    let read_err = |e: std::io::Error| ForeignError::Read {
        file: file.to_path_buf(),
        reason: e.to_string(),
    };
    let reader = BufReader::new(std::fs::File::open(file).map_err(read_err)?);
    for (at, line) in reader.lines().enumerate() {
        let text = line.map_err(read_err)?;
        if text.trim().is_empty() {
            continue;
        }
        let object: Map<String, Value> =
            serde_json::from_str(&text).map_err(|e| ForeignError::NotJson {
                file: file.to_path_buf(),
                line: at + 1,
                reason: e.to_string(),
            })?;
        for key in object.keys() {
            if !mapped.contains(&key.as_str()) {
                *unmapped.entry(key.clone()).or_insert(0) += 1;
            }
        }
        rows.push(RawRow {
            file: index,
            index: at + 1,
            object,
        });
    }
    Ok(())
}

fn read_parquet(
    index: usize,
    file: &Path,
    options: &ImportOptions,
    rows: &mut Vec<RawRow>,
    unmapped: &mut BTreeMap<String, usize>,
) -> std::result::Result<(), ForeignError> {
    let read_err = |reason: String| ForeignError::Read {
        file: file.to_path_buf(),
        reason,
    };
    let handle = std::fs::File::open(file).map_err(|e| read_err(e.to_string()))?;
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(handle).map_err(|e| read_err(e.to_string()))?;
    let schema = builder.schema().clone();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let mut mapped: Vec<(String, String)> = options
        .columns
        .iter()
        .map(|(r, c)| (r.clone(), c.clone()))
        .collect();
    if let Grouping::Column(c) = &options.grouping {
        mapped.push(("group".into(), c.clone()));
    }
    let mut roots = Vec::new();
    for (role, column) in &mapped {
        match names.iter().position(|n| n == column) {
            Some(at) => roots.push(at),
            None => {
                return Err(ForeignError::NoColumn {
                    file: file.to_path_buf(),
                    role: role.clone(),
                    column: column.clone(),
                    columns: names.join(", "),
                });
            }
        }
    }
    let total = usize::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0);
    for name in &names {
        if !mapped.iter().any(|(_, c)| c == name) {
            *unmapped.entry(name.to_string()).or_insert(0) += total;
        }
    }
    let projection = ProjectionMask::roots(builder.parquet_schema(), roots);
    let reader = builder
        .with_projection(projection)
        .build()
        .map_err(|e| read_err(e.to_string()))?;
    let mut row = 0;
    for batch in reader {
        let batch = batch.map_err(|e| read_err(e.to_string()))?;
        let columns: Vec<(&String, &std::sync::Arc<dyn Array>)> = batch
            .schema_ref()
            .fields()
            .iter()
            .map(|f| f.name())
            .zip(batch.columns())
            .collect();
        for i in 0..batch.num_rows() {
            let mut object = Map::new();
            for (name, array) in &columns {
                let value = cell(array.as_ref(), i).map_err(|found| ForeignError::WrongType {
                    at: format!("{}: row {row}", file.display()),
                    noun: "column",
                    key: name.to_string(),
                    expected: "text, numbers, booleans, or lists and structs of them",
                    found: format!("of type {found}"),
                })?;
                object.insert(name.to_string(), value);
            }
            rows.push(RawRow {
                file: index,
                index: row,
                object,
            });
            row += 1;
        }
    }
    Ok(())
}

/// A Parquet cell as a JSON value (null for null); the column's type when
/// it is not text, a number, a boolean or a list or struct of them.
fn cell(array: &dyn Array, row: usize) -> std::result::Result<Value, DataType> {
    if array.is_null(row) {
        return Ok(Value::Null);
    }
    let float = |x: f64| {
        serde_json::Number::from_f64(x).map_or_else(|| Value::String(x.to_string()), Value::Number)
    };
    let list = |items: std::sync::Arc<dyn Array>| -> std::result::Result<Value, DataType> {
        (0..items.len()).map(|i| cell(items.as_ref(), i)).collect()
    };
    Ok(match array.data_type() {
        DataType::Utf8 => array.as_string::<i32>().value(row).into(),
        DataType::LargeUtf8 => array.as_string::<i64>().value(row).into(),
        DataType::Utf8View => array.as_string_view().value(row).into(),
        DataType::Boolean => array.as_boolean().value(row).into(),
        DataType::Int8 => array.as_primitive::<Int8Type>().value(row).into(),
        DataType::Int16 => array.as_primitive::<Int16Type>().value(row).into(),
        DataType::Int32 => array.as_primitive::<Int32Type>().value(row).into(),
        DataType::Int64 => array.as_primitive::<Int64Type>().value(row).into(),
        DataType::UInt8 => array.as_primitive::<UInt8Type>().value(row).into(),
        DataType::UInt16 => array.as_primitive::<UInt16Type>().value(row).into(),
        DataType::UInt32 => array.as_primitive::<UInt32Type>().value(row).into(),
        DataType::UInt64 => array.as_primitive::<UInt64Type>().value(row).into(),
        DataType::Float32 => float(f64::from(array.as_primitive::<Float32Type>().value(row))),
        DataType::Float64 => float(array.as_primitive::<Float64Type>().value(row)),
        DataType::List(_) => list(array.as_list::<i32>().value(row))?,
        DataType::LargeList(_) => list(array.as_list::<i64>().value(row))?,
        DataType::Struct(fields) => {
            let columns = array.as_struct().columns();
            let mut object = Map::new();
            for (field, column) in fields.iter().zip(columns) {
                object.insert(field.name().clone(), cell(column.as_ref(), row)?);
            }
            Value::Object(object)
        }
        other => return Err(other.clone()),
    })
}

/// Maps every raw row, renders chat messages, tokenises texts and forms
/// the groups; the summary's counts of rendered rows.
fn read_dump(
    options: &ImportOptions,
    texts: &mut Texts,
) -> std::result::Result<(Vec<DumpRow>, BTreeMap<String, usize>, usize), ForeignError> {
    let keys = Keys::of(options);
    let (raw, mut unmapped) = read_raw(options, &keys)?;
    let mut rows = Vec::with_capacity(raw.len());
    let (mut rendered, mut kwargs_used) = (0, 0);
    for raw in raw {
        let row = map_row(options, &keys, texts, raw, rows.len(), &mut rendered)?;
        kwargs_used += usize::from(row.kwargs_used);
        rows.push(row);
    }
    // TRL's per-example template arguments are mapped where a row's chat
    // messages were rendered with them; elsewhere they are unmapped.
    if let Some(count) = unmapped.get_mut(KWARGS) {
        *count -= kwargs_used;
        if *count == 0 {
            unmapped.remove(KWARGS);
        }
    }
    let last = options.from.last().cloned().unwrap_or_default();
    if rows.is_empty() {
        return Err(ForeignError::Empty { file: last });
    }
    if let Grouping::Size(n) = options.grouping
        && rows.len() % n.get() != 0
    {
        return Err(ForeignError::GroupSize {
            file: last,
            rows: rows.len(),
            size: n.get(),
            rest: rows.len() % n.get(),
        });
    }
    if options.grouping == Grouping::Prompt {
        let mut first: HashMap<(&str, &[i32]), usize> = HashMap::new();
        let uids: Vec<String> = rows
            .iter()
            .map(|r| {
                let prompt = (r.prompt.as_str(), r.prompt_ids.as_slice());
                format!("p{}", first.entry(prompt).or_insert(r.row))
            })
            .collect();
        for (row, uid) in rows.iter_mut().zip(uids) {
            row.uid = uid;
        }
    }
    Ok((rows, unmapped, rendered))
}

/// One row mapped (module doc): the same for every format, which differ
/// only in the keys and in how a row is read. In phases: the texts
/// ([`RowAt::texts`]), chat messages rendered ([`RowAt::render`]), token
/// ids ([`RowAt::token_ids`]), the per-token columns ([`RowAt::per_token`]),
/// the score ([`RowAt::score`]), the step and the group ([`RowAt::step`],
/// [`RowAt::group`]).
fn map_row(
    options: &ImportOptions,
    keys: &Keys,
    texts: &mut Texts,
    raw: RawRow,
    order: usize,
    rendered: &mut usize,
) -> std::result::Result<DumpRow, ForeignError> {
    let row = RowAt::new(options, &raw);
    let (prompt, response) = row.texts(keys)?;
    let (prompt, response, kwargs_used) = row.render(keys, texts, prompt, response, rendered)?;
    let (prompt_ids, response_ids) = row.token_ids(keys, texts, &prompt, &response)?;
    let per_token = row.per_token(keys, &response_ids)?;
    let score = row.score(keys, per_token.token_rewards.as_ref())?;
    let step = row.step(keys)?;
    let uid = row.group(&options.grouping, order)?;
    let gts = keys.gts.as_ref().and_then(|k| raw.object.get(k)).cloned();
    Ok(DumpRow {
        file: raw.file,
        index: raw.index,
        row: order,
        prompt: prompt.unwrap_or_default(),
        prompt_ids,
        response,
        response_ids,
        score,
        token_rewards: per_token.token_rewards.map(|(_, rewards)| rewards),
        response_mask: per_token.response_mask,
        values: per_token.values,
        step,
        uid,
        gts,
        kwargs_used,
    })
}

/// A raw row with where it is, for the errors that name it (file and line
/// or row, the dump's noun for its keys, the format).
struct RowAt<'a> {
    at: String,
    noun: &'static str,
    format: &'static str,
    /// Whether prompts and responses may be chat messages (TRL, Parquet).
    chats: bool,
    object: &'a Map<String, Value>,
}

/// A row's per-token columns, each one entry per response token.
struct PerToken<'k> {
    /// The token rewards with their key.
    token_rewards: Option<(&'k String, Vec<f32>)>,
    values: Option<Vec<f32>>,
    response_mask: Option<Vec<bool>>,
}

impl<'a> RowAt<'a> {
    fn new(options: &ImportOptions, raw: &'a RawRow) -> RowAt<'a> {
        let file = &options.from[raw.file];
        let at = if options.source == Source::Parquet {
            format!("{}: row {}", file.display(), raw.index)
        } else {
            format!("{}:{}", file.display(), raw.index)
        };
        RowAt {
            at,
            noun: options.source.noun(),
            format: options.source.name(),
            chats: options.source != Source::Verl,
            object: &raw.object,
        }
    }

    fn missing(&self, key: &str, hint: &'static str) -> ForeignError {
        ForeignError::MissingKey {
            at: self.at.clone(),
            noun: self.noun,
            key: key.to_string(),
            format: self.format,
            hint,
        }
    }

    fn wrong(&self, key: &str, expected: &'static str, value: &Value) -> ForeignError {
        ForeignError::WrongType {
            at: self.at.clone(),
            noun: self.noun,
            key: key.to_string(),
            expected,
            found: shorten(value),
        }
    }

    fn get(&self, key: &str) -> std::result::Result<&'a Value, ForeignError> {
        self.object.get(key).ok_or_else(|| self.missing(key, ""))
    }

    /// The prompt and response as given: plain text, or chat messages
    /// (TRL, Parquet; a conversational prompt needs a conversational
    /// response, a plain one may come as one assistant message).
    fn texts(
        &self,
        keys: &Keys,
    ) -> std::result::Result<(Option<Text>, Option<Text>), ForeignError> {
        let chats = self.chats;
        let prompt = match &keys.prompt {
            None => None,
            Some(key) => Some(match self.get(key)? {
                Value::String(s) => Text::Plain(s.clone()),
                value if chats && is_chat(value) => Text::Chat(value.clone()),
                other if chats => {
                    return Err(self.wrong(
                        key,
                        "a string or a list of chat messages ({role, content})",
                        other,
                    ));
                }
                other => return Err(self.wrong(key, "a string", other)),
            }),
        };
        let conversational = matches!(prompt, Some(Text::Chat(_)));
        let response = match &keys.response {
            None => None,
            Some(key) => Some(match self.get(key)? {
                value if conversational => {
                    if !is_chat(value) {
                        return Err(self.wrong(
                            key,
                            "a list of chat messages ({role, content}), as the prompt is",
                            value,
                        ));
                    }
                    Text::Chat(value.clone())
                }
                Value::String(s) => Text::Plain(s.clone()),
                Value::Array(messages) if chats => match messages.as_slice() {
                    [message]
                        if message.get("role").and_then(Value::as_str) == Some("assistant")
                            && message.get("content").is_some_and(Value::is_string) =>
                    {
                        Text::Plain(message["content"].as_str().unwrap_or_default().to_string())
                    }
                    _ => {
                        return Err(self.wrong(
                            key,
                            "a string or one assistant message with string content",
                            &Value::Array(messages.clone()),
                        ));
                    }
                },
                other => return Err(self.wrong(key, "a string", other)),
            }),
        };
        Ok((prompt, response))
    }

    /// The texts, chat messages rendered as TRL renders them (with the row's
    /// template arguments, whether they were used is the third value);
    /// `rendered` counts the rows rendered.
    fn render(
        &self,
        keys: &Keys,
        texts: &mut Texts,
        prompt: Option<Text>,
        response: Option<Text>,
        rendered: &mut usize,
    ) -> std::result::Result<(Option<String>, Option<String>, bool), ForeignError> {
        Ok(match (prompt, response) {
            (Some(Text::Chat(p)), response) => {
                let key = keys.prompt.as_deref().unwrap_or_default();
                let kwargs = match self.object.get(KWARGS) {
                    None => None,
                    Some(Value::Object(map)) => Some(map),
                    Some(other) => return Err(self.wrong(KWARGS, "an object", other)),
                };
                let template = texts.template().map_err(|reason| ForeignError::Template {
                    at: self.at.clone(),
                    noun: self.noun,
                    key: key.to_string(),
                    reason,
                })?;
                let failed = |e: embodyflow_chat::ChatError| ForeignError::Template {
                    at: self.at.clone(),
                    noun: self.noun,
                    key: key.to_string(),
                    reason: e.to_string(),
                };
                *rendered += 1;
                let (p, c) = match response {
                    Some(Text::Chat(c)) => {
                        let (p, c) = template
                            .render_prompt_completion(&p, &c, None, kwargs)
                            .map_err(failed)?;
                        (Some(p), Some(c))
                    }
                    _ => (
                        Some(template.render_prompt(&p, None, kwargs).map_err(failed)?),
                        None,
                    ),
                };
                (p, c, kwargs.is_some())
            }
            (Some(Text::Plain(p)), Some(Text::Plain(r))) => (Some(p), Some(r), false),
            (Some(Text::Plain(p)), _) => (Some(p), None, false),
            (None, Some(Text::Plain(r))) => (None, Some(r), false),
            (None, _) => (None, None, false),
        })
    }

    /// The token ids under `key`, if mapped.
    fn ids(&self, key: &Option<String>) -> std::result::Result<Option<Vec<i32>>, ForeignError> {
        let Some(key) = key else { return Ok(None) };
        let value = self.get(key)?;
        let ids = value.as_array().and_then(|items| {
            items
                .iter()
                .map(|i| {
                    i.as_i64()
                        .and_then(|i| i32::try_from(i).ok())
                        .filter(|&i| i >= 0)
                })
                .collect::<Option<Vec<i32>>>()
        });
        ids.map(Some)
            .ok_or_else(|| self.wrong(key, "a list of non-negative integer token ids (i32)", value))
    }

    /// `ids` when given, else `text` (under `key`) tokenised, else none.
    fn tokenise(
        &self,
        texts: &Texts,
        text: &Option<String>,
        key: &Option<String>,
        ids: Option<Vec<i32>>,
    ) -> std::result::Result<Vec<i32>, ForeignError> {
        if let Some(ids) = ids {
            return Ok(ids);
        }
        let (Some(text), Some(key)) = (text, key) else {
            return Ok(Vec::new());
        };
        let Some(tokenizer) = &texts.tokenizer else {
            return Err(ForeignError::NoTokenizer {
                at: self.at.clone(),
                noun: self.noun,
                key: key.clone(),
            });
        };
        let encoding =
            tokenizer
                .encode(text.as_str(), false)
                .map_err(|e| ForeignError::WrongType {
                    at: self.at.clone(),
                    noun: self.noun,
                    key: key.clone(),
                    expected: "text the tokenizer encodes",
                    found: e.to_string(),
                })?;
        Ok(encoding.get_ids().iter().map(|&id| id as i32).collect())
    }

    /// The prompt's and the response's token ids: as mapped, else the texts
    /// tokenised. A group's rows share their prompt: it is tokenised once.
    fn token_ids(
        &self,
        keys: &Keys,
        texts: &mut Texts,
        prompt: &Option<String>,
        response: &Option<String>,
    ) -> std::result::Result<(Vec<i32>, Vec<i32>), ForeignError> {
        let prompt_ids = match (self.ids(&keys.prompt_ids)?, prompt) {
            (None, Some(text)) => texts.prompt_ids.get(text).cloned(),
            (ids, _) => ids,
        };
        let response_ids = self.ids(&keys.response_ids)?;
        let prompt_ids = self.tokenise(texts, prompt, &keys.prompt, prompt_ids)?;
        let response_ids = self.tokenise(texts, response, &keys.response, response_ids)?;
        if let (None, Some(text)) = (&keys.prompt_ids, prompt)
            && !texts.prompt_ids.contains_key(text)
        {
            texts.prompt_ids.insert(text.clone(), prompt_ids.clone());
        }
        Ok((prompt_ids, response_ids))
    }

    /// A per-token column's length checked against the response's tokens.
    fn check_len(
        &self,
        keys: &Keys,
        key: &String,
        found: usize,
        tokens: usize,
    ) -> std::result::Result<(), ForeignError> {
        if found == tokens {
            return Ok(());
        }
        let noun = self.noun;
        let tokens_of = match (&keys.response_ids, &keys.response) {
            (Some(ids), _) => format!("{noun} `{ids}`"),
            (None, Some(text)) => format!("{noun} `{text}` tokenised"),
            (None, None) => "no response mapped".into(),
        };
        Err(ForeignError::Length {
            at: self.at.clone(),
            noun,
            key: key.clone(),
            found,
            tokens,
            tokens_of,
        })
    }

    /// The finite floats under `key`, one per response token.
    fn floats(
        &self,
        keys: &Keys,
        key: &String,
        expected: &'static str,
        tokens: usize,
    ) -> std::result::Result<Vec<f32>, ForeignError> {
        let value = self.get(key)?;
        let floats = value
            .as_array()
            .and_then(|items| {
                items
                    .iter()
                    .map(|v| v.as_f64().map(|x| x as f32).filter(|x| x.is_finite()))
                    .collect::<Option<Vec<f32>>>()
            })
            .ok_or_else(|| self.wrong(key, expected, value))?;
        self.check_len(keys, key, floats.len(), tokens)?;
        Ok(floats)
    }

    /// The booleans (or 0/1 integers) under `key`, one per response token.
    fn mask(
        &self,
        keys: &Keys,
        key: &String,
        tokens: usize,
    ) -> std::result::Result<Vec<bool>, ForeignError> {
        let value = self.get(key)?;
        let flag = |v: &Value| match v {
            Value::Bool(b) => Some(*b),
            Value::Number(n) => match n.as_u64() {
                Some(0) => Some(false),
                Some(1) => Some(true),
                _ => None,
            },
            _ => None,
        };
        let mask = value
            .as_array()
            .and_then(|items| items.iter().map(flag).collect::<Option<Vec<bool>>>())
            .ok_or_else(|| {
                self.wrong(
                    key,
                    "a list of booleans or 0/1 integers, one per response token",
                    value,
                )
            })?;
        self.check_len(keys, key, mask.len(), tokens)?;
        Ok(mask)
    }

    /// The per-token columns: token rewards, values and response mask,
    /// each one entry per response token.
    fn per_token<'k>(
        &self,
        keys: &'k Keys,
        response_ids: &[i32],
    ) -> std::result::Result<PerToken<'k>, ForeignError> {
        let tokens = response_ids.len();
        let token_rewards = keys
            .token_rewards
            .as_ref()
            .map(|key| {
                self.floats(
                    keys,
                    key,
                    "a list of finite numbers (f32), one reward per response token",
                    tokens,
                )
                .map(|rewards| (key, rewards))
            })
            .transpose()?;
        let values = keys
            .values
            .as_ref()
            .map(|key| {
                self.floats(
                    keys,
                    key,
                    "a list of finite numbers (f32), one value per response token",
                    tokens,
                )
            })
            .transpose()?;
        let response_mask = keys
            .response_mask
            .as_ref()
            .map(|key| self.mask(keys, key, tokens))
            .transpose()?;
        Ok(PerToken {
            token_rewards,
            values,
            response_mask,
        })
    }

    /// The score: the reward's key, which must agree with the token rewards'
    /// sum when both are mapped; else that sum.
    fn score(
        &self,
        keys: &Keys,
        token_rewards: Option<&(&String, Vec<f32>)>,
    ) -> std::result::Result<f32, ForeignError> {
        let score_of = |key: &String| {
            let value = self.get(key)?;
            value
                .as_f64()
                .map(|s| s as f32)
                .filter(|s| s.is_finite())
                .ok_or_else(|| self.wrong(key, "a finite number (f32)", value))
        };
        Ok(match (&keys.score, token_rewards) {
            (Some(key), None) => score_of(key)?,
            (Some(key), Some((tokens_key, rewards))) => {
                let score = score_of(key)?;
                let (sum, agrees) = token_sum(score, rewards);
                if !agrees {
                    return Err(ForeignError::TokenSum {
                        at: self.at.clone(),
                        noun: self.noun,
                        score_key: key.clone(),
                        score,
                        key: (*tokens_key).clone(),
                        sum,
                        tolerance: TOKEN_SUM_TOLERANCE,
                    });
                }
                score
            }
            (None, Some((_, rewards))) => rewards.iter().map(|&r| f64::from(r)).sum::<f64>() as f32,
            (None, None) => {
                return Err(self.missing(
                    "reward",
                    " (map --column reward=COLUMN or --column token_rewards=COLUMN)",
                ));
            }
        })
    }

    /// The step (0 when unmapped, or when optional and absent).
    fn step(&self, keys: &Keys) -> std::result::Result<i32, ForeignError> {
        Ok(match &keys.step {
            None => 0,
            Some((key, required)) => match self.object.get(key.as_str()) {
                None if !required => 0,
                None => return Err(self.missing(key, "")),
                Some(value) => value
                    .as_i64()
                    .and_then(|s| i32::try_from(s).ok())
                    .ok_or_else(|| self.wrong(key, "an integer (i32)", value))?,
            },
        })
    }

    /// The row's group: its group key's value, its block of `n` rows
    /// (`order` counts the rows), or none yet (grouped by prompt later).
    fn group(
        &self,
        grouping: &Grouping,
        order: usize,
    ) -> std::result::Result<String, ForeignError> {
        Ok(match grouping {
            Grouping::Column(key) => match self.object.get(key.as_str()) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
                Some(other) => return Err(self.wrong(key, "a string or an integer", other)),
                None => {
                    return Err(self.missing(
                        key,
                        " (veRL dumps `uid` only when the reward function returns it: pass \
                         --group-by-prompt for a training dump, --group-size N (rollout.n \
                         consecutive rows) for a validation dump, or --group-column KEY)",
                    ));
                }
            },
            Grouping::Size(n) => format!("r{}", order / n.get() * n.get()),
            Grouping::Prompt => String::new(),
        })
    }
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

/// The trajectory, its one step and its reward for dump row `row`, the
/// `sample`-th of its group (uid x step).
fn rollout_rows(
    row: &DumpRow,
    sample: i32,
    policy: &str,
    format: &str,
    options: &ImportOptions,
) -> (TrajectoryRow, StepRow, RewardRow) {
    let group_id = format!("it{}/{}/d0", row.step, row.uid);
    let trajectory_id = format!("{group_id}/s{sample}");
    let trajectory = TrajectoryRow {
        source_row: Some(row.row as i64),
        infra_fault: None,
        trajectory_id: trajectory_id.clone(),
        group_id: group_id.clone(),
        task_id: row.uid.clone(),
        sample_index: sample,
        iteration: row.step,
        policy: policy.to_string(),
        temperature: options.temperature,
        num_steps: 1,
        env_steps: 1,
        complete: row.score > 0.0,
        response_text: row.response.clone(),
        seed: 0,
        ever_grasped: None,
        failure_reason: None,
    };
    let mut step = StepRow::one_shot(
        trajectory_id.clone(),
        row.prompt_ids.clone(),
        row.response_ids.clone(),
        vec![0.0; row.response_ids.len()],
    );
    step.response_mask = row.response_mask.clone();
    step.old_values = row.values.clone();
    let reward = RewardRow {
        infra_fault: None,
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
        token_rewards: row.token_rewards.clone(),
    };
    (trajectory, step, reward)
}

/// Imports a veRL, TRL or Parquet dump into
/// `out/{tasks,trajectories,steps,rewards}`, all four committed together;
/// nothing is written on bad input.
pub fn import(
    options: &ImportOptions,
    out: &Path,
    write: WriteOptions,
    overwrite: bool,
) -> Result<ImportSummary> {
    let mut texts = Texts::new(options)?;
    let (rows, unmapped, rendered) = read_dump(options, &mut texts)?;
    let files = &options.from;
    let keys = Keys::of(options);
    let prompt_key = keys
        .prompt
        .as_deref()
        .or(keys.prompt_ids.as_deref())
        .unwrap_or_default();
    let format = options.source.name();
    let policy = format!(
        "{}{format}:{}",
        embodyflow_core::IMPORTED_POLICY_PREFIX,
        files[0].file_name().unwrap_or_default().to_string_lossy()
    );
    let place = |row: &DumpRow| {
        if options.source == Source::Parquet {
            format!("row {}", row.index)
        } else {
            format!("line {}", row.index)
        }
    };

    let mut tasks: Vec<TaskRow> = Vec::new();
    let (mut trajectories, mut steps, mut rewards) = (Vec::new(), Vec::new(), Vec::new());
    // uid -> its first row (the task's)
    let mut task_of: HashMap<&str, &DumpRow> = HashMap::new();
    let mut group_sizes: HashMap<(i32, &str), i32> = HashMap::new();
    let mut gts_not_plans = 0;
    for row in &rows {
        match task_of.get(row.uid.as_str()) {
            Some(&first) => {
                let key = if first.prompt != row.prompt || first.prompt_ids != row.prompt_ids {
                    Some(prompt_key)
                } else if first.gts != row.gts {
                    Some("gts")
                } else {
                    None
                };
                if let Some(key) = key {
                    let other = if row.file == first.file {
                        place(row)
                    } else {
                        format!("{} {}", files[row.file].display(), place(row))
                    };
                    return Err(ForeignError::Mixed {
                        file: files[first.file].clone(),
                        uid: row.uid.clone(),
                        key: key.to_string(),
                        first: place(first),
                        other,
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
        let (trajectory, step, reward) = rollout_rows(row, *sample, &policy, format, options);
        *sample += 1;
        trajectories.push(trajectory);
        steps.push(step);
        rewards.push(reward);
    }

    let producer = Producer {
        stage: "table import".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        config: serde_json::json!({
            "format": format,
            "from": files,
            "tokenizer": options.tokenizer,
            "chat_template": options.chat_template,
            "columns": options.columns,
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
        rendered,
        token_rewards: rows.iter().filter(|r| r.token_rewards.is_some()).count(),
        masks: rows
            .iter()
            .filter_map(|r| r.response_mask.as_ref())
            .fold((0, 0), |(n, holes), mask| {
                (n + 1, holes + mask.iter().filter(|&&m| !m).count())
            }),
        values: rows.iter().filter(|r| r.values.is_some()).count(),
        unmapped,
        noun: options.source.noun(),
    })
}

/// Writes `rows` as a staged table into `commit` (applied with the others).
pub(crate) fn stage<R: Row>(
    commit: &mut Commit,
    out: &Path,
    rows: &[R],
    write: WriteOptions,
    overwrite: bool,
    producer: &Producer,
) -> Result<Manifest> {
    let mut writer = TableWriter::create(out, R::TABLE, write, overwrite)?;
    writer.write_rows(rows).map_err(crate::refused_row)?;
    let (manifest, staged) = writer.finish_staged(producer, &[])?.into_parts();
    commit.absorb(staged)?;
    Ok(manifest)
}

/// The hex SHA-256 of a prompt's UTF-8 text, as Python computes it:
/// `hashlib.sha256(text.encode()).hexdigest()`.
pub fn prompt_sha256(text: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Writes the advantages table at `dir` as JSON lines keyed by `dump_row`
/// (`trajectories.source_row`, for imported trajectories), `uid`
/// (`trajectories.task_id`), `step` and `sample_index` (module doc), with
/// the rewards table's score as `rescored` when `rewards` is given; returns
/// the number of rows. A closed pipe ends the export quietly.
pub fn export_verl(
    dir: &Path,
    trajectories: &Path,
    rewards: Option<&Path>,
    tasks: Option<&Path>,
    out: &mut impl Write,
    label: &str,
) -> Result<u64> {
    let prompts: Option<HashMap<String, String>> = match tasks {
        Some(path) => Some(
            TableReader::open(path, TableName::Tasks)?
                .read_rows::<TaskRow>()?
                .into_iter()
                .map(|t| (t.task_id, prompt_sha256(&t.instruction)))
                .collect(),
        ),
        None => None,
    };
    let advantages: Vec<AdvantageRow> =
        TableReader::open(dir, TableName::Advantages)?.read_rows()?;
    let reader = TableReader::open(trajectories, TableName::Trajectories)?;
    check_source_rows(trajectories, &reader)?;
    let keys: HashMap<String, TrajectoryRow> = reader
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
        if let Some(dump_row) = trajectory.source_row {
            object.insert("dump_row".into(), dump_row.into());
        }
        if let (Some(prompts), Some(path)) = (&prompts, tasks) {
            let hash = prompts.get(&trajectory.task_id).ok_or_else(|| {
                Error::BadInput(format!(
                    "trajectory `{}`: no task `{}` in {}",
                    row.trajectory_id,
                    trajectory.task_id,
                    path.display()
                ))
            })?;
            object.insert("prompt_sha256".into(), hash.clone().into());
        }
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
    fn the_prompt_hash_is_hashlibs_sha256() {
        // hashlib.sha256("abc".encode()).hexdigest()
        assert_eq!(
            prompt_sha256("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

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

    /// Parquet cells as JSON values, for the types pyarrow's inference does
    /// not write in the integration tests: large and view strings, unsigned
    /// and narrow integers, f32, NaN, nested lists of structs with nulls;
    /// binary is refused with its type.
    #[test]
    fn parquet_cells_become_json_values() {
        use arrow::array::{
            ArrayRef, BinaryArray, Float32Array, Int8Array, LargeStringArray, ListArray,
            StringArray, StringViewArray, StructArray, UInt64Array,
        };
        use arrow::datatypes::{Field, Fields};
        use std::sync::Arc;

        assert_eq!(
            cell(&LargeStringArray::from(vec![Some("a"), None]), 0),
            Ok(serde_json::json!("a"))
        );
        assert_eq!(
            cell(&LargeStringArray::from(vec![Some("a"), None]), 1),
            Ok(Value::Null)
        );
        assert_eq!(
            cell(&StringViewArray::from(vec!["v"]), 0),
            Ok(serde_json::json!("v"))
        );
        assert_eq!(
            cell(&UInt64Array::from(vec![u64::MAX]), 0),
            Ok(serde_json::json!(u64::MAX))
        );
        assert_eq!(
            cell(&Int8Array::from(vec![-3]), 0),
            Ok(serde_json::json!(-3))
        );
        assert_eq!(
            cell(&Float32Array::from(vec![0.1f32]), 0),
            Ok(serde_json::json!(f64::from(0.1f32)))
        );
        assert_eq!(
            cell(&Float32Array::from(vec![f32::NAN]), 0),
            Ok(serde_json::json!("NaN"))
        );
        let fields = Fields::from(vec![
            Field::new("content", DataType::Utf8, true),
            Field::new("role", DataType::Utf8, false),
        ]);
        let messages = StructArray::new(
            fields.clone(),
            vec![
                Arc::new(StringArray::from(vec![Some("hi"), None])) as ArrayRef,
                Arc::new(StringArray::from(vec!["user", "assistant"])) as ArrayRef,
            ],
            None,
        );
        let list = ListArray::new(
            Arc::new(Field::new("item", DataType::Struct(fields), true)),
            arrow::buffer::OffsetBuffer::new(vec![0, 2].into()),
            Arc::new(messages),
            None,
        );
        assert_eq!(
            cell(&list, 0),
            Ok(serde_json::json!([
                {"content": "hi", "role": "user"},
                {"content": null, "role": "assistant"}
            ]))
        );
        assert_eq!(
            cell(&BinaryArray::from(vec![b"x".as_slice()]), 0),
            Err(DataType::Binary)
        );
    }
}

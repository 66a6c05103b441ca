//! What each stage is, declared once: its name, one-line purpose, the tables
//! it reads (always, or under a config condition), the checkpoints it loads,
//! what it writes, whether `--shard i/n` splits its work, and the thread pool
//! it computes on (libtorch's, rayon's or none: its thread keys and how its
//! process is set up, [`crate::threads`]).
//!
//! Every consumer reads the same declaration: a stage passes its
//! [`StageSpec`] to [`crate::stage::Stage::start`] (which refuses `--shard`
//! for a stage that cannot shard) and shows [`StageSpec::help_with_config`]
//! (the declaration, then its config keys) in `--help`;
//! the pipeline runner looks stages up in [`STAGES`] (known stages, which
//! shard, which tables a step's inputs must hold, which outputs to merge,
//! record and report) without linking the stage crates; and a consumer of
//! another stage's table reads the config it was made with through
//! [`StageSpec::config_of`], typed, instead of by JSON path.
//!
//! ```
//! use embodyflow_core::spec::{self, Sharding};
//! use embodyflow_core::schemas::TableName;
//! let update = spec::stage("update-policy").unwrap();
//! assert!(matches!(update.sharding, Sharding::Refused(_)));
//! assert!(update.writes_table(TableName::Metrics));
//! assert_eq!(spec::stage("compute-advantages").unwrap().always_reads().count(), 3);
//! ```

use std::fmt::Write as _;
use std::path::Path;

use embodyflow_schemas::TableName;
use serde::de::DeserializeOwned;

use crate::config::StageConfig;
use crate::error::{Error, Result};
use crate::manifest::Manifest;
pub use crate::threads::Threads;

/// When a stage needs something it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// On every run: a missing table is an error before any work.
    Always,
    /// Only under a config condition, said for people (`objective = sft`);
    /// whether a resolved config meets it is the stage's own answer
    /// ([`crate::config::StageConfig::reads`], `--print-config`'s `reads`).
    When(&'static str),
}

impl Need {
    /// `always` or `when …`.
    pub fn describe(self) -> String {
        match self {
            Need::Always => "always".into(),
            Need::When(condition) => format!("when {condition}"),
        }
    }
}

/// A table a stage finds among its `--input` directories.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// The table.
    pub table: TableName,
    /// When it is needed.
    pub need: Need,
}

/// The flag a checkpoint is given with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointFlag {
    /// `--policy CKPT`.
    Policy,
    /// `--teacher CKPT` (or `self`).
    Teacher,
}

impl CheckpointFlag {
    /// The flag as typed.
    pub fn flag(self) -> &'static str {
        match self {
            CheckpointFlag::Policy => "--policy",
            CheckpointFlag::Teacher => "--teacher",
        }
    }
}

/// A checkpoint a stage loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointRead {
    /// Its flag.
    pub flag: CheckpointFlag,
    /// When it is needed.
    pub need: Need,
}

/// Something a stage writes under `--out`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// A table directory named after the table.
    Table(TableName),
    /// A checkpoint directory at this path relative to `--out` (`.`: `--out`
    /// itself is the checkpoint).
    Checkpoint(&'static str),
    /// A file at this path relative to `--out` (not a table: not merged
    /// across shards; each shard keeps its own under `_shards/<i>/`).
    File(&'static str),
}

impl Output {
    /// The path relative to `--out`.
    pub fn path(self) -> &'static str {
        match self {
            Output::Table(table) => table.as_str(),
            Output::Checkpoint(path) | Output::File(path) => path,
        }
    }

    fn describe(self) -> String {
        match self {
            Output::Table(table) => format!("{table}/ (table)"),
            Output::Checkpoint(".") => "the --out directory itself (checkpoint)".into(),
            Output::Checkpoint(path) => format!("{path}/ (checkpoint)"),
            Output::File(path) => format!("{path} (file)"),
        }
    }
}

/// Whether `--shard i/n` splits a stage's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharding {
    /// Each shard processes the rows whose key column (`task_id`,
    /// `group_id`, …) it owns ([`crate::cli::ShardSpec::owns`]); the shards'
    /// tables together hold the unsharded tables' rows.
    ByKey(&'static str),
    /// `--shard` other than `0/1` is a usage error, for this reason.
    Refused(&'static str),
}

/// The declaration of one stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageSpec {
    /// The binary's name.
    pub name: &'static str,
    /// One line: what it does.
    pub purpose: &'static str,
    /// Tables it reads.
    pub reads: &'static [Read],
    /// Checkpoints it loads.
    pub checkpoints: &'static [CheckpointRead],
    /// What it writes under `--out` (besides `_summary.<stage>.md`).
    pub writes: &'static [Output],
    /// Whether it shards.
    pub sharding: Sharding,
    /// The thread pool it computes on: its thread config keys and how
    /// [`crate::stage::Stage::start`] sets its process up.
    pub threads: Threads,
}

impl StageSpec {
    /// Whether `--shard i/n` with n > 1 is accepted.
    pub fn shards(&self) -> bool {
        matches!(self.sharding, Sharding::ByKey(_))
    }

    /// The tables read on every run.
    pub fn always_reads(&self) -> impl Iterator<Item = TableName> + '_ {
        self.reads
            .iter()
            .filter(|r| r.need == Need::Always)
            .map(|r| r.table)
    }

    /// The tables it writes.
    pub fn written_tables(&self) -> impl Iterator<Item = TableName> + '_ {
        self.writes.iter().filter_map(|o| match o {
            Output::Table(table) => Some(*table),
            _ => None,
        })
    }

    /// Whether it writes table `table`.
    pub fn writes_table(&self, table: TableName) -> bool {
        self.written_tables().any(|t| t == table)
    }

    /// The checkpoint flag `flag`'s need, if the stage takes it.
    pub fn checkpoint(&self, flag: CheckpointFlag) -> Option<Need> {
        self.checkpoints
            .iter()
            .find(|c| c.flag == flag)
            .map(|c| c.need)
    }

    /// The config a table written by this stage was produced with (its
    /// manifest's `producer.config`), read into `T`: a view with the keys a
    /// consumer needs, where extra keys are ignored and a missing or
    /// mistyped one is an error naming it. A table another stage wrote is an
    /// error too. `dir` names the table in messages.
    pub fn config_of<T: DeserializeOwned>(&self, manifest: &Manifest, dir: &Path) -> Result<T> {
        let producer = &manifest.producer;
        if producer.stage != self.name {
            return Err(Error::BadInput(format!(
                "table `{}` at {} was written by `{}`, expected `{}`",
                manifest.table,
                dir.display(),
                producer.stage,
                self.name
            )));
        }
        serde_path_to_error::deserialize(&producer.config).map_err(|e| {
            Error::BadInput(format!(
                "table `{}` at {}: {} config key `{}`: {}",
                manifest.table,
                dir.display(),
                self.name,
                e.path(),
                e.inner()
            ))
        })
    }

    /// The `--help` text after the options: [`Self::help`], then each config
    /// key of `C` with its default and meaning ([`crate::config::keys_help`]).
    pub fn help_with_config<C: StageConfig>(&self) -> String {
        format!(
            "{}\n\n{}",
            self.help(),
            crate::config::keys_help_with::<C>(self.threads)
        )
    }

    /// The stage's declaration for `--help`: reads, checkpoints, writes,
    /// sharding.
    pub fn help(&self) -> String {
        let mut text = String::from("Reads (--input, tables found by name):\n");
        if self.reads.is_empty() {
            text.push_str("  nothing\n");
        }
        for read in self.reads {
            let _ = writeln!(
                text,
                "  {:<14} {}",
                read.table.as_str(),
                read.need.describe()
            );
        }
        if !self.checkpoints.is_empty() {
            text.push_str("Loads:\n");
            for c in self.checkpoints {
                let _ = writeln!(text, "  {:<14} {}", c.flag.flag(), c.need.describe());
            }
        }
        text.push_str("Writes (under --out):\n");
        for output in self.writes {
            let _ = writeln!(text, "  {}", output.describe());
        }
        let _ = writeln!(text, "  _summary.{}.md", self.name);
        match self.sharding {
            Sharding::ByKey(key) => {
                let _ = write!(
                    text,
                    "Shards: --shard i/n processes the rows whose {key} shard i owns"
                );
            }
            Sharding::Refused(why) => {
                let _ = writeln!(text, "Shards: no, --shard is refused ({why})");
            }
        }
        let _ = write!(
            text,
            "Threads: {} (EMBODYFLOW_CPUS=LIST restricts the process to those CPUs)",
            match self.threads {
                Threads::Torch => "libtorch's OpenMP pool, keys threads and omp_wait_policy",
                Threads::Rayon => "rayon's pool, key threads",
                Threads::Single => "one",
            }
        );
        text
    }
}

const fn always(table: TableName) -> Read {
    Read {
        table,
        need: Need::Always,
    }
}

const fn when(table: TableName, condition: &'static str) -> Read {
    Read {
        table,
        need: Need::When(condition),
    }
}

const POLICY: CheckpointRead = CheckpointRead {
    flag: CheckpointFlag::Policy,
    need: Need::Always,
};

/// `generate-tasks`.
pub const GENERATE_TASKS: StageSpec = StageSpec {
    name: "generate-tasks",
    purpose: "Tasks of an embedded world (household planning, tabletop manipulation; train / val / unseen) as a tasks table",
    reads: &[],
    checkpoints: &[],
    writes: &[Output::Table(TableName::Tasks)],
    sharding: Sharding::ByKey("task_id"),
    threads: Threads::Single,
};

/// `init-policy`.
pub const INIT_POLICY: StageSpec = StageSpec {
    name: "init-policy",
    purpose: "A fresh policy checkpoint for an environment",
    reads: &[when(
        TableName::Tasks,
        "kind = vla and --input is given: the tasks' world sets the VLA's shape, their instructions train its tokenizer",
    )],
    checkpoints: &[],
    writes: &[Output::Checkpoint(".")],
    sharding: Sharding::Refused("it writes one checkpoint"),
    threads: Threads::Torch,
};

/// `collect-rollouts`.
pub const COLLECT_ROLLOUTS: StageSpec = StageSpec {
    name: "collect-rollouts",
    purpose: "Sample, execute and record rollouts",
    reads: &[always(TableName::Tasks)],
    checkpoints: &[POLICY],
    writes: &[
        Output::Table(TableName::Trajectories),
        Output::Table(TableName::Steps),
    ],
    sharding: Sharding::ByKey("task_id"),
    threads: Threads::Torch,
};

/// `score-rewards`.
pub const SCORE_REWARDS: StageSpec = StageSpec {
    name: "score-rewards",
    purpose: "Trajectory rewards and rule step matches",
    reads: &[
        always(TableName::Trajectories),
        when(
            TableName::Tasks,
            "the chosen reward.fn needs them (ground-truth plans, scenes); an outcome reward reads them when given",
        ),
    ],
    checkpoints: &[],
    writes: &[Output::Table(TableName::Rewards)],
    sharding: Sharding::ByKey("group_id"),
    threads: Threads::Rayon,
};

/// `teacher-logp`.
pub const TEACHER_LOGP: StageSpec = StageSpec {
    name: "teacher-logp",
    purpose: "Teacher- and student-context log-probs of rollout responses",
    reads: &[
        always(TableName::Trajectories),
        always(TableName::Steps),
        always(TableName::Tasks),
    ],
    checkpoints: &[
        POLICY,
        CheckpointRead {
            flag: CheckpointFlag::Teacher,
            need: Need::Always,
        },
    ],
    writes: &[Output::Table(TableName::TeacherLogp)],
    sharding: Sharding::ByKey("group_id"),
    threads: Threads::Torch,
};

/// `judge-steps`.
pub const JUDGE_STEPS: StageSpec = StageSpec {
    name: "judge-steps",
    purpose: "Rule-based step gates (decision, redundancy, causality) for the prompt gate",
    reads: &[
        always(TableName::Trajectories),
        always(TableName::Rewards),
        always(TableName::Tasks),
    ],
    checkpoints: &[],
    writes: &[Output::Table(TableName::StepGates)],
    sharding: Sharding::ByKey("group_id"),
    threads: Threads::Single,
};

/// File name of compute-advantages' diagnostics.
pub const DIAGNOSTICS_FILE: &str = "diagnostics.json";

/// `compute-advantages`.
pub const COMPUTE_ADVANTAGES: StageSpec = StageSpec {
    name: "compute-advantages",
    purpose: "Per-token advantages from rollouts and rewards",
    reads: &[
        always(TableName::Trajectories),
        always(TableName::Rewards),
        always(TableName::Steps),
        when(
            TableName::TeacherLogp,
            "stepopsd.enabled or estimator = grpo_step with step.kind = forward_proxy",
        ),
        when(
            TableName::StepGates,
            "estimator = grpo_step with step.gate = prompt",
        ),
    ],
    checkpoints: &[CheckpointRead {
        flag: CheckpointFlag::Policy,
        need: Need::When("grpo_step or StepOPSD without step.tokenizer (its tokenizer)"),
    }],
    writes: &[
        Output::Table(TableName::Advantages),
        Output::File(DIAGNOSTICS_FILE),
    ],
    sharding: Sharding::ByKey("group_id"),
    threads: Threads::Rayon,
};

/// `update-policy`.
pub const UPDATE_POLICY: StageSpec = StageSpec {
    name: "update-policy",
    purpose: "SFT and PPO/GRPO updates of a policy checkpoint",
    reads: &[
        when(TableName::Tasks, "objective = sft"),
        when(TableName::Trajectories, "objective = ppo or lapo"),
        when(TableName::Steps, "objective = ppo or lapo"),
        when(TableName::Advantages, "objective = ppo or lapo"),
    ],
    checkpoints: &[POLICY],
    writes: &[
        Output::Table(TableName::Metrics),
        Output::Checkpoint("policy"),
    ],
    sharding: Sharding::Refused("it trains one policy on every row of its inputs"),
    threads: Threads::Torch,
};

/// `evaluate`.
pub const EVALUATE: StageSpec = StageSpec {
    name: "evaluate",
    purpose: "Greedy success rates by split and task type",
    reads: &[always(TableName::Tasks)],
    checkpoints: &[POLICY],
    writes: &[Output::Table(TableName::Eval)],
    sharding: Sharding::ByKey("task_id"),
    threads: Threads::Torch,
};

/// Every stage binary, in pipeline order.
pub const STAGES: &[&StageSpec] = &[
    &GENERATE_TASKS,
    &INIT_POLICY,
    &COLLECT_ROLLOUTS,
    &SCORE_REWARDS,
    &TEACHER_LOGP,
    &JUDGE_STEPS,
    &COMPUTE_ADVANTAGES,
    &UPDATE_POLICY,
    &EVALUATE,
];

/// The stage named `name`.
pub fn stage(name: &str) -> Option<&'static StageSpec> {
    STAGES.iter().copied().find(|s| s.name == name)
}

/// The names of every stage, comma-separated (for messages).
pub fn names() -> String {
    STAGES.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
}

/// Every stage of [`STAGES`] as one Markdown table row: its name, purpose,
/// the tables it reads (always; `(if configured)` for those read under a
/// config condition), the checkpoints it loads, what it writes under
/// `--out` and how `--shard` splits it. README.md's stage table is this
/// text (`pipeline stages --markdown` prints it; a test compares the two).
///
/// ```
/// let table = embodyflow_core::spec::markdown_table();
/// assert!(table.starts_with("| stage | what it does |"));
/// assert!(table.contains("| `update-policy` |"));
/// assert_eq!(table.lines().count(), 2 + embodyflow_core::spec::STAGES.len());
/// ```
pub fn markdown_table() -> String {
    let code = |text: &str| format!("`{text}`");
    let needed = |name: &str, need: Need| match need {
        Need::Always => code(name),
        Need::When(_) => format!("{} (if configured)", code(name)),
    };
    let list = |items: Vec<String>| {
        if items.is_empty() {
            "-".to_string()
        } else {
            items.join(", ")
        }
    };
    let mut table = String::from(
        "| stage | what it does | reads (tables) | loads | writes (under `--out`) | `--shard i/n` |\n\
         |---|---|---|---|---|---|\n",
    );
    for spec in STAGES {
        let reads = spec
            .reads
            .iter()
            .map(|r| needed(r.table.as_str(), r.need))
            .collect();
        let loads = spec
            .checkpoints
            .iter()
            .map(|c| needed(c.flag.flag(), c.need))
            .collect();
        let writes = spec
            .writes
            .iter()
            .map(|o| match o {
                Output::Table(table) => format!("{} table", code(table.as_str())),
                Output::Checkpoint(".") => "checkpoint (`--out` itself)".to_string(),
                Output::Checkpoint(path) => format!("{} checkpoint", code(path)),
                Output::File(path) => code(path),
            })
            .collect();
        let shards = match spec.sharding {
            Sharding::ByKey(key) => format!("by {}", code(key)),
            Sharding::Refused(why) => format!("no: {why}"),
        };
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} | {} | {} |",
            code(spec.name),
            spec.purpose.replace('|', "\\|"),
            list(reads),
            list(loads),
            list(writes),
            shards
        );
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_stage_writes_something() {
        let mut names: Vec<&str> = STAGES.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), STAGES.len());
        for spec in STAGES {
            assert!(!spec.writes.is_empty(), "{}", spec.name);
            let mut paths: Vec<&str> = spec.writes.iter().map(|o| o.path()).collect();
            paths.sort_unstable();
            paths.dedup();
            assert_eq!(paths.len(), spec.writes.len(), "{}", spec.name);
        }
    }

    #[test]
    fn config_of_reads_a_typed_view_and_names_a_missing_key() {
        #[derive(serde::Deserialize, Debug)]
        struct View {
            step: Step,
        }
        #[derive(serde::Deserialize, Debug)]
        struct Step {
            omega: f32,
        }
        let manifest = |stage: &str, config: serde_json::Value| -> Manifest {
            serde_json::from_value(serde_json::json!({
                "format": "embodyflow.table/1", "table": "advantages", "schema_version": 1,
                "num_rows": 0, "content_hash": "", "shards": [], "inputs": [],
                "producer": {"stage": stage, "version": "t", "config": config, "seed": 0, "shard": "0/1"},
            }))
            .unwrap()
        };
        let dir = Path::new("runs/adv/advantages");
        let good = manifest(
            "compute-advantages",
            serde_json::json!({"estimator": "grpo", "step": {"omega": 0.5, "kind": "rule"}}),
        );
        let view: View = COMPUTE_ADVANTAGES.config_of(&good, dir).unwrap();
        assert_eq!(view.step.omega, 0.5);
        let missing = manifest(
            "compute-advantages",
            serde_json::json!({"step": {"kind": "rule"}}),
        );
        let err = COMPUTE_ADVANTAGES
            .config_of::<View>(&missing, dir)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("runs/adv/advantages") && err.contains("`step`") && err.contains("omega"),
            "{err}"
        );
        let other = manifest("score-rewards", serde_json::json!({}));
        let err = COMPUTE_ADVANTAGES
            .config_of::<View>(&other, dir)
            .unwrap_err()
            .to_string();
        assert!(err.contains("written by `score-rewards`"), "{err}");
    }

    #[test]
    fn markdown_table_has_one_row_per_stage_with_its_declaration() {
        let table = markdown_table();
        let rows: Vec<&str> = table.lines().skip(2).collect();
        assert_eq!(rows.len(), STAGES.len());
        for (row, spec) in rows.iter().zip(STAGES) {
            assert!(row.starts_with(&format!("| `{}` | ", spec.name)), "{row}");
            assert_eq!(row.matches(" | ").count(), 5, "{row}");
        }
        assert!(
            table.contains(
                "| `compute-advantages` | Per-token advantages from rollouts and rewards | \
                 `trajectories`, `rewards`, `steps`, `teacher_logp` (if configured), \
                 `step_gates` (if configured) | `--policy` (if configured) | \
                 `advantages` table, `diagnostics.json` | by `group_id` |"
            ),
            "{table}"
        );
        assert!(
            table.contains("| checkpoint (`--out` itself) | no: it writes one checkpoint |"),
            "{table}"
        );
    }

    #[test]
    fn help_lists_reads_writes_and_sharding() {
        let help = UPDATE_POLICY.help();
        assert!(
            help.contains("tasks          when objective = sft"),
            "{help}"
        );
        assert!(help.contains("metrics/ (table)"), "{help}");
        assert!(help.contains("policy/ (checkpoint)"), "{help}");
        assert!(help.contains("--shard is refused"), "{help}");
        let help = GENERATE_TASKS.help();
        assert!(
            help.contains("Reads (--input, tables found by name):\n  nothing"),
            "{help}"
        );
        assert!(help.contains("whose task_id shard i owns"), "{help}");
    }
}

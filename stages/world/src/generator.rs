//! How a world says what `generate-tasks` writes for it: the
//! [`Generator`] interface, what the stage asks of the world
//! ([`TaskRequest`]: the stage's keys and every world's own keys as
//! resolved) and where the world's rows go ([`TaskSink`]).
//!
//! Every world of the registry, one-shot and closed-loop alike, declares
//! its `env` name, its own keys (a [`Settings`] section at the top of the
//! stage's config: its type's fields with their doc comments, defaults and
//! value checks, which see the whole request, e.g. to refuse the key for
//! another `env`), whether it writes LIBERO's initial-states protocol
//! ([`Generator::initial_states`]), and how it writes a shard's tasks
//! ([`Generator::write`]). The stage (`generate-tasks`) iterates the
//! registry for the config, `--help` and the checks and runs the chosen
//! world's generator; it names no world.
//!
//! A world's generator, in outline (the test-only `toy` world is a whole
//! one):
//!
//! ```text
//! #[derive(Serialize, Deserialize, Default, ConfigKeys)]
//! #[serde(default, deny_unknown_fields)]
//! struct CorridorKeys {
//!     /// Cells of the shortest corridor (env = corridor).
//!     corridor_min: u32,
//! }
//! impl SectionConfig<TaskRequest> for CorridorKeys { /* its value checks */ }
//! impl Generator for Corridor {
//!     fn name(&self) -> &'static str { "corridor" }
//!     fn settings(&self) -> Option<Settings> { Some(Settings::of::<CorridorKeys>(ROOT)) }
//!     fn write(&self, request: &TaskRequest, shard: ShardSpec, seed: u64, sink: &mut TaskSink) -> ... {
//!         let keys: CorridorKeys = request.keys()?;
//!         // sink.push(row) for each task the shard owns, then its summary lines
//!     }
//! }
//! ```

use std::collections::BTreeMap;

use embodyflow_core::Result;
use embodyflow_core::checks::either;
use embodyflow_core::cli::ShardSpec;
use embodyflow_core::dataset::TableWriter;
use embodyflow_core::schemas::{Split, TaskRow};
use embodyflow_core::section::{self, Section, SectionConfig};
use embodyflow_core::stage::Summary;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::world::WorldsError;

/// How `generate-tasks` writes a world's tasks (`env = NAME`): one
/// `pub static` value per world, listed once in the registry.
pub trait Generator: Sync {
    /// `env = NAME`.
    fn name(&self) -> &'static str;

    /// Its own keys (`image_size`, `suite`, `gym.*`): a section of the
    /// config's top level ([`ROOT`]), whose type's doc comments are the
    /// keys' meanings and whose checks see the whole request (a world's key
    /// set for another world is refused there). `None`: no keys of its own.
    fn settings(&self) -> Option<Settings> {
        None
    }

    /// Whether it writes `protocol = initial-states` tables (`count` tasks
    /// at `states` initial states each).
    fn initial_states(&self) -> bool {
        false
    }

    /// Writes the tasks of `request` that `shard` owns into `sink` (their
    /// seeds drawn from `seed`) and adds its lines to the sink's summary.
    /// Its own keys are [`TaskRequest::keys`].
    fn write(
        &self,
        request: &TaskRequest,
        shard: ShardSpec,
        seed: u64,
        sink: &mut TaskSink,
    ) -> std::result::Result<(), WorldsError>;
}

/// A world's keys in the stage's config ([`Generator::settings`]).
pub type Settings = Section<TaskRequest>;

/// The table of a world's keys: the config's top level (its keys are
/// `image_size`, `suite`, and `gym.*` for a type whose field is `gym`).
pub const ROOT: &str = "";

/// LIBERO's initial states per task (its `init_states` files): the
/// default of `states`.
pub const LIBERO_STATES: u32 = 50;

/// What a table holds: `count` tasks in layouts of their split, or
/// LIBERO's protocol.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// `count` tasks, each in a layout of its own split.
    #[default]
    Layouts,
    /// `count` tasks at `states` initial states each (LIBERO's protocol).
    InitialStates,
}

/// What `generate-tasks` asks of a world: the stage's keys, every world's
/// own keys as resolved, and the registered worlds' names (for messages
/// naming them).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRequest {
    /// The world whose tasks are written.
    pub env: String,
    /// The split.
    pub split: Split,
    /// Tasks to write (at least 1).
    pub count: usize,
    /// Layouts or LIBERO's initial states.
    pub protocol: Protocol,
    /// Initial states per task under `protocol = initial-states`.
    pub states: u32,
    /// Every world's own keys as resolved (read typed by
    /// [`TaskRequest::keys`]).
    pub keys: Map<String, Value>,
    /// Every registered world's name, in the registry's order.
    pub worlds: Vec<&'static str>,
}

impl TaskRequest {
    /// A world's keys, typed (its [`Generator::settings`] type).
    pub fn keys<T: SectionConfig<TaskRequest>>(&self) -> Result<T> {
        section::read::<TaskRequest, T>(ROOT, &self.tree())
    }

    /// Whether the chosen world is `name`.
    pub fn is(&self, name: &str) -> bool {
        self.env == name
    }

    /// Whether the table holds tasks at initial states.
    pub fn initial_states(&self) -> bool {
        self.protocol == Protocol::InitialStates
    }

    /// The registered worlds but `name`, as `a, b or c`.
    pub fn others(&self, name: &str) -> String {
        let names: Vec<&str> = self.worlds.iter().copied().filter(|w| *w != name).collect();
        either(&names)
    }

    /// The worlds' keys as the sections read them: the top level as table
    /// [`ROOT`].
    pub fn tree(&self) -> Value {
        Value::Object(Map::from_iter([(
            ROOT.to_string(),
            Value::Object(self.keys.clone()),
        )]))
    }
}

/// Where a world's tasks go: the table writer, the rows waiting for it,
/// and the summary the world adds its lines to.
pub struct TaskSink {
    writer: TableWriter,
    rows: Vec<TaskRow>,
    /// The stage's summary (shard and seed, then the world's lines).
    pub summary: Summary,
}

impl TaskSink {
    /// Rows for `writer`, lines for `summary`.
    pub fn new(writer: TableWriter, summary: Summary) -> TaskSink {
        TaskSink {
            writer,
            rows: Vec::new(),
            summary,
        }
    }

    /// Adds `row`; the waiting rows are written once 4096 wait.
    pub fn push(&mut self, row: TaskRow) -> Result<()> {
        self.rows.push(row);
        if self.rows.len() >= 4096 {
            self.writer.write_rows(&self.rows)?;
            self.rows.clear();
        }
        Ok(())
    }

    /// Adds each name's task count to the summary, in name order.
    pub fn add_counts<K: Into<String>>(&mut self, counts: BTreeMap<K, usize>) {
        for (name, n) in counts {
            self.summary.add(name, n);
        }
    }

    /// Writes the rows still waiting; the writer and the summary, for the
    /// stage to finish and commit.
    pub fn finish(mut self) -> Result<(TableWriter, Summary)> {
        self.writer.write_rows(&self.rows)?;
        Ok((self.writer, self.summary))
    }
}

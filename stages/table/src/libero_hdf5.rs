//! LIBERO's demonstrations: `table import --format libero-hdf5` turns the
//! HDF5 demonstration files (one per task, `data/demo_<n>`) into the tasks,
//! trajectories and steps rows the bridge's LIBERO adapter has
//! `collect-rollouts` write for the same task, so update-policy's SFT
//! trains on them as on collected episodes; `table replay` runs a
//! demonstration's actions from its initial state through the adapter, as
//! LIBERO validates its demos.
//!
//! The files are read with `h5py` in the bridge's Python (a worker of
//! `embodyflow_gym`, requests `demo_files`, `demo_read`, `demo_replay`,
//! `stages/gym/python/embodyflow_gym/demos.py`): h5py is in `.venv` with
//! LIBERO (scripts/setup), the replay needs that Python anyway, and the
//! `hdf5` crate would need the system's libhdf5 C library and lags its
//! releases. The layouts (LIBERO's own files and OpenVLA's "modified_libero"
//! regenerations), how each observation is paired with its action, the image
//! turn and the task lookup are described there.
//!
//! Rows, for a file of task `<suite>/<task>` (env id) and each demo
//! `demo_<n>`, with `K = --chunk-len` actions per decision:
//!
//! | column | value |
//! |---|---|
//! | `tasks.task_id` | `gym-libero/<env id>@<split>/demos` (task key `gym-libero/<env id>`, as generate-tasks' rows of the task) |
//! | `tasks` row | `env = gym:libero`, `suite` = `task_type` = the env id, the adapter's spec (`resolution` = the file's), `seed` 0, `instruction` = the task's language, as generate-tasks writes them |
//! | `trajectory_id` | `it0/<task_id>/d<n>/s0` (group `it0/<task_id>/d<n>`: the demo's number is its draw) |
//! | `trajectories.policy` | `imported:libero-hdf5:<file name>` (update-policy's PPO refuses it: no behaviour log-probs) |
//! | `num_steps`, `env_steps` | decisions, actions |
//! | `complete` | the demo's last `dones` (true without `dones`) |
//! | `steps.prompt_ids` | the instruction through `--tokenizer` (the policy's, as collect-rollouts tokenises it) |
//! | `steps.response_ids` | the chunk's actions through the adapter's bins (256 over [-1, 1], OpenVLA's), `K x 7` (fewer on the last decision) |
//! | `steps.old_logprobs` | 0.0 per token (a demonstration has no behaviour log-probs) |
//! | `steps.observation` | EFOB format 2: `agentview` and `wrist` joined along the channels, turned as the adapter turns them, 8 proprio values |
//!
//! Bad input (exit 2, nothing written: every file is checked before any
//! demo is read and the three tables are committed together): a missing
//! file, a file h5py cannot open, no `data` group, a demo without `actions`
//! or an expected observation key, lengths or shapes that disagree, files of
//! different resolutions or two files of one task, a task LIBERO lacks, a
//! tokenizer that does not load, h5py or LIBERO missing, each named with the
//! file and the group or key.
//!
//! A file is untrusted input: every size it declares is bounded before
//! anything of that size is read or allocated, by the named limits below
//! (the worker's, `demos.py`, holds the same values): [`MAX_DEMOS`] groups
//! in `data`, [`MAX_ACTIONS`] actions per demo, images of at most
//! [`MAX_RESOLUTION`] px, [`MAX_STATE_DIM`] MuJoCo state values,
//! [`MAX_TEXT_BYTES`] per text attribute (one string), actions of exactly
//! [`ACTION_DIM`] numbers, and one demo's decisions at `--chunk-len` within
//! [`MAX_REPLY_BYTES`] of observations (checked for every demo before any is
//! read). A file beyond a limit is bad input naming the file, the dataset
//! and the value (`F.hdf5: data/demo_0/actions has 1000000000000 rows, more
//! than 10000 (MAX_ACTIONS)`), and so is a file h5py or the HDF5 library
//! cannot read (truncated, corrupted), naming what was being read; an
//! HDF5 dataset may declare any shape while storing nothing, so a small
//! file can declare a terabyte. What the worker reports is checked against
//! the same limits here.
//!
//! ```text
//! table import --format libero-hdf5 --from libero_spatial/*_demo.hdf5 --tokenizer runs/vla \
//!     --chunk-len 8 --out runs/libero-demos
//! table replay libero_spatial/pick_up_the_black_bowl_between_the_plate_and_the_ramekin_and_place_it_on_the_plate_demo.hdf5 \
//!     --demo demo_0 --steps 20
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use embodyflow_core::commit::Commit;
use embodyflow_core::dataset::{TableWriter, WriteOptions};
use embodyflow_core::manifest::Producer;
use embodyflow_core::observation::{self, ObservationShape};
use embodyflow_core::schemas::{StepRow, TableName, TaskRow, TrajectoryRow};
use embodyflow_core::{Error, Result};
use embodyflow_gym::protocol::{Frame, split_body};
use embodyflow_gym::worker::{Fault, Reply, Worker};
use embodyflow_gym::{ActionSpace, GymTaskSpec};
use serde::Deserialize;
use serde_json::{Value, json};

/// The format's name (`--format libero-hdf5`, the policy column).
pub const FORMAT: &str = "libero-hdf5";

/// The adapter the rows belong to.
const ADAPTER: &str = "libero";

/// The images of every observation, in channel order (the adapter's).
pub const IMAGES: [&str; 2] = ["agentview", "wrist"];

/// Proprio values per observation (end-effector position, axis-angle,
/// two finger positions).
pub const PROPRIO: usize = 8;

/// LIBERO's action dimensions.
pub const ACTION_DIM: usize = 7;

/// The most `demo_<n>` groups a file's `data` may hold (LIBERO's hold 50).
pub const MAX_DEMOS: usize = 10_000;

/// The most actions one demonstration may hold (LIBERO's hold a few
/// hundred).
pub const MAX_ACTIONS: usize = 10_000;

/// The largest image side in pixels (LIBERO's files are 128 px, OpenVLA's
/// regenerations 256 px).
pub const MAX_RESOLUTION: usize = 1024;

/// The most MuJoCo state values per step (`states`' width; LIBERO's are
/// about a hundred).
pub const MAX_STATE_DIM: usize = 4096;

/// The longest text attribute (`problem_info`, `bddl_file_name`,
/// `macros_image_convention`), in bytes.
pub const MAX_TEXT_BYTES: usize = 1 << 20;

/// The most observation bytes of one demo's decisions (or of a replay's
/// steps): what one reply of the worker carries, within the protocol's
/// 1 GiB frame.
pub const MAX_REPLY_BYTES: usize = 512 << 20;

/// How long the worker may go without a frame (it sends one per file
/// checked, per demo read and per replayed step).
const PATIENCE: Duration = Duration::from_secs(600);

/// What `table import --format libero-hdf5` reads and how it cuts decisions.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// The demonstration files, in order.
    pub from: Vec<PathBuf>,
    /// `tokenizer.json` or a directory holding one (the policy's).
    pub tokenizer: PathBuf,
    /// Actions per decision (`K`, the policy's `chunk_len`).
    pub chunk_len: usize,
    /// The split of the tasks rows.
    pub split: String,
    /// The bridge's Python (with h5py and LIBERO).
    pub python: PathBuf,
}

/// What an import wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportSummary {
    /// Files (tasks).
    pub files: usize,
    /// Demonstrations (trajectories).
    pub demos: usize,
    /// Decisions (steps rows).
    pub decisions: usize,
    /// Actions in the decisions.
    pub actions: usize,
    /// Demonstrations whose last `dones` is 0.
    pub incomplete: usize,
    /// Each file's layout (`libero` or `openvla`), in order.
    pub layouts: Vec<String>,
    /// The observations' side in pixels.
    pub resolution: usize,
}

impl ImportSummary {
    /// Counts a demo by its `trajectories` row.
    fn add(&mut self, trajectory: &TrajectoryRow) {
        self.demos += 1;
        self.decisions += trajectory.num_steps as usize;
        self.actions += trajectory.env_steps as usize;
        self.incomplete += usize::from(!trajectory.complete);
    }
}

/// One demonstration file as the worker checked it.
#[derive(Debug, Clone, Deserialize)]
struct FileInfo {
    path: PathBuf,
    layout: String,
    env_id: String,
    instruction: String,
    max_steps: u32,
    resolution: usize,
    demos: Vec<DemoInfo>,
}

#[derive(Debug, Clone, Deserialize)]
struct DemoInfo {
    name: String,
    complete: bool,
}

#[derive(Deserialize)]
struct Decision {
    obs_len: usize,
    actions: Vec<Vec<f32>>,
}

#[derive(Deserialize)]
struct DemoReply {
    decisions: Vec<Decision>,
}

/// The worker that reads the files.
struct Reader {
    worker: Worker,
    python: PathBuf,
}

impl Reader {
    fn start(python: &Path) -> Result<Reader> {
        let worker = Worker::spawn(python, 0).map_err(|e| {
            Error::BadInput(format!(
                "cannot start the bridge's Python `{}`: {e}; run scripts/setup (it creates .venv with h5py and LIBERO) or set {}",
                python.display(),
                embodyflow_gym::PYTHON_VAR
            ))
        })?;
        Ok(Reader {
            worker,
            python: python.to_path_buf(),
        })
    }

    /// The worker's reply to `request` (about `file`): a refusal for bad
    /// input is bad input, anything else that goes wrong a failure. A
    /// worker that crashes is started again and asked once more: a file
    /// whose reading crashes a fresh worker too (the HDF5 library dying on a
    /// cut or corrupt file) is bad input naming it, any other crash a
    /// failure.
    fn ask(&mut self, request: &Value, file: &Path) -> Result<Frame> {
        match self.exchange(request, file) {
            Err(Exchanged::Crashed(first)) => {
                *self = Reader::start(&self.python)?;
                match self.exchange(request, file) {
                    Err(Exchanged::Crashed(again)) => Err(Error::BadInput(format!(
                        "{}: reading it crashed the bridge's Python twice ({first}, then {again}): the HDF5 library cannot read the file (cut, corrupt, or not a demonstration file LIBERO or OpenVLA writes)",
                        file.display()
                    ))),
                    other => other.map_err(|e| e.into_error(file)),
                }
            }
            other => other.map_err(|e| e.into_error(file)),
        }
    }

    /// One request and its reply, a crash told apart.
    fn exchange(&mut self, request: &Value, file: &Path) -> std::result::Result<Frame, Exchanged> {
        self.worker.send(request);
        let failure = |what: String| Error::Io {
            path: file.to_path_buf(),
            source: std::io::Error::other(format!(
                "the bridge's Python `{}` {what} (its traceback, if any, is on stderr)",
                self.python.display()
            )),
        };
        match self.worker.receive_patiently(PATIENCE, PATIENCE) {
            Ok(Reply::Done(frame)) => Ok(frame),
            Ok(Reply::Refused {
                bad_input: true,
                message,
            }) => Err(Exchanged::Error(Error::BadInput(message))),
            Ok(Reply::Refused { message, .. }) => {
                Err(Exchanged::Error(failure(format!("failed: {message}"))))
            }
            Err(Fault::Crashed(status)) => Err(Exchanged::Crashed(status)),
            Err(fault) => Err(Exchanged::Error(failure(format!("{fault}")))),
        }
    }

    /// Every file checked (module doc); with `chunk_len`, every demo's
    /// decisions within one reply ([`MAX_REPLY_BYTES`]).
    fn files(&mut self, paths: &[PathBuf], chunk_len: Option<usize>) -> Result<Vec<FileInfo>> {
        let mut request = json!({"op": "demo_files", "paths": paths});
        if let Some(k) = chunk_len {
            request["k"] = k.into();
        }
        let frame = self.ask(&request, &paths[0])?;
        let files: Vec<FileInfo> = header_field(&frame, "files", &paths[0])?;
        if files.len() != paths.len() {
            return Err(malformed(&paths[0], "a reply for another number of files"));
        }
        for (file, path) in files.iter().zip(paths) {
            within_limits(file, path)?;
        }
        Ok(files)
    }
}

/// How a request to the reader's worker went wrong.
enum Exchanged {
    /// The worker died (its exit status).
    Crashed(String),
    /// Anything else, as the stage's error.
    Error(Error),
}

impl Exchanged {
    /// The stage's error for a request about `file`.
    fn into_error(self, file: &Path) -> Error {
        match self {
            Exchanged::Crashed(status) => Error::Io {
                path: file.to_path_buf(),
                source: std::io::Error::other(format!("the bridge's Python crashed ({status})")),
            },
            Exchanged::Error(error) => error,
        }
    }
}

/// Checks what the worker reported of a file against the limits it
/// enforces (module doc): beyond them the reply is malformed.
fn within_limits(file: &FileInfo, path: &Path) -> Result<()> {
    if file.demos.is_empty() || file.demos.len() > MAX_DEMOS {
        return Err(malformed(
            path,
            &format!("{} demos, expected 1 to {MAX_DEMOS}", file.demos.len()),
        ));
    }
    if !(1..=MAX_RESOLUTION).contains(&file.resolution) {
        return Err(malformed(
            path,
            &format!(
                "images of {} px, expected 1 to {MAX_RESOLUTION}",
                file.resolution
            ),
        ));
    }
    if file.instruction.len() > MAX_TEXT_BYTES {
        return Err(malformed(
            path,
            &format!("an instruction of {} bytes", file.instruction.len()),
        ));
    }
    Ok(())
}

fn header_field<T: for<'de> Deserialize<'de>>(frame: &Frame, key: &str, file: &Path) -> Result<T> {
    let value = frame.header.get(key).cloned().unwrap_or(Value::Null);
    serde_json::from_value(value).map_err(|e| malformed(file, &format!("`{key}`: {e}")))
}

/// A reply's header as `T` and its body cut into the observations whose
/// lengths `lengths` reads from the header.
fn observations<'f, T: for<'de> Deserialize<'de>>(
    frame: &'f Frame,
    file: &Path,
    lengths: impl FnOnce(&T) -> Vec<usize>,
) -> Result<(T, Vec<&'f [u8]>)> {
    let reply: T = serde_json::from_value(Value::Object(frame.header.clone()))
        .map_err(|e| malformed(file, &e.to_string()))?;
    let bodies = split_body(&frame.body, &lengths(&reply))
        .ok_or_else(|| malformed(file, "observation lengths that do not add up"))?;
    Ok((reply, bodies))
}

fn malformed(file: &Path, what: &str) -> Error {
    Error::Io {
        path: file.to_path_buf(),
        source: std::io::Error::other(format!(
            "the bridge's worker sent a malformed reply ({what})"
        )),
    }
}

/// The observation shape of a file's rows.
fn shape(resolution: usize) -> ObservationShape {
    ObservationShape {
        height: resolution,
        width: resolution,
        channels: 3 * IMAGES.len(),
        proprio: PROPRIO,
    }
}

/// LIBERO's action space, as the adapter announces it.
fn action_space() -> ActionSpace {
    ActionSpace::Box {
        low: vec![-1.0; ACTION_DIM],
        high: vec![1.0; ACTION_DIM],
    }
}

/// The task id of a file's demos.
pub fn task_id(env_id: &str, split: &str) -> String {
    format!("gym-{ADAPTER}/{env_id}@{split}/demos")
}

/// Imports the files into `out/{tasks,trajectories,steps}` (module doc),
/// streaming demo by demo; nothing is written on bad input.
pub fn import(
    options: &ImportOptions,
    out: &Path,
    write: WriteOptions,
    overwrite: bool,
) -> Result<ImportSummary> {
    check_options(options)?;
    let tokenizer = crate::foreign::load_tokenizer(&options.tokenizer)?;
    let mut reader = Reader::start(&options.python)?;
    let files = reader.files(&options.from, Some(options.chunk_len))?;
    one_file_per_task(&files)?;
    let (space, shape) = (action_space(), shape(files[0].resolution));
    let bins = space.bins();
    let to_tokens = |flat: &[f32]| space.tokens(&bins, flat).map_err(|e| e.to_string());
    let mut tasks = Vec::with_capacity(files.len());
    let mut trajectories = Vec::new();
    let mut steps = TableWriter::create(out, TableName::Steps, write, overwrite)?;
    let mut summary = ImportSummary {
        files: files.len(),
        demos: 0,
        decisions: 0,
        actions: 0,
        incomplete: 0,
        layouts: files.iter().map(|f| f.layout.clone()).collect(),
        resolution: files[0].resolution,
    };
    for (task_id, file, path) in key_order(&files, options) {
        let task = task_row(file, &task_id, &options.split)?;
        let demos = FileDemos {
            path,
            task_id: &task_id,
            prompt: prompt_ids(&tokenizer, file, path, options)?,
            chunk_len: options.chunk_len,
            shape: &shape,
        };
        let mut names: Vec<&DemoInfo> = file.demos.iter().collect();
        names.sort_by(|a, b| a.name.cmp(&b.name));
        for demo in names {
            let (trajectory, rows) = demos.read(&mut reader, demo, &to_tokens)?;
            steps.write_rows(&rows)?;
            summary.add(&trajectory);
            trajectories.push(trajectory);
        }
        tasks.push(task);
    }
    let producer = producer(options, bins.n_bins());
    let mut commit = Commit::new(out);
    crate::foreign::stage(&mut commit, out, &tasks, write, overwrite, &producer)?;
    crate::foreign::stage(&mut commit, out, &trajectories, write, overwrite, &producer)?;
    let (_, staged) = steps.finish_staged(&producer, &[])?.into_parts();
    commit.absorb(staged)?;
    commit.apply()?;
    Ok(summary)
}

/// Refuses an import without files or decisions, or of a file that is not
/// there, before the worker starts.
fn check_options(options: &ImportOptions) -> Result<()> {
    if options.from.is_empty() || options.chunk_len == 0 {
        return Err(Error::Usage(
            "table import --format libero-hdf5: give --from FILE... and --chunk-len of at least 1"
                .into(),
        ));
    }
    if let Some(missing) = options.from.iter().find(|p| !p.is_file()) {
        return Err(Error::BadInput(format!(
            "{}: no such file",
            missing.display()
        )));
    }
    Ok(())
}

/// Refuses two files of one task (their task ids would be one).
fn one_file_per_task(files: &[FileInfo]) -> Result<()> {
    for (i, file) in files.iter().enumerate() {
        if let Some(other) = files[..i].iter().find(|f| f.env_id == file.env_id) {
            return Err(Error::BadInput(format!(
                "{} and {} are both demonstrations of {}: import them into separate tables",
                other.path.display(),
                file.path.display(),
                file.env_id
            )));
        }
    }
    Ok(())
}

/// Each file with its task id and path, in the steps table's key order
/// (trajectory ids as text: `d10` before `d2`), so its writer never
/// re-sorts spilled rows.
fn key_order<'a>(
    files: &'a [FileInfo],
    options: &'a ImportOptions,
) -> Vec<(String, &'a FileInfo, &'a PathBuf)> {
    let mut order: Vec<(String, &FileInfo, &PathBuf)> = files
        .iter()
        .zip(&options.from)
        .map(|(file, path)| (task_id(&file.env_id, &options.split), file, path))
        .collect();
    order.sort_by(|a, b| a.0.cmp(&b.0));
    order
}

/// A file's `tasks` row, as generate-tasks writes the task (module doc).
fn task_row(file: &FileInfo, task_id: &str, split: &str) -> Result<TaskRow> {
    let mut spec = GymTaskSpec::new(ADAPTER, &file.env_id, 0, file.max_steps);
    spec.kwargs = json!({"resolution": file.resolution});
    let mut task = embodyflow_gym::task_row(task_id, split, &spec)
        .map_err(|e| Error::BadInput(e.to_string()))?;
    task.task_type = Some(file.env_id.clone());
    task.instruction.clone_from(&file.instruction);
    Ok(task)
}

/// The file's instruction through the policy's tokenizer.
fn prompt_ids(
    tokenizer: &tokenizers::Tokenizer,
    file: &FileInfo,
    path: &Path,
    options: &ImportOptions,
) -> Result<Vec<i32>> {
    let encoding = tokenizer
        .encode(file.instruction.as_str(), false)
        .map_err(|e| {
            Error::BadInput(format!(
                "{}: tokenising the instruction `{}` with {}: {e}",
                path.display(),
                file.instruction,
                options.tokenizer.display()
            ))
        })?;
    Ok(encoding.get_ids().iter().map(|&id| id as i32).collect())
}

/// One file's demos to read into rows: its task, the instruction's token
/// ids, decisions of up to `chunk_len` actions, observations of `shape`.
struct FileDemos<'a> {
    path: &'a Path,
    task_id: &'a str,
    prompt: Vec<i32>,
    chunk_len: usize,
    shape: &'a ObservationShape,
}

impl FileDemos<'_> {
    /// Demo `demo`'s `trajectories` row and `steps` rows (module doc).
    fn read(
        &self,
        reader: &mut Reader,
        demo: &DemoInfo,
        to_tokens: &dyn Fn(&[f32]) -> std::result::Result<Vec<u32>, String>,
    ) -> Result<(TrajectoryRow, Vec<StepRow>)> {
        let number = demo.name.trim_start_matches("demo_");
        let group_id = format!("it0/{}/d{number}", self.task_id);
        let trajectory_id = format!("{group_id}/s0");
        let (rows, actions) = self.steps(reader, demo, &trajectory_id, to_tokens)?;
        let trajectory = TrajectoryRow {
            source_row: None,
            trajectory_id,
            group_id,
            task_id: self.task_id.to_string(),
            sample_index: 0,
            iteration: 0,
            policy: format!(
                "{}{FORMAT}:{}",
                embodyflow_core::IMPORTED_POLICY_PREFIX,
                self.path.file_name().unwrap_or_default().to_string_lossy()
            ),
            temperature: 1.0,
            num_steps: rows.len() as i32,
            env_steps: actions as i32,
            complete: demo.complete,
            response_text: None,
            seed: 0,
            ever_grasped: None,
            failure_reason: None,
            infra_fault: Some(false),
        };
        Ok((trajectory, rows))
    }

    /// The demo's `steps` rows under `trajectory_id` (each decision's
    /// observation checked against the shape, its actions against the
    /// chunk and LIBERO's dimensions, turned into tokens by `to_tokens`)
    /// and its number of actions.
    fn steps(
        &self,
        reader: &mut Reader,
        demo: &DemoInfo,
        trajectory_id: &str,
        to_tokens: &dyn Fn(&[f32]) -> std::result::Result<Vec<u32>, String>,
    ) -> Result<(Vec<StepRow>, usize)> {
        let path = self.path;
        let request = json!({
            "op": "demo_read", "path": path, "demo": demo.name, "k": self.chunk_len,
        });
        let frame = reader.ask(&request, path)?;
        let (reply, bodies) = observations(&frame, path, |reply: &DemoReply| {
            reply.decisions.iter().map(|d| d.obs_len).collect()
        })?;
        let mut rows = Vec::with_capacity(reply.decisions.len());
        let mut actions = 0;
        for (index, (decision, bytes)) in reply.decisions.iter().zip(bodies).enumerate() {
            let at = || format!("{}: data/{} decision {index}", path.display(), demo.name);
            observation::decode(bytes)
                .and_then(|o| o.expect_shape(self.shape))
                .map_err(|e| malformed(path, &format!("{}'s observation: {e}", at())))?;
            if decision.actions.is_empty()
                || decision.actions.len() > self.chunk_len
                || decision.actions.iter().any(|a| a.len() != ACTION_DIM)
            {
                return Err(malformed(
                    path,
                    &format!("{}: actions of another shape", at()),
                ));
            }
            let tokens = to_tokens(&decision.actions.concat())
                .map_err(|e| Error::BadInput(format!("{}: {e}", at())))?;
            actions += decision.actions.len();
            let mut row = StepRow::one_shot(
                trajectory_id.to_string(),
                self.prompt.clone(),
                tokens.iter().map(|&t| t as i32).collect(),
                vec![0.0; tokens.len()],
            );
            row.step_index = index as i32;
            row.observation = Some(bytes.to_vec());
            rows.push(row);
        }
        Ok((rows, actions))
    }
}

/// The import's producer: its options and the bins (`n_bins` over
/// [-1, 1]).
fn producer(options: &ImportOptions, n_bins: usize) -> Producer {
    Producer {
        stage: "table import".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        config: json!({
            "format": FORMAT,
            "from": options.from,
            "tokenizer": options.tokenizer,
            "chunk_len": options.chunk_len,
            "split": options.split,
            "bins": {"n": n_bins, "low": -1.0, "high": 1.0},
        }),
        seed: 0,
        shard: "0/1".into(),
    }
}

/// The replay check of one demonstration (see `table replay`).
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// The demo (`demo_<n>`).
    pub demo: String,
    /// Actions replayed (up to the limit, or to the task's success).
    pub steps: usize,
    /// Whether LIBERO's goal held after one of them.
    pub success: bool,
    /// The replayed observations' shape (the file's by construction).
    pub shape: ObservationShape,
    /// Per image (`agentview`, `wrist`): the mean absolute pixel difference
    /// (0..255) between the replayed and the file's observations, averaged
    /// over the steps.
    pub pixel_error: Vec<(String, f64)>,
    /// The largest absolute proprio difference.
    pub proprio_error: f64,
    /// The largest L2 distance between the replayed MuJoCo state and the
    /// file's next state (LIBERO's check; `None` for a one-action demo).
    pub state_error: Option<f64>,
    /// The replayed observations (EFOB), one per step.
    pub observations: Vec<Vec<u8>>,
}

#[derive(Deserialize)]
struct ReplayReply {
    steps: usize,
    success: bool,
    shape: [usize; 4],
    pixel_error: serde_json::Map<String, Value>,
    proprio_error: f64,
    state_error: Option<f64>,
    obs_len: Vec<usize>,
}

/// Replays the first `steps` actions of each of `demos` of `file` (every
/// demo when empty) through the LIBERO adapter at the file's resolution,
/// from the demo's `states[0]` (module doc of the Python side).
pub fn replay(python: &Path, file: &Path, demos: &[String], steps: usize) -> Result<Vec<Replay>> {
    if !file.is_file() {
        return Err(Error::BadInput(format!("{}: no such file", file.display())));
    }
    let mut reader = Reader::start(python)?;
    let info = reader.files(&[file.to_path_buf()], None)?.remove(0);
    let names: Vec<String> = if demos.is_empty() {
        info.demos.iter().map(|d| d.name.clone()).collect()
    } else {
        demos.to_vec()
    };
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let request = json!({"op": "demo_replay", "path": file, "demo": name, "steps": steps});
        let frame = reader.ask(&request, file)?;
        let (reply, bodies) =
            observations(&frame, file, |reply: &ReplayReply| reply.obs_len.clone())?;
        let [height, width, channels, proprio] = reply.shape;
        out.push(Replay {
            demo: name,
            steps: reply.steps,
            success: reply.success,
            shape: ObservationShape {
                height,
                width,
                channels,
                proprio,
            },
            pixel_error: IMAGES
                .iter()
                .map(|&image| {
                    let error = reply.pixel_error.get(image).and_then(Value::as_f64);
                    (image.to_string(), error.unwrap_or(f64::NAN))
                })
                .collect(),
            proprio_error: reply.proprio_error,
            state_error: reply.state_error,
            observations: bodies.into_iter().map(<[u8]>::to_vec).collect(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(from: Vec<PathBuf>, chunk_len: usize) -> ImportOptions {
        ImportOptions {
            from,
            tokenizer: PathBuf::from("no-tokenizer.json"),
            chunk_len,
            split: "train".into(),
            // Never started: these imports stop before the worker.
            python: PathBuf::from("/nonexistent/python"),
        }
    }

    #[test]
    fn an_import_without_files_or_chunks_or_with_a_missing_file_stops_before_python() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let write = WriteOptions::default();
        let none = import(&options(Vec::new(), 2), &out, write, false).unwrap_err();
        assert!(matches!(none, Error::Usage(_)), "{none}");
        let file = dir.path().join("a_demo.hdf5");
        std::fs::write(&file, b"").unwrap();
        let zero = import(&options(vec![file.clone()], 0), &out, write, false).unwrap_err();
        assert!(zero.to_string().contains("--chunk-len"), "{zero}");
        let missing = dir.path().join("b_demo.hdf5");
        let error = import(&options(vec![file, missing.clone()], 2), &out, write, false)
            .unwrap_err()
            .to_string();
        assert_eq!(error, format!("{}: no such file", missing.display()));
        assert!(!out.exists(), "nothing written");
    }

    #[test]
    fn demos_are_tasks_of_the_adapter_keyed_as_generate_tasks_keys_them() {
        let id = task_id("libero_spatial/3", "train");
        assert_eq!(id, "gym-libero/libero_spatial/3@train/demos");
        let spec = GymTaskSpec::new(ADAPTER, "libero_spatial/3", 0, 220);
        let row = embodyflow_gym::task_row(&id, "train", &spec).unwrap();
        assert_eq!(row.task_key(), "gym-libero/libero_spatial/3");
        assert_eq!(row.env, "gym:libero");
        // The adapter's Box(7) in [-1, 1] through 256 bins: -1 -> 0, +1 -> 255.
        let space = action_space();
        let tokens = space.tokens(&space.bins(), &[-1.0, 0.0, 1.0]).unwrap();
        assert_eq!((tokens[0], tokens[2]), (0, 255));
    }

    /// The value of `name = ...` in the worker's `demos.py` (an integer
    /// with `_` separators, or `a << b`).
    fn python_limit(source: &str, name: &str) -> usize {
        let line = source
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} = ")))
            .unwrap_or_else(|| panic!("demos.py has no {name}"));
        let int = |t: &str| t.trim().replace('_', "").parse::<usize>().unwrap();
        match line.split_once("<<") {
            Some((a, b)) => int(a) << int(b),
            None => int(line),
        }
    }

    #[test]
    fn the_limits_are_the_workers() {
        let demos_py =
            Path::new(embodyflow_gym::worker::PYTHON_DIR).join("embodyflow_gym/demos.py");
        let source = std::fs::read_to_string(demos_py).unwrap();
        for (name, limit) in [
            ("MAX_DEMOS", MAX_DEMOS),
            ("MAX_ACTIONS", MAX_ACTIONS),
            ("MAX_RESOLUTION", MAX_RESOLUTION),
            ("MAX_STATE_DIM", MAX_STATE_DIM),
            ("MAX_TEXT_BYTES", MAX_TEXT_BYTES),
            ("MAX_REPLY_BYTES", MAX_REPLY_BYTES),
            ("ACTION_DIM", ACTION_DIM),
        ] {
            assert_eq!(python_limit(&source, name), limit, "{name}");
        }
        assert!(MAX_REPLY_BYTES < embodyflow_gym::protocol::MAX_FRAME);
    }

    #[test]
    fn a_reply_beyond_the_limits_is_malformed() {
        let info = |demos: usize, resolution: usize| FileInfo {
            path: PathBuf::from("a.hdf5"),
            layout: "libero".into(),
            env_id: "libero_spatial/0".into(),
            instruction: "pick".into(),
            max_steps: 220,
            resolution,
            demos: (0..demos)
                .map(|i| DemoInfo {
                    name: format!("demo_{i}"),
                    complete: true,
                })
                .collect(),
        };
        let path = Path::new("a.hdf5");
        within_limits(&info(2, 128), path).unwrap();
        for (bad, says) in [
            (info(0, 128), "0 demos, expected 1 to 10000"),
            (info(MAX_DEMOS + 1, 128), "10001 demos"),
            (info(1, 0), "images of 0 px"),
            (info(1, MAX_RESOLUTION + 1), "images of 1025 px"),
        ] {
            match within_limits(&bad, path).unwrap_err() {
                Error::Io {
                    path: named,
                    source,
                } => {
                    assert_eq!(named, path);
                    assert!(source.to_string().contains(says), "{source}");
                }
                other => panic!("{other}"),
            }
        }
    }

    /// Writes a small valid demonstration file of each layout under `dir`
    /// with h5py (`None` when the bridge's Python lacks h5py).
    fn valid_files(dir: &Path) -> Option<[Vec<u8>; 2]> {
        let python = embodyflow_gym::BridgeConfig::default().python;
        let script = r#"
import sys, h5py, numpy as np
for layout in ("openvla", "libero"):
    with h5py.File(f"{sys.argv[1]}/{layout}.hdf5", "w") as f:
        data = f.create_group("data")
        if layout == "libero":
            data.attrs["problem_info"] = '{"language_instruction": "pick"}'
            data.attrs["bddl_file_name"] = "bddl/libero_spatial/nothing.bddl"
            data.attrs["macros_image_convention"] = "opengl"
        for d in range(2):
            demo = data.create_group(f"demo_{d}")
            obs = demo.create_group("obs")
            demo["actions"] = np.full((5, 7), 0.1)
            demo["states"] = np.zeros((5, 9))
            demo["dones"] = np.array([0, 0, 0, 0, 1], np.uint8)
            obs["ee_states"] = np.zeros((5, 6))
            obs["gripper_states"] = np.zeros((5, 2))
            obs["agentview_rgb"] = np.full((5, 8, 8, 3), 7, np.uint8)
            obs["eye_in_hand_rgb"] = np.full((5, 8, 8, 3), 9, np.uint8)
"#;
        let out = std::process::Command::new(&python)
            .args(["-c", script])
            .arg(dir)
            .output()
            .ok()
            .filter(|o| o.status.success());
        if out.is_none() {
            eprintln!(
                "skipped: h5py is not installed in {} (run scripts/setup)",
                python.display()
            );
            return None;
        }
        let read = |layout: &str| std::fs::read(dir.join(format!("{layout}.hdf5"))).unwrap();
        Some([read("openvla"), read("libero")])
    }

    /// What a fuzzed file is made of: one of the valid files, then cut,
    /// with bytes overwritten, or random bytes after HDF5's signature.
    #[derive(Debug, Clone)]
    enum Mutation {
        Truncate(usize, usize),
        Overwrite(usize, Vec<(usize, u8)>),
        Random(Vec<u8>),
    }

    fn mutation() -> impl proptest::strategy::Strategy<Value = Mutation> {
        use proptest::prelude::*;
        prop_oneof![
            (0..2usize, any::<usize>()).prop_map(|(f, at)| Mutation::Truncate(f, at)),
            // Mostly in the first 4 KiB: the superblock, the root group's
            // and `data`'s headers, where a byte changes the file's layout.
            (
                0..2usize,
                proptest::collection::vec(
                    (
                        prop_oneof![3 => 0..4096usize, 1 => any::<usize>()],
                        any::<u8>()
                    ),
                    1..24
                )
            )
                .prop_map(|(f, bytes)| Mutation::Overwrite(f, bytes)),
            proptest::collection::vec(any::<u8>(), 0..4096).prop_map(Mutation::Random),
        ]
    }

    #[test]
    fn random_cut_or_corrupted_files_are_bad_input_never_a_failure() {
        use embodyflow_core::{Classify as _, ErrorKind};
        use proptest::test_runner::{Config, TestCaseError, TestRunner};
        let dir = tempfile::tempdir().unwrap();
        let Some(valid) = valid_files(dir.path()) else {
            return;
        };
        // The layout probe and every check run in one worker, as an import's.
        let python = embodyflow_gym::BridgeConfig::default().python;
        let reader = std::cell::RefCell::new(Reader::start(&python).unwrap());
        let folder = dir.path().join("libero_spatial");
        std::fs::create_dir(&folder).unwrap();
        let cases = std::cell::Cell::new(0);
        // A fixed stream of cases, so every run checks the same 256 files: a
        // file that hangs the HDF5 library is only noticed after PATIENCE,
        // which a test run must not draw by chance.
        let mut runner = TestRunner::new_with_rng(
            Config {
                cases: 256,
                failure_persistence: None,
                ..Config::default()
            },
            proptest::test_runner::TestRng::deterministic_rng(
                proptest::test_runner::RngAlgorithm::ChaCha,
            ),
        );
        let check = |mutation: Mutation| {
            let bytes = match &mutation {
                Mutation::Truncate(f, at) => valid[*f][..at % valid[*f].len()].to_vec(),
                Mutation::Overwrite(f, writes) => {
                    let mut bytes = valid[*f].clone();
                    let n = bytes.len();
                    for &(at, byte) in writes {
                        bytes[at % n] = byte;
                    }
                    bytes
                }
                Mutation::Random(tail) => [b"\x89HDF\r\n\x1a\n".as_slice(), tail].concat(),
            };
            cases.set(cases.get() + 1);
            // A new name per case: the worker keeps what it checked by path,
            // modification time and size.
            let path = folder.join(format!("fuzz{}_demo.hdf5", cases.get()));
            std::fs::write(&path, &bytes).unwrap();
            let outcome = reader
                .borrow_mut()
                .files(std::slice::from_ref(&path), Some(2));
            std::fs::remove_file(&path).unwrap();
            match outcome {
                Ok(files) => Err(TestCaseError::fail(format!(
                    "accepted as task {}",
                    files[0].env_id
                ))),
                Err(e) if e.kind() == ErrorKind::BadInput => {
                    let text = e.to_string();
                    if text.contains(&path.display().to_string()) || text.contains("scripts/setup")
                    {
                        Ok(())
                    } else {
                        Err(TestCaseError::fail(format!("names no file: {text}")))
                    }
                }
                Err(e) => {
                    // A worker that failed may be gone: the next case gets a new one.
                    *reader.borrow_mut() = Reader::start(&python).unwrap();
                    let cause = std::error::Error::source(&e).map(ToString::to_string);
                    Err(TestCaseError::fail(format!(
                        "not bad input: {e}: {cause:?}"
                    )))
                }
            }
        };
        // A byte that crashes the HDF5 library reading the file (the worker
        // dies, and again when started anew): bad input naming the file.
        check(Mutation::Overwrite(0, vec![(1424, 128)])).unwrap();
        let result = runner.run(&mutation(), check);
        if let Err(e) = result {
            panic!("{e}");
        }
    }
}

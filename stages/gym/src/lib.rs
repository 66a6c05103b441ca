//! The Gymnasium bridge: any Gymnasium environment as a
//! [`ClosedLoopWorld`](embodyflow_world::ClosedLoopWorld)
//! of the closed-loop driver, through Python worker processes.
//!
//! ```text
//! run_closed_loop ──► GymEpisodes ──► Pool of N workers (python -u -m embodyflow_gym.worker)
//!                       episodes split over the workers, stepped in lockstep:
//!                       send step_chunk to every worker, then read every reply
//! ```
//!
//! - [`protocol`]: frames over the pipes (u32 length + JSON header + binary
//!   body of EFOB observations), bounded; anything else is malformed.
//! - [`worker`]: one process in its own process group, with a deadline on
//!   every reply and an id that ties each reply to its request; its
//!   [`worker::Fault`]s (crashed, hung, malformed).
//! - [`episodes`]: [`GymEpisodes`], `G` copies of each task sharing the
//!   reset seed (so the initial state), actions decoded from the policy's
//!   bins, anchor keys from the worker's state hash; a faulty worker is
//!   killed (with its process group) and restarted and each of its live
//!   episodes ends as a failure with the reason, never dropped, never a
//!   hang. A worker that dies starting or resetting is restarted up to
//!   [`START_ATTEMPTS`] times, then its episodes fail with the reason; an
//!   environment that raises in its reset fails its own episode. Only bad
//!   input (an unknown adapter or env id, a missing package, a Python that
//!   cannot be started) stops a stage.
//! - [`expert`]: the adapters' scripted experts' whole episodes
//!   ([`expert_demonstrations`]).
//! - [`served`]: workers a pipeline runner keeps warm across its steps
//!   (`keep_workers`), which a stage's pool takes before it spawns any.
//!
//! An environment family is an adapter: a Python `make` function
//! registered in the entry-point group `embodyflow_gym.adapters` by the
//! package that holds it (the built-ins `babyai`, `metaworld` and
//! `generic` in `python/pyproject.toml`, one line each; a user's in their
//! own package's), or named by a task as `module:function`. Adding one is a
//! function plus task specs ([`GymTaskSpec`]), no stage change and no edit
//! of this tree. Each task says what success is where the adapter takes a
//! rule ([`SuccessRule`]).
//!
//! ```no_run
//! use embodyflow_gym::{BridgeConfig, GymEpisodes, GymTask, GymTaskSpec, probe};
//! let config = BridgeConfig::default();
//! let spec = GymTaskSpec::new("babyai", "BabyAI-GoToLocal-v0", 7, 64);
//! let info = probe(&config, &spec).unwrap();
//! let tasks = vec![GymTask { task_id: "goto/7".into(), spec }];
//! let bins = info.action.bins();
//! let world = GymEpisodes::new(&config, &tasks, 8, &bins).unwrap(); // G = 8
//! ```

use std::path::PathBuf;

use embodyflow_algos::action_tokens::{ActionBins, ActionTokenError};
use embodyflow_core::observation::ObservationShape;
use embodyflow_core::schemas::TaskRow;
use embodyflow_core::{Classify, ErrorKind};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

mod config;
pub mod declaration;
pub mod episodes;
pub mod expert;
pub mod protocol;
pub mod served;
pub mod worker;

pub use config::{BridgeConfig, DEFAULT_PYTHON, PYTHON_VAR, STARTUP_TIMEOUT};
pub use episodes::{FaultCounts, GymEpisodes, Pool};
pub use expert::{Demonstration, DemonstrationDecision, expert_demonstrations};

use worker::{Fault, Reply, Worker};

/// How many times a worker is started for a hello or a reset before the
/// episodes it was to host fail: the first start and two restarts.
pub const START_ATTEMPTS: usize = 3;

/// The tasks table's `env` prefix of a bridge task (`gym:<adapter>`).
pub const ENV_PREFIX: &str = "gym:";

/// When an episode of an adapter that takes a rule (the `generic` one)
/// succeeds. Written as text: `info`, `terminal_reward`, `survive`,
/// `return_at_least:X`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum SuccessRule {
    /// The step's `info["success"]` or `info["is_success"]` is true (the
    /// default where the env reports one of them).
    Info,
    /// The episode terminates with a positive reward (MiniGrid's goal
    /// convention; only when asked for: CartPole's pole falls with reward 1).
    TerminalReward,
    /// The episode reaches its end (truncation or the task's `max_steps`)
    /// without terminating (CartPole's balance).
    Survive,
    /// The episode's summed reward is at least this when it ends.
    ReturnAtLeast(f64),
}

impl SuccessRule {
    /// The rules, as `generate-tasks --help` and messages list them.
    pub const CHOICES: &'static str = "info (the env's info[\"success\"] / info[\"is_success\"]; the default where the env reports one), terminal_reward (terminated with a positive reward), survive (reaching truncation or max_steps without terminating), return_at_least:X (a return of at least X at the end)";
}

impl std::str::FromStr for SuccessRule {
    type Err = String;

    fn from_str(text: &str) -> Result<SuccessRule, String> {
        let rule = match text.split_once(':') {
            None if text == "info" => Some(SuccessRule::Info),
            None if text == "terminal_reward" => Some(SuccessRule::TerminalReward),
            None if text == "survive" => Some(SuccessRule::Survive),
            Some(("return_at_least", x)) => x
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .map(SuccessRule::ReturnAtLeast),
            _ => None,
        };
        rule.ok_or_else(|| {
            format!(
                "success rule `{text}`: expected one of {}",
                SuccessRule::CHOICES
            )
        })
    }
}

impl TryFrom<String> for SuccessRule {
    type Error = String;

    fn try_from(text: String) -> Result<SuccessRule, String> {
        text.parse()
    }
}

impl From<SuccessRule> for String {
    fn from(rule: SuccessRule) -> String {
        rule.to_string()
    }
}

impl std::fmt::Display for SuccessRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SuccessRule::Info => write!(f, "info"),
            SuccessRule::TerminalReward => write!(f, "terminal_reward"),
            SuccessRule::Survive => write!(f, "survive"),
            SuccessRule::ReturnAtLeast(x) => write!(f, "return_at_least:{x}"),
        }
    }
}

/// One task of a Gymnasium environment: which adapter and env, the reset
/// seed, the step budget, the adapter's keyword arguments and the success
/// rule. Stored as JSON in the tasks table's `observation` column
/// ([`task_row`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GymTaskSpec {
    /// The adapter: a name registered in the entry-point group
    /// `embodyflow_gym.adapters` (`babyai`, `metaworld`, `generic`, a
    /// user's), or `module:function`.
    pub adapter: String,
    /// The environment id the adapter builds (`BabyAI-GoToLocal-v0`,
    /// `reach-v3`, …).
    pub env_id: String,
    /// The reset seed (every copy of the task resets with it).
    pub seed: u64,
    /// Environment steps after which an episode ends (a failure unless it
    /// succeeded at that step).
    pub max_steps: u32,
    /// Keyword arguments of the adapter (`gymnasium.make`'s for most).
    #[serde(default = "empty_object")]
    pub kwargs: Value,
    /// The instruction when the environment gives none (the generic
    /// adapter); BabyAI's mission and Meta-World's sentence take precedence.
    #[serde(default)]
    pub instruction: Option<String>,
    /// When an episode succeeds, for an adapter that takes a rule
    /// (`generic`); `None`: the adapter's own (the generic adapter's is
    /// `info` where the env reports success, else it refuses the task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success: Option<SuccessRule>,
}

fn empty_object() -> Value {
    json!({})
}

impl GymTaskSpec {
    /// A spec without kwargs or instruction.
    pub fn new(adapter: &str, env_id: &str, seed: u64, max_steps: u32) -> GymTaskSpec {
        GymTaskSpec {
            adapter: adapter.to_string(),
            env_id: env_id.to_string(),
            seed,
            max_steps,
            kwargs: empty_object(),
            instruction: None,
            success: None,
        }
    }

    /// The spec as the worker takes it.
    pub(crate) fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("a spec serializes")
    }
}

/// A task: its id and its spec.
#[derive(Clone, Debug, PartialEq)]
pub struct GymTask {
    /// The task id (the tasks table's `task_id`).
    pub task_id: String,
    /// What to run.
    pub spec: GymTaskSpec,
}

/// The tasks-table row of a bridge task: `env = "gym:<adapter>"`, `suite` =
/// the env id, the spec JSON in `observation`, `seed` = the reset seed,
/// `instruction` = the spec's (empty when the environment gives it: BabyAI's
/// mission depends on the seed; [`GymEpisodes::instruction`] has it).
pub fn task_row(task_id: &str, split: &str, spec: &GymTaskSpec) -> Result<TaskRow, BridgeError> {
    let seed = i64::try_from(spec.seed).map_err(|_| BridgeError::TaskRow {
        task_id: task_id.to_string(),
        reason: format!("seed {} does not fit the seed column (i64)", spec.seed),
    })?;
    Ok(TaskRow {
        task_id: task_id.to_string(),
        suite: spec.env_id.clone(),
        env: format!("{ENV_PREFIX}{}", spec.adapter),
        split: split.to_string(),
        task_type: None,
        seed,
        instruction: spec.instruction.clone().unwrap_or_default(),
        observation: Some(serde_json::to_vec(spec).expect("a spec serializes")),
        gt_actions: None,
    })
}

/// The task of a tasks-table row written by [`task_row`]: the spec from
/// `observation`, its seed from the `seed` column. A row of another env,
/// without a spec, or whose spec names another adapter is bad input naming
/// the task.
pub fn task_from_row(row: &TaskRow) -> Result<GymTask, BridgeError> {
    let bad = |reason: String| BridgeError::TaskRow {
        task_id: row.task_id.clone(),
        reason,
    };
    let adapter = row.env.strip_prefix(ENV_PREFIX).ok_or_else(|| {
        bad(format!(
            "env `{}` is not a bridge task (expected `{ENV_PREFIX}<adapter>`)",
            row.env
        ))
    })?;
    let bytes = row
        .observation
        .as_deref()
        .ok_or_else(|| bad("column `observation` is null, expected the task spec JSON".into()))?;
    let mut spec: GymTaskSpec = serde_json::from_slice(bytes)
        .map_err(|e| bad(format!("column `observation` is not a task spec: {e}")))?;
    if spec.adapter != adapter {
        return Err(bad(format!(
            "env `{}` but the spec names adapter `{}`",
            row.env, spec.adapter
        )));
    }
    spec.seed = u64::try_from(row.seed)
        .map_err(|_| bad(format!("column `seed` is {}, expected >= 0", row.seed)))?;
    Ok(GymTask {
        task_id: row.task_id.clone(),
        spec,
    })
}

/// An environment's action space.
#[derive(Clone, Debug, PartialEq)]
pub enum ActionSpace {
    /// `n` discrete actions: one action dimension whose value is the index.
    Discrete {
        /// Actions.
        n: usize,
    },
    /// A box of `low.len()` dimensions.
    Box {
        /// Lower bounds.
        low: Vec<f32>,
        /// Upper bounds.
        high: Vec<f32>,
    },
}

impl ActionSpace {
    /// Dimensions of one action (1 for discrete).
    pub fn dim(&self) -> usize {
        match self {
            ActionSpace::Discrete { .. } => 1,
            ActionSpace::Box { low, .. } => low.len(),
        }
    }

    /// The action bins a policy for this space uses: `n + 1` bins for
    /// `Discrete(n)` (bins `0..n` decode to `n` distinct centres, one per
    /// action; OpenVLA's top bin shares the centre below it, so `n` bins
    /// would leave action `n - 1` unreachable), 256 bins over the box's
    /// widest bounds for a box (OpenVLA's).
    pub fn bins(&self) -> ActionBins {
        match self {
            ActionSpace::Discrete { n } => {
                ActionBins::new(n + 1, -1.0, 1.0).expect("n + 1 >= 2 bins over [-1, 1]")
            }
            ActionSpace::Box { low, high } => {
                let lo = low.iter().copied().fold(f32::INFINITY, f32::min);
                let hi = high.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                ActionBins::new(256, f64::from(lo), f64::from(hi))
                    .unwrap_or_else(|_| ActionBins::openvla())
            }
        }
    }

    /// Whether `bins` fit the space: `Discrete(n)` needs `n + 1` bins (see
    /// [`ActionSpace::bins`]); any bins fit a box (values are clipped to it).
    pub fn check_bins(&self, bins: &ActionBins) -> Result<(), String> {
        match self {
            ActionSpace::Discrete { n } if bins.n_bins() != n + 1 => Err(format!(
                "Discrete({n}) actions need a policy with n_bins = {} (n + 1: OpenVLA's top bin decodes to the centre below it, so bins 0..{n} are the {n} actions), found {}",
                n + 1,
                bins.n_bins()
            )),
            _ => Ok(()),
        }
    }

    /// The tokens of a demonstration's actions (flattened, [`ActionSpace::dim`]
    /// values each): the index for discrete actions, `bins.encode` for a box.
    pub fn tokens(&self, bins: &ActionBins, actions: &[f32]) -> Result<Vec<u32>, ActionTokenError> {
        match self {
            ActionSpace::Discrete { .. } => Ok(actions.iter().map(|&a| a as u32).collect()),
            ActionSpace::Box { .. } => bins.encode(actions),
        }
    }

    fn from_json(value: &Value) -> Option<ActionSpace> {
        let floats = |key: &str| -> Option<Vec<f32>> {
            value
                .get(key)?
                .as_array()?
                .iter()
                .map(|v| v.as_f64().map(|f| f as f32))
                .collect()
        };
        match value.get("kind")?.as_str()? {
            "discrete" => Some(ActionSpace::Discrete {
                n: usize::try_from(value.get("n")?.as_u64()?).ok()?,
            }),
            "box" => {
                let (low, high) = (floats("low")?, floats("high")?);
                (low.len() == high.len() && !low.is_empty())
                    .then_some(ActionSpace::Box { low, high })
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for ActionSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ActionSpace::Discrete { n } => write!(f, "Discrete({n})"),
            ActionSpace::Box { low, .. } => write!(f, "Box({})", low.len()),
        }
    }
}

/// What an adapter's environment looks like ([`probe`]).
#[derive(Clone, Debug, PartialEq)]
pub struct AdapterInfo {
    /// Its observations' shape (a `0x0x3` image for a state-only env).
    pub shape: ObservationShape,
    /// The names of the images its frames join along the channels (LIBERO's
    /// `agentview`, `wrist`: `shape.channels` split evenly among them, in
    /// order); empty for one unnamed image.
    pub images: Vec<String>,
    /// The longest text an observation carries, in characters (a
    /// Gymnasium `Text` space's `max_length`); 0 when the env observes no
    /// text. A text observation is appended to the instruction in each
    /// decision's prompt ([`embodyflow_world::observed_prompt`]).
    pub text: usize,
    /// Its actions.
    pub action: ActionSpace,
    /// Whether it gives an instruction.
    pub instruction: bool,
    /// Whether it has a scripted expert.
    pub expert: bool,
    /// The success rule it applies (an adapter that takes a rule announces
    /// the one in force: the task's, or the default it chose); `None` when
    /// the adapter decides success itself.
    pub success: Option<SuccessRule>,
}

impl AdapterInfo {
    /// Whether an observation with (`true`) or without a text fits: an env
    /// that observes text sends it with every observation, no other may.
    pub(crate) fn check_text(&self, has_text: bool) -> Result<(), &'static str> {
        match (has_text, self.text > 0) {
            (false, true) => Err("no text, the env observes text"),
            (true, false) => Err("a text, the env announced none"),
            _ => Ok(()),
        }
    }

    fn from_header(header: &serde_json::Map<String, Value>) -> Option<AdapterInfo> {
        let size = |key: &str| usize::try_from(header.get(key)?.as_u64()?).ok();
        Some(AdapterInfo {
            shape: ObservationShape {
                height: size("height")?,
                width: size("width")?,
                channels: size("channels")?,
                proprio: size("proprio")?,
            },
            images: match header.get("images") {
                None | Some(Value::Null) => Vec::new(),
                Some(names) => {
                    let names: Vec<String> = names
                        .as_array()?
                        .iter()
                        .map(|n| n.as_str().map(String::from))
                        .collect::<Option<_>>()?;
                    let channels = size("channels")?;
                    // Each image has the same channels (observation format 2).
                    if names.is_empty() || channels % names.len() != 0 {
                        return None;
                    }
                    names
                }
            },
            text: size("text")?,
            action: ActionSpace::from_json(header.get("action")?)?,
            instruction: header.get("instruction")?.as_bool()?,
            expert: header.get("expert")?.as_bool()?,
            success: match header.get("success") {
                None | Some(Value::Null) => None,
                Some(rule) => Some(rule.as_str()?.parse().ok()?),
            },
        })
    }
}

/// Why the bridge could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// The Python interpreter cannot be started.
    #[error(
        "cannot start the bridge's Python `{python}`: {source}; run scripts/setup (it creates .venv with the Gymnasium packages) or set {PYTHON_VAR}"
    )]
    Python {
        /// The interpreter.
        python: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A worker refused a request: an unknown adapter, an env id that does
    /// not exist, a missing package (the message says how to install it).
    #[error("{worker}, {request}: {message}")]
    Refused {
        /// The worker.
        worker: String,
        /// The request.
        request: String,
        /// The worker's message.
        message: String,
        /// Whether the request was at fault (else the worker failed).
        bad_input: bool,
    },
    /// A worker failed to start (its hello), [`START_ATTEMPTS`] times: a
    /// Python that cannot run the worker module, an environment that kills
    /// its process while it is built, a start or a build past its deadline
    /// (named with the key that set it: `worker 0 (pid …) did not answer
    /// hello (libero libero_spatial/0) within 300 s (bridge.startup_timeout_s
    /// = 300; raise it on a busy machine)`).
    #[error(
        "{worker} {}, the last of {START_ATTEMPTS} attempts (python `{python}`; its traceback, if any, is on stderr)",
        startup_fault(.fault, .request, .deadline)
    )]
    Startup {
        /// The worker.
        worker: String,
        /// The request.
        request: String,
        /// What happened.
        fault: Fault,
        /// The interpreter.
        python: PathBuf,
        /// What set the deadline a hung worker missed, and what to do
        /// ([`BridgeConfig::deadline`]).
        deadline: String,
    },
    /// Tasks or a policy that do not fit together.
    #[error("{0}")]
    Mismatch(String),
    /// A tasks row that is not a bridge task.
    #[error("tasks row `{task_id}`: {reason}")]
    TaskRow {
        /// The row's task id.
        task_id: String,
        /// What is wrong.
        reason: String,
    },
}

/// What a worker that failed to start did during `request`: `did not
/// answer hello (…) within 300 s (<deadline>)` when it hung, else `<fault>
/// during hello (…)`.
fn startup_fault(fault: &Fault, request: &str, deadline: &str) -> String {
    match fault {
        Fault::Hung(waited) => format!(
            "did not answer {request} within {} s ({deadline})",
            waited.as_secs_f64()
        ),
        other => format!("{other} during {request}"),
    }
}

/// ` (<what set the deadline>; raise it on a busy machine)` for a worker
/// that hung (its episodes' failure reasons name the key), else nothing.
pub(crate) fn missed_deadline(config: &BridgeConfig, fault: &Fault) -> String {
    match fault {
        Fault::Hung(waited) => format!(" ({})", config.deadline(*waited)),
        _ => String::new(),
    }
}

impl Classify for BridgeError {
    fn kind(&self) -> ErrorKind {
        match self {
            BridgeError::Refused {
                bad_input: false, ..
            }
            | BridgeError::Startup { .. } => ErrorKind::Failure,
            BridgeError::Python { .. }
            | BridgeError::Refused { .. }
            | BridgeError::Mismatch(_)
            | BridgeError::TaskRow { .. } => ErrorKind::BadInput,
        }
    }
}

/// Worker `index` of a pool: an idle one of the `served` workers (the
/// runner's kept ones, [`served::attach`]), else a new process.
pub(crate) fn spawn(
    config: &BridgeConfig,
    served: &[served::ServedSocket],
    index: usize,
) -> Result<Worker, BridgeError> {
    if let Some(worker) = served::attach(config, served, index) {
        return Ok(worker);
    }
    Worker::spawn(&config.python, index).map_err(|source| BridgeError::Python {
        python: config.python.clone(),
        source,
    })
}

/// What `spec`'s environment looks like, asked of the pool's worker `w`
/// (`hello`, which builds the environment: the worker may stay silent for
/// the start-up patience, [`BridgeConfig::build_patience`]): a worker that
/// crashes, hangs or sends a malformed reply is restarted and asked again,
/// [`START_ATTEMPTS`] times in all ([`BridgeError::Startup`] then, naming
/// the key of the deadline a hung one missed); a refusal is the worker's
/// answer.
pub(crate) fn hello(
    pool: &mut Pool,
    w: usize,
    spec: &GymTaskSpec,
) -> Result<AdapterInfo, BridgeError> {
    let request = json!({
        "op": "hello", "adapter": spec.adapter, "env_id": spec.env_id,
        "kwargs": spec.kwargs, "seed": spec.seed, "max_steps": spec.max_steps,
        "success": spec.success,
    });
    let what = format!("hello ({} {})", spec.adapter, spec.env_id);
    let (timeout, start) = (pool.config().timeout, pool.config().startup_timeout);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let worker = pool.worker(w)?;
        let name = worker.name();
        worker.send(&request);
        let fault = match worker.receive_patiently(timeout, start) {
            Ok(Reply::Done(frame)) => match AdapterInfo::from_header(&frame.header) {
                Some(info) => return Ok(info),
                None => Fault::Malformed("a hello reply without the shape and action space".into()),
            },
            Ok(Reply::Refused { bad_input, message }) => {
                return Err(BridgeError::Refused {
                    worker: name,
                    request: what,
                    message,
                    bad_input,
                });
            }
            Err(fault) => fault,
        };
        pool.fault(w, &fault);
        if attempt == START_ATTEMPTS {
            let deadline = match &fault {
                Fault::Hung(waited) => pool.config().deadline(*waited),
                _ => String::new(),
            };
            return Err(BridgeError::Startup {
                worker: name,
                request: what,
                fault,
                python: pool.config().python.clone(),
                deadline,
            });
        }
    }
}

/// What the environment of `spec` looks like (built as the task builds it:
/// its kwargs, `max_steps` and success rule), asked of a fresh worker
/// (which then exits). An unknown adapter, an env id that does not exist,
/// a missing package, an env without a success signal and no rule, or a
/// Python that cannot be started is bad input naming what is missing and
/// how to supply it; a worker that dies [`START_ATTEMPTS`] times is a
/// failure ([`BridgeError::Startup`]).
pub fn probe(config: &BridgeConfig, spec: &GymTaskSpec) -> Result<AdapterInfo, BridgeError> {
    let mut pool = Pool::new(&BridgeConfig {
        workers: 1,
        ..config.clone()
    })?;
    hello(&mut pool, 0, spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_rows_round_trip_and_bad_rows_name_the_task() {
        let mut spec = GymTaskSpec::new("babyai", "BabyAI-GoToLocal-v0", 7, 64);
        spec.kwargs = json!({"room_size": 8});
        let row = task_row("goto/7", "train", &spec).unwrap();
        assert_eq!(row.env, "gym:babyai");
        assert_eq!(row.seed, 7);
        let task = task_from_row(&row).unwrap();
        assert_eq!(task.spec, spec);
        let mut other = row.clone();
        other.seed = 9;
        assert_eq!(task_from_row(&other).unwrap().spec.seed, 9);
        let mut tabletop = row.clone();
        tabletop.env = "tabletop".into();
        let error = task_from_row(&tabletop).unwrap_err().to_string();
        assert!(
            error.starts_with("tasks row `goto/7`: env `tabletop`"),
            "{error}"
        );
        let mut wrong = row.clone();
        wrong.env = "gym:metaworld".into();
        assert!(
            task_from_row(&wrong)
                .unwrap_err()
                .to_string()
                .contains("adapter `babyai`")
        );
        let mut null = row.clone();
        null.observation = None;
        assert!(
            task_from_row(&null)
                .unwrap_err()
                .to_string()
                .contains("`observation` is null")
        );
        let mut negative = row;
        negative.seed = -1;
        assert_eq!(
            task_from_row(&negative).unwrap_err().kind(),
            ErrorKind::BadInput
        );
    }

    #[test]
    fn discrete_spaces_need_one_bin_more_than_actions() {
        let space = ActionSpace::Discrete { n: 7 };
        let bins = space.bins();
        assert_eq!(bins.n_bins(), 8);
        assert!(space.check_bins(&bins).is_ok());
        // Every action index is its own bin and its own centre.
        let centres = bins.decode(&[0, 1, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!(bins.encode(&centres).unwrap(), [0, 1, 2, 3, 4, 5, 6]);
        let error = space
            .check_bins(&ActionBins::new(7, -1.0, 1.0).unwrap())
            .unwrap_err();
        assert!(
            error.contains("n_bins = 8") && error.contains("found 7"),
            "{error}"
        );
        assert!(
            ActionSpace::Box {
                low: vec![-1.0; 4],
                high: vec![1.0; 4]
            }
            .check_bins(&ActionBins::openvla())
            .is_ok()
        );
    }
}

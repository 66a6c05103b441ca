//! [`GymEpisodes`]: the episodes of Gymnasium tasks as a
//! [`ClosedLoopWorld`], hosted by a [`Pool`] of Python workers.
//!
//! Episode `t * G + g` is copy `g` of task `t`; every copy resets with the
//! task's seed, so the `G` copies of a task start in the same state (GRPO's
//! group). The `n` episodes are split over the `W` workers in contiguous
//! blocks (worker `w` hosts episodes `w·n/W .. (w+1)·n/W`, one slot each).
//! A chunk is stepped in lockstep: `step_chunk` is sent to every worker
//! with live episodes, then every reply is read, each within the timeout
//! counted from its send, so the workers run in parallel.
//!
//! Actions arrive as the bin centres the driver decoded. A `Discrete(n)`
//! space maps a value back to its bin with the policy's [`ActionBins`]
//! (`n + 1` bins, checked at construction: [`crate::ActionSpace::check_bins`]);
//! a box passes the values (the adapter clips them to the box).
//!
//! Faults: a worker that crashes, hangs past the timeout or sends a
//! malformed frame is killed and restarted; each of its live episodes ends
//! with `ChunkReport { done: true, success: false, failure: Some(reason) }`,
//! the reason naming the worker, what happened and the decision (and, for
//! a hung one, the key of the deadline it missed). An
//! environment that raises ends only its own episode the same way. Before
//! the first decision: a worker that dies saying hello or resetting is
//! restarted and asked again, [`START_ATTEMPTS`] times in all; then the
//! episodes it was to host end before their first decision
//! ([`ClosedLoopWorld::start_failure`] says why), as does an episode whose
//! environment raises in its reset, and the others run. The counts are
//! [`GymEpisodes::faults`]. Dropping the pool closes its workers (each
//! closes its environments) and kills their process groups.
//!
//! ```no_run
//! use embodyflow_gym::{BridgeConfig, GymEpisodes, GymTask, GymTaskSpec, probe};
//! use embodyflow_world::ClosedLoopWorld;
//! let config = BridgeConfig { workers: 2, ..BridgeConfig::default() };
//! let spec = GymTaskSpec::new("babyai", "BabyAI-GoToLocal-v0", 3, 64);
//! let tasks = vec![GymTask { task_id: "goto/3".into(), spec }];
//! let info = probe(&config, &tasks[0].spec).unwrap();
//! let mut world = GymEpisodes::new(&config, &tasks, 4, &info.action.bins()).unwrap();
//! let reports = world.step_chunks(&vec![0.0; 4 * 2], 2).unwrap(); // K = 2 turns left
//! println!("{}", world.faults());
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use embodyflow_algos::action_tokens::ActionBins;
use embodyflow_core::observation::{self, ObservationShape};
use embodyflow_world::world::{Kept, WorldEpisodes};
use embodyflow_world::{ChunkReport, ClosedLoopWorld, WorldError};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::protocol::{Frame, split_body};
use crate::worker::{Fault, Reply, Worker};
use crate::{
    ActionSpace, AdapterInfo, BridgeConfig, BridgeError, GymTask, GymTaskSpec, START_ATTEMPTS,
};

/// The longest wait for a worker to close its environments and exit
/// (shorter when the bridge's timeout is); then its group is killed.
pub const CLOSE_PATIENCE: Duration = Duration::from_secs(5);

/// Faults of a pool's workers, for a stage's summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Workers that exited.
    pub crashed: u32,
    /// Workers that did not answer within the timeout.
    pub hung: u32,
    /// Workers that sent a malformed frame.
    pub malformed: u32,
    /// Workers started again after a fault.
    pub restarts: u32,
}

impl FaultCounts {
    /// Faults of any kind.
    pub fn total(&self) -> u32 {
        self.crashed + self.hung + self.malformed
    }
}

impl std::fmt::Display for FaultCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "worker faults: {} crashed, {} hung, {} malformed; {} restarts",
            self.crashed, self.hung, self.malformed, self.restarts
        )
    }
}

/// The worker processes of a bridge, restarted after faults.
pub struct Pool {
    config: BridgeConfig,
    /// The served workers it takes before it spawns any
    /// ([`crate::served`]): their sockets and the pids the run started.
    served: Vec<crate::served::ServedSocket>,
    workers: Vec<Option<Worker>>,
    faults: FaultCounts,
    /// What each adapter, env id and kwargs looked like (`hello` once per
    /// pool, not per batch).
    infos: Vec<(String, String, Value, AdapterInfo)>,
}

impl Pool {
    /// Starts `config.workers` workers (at least one), taking the idle
    /// served workers that [`POOL_VAR`](crate::served::POOL_VAR) names
    /// first.
    pub fn new(config: &BridgeConfig) -> Result<Pool, BridgeError> {
        Pool::with_served(config, crate::served::from_env())
    }

    /// Starts `config.workers` workers (at least one), taking the idle
    /// served workers of `served` (their sockets, with the pid of the
    /// worker the run started at each) first, also when it replaces a
    /// faulty worker.
    pub fn with_served(
        config: &BridgeConfig,
        served: Vec<crate::served::ServedSocket>,
    ) -> Result<Pool, BridgeError> {
        let workers = (0..config.workers.max(1))
            .map(|w| crate::spawn(config, &served, w).map(Some))
            .collect::<Result<_, _>>()?;
        Ok(Pool {
            config: config.clone(),
            served,
            workers,
            faults: FaultCounts::default(),
            infos: Vec::new(),
        })
    }

    /// Its configuration.
    pub fn config(&self) -> &BridgeConfig {
        &self.config
    }

    /// Its workers.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether it has no worker (never: a pool starts at least one).
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// The faults so far.
    pub fn faults(&self) -> FaultCounts {
        self.faults
    }

    /// Worker `w`, started again if its restart had failed.
    pub(crate) fn worker(&mut self, w: usize) -> Result<&mut Worker, BridgeError> {
        if self.workers[w].is_none() {
            self.workers[w] = Some(crate::spawn(&self.config, &self.served, w)?);
        }
        Ok(self.workers[w].as_mut().expect("just started"))
    }

    /// Asks every worker that awaits no reply to close (each closes its
    /// environments and exits), waits for their answers (at most
    /// [`CLOSE_PATIENCE`] or the timeout, together) and kills the process
    /// groups of all. A served worker that awaits no reply is let go with
    /// its environments instead (`crate::served`).
    fn close(&mut self) {
        let patience = self.config.timeout.min(CLOSE_PATIENCE);
        let mut closing = Vec::new();
        for mut worker in self.workers.iter_mut().filter_map(Option::take) {
            if worker.busy() {
                worker.kill();
            } else if worker.served() {
                drop(worker);
            } else {
                worker.send(&json!({"op": "close"}));
                closing.push(worker);
            }
        }
        for mut worker in closing {
            let _ = worker.receive(patience);
            worker.kill();
        }
    }

    /// Counts `fault` of worker `w`, kills it and starts another (a
    /// failed start is retried at the next use).
    pub(crate) fn fault(&mut self, w: usize, fault: &Fault) {
        match fault {
            Fault::Crashed(_) => self.faults.crashed += 1,
            Fault::Hung(_) => self.faults.hung += 1,
            Fault::Malformed(_) => self.faults.malformed += 1,
        }
        if let Some(mut worker) = self.workers[w].take() {
            worker.kill();
        }
        if let Ok(worker) = crate::spawn(&self.config, &self.served, w) {
            self.workers[w] = Some(worker);
            self.faults.restarts += 1;
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.close();
    }
}

#[derive(Deserialize)]
struct ResetEpisode {
    slot: usize,
    instruction: String,
    key: String,
    obs_len: usize,
    #[serde(default)]
    text: Option<String>,
    /// The environment raised building or resetting (the episode fails).
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct StepEpisode {
    slot: usize,
    steps: u32,
    done: bool,
    success: bool,
    key: String,
    obs_len: usize,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct Episodes<T> {
    episodes: Vec<T>,
}

/// The `episodes` of a reply, one per slot asked in order, with their
/// observations; `Err` names what is malformed.
fn reply_episodes<'a, T: for<'de> Deserialize<'de>>(
    frame: &'a Frame,
    slots: &[usize],
    slot_of: impl Fn(&T) -> (usize, usize),
) -> Result<(Vec<T>, Vec<&'a [u8]>), String> {
    let Episodes { episodes } =
        serde_json::from_value::<Episodes<T>>(Value::Object(frame.header.clone()))
            .map_err(|e| format!("reply header: {e}"))?;
    let got: Vec<(usize, usize)> = episodes.iter().map(&slot_of).collect();
    if got.iter().map(|g| g.0).ne(slots.iter().copied()) {
        return Err(format!(
            "reply for slots {:?}, asked {slots:?}",
            got.iter().map(|g| g.0).collect::<Vec<_>>()
        ));
    }
    let lengths: Vec<usize> = got.iter().map(|g| g.1).collect();
    let observations = split_body(&frame.body, &lengths).ok_or_else(|| {
        format!(
            "observation lengths {lengths:?} do not add up to the body's {} bytes",
            frame.body.len()
        )
    })?;
    Ok((episodes, observations))
}

struct Episode {
    task: usize,
    worker: usize,
    slot: usize,
    instruction: String,
    key: Option<String>,
    /// The text of its last observation (an env that observes text).
    text: Option<String>,
    running: bool,
    /// Why it ended before its first decision (its environment could not
    /// be started or reset).
    failure: Option<String>,
}

/// `G` copies of each Gymnasium task, stepped by a [`Pool`] (module doc).
pub struct GymEpisodes {
    pool: Pool,
    tasks: Vec<GymTask>,
    info: AdapterInfo,
    bins: ActionBins,
    episodes: Vec<Episode>,
    frames: Vec<u8>,
    proprio: Vec<f32>,
    decision: usize,
}

impl GymEpisodes {
    /// `group` copies of each task on a new pool of `config.workers`
    /// workers, reset; `bins` are the policy's (checked against the action
    /// space). Bad input (an unknown adapter or env id, a missing package,
    /// a Python that cannot be started, tasks of different shapes, bins
    /// that do not fit) is an error before any step; an episode whose
    /// environment could not be started or reset is not (module doc).
    pub fn new(
        config: &BridgeConfig,
        tasks: &[GymTask],
        group: usize,
        bins: &ActionBins,
    ) -> Result<GymEpisodes, BridgeError> {
        GymEpisodes::with_pool(Pool::new(config)?, tasks, group, bins)
    }

    /// As [`GymEpisodes::new`] on the workers of `pool` (of an earlier
    /// batch: [`GymEpisodes::into_pool`]), which keep their environments
    /// and fault counts.
    pub fn with_pool(
        mut pool: Pool,
        tasks: &[GymTask],
        group: usize,
        bins: &ActionBins,
    ) -> Result<GymEpisodes, BridgeError> {
        if tasks.is_empty() || group == 0 {
            return Err(BridgeError::Mismatch(format!(
                "{} tasks x {group} copies: need at least one episode",
                tasks.len()
            )));
        }
        let (info, unstarted) = describe(&mut pool, tasks)?;
        info.action
            .check_bins(bins)
            .map_err(|e| BridgeError::Mismatch(format!("the policy's action bins: {e}")))?;
        let n = tasks.len() * group;
        let w_count = pool.len().min(n);
        let mut episodes = Vec::with_capacity(n);
        for e in 0..n {
            let worker = e * w_count / n;
            let first = (worker * n).div_ceil(w_count);
            let failure = unstarted[e / group].clone();
            episodes.push(Episode {
                task: e / group,
                worker,
                slot: e - first,
                instruction: String::new(),
                key: None,
                text: None,
                running: failure.is_none(),
                failure,
            });
        }
        let mut world = GymEpisodes {
            pool,
            tasks: tasks.to_vec(),
            frames: vec![0; n * info.shape.pixel_len()],
            proprio: vec![0.0; n * info.shape.proprio],
            info,
            bins: bins.clone(),
            episodes,
            decision: 0,
        };
        world.reset()?;
        Ok(world)
    }

    /// The environment's shape and action space.
    pub fn info(&self) -> &AdapterInfo {
        &self.info
    }

    /// The workers' faults so far (crashed, hung, malformed, restarts).
    pub fn faults(&self) -> FaultCounts {
        self.pool.faults()
    }

    /// The pool, to host the next batch ([`GymEpisodes::with_pool`]).
    pub fn into_pool(self) -> Pool {
        self.pool
    }

    /// Episodes by worker: `(worker, episode indices)` for each worker
    /// hosting one that `pick` keeps.
    fn by_worker(&self, pick: impl Fn(&Episode) -> bool) -> BTreeMap<usize, Vec<usize>> {
        let mut out: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, e) in self.episodes.iter().enumerate() {
            if pick(e) {
                out.entry(e.worker).or_default().push(i);
            }
        }
        out
    }

    /// Keeps episode `i`'s observation: its bytes decoded into the frames
    /// and proprio, its text (which an env that observes text must send,
    /// and no other may).
    fn store(&mut self, i: usize, bytes: &[u8], text: Option<String>) -> Result<(), String> {
        self.info
            .check_text(text.is_some())
            .map_err(|e| format!("episode {i}'s observation has {e}"))?;
        self.episodes[i].text = text;
        let shape = self.info.shape;
        let (pl, pp) = (shape.pixel_len(), shape.proprio);
        observation::decode_into(
            bytes,
            &shape,
            &mut self.frames[i * pl..(i + 1) * pl],
            &mut self.proprio[i * pp..(i + 1) * pp],
        )
        .map_err(|e| format!("episode {i}'s observation: {e}"))
    }

    /// Resets every episode that started: each worker builds (or reuses)
    /// and resets the environments of its slots, sending progress frames as
    /// it goes. A worker that crashes, stays silent past the timeout (its
    /// start-up patience before its first frame and while it builds an
    /// environment) or sends a malformed reply
    /// is counted, restarted and asked again, [`START_ATTEMPTS`] times in
    /// all; then its episodes fail with the last fault. An episode whose
    /// environment raised fails alone.
    fn reset(&mut self) -> Result<(), BridgeError> {
        let mut pending = self.by_worker(|e| e.failure.is_none());
        for attempt in 1..=START_ATTEMPTS {
            for (&w, members) in &pending {
                self.send_reset(w, members)?;
            }
            let mut again = BTreeMap::new();
            for (w, members) in pending {
                let name = self.pool.worker(w)?.name();
                let Err(fault) = self.read_reset(w, &members)? else {
                    continue;
                };
                self.pool.fault(w, &fault);
                if attempt == START_ATTEMPTS {
                    let deadline = crate::missed_deadline(&self.pool.config, &fault);
                    let reason = format!(
                        "{name} {fault} in reset, the last of {START_ATTEMPTS} attempts{deadline}; killed and restarted"
                    );
                    for &i in &members {
                        self.episodes[i].running = false;
                        self.episodes[i].failure = Some(reason.clone());
                    }
                } else {
                    again.insert(w, members);
                }
            }
            pending = again;
        }
        Ok(())
    }

    fn send_reset(&mut self, w: usize, members: &[usize]) -> Result<(), BridgeError> {
        let items: Vec<Value> = members
            .iter()
            .map(|&i| {
                let e = &self.episodes[i];
                let spec = &self.tasks[e.task].spec;
                json!({"slot": e.slot, "spec": spec.to_json(), "seed": spec.seed})
            })
            .collect();
        self.pool
            .worker(w)?
            .send(&json!({"op": "reset", "episodes": items}));
        Ok(())
    }

    /// Worker `w`'s reply to `reset` for `members`: `Ok(Err(fault))` when
    /// the worker failed (the caller restarts it), `Err` when it refused.
    fn read_reset(
        &mut self,
        w: usize,
        members: &[usize],
    ) -> Result<Result<(), Fault>, BridgeError> {
        let (timeout, start) = (self.pool.config.timeout, self.pool.config.startup_timeout);
        let worker = self.pool.worker(w)?;
        let name = worker.name();
        let frame = match worker.receive_patiently(timeout, start) {
            Ok(Reply::Done(frame)) => frame,
            Ok(Reply::Refused { bad_input, message }) => {
                return Err(BridgeError::Refused {
                    worker: worker.name(),
                    request: "reset".into(),
                    message,
                    bad_input,
                });
            }
            Err(fault) => return Ok(Err(fault)),
        };
        let slots: Vec<usize> = members.iter().map(|&i| self.episodes[i].slot).collect();
        let parsed = reply_episodes::<ResetEpisode>(&frame, &slots, |r| (r.slot, r.obs_len))
            .and_then(|(replies, observations)| {
                for ((&i, reply), bytes) in members.iter().zip(replies).zip(observations) {
                    if let Some(error) = reply.error {
                        let e = &mut self.episodes[i];
                        e.running = false;
                        e.failure = Some(format!("{name}: {error}"));
                        continue;
                    }
                    self.store(i, bytes, reply.text)?;
                    let e = &mut self.episodes[i];
                    e.instruction = reply.instruction;
                    e.key = Some(reply.key);
                    e.running = true;
                }
                Ok(())
            });
        Ok(parsed.map_err(Fault::Malformed))
    }

    /// The JSON actions of episode `i`'s chunk of `k`.
    fn chunk_json(&self, i: usize, actions: &[f32], k: usize) -> Value {
        let d = self.info.action.dim();
        let chunk = &actions[i * k * d..(i + 1) * k * d];
        let values: Vec<Value> = chunk
            .chunks_exact(d)
            .map(|a| match self.info.action {
                ActionSpace::Discrete { n } => {
                    let bin = self.bins.encode(a).map(|b| b[0] as usize).unwrap_or(0);
                    json!(bin.min(n - 1))
                }
                ActionSpace::Box { .. } => json!(a),
            })
            .collect();
        json!({"slot": self.episodes[i].slot, "actions": values})
    }

    fn fail(&mut self, members: &[usize], reason: &str, reports: &mut [ChunkReport]) {
        for &i in members {
            self.episodes[i].running = false;
            reports[i] = ChunkReport {
                env_steps: 0,
                done: true,
                success: false,
                failure: Some(reason.to_string()),
            };
        }
    }

    /// Reads worker `w`'s reply to `step_chunk` for `members` into `reports`.
    fn read_step(
        &mut self,
        frame: &Frame,
        members: &[usize],
        k: usize,
        (name, decision): (&str, usize),
        reports: &mut [ChunkReport],
    ) -> Result<(), String> {
        let slots: Vec<usize> = members.iter().map(|&i| self.episodes[i].slot).collect();
        let (replies, observations) =
            reply_episodes::<StepEpisode>(frame, &slots, |r| (r.slot, r.obs_len))?;
        for (&i, reply) in members.iter().zip(&replies) {
            if reply.steps as usize > k {
                return Err(format!(
                    "episode {i}: {} steps for a chunk of {k}",
                    reply.steps
                ));
            }
            if reply.error.is_none() && !reply.done && (reply.steps as usize) < k {
                return Err(format!(
                    "episode {i}: {} steps of a chunk of {k} and not done",
                    reply.steps
                ));
            }
        }
        for ((&i, reply), bytes) in members.iter().zip(replies).zip(observations) {
            if let Some(error) = reply.error {
                let reason = format!("{name}, decision {decision}: {error}");
                self.episodes[i].running = false;
                reports[i] = ChunkReport {
                    env_steps: reply.steps,
                    done: true,
                    success: false,
                    failure: Some(reason),
                };
                continue;
            }
            self.store(i, bytes, reply.text)?;
            let e = &mut self.episodes[i];
            e.key = Some(reply.key);
            e.running = !reply.done;
            reports[i] = ChunkReport {
                env_steps: reply.steps,
                done: reply.done,
                success: reply.success,
                failure: None,
            };
        }
        Ok(())
    }
}

/// The one shape and action space of every task's environment (a `hello`
/// to worker 0 per distinct adapter, env id and kwargs the pool has not
/// seen), and for each task why it cannot start (`None`: it can): a worker
/// that died saying hello [`START_ATTEMPTS`] times, an environment that
/// raised while it was built. Bad input (a refusal naming the request),
/// tasks of different shapes, and no task that can start (in a pool that
/// never described one) are errors.
pub(crate) fn describe(
    pool: &mut Pool,
    tasks: &[GymTask],
) -> Result<(AdapterInfo, Vec<Option<String>>), BridgeError> {
    let mut first: Option<(&GymTask, AdapterInfo)> = None;
    let mut unstartable: Option<BridgeError> = None;
    let mut outcomes: Vec<((&str, &str, &Value), Option<String>)> = Vec::new();
    let mut unstarted = Vec::with_capacity(tasks.len());
    for task in tasks {
        let spec: &GymTaskSpec = &task.spec;
        let key = (spec.adapter.as_str(), spec.env_id.as_str(), &spec.kwargs);
        if let Some((_, outcome)) = outcomes.iter().find(|(k, _)| *k == key) {
            unstarted.push(outcome.clone());
            continue;
        }
        let known = pool
            .infos
            .iter()
            .find(|(a, e, k, _)| (a.as_str(), e.as_str(), k) == (key.0, key.1, key.2));
        let info = match known {
            Some((.., info)) => info.clone(),
            None => match crate::hello(pool, 0, spec) {
                Ok(info) => {
                    let entry = (spec.adapter.clone(), spec.env_id.clone());
                    pool.infos
                        .push((entry.0, entry.1, spec.kwargs.clone(), info.clone()));
                    info
                }
                Err(
                    e @ (BridgeError::Startup { .. }
                    | BridgeError::Refused {
                        bad_input: false, ..
                    }),
                ) => {
                    let reason = e.to_string();
                    outcomes.push((key, Some(reason.clone())));
                    unstarted.push(Some(reason));
                    unstartable.get_or_insert(e);
                    continue;
                }
                Err(e) => return Err(e),
            },
        };
        outcomes.push((key, None));
        unstarted.push(None);
        let observed = |info: &AdapterInfo| {
            let text = if info.text > 0 { " and text" } else { "" };
            format!("observes {}{text} and acts in {}", info.shape, info.action)
        };
        match &mut first {
            None => first = Some((task, info)),
            Some((t0, i0))
                if i0.shape != info.shape
                    || i0.images != info.images
                    || i0.action != info.action
                    || (i0.text > 0) != (info.text > 0) =>
            {
                return Err(BridgeError::Mismatch(format!(
                    "task `{}` ({} {}) {}, task `{}` ({} {}) {}: one batch takes one observation shape and action space",
                    t0.task_id,
                    t0.spec.adapter,
                    t0.spec.env_id,
                    observed(i0),
                    task.task_id,
                    spec.adapter,
                    spec.env_id,
                    observed(&info),
                )));
            }
            // The longest text of any task's env bounds the batch's.
            Some((_, i0)) => i0.text = i0.text.max(info.text),
        }
    }
    // No task can start: the episodes of an earlier batch (the same
    // policy's) tell their shape, else there is none to run.
    let info = match (first, pool.infos.first(), unstartable) {
        (Some((_, info)), ..) => info,
        (None, Some((.., info)), _) => info.clone(),
        (None, None, Some(e)) => return Err(e),
        (None, None, None) => unreachable!("every task is described or unstartable"),
    };
    Ok((info, unstarted))
}

/// A batch the registry hands a stage: its workers serve the stage's next
/// batch of bridge tasks, and their fault counts go to its summary.
impl WorldEpisodes for GymEpisodes {
    fn finish(self: Box<Self>, kept: &mut Kept) {
        kept.faults = Some(self.faults().to_string());
        kept.state = Some(Box::new(self.into_pool()));
    }
}

impl ClosedLoopWorld for GymEpisodes {
    fn len(&self) -> usize {
        self.episodes.len()
    }

    fn observation_shape(&self) -> ObservationShape {
        self.info.shape
    }

    fn image_names(&self) -> &[String] {
        &self.info.images
    }

    fn action_dim(&self) -> usize {
        self.info.action.dim()
    }

    fn task_id(&self, i: usize) -> &str {
        &self.tasks[self.episodes[i].task].task_id
    }

    /// The environment's instruction from the reset (BabyAI's mission), else
    /// the spec's.
    fn instruction(&self, i: usize) -> &str {
        &self.episodes[i].instruction
    }

    fn running(&self, i: usize) -> bool {
        self.episodes[i].running
    }

    /// Nothing to do: the workers' replies to reset and step already hold
    /// the observations, decoded into the buffers.
    fn observe(&mut self) {}

    fn frames(&self) -> &[u8] {
        &self.frames
    }

    fn proprio(&self) -> &[f32] {
        &self.proprio
    }

    fn step_chunks(&mut self, actions: &[f32], k: usize) -> Result<Vec<ChunkReport>, WorldError> {
        let n = self.episodes.len();
        let want = n * k * self.info.action.dim();
        if actions.len() != want || k == 0 {
            return Err(format!(
                "{} action values for {n} episodes x chunks of {k} x {} dimensions (expected {want}, k >= 1)",
                actions.len(),
                self.info.action.dim()
            )
            .into());
        }
        if let Some((at, v)) = actions.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(format!("action value {at} is {v}, expected a finite number").into());
        }
        let decision = self.decision;
        self.decision += 1;
        let mut reports = vec![
            ChunkReport {
                env_steps: 0,
                done: true,
                success: false,
                failure: None,
            };
            n
        ];
        let groups = self.by_worker(|e| e.running);
        let mut sent = Vec::with_capacity(groups.len());
        for (w, members) in groups {
            let items: Vec<Value> = members
                .iter()
                .map(|&i| self.chunk_json(i, actions, k))
                .collect();
            match self.pool.worker(w) {
                Ok(worker) => {
                    worker.send(&json!({"op": "step_chunk", "episodes": items}));
                    sent.push((w, members, worker.name()));
                }
                Err(e) => {
                    let reason =
                        format!("worker {w} could not be restarted at decision {decision}: {e}");
                    self.fail(&members, &reason, &mut reports);
                }
            }
        }
        let timeout = self.pool.config.timeout;
        for (w, members, name) in sent {
            let reply = self.pool.worker(w).map(|worker| worker.receive(timeout));
            let fault = match reply {
                Ok(Ok(Reply::Done(frame))) => {
                    match self.read_step(&frame, &members, k, (&name, decision), &mut reports) {
                        Ok(()) => continue,
                        Err(what) => Fault::Malformed(what),
                    }
                }
                Ok(Ok(Reply::Refused { message, .. })) => {
                    let reason =
                        format!("{name} refused step_chunk at decision {decision}: {message}");
                    self.fail(&members, &reason, &mut reports);
                    continue;
                }
                Ok(Err(fault)) => fault,
                Err(e) => Fault::Crashed(e.to_string()),
            };
            let deadline = crate::missed_deadline(&self.pool.config, &fault);
            let reason =
                format!("{name} {fault} at decision {decision}{deadline}; killed and restarted");
            self.pool.fault(w, &fault);
            self.fail(&members, &reason, &mut reports);
        }
        Ok(reports)
    }

    fn target_ever_grasped(&self, _i: usize) -> Option<bool> {
        None
    }

    fn anchor_key(&self, i: usize) -> Option<String> {
        self.episodes[i].key.clone()
    }

    fn observation_text(&self, i: usize) -> Option<&str> {
        self.episodes[i].text.as_deref()
    }

    fn start_failure(&self, i: usize) -> Option<&str> {
        self.episodes[i].failure.as_deref()
    }
}

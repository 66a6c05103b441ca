//! The adapters' scripted experts, whole episodes at a time
//! ([`expert_demonstrations`]): BabyAI's `BabyAIBot`, Meta-World's
//! `metaworld.policies` for the task, the faulty env's "+1". The worker
//! runs the expert and the environment together (`expert_episode`) and
//! returns each decision's observation (EFOB, before its chunk) and the
//! chunk of `K` actions the expert took (fewer on the last), plus success:
//! demonstrations for supervised warm-up, without a policy in the loop.
//! Tasks are spread over the workers, one episode per worker at a time.
//!
//! ```no_run
//! use embodyflow_gym::{BridgeConfig, GymTask, GymTaskSpec, expert_demonstrations};
//! let spec = GymTaskSpec::new("metaworld", "reach-v3", 1, 200);
//! let tasks = vec![GymTask { task_id: "reach/1".into(), spec }];
//! let demos = expert_demonstrations(&BridgeConfig::default(), &tasks, 8).unwrap();
//! assert!(demos[0].success);
//! ```

use embodyflow_core::observation;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::episodes::Pool;
use crate::protocol::{Frame, split_body};
use crate::worker::{Fault, Reply};
use crate::{ActionSpace, AdapterInfo, BridgeConfig, BridgeError, GymTask};

/// One decision of a demonstration.
#[derive(Clone, Debug, PartialEq)]
pub struct DemonstrationDecision {
    /// The observation before the chunk (EFOB bytes).
    pub observation: Vec<u8>,
    /// The chunk's actions, flattened ([`ActionSpace::dim`] values each: the
    /// index of a discrete action, the values of a box action).
    pub actions: Vec<f32>,
    /// Actions executed (`K`, fewer on the last decision).
    pub env_steps: u32,
    /// The observation's text, for an env that observes text (the
    /// decision's prompt is then
    /// [`embodyflow_world::observed_prompt`]).
    pub text: Option<String>,
}

/// A scripted expert's episode of one task.
#[derive(Clone, Debug, PartialEq)]
pub struct Demonstration {
    /// The task.
    pub task_id: String,
    /// The instruction the environment gave.
    pub instruction: String,
    /// The decisions, in order.
    pub decisions: Vec<DemonstrationDecision>,
    /// Whether the expert succeeded.
    pub success: bool,
    /// Why the episode ended outside the task (its worker crashed, hung or
    /// sent a malformed frame); then `success` is false.
    pub failure: Option<String>,
}

#[derive(Deserialize)]
struct ExpertDecision {
    actions: Vec<Value>,
    obs_len: usize,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct ExpertReply {
    instruction: String,
    success: bool,
    decisions: Vec<ExpertDecision>,
    /// The expert or the environment raised (the demonstration fails).
    #[serde(default)]
    error: Option<String>,
}

fn parse(
    frame: &Frame,
    info: &AdapterInfo,
    chunk_len: usize,
    task_id: &str,
    worker: &str,
) -> Result<Demonstration, String> {
    let reply: ExpertReply = serde_json::from_value(Value::Object(frame.header.clone()))
        .map_err(|e| format!("reply header: {e}"))?;
    if let Some(error) = reply.error {
        return Ok(Demonstration {
            task_id: task_id.to_string(),
            instruction: reply.instruction,
            decisions: Vec::new(),
            success: false,
            failure: Some(format!("{worker}: {error}")),
        });
    }
    let lengths: Vec<usize> = reply.decisions.iter().map(|d| d.obs_len).collect();
    let bodies = split_body(&frame.body, &lengths).ok_or_else(|| {
        format!(
            "observation lengths do not add up to {} bytes",
            frame.body.len()
        )
    })?;
    let dim = info.action.dim();
    let mut decisions = Vec::with_capacity(reply.decisions.len());
    for (d, (decision, bytes)) in reply.decisions.iter().zip(bodies).enumerate() {
        observation::decode(bytes)
            .and_then(|o| o.expect_shape(&info.shape))
            .map_err(|e| format!("decision {d}'s observation: {e}"))?;
        info.check_text(decision.text.is_some())
            .map_err(|e| format!("decision {d}'s observation has {e}"))?;
        if decision.actions.is_empty() || decision.actions.len() > chunk_len {
            return Err(format!(
                "decision {d}: {} actions for chunks of {chunk_len}",
                decision.actions.len()
            ));
        }
        let mut actions = Vec::with_capacity(decision.actions.len() * dim);
        for action in &decision.actions {
            let values: Option<Vec<f32>> = match (&info.action, action) {
                (ActionSpace::Discrete { n }, Value::Number(v)) => v
                    .as_u64()
                    .filter(|&a| (a as usize) < *n)
                    .map(|a| vec![a as f32]),
                (ActionSpace::Box { .. }, Value::Array(values)) => values
                    .iter()
                    .map(|v| v.as_f64().map(|f| f as f32))
                    .collect(),
                _ => None,
            };
            match values {
                Some(values) if values.len() == dim => actions.extend(values),
                _ => {
                    return Err(format!(
                        "decision {d}: action {action} is not of {}",
                        info.action
                    ));
                }
            }
        }
        decisions.push(DemonstrationDecision {
            observation: bytes.to_vec(),
            env_steps: decision.actions.len() as u32,
            actions,
            text: decision.text.clone(),
        });
    }
    Ok(Demonstration {
        task_id: task_id.to_string(),
        instruction: reply.instruction,
        decisions,
        success: reply.success,
        failure: None,
    })
}

/// Each task's scripted-expert episode in chunks of `chunk_len` actions, on
/// `config.workers` workers. Tasks without an expert (the generic adapter),
/// of different shapes, or of an unknown adapter or env id are bad input; a
/// worker fault, or an expert or environment that raises, ends that task's
/// demonstration as a failure with its reason (a faulty worker is
/// restarted for the next task), as does a worker that keeps dying saying
/// hello ([`crate::START_ATTEMPTS`]). A worker playing an expert episode
/// sends progress frames: it is hung after `config.timeout` without any
/// ([`BridgeConfig::build_patience`] before its first frame and while it
/// builds an environment).
pub fn expert_demonstrations(
    config: &BridgeConfig,
    tasks: &[GymTask],
    chunk_len: usize,
) -> Result<Vec<Demonstration>, BridgeError> {
    if tasks.is_empty() || chunk_len == 0 {
        return Err(BridgeError::Mismatch(format!(
            "{} tasks in chunks of {chunk_len}: need a task and chunks of at least 1",
            tasks.len()
        )));
    }
    let workers = config.workers.clamp(1, tasks.len());
    let mut pool = Pool::new(&BridgeConfig {
        workers,
        ..config.clone()
    })?;
    let (info, unstarted) = crate::episodes::describe(&mut pool, tasks)?;
    if !info.expert {
        return Err(BridgeError::Mismatch(format!(
            "task `{}`: adapter `{}` has no scripted expert",
            tasks[0].task_id, tasks[0].spec.adapter
        )));
    }
    let (timeout, start) = (config.timeout, config.startup_timeout);
    let failed = |task: &GymTask, failure: String| Demonstration {
        task_id: task.task_id.clone(),
        instruction: String::new(),
        decisions: Vec::new(),
        success: false,
        failure: Some(failure),
    };
    // The demonstrations in task order: those of tasks that cannot start
    // now, the others as their waves end.
    let mut out: Vec<Option<Demonstration>> = Vec::with_capacity(tasks.len());
    for (task, why) in tasks.iter().zip(&unstarted) {
        out.push(why.clone().map(|why| failed(task, why)));
    }
    let ready: Vec<usize> = (0..tasks.len()).filter(|&t| out[t].is_none()).collect();
    for wave in ready.chunks(workers) {
        for (w, &t) in wave.iter().enumerate() {
            let spec = &tasks[t].spec;
            let request = json!({
                "op": "expert_episode", "spec": spec.to_json(),
                "seed": spec.seed, "k": chunk_len,
            });
            pool.worker(w)?.send(&request);
        }
        for (w, &t) in wave.iter().enumerate() {
            let task = &tasks[t];
            let worker = pool.worker(w)?;
            let name = worker.name();
            let fault = match worker.receive_patiently(timeout, start) {
                Ok(Reply::Done(frame)) => {
                    match parse(&frame, &info, chunk_len, &task.task_id, &name) {
                        Ok(demo) => {
                            out[t] = Some(demo);
                            continue;
                        }
                        Err(what) => Fault::Malformed(what),
                    }
                }
                Ok(Reply::Refused {
                    bad_input: false,
                    message,
                }) => {
                    out[t] = Some(failed(task, format!("{name}: {message}")));
                    continue;
                }
                Ok(Reply::Refused { message, .. }) => {
                    return Err(BridgeError::Refused {
                        worker: name,
                        request: format!("expert_episode (task `{}`)", task.task_id),
                        message,
                        bad_input: true,
                    });
                }
                Err(fault) => fault,
            };
            pool.fault(w, &fault);
            let deadline = crate::missed_deadline(pool.config(), &fault);
            let reason =
                format!("{name} {fault} in the expert episode{deadline}; killed and restarted");
            out[t] = Some(failed(task, reason));
        }
    }
    Ok(out
        .into_iter()
        .map(|d| d.expect("every task played or failed"))
        .collect())
}

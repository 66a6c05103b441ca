//! The Ray backend (`pipeline run FILE --out DIR --backend ray`): the steps
//! the cache says must run are handed to an existing Ray cluster as Ray
//! jobs, through the Ray Jobs REST API of its dashboard (`POST /api/jobs/`,
//! `GET /api/jobs/{id}`, `GET /api/jobs/{id}/logs`,
//! `POST /api/jobs/{id}/stop`), at the address `[backend] address` gives
//! (else `$RAY_API_SERVER_ADDRESS`, as Ray's own job CLI reads it).
//!
//! Each process of a step is one job whose entrypoint runs `pipeline task
//! SPEC --index i` in the directory `pipeline` runs in: the very command
//! line the local and Slurm backends run ([`crate::exec::stage_command`]),
//! its log, its task record, and for a step of one process the checks and
//! `_step.json` ([`cluster::task`]). A job asks Ray for the step's `cpus`
//! (`entrypoint_num_cpus`, 1 unless the step says), `gpus`
//! (`entrypoint_num_gpus`; Ray sets `CUDA_VISIBLE_DEVICES` to the GPUs it
//! grants, and a CUDA device becomes `--device cuda`) and `mem`
//! (`entrypoint_memory`). Its stage process computes with as many threads
//! as the step's `cpus` (libtorch's and rayon's pools alike, not every core
//! of the node) and at the runner's libtorch dispatch level
//! ([`crate::cache::process_environment`]), as locally.
//!
//! Ray has no dependencies between jobs, so the runner keeps them: it
//! submits a step's jobs once every step it reads has completed (its
//! `_step.json` written), the merge job of a sharded step (`pipeline task
//! SPEC --merge`) once each of its shards' jobs has succeeded, and never
//! the jobs of a step whose input failed (reported "not run"). The runner
//! must therefore stay up until the run ends; a runner stopped midway
//! leaves the submitted jobs running, and a resumed run submits what is
//! missing once they are over (or `pipeline cancel OUT` stopped them).
//!
//! The wait, the progress lines, the failure reports (a task's exit code
//! and log tail; for a job that ended without one, Ray's log of it, saved as
//! `OUT/_runner/ray/<step>/ray-<i>.out`), the journal
//! `OUT/_runner/ray/jobs.jsonl` and the queue figures are shared with the
//! Slurm backend ([`crate::cluster`]). Bad input before anything is
//! submitted (exit 2): no address, an address that does not answer as a Ray
//! dashboard, a step asking for more CPUs, memory or GPUs than any alive
//! node has, a path outside `[backend] shared` (every node must see the run
//! directory, the inputs and the binaries), jobs of an earlier submission
//! still running.
//!
//! ```toml
//! [backend]
//! kind = "ray"
//! address = "http://head:8265"      # the dashboard (ray start --head --include-dashboard true)
//! shared = ["/shared/me"]
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::json;

use embodyflow_core::config::{ConfigKeys, keys_of};

use crate::backend::Table;
use crate::cluster::journal::{Journal, bad, jobs_file, now, read_jobs, step_dir};
use crate::cluster::nodes::{Node, check_fits, check_shared};
use crate::cluster::task::quote;
use crate::cluster::{self, Backend, JobEntry, JobState, Lost, Queue, Run, Submitted};
use crate::error::{Result, RunnerError};
use crate::exec::{RunOptions, RunOutcome};
use crate::plan::{Instance, Plan};

/// `OUT/_runner/ray`.
const NAME: &str = "ray";

/// Where the address comes from when `[backend]` has none (Ray's job CLI
/// reads it too).
const ADDRESS_VAR: &str = "RAY_API_SERVER_ADDRESS";

/// How long `pipeline cancel` waits for stopped jobs to end.
const STOP_WAIT: Duration = Duration::from_secs(30);

/// The `[backend]` keys Ray reads.
#[derive(Debug, Clone, Default, Deserialize, ConfigKeys)]
struct Settings {
    /// The Ray dashboard's HTTP address (`http://head:8265`; default:
    /// `$RAY_API_SERVER_ADDRESS`).
    address: Option<String>,
}

/// The Ray backend, as the registry lists it.
pub struct RayCluster;

/// The Ray backend.
pub static RAY: RayCluster = RayCluster;

impl Backend for RayCluster {
    fn name(&self) -> &'static str {
        NAME
    }

    fn title(&self) -> &'static str {
        "Ray"
    }

    fn about(&self) -> &'static str {
        "A Ray cluster: one Ray job per process of a step"
    }

    fn keys(&self) -> Vec<(String, &'static str)> {
        keys_of::<Settings>()
    }

    fn check(&self, table: &Table) -> std::result::Result<(), String> {
        table.settings::<Settings>().map(|_| ())
    }

    fn queued(&self) -> bool {
        true
    }

    /// Submits the steps that must run as Ray jobs and waits for them.
    fn run_plan(&self, run: &Run, say: &mut dyn FnMut(&str)) -> Result<RunOutcome> {
        let settings: Settings = run.table.settings().map_err(bad)?;
        let address = address(run.plan, &settings)?;
        let started_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let mut queue = Ray {
            table: run.table,
            client: Client::new(&address),
            cwd: std::env::current_dir().map_err(|e| RunnerError::io(".", e))?,
            exe: std::env::current_exe().map_err(|e| RunnerError::io("pipeline", e))?,
            journal: Journal::new(&run.plan.out, NAME),
            stamp: format!("{started_ms:x}"),
            seen: BTreeMap::new(),
        };
        cluster::run_plan(run, self, &mut queue, say)
    }

    fn live_jobs(&self, out: &Path) -> Result<Vec<JobEntry>> {
        live_jobs(out)
    }

    fn cancel(&self, out: &Path) -> Result<Vec<String>> {
        cancel(out)
    }
}

/// The dashboard's address as `http://host:port`, from `[backend] address`
/// or `$RAY_API_SERVER_ADDRESS`.
fn address(plan: &Plan, backend: &Settings) -> Result<String> {
    let from_env = std::env::var(ADDRESS_VAR)
        .ok()
        .filter(|a| !a.trim().is_empty());
    let (raw, from) = match (&backend.address, from_env) {
        (Some(address), _) => (address.clone(), "[backend] address"),
        (None, Some(address)) => (address, ADDRESS_VAR),
        (None, None) => {
            return Err(bad(format!(
                "{}: the Ray backend needs the address of the Ray cluster's dashboard: [backend] address = \"http://head:8265\", or {ADDRESS_VAR}",
                plan.file.display()
            )));
        }
    };
    normalise(&raw).map_err(|why| bad(format!("{}: {from} `{raw}`: {why}", plan.file.display())))
}

/// `head:8265` → `http://head:8265`; refuses what is not a plain HTTP
/// address of a dashboard.
fn normalise(raw: &str) -> std::result::Result<String, String> {
    let text = raw.trim().trim_end_matches('/');
    let rest = match text.split_once("://") {
        None => text,
        Some(("http", rest)) => rest,
        Some(("https", _)) => {
            return Err(
                "HTTPS is not supported: the runner speaks plain HTTP to the dashboard (reach it through an SSH tunnel or a proxy on this machine)".into(),
            );
        }
        Some((scheme, _)) => {
            return Err(format!(
                "`{scheme}://` is not the dashboard's HTTP address (Ray Client and GCS addresses are not job servers); expected http://HOST:PORT, by default port 8265"
            ));
        }
    };
    if rest.is_empty() || rest.contains('/') {
        return Err("expected http://HOST:PORT".into());
    }
    Ok(format!("http://{rest}"))
}

/// A Ray job's state as `GET /api/jobs/{id}` gives it.
#[derive(Debug, Clone, Deserialize)]
struct JobInfo {
    /// `PENDING`, `RUNNING`, `STOPPED`, `SUCCEEDED` or `FAILED`.
    status: String,
    #[serde(default)]
    message: Option<String>,
}

impl JobInfo {
    fn over(&self) -> bool {
        !matches!(self.status.as_str(), "PENDING" | "RUNNING")
    }
}

/// The dashboard's HTTP API.
struct Client {
    address: String,
    agent: ureq::Agent,
}

impl Client {
    fn new(address: &str) -> Client {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_connect(Some(Duration::from_secs(5)))
            .timeout_global(Some(Duration::from_secs(60)))
            .http_status_as_error(false)
            .build()
            .into();
        Client {
            address: address.to_string(),
            agent,
        }
    }

    /// `GET` (`body` none) or `POST` of `path`; the status and the body, or
    /// why there is no answer.
    fn call(&self, path: &str, post: Option<String>) -> std::result::Result<(u16, String), String> {
        let url = format!("{}{path}", self.address);
        let response = match &post {
            None => self.agent.get(&url).call(),
            Some(body) => self
                .agent
                .post(&url)
                .header("Content-Type", "application/json")
                .send(body.as_str()),
        };
        let what = if post.is_some() { "POST" } else { "GET" };
        let mut response = response.map_err(|e| format!("{what} {url}: {e}"))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|e| format!("{what} {url}: reading the answer: {e}"))?;
        Ok((status, text))
    }

    /// A job's state; `None` when the cluster does not know it.
    fn job(&self, id: &str) -> std::result::Result<Option<JobInfo>, String> {
        match self.call(&format!("/api/jobs/{id}"), None)? {
            (200, text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| format!("job {id}: an answer that is not a job ({e}): {text}")),
            (404, _) => Ok(None),
            (status, text) => Err(format!("job {id}: HTTP {status}: {}", text.trim())),
        }
    }

    /// Asks Ray to stop a job (a job it does not know is over already).
    fn stop(&self, id: &str) -> std::result::Result<(), String> {
        match self.call(&format!("/api/jobs/{id}/stop"), Some(String::new()))? {
            (200 | 404, _) => Ok(()),
            (status, text) => Err(format!("stopping job {id}: HTTP {status}: {}", text.trim())),
        }
    }

    /// The alive nodes and what each has.
    fn nodes(&self) -> std::result::Result<Vec<Node>, String> {
        let (status, text) = self.call("/api/v0/nodes?limit=10000", None)?;
        if status != 200 {
            return Err(format!("listing the nodes: HTTP {status}: {}", text.trim()));
        }
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| format!("listing the nodes: not JSON ({e})"))?;
        let nodes = value["data"]["result"]["result"]
            .as_array()
            .ok_or_else(|| format!("listing the nodes: no data.result.result in {text}"))?;
        Ok(nodes
            .iter()
            .filter(|n| n["state"] == "ALIVE")
            .map(|n| {
                let total = &n["resources_total"];
                let amount = |key: &str| total[key].as_f64().unwrap_or(0.0);
                Node {
                    name: n["node_name"]
                        .as_str()
                        .or(n["node_ip"].as_str())
                        .unwrap_or("?")
                        .to_string(),
                    cpus: amount("CPU") as u32,
                    mem_mb: (amount("memory") / (1024.0 * 1024.0)) as u64,
                    gpus: amount("GPU") as u32,
                }
            })
            .collect())
    }
}

/// A name Ray can use in a submission id and a log file's name.
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The Ray side of the shared wait.
struct Ray<'a> {
    table: &'a Table,
    client: Client,
    cwd: PathBuf,
    exe: PathBuf,
    journal: Journal,
    /// Makes this run's submission ids unique on the cluster.
    stamp: String,
    /// The last state seen of each job.
    seen: BTreeMap<String, JobInfo>,
}

impl Ray<'_> {
    /// The shell command of a job: `pipeline task` in the directory
    /// `pipeline` runs in, for shard `task` or (none) the merge.
    fn entrypoint(&self, spec: &Path, task: Option<u32>) -> String {
        format!(
            "cd {} && unset EMBODYFLOW_CPUS && exec {} task {} {}",
            quote(&self.cwd.display().to_string()),
            quote(&self.exe.display().to_string()),
            quote(&spec.display().to_string()),
            task.map_or("--merge".to_string(), |i| format!("--index {i}"))
        )
    }

    /// The request that submits shard `task` (none: the merge) of an
    /// instance, without its submission id.
    fn request(&self, instance: &Instance, spec: &Path, task: Option<u32>) -> serde_json::Value {
        let r = &instance.resources;
        let mut body = json!({
            "entrypoint": self.entrypoint(spec, task),
            "entrypoint_num_cpus": if task.is_some() { r.cpus_or_default() } else { 1 },
            "entrypoint_num_gpus": if task.is_some() { r.gpus } else { 0 },
        });
        if let Some(mem) = r.mem_mb {
            body["entrypoint_memory"] = json!(mem * 1024 * 1024);
        }
        body
    }

    /// Submits one job and appends it to `jobs.jsonl`.
    fn submit(
        &mut self,
        plan: &Plan,
        instance: &Instance,
        spec: &Path,
        task: Option<u32>,
        after: Vec<String>,
    ) -> Result<String> {
        let id = format!(
            "{}-{}-{}-{}",
            clean(&plan.name),
            clean(&instance.id),
            task.map_or("merge".to_string(), |i| i.to_string()),
            self.stamp
        );
        let mut body = self.request(instance, spec, task);
        body["submission_id"] = json!(id);
        body["metadata"] = json!({
            "pipeline": plan.name,
            "step": instance.id,
            "run": plan.out.display().to_string(),
        });
        let submitted_unix = now();
        let failed = |message: String| RunnerError::Cluster {
            backend: "Ray",
            message: format!("submitting step `{}`: {message}", instance.id),
        };
        match self.client.call("/api/jobs/", Some(body.to_string())) {
            Ok((200, _)) => {}
            Ok((status, text)) => return Err(failed(format!("HTTP {status}: {}", text.trim()))),
            Err(e) => return Err(failed(e)),
        }
        self.journal.append(&JobEntry {
            job: id.clone(),
            instance: instance.id.clone(),
            kind: if task.is_some() { "stage" } else { "merge" }.into(),
            tasks: 1,
            first: task.unwrap_or(0),
            after,
            submitted_unix,
            address: Some(self.client.address.clone()),
        })?;
        Ok(id)
    }

    fn succeeded(&self, job: &str) -> bool {
        self.seen.get(job).is_some_and(|j| j.status == "SUCCEEDED")
    }
}

impl Queue for Ray<'_> {
    fn submits_when_ready(&self) -> bool {
        true
    }

    fn preflight(&mut self, plan: &Plan, options: &RunOptions, exe: &Path) -> Result<()> {
        let address = &self.client.address;
        let unreachable = |why: String| {
            bad(format!(
                "cannot reach the Ray cluster's dashboard at {address} ({why}): start the head with it (ray start --head --include-dashboard true), or correct [backend] address / {ADDRESS_VAR}"
            ))
        };
        match self.client.call("/api/version", None) {
            Ok((200, text)) if text.contains("ray_version") => {}
            Ok((status, text)) => {
                return Err(unreachable(format!(
                    "GET /api/version answered HTTP {status}, not a Ray job server: {}",
                    text.trim().chars().take(200).collect::<String>()
                )));
            }
            Err(e) => return Err(unreachable(e)),
        }
        let nodes = self.client.nodes().map_err(unreachable)?;
        check_fits(plan, &nodes, &format!("the Ray cluster at {address}"))?;
        check_shared(plan, self.table, options, exe, "Ray")
    }

    fn describe(&self, _plan: &Plan, instance: &Instance, after: &[String]) -> String {
        let mut request = self.request(instance, Path::new("SPEC"), Some(0));
        request
            .as_object_mut()
            .expect("an object")
            .remove("entrypoint");
        format!(
            "  ray job {}{}{}",
            request,
            if instance.shards > 1 {
                format!(
                    " × {} shards (and a merge job once they succeed)",
                    instance.shards
                )
            } else {
                String::new()
            },
            if after.is_empty() {
                String::new()
            } else {
                format!(", submitted once {} completed", after.join(", "))
            }
        )
    }

    /// Submits the jobs of every instance whose inputs have completed, and
    /// the merge job of every sharded instance whose shards succeeded.
    fn advance(&mut self, plan: &Plan, submitted: &mut [Submitted]) -> Result<Vec<usize>> {
        let position: BTreeMap<usize, usize> = submitted
            .iter()
            .enumerate()
            .map(|(k, s)| (s.index, k))
            .collect();
        let mut new = Vec::new();
        for k in 0..submitted.len() {
            let s = &submitted[k];
            if s.state.finished() {
                continue;
            }
            let instance = &plan.instances[s.index];
            let spec = s.spec.clone();
            if s.jobs.is_empty() {
                let completed = instance.deps.iter().all(|d| {
                    !position.contains_key(d)
                        || plan.instances[*d]
                            .dir
                            .join(crate::cache::STEP_FILE)
                            .is_file()
                });
                if !completed {
                    continue;
                }
                let after: Vec<String> = instance
                    .deps
                    .iter()
                    .filter_map(|d| submitted[*position.get(d)?].jobs.last().cloned())
                    .collect();
                submitted[k].submitted_unix = now();
                for i in 0..instance.shards {
                    let job = self.submit(plan, instance, &spec, Some(i), after.clone())?;
                    submitted[k].jobs.push(job);
                }
                submitted[k].label = format!(
                    "job{} {}",
                    if instance.shards > 1 { "s" } else { "" },
                    submitted[k].jobs.join(", ")
                );
                new.push(k);
            } else if instance.shards > 1
                && s.jobs.len() == instance.shards as usize
                && s.jobs.iter().all(|j| self.succeeded(j))
            {
                let shards = s.jobs.clone();
                let merge = self.submit(plan, instance, &spec, None, shards)?;
                submitted[k].label.push_str(&format!(" + merge {merge}"));
                submitted[k].jobs.push(merge);
            }
        }
        Ok(new)
    }

    fn live(
        &mut self,
        ids: &[String],
    ) -> std::result::Result<BTreeMap<String, Vec<JobState>>, String> {
        let mut live = BTreeMap::new();
        for id in ids {
            if self.seen.get(id).is_some_and(JobInfo::over) {
                continue;
            }
            let info = self.client.job(id)?.unwrap_or_else(|| JobInfo {
                status: "UNKNOWN".into(),
                message: Some("the cluster does not know the job (was it restarted?)".into()),
            });
            match info.status.as_str() {
                "PENDING" => {
                    live.insert(id.clone(), vec![JobState::Queued]);
                }
                "RUNNING" => {
                    live.insert(id.clone(), vec![JobState::Running]);
                }
                _ => {}
            }
            self.seen.insert(id.clone(), info);
        }
        Ok(live)
    }

    /// Ray's state and log of the job, the log saved beside the task
    /// records.
    fn lost(
        &mut self,
        out: &Path,
        instance: &Instance,
        jobs: &[String],
        task: Option<u32>,
    ) -> Lost {
        let job = match task {
            Some(i) if instance.shards > 1 => jobs.get(i as usize),
            Some(_) => jobs.first(),
            None => jobs.last(),
        }
        .cloned()
        .unwrap_or_default();
        let log = step_dir(out, NAME, instance).join(format!(
            "ray-{}.out",
            task.map_or("merge".to_string(), |i| i.to_string())
        ));
        let text = match self.client.call(&format!("/api/jobs/{job}/logs"), None) {
            Ok((200, text)) => serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v["logs"].as_str().map(str::to_string))
                .unwrap_or(text),
            Ok((status, text)) => format!("(Ray's log: HTTP {status}: {text})"),
            Err(e) => format!("(Ray's log: {e})"),
        };
        let _ = std::fs::write(&log, text);
        let state = self.seen.get(&job).map_or("gone".to_string(), |info| {
            let message = info
                .message
                .as_deref()
                .and_then(|m| m.lines().next())
                .unwrap_or_default();
            format!(
                "{}{}{message}",
                info.status,
                if message.is_empty() { "" } else { ": " }
            )
        });
        Lost {
            job,
            what: match task {
                Some(_) => format!("ended without an exit status (Ray: {state})"),
                None => format!("Ray: {state}"),
            },
            log,
        }
    }

    fn cancel(&mut self, ids: &[String]) -> std::result::Result<(), String> {
        let errors: Vec<String> = ids
            .iter()
            .filter(|id| !self.seen.get(*id).is_some_and(JobInfo::over))
            .filter_map(|id| self.client.stop(id).err())
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }
}

/// The jobs of `out`'s earlier Ray submissions that are not over. A
/// cluster that does not answer has none: Ray jobs end with their cluster.
fn live_jobs(out: &Path) -> Result<Vec<JobEntry>> {
    let entries = read_jobs(out, NAME)?;
    let mut clients: BTreeMap<String, Option<Client>> = BTreeMap::new();
    let mut live = Vec::new();
    for entry in entries {
        let Some(address) = entry.address.clone() else {
            continue;
        };
        let client = clients.entry(address.clone()).or_insert_with(|| {
            let client = Client::new(&address);
            client.call("/api/version", None).is_ok().then_some(client)
        });
        let Some(client) = client else {
            continue;
        };
        let info = client.job(&entry.job).map_err(|e| {
            bad(format!(
                "{} lists Ray jobs and the cluster at {address} cannot say whether they still run: {e}",
                jobs_file(out, NAME).display()
            ))
        })?;
        if info.is_some_and(|i| !i.over()) {
            live.push(entry);
        }
    }
    Ok(live)
}

/// Stops the run's Ray jobs that are not over and waits until Ray says
/// they are; returns their ids.
fn cancel(out: &Path) -> Result<Vec<String>> {
    let live = live_jobs(out)?;
    let failed = |message: String| RunnerError::Cluster {
        backend: "Ray",
        message,
    };
    for entry in &live {
        let address = entry.address.as_deref().unwrap_or_default();
        Client::new(address).stop(&entry.job).map_err(failed)?;
    }
    let started = Instant::now();
    while !live_jobs(out)?.is_empty() {
        if started.elapsed() >= STOP_WAIT {
            return Err(failed(format!(
                "jobs asked to stop still run after {} s",
                STOP_WAIT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(live.into_iter().map(|e| e.job).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_the_dashboards_plain_http() {
        assert_eq!(
            normalise("http://127.0.0.1:8265/").unwrap(),
            "http://127.0.0.1:8265"
        );
        assert_eq!(normalise("head:8265").unwrap(), "http://head:8265");
        assert!(
            normalise("https://head:8265")
                .unwrap_err()
                .contains("HTTPS")
        );
        assert!(
            normalise("ray://head:10001")
                .unwrap_err()
                .contains("ray://")
        );
        assert!(normalise("http://head:8265/api").is_err());
        assert!(normalise("").is_err());
    }

    #[test]
    fn submission_ids_keep_only_safe_characters() {
        assert_eq!(clean("it0/collect@lr=1e-5,b=2"), "it0_collect_lr_1e-5_b_2");
    }
}

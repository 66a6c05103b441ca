//! `[pipeline] keep_workers = N`: the Gymnasium bridge's workers kept warm
//! across a run's steps. Without it each stage process that drives a
//! bridge environment starts its own workers, and they (with every
//! environment they built) die with it. With it the runner starts `N`
//! served workers ([`embodyflow_gym::served`]) when the first step runs,
//! in `OUT/_runner/workers/` (`<i>.sock`, their output in `<i>.log`),
//! names their sockets, each with the pid of the worker it started there,
//! to every stage process in
//! [`POOL_VAR`](embodyflow_gym::served::POOL_VAR) (a stage takes a socket
//! only when that very process serves it, so it signals no other after a
//! fault), and kills them (with
//! their process groups) when the run ends: at success, at a failed step
//! (the guard drops as the error returns) and when the runner dies (each
//! worker exits, killing its group, once its parent changes: Ctrl-C and
//! `kill -9` included). Before each step a worker that died (a stage killed
//! it after a fault) is started again.
//!
//! A kept worker builds its Python's registered adapters and, besides
//! them, only the `module:function` adapters on its command line, never
//! one a stage names to it. The runner lists there every `module:function`
//! adapter the pipeline's steps name in their resolved config
//! (`gym.adapter`, as `generate-tasks --set gym.adapter=myenvs:make` takes
//! it), each as `--adapter NAME` ([`named_adapters`]): that explicit
//! allow-list lets the steps that play those tasks run on the kept
//! workers. A tasks table from outside the run whose rows name another
//! `module:function` adapter is refused by the kept worker (bad input,
//! naming the adapter and what the worker serves).
//!
//! A stage's bridge takes idle kept workers before it spawns any, so
//! consecutive steps on the same environments build them once
//! (Meta-World's MT1 costs about a second per environment). Results do not
//! change: every episode resets its environment with its own seed, as
//! within one stage. The variable is not part of a step's cache key. The
//! workers run the Python a stage would run without a `bridge.python` key
//! (`$EMBODYFLOW_GYM_PYTHON`, else the workspace's `.venv`); a stage that
//! names another spawns its own. Local backend only: Slurm and Ray run each
//! step's processes on whichever node the cluster picks.
//!
//! ```toml
//! [pipeline]
//! name = "metaworld-grpo"
//! keep_workers = 2          # at least the stages' `bridge.workers`
//! ```

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use embodyflow_gym::BridgeConfig;
use embodyflow_gym::served::{POOL_VAR, ServedWorkers};

use crate::error::{Result, RunnerError};

/// The kept workers of a run, started when a step first needs them.
pub(crate) struct KeptWorkers {
    count: usize,
    /// The `module:function` adapters the workers may build.
    adapters: Vec<String>,
    dir: std::path::PathBuf,
    workers: Option<ServedWorkers>,
}

impl KeptWorkers {
    /// `count` workers for the run directory `out` (none started yet),
    /// allowed the `module:function` adapters `adapters` besides the
    /// registered ones.
    pub(crate) fn new(out: &Path, count: u32, adapters: Vec<String>) -> KeptWorkers {
        KeptWorkers {
            count: count as usize,
            adapters,
            dir: crate::cache::runner_dir(out).join("workers"),
            workers: None,
        }
    }

    /// The environment entry that names the workers' sockets to a stage
    /// process, after starting them (the first time) or starting again
    /// those that died.
    pub(crate) fn env(&mut self) -> Result<(String, String)> {
        let workers = match &mut self.workers {
            Some(workers) => {
                workers.revive().map_err(serve_error)?;
                workers
            }
            None => self.workers.insert(
                ServedWorkers::start(
                    &self.dir,
                    self.count,
                    &BridgeConfig::python(None),
                    &self.adapters,
                )
                .map_err(serve_error)?,
            ),
        };
        Ok((
            POOL_VAR.to_string(),
            workers.sockets_var().to_string_lossy().into_owned(),
        ))
    }

    /// One line on the workers, for the end of the run: their pids and the
    /// environments each built; none when no step started them.
    pub(crate) fn summary(&self) -> Option<String> {
        let workers = self.workers.as_ref()?;
        let each: Vec<String> = match workers.builds(Duration::from_secs(10)) {
            Ok(builds) => builds
                .into_iter()
                .map(|(pid, n)| format!("pid {pid} built {n} environment(s)"))
                .collect(),
            Err(why) => vec![format!("pids {:?}: {why}", workers.pids())],
        };
        Some(format!("kept bridge workers: {}", each.join("; ")))
    }
}

/// The `module:function` adapters the steps' resolved configs name
/// (`gym.adapter`; a registered adapter's plain name needs no listing),
/// each once, sorted.
pub(crate) fn named_adapters(configs: &[Option<serde_json::Value>]) -> Vec<String> {
    configs
        .iter()
        .flatten()
        .filter_map(|config| config.pointer("/gym/adapter")?.as_str())
        .filter(|adapter| adapter.contains(':'))
        .map(str::to_string)
        .collect::<BTreeSet<String>>()
        .into_iter()
        .collect()
}

fn serve_error(e: embodyflow_gym::served::ServeError) -> RunnerError {
    RunnerError::Backend(format!("keep_workers: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_kept_workers_serve_the_module_function_adapters_the_steps_name() {
        let configs = [
            Some(json!({"env": "gym", "gym": {"adapter": "myenvs:make"}})),
            None,
            Some(json!({"env": "gym", "gym": {"adapter": "metaworld"}})),
            Some(json!({"group_size": 2})),
            Some(json!({"gym": {"adapter": "lab.envs:cartpole"}})),
            Some(json!({"gym": {"adapter": "myenvs:make"}})),
            Some(json!({"gym": {"adapter": 3}})),
        ];
        assert_eq!(
            named_adapters(&configs),
            ["lab.envs:cartpole", "myenvs:make"]
        );
        assert!(named_adapters(&[]).is_empty());
    }
}

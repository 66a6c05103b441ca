//! Served workers (a pipeline runner's `keep_workers`) under a stage's
//! pool: consecutive pools take the same processes and reset the
//! environments they built instead of building them again; a served
//! worker that crashes or hangs mid-episode fails exactly its episodes
//! with the reason, as a spawned one, is replaced by a spawned worker for
//! the rest of the pool and started again by `revive`; a socket that does
//! not exist leaves the pool to spawn its own. Needs `.venv` (numpy).

use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use embodyflow_gym::served::{ServedSocket, ServedWorkers};
use embodyflow_gym::{ActionSpace, BridgeConfig, GymEpisodes, GymTask, GymTaskSpec, Pool};
use embodyflow_world::{ChunkReport, ClosedLoopWorld};
use serde_json::json;

/// The tests of this file run one at a time. A worker one test starts is
/// forked with a copy of every descriptor open in this process, another
/// test's `.taken` lock among them; until its exec closes that copy the
/// lock looks held, and a pool made in that moment starts a worker of its
/// own instead of taking the served one (what "build nothing again"
/// checks). Stages sharing a machine run in separate processes.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn config(workers: usize, timeout: Duration) -> BridgeConfig {
    BridgeConfig {
        workers,
        timeout,
        ..BridgeConfig::default()
    }
}

/// Two counter tasks (goal 3), one episode each; the first with `kwargs`.
fn tasks(kwargs: serde_json::Value, built: &Path) -> Vec<GymTask> {
    let mut first = GymTaskSpec::new("faulty", "Counter-v0", 0, 10);
    first.kwargs = kwargs;
    first.kwargs["built"] = json!(built);
    let mut second = GymTaskSpec::new("faulty", "Counter-v0", 1, 10);
    second.kwargs = json!({"built": built});
    [first, second]
        .into_iter()
        .enumerate()
        .map(|(t, spec)| GymTask {
            task_id: format!("count/{t}"),
            spec,
        })
        .collect()
}

/// Plays every episode of a pool of `config.workers` workers over
/// `served` to its end, always moving +1, one step per decision; each
/// episode's last report, and the pool.
fn play(
    config: &BridgeConfig,
    served: Vec<ServedSocket>,
    tasks: &[GymTask],
) -> (Vec<ChunkReport>, Pool) {
    let bins = ActionSpace::Discrete { n: 3 }.bins();
    let pool = Pool::with_served(config, served).unwrap();
    let mut world = GymEpisodes::with_pool(pool, tasks, 1, &bins).unwrap();
    let n = world.len();
    let plus_one = bins.decode(&[1]).unwrap()[0];
    let mut last: Vec<Option<ChunkReport>> = vec![None; n];
    while (0..n).any(|i| world.running(i)) {
        let running: Vec<bool> = (0..n).map(|i| world.running(i)).collect();
        let reports = world.step_chunks(&vec![plus_one; n], 1).unwrap();
        for (i, report) in reports.into_iter().enumerate() {
            if running[i] && report.done {
                last[i] = Some(report);
            }
        }
    }
    let last = last
        .into_iter()
        .map(|r| r.expect("every episode ended"))
        .collect();
    (last, world.into_pool())
}

/// Lines of a file the counter appends to (0 when it does not exist).
fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
}

/// Each served worker's (pid, environments built).
fn census(workers: &ServedWorkers) -> Vec<(u32, u64)> {
    workers.builds(Duration::from_secs(10)).unwrap()
}

#[test]
fn consecutive_pools_take_the_same_served_workers_and_build_nothing_again() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let config = config(2, Duration::from_secs(20));
    let mut workers = ServedWorkers::start(&dir.path().join("w"), 2, &config.python, &[]).unwrap();
    let built = dir.path().join("built");
    let tasks = tasks(json!({}), &built);
    assert_eq!(
        census(&workers),
        vec![(workers.pids()[0], 0), (workers.pids()[1], 0)]
    );
    let (reports, pool) = play(&config, workers.sockets(), &tasks);
    assert!(reports.iter().all(|r| r.success), "{reports:?}");
    drop(pool);
    let first = census(&workers);
    // The processes at the sockets are the ones started.
    let said: Vec<u32> = workers
        .status(Duration::from_secs(10))
        .into_iter()
        .map(|s| s.unwrap().pid)
        .collect();
    assert_eq!(said, workers.pids());
    let builds: u64 = first.iter().map(|&(_, b)| b).sum();
    assert_eq!(
        builds, 2,
        "{first:?}: hello's environment on worker 0, one on worker 1"
    );
    assert_eq!(lines(&built), 2);
    for round in 0..2 {
        let (reports, pool) = play(&config, workers.sockets(), &tasks);
        assert!(
            reports.iter().all(|r| r.success),
            "round {round}: {reports:?}"
        );
        assert_eq!(pool.faults().total(), 0);
        drop(pool);
        assert_eq!(
            census(&workers),
            first,
            "round {round}: the same workers, nothing built"
        );
        assert_eq!(lines(&built), 2, "round {round}");
    }
    assert_eq!(workers.revive().unwrap(), 0, "none died");
}

#[test]
fn a_served_worker_that_dies_or_hangs_mid_episode_fails_its_episodes_and_is_replaced() {
    let _serial = one_at_a_time();
    for (fault, what) in [
        ("crash", "crashed (closed its connection)"),
        ("hang", "hung (no reply within 1.0 s)"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let config = config(2, Duration::from_secs(1));
        let mut workers =
            ServedWorkers::start(&dir.path().join("w"), 2, &config.python, &[]).unwrap();
        let before = workers.pids();
        let built = dir.path().join("built");
        let tasks = tasks(json!({"fault": fault, "at_step": 2}), &built);
        let (reports, pool) = play(&config, workers.sockets(), &tasks);
        let reason = reports[0].failure.as_deref().unwrap_or_default();
        assert!(
            reason.starts_with(&format!("worker 0 (pid {}, served at ", before[0]))
                && reason.contains(what)
                && reason.contains("at decision 1"),
            "{fault}: {reason}"
        );
        assert!(!reports[0].success);
        assert!(
            reports[1].success && reports[1].failure.is_none(),
            "{fault}: {:?}",
            reports[1]
        );
        let faults = pool.faults();
        assert_eq!(
            (faults.total(), faults.restarts),
            (1, 1),
            "{fault}: {faults}"
        );
        drop(pool);
        // Killed with its process group; the other served worker lives on.
        assert_eq!(workers.revive().unwrap(), 1, "{fault}");
        let after = workers.pids();
        assert_ne!(after[0], before[0], "{fault}");
        assert_eq!(after[1], before[1], "{fault}");
        let census = census(&workers);
        assert_eq!(census[0], (after[0], 0), "{fault}: a new worker");
        // The next pool runs clean tasks on both.
        let clean = self::tasks(json!({}), &built);
        let (reports, pool) = play(&config, workers.sockets(), &clean);
        assert!(reports.iter().all(|r| r.success), "{fault}: {reports:?}");
        assert_eq!(pool.faults().total(), 0);
    }
}

#[test]
fn a_socket_that_does_not_exist_leaves_the_pool_to_spawn_its_own() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let config = config(1, Duration::from_secs(20));
    let built = dir.path().join("built");
    let tasks = tasks(json!({}), &built);
    let missing = vec![ServedSocket {
        socket: dir.path().join("no-such.sock"),
        pid: std::process::id(),
    }];
    let (reports, pool) = play(&config, missing, &tasks);
    assert!(reports.iter().all(|r| r.success), "{reports:?}");
    assert_eq!(pool.faults().total(), 0);
}

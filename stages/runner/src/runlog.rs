//! The run log: every completed step's scalars against the global step and
//! the iteration, one file for the whole run, as CSV and as TensorBoard
//! event files, and the same curves as PNGs in the run report.
//!
//! ```text
//! OUT/report/runlog.csv                              cell,iteration,global_step,step,stage,name,value,wall_time
//! OUT/report/tensorboard/<cell>/events.out.tfevents.<unix>.embodyflow   tag = <step>/<name>
//! tensorboard --logdir OUT                           one TensorBoard run per sweep cell
//! ```
//!
//! The global step of a cell counts the optimizer steps its update steps
//! took before the figure, in plan order (SFT's included): an update step's
//! metrics row `k` (0-based, of `n`) is at `G + k + 1`, where `G` counts
//! every earlier row, and every other figure of a step is at the `G` of the
//! policy it measured (a collect step at the steps its policy took, an
//! evaluation after an update at the steps taken with it). Which scalars a
//! step gives follows from what its stage declares it writes
//! ([`embodyflow_core::spec`]):
//!
//! - a `metrics` table: every metrics column per optimizer step (`loss`,
//!   `pg_loss`, `clipfrac`, `clipfrac_lower`, `approx_kl`, `entropy`,
//!   `kl_loss`, `latent_loss`, `end_loss`, `value_loss`, `grad_norm`, `lr`;
//!   a null is no point);
//! - a `trajectories` table: `success` and `samples` of every sample drawn
//!   (its summary's line, dropped groups included), `groups_kept` (its
//!   `groups written`), `samples_per_s` (drawn samples over the step's wall
//!   seconds);
//! - a `rewards` table: `reward_mean`, `reward_std` (population), `success`
//!   and `groups_with_signal` (the share of groups whose scores differ), the
//!   rows of episodes infrastructure ended left out;
//! - an `eval` table: `success`;
//! - `diagnostics.json`: each top-level number (`groups`, `kept_groups`,
//!   `dropped_groups`, `episode_adv_mean`, `episode_adv_std`, …);
//! - every step: `wall_s` and `rows_per_s` (rows of the first table it
//!   writes over its wall seconds).
//!
//! A figure's wall time is its step's finish time (`_step.json`). The CSV
//! and the event files grow as the run goes ([`Live`]): a step's figures are
//! appended when it completes, read from its directory, so `tensorboard
//! --logdir OUT` during a run shows the steps so far, a run killed at any
//! point leaves the log of the steps that finished, and a resumed or cached
//! run writes the same log again (its cached steps first). The PNGs (`curve-<stage>-<name>.png`)
//! put every cell's steps of one stage and one name on one chart against the
//! iteration (setup steps at -1, before RL: SFT's rows and the evaluation of
//! the RL init), an update's rows spread over its iteration; cells that
//! differ only in a variable named `seed` (or ending in `seed`) are one
//! curve, their mean, with the band from the lowest to the highest seed.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::{MetricRow, TableName};
use embodyflow_core::spec::{self, Output};
use embodyflow_plots::Curve;

use crate::cache::{self, StepRecord};
use crate::error::{Result, RunnerError};
use crate::plan::{Instance, Plan};
use crate::tfevents::{EventWriter, Scalar};

/// One figure of the run log.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// The sweep cell's index in the plan.
    pub cell: usize,
    /// The loop iteration (`None`: a setup step).
    pub iteration: Option<u32>,
    /// Optimizer steps taken before the figure (module doc).
    pub global_step: u64,
    /// Where the PNGs draw it: the iteration, setup at -1, an update's row
    /// `k` of `n` at `iteration + k / n`.
    pub x: f64,
    /// The step's name.
    pub step: String,
    /// Its stage.
    pub stage: &'static str,
    /// The scalar's name.
    pub name: String,
    /// Its value.
    pub value: f64,
    /// Unix seconds when the step finished.
    pub wall_time: f64,
}

/// The summary line where a rollout stage counts its kept groups:
/// `| groups written | 1 of 8 wanted (8 trajectories) |`, one per shard.
const GROUPS_WRITTEN: &str = "| groups written | ";

fn groups_kept(dir: &Path, stage: &str) -> Option<f64> {
    let text = std::fs::read_to_string(dir.join(format!("_summary.{stage}.md"))).ok()?;
    let counts: Vec<f64> = text
        .lines()
        .filter_map(|l| l.strip_prefix(GROUPS_WRITTEN))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect();
    (!counts.is_empty()).then(|| counts.iter().sum())
}

/// Mean and population standard deviation.
fn mean_std(values: &[f64]) -> Option<(f64, f64)> {
    if values.is_empty() {
        return None;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    Some((mean, var.sqrt()))
}

fn rewards_figures(dir: &Path) -> Vec<(String, f64)> {
    let Some(rows) = crate::figures::outcome_rewards(dir) else {
        return Vec::new();
    };
    let scores: Vec<f64> = rows.iter().map(|r| f64::from(r.score)).collect();
    let mut figures = Vec::new();
    if let Some((mean, std)) = mean_std(&scores) {
        figures.push(("reward_mean".into(), mean));
        figures.push(("reward_std".into(), std));
        let successes = rows.iter().filter(|r| r.success).count();
        figures.push(("success".into(), successes as f64 / rows.len() as f64));
        let (signal, groups) = crate::figures::groups_with_signal(&rows);
        figures.push(("groups_with_signal".into(), signal as f64 / groups as f64));
    }
    figures
}

/// The top-level numbers of a `diagnostics.json`.
fn diagnostics_figures(dir: &Path) -> Vec<(String, f64)> {
    let Ok(text) = std::fs::read_to_string(dir.join(spec::DIAGNOSTICS_FILE)) else {
        return Vec::new();
    };
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str(&text) else {
        return Vec::new();
    };
    map.iter()
        .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
        .collect()
}

/// The metrics rows of an update step, each column by name (nulls left out).
fn metrics_rows(dir: &Path) -> Vec<Vec<(String, f64)>> {
    let Ok(rows) =
        TableReader::open(dir, TableName::Metrics).and_then(|r| r.read_rows::<MetricRow>())
    else {
        return Vec::new();
    };
    let columns = TableName::Metrics.def().column_names();
    rows.iter()
        .map(|row| {
            let value = serde_json::to_value(row).expect("metric rows serialise");
            columns
                .iter()
                .filter(|c| !["iteration", "update"].contains(c))
                .filter_map(|c| Some((c.to_string(), value.get(*c)?.as_f64()?)))
                .collect()
        })
        .collect()
}

/// The figures of instance `index` in `cell`, measured `global` optimizer
/// steps into the cell (module doc), and the optimizer steps it took (its
/// metrics rows); `None` when it has no record (it did not complete).
fn instance_points(
    plan: &Plan,
    cell: usize,
    index: usize,
    global: u64,
) -> Option<(Vec<Point>, u64)> {
    let instance = &plan.instances[index];
    let record = std::fs::read_to_string(instance.dir.join(cache::STEP_FILE))
        .ok()
        .and_then(|text| serde_json::from_str::<StepRecord>(&text).ok())?;
    let x = instance.iteration.map_or(-1.0, f64::from);
    let point = |name: &str, value: f64, global_step: u64, x: f64| Point {
        cell,
        iteration: instance.iteration,
        global_step,
        x,
        step: instance.step.clone(),
        stage: instance.stage.name,
        name: name.to_string(),
        value,
        wall_time: record.finished_unix as f64,
    };
    let mut points = Vec::new();
    let figures = step_figures(instance, record.wall_s);
    let rows = if writes_metrics(instance) {
        metrics_rows(&instance.dir.join(TableName::Metrics.as_str()))
    } else {
        Vec::new()
    };
    for (k, row) in rows.iter().enumerate() {
        let at = x + k as f64 / rows.len() as f64;
        points.extend(
            row.iter()
                .map(|(name, value)| point(name, *value, global + k as u64 + 1, at)),
        );
    }
    let after = global + rows.len() as u64;
    // An update's own figures (wall time, throughput) describe the
    // policy it wrote; a collect step's the policy it sampled.
    points.extend(
        figures
            .iter()
            .map(|(name, value)| point(name, *value, after, x)),
    );
    Some((points, rows.len() as u64))
}

/// Whether an instance's stage writes a metrics table (its rows move the
/// global step).
fn writes_metrics(instance: &Instance) -> bool {
    instance.stage.writes_table(TableName::Metrics)
}

/// The figures of one cell's completed steps, in plan order.
fn cell_points(plan: &Plan, cell: usize) -> Vec<Point> {
    let mut points = Vec::new();
    let mut global = 0u64;
    for (index, _) in plan
        .instances
        .iter()
        .enumerate()
        .filter(|(_, i)| i.cells.contains(&cell))
    {
        if let Some((mine, rows)) = instance_points(plan, cell, index, global) {
            points.extend(mine);
            global += rows;
        }
    }
    points
}

/// A step's figures other than its metrics rows (module doc).
fn step_figures(instance: &Instance, wall_s: f64) -> Vec<(String, f64)> {
    let dir = &instance.dir;
    let mut figures = Vec::new();
    for output in instance.stage.writes {
        match *output {
            Output::Table(TableName::Trajectories) => {
                if let Some((successes, samples)) =
                    crate::figures::drawn_counts(dir, instance.stage.name)
                {
                    figures.push(("success".into(), successes as f64 / samples as f64));
                    figures.push(("samples".into(), samples as f64));
                    if wall_s > 0.0 {
                        figures.push(("samples_per_s".into(), samples as f64 / wall_s));
                    }
                }
                if let Some(kept) = groups_kept(dir, instance.stage.name) {
                    figures.push(("groups_kept".into(), kept));
                }
            }
            Output::Table(TableName::Rewards) => {
                figures.extend(rewards_figures(&dir.join(TableName::Rewards.as_str())))
            }
            Output::Table(TableName::Eval) => {
                if let Some(success) =
                    crate::figures::eval_success(&dir.join(TableName::Eval.as_str()))
                {
                    figures.push(("success".into(), success));
                }
            }
            Output::File(spec::DIAGNOSTICS_FILE) => figures.extend(diagnostics_figures(dir)),
            _ => {}
        }
    }
    figures.push(("wall_s".into(), wall_s));
    let first_table = instance.stage.writes.iter().find_map(|o| match o {
        Output::Table(table) => Some(*table),
        _ => None,
    });
    if let Some(table) = first_table
        && wall_s > 0.0
        && let Ok(manifest) = embodyflow_core::manifest::Manifest::read(&dir.join(table.as_str()))
    {
        figures.push(("rows_per_s".into(), manifest.num_rows as f64 / wall_s));
    }
    figures
}

/// Every cell's figures, cell by cell.
pub fn gather(plan: &Plan) -> Vec<Point> {
    (0..plan.cells.len())
        .flat_map(|cell| cell_points(plan, cell))
        .collect()
}

/// The run log's CSV header.
pub const CSV_HEADER: &str = "cell,iteration,global_step,step,stage,name,value,wall_time\n";

/// The CSV rows of `points`, one per figure (`iteration` empty for a setup
/// step; floats in their shortest form), without the header.
pub fn csv_rows(plan: &Plan, points: &[Point]) -> String {
    let mut text = String::new();
    for p in points {
        text.push_str(&format!(
            "{},{},{},{},{},{},{},{}\n",
            csv_field(&plan.cells[p.cell].name),
            p.iteration.map_or(String::new(), |i| i.to_string()),
            p.global_step,
            csv_field(&p.step),
            p.stage,
            p.name,
            p.value,
            p.wall_time,
        ));
    }
    text
}

/// A CSV field, quoted when it holds a comma or a quote (RFC 4180).
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// The directory of a cell's event files under the report directory.
pub fn events_dir(report: &Path, cell_name: &str) -> PathBuf {
    report
        .join("tensorboard")
        .join(crate::figures::sanitize(cell_name))
}

/// The event records of `points` (tag `<step>/<name>`), without the file's
/// version record.
fn event_records(points: &[Point]) -> Vec<u8> {
    let mut writer = EventWriter::append(Vec::new());
    for p in points {
        let tag = format!("{}/{}", p.step, p.name);
        writer
            .scalar(&Scalar {
                tag: &tag,
                step: p.global_step as i64,
                value: p.value,
                wall_time: p.wall_time,
            })
            .expect("writing to memory does not fail");
    }
    writer.into_inner()
}

/// Appends `bytes` to the open file at `path` in one write: a process
/// killed after it leaves every earlier step's records whole.
fn append(file: &mut File, path: &Path, bytes: &[u8]) -> Result<()> {
    file.write_all(bytes).map_err(|e| RunnerError::io(path, e))
}

/// Creates `path` (replacing it) holding `bytes`, open for appending.
fn create(path: &Path, bytes: &[u8]) -> Result<File> {
    let mut file = File::create(path).map_err(|e| RunnerError::io(path, e))?;
    append(&mut file, path, bytes)?;
    Ok(file)
}

/// The run log as the run goes: each step's figures appended to
/// `runlog.csv` and to its cells' event files as the step completes (or is
/// found complete in the cache), one write per file, so `tensorboard
/// --logdir OUT` during a run shows the steps so far and a run killed at any
/// point leaves a readable log of the steps that finished. A step's figures
/// are written once every earlier step of its cell that writes a `metrics`
/// table has completed, which fixes their global step (module doc); the
/// rows are in the order they were written. The files are created (an
/// earlier run's replaced) when the first step completes, so a run refused
/// before any step leaves an earlier log as it was.
pub struct Live<'a> {
    plan: &'a Plan,
    dir: PathBuf,
    state: Mutex<Option<LiveFiles>>,
}

/// The open files and, per cell, how far its figures are written.
struct LiveFiles {
    csv: File,
    /// Per cell, its event file and its path.
    events: Vec<(File, PathBuf)>,
    cells: Vec<CellLog>,
    /// Per instance, whether it completed.
    done: Vec<bool>,
}

/// How far one cell's figures are written: the cell's instances in plan
/// order, and the frontier, the position of its first instance that writes
/// metrics and has not completed (`instances.len()` when none); the global
/// step before each position up to the frontier; which were written.
struct CellLog {
    instances: Vec<usize>,
    frontier: usize,
    global_at: Vec<u64>,
    written: Vec<bool>,
}

impl<'a> Live<'a> {
    /// The log of `plan`'s run, in its report directory (`OUT/report`).
    pub fn new(plan: &'a Plan) -> Live<'a> {
        Live {
            plan,
            dir: plan.out.join("report"),
            state: Mutex::new(None),
        }
    }

    /// Instance `index` completed (ran, was passed on, or was found in the
    /// cache): writes its figures and those of any later step of its cells
    /// that waited for it.
    pub fn done(&self, index: usize) -> Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.is_none() {
            *state = Some(self.open()?);
        }
        let files = state.as_mut().expect("opened above");
        files.done[index] = true;
        for &cell in &self.plan.instances[index].cells {
            let log = &files.cells[cell];
            let position = log
                .instances
                .binary_search(&index)
                .expect("an instance is in the cells it lists");
            if position < log.frontier {
                // A step that writes no metrics, behind the frontier: its
                // global step is known.
                let global = log.global_at[position];
                self.write(files, cell, position, global)?;
            } else {
                self.advance(files, cell)?;
            }
        }
        Ok(())
    }

    /// Moves `cell`'s frontier past every completed instance, writing the
    /// figures of each completed one it passes.
    fn advance(&self, files: &mut LiveFiles, cell: usize) -> Result<()> {
        loop {
            let log = &files.cells[cell];
            let Some(&index) = log.instances.get(log.frontier) else {
                return Ok(());
            };
            let done = files.done[index];
            if writes_metrics(&self.plan.instances[index]) && !done {
                return Ok(());
            }
            let (position, global) = (
                log.frontier,
                *log.global_at
                    .last()
                    .expect("one per position up to the frontier"),
            );
            let rows = if done {
                self.write(files, cell, position, global)?
            } else {
                0
            };
            let log = &mut files.cells[cell];
            log.frontier += 1;
            log.global_at.push(global + rows);
        }
    }

    /// Writes the figures of the instance at `position` of `cell` (once),
    /// measured `global` optimizer steps in; returns its metrics rows.
    fn write(
        &self,
        files: &mut LiveFiles,
        cell: usize,
        position: usize,
        global: u64,
    ) -> Result<u64> {
        let log = &mut files.cells[cell];
        if log.written[position] {
            return Ok(0);
        }
        log.written[position] = true;
        let index = log.instances[position];
        let Some((points, rows)) = instance_points(self.plan, cell, index, global) else {
            return Ok(0);
        };
        let csv_path = self.dir.join("runlog.csv");
        append(
            &mut files.csv,
            &csv_path,
            csv_rows(self.plan, &points).as_bytes(),
        )?;
        let (events, path) = &mut files.events[cell];
        append(events, path, &event_records(&points))?;
        Ok(rows)
    }

    /// Creates the CSV with its header and every cell's event file with its
    /// version record (removing the event files an earlier run wrote).
    fn open(&self) -> Result<LiveFiles> {
        std::fs::create_dir_all(&self.dir).map_err(|e| RunnerError::io(&self.dir, e))?;
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let csv_path = self.dir.join("runlog.csv");
        let csv = create(&csv_path, CSV_HEADER.as_bytes())?;
        let mut events = Vec::new();
        let mut cells = Vec::new();
        for cell in &self.plan.cells {
            let dir = events_dir(&self.dir, &cell.name);
            std::fs::create_dir_all(&dir).map_err(|e| RunnerError::io(&dir, e))?;
            for entry in std::fs::read_dir(&dir)
                .map_err(|e| RunnerError::io(&dir, e))?
                .flatten()
            {
                if entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with("events.out.tfevents.")
                {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
            let path = dir.join(format!("events.out.tfevents.{}.embodyflow", start as u64));
            let header = EventWriter::new(Vec::new(), start)
                .expect("writing to memory does not fail")
                .into_inner();
            events.push((create(&path, &header)?, path));
            cells.push(CellLog {
                instances: Vec::new(),
                frontier: 0,
                global_at: vec![0],
                written: Vec::new(),
            });
        }
        for (index, instance) in self.plan.instances.iter().enumerate() {
            for &c in &instance.cells {
                cells[c].instances.push(index);
                cells[c].written.push(false);
            }
        }
        Ok(LiveFiles {
            csv,
            events,
            cells,
            done: vec![false; self.plan.instances.len()],
        })
    }
}

/// The names drawn as PNGs, when a step gives them.
const DRAWN: [&str; 12] = [
    "success",
    "reward_mean",
    "reward_std",
    "groups_with_signal",
    "kept_groups",
    "episode_adv_std",
    "loss",
    "approx_kl",
    "entropy",
    "clipfrac",
    "grad_norm",
    "lr",
];

/// A cell's name without its seed variables: cells agreeing on it are one
/// curve with a band.
fn seedless(plan: &Plan, cell: usize) -> (String, usize) {
    let values = &plan.cells[cell].values;
    let kept: Vec<String> = values
        .iter()
        .filter(|(var, _)| !var.ends_with("seed"))
        .map(|(var, value)| format!("{var}={value}"))
        .collect();
    let seeds = values.len() - kept.len();
    let name = if kept.is_empty() {
        if seeds > 0 {
            "seeds".to_string()
        } else {
            plan.cells[cell].name.clone()
        }
    } else {
        kept.join(",")
    };
    (name, seeds)
}

/// The curves of one (stage, name): per cell group and step, the mean over
/// the group's seeds at each x with the band of its lowest and highest.
fn curves_of(plan: &Plan, points: &[&Point]) -> Vec<Curve> {
    // (group, step) -> x -> values of the group's cells.
    let mut by: BTreeMap<(String, String), BTreeMap<i64, (f64, Vec<f64>)>> = BTreeMap::new();
    let mut members: BTreeMap<String, std::collections::BTreeSet<usize>> = BTreeMap::new();
    for p in points {
        let (group, _) = seedless(plan, p.cell);
        members.entry(group.clone()).or_default().insert(p.cell);
        let key = (p.x * 1e6).round() as i64;
        by.entry((group, p.step.clone()))
            .or_default()
            .entry(key)
            .or_insert((p.x, Vec::new()))
            .1
            .push(p.value);
    }
    by.into_iter()
        .map(|((group, step), at)| {
            let seeds = members[&group].len();
            let mut curve = Curve {
                name: if seeds > 1 {
                    format!("{group}: {step} (mean of {seeds} seeds, band min-max)")
                } else if plan.cells.len() > 1 {
                    format!("{group}: {step}")
                } else {
                    step.clone()
                },
                ..Curve::default()
            };
            for (x, values) in at.values() {
                let mean = values.iter().sum::<f64>() / values.len() as f64;
                curve.points.push((*x, mean));
                if seeds > 1 {
                    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
                    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    curve.band.push((*x, lo, hi));
                }
            }
            curve
        })
        .collect()
}

/// The run log's section of the report and its PNGs in the report
/// directory `dir` (the CSV and the event files were written as the steps
/// completed, [`Live`]).
pub fn write(plan: &Plan, dir: &Path) -> Result<String> {
    let points = gather(plan);
    let mut md = format!(
        "\n## Run log\n\nEvery step's scalars against the global step (optimizer steps taken) and the iteration, written as each step completed: [runlog.csv](runlog.csv) ({} rows: cell, iteration, global_step, step, stage, name, value, wall_time) and TensorBoard event files, one run per cell (`tensorboard --logdir {}`; tags `<step>/<name>`).\n",
        points.len(),
        plan.out.display(),
    );
    let mut drawn: BTreeMap<(&str, &str), Vec<&Point>> = BTreeMap::new();
    for p in &points {
        if DRAWN.contains(&p.name.as_str()) {
            drawn.entry((p.stage, p.name.as_str())).or_default().push(p);
        }
    }
    if !drawn.is_empty() {
        md.push_str("\nCurves (x = iteration, setup steps at -1, before RL; an update's optimizer steps spread over its iteration; cells differing only in a seed variable drawn as their mean with the band from the lowest to the highest seed):\n\n");
    }
    for ((stage, name), points) in &drawn {
        let file = format!("curve-{stage}-{name}.png");
        let path = dir.join(&file);
        let curves = curves_of(plan, points);
        let title = format!("{stage}: {name}");
        embodyflow_plots::curves(&path, &title, "iteration (setup at -1)", name, &curves)
            .map_err(crate::figures::plot_err(&path))?;
        let key: Vec<(String, Vec<(f64, f64)>)> = curves
            .iter()
            .map(|c| (c.name.clone(), Vec::new()))
            .collect();
        md.push_str(&format!(
            "- ![{stage} {name}]({file}): {}\n",
            embodyflow_plots::colour_key(&key)
        ));
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_std_is_the_population_one() {
        assert_eq!(mean_std(&[]), None);
        assert_eq!(mean_std(&[1.0, 3.0]), Some((2.0, 1.0)));
    }

    /// A cluster finishes steps in any order: an evaluation of SFT's policy
    /// that completes first is logged once SFT has, at the global step after
    /// SFT's optimizer steps, in the CSV and the event file alike.
    #[test]
    fn a_steps_figures_wait_for_every_earlier_update_of_its_cell() {
        use embodyflow_core::schemas::Examples as _;
        let tmp = tempfile::tempdir().unwrap();
        let text = r#"
[[step]]
name = "sft"
stage = "update-policy"
policy = "init"
inputs = ["tasks"]

[[step]]
name = "eval"
stage = "evaluate"
policy = "${sft}/policy"
inputs = ["tasks"]
"#;
        let pipeline = crate::pipeline::Pipeline::parse(Path::new("p.toml"), text).unwrap();
        let out = tmp.path().join("run");
        let plan = Plan::build(&pipeline, &out, &crate::plan::Overrides::default()).unwrap();
        let complete = |index: usize| {
            let instance = &plan.instances[index];
            std::fs::create_dir_all(&instance.dir).unwrap();
            let record = cache::test_record(instance, 1.0, 100 + index as u64);
            cache::write_record(&instance.dir, &record).unwrap();
        };
        let metrics = MetricRow::examples();
        crate::figures::test_table(&plan.instances[0].dir, "update-policy", &metrics);
        let live = Live::new(&plan);
        let csv = || std::fs::read_to_string(out.join("report/runlog.csv")).unwrap();
        complete(1);
        live.done(1).unwrap();
        assert_eq!(csv(), CSV_HEADER, "the evaluation waits for SFT");
        complete(0);
        live.done(0).unwrap();
        let text = csv();
        let rows: Vec<(String, u64, String)> = text
            .lines()
            .skip(1)
            .map(|l| {
                let r: Vec<&str> = l.split(',').collect();
                (r[3].to_string(), r[2].parse().unwrap(), r[5].to_string())
            })
            .collect();
        let n = metrics.len() as u64;
        let losses: Vec<u64> = rows
            .iter()
            .filter(|r| r.0 == "sft" && r.2 == "loss")
            .map(|r| r.1)
            .collect();
        assert_eq!(losses, (1..=n).collect::<Vec<_>>(), "{text}");
        let last = rows.last().unwrap();
        assert_eq!(
            last,
            &("eval".to_string(), n, "wall_s".to_string()),
            "{text}"
        );
        // Each figure once; the event file holds its version record and
        // one record per row.
        live.done(1).unwrap();
        assert_eq!(csv(), text);
        let events = events_dir(&out.join("report"), "default");
        let file = std::fs::read_dir(&events).unwrap().next().unwrap().unwrap();
        let bytes = std::fs::read(file.path()).unwrap();
        let records = crate::tfevents::records(&bytes).unwrap();
        assert_eq!(records.len(), 1 + rows.len());
    }

    #[test]
    fn csv_fields_with_commas_are_quoted() {
        assert_eq!(csv_field("lr=1e-4,seed=1"), "\"lr=1e-4,seed=1\"");
        assert_eq!(csv_field("collect"), "collect");
    }
}

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
//! A figure's wall time is its step's finish time (`_step.json`). The log is
//! rebuilt from the step directories at the end of every run, so a resumed
//! or cached run writes the same log. The PNGs (`curve-<stage>-<name>.png`)
//! put every cell's steps of one stage and one name on one chart against the
//! iteration (setup steps at -1, before RL: SFT's rows and the evaluation of
//! the RL init), an update's rows spread over its iteration; cells that
//! differ only in a variable named `seed` (or ending in `seed`) are one
//! curve, their mean, with the band from the lowest to the highest seed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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

/// The figures of one cell's completed steps, in plan order.
fn cell_points(plan: &Plan, cell: usize) -> Vec<Point> {
    let mut points = Vec::new();
    let mut global = 0u64;
    for instance in plan.instances.iter().filter(|i| i.cells.contains(&cell)) {
        let Some(record) = std::fs::read_to_string(instance.dir.join(cache::STEP_FILE))
            .ok()
            .and_then(|text| serde_json::from_str::<StepRecord>(&text).ok())
        else {
            continue;
        };
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
        let figures = step_figures(instance, record.wall_s);
        let rows = if instance.stage.writes_table(TableName::Metrics) {
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
        let at = if rows.is_empty() { global } else { after };
        points.extend(
            figures
                .iter()
                .map(|(name, value)| point(name, *value, at, x)),
        );
        global = after;
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

/// The CSV text of the run log: a header, then one row per figure
/// (`iteration` empty for a setup step; floats in their shortest form).
pub fn csv(plan: &Plan, points: &[Point]) -> String {
    let mut text = String::from("cell,iteration,global_step,step,stage,name,value,wall_time\n");
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

/// Writes one cell's event file (replacing the one an earlier run wrote).
fn write_events(dir: &Path, points: &[&Point]) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| RunnerError::io(dir, e))?;
    for entry in std::fs::read_dir(dir)
        .map_err(|e| RunnerError::io(dir, e))?
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
    let start = points
        .iter()
        .map(|p| p.wall_time)
        .fold(f64::INFINITY, f64::min);
    let start = if start.is_finite() { start } else { 0.0 };
    let path = dir.join(format!("events.out.tfevents.{}.embodyflow", start as u64));
    let mut writer = EventWriter::new(Vec::new(), start).map_err(|e| RunnerError::io(&path, e))?;
    for p in points {
        let tag = format!("{}/{}", p.step, p.name);
        writer
            .scalar(&Scalar {
                tag: &tag,
                step: p.global_step as i64,
                value: p.value,
                wall_time: p.wall_time,
            })
            .map_err(|e| RunnerError::io(&path, e))?;
    }
    std::fs::write(&path, writer.into_inner()).map_err(|e| RunnerError::io(&path, e))?;
    Ok(path)
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

/// Writes the run log into the report directory `dir` (`runlog.csv`, the
/// event files and the PNGs) and returns the report's Markdown section.
pub fn write(plan: &Plan, dir: &Path) -> Result<String> {
    let points = gather(plan);
    let path = dir.join("runlog.csv");
    std::fs::write(&path, csv(plan, &points)).map_err(|e| RunnerError::io(&path, e))?;
    let mut md = format!(
        "\n## Run log\n\nEvery step's scalars against the global step (optimizer steps taken) and the iteration: [runlog.csv](runlog.csv) ({} rows: cell, iteration, global_step, step, stage, name, value, wall_time) and TensorBoard event files, one run per cell (`tensorboard --logdir {}`; tags `<step>/<name>`).\n",
        points.len(),
        plan.out.display(),
    );
    for (c, cell) in plan.cells.iter().enumerate() {
        let mine: Vec<&Point> = points.iter().filter(|p| p.cell == c).collect();
        write_events(&events_dir(dir, &cell.name), &mine)?;
    }
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

    #[test]
    fn csv_fields_with_commas_are_quoted() {
        assert_eq!(csv_field("lr=1e-4,seed=1"), "\"lr=1e-4,seed=1\"");
        assert_eq!(csv_field("collect"), "collect");
    }
}

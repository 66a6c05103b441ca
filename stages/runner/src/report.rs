//! The run report, `OUT/report/`: `report.md` with the run summary, the wall
//! time per step, a metrics table per variant (per iteration: train success
//! of every sampled rollout, dropped groups included, success of each evaluate step, mean update loss,
//! approx KL and entropy), the ablation table when the pipeline sweeps (one
//! row per cell: last evaluation successes, train success, mean reward,
//! the share of groups whose rewards differ (the groups GRPO learns from),
//! kept groups, the episode advantages' std and the grpo_step
//! diagnostics), and PNG plots: a success
//! curve per variant and a bar per cell, each with a title, labelled axes
//! and a legend or the cells' names ([`embodyflow_plots`]); `report.md` says
//! what their lines and bars are too.
//!
//! Which figures a step gives follows from the outputs its stage declares
//! ([`embodyflow_core::spec`]), not from its name. The tables' figures are
//! gathered with polars lazy queries ([`embodyflow_report::column_means`]),
//! `diagnostics.json` is read typed ([`VariantDiagnostics`]), and all is
//! written as Markdown.

use std::collections::BTreeMap;
use std::path::Path;

use embodyflow_core::schemas::TableName;
use embodyflow_core::spec::{self, Output};
use embodyflow_core::stage::Summary;
use embodyflow_plots::{Frame, PALETTE, PlotError};
use embodyflow_report::VariantDiagnostics;
use plotters::prelude::*;

use crate::error::{Result, RunnerError};
use crate::exec::{RunOutcome, Status};
use crate::plan::{Instance, Plan};

/// Means of columns of the table `table` under a step directory (polars,
/// one lazy pass); `None` when the table is absent or unreadable.
fn column_means(dir: &Path, table: TableName, names: &[&str]) -> Option<Vec<f64>> {
    let means = embodyflow_report::column_means(&dir.join(table.as_str()), table, names).ok()?;
    means.into_iter().collect()
}

/// The summary lines in which a rollout stage states the success of every
/// sample it drew: `| success rate (all drawn samples) | 0.250 (3 of 12) |`
/// for one-shot plans, `| success rate (all drawn episodes) | … |` for
/// closed-loop episodes.
const DRAWN_SUCCESS: [&str; 2] = [
    "| success rate (all drawn samples) |",
    "| success rate (all drawn episodes) |",
];

/// The train success of a rollout step: successes over samples drawn, summed
/// over the `DRAWN_SUCCESS` lines of its summary (one per shard). Dynamic
/// sampling writes only the groups it keeps to the trajectories table (none
/// when every group scored the same, as when the policy solves nothing), so
/// the table's mean of `complete` is neither the sampled rollouts' success
/// nor defined then; it is the fallback for a summary without the line.
fn drawn_success(dir: &Path, stage: &str) -> Option<f64> {
    drawn_counts(dir, stage).map(|(successes, samples)| successes as f64 / samples as f64)
}

/// The successes and samples drawn of a rollout step, summed over the
/// `DRAWN_SUCCESS` lines of its summary; `None` without a line or samples.
pub(crate) fn drawn_counts(dir: &Path, stage: &str) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(dir.join(format!("_summary.{stage}.md"))).ok()?;
    let (mut successes, mut samples) = (0u64, 0u64);
    for line in text
        .lines()
        .filter(|l| DRAWN_SUCCESS.iter().any(|label| l.starts_with(label)))
    {
        // "... | 0.250 (3 of 12) |" or "... | 0.034 (6 of 176; 0 cut at the decision limit) |"
        let counts = line.rsplit_once('(')?.1.split_once(')')?.0;
        let counts = counts.split(';').next()?;
        let (s, n) = counts.split_once(" of ")?;
        successes += s.trim().parse::<u64>().ok()?;
        samples += n.trim().parse::<u64>().ok()?;
    }
    (samples > 0).then_some((successes, samples))
}

/// The `| warning | … |` lines of a step's summary (one per shard when the
/// runner joined shard summaries): what a stage said went wrong without
/// failing, such as dynamic sampling that dropped every draw.
fn step_warnings(dir: &Path, stage: &str) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(dir.join(format!("_summary.{stage}.md"))) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| l.strip_prefix("| warning | "))
        .map(|w| w.trim_end().trim_end_matches('|').trim_end().to_string())
        .collect()
}

fn fmt(value: Option<f64>) -> String {
    value.map_or("-".to_string(), |v| format!("{v:.3}"))
}

/// What one variant measured per iteration (`None` = setup steps).
#[derive(Debug, Default, Clone)]
struct Row {
    train: Option<f64>,
    evals: BTreeMap<String, f64>,
    /// Mean loss, approx KL and entropy; approx KL is null on SFT rows.
    update: Option<Vec<Option<f64>>>,
    score: Option<f64>,
    /// The reward function of the rewards table (its scale).
    reward_fn: Option<String>,
    /// Groups of the rewards table whose scores differ, and all groups.
    signal: Option<(u64, u64)>,
    diagnostics: Option<VariantDiagnostics>,
}

/// Gathers each instance's figures from the outputs its stage declares: the
/// train success of a rollout step (its drawn samples, [`drawn_success`]), the success of an eval table
/// (by step), the update figures of a metrics table, the mean score and
/// the groups with signal of a rewards table and compute-advantages'
/// diagnostics.
fn gather(instances: &[&Instance]) -> BTreeMap<Option<u32>, Row> {
    let mut rows: BTreeMap<Option<u32>, Row> = BTreeMap::new();
    for instance in instances {
        let row = rows.entry(instance.iteration).or_default();
        let dir = &instance.dir;
        for output in instance.stage.writes {
            match *output {
                Output::Table(TableName::Trajectories) => {
                    row.train = drawn_success(dir, instance.stage.name).or_else(|| {
                        column_means(dir, TableName::Trajectories, &["complete"]).map(|v| v[0])
                    })
                }
                Output::Table(TableName::Eval) => {
                    if let Some(v) = column_means(dir, TableName::Eval, &["success"]) {
                        row.evals.insert(instance.step.clone(), v[0]);
                    }
                }
                Output::Table(TableName::Metrics) => {
                    row.update = embodyflow_report::column_means(
                        &dir.join(TableName::Metrics.as_str()),
                        TableName::Metrics,
                        &["loss", "approx_kl", "entropy"],
                    )
                    .ok()
                }
                Output::Table(TableName::Rewards) => {
                    row.score = column_means(dir, TableName::Rewards, &["score"]).map(|v| v[0]);
                    row.reward_fn = reward_fn(&dir.join(TableName::Rewards.as_str()));
                    row.signal = embodyflow_report::groups_with_signal(
                        &dir.join(TableName::Rewards.as_str()),
                    )
                    .ok();
                }
                Output::File(spec::DIAGNOSTICS_FILE) => {
                    row.diagnostics = VariantDiagnostics::read(dir).ok().flatten()
                }
                _ => {}
            }
        }
    }
    rows
}

/// The reward function a rewards table was scored with (its first row's).
fn reward_fn(dir: &Path) -> Option<String> {
    let reader = embodyflow_core::dataset::TableReader::open(dir, TableName::Rewards).ok()?;
    let batch = reader.batches(None, 1).ok()?.next()?.ok()?;
    let rows =
        embodyflow_core::dataset::batch_to_rows::<embodyflow_core::schemas::RewardRow>(&batch)
            .ok()?;
    rows.into_iter().next().map(|r| r.reward_fn)
}

/// Groups of cells that run exactly the same step instances: what they
/// sweep changes nothing they run, so their figures are identical by
/// construction.
fn identical_cells(plan: &Plan) -> Vec<Vec<usize>> {
    let mut by: BTreeMap<Vec<usize>, Vec<usize>> = BTreeMap::new();
    for c in 0..plan.cells.len() {
        let runs: Vec<usize> = (0..plan.instances.len())
            .filter(|&i| plan.instances[i].cells.contains(&c))
            .collect();
        by.entry(runs).or_default().push(c);
    }
    by.into_values().filter(|cells| cells.len() > 1).collect()
}

pub(crate) fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

pub(crate) fn plot_err(path: &Path) -> impl Fn(PlotError) -> RunnerError + '_ {
    move |reason| RunnerError::Plot {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// One bar per sweep cell, numbered on the x axis and named in the key
/// under the chart (a cell's name is too long for a tick), its value printed
/// above it; all-zero values still show the axes, flat bars and a note.
fn plot_bars(path: &Path, cells: &[String], values: &[f64], y_label: &str) -> Result<()> {
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    const CHART: u32 = 400;
    const KEY_LINE: u32 = 18;
    let draw = || -> std::result::Result<(), PlotError> {
        let height = CHART + 10 + KEY_LINE * cells.len() as u32;
        let root = embodyflow_plots::canvas(path, (640, height))?;
        let (upper, key) = root.split_vertically(CHART);
        let top = values.iter().copied().fold(1.0, f64::max) * 1.1;
        let bottom = values.iter().copied().fold(0.0, f64::min) * 1.1;
        let number = |x: &f64| {
            let k = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 1e-9 && k < cells.len() {
                (k + 1).to_string()
            } else {
                String::new()
            }
        };
        let mut chart = Frame::new(
            &format!("Ablation: {} cells", cells.len()),
            "sweep cell (named below)",
            y_label,
        )
        .ranges(0.0..cells.len().max(1) as f64, bottom..top)
        .x_ticks(2 * cells.len().max(1) + 1, &number)
        .draw(&upper)?;
        let thin = (top - bottom) / 300.0;
        chart.draw_series(values.iter().enumerate().map(|(k, &v)| {
            let colour = PALETTE[k % PALETTE.len()];
            // A value of 0 is a visible flat bar, not nothing.
            let v = if v.abs() < thin { thin } else { v };
            Rectangle::new(
                [(k as f64 + 0.15, 0.0), (k as f64 + 0.85, v)],
                colour.filled(),
            )
        }))?;
        chart.draw_series(values.iter().enumerate().map(|(k, &v)| {
            Text::new(
                format!("{v:.3}"),
                (k as f64 + 0.5, v.max(0.0) + (top - bottom) * 0.02),
                embodyflow_plots::text(12).pos(Pos::new(HPos::Center, VPos::Bottom)),
            )
        }))?;
        if values.iter().all(|&v| v == 0.0) {
            chart.draw_series(std::iter::once(Text::new(
                "every cell's value is 0",
                (cells.len().max(1) as f64 * 0.5, top * 0.5),
                embodyflow_plots::text(16).pos(Pos::new(HPos::Center, VPos::Center)),
            )))?;
        }
        for (k, name) in cells.iter().enumerate() {
            let y = 5 + (KEY_LINE * k as u32 + KEY_LINE / 2) as i32;
            key.draw(&embodyflow_plots::swatch(PALETTE[k % PALETTE.len()])((
                70, y,
            )))?;
            key.draw(&Text::new(
                format!("{}  {name}", k + 1),
                (86, y),
                embodyflow_plots::text(12).pos(Pos::new(HPos::Left, VPos::Center)),
            ))?;
        }
        root.present()?;
        Ok(())
    };
    draw().map_err(plot_err(path))
}

fn ratio(x: u64, y: u64) -> Option<f64> {
    (y > 0).then(|| x as f64 / y as f64)
}

/// Writes `OUT/report/` and returns the run summary (Markdown).
pub fn write_report(plan: &Plan, outcome: &RunOutcome, plan_s: f64) -> Result<String> {
    let dir = plan.out.join("report");
    std::fs::create_dir_all(&dir).map_err(|e| RunnerError::io(&dir, e))?;
    let ran: Vec<_> = outcome
        .steps
        .iter()
        .filter(|s| s.status == Status::Ran)
        .collect();
    let stage_s: f64 = ran.iter().map(|s| s.wall_s).sum::<f64>().max(0.0);
    // Cached and kept steps carry the timing recorded when they ran, so a
    // rerun from the cache reports what the pipeline costs, not 0.0 s.
    let recorded_s: f64 = outcome.steps.iter().map(|s| s.wall_s).sum::<f64>();
    let total = outcome.total_s + plan_s;
    let overhead = (total - stage_s).max(0.0);
    let mut summary = Summary::new(format!("pipeline {}", plan.name));
    summary
        .add("pipeline file", plan.file.display())
        .add("run directory", plan.out.display())
        .add("steps (ran / cached / kept)", format!(
            "{} ({} / {} / {})",
            outcome.steps.len(),
            ran.len(),
            outcome.steps.iter().filter(|s| s.status == Status::Cached).count(),
            outcome.steps.iter().filter(|s| s.status == Status::Kept).count(),
        ))
        .add("sweep cells", plan.cells.len())
        .add("wall time", format!("{total:.1} s"))
        .add("stage processes (this run)", format!("{stage_s:.1} s"))
        .add(
            "stage processes (all steps; cached and kept ones as recorded when they ran)",
            format!("{recorded_s:.1} s"),
        )
        .add("runner overhead (planning, checks, hashing, merges, records)", format!(
            "{overhead:.2} s ({:.1} % of wall; planning {plan_s:.2} s, config checks {:.2} s, binary hashes {:.2} s)",
            100.0 * overhead / total.max(1e-9),
            outcome.check_s,
            outcome.binary_hash_s,
        ))
        .add("report", dir.join("report.md").display());
    let mut md = summary.to_markdown();
    md.push_str(
        "\n## Wall time per step\n\nA cached or kept step shows the wall time recorded when it ran (its `_step.json`).\n\n| step | stage | status | wall s |\n|---|---|---|---|\n",
    );
    for step in &outcome.steps {
        let instance = &plan.instances[step.index];
        md.push_str(&format!(
            "| {} | {} | {} | {:.1} |\n",
            instance.id,
            instance.stage.name,
            step.status.word(),
            step.wall_s
        ));
    }
    let warnings: Vec<(String, String)> = outcome
        .steps
        .iter()
        .map(|step| &plan.instances[step.index])
        .flat_map(|instance| {
            step_warnings(&instance.dir, instance.stage.name)
                .into_iter()
                .map(|w| (instance.id.clone(), w))
        })
        .collect();
    if !warnings.is_empty() {
        md.push_str("\n## Warnings\n\nWhat stages said went wrong without failing (their summaries' `warning` lines).\n\n| step | warning |\n|---|---|\n");
        for (id, warning) in &warnings {
            md.push_str(&format!("| {id} | {warning} |\n"));
        }
    }
    summary.add("warnings (see the report)", warnings.len());
    let mut ablation: Vec<(String, BTreeMap<Option<u32>, Row>)> = Vec::new();
    // Every cell's curves on one chart, named by cell, when a sweep compares
    // cells (GRPO vs GiGPO from the same init, say).
    let mut all_cells: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let mut all_iterations = 0;
    for (c, cell) in plan.cells.iter().enumerate() {
        let instances: Vec<&Instance> = plan
            .instances
            .iter()
            .filter(|i| i.cells.contains(&c))
            .collect();
        let rows = gather(&instances);
        let eval_names: Vec<String> = instances
            .iter()
            .filter(|i| i.stage.writes_table(TableName::Eval))
            .map(|i| i.step.clone())
            .fold(Vec::new(), |mut v, n| {
                if !v.contains(&n) {
                    v.push(n);
                }
                v
            });
        md.push_str(&format!(
            "\n## Metrics: {}\n\nTrain success: the share of every rollout the collect step sampled that reached its goal (groups dynamic sampling dropped included; its summary's line). Mean reward and the update figures cover the groups it kept, `-` when it kept none.\n\n| iteration | train success | {}mean reward | update loss | approx KL | entropy |\n|---|---|{}---|---|---|---|\n",
            cell.name,
            eval_names.iter().map(|n| format!("{n} success | ")).collect::<String>(),
            "---|".repeat(eval_names.len()),
        ));
        for (iteration, row) in &rows {
            let update = row.update.as_ref();
            md.push_str(&format!(
                "| {} | {} | {}{} | {} | {} | {} |\n",
                iteration.map_or("setup".to_string(), |i| i.to_string()),
                fmt(row.train),
                eval_names
                    .iter()
                    .map(|n| format!("{} | ", fmt(row.evals.get(n).copied())))
                    .collect::<String>(),
                fmt(row.score),
                fmt(update.and_then(|u| u[0])),
                fmt(update.and_then(|u| u[1])),
                fmt(update.and_then(|u| u[2])),
            ));
        }
        let iterations = rows.keys().flatten().max().map_or(0, |m| m + 1);
        if iterations > 0 {
            let mut series = vec![(
                "train (sampled rollouts)".to_string(),
                rows.iter()
                    .filter_map(|(i, r)| Some((f64::from((*i)?), r.train?)))
                    .collect::<Vec<_>>(),
            )];
            for name in &eval_names {
                series.push((
                    format!("eval step {name}"),
                    rows.iter()
                        .filter_map(|(i, r)| Some((f64::from((*i)?), *r.evals.get(name)?)))
                        .collect(),
                ));
            }
            // A setup step's evaluation has no iteration: it is in the table
            // (row `setup`), not a curve.
            series.retain(|(_, points)| !points.is_empty());
            let path = dir.join(format!("success-{}.png", sanitize(&cell.name)));
            let title = format!("Success per iteration: {}", cell.name);
            embodyflow_plots::success_curves(&path, &title, &series, f64::from(iterations))
                .map_err(plot_err(&path))?;
            md.push_str(&format!(
                "\n![success {}]({}): x = iteration 0…{}, y = success 0…1 (grid every 0.25); {}.\n",
                cell.name,
                path.file_name().unwrap().to_string_lossy(),
                iterations - 1,
                embodyflow_plots::colour_key(&series),
            ));
            all_iterations = all_iterations.max(iterations);
            all_cells.extend(
                series
                    .into_iter()
                    .map(|(name, points)| (format!("{}: {name}", cell.name), points)),
            );
        }
        ablation.push((cell.name.clone(), rows));
    }
    if plan.cells.len() > 1 && all_iterations > 0 {
        let path = dir.join("success-cells.png");
        let title = format!("Success per iteration: {} cells", plan.cells.len());
        embodyflow_plots::success_curves(&path, &title, &all_cells, f64::from(all_iterations))
            .map_err(plot_err(&path))?;
        md.push_str(&format!(
            "\n## Every cell\n\n![success of every cell](success-cells.png): x = iteration 0…{}, y = success 0…1; one curve per cell and series: {}.\n",
            all_iterations - 1,
            embodyflow_plots::colour_key(&all_cells),
        ));
    }
    if plan.cells.len() > 1 {
        let mut table = String::from(
            "| cell | last eval success | last train success | mean reward | groups with signal | kept groups | A^E std | responses with A^S | sign-flip ratio |\n|---|---|---|---|---|---|---|---|---|\n",
        );
        // Chart file slug -> its metric (y label), the cells that have it
        // and their values.
        let mut charts: BTreeMap<String, (String, Vec<String>, Vec<f64>)> = BTreeMap::new();
        for (name, rows) in &ablation {
            let last = |f: &dyn Fn(&Row) -> Option<f64>| rows.values().rev().find_map(f);
            let eval = last(&|r: &Row| r.evals.values().next().copied());
            let diagnostics = rows.values().rev().find_map(|r| r.diagnostics.clone());
            let d = diagnostics.as_ref();
            let kept = d.and_then(|d| ratio(d.kept_groups, d.groups));
            let step = d.and_then(|d| d.step.as_ref());
            let with_step = step.and_then(|s| ratio(s.responses_with_step_adv, s.responses));
            let flips = step.and_then(|s| ratio(s.sign_flips.flipped, s.sign_flips.tokens));
            let score = last(&|r: &Row| r.score);
            let signal = last(&|r: &Row| r.signal.and_then(|(s, n)| ratio(s, n)));
            let adv_std = d.and_then(|d| d.episode_adv_std);
            table.push_str(&format!(
                "| {name} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                fmt(eval),
                fmt(last(&|r: &Row| r.train)),
                fmt(score),
                fmt(signal),
                fmt(kept),
                fmt(adv_std),
                fmt(with_step),
                fmt(flips),
            ));
            let reward_fn = rows.values().rev().find_map(|r| r.reward_fn.clone());
            let reward_fn = reward_fn.as_deref().unwrap_or("unknown");
            for (slug, metric, value) in [
                (
                    "eval-success".to_string(),
                    "last eval success (fraction)".to_string(),
                    eval,
                ),
                (
                    "train-success".to_string(),
                    "last train success (fraction)".to_string(),
                    last(&|r: &Row| r.train),
                ),
                (
                    format!("reward-{}", sanitize(reward_fn)),
                    format!("mean reward (reward.fn {reward_fn})"),
                    score,
                ),
            ] {
                if let Some(value) = value {
                    let chart = charts
                        .entry(slug)
                        .or_insert_with(|| (metric, Vec::new(), Vec::new()));
                    chart.1.push(name.clone());
                    chart.2.push(value);
                }
            }
        }
        std::fs::write(dir.join("ablation.md"), &table)
            .map_err(|e| RunnerError::io(dir.join("ablation.md"), e))?;
        md.push_str(&format!(
            "\n## Ablation ({} cells)\n\n{table}\n",
            plan.cells.len()
        ));
        for group in identical_cells(plan) {
            let names: Vec<&str> = group.iter().map(|&c| plan.cells[c].name.as_str()).collect();
            md.push_str(&format!(
                "\nIdentical by construction: {} run the same step instances (what they sweep changes nothing they run), so their figures are equal.\n",
                names.join(", ")
            ));
        }
        // One metric per chart; mean rewards only beside rewards of the same
        // function (one chart per reward function).
        for (slug, (metric, names, values)) in &charts {
            let file = format!("ablation-{slug}.png");
            plot_bars(&dir.join(&file), names, values, metric)?;
            md.push_str(&format!(
                "\n![ablation {metric}]({file}): one bar per cell that has it, in table order, height = {metric}.\n"
            ));
        }
    }
    md.push_str(&crate::runlog::write(plan, &dir)?);
    summary.add("run log", dir.join("runlog.csv").display());
    let path = dir.join("report.md");
    std::fs::write(&path, &md).map_err(|e| RunnerError::io(&path, e))?;
    Ok(summary.to_markdown())
}

#[cfg(test)]
mod tests {
    use super::*;
    use embodyflow_plots::Png;

    #[test]
    fn train_success_sums_the_drawn_samples_of_every_shard() {
        let tmp = tempfile::tempdir().unwrap();
        let summary = |rate: &str| {
            format!(
                "## collect-rollouts\n\n| | |\n|---|---|\n| groups written | 0 of 4 wanted (0 trajectories) |\n{} {rate} |\n",
                DRAWN_SUCCESS[0]
            )
        };
        let path = tmp.path().join("_summary.collect-rollouts.md");
        std::fs::write(&path, summary("0.000 (0 of 108)")).unwrap();
        assert_eq!(drawn_success(tmp.path(), "collect-rollouts"), Some(0.0));
        // The runner joins shard summaries into one file.
        let shards = format!(
            "<!-- shard 0/2 -->\n{}\n<!-- shard 1/2 -->\n{}",
            summary("0.250 (3 of 12)"),
            summary("0.750 (9 of 12)")
        );
        std::fs::write(&path, shards).unwrap();
        assert_eq!(drawn_success(tmp.path(), "collect-rollouts"), Some(0.5));
        assert_eq!(drawn_success(tmp.path(), "evaluate"), None);
        std::fs::write(&path, summary("0.000 (0 of 0)")).unwrap();
        assert_eq!(drawn_success(tmp.path(), "collect-rollouts"), None);
        // Closed-loop episodes: a summary whose kept groups all succeeded
        // still reports the drawn episodes' rate, not the kept table's.
        let closed_loop = format!(
            "| groups written | 1 of 8 wanted (8 trajectories) |\n{} 0.034 (6 of 176; 0 cut at the decision limit) |\n",
            DRAWN_SUCCESS[1]
        );
        std::fs::write(&path, closed_loop).unwrap();
        assert_eq!(
            drawn_success(tmp.path(), "collect-rollouts"),
            Some(6.0 / 176.0)
        );
    }

    #[test]
    fn a_steps_warnings_are_read_from_every_shards_summary() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(step_warnings(tmp.path(), "collect-rollouts").is_empty());
        let path = tmp.path().join("_summary.collect-rollouts.md");
        std::fs::write(
            &path,
            "<!-- shard 0/2 -->\n| groups written | 0 of 4 wanted |\n| warning | 0 of 4 slots filled: 9 groups dropped (all success 9) |\n<!-- shard 1/2 -->\n| warning | 1 of 4 slots filled |\n",
        )
        .unwrap();
        assert_eq!(
            step_warnings(tmp.path(), "collect-rollouts"),
            [
                "0 of 4 slots filled: 9 groups dropped (all success 9)",
                "1 of 4 slots filled"
            ]
        );
    }

    #[test]
    fn cells_running_the_same_instances_are_identical_by_construction() {
        let text = r#"
[vars]
mode = "exact"
unused = "a"

[[step]]
name = "score"
stage = "score-rewards"
inputs = ["rollouts", "tasks"]
set = { "match.mode" = "${mode}" }

[sweep]
mode = ["exact", "lcs"]
unused = ["a", "b"]
"#;
        let pipeline = crate::pipeline::Pipeline::parse(Path::new("p.toml"), text).unwrap();
        let plan = Plan::build(
            &pipeline,
            Path::new("run"),
            &crate::plan::Overrides::default(),
        )
        .unwrap();
        let names = |group: &Vec<usize>| -> Vec<String> {
            group.iter().map(|&c| plan.cells[c].name.clone()).collect()
        };
        let groups: Vec<Vec<String>> = identical_cells(&plan).iter().map(names).collect();
        assert_eq!(
            groups,
            [
                ["mode=exact,unused=a", "mode=exact,unused=b"],
                ["mode=lcs,unused=a", "mode=lcs,unused=b"],
            ]
        );
    }

    #[test]
    fn ablation_bars_of_zeros_show_axes_flat_bars_and_a_note() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = embodyflow_plots::test_dir(tmp.path());
        let cells = vec!["rule".to_string(), "proxy".to_string()];
        let zeros = dir.join("runner-ablation-zeros.png");
        plot_bars(&zeros, &cells, &[0.0, 0.0], "success (fraction)").unwrap();
        let some = dir.join("runner-ablation.png");
        plot_bars(&some, &cells, &[0.25, 0.5], "success (fraction)").unwrap();
        let (zeros, some) = (Png::read(&zeros).unwrap(), Png::read(&some).unwrap());
        for png in [&zeros, &some] {
            // The chart, then a key line per cell.
            assert_eq!((png.width, png.height), (640, 400 + 10 + 2 * 18));
            assert!(png.dark_in(80..200, 400..446) > 50, "no key");
            assert!(png.colours() > 10, "{} colours", png.colours());
            assert!(png.dark_in(200..440, 0..30) > 50, "no title");
            assert!(png.dark_in(0..25, 100..300) > 30, "no y axis label");
        }
        // The note in the middle of the plot, which the non-zero chart lacks.
        let middle = |png: &Png| png.dark_in(150..500, 150..250);
        assert!(middle(&zeros) > middle(&some) + 50);
    }
}

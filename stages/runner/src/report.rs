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
//! computed from their shard rows ([`crate::figures`]), `diagnostics.json`
//! is read typed ([`VariantDiagnostics`]), and all is written as Markdown.

use std::collections::BTreeMap;
use std::path::Path;

use embodyflow_core::diagnostics::VariantDiagnostics;
use embodyflow_core::schemas::TableName;
use embodyflow_core::spec::{self, Output};
use embodyflow_core::stage::Summary;
use embodyflow_plots::{Frame, PALETTE, PlotError};
use plotters::prelude::*;

use crate::error::{Result, RunnerError};
use crate::exec::{RunOutcome, Status};
use crate::figures::{
    drawn_success, eval_success, groups_with_signal, outcome_rewards, plot_err, reward_fn,
    sanitize, score_mean, step_warnings, train_complete, update_means,
};
use crate::plan::{Instance, Plan};

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
                    row.train = drawn_success(dir, instance.stage.name)
                        .or_else(|| train_complete(&dir.join(TableName::Trajectories.as_str())))
                }
                Output::Table(TableName::Eval) => {
                    if let Some(v) = eval_success(&dir.join(TableName::Eval.as_str())) {
                        row.evals.insert(instance.step.clone(), v);
                    }
                }
                Output::Table(TableName::Metrics) => {
                    row.update = update_means(&dir.join(TableName::Metrics.as_str()))
                }
                Output::Table(TableName::Rewards) => {
                    let table = dir.join(TableName::Rewards.as_str());
                    row.score = score_mean(&table);
                    row.reward_fn = reward_fn(&table);
                    row.signal = outcome_rewards(&table).map(|rows| groups_with_signal(&rows));
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
    let mut summary = run_summary(plan, outcome, plan_s, &dir);
    let mut md = summary.to_markdown();
    md.push_str(&step_times(plan, outcome));
    let warnings = warnings(plan, outcome);
    md.push_str(&warnings_section(&warnings));
    summary.add("warnings (see the report)", warnings.len());
    let mut ablation: Vec<(String, BTreeMap<Option<u32>, Row>)> = Vec::new();
    // Every cell's curves on one chart, named by cell, when a sweep compares
    // cells (GRPO vs GiGPO from the same init, say).
    let mut all_cells = Curves::default();
    for c in 0..plan.cells.len() {
        let (section, rows) = cell_metrics(plan, c, &dir, &mut all_cells)?;
        md.push_str(&section);
        ablation.push((plan.cells[c].name.clone(), rows));
    }
    if plan.cells.len() > 1 && all_cells.iterations > 0 {
        md.push_str(&every_cell(plan, &dir, &all_cells)?);
    }
    if plan.cells.len() > 1 {
        md.push_str(&ablation_section(plan, &dir, &ablation)?);
    }
    md.push_str(&crate::runlog::write(plan, &dir)?);
    summary.add("run log", dir.join("runlog.csv").display());
    let path = dir.join("report.md");
    std::fs::write(&path, &md).map_err(|e| RunnerError::io(&path, e))?;
    Ok(summary.to_markdown())
}

/// The run summary: the steps by status, the wall time and what the
/// runner itself cost.
fn run_summary(plan: &Plan, outcome: &RunOutcome, plan_s: f64, dir: &Path) -> Summary {
    let count = |status: Status| outcome.steps.iter().filter(|s| s.status == status).count();
    let stage_s: f64 = outcome
        .steps
        .iter()
        .filter(|s| s.status == Status::Ran)
        .map(|s| s.wall_s)
        .sum::<f64>()
        .max(0.0);
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
            count(Status::Ran),
            count(Status::Cached),
            count(Status::Kept),
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
    summary
}

/// The wall time of every step.
fn step_times(plan: &Plan, outcome: &RunOutcome) -> String {
    let mut md = String::from(
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
    md
}

/// Every step's warnings, with the step's id.
fn warnings(plan: &Plan, outcome: &RunOutcome) -> Vec<(String, String)> {
    outcome
        .steps
        .iter()
        .map(|step| &plan.instances[step.index])
        .flat_map(|instance| {
            step_warnings(&instance.dir, instance.stage.name)
                .into_iter()
                .map(|w| (instance.id.clone(), w))
        })
        .collect()
}

/// The warnings' section (none without warnings).
fn warnings_section(warnings: &[(String, String)]) -> String {
    if warnings.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "\n## Warnings\n\nWhat stages said went wrong without failing (their summaries' `warning` lines).\n\n| step | warning |\n|---|---|\n",
    );
    for (id, warning) in warnings {
        md.push_str(&format!("| {id} | {warning} |\n"));
    }
    md
}

/// Success curves: each named, its points `(iteration, success)`, and the
/// iterations the longest covers.
#[derive(Default)]
struct Curves {
    series: Vec<(String, Vec<(f64, f64)>)>,
    iterations: u32,
}

/// The evaluate steps among `instances`, by name, once each.
fn eval_names(instances: &[&Instance]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for instance in instances {
        if instance.stage.writes_table(TableName::Eval) && !names.contains(&instance.step) {
            names.push(instance.step.clone());
        }
    }
    names
}

/// Cell `c`'s section: its metrics per iteration and its success curves
/// (added to `all_cells` under the cell's name); with its rows.
fn cell_metrics(
    plan: &Plan,
    c: usize,
    dir: &Path,
    all_cells: &mut Curves,
) -> Result<(String, BTreeMap<Option<u32>, Row>)> {
    let cell = &plan.cells[c];
    let instances: Vec<&Instance> = plan
        .instances
        .iter()
        .filter(|i| i.cells.contains(&c))
        .collect();
    let rows = gather(&instances);
    let eval_names = eval_names(&instances);
    let mut md = metrics_table(&cell.name, &eval_names, &rows);
    let iterations = rows.keys().flatten().max().map_or(0, |m| m + 1);
    if iterations > 0 {
        let series = success_series(&eval_names, &rows);
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
        all_cells.iterations = all_cells.iterations.max(iterations);
        all_cells.series.extend(
            series
                .into_iter()
                .map(|(name, points)| (format!("{}: {name}", cell.name), points)),
        );
    }
    Ok((md, rows))
}

/// A cell's metrics per iteration.
fn metrics_table(cell: &str, eval_names: &[String], rows: &BTreeMap<Option<u32>, Row>) -> String {
    let mut md = format!(
        "\n## Metrics: {}\n\nTrain success: the share of every rollout the collect step sampled that reached its goal (groups dynamic sampling dropped included; its summary's line). Mean reward and the update figures cover the groups it kept, `-` when it kept none.\n\n| iteration | train success | {}mean reward | update loss | approx KL | entropy |\n|---|---|{}---|---|---|---|\n",
        cell,
        eval_names
            .iter()
            .map(|n| format!("{n} success | "))
            .collect::<String>(),
        "---|".repeat(eval_names.len()),
    );
    for (iteration, row) in rows {
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
    md
}

/// A cell's success curves: train, then each evaluate step's; a setup
/// step's evaluation has no iteration (it is in the table, row `setup`,
/// not a curve).
fn success_series(
    eval_names: &[String],
    rows: &BTreeMap<Option<u32>, Row>,
) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut series = vec![(
        "train (sampled rollouts)".to_string(),
        rows.iter()
            .filter_map(|(i, r)| Some((f64::from((*i)?), r.train?)))
            .collect::<Vec<_>>(),
    )];
    for name in eval_names {
        series.push((
            format!("eval step {name}"),
            rows.iter()
                .filter_map(|(i, r)| Some((f64::from((*i)?), *r.evals.get(name)?)))
                .collect(),
        ));
    }
    series.retain(|(_, points)| !points.is_empty());
    series
}

/// Every cell's curves on one chart.
fn every_cell(plan: &Plan, dir: &Path, all_cells: &Curves) -> Result<String> {
    let path = dir.join("success-cells.png");
    let title = format!("Success per iteration: {} cells", plan.cells.len());
    let iterations = f64::from(all_cells.iterations);
    embodyflow_plots::success_curves(&path, &title, &all_cells.series, iterations)
        .map_err(plot_err(&path))?;
    Ok(format!(
        "\n## Every cell\n\n![success of every cell](success-cells.png): x = iteration 0…{}, y = success 0…1; one curve per cell and series: {}.\n",
        all_cells.iterations - 1,
        embodyflow_plots::colour_key(&all_cells.series),
    ))
}

/// Chart file slug -> its metric (y label), the cells that have it and
/// their values.
type Charts = BTreeMap<String, (String, Vec<String>, Vec<f64>)>;

/// The ablation: a row per cell (also written as `ablation.md`), the cells
/// identical by construction, and a bar chart per metric.
fn ablation_section(
    plan: &Plan,
    dir: &Path,
    ablation: &[(String, BTreeMap<Option<u32>, Row>)],
) -> Result<String> {
    let mut table = String::from(
        "| cell | last eval success | last train success | mean reward | groups with signal | kept groups | A^E std | responses with A^S | sign-flip ratio |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut charts = Charts::new();
    for (name, rows) in ablation {
        table.push_str(&ablation_row(name, rows, &mut charts));
    }
    std::fs::write(dir.join("ablation.md"), &table)
        .map_err(|e| RunnerError::io(dir.join("ablation.md"), e))?;
    let mut md = format!("\n## Ablation ({} cells)\n\n{table}\n", plan.cells.len());
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
    Ok(md)
}

/// A cell's row of the ablation table; its figures join the charts.
fn ablation_row(name: &str, rows: &BTreeMap<Option<u32>, Row>, charts: &mut Charts) -> String {
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
            chart.1.push(name.to_string());
            chart.2.push(value);
        }
    }
    format!(
        "| {name} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
        fmt(eval),
        fmt(last(&|r: &Row| r.train)),
        fmt(score),
        fmt(signal),
        fmt(kept),
        fmt(adv_std),
        fmt(with_step),
        fmt(flips),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use embodyflow_plots::Png;

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

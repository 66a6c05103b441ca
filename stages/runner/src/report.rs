//! The run report, `OUT/report/`: `report.md` with the run summary, the wall
//! time per step, a metrics table per variant (per iteration: train success
//! of the sampled rollouts, success of each evaluate step, mean update loss,
//! approx KL and entropy), the ablation table when the pipeline sweeps (one
//! row per cell: last evaluation successes, train success, mean reward,
//! kept groups and the grpo_step diagnostics), and PNG plots: a success
//! curve per variant and a bar per cell. The plots carry no text (no font
//! backend); `report.md` says what their lines and bars are.
//!
//! Which figures a step gives follows from the outputs its stage declares
//! ([`embodyflow_core::spec`]), not from its name. The tables' figures are
//! gathered with polars lazy queries ([`embodyflow_report::column_means`]),
//! `diagnostics.json` is read typed ([`VariantDiagnostics`]), and all is
//! written as Markdown.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use embodyflow_core::schemas::TableName;
use embodyflow_core::spec::{self, Output};
use embodyflow_core::stage::Summary;
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

fn fmt(value: Option<f64>) -> String {
    value.map_or("-".to_string(), |v| format!("{v:.3}"))
}

/// What one variant measured per iteration (`None` = setup steps).
#[derive(Debug, Default, Clone)]
struct Row {
    train: Option<f64>,
    evals: BTreeMap<String, f64>,
    update: Option<Vec<f64>>,
    score: Option<f64>,
    diagnostics: Option<VariantDiagnostics>,
}

/// Gathers each instance's figures from the outputs its stage declares: the
/// train success of a trajectories table, the success of an eval table
/// (by step), the update figures of a metrics table, the mean score of a
/// rewards table and compute-advantages' diagnostics.
fn gather(instances: &[&Instance]) -> BTreeMap<Option<u32>, Row> {
    let mut rows: BTreeMap<Option<u32>, Row> = BTreeMap::new();
    for instance in instances {
        let row = rows.entry(instance.iteration).or_default();
        let dir = &instance.dir;
        for output in instance.stage.writes {
            match *output {
                Output::Table(TableName::Trajectories) => {
                    row.train =
                        column_means(dir, TableName::Trajectories, &["complete"]).map(|v| v[0])
                }
                Output::Table(TableName::Eval) => {
                    if let Some(v) = column_means(dir, TableName::Eval, &["success"]) {
                        row.evals.insert(instance.step.clone(), v[0]);
                    }
                }
                Output::Table(TableName::Metrics) => {
                    row.update =
                        column_means(dir, TableName::Metrics, &["loss", "approx_kl", "entropy"])
                }
                Output::Table(TableName::Rewards) => {
                    row.score = column_means(dir, TableName::Rewards, &["score"]).map(|v| v[0])
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

fn sanitize(name: &str) -> String {
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

const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn plot_err(path: &Path) -> impl Fn(String) -> RunnerError + '_ {
    move |reason| RunnerError::Plot {
        path: path.to_path_buf(),
        reason,
    }
}

/// Success curves: series of (iteration, value) on [0, 1].
fn plot_curves(path: &Path, series: &[Vec<(f64, f64)>], iterations: f64) -> Result<()> {
    let e = plot_err(path);
    let root = BitMapBackend::new(path, (640, 400)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(x.to_string()))?;
    let area = root.margin(20, 20, 20, 20);
    let mut chart = ChartBuilder::on(&area)
        .build_cartesian_2d(-0.2..(iterations - 1.0).max(1.0) + 0.2, 0f64..1f64)
        .map_err(|x| e(x.to_string()))?;
    for y in [0.0, 0.25, 0.5, 0.75, 1.0] {
        chart
            .draw_series(LineSeries::new(
                vec![(-0.2, y), ((iterations - 1.0).max(1.0) + 0.2, y)],
                RGBColor(220, 220, 220),
            ))
            .map_err(|x| e(x.to_string()))?;
    }
    for (k, points) in series.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
            .map_err(|x| e(x.to_string()))?;
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))
            .map_err(|x| e(x.to_string()))?;
    }
    root.present().map_err(|x| e(x.to_string()))
}

/// One bar per value on [0, max].
fn plot_bars(path: &Path, values: &[f64]) -> Result<()> {
    let e = plot_err(path);
    let root = BitMapBackend::new(path, (640, 400)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(x.to_string()))?;
    let top = values.iter().cloned().fold(1e-9, f64::max);
    let area = root.margin(20, 20, 20, 20);
    let mut chart = ChartBuilder::on(&area)
        .build_cartesian_2d(0f64..values.len() as f64, 0f64..top * 1.05)
        .map_err(|x| e(x.to_string()))?;
    chart
        .draw_series(values.iter().enumerate().map(|(k, &v)| {
            let colour = COLOURS[k % COLOURS.len()];
            Rectangle::new(
                [(k as f64 + 0.15, 0.0), (k as f64 + 0.85, v)],
                colour.filled(),
            )
        }))
        .map_err(|x| e(x.to_string()))?;
    root.present().map_err(|x| e(x.to_string()))
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
        .add("stage processes", format!("{stage_s:.1} s"))
        .add("runner overhead (planning, checks, hashing, merges, records)", format!(
            "{overhead:.2} s ({:.1} % of wall; planning {plan_s:.2} s, config checks {:.2} s, binary hashes {:.2} s)",
            100.0 * overhead / total.max(1e-9),
            outcome.check_s,
            outcome.binary_hash_s,
        ))
        .add("report", dir.join("report.md").display());
    let mut md = summary.to_markdown();
    md.push_str(
        "\n## Wall time per step\n\n| step | stage | status | wall s |\n|---|---|---|---|\n",
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
    let mut ablation: Vec<(String, BTreeMap<Option<u32>, Row>)> = Vec::new();
    let mut plots: Vec<PathBuf> = Vec::new();
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
            "\n## Metrics: {}\n\n| iteration | train success | {}mean reward | update loss | approx KL | entropy |\n|---|---|{}---|---|---|---|\n",
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
                fmt(update.map(|u| u[0])),
                fmt(update.map(|u| u[1])),
                fmt(update.map(|u| u[2])),
            ));
        }
        let iterations = rows.keys().flatten().max().map_or(0, |m| m + 1);
        if iterations > 0 {
            let mut series = vec![
                rows.iter()
                    .filter_map(|(i, r)| Some((f64::from((*i)?), r.train?)))
                    .collect::<Vec<_>>(),
            ];
            for name in &eval_names {
                series.push(
                    rows.iter()
                        .filter_map(|(i, r)| Some((f64::from((*i)?), *r.evals.get(name)?)))
                        .collect(),
                );
            }
            let path = dir.join(format!("success-{}.png", sanitize(&cell.name)));
            plot_curves(&path, &series, f64::from(iterations))?;
            md.push_str(&format!(
                "\n![success {}]({}): x = iteration 0…{}, y = success 0…1 (grid every 0.25); blue = train success of the sampled rollouts{}.\n",
                cell.name,
                path.file_name().unwrap().to_string_lossy(),
                iterations - 1,
                eval_names
                    .iter()
                    .enumerate()
                    .map(|(k, n)| format!(", {} = `{n}` success", ["red", "green", "orange", "purple", "brown"][k % 5]))
                    .collect::<String>()
            ));
            plots.push(path);
        }
        ablation.push((cell.name.clone(), rows));
    }
    if plan.cells.len() > 1 {
        let mut table = String::from(
            "| cell | last eval success | last train success | mean reward | kept groups | responses with A^S | sign-flip ratio |\n|---|---|---|---|---|---|---|\n",
        );
        let mut bars = Vec::new();
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
            table.push_str(&format!(
                "| {name} | {} | {} | {} | {} | {} | {} |\n",
                fmt(eval),
                fmt(last(&|r: &Row| r.train)),
                fmt(score),
                fmt(kept),
                fmt(with_step),
                fmt(flips),
            ));
            bars.push(eval.or(score).unwrap_or(0.0));
        }
        let path = dir.join("ablation.png");
        plot_bars(&path, &bars)?;
        std::fs::write(dir.join("ablation.md"), &table)
            .map_err(|e| RunnerError::io(dir.join("ablation.md"), e))?;
        md.push_str(&format!(
            "\n## Ablation ({} cells)\n\n{table}\n![ablation](ablation.png): one bar per cell in table order, height = last eval success (mean reward where no evaluate step ran).\n",
            plan.cells.len()
        ));
    }
    let path = dir.join("report.md");
    std::fs::write(&path, &md).map_err(|e| RunnerError::io(&path, e))?;
    let _ = plots;
    Ok(summary.to_markdown())
}

//! The success per iteration of RL runs (scripts/rl_loop's `curve.tsv`):
//! a table of each run's figures before RL, first and last, and
//! `success.png`, train success of the sampled rollouts and greedy val
//! success per iteration, from the policy RL started from.
//!
//! ```text
//! iteration<TAB>train_success<TAB>val_success     (a header line, then `-` for a missing value)
//! before<TAB>-<TAB>0.125                          (the RL init's val success, drawn at -1)
//! 0<TAB>0.250<TAB>-
//! ```

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::{ReportError, Result, opt};

/// One RL run's success per iteration: train success of the sampled
/// rollouts and, where evaluated, greedy val success.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Curve {
    /// (iteration, train success).
    pub train: Vec<(f64, f64)>,
    /// (iteration, val success), the evaluated iterations only.
    pub val: Vec<(f64, f64)>,
}

/// The iteration of a curve row that measured the policy RL started from,
/// before its first update; its points are at
/// [`embodyflow_plots::BEFORE_RL`].
pub const BEFORE: &str = "before";

/// Reads a curve file (see [`crate::Args::curves`]): a header line, then
/// `iteration<TAB>train<TAB>val` rows, `-` for a missing value, the
/// iteration a whole number or [`BEFORE`]. A row that is not three fields,
/// another iteration, or a success outside [0, 1] is an error naming the
/// file and line.
pub fn read_curve(path: &Path) -> Result<Curve> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ReportError::BadInput(format!("curve {}: {e}", path.display())))?;
    let mut curve = Curve::default();
    for (n, line) in text.lines().enumerate().skip(1) {
        let bad = |what: &str| {
            ReportError::BadInput(format!(
                "curve {} line {}: {what}: `{line}`",
                path.display(),
                n + 1
            ))
        };
        let fields: Vec<&str> = line.split('\t').collect();
        let [iteration, train, val] = fields[..] else {
            return Err(bad("expected iteration, train_success, val_success"));
        };
        let x = if iteration == BEFORE {
            embodyflow_plots::BEFORE_RL
        } else {
            let iteration: u32 = iteration
                .parse()
                .map_err(|_| bad("the iteration is not a whole number or `before`"))?;
            f64::from(iteration)
        };
        for (value, series) in [(train, &mut curve.train), (val, &mut curve.val)] {
            if value == "-" {
                continue;
            }
            let success: f64 = value
                .parse()
                .ok()
                .filter(|v| (0.0..=1.0).contains(v))
                .ok_or_else(|| bad("a success is `-` or a number in [0, 1]"))?;
            series.push((x, success));
        }
    }
    Ok(curve)
}

/// The curves' table and `success.png` in `out` (per curve a train line
/// and a val line, each drawn where it has points), as Markdown under a
/// heading the caller writes.
pub fn curves_report(curves: &[(String, PathBuf)], out: &Path) -> Result<String> {
    let mut series = Vec::new();
    let mut iterations = 0.0_f64;
    let mut md = String::from(
        "| run | iterations | val before RL | first train success | last train success | last val success |\n|---|---|---|---|---|---|\n",
    );
    for (name, path) in curves {
        let curve = read_curve(path)?;
        let last = |points: &[(f64, f64)]| points.last().map(|p| p.1);
        let before = |points: &[(f64, f64)]| {
            points
                .iter()
                .find(|p| p.0 == embodyflow_plots::BEFORE_RL)
                .map(|p| p.1)
        };
        let iterations_run = curve.train.iter().filter(|p| p.0 >= 0.0).count();
        let first_train = curve.train.iter().find(|p| p.0 >= 0.0).map(|p| p.1);
        let _ = writeln!(
            md,
            "| {name} | {iterations_run} | {} | {} | {} | {} |",
            opt(before(&curve.val)),
            opt(first_train),
            opt(last(&curve.train)),
            opt(last(&curve.val)),
        );
        iterations = curve
            .train
            .iter()
            .chain(&curve.val)
            .map(|p| p.0 + 1.0)
            .fold(iterations, f64::max);
        series.push((format!("{name}: train (sampled rollouts)"), curve.train));
        series.push((format!("{name}: val (greedy)"), curve.val));
    }
    series.retain(|(_, points)| !points.is_empty());
    let path = out.join("success.png");
    let title = match curves {
        [(name, _)] => format!("Success per iteration: {name}"),
        _ => format!("Success per iteration: {} runs", curves.len()),
    };
    embodyflow_plots::success_curves(&path, &title, &series, iterations).map_err(|e| {
        ReportError::Write {
            path: path.clone(),
            reason: e.to_string(),
        }
    })?;
    let drawn_before = series
        .iter()
        .flat_map(|(_, points)| points)
        .any(|p| p.0 == embodyflow_plots::BEFORE_RL);
    let _ = writeln!(
        md,
        "\n![success per iteration](success.png): x = {}iteration 0…{}, y = success 0…1; {}.",
        if drawn_before {
            "before RL (the policy RL started from), then "
        } else {
            ""
        },
        (iterations - 1.0).max(0.0),
        embodyflow_plots::colour_key(&series)
    );
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_curve_is_read_with_its_missing_values_and_drawn() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("curve.tsv");
        std::fs::write(
            &path,
            "iteration\ttrain_success\tval_success\nbefore\t-\t0.125\n0\t0.250\t-\n1\t0.5\t0.400\n",
        )
        .unwrap();
        let curve = read_curve(&path).unwrap();
        assert_eq!(curve.train, [(0.0, 0.25), (1.0, 0.5)]);
        // The figure's val line starts at the policy RL started from.
        assert_eq!(
            curve.val,
            [(embodyflow_plots::BEFORE_RL, 0.125), (1.0, 0.4)]
        );
        let out = embodyflow_plots::test_dir(dir.path());
        let md = curves_report(&[("grpo".into(), path.clone())], &out).unwrap();
        assert!(
            md.contains("| grpo | 2 | 0.125 | 0.250 | 0.500 | 0.400 |"),
            "{md}"
        );
        assert!(
            md.contains("x = before RL (the policy RL started from), then iteration 0…1"),
            "{md}"
        );
        assert!(
            md.contains("blue = grpo: train (sampled rollouts), red = grpo: val (greedy)"),
            "{md}"
        );
        let png = embodyflow_plots::Png::read(&out.join("success.png")).unwrap();
        assert!(png.dark_in(200..440, 0..30) > 50, "no title");
        for (text, why) in [
            ("h\n0\t0.5\n", "expected iteration"),
            ("h\nzero\t0.5\t-\n", "not a whole number or `before`"),
            ("h\n0\t1.5\t-\n", "in [0, 1]"),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = read_curve(&path).unwrap_err().to_string();
            assert!(err.contains(why) && err.contains("line 2"), "{err}");
        }
    }
}

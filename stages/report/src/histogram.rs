//! The histogram of A^S on a variant's credited tokens: successful
//! trajectories beside failed ones, each as a share of its own tokens.
//!
//! ```text
//! bin(x) = floor((clamp(x, -1, 1) + 1) / 2 · 40), share = 100 · count / group tokens
//! ```

use std::path::Path;

use crate::{ReportError, Result};

/// Histograms of A^S on credited tokens in [-1, 1] (40 bins, values
/// outside clamped to the end bins): successful trajectories in blue, failed
/// in red side by side in each bin, each as the percentage of its own tokens
/// so groups of different sizes compare; the legend gives each group's count.
pub fn histogram_png(path: &Path, values: &(Vec<f32>, Vec<f32>)) -> Result<()> {
    use embodyflow_plots::{Frame, PALETTE, canvas, legend, swatch, text};
    use plotters::prelude::*;
    const BINS: usize = 40;
    let shares = |v: &[f32]| {
        let mut bins = [0u64; BINS];
        for &x in v {
            let i = (((x.clamp(-1.0, 1.0) + 1.0) / 2.0) * BINS as f32) as usize;
            bins[i.min(BINS - 1)] += 1;
        }
        bins.map(|c| 100.0 * c as f64 / v.len().max(1) as f64)
    };
    let groups = [
        (
            shares(&values.0),
            PALETTE[0],
            "successful",
            values.0.len(),
            0.0,
        ),
        (shares(&values.1), PALETTE[1], "failed", values.1.len(), 0.5),
    ];
    let top = groups
        .iter()
        .flat_map(|g| g.0.iter().copied())
        .fold(10.0, f64::max)
        * 1.1;
    let draw = || -> std::result::Result<(), embodyflow_plots::PlotError> {
        let root = canvas(path, (640, 400))?;
        let mut chart = Frame::new(
            "A^S on credited tokens",
            "A^S (advantage units)",
            "share of the group's credited tokens (%)",
        )
        .ranges(-1.0..1.0, 0.0..top)
        .draw(&root)?;
        let width = 2.0 / BINS as f64;
        for (bins, colour, name, n, offset) in &groups {
            chart
                .draw_series(bins.iter().enumerate().filter(|(_, s)| **s > 0.0).map(
                    |(i, &share)| {
                        let x = -1.0 + (i as f64 + offset) * width;
                        Rectangle::new([(x, 0.0), (x + width / 2.0, share)], colour.filled())
                    },
                ))?
                .label(format!("{name} trajectories ({n} tokens)"))
                .legend(swatch(*colour));
        }
        chart.draw_series(LineSeries::new(vec![(0.0, 0.0), (0.0, top)], BLACK))?;
        if values.0.is_empty() && values.1.is_empty() {
            chart.draw_series(std::iter::once(Text::new(
                "no credited tokens (A^S = 0 everywhere)",
                (-0.6, top * 0.5),
                text(16),
            )))?;
        }
        legend(&mut chart)?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| ReportError::Write {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_has_a_title_axes_and_a_legend_and_says_when_empty() {
        use embodyflow_plots::Png;
        let tmp = tempfile::tempdir().unwrap();
        let dir = embodyflow_plots::test_dir(tmp.path());
        let some = dir.join("report-histogram.png");
        let values = (vec![0.5, 0.6, 0.55, -0.1], vec![-0.5, -0.45, 0.1]);
        histogram_png(&some, &values).unwrap();
        let empty = dir.join("report-histogram-empty.png");
        histogram_png(&empty, &(vec![], vec![])).unwrap();
        let (some, empty) = (Png::read(&some).unwrap(), Png::read(&empty).unwrap());
        for png in [&some, &empty] {
            assert_eq!((png.width, png.height), (640, 400));
            assert!(png.dark_in(200..440, 0..30) > 50, "no title");
            assert!(png.dark_in(0..25, 100..300) > 30, "no y axis label");
            assert!(png.dark_in(250..400, 370..400) > 30, "no x axis label");
            // The legend box, upper left of the plot.
            assert!(png.dark_in(70..300, 35..90) > 100, "no legend");
        }
        assert!(some.colours() > empty.colours());
        let middle = |png: &Png| png.dark_in(150..500, 150..250);
        assert!(middle(&empty) > middle(&some) + 50, "no note");
    }
}

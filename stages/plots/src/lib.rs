//! The common frame of every PNG the project writes (the report's A^S
//! histogram and per-token heatmap, compute-advantages' `--heatmaps`, the
//! runner's success curves and ablation bars): one embedded font, a title,
//! axes labelled with their units, a legend or a colour scale.
//!
//! Text is drawn by plotters' `ab_glyph` path from DejaVu Sans, whose bytes
//! the `dejavu` crate compiles into the binary ([`canvas`] registers it once
//! as `sans-serif`): no system fonts, fontconfig or FreeType are needed, so a
//! plot renders the same on a bare CI machine as on a workstation.
//!
//! Token text: [`token_texts`] decodes a response's ids one token at a time
//! (`#id` without a tokenizer) and [`token_strip`] draws them above a
//! heatmap's columns, read bottom to top ([`TOKEN_CELL`] pixels a column).
//!
//! Any scalar: [`curves`] draws named [`Curve`]s on the scale of their
//! values, each with its seeds' band (the run log's PNGs).
//!
//! Success per iteration: [`success_curves`] draws named series of
//! (iteration, success) on [0, 1] (the run report's curves, `report
//! --curve`), [`colour_key`] names them by colour for the Markdown beside.
//!
//! Colours: [`diverging`] is the seeds' `RdBu_r` centred at 0 (red positive,
//! blue negative, white zero), [`PALETTE`] the series colours (tab10).
//!
//! ```no_run
//! use embodyflow_plots::{canvas, Frame};
//! use plotters::prelude::*;
//! let root = canvas(std::path::Path::new("curve.png"), (640, 400))?;
//! let mut chart = Frame::new("Success per iteration", "iteration", "success rate (fraction)")
//!     .ranges(0.0..3.0, 0.0..1.0)
//!     .draw(&root)?;
//! chart
//!     .draw_series(LineSeries::new(vec![(0.0, 0.1), (3.0, 0.6)], BLUE))?
//!     .label("train")
//!     .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
//! embodyflow_plots::legend(&mut chart)?;
//! root.present()?;
//! # Ok::<(), embodyflow_plots::PlotError>(())
//! ```

use std::ops::Range;
use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{FontStyle, register_font};

/// The family name the embedded font is registered under.
pub const FONT: &str = "sans-serif";

/// Series colours (matplotlib's tab10), in the order series are drawn.
pub const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// The colour names of [`PALETTE`], for Markdown that describes a plot.
pub const PALETTE_NAMES: [&str; 6] = ["blue", "red", "green", "orange", "purple", "brown"];

/// Why a plot could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The embedded font did not parse (a broken build, not bad input).
    #[error("the embedded DejaVu Sans font could not be registered")]
    Font,
    /// plotters failed to draw or to write the image.
    #[error("{0}")]
    Draw(String),
}

impl<E: std::error::Error + Send + Sync> From<DrawingAreaErrorKind<E>> for PlotError {
    fn from(e: DrawingAreaErrorKind<E>) -> PlotError {
        PlotError::Draw(e.to_string())
    }
}

/// Result of drawing.
pub type Result<T> = std::result::Result<T, PlotError>;

/// Registers the embedded font (once per process).
fn register() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED
        .get_or_init(|| register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok());
    if ok { Ok(()) } else { Err(PlotError::Font) }
}

/// A white PNG canvas of `size` pixels (width, height) writing to `path` on
/// `present()`, with the font registered.
pub fn canvas(path: &Path, size: (u32, u32)) -> Result<DrawingArea<BitMapBackend<'_>, Shift>> {
    register()?;
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;
    Ok(root)
}

/// The embedded font at `size` pixels, black.
pub fn text(size: u32) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font()).color(&BLACK)
}

/// Draws `title` centred at the top of `area` and returns the area below it.
pub fn title<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
) -> Result<DrawingArea<DB, Shift>> {
    Ok(area.titled(title, text(18))?)
}

/// Names an x tick from its position.
pub type TickName<'a> = &'a dyn Fn(&f64) -> String;

/// A 2-D chart over f64 ranges: title, both axes labelled (the labels carry
/// the units), tick numbers and a light grid.
pub struct Frame<'a> {
    title: &'a str,
    x_label: &'a str,
    y_label: &'a str,
    x: Range<f64>,
    y: Range<f64>,
    x_ticks: Option<(usize, TickName<'a>)>,
}

impl<'a> Frame<'a> {
    /// A frame with ranges 0..1 on both axes.
    pub fn new(title: &'a str, x_label: &'a str, y_label: &'a str) -> Frame<'a> {
        Frame {
            title,
            x_label,
            y_label,
            x: 0.0..1.0,
            y: 0.0..1.0,
            x_ticks: None,
        }
    }

    /// The axes' ranges.
    pub fn ranges(mut self, x: Range<f64>, y: Range<f64>) -> Frame<'a> {
        self.x = x;
        self.y = y;
        self
    }

    /// `count` x ticks named by `name` (e.g. categories at integer positions).
    pub fn x_ticks(mut self, count: usize, name: TickName<'a>) -> Frame<'a> {
        self.x_ticks = Some((count, name));
        self
    }

    /// Draws the frame into `area` and returns the chart to draw series on.
    pub fn draw<'c, DB: DrawingBackend>(
        &self,
        area: &'c DrawingArea<DB, Shift>,
    ) -> Result<ChartContext<'c, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>> {
        let mut chart = ChartBuilder::on(area)
            .caption(self.title, text(18))
            .margin(10)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(self.x.clone(), self.y.clone())?;
        let mut mesh = chart.configure_mesh();
        mesh.x_desc(self.x_label)
            .y_desc(self.y_label)
            .label_style(text(12))
            .axis_desc_style(text(14))
            .light_line_style(RGBColor(240, 240, 240))
            .bold_line_style(RGBColor(215, 215, 215));
        if let Some((count, name)) = self.x_ticks {
            mesh.x_labels(count)
                .x_label_formatter(name)
                .disable_x_mesh();
        }
        mesh.draw()?;
        Ok(chart)
    }
}

/// Draws the legend of the series drawn with a `.label(..)` (upper left,
/// framed on a white background).
pub fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(text(12))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// A legend entry's marker: a filled square of `colour`.
pub fn swatch(colour: RGBColor) -> impl Fn((i32, i32)) -> Rectangle<(i32, i32)> {
    move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled())
}

/// Success per iteration, as a PNG of 640 × 400 at `path`: each named series
/// of (iteration, success) on [0, 1] in [`PALETTE`] order over iterations
/// 0 to `iterations - 1`, and from [`BEFORE_RL`] (tick `before`) when a
/// series has a point there (the policy RL started from), with a legend
/// (and a note when every value is 0, whose points lie on the x axis, or
/// there is none).
pub fn success_curves(
    path: &Path,
    title: &str,
    series: &[(String, Vec<(f64, f64)>)],
    iterations: f64,
) -> Result<()> {
    let root = canvas(path, (640, 400))?;
    let last = (iterations - 1.0).max(1.0);
    let before = series.iter().flat_map(|(_, p)| p).any(|p| p.0 == BEFORE_RL);
    let first = if before { BEFORE_RL } else { 0.0 };
    let whole = |x: &f64| {
        if before && *x == BEFORE_RL {
            "before".to_string()
        } else if x.fract() == 0.0 {
            format!("{x:.0}")
        } else {
            String::new()
        }
    };
    let x_label = if before {
        "iteration (before: the policy RL started from)"
    } else {
        "iteration"
    };
    let mut chart = Frame::new(title, x_label, "success rate (fraction of episodes)")
        .ranges(first - 0.2..last + 0.2, -0.03..1.03)
        .x_ticks(((last - first + 1.0) as usize).min(12), &whole)
        .draw(&root)?;
    for (k, (name, points)) in series.iter().enumerate() {
        let colour = PALETTE[k % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))?
            .label(name.as_str())
            .legend(swatch(colour));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))?;
    }
    let points: Vec<f64> = series.iter().flat_map(|(_, p)| p).map(|p| p.1).collect();
    let note = if points.is_empty() {
        Some("no success figures in this run")
    } else if points.iter().all(|&y| y == 0.0) {
        Some("every success rate is 0")
    } else {
        None
    };
    if let Some(note) = note {
        chart.draw_series(std::iter::once(Text::new(
            note,
            (last * 0.35, 0.5),
            text(16),
        )))?;
    }
    legend(&mut chart)?;
    root.present()?;
    Ok(())
}

/// The x at which [`success_curves`] draws the policy RL started from
/// (before iteration 0, as the run log draws setup steps).
pub const BEFORE_RL: f64 = -1.0;

/// One curve of [`curves`]: named points and, for a group of seeds, the
/// band from the lowest to the highest seed at each x.
#[derive(Debug, Clone, Default)]
pub struct Curve {
    /// The legend's name.
    pub name: String,
    /// (x, y), drawn as a line with a marker on each point.
    pub points: Vec<(f64, f64)>,
    /// (x, lowest, highest), drawn as a translucent band under the line.
    pub band: Vec<(f64, f64, f64)>,
}

/// Named curves of any scalar, as a PNG of 640 × 400 at `path`: each in
/// [`PALETTE`] order with its band (the seeds' spread) and a legend; the
/// axes span the points and bands, 5 % beyond them (a constant curve
/// spans its value ± 1, or ± 5 % of it).
pub fn curves(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    curves: &[Curve],
) -> Result<()> {
    let root = canvas(path, (640, 400))?;
    let xs = curves.iter().flat_map(|c| {
        c.points
            .iter()
            .map(|p| p.0)
            .chain(c.band.iter().map(|b| b.0))
    });
    let ys = curves.iter().flat_map(|c| {
        c.points
            .iter()
            .map(|p| p.1)
            .chain(c.band.iter().flat_map(|b| [b.1, b.2]))
    });
    let span = |values: &mut dyn Iterator<Item = f64>| {
        let (lo, hi) = values
            .filter(|v| v.is_finite())
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            });
        if lo > hi {
            0.0..1.0
        } else if hi - lo < 1e-12 {
            let pad = if lo.abs() > 1e-12 {
                lo.abs() * 0.05
            } else {
                1.0
            };
            lo - pad..hi + pad
        } else {
            let pad = (hi - lo) * 0.05;
            lo - pad..hi + pad
        }
    };
    let mut chart = Frame::new(title, x_label, y_label)
        .ranges(span(&mut { xs }), span(&mut { ys }))
        .draw(&root)?;
    for (k, curve) in curves.iter().enumerate() {
        let colour = PALETTE[k % PALETTE.len()];
        if !curve.band.is_empty() {
            let outline: Vec<(f64, f64)> = curve
                .band
                .iter()
                .map(|b| (b.0, b.2))
                .chain(curve.band.iter().rev().map(|b| (b.0, b.1)))
                .collect();
            chart.draw_series(std::iter::once(Polygon::new(
                outline,
                colour.mix(0.2).filled(),
            )))?;
        }
        chart
            .draw_series(LineSeries::new(
                curve.points.clone(),
                colour.stroke_width(2),
            ))?
            .label(curve.name.as_str())
            .legend(swatch(colour));
        chart.draw_series(
            curve
                .points
                .iter()
                .map(|&p| Circle::new(p, 3, colour.filled())),
        )?;
    }
    legend(&mut chart)?;
    root.present()?;
    Ok(())
}

/// Names each curve [`success_curves`] draws by its colour, in drawing order:
/// `blue = train (sampled rollouts), red = eval step eval`.
pub fn colour_key(series: &[(String, Vec<(f64, f64)>)]) -> String {
    series
        .iter()
        .enumerate()
        .map(|(k, (name, _))| format!("{} = {name}", PALETTE_NAMES[k % PALETTE_NAMES.len()]))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Red for positive, blue for negative, white for zero (`RdBu_r` centred at
/// 0), `value / scale` clamped to [-1, 1]; a non-positive scale is white.
pub fn diverging(value: f64, scale: f64) -> RGBColor {
    let t = if scale > 0.0 {
        (value / scale).clamp(-1.0, 1.0)
    } else {
        0.0
    };
    let fade = (255.0 * (1.0 - t.abs())) as u8;
    if t >= 0.0 {
        RGBColor(255, fade, fade)
    } else {
        RGBColor(fade, fade, 255)
    }
}

/// A vertical colour scale of [`diverging`] over [-scale, scale] in `area`
/// (best about 90 px wide: 55 px of numbers, a bar of the rest less 15 px), with tick numbers and `label` (its unit) beside.
pub fn colour_bar<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    scale: f64,
    label: &str,
) -> Result<()> {
    let scale = if scale > 0.0 { scale } else { 1.0 };
    let mut bar = ChartBuilder::on(area)
        .margin_top(10)
        .margin_bottom(10)
        .margin_right(15)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..1f64, -scale..scale)?;
    bar.configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .y_labels(5)
        .y_desc(label)
        .label_style(text(12))
        .axis_desc_style(text(12))
        .draw()?;
    const STEPS: usize = 64;
    bar.draw_series((0..STEPS).map(|k| {
        let lo = -scale + 2.0 * scale * k as f64 / STEPS as f64;
        let hi = lo + 2.0 * scale / STEPS as f64;
        Rectangle::new(
            [(0.0, lo), (1.0, hi)],
            diverging((lo + hi) / 2.0, scale).filled(),
        )
    }))?;
    bar.draw_series(std::iter::once(Rectangle::new(
        [(0.0, -scale), (1.0, scale)],
        BLACK.stroke_width(1),
    )))?;
    Ok(())
}

/// Draws a token-position axis under a heatmap whose token `t` occupies
/// columns `x0 + t * cell .. x0 + (t + 1) * cell`: a baseline at row `y`,
/// ticks at round positions (at most about 12) with their numbers, and the
/// label "response token position (tokens)" below.
pub fn token_axis<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    (x0, y): (i32, i32),
    cell: i32,
    tokens: usize,
) -> Result<()> {
    let end = x0 + cell * tokens.max(1) as i32;
    root.draw(&PathElement::new(vec![(x0, y), (end, y)], BLACK))?;
    let step = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
        .into_iter()
        .find(|s| tokens / s <= 12)
        .unwrap_or(2000);
    for t in (0..=tokens).step_by(step) {
        let x = x0 + cell * t as i32;
        root.draw(&PathElement::new(vec![(x, y), (x, y + 4)], BLACK))?;
        root.draw(&Text::new(
            t.to_string(),
            (x, y + 6),
            text(12).pos(Pos::new(HPos::Center, VPos::Top)),
        ))?;
    }
    root.draw(&Text::new(
        "response token position (tokens)",
        ((x0 + end) / 2, y + 22),
        text(13).pos(Pos::new(HPos::Center, VPos::Top)),
    ))?;
    Ok(())
}

/// Width of a token's column when its text is drawn (pixels): one line of
/// 12-pixel text, read bottom to top.
pub const TOKEN_CELL: i32 = 12;

/// Height of a token strip (pixels): room for [`TOKEN_CHARS`] characters.
pub const TOKEN_STRIP: i32 = 84;

/// The most characters of a token's text a strip shows.
pub const TOKEN_CHARS: usize = 12;

/// A token's text as a strip draws it: whitespace made visible (space `·`,
/// newline `⏎`, tab `→`), at most [`TOKEN_CHARS`] characters.
pub fn shown(token: &str) -> String {
    token
        .chars()
        .map(|c| match c {
            ' ' => '·',
            '\n' => '⏎',
            '\t' => '→',
            c => c,
        })
        .take(TOKEN_CHARS)
        .collect()
}

/// Each token's text: the tokenizer's decoding of the token alone, or
/// `#id` without a tokenizer (or where it cannot decode the id).
pub fn token_texts(ids: &[i32], tokenizer: Option<&tokenizers::Tokenizer>) -> Vec<String> {
    ids.iter()
        .map(|&id| {
            u32::try_from(id)
                .ok()
                .and_then(|id| tokenizer?.decode(&[id], false).ok())
                .unwrap_or_else(|| format!("#{id}"))
        })
        .collect()
}

/// Draws a token strip over a heatmap whose token `t` occupies columns
/// `x0 + t * cell .. x0 + (t + 1) * cell`: each token's [`shown`] text in
/// 12-pixel type, read bottom to top, centred on its column and starting at
/// row `bottom` (the strip spans [`TOKEN_STRIP`] rows above it).
pub fn token_strip<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    (x0, bottom): (i32, i32),
    cell: i32,
    tokens: &[String],
) -> Result<()> {
    let style = text(12)
        .transform(FontTransform::Rotate270)
        .pos(Pos::new(HPos::Left, VPos::Center));
    for (t, token) in tokens.iter().enumerate() {
        let x = x0 + t as i32 * cell + cell / 2;
        root.draw(&Text::new(shown(token), (x, bottom), style.clone()))?;
    }
    Ok(())
}

/// A PNG read back as 8-bit RGB, to check what a plot shows (tests: a plot
/// with a title has dark pixels in its top rows, a blank image one colour).
#[derive(Debug, Clone)]
pub struct Png {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    rgb: Vec<u8>,
}

impl Png {
    /// Reads `path` (8-bit RGB or RGBA, as plotters writes).
    pub fn read(path: &Path) -> Result<Png> {
        let fail = |e: &dyn std::fmt::Display| PlotError::Draw(format!("{}: {e}", path.display()));
        let file = std::fs::File::open(path).map_err(|e| fail(&e))?;
        let mut reader = png::Decoder::new(std::io::BufReader::new(file))
            .read_info()
            .map_err(|e| fail(&e))?;
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).map_err(|e| fail(&e))?;
        let channels = match info.color_type {
            png::ColorType::Rgb => 3,
            png::ColorType::Rgba => 4,
            other => return Err(fail(&format!("colour type {other:?}, expected RGB"))),
        };
        let rgb = buf[..info.buffer_size()]
            .chunks(channels)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect();
        Ok(Png {
            width: info.width,
            height: info.height,
            rgb,
        })
    }

    /// How many distinct colours the image has.
    pub fn colours(&self) -> usize {
        let set: std::collections::HashSet<&[u8]> = self.rgb.chunks(3).collect();
        set.len()
    }

    /// Dark pixels (as text is drawn: each channel below 100) in the
    /// rectangle of columns `x` and rows `y`.
    pub fn dark_in(&self, x: Range<u32>, y: Range<u32>) -> usize {
        let mut n = 0;
        for row in y.start..y.end.min(self.height) {
            for col in x.start..x.end.min(self.width) {
                let i = 3 * (row * self.width + col) as usize;
                n += usize::from(self.rgb[i..i + 3].iter().all(|&c| c < 100));
            }
        }
        n
    }

    /// The leftmost column in rows `y` holding a pixel of exactly `colour`
    /// (a series drawn in it), if any.
    pub fn first_column(&self, colour: RGBColor, y: Range<u32>) -> Option<u32> {
        let want = [colour.0, colour.1, colour.2];
        (0..self.width).find(|&col| {
            (y.start..y.end.min(self.height)).any(|row| {
                let i = 3 * (row * self.width + col) as usize;
                self.rgb[i..i + 3] == want
            })
        })
    }
}

/// Where a test should write the plots it draws: `$EMBODYFLOW_PLOT_DIR`
/// when set (to look at them), else `fallback` (a temporary directory).
pub fn test_dir(fallback: &Path) -> std::path::PathBuf {
    match std::env::var_os("EMBODYFLOW_PLOT_DIR") {
        Some(dir) => {
            let dir = std::path::PathBuf::from(dir);
            std::fs::create_dir_all(&dir).ok();
            dir
        }
        None => fallback.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diverging_is_white_at_zero_and_saturates() {
        assert_eq!(diverging(0.0, 1.0), RGBColor(255, 255, 255));
        assert_eq!(diverging(2.0, 1.0), RGBColor(255, 0, 0));
        assert_eq!(diverging(-1.0, 1.0), RGBColor(0, 0, 255));
        assert_eq!(diverging(0.5, 0.0), RGBColor(255, 255, 255));
    }

    #[test]
    fn token_texts_decode_or_fall_back_to_ids_and_whitespace_is_shown() {
        let tokenizer: tokenizers::Tokenizer = r#"{"version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [], "normalizer": null, "pre_tokenizer": null, "post_processor": null,
            "decoder": null, "model": {"type": "WordLevel", "vocab": {"pick": 0, "up": 1}, "unk_token": "pick"}}"#
            .parse()
            .unwrap();
        assert_eq!(token_texts(&[1, 0], Some(&tokenizer)), vec!["up", "pick"]);
        assert_eq!(token_texts(&[5, 17, -1], None), vec!["#5", "#17", "#-1"]);
        assert_eq!(shown(" up\n"), "·up⏎");
        assert_eq!(shown("abcdefghijklmnop"), "abcdefghijkl");
    }

    #[test]
    fn a_token_strip_draws_text_above_its_baseline_only() {
        let tmp = tempfile::tempdir().unwrap();
        let path = test_dir(tmp.path()).join("token-strip.png");
        let root = canvas(&path, (300, 120)).unwrap();
        let tokens: Vec<String> = ["{\"", "plan", " up", "\n"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        token_strip(&root, (20, 100), TOKEN_CELL, &tokens).unwrap();
        root.present().unwrap();
        let png = Png::read(&path).unwrap();
        // Four columns of text above row 100, nothing right of them or below.
        assert!(png.dark_in(20..68, 100 - TOKEN_STRIP as u32..100) > 60);
        assert_eq!(png.dark_in(74..300, 0..120), 0);
        assert_eq!(png.dark_in(0..300, 104..120), 0);
    }

    #[test]
    fn a_frame_has_its_title_axes_colour_bar_and_legend_in_text() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = test_dir(tmp.path());
        let path = dir.join("frame.png");
        let root = canvas(&path, (640, 400)).unwrap();
        let (left, right) = root.split_horizontally(540);
        let mut chart = Frame::new("A title", "x (units)", "y (units)")
            .ranges(0.0..2.0, -1.0..1.0)
            .draw(&left)
            .unwrap();
        chart
            .draw_series(LineSeries::new(vec![(0.0, -0.5), (2.0, 0.5)], PALETTE[0]))
            .unwrap()
            .label("a line")
            .legend(swatch(PALETTE[0]));
        legend(&mut chart).unwrap();
        colour_bar(&right, 0.5, "value (units)").unwrap();
        root.present().unwrap();
        drop(chart);
        let png = Png::read(&path).unwrap();
        assert_eq!((png.width, png.height), (640, 400));
        assert!(png.colours() > 20, "{} colours", png.colours());
        // The title, centred in the top 30 rows of the chart's 540 columns.
        assert!(png.dark_in(200..340, 0..30) > 50);
        // The y axis label, rotated, at the left edge.
        assert!(png.dark_in(0..25, 100..300) > 30);
        // The colour bar's numbers left of its gradient.
        assert!(png.dark_in(560..610, 0..400) > 30);
        let blank = dir.join("blank.png");
        canvas(&blank, (64, 32)).unwrap().present().unwrap();
        let blank = Png::read(&blank).unwrap();
        assert_eq!(blank.colours(), 1);
        assert_eq!(blank.dark_in(0..64, 0..32), 0);
    }

    #[test]
    fn curves_draw_bands_lines_and_a_legend_on_their_own_scale() {
        let tmp = tempfile::tempdir().unwrap();
        let path = test_dir(tmp.path()).join("curves.png");
        let seeds = Curve {
            name: "lr=1e-4 (mean of 2 seeds)".into(),
            points: vec![(0.0, 10.0), (1.0, 12.0), (2.0, 11.0)],
            band: vec![(0.0, 9.0, 11.0), (1.0, 10.0, 14.0), (2.0, 10.5, 11.5)],
        };
        let flat = Curve {
            name: "lr=3e-5".into(),
            points: vec![(0.0, 10.0), (2.0, 10.0)],
            band: Vec::new(),
        };
        curves(&path, "update: loss", "iteration", "loss", &[seeds, flat]).unwrap();
        let png = Png::read(&path).unwrap();
        assert_eq!((png.width, png.height), (640, 400));
        assert!(png.colours() > 20, "{} colours", png.colours());
        assert!(png.dark_in(200..440, 0..30) > 50, "no title");
        assert!(png.dark_in(0..25, 100..300) > 30, "no y axis label");
        // A constant curve alone still draws (its value ± 5 %).
        let alone = test_dir(tmp.path()).join("curves-constant.png");
        let flat = Curve {
            name: "x".into(),
            points: vec![(0.0, 3.0), (1.0, 3.0)],
            band: Vec::new(),
        };
        curves(&alone, "constant", "iteration", "value", &[flat]).unwrap();
        assert!(Png::read(&alone).unwrap().colours() > 5);
    }

    #[test]
    fn success_curves_have_a_title_axes_and_a_legend() {
        let tmp = tempfile::tempdir().unwrap();
        let path = test_dir(tmp.path()).join("success.png");
        let series = vec![
            (
                "train (sampled rollouts)".to_string(),
                vec![(0.0, 0.1), (1.0, 0.3), (2.0, 0.5)],
            ),
            ("eval step eval".to_string(), vec![(0.0, 0.0), (2.0, 0.4)]),
        ];
        success_curves(&path, "Success per iteration: base", &series, 3.0).unwrap();
        let png = Png::read(&path).unwrap();
        assert_eq!((png.width, png.height), (640, 400));
        assert!(png.colours() > 20, "{} colours", png.colours());
        assert!(png.dark_in(200..440, 0..30) > 50, "no title");
        assert!(png.dark_in(0..25, 100..300) > 30, "no y axis label");
        assert!(png.dark_in(250..400, 370..400) > 30, "no x axis label");
        assert_eq!(
            colour_key(&series),
            "blue = train (sampled rollouts), red = eval step eval"
        );
    }

    #[test]
    fn a_success_point_before_rl_is_drawn_left_of_iteration_0() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = test_dir(tmp.path());
        let train = vec![(0.0, 0.1), (1.0, 0.2), (2.0, 0.3)];
        // Below the legend (upper left): the rows of success 0 to ~0.4.
        let rows = 200..350;
        let mut leftmost = Vec::new();
        for (name, val) in [
            ("success-before.png", vec![(BEFORE_RL, 0.2), (1.0, 0.25)]),
            ("success-no-before.png", vec![(1.0, 0.2), (2.0, 0.25)]),
        ] {
            let path = dir.join(name);
            let series = vec![
                ("train".to_string(), train.clone()),
                ("val".to_string(), val),
            ];
            success_curves(&path, "Success per iteration", &series, 3.0).unwrap();
            let png = Png::read(&path).unwrap();
            let first = |colour| png.first_column(colour, rows.clone()).unwrap();
            leftmost.push((first(PALETTE[0]), first(PALETTE[1])));
        }
        let ((train_before, val_before), (train_plain, val_plain)) = (leftmost[0], leftmost[1]);
        assert!(val_before + 30 < train_before, "{leftmost:?}");
        assert!(val_plain > train_plain, "{leftmost:?}");
    }
}

//! The image processor of Qwen2-VL, Qwen2.5-VL and Qwen3-VL
//! (transformers' `Qwen2VLImageProcessorPil`), configured by a model
//! directory's `preprocessor_config.json`: an RGB image (8 bits per channel)
//! becomes the flattened patches the vision encoder reads.
//!
//! ```text
//! (h', w') = smart_resize(h, w): multiples of factor = patch_size × merge_size,
//!            round(h / factor) · factor (ties to even), and if h'·w' > max_pixels:
//!            floor(h / β / factor) · factor, β = sqrt(h·w / max_pixels);
//!            if < min_pixels: ceil(h · β / factor) · factor, β = sqrt(min_pixels / (h·w))
//! resize     Pillow's bicubic resampling (a = -0.5, support scaled by the
//!            reduction, 22-bit fixed-point coefficients, one pass per axis,
//!            each rounded back to 8 bits), as PIL.Image.resize does it
//! x          = f32(v · rescale_factor) (computed in f64), (x - mean_c) / std_c in f32
//! patches    one row per patch, merge blocks row-major, patches row-major within
//!            a block; a row holds channel, temporal copy (the image repeated
//!            temporal_patch_size times), patch row, patch column
//! ```
//!
//! The port is exact when the passes run in Pillow's order: the pixel tensor
//! then equals the processor's bit for bit (`tests/vl.rs`, images resized
//! up, down, and one axis each way). Pillow 13 picks the order of the two
//! passes by a rule we reproduce on most but not all sizes (see
//! `resize_bicubic`); where it differs the bytes differ by up to about
//! 20/255. transformers' torchvision backend (used when torchvision is
//! installed) resamples with torch's antialiased bicubic instead.
//!
//! `min_pixels` / `max_pixels` come from `size.shortest_edge` /
//! `size.longest_edge` (or the older top-level `min_pixels` / `max_pixels`,
//! which take precedence, as in transformers).
//!
//! ```no_run
//! use embodyflow_hf::image::{ImageProcessor, RgbImage};
//! let processor = ImageProcessor::from_file("Qwen2.5-VL-3B-Instruct/preprocessor_config.json".as_ref()).unwrap();
//! let image = RgbImage::new(480, 640, vec![0; 480 * 640 * 3]).unwrap();
//! let images = processor.process(&[image]).unwrap();
//! assert_eq!(images.grid_thw, [[1, 34, 46]]);
//! ```

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use tch::Tensor;

use crate::HfError;
use crate::vl::{Images, VlConfig};

/// An RGB image, 8 bits per channel, rows top to bottom, `[H, W, 3]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RgbImage {
    height: usize,
    width: usize,
    data: Vec<u8>,
}

impl RgbImage {
    /// An image of `height × width` pixels from `data` (`H·W·3` bytes).
    pub fn new(height: usize, width: usize, data: Vec<u8>) -> Result<RgbImage, HfError> {
        if data.len() != height * width * 3 || height == 0 || width == 0 {
            return Err(HfError::BadBatch(format!(
                "an RGB image of {height} x {width} needs {} bytes, got {}",
                height * width * 3,
                data.len()
            )));
        }
        Ok(RgbImage {
            height,
            width,
            data,
        })
    }

    /// Height in pixels.
    pub fn height(&self) -> usize {
        self.height
    }

    /// Width in pixels.
    pub fn width(&self) -> usize {
        self.width
    }

    /// The bytes, `[H, W, 3]`.
    pub fn data(&self) -> &[u8] {
        &self.data
    }
}

/// A resolved `preprocessor_config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageProcessor {
    /// The file it was read from (errors name it).
    pub file: PathBuf,
    /// Fewest pixels after resizing.
    pub min_pixels: i64,
    /// Most pixels after resizing.
    pub max_pixels: i64,
    /// Side of a patch.
    pub patch_size: i64,
    /// Copies of an image per temporal patch.
    pub temporal_patch_size: i64,
    /// Side of the square of patches merged into one token.
    pub merge_size: i64,
    /// Per-channel mean (after rescaling).
    pub image_mean: [f32; 3],
    /// Per-channel standard deviation.
    pub image_std: [f32; 3],
    /// The factor bytes are multiplied by (1/255).
    pub rescale_factor: f64,
    /// Whether to resize (`smart_resize`).
    pub do_resize: bool,
    /// Whether to rescale.
    pub do_rescale: bool,
    /// Whether to normalise.
    pub do_normalize: bool,
}

/// PIL's `Resampling.BICUBIC`.
const BICUBIC: i64 = 3;
/// Pillow's fixed-point precision for 8-bit images.
const PRECISION_BITS: u32 = 32 - 8 - 2;

impl ImageProcessor {
    /// Reads a `preprocessor_config.json` with transformers' defaults
    /// (`Qwen2VLImageProcessor`: 56² to 28²·1280 pixels, patch 14, merge 2,
    /// temporal 2, CLIP's mean and std, bicubic).
    pub fn from_file(file: &Path) -> Result<ImageProcessor, HfError> {
        let text = std::fs::read_to_string(file).map_err(|source| HfError::Read {
            file: file.to_path_buf(),
            source,
        })?;
        ImageProcessor::parse(&text, file)
    }

    /// As [`ImageProcessor::from_file`], from the text of a
    /// `preprocessor_config.json`; `file` names it in errors.
    pub fn parse(text: &str, file: &Path) -> Result<ImageProcessor, HfError> {
        let bad = |reason: String| HfError::BadConfig {
            file: file.to_path_buf(),
            reason,
        };
        let map: Map<String, Value> = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let size = map.get("size").and_then(Value::as_object);
        let int = |key: &str, default: i64| -> Result<i64, HfError> {
            let sized = match key {
                "min_pixels" => size.and_then(|s| s.get("shortest_edge").or(s.get("min_pixels"))),
                "max_pixels" => size.and_then(|s| s.get("longest_edge").or(s.get("max_pixels"))),
                _ => None,
            };
            match map.get(key).filter(|v| !v.is_null()).or(sized) {
                None => Ok(default),
                Some(v) => v
                    .as_i64()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| bad(format!("`{key}` is {v}, expected an integer > 0"))),
            }
        };
        let flag = |key: &str| -> Result<bool, HfError> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(true),
                Some(v) => v
                    .as_bool()
                    .ok_or_else(|| bad(format!("`{key}` is {v}, expected true or false"))),
            }
        };
        let triple = |key: &str, default: [f32; 3]| -> Result<[f32; 3], HfError> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(Value::Number(n)) => Ok([n.as_f64().unwrap_or(0.0) as f32; 3]),
                Some(v) => {
                    let values: Option<Vec<f32>> = v
                        .as_array()
                        .and_then(|a| a.iter().map(|x| x.as_f64().map(|x| x as f32)).collect());
                    match values.as_deref() {
                        Some(&[a, b, c]) => Ok([a, b, c]),
                        _ => Err(bad(format!("`{key}` is {v}, expected 3 numbers (R, G, B)"))),
                    }
                }
            }
        };
        let resample = int("resample", BICUBIC)?;
        if resample != BICUBIC {
            return Err(bad(format!(
                "`resample` is {resample}; only {BICUBIC} (bicubic) is supported"
            )));
        }
        let processor = ImageProcessor {
            file: file.to_path_buf(),
            min_pixels: int("min_pixels", 56 * 56)?,
            max_pixels: int("max_pixels", 28 * 28 * 1280)?,
            patch_size: int("patch_size", 14)?,
            temporal_patch_size: int("temporal_patch_size", 2)?,
            merge_size: int("merge_size", 2)?,
            image_mean: triple("image_mean", [0.481_454_66, 0.457_827_5, 0.408_210_73])?,
            image_std: triple("image_std", [0.268_629_54, 0.261_302_58, 0.275_777_11])?,
            rescale_factor: match map.get("rescale_factor") {
                None | Some(Value::Null) => 1.0 / 255.0,
                Some(v) => v
                    .as_f64()
                    .ok_or_else(|| bad(format!("`rescale_factor` is {v}, expected a number")))?,
            },
            do_resize: flag("do_resize")?,
            do_rescale: flag("do_rescale")?,
            do_normalize: flag("do_normalize")?,
        };
        if processor.min_pixels > processor.max_pixels {
            return Err(bad(format!(
                "`min_pixels` {} exceeds `max_pixels` {}",
                processor.min_pixels, processor.max_pixels
            )));
        }
        if processor.image_std.contains(&0.0) {
            return Err(bad("`image_std` holds 0".into()));
        }
        Ok(processor)
    }

    /// `dir/preprocessor_config.json`, checked against the model's vision
    /// config: the patch, merge and temporal sizes must agree (a processor
    /// of another model cuts patches the encoder cannot read), and the
    /// encoder must take 3 channels.
    pub fn for_model(dir: &Path, config: &VlConfig) -> Result<ImageProcessor, HfError> {
        let processor = ImageProcessor::from_file(&dir.join("preprocessor_config.json"))?;
        processor.check_model(config)?;
        Ok(processor)
    }

    /// Whether this processor cuts the patches `config`'s vision encoder
    /// reads ([`ImageProcessor::for_model`]'s check), naming the key that
    /// differs.
    pub fn check_model(&self, config: &VlConfig) -> Result<(), HfError> {
        let processor = self;
        let v = &config.vision;
        for (key, ours, model_key, theirs) in [
            (
                "patch_size",
                processor.patch_size,
                "patch_size",
                v.patch_size,
            ),
            (
                "merge_size",
                processor.merge_size,
                "spatial_merge_size",
                v.spatial_merge_size,
            ),
            (
                "temporal_patch_size",
                processor.temporal_patch_size,
                "temporal_patch_size",
                v.temporal_patch_size,
            ),
            ("(RGB channels)", 3, "in_channels", v.in_channels),
        ] {
            if ours != theirs {
                return Err(HfError::BadConfig {
                    file: processor.file.clone(),
                    reason: format!(
                        "`{key}` is {ours}, the model's config.json has `vision_config.{model_key}` {theirs}"
                    ),
                });
            }
        }
        Ok(())
    }

    /// transformers' `smart_resize`: the size an image of `height × width`
    /// is resized to; an aspect ratio over 200, or a size the rule cannot
    /// bring within `min_pixels..=max_pixels`, is an error naming the file
    /// and key.
    pub fn smart_resize(&self, height: i64, width: i64) -> Result<(i64, i64), HfError> {
        let bad = |reason: String| HfError::BadImage {
            file: self.file.clone(),
            reason,
        };
        if height <= 0 || width <= 0 {
            return Err(bad(format!("an image of {height} x {width} pixels")));
        }
        let (hf, wf) = (height as f64, width as f64);
        if hf.max(wf) / hf.min(wf) > 200.0 {
            return Err(bad(format!(
                "an image of {height} x {width} pixels: the aspect ratio must be below 200"
            )));
        }
        let factor = self.patch_size * self.merge_size;
        let ff = factor as f64;
        let mut h = (hf / ff).round_ties_even() as i64 * factor;
        let mut w = (wf / ff).round_ties_even() as i64 * factor;
        if h * w > self.max_pixels {
            let beta = (hf * wf / self.max_pixels as f64).sqrt();
            h = factor.max((hf / beta / ff).floor() as i64 * factor);
            w = factor.max((wf / beta / ff).floor() as i64 * factor);
        } else if h * w < self.min_pixels {
            let beta = (self.min_pixels as f64 / (hf * wf)).sqrt();
            h = (hf * beta / ff).ceil() as i64 * factor;
            w = (wf * beta / ff).ceil() as i64 * factor;
        }
        if h * w > self.max_pixels || h * w < self.min_pixels || h == 0 || w == 0 {
            let key = if h * w > self.max_pixels {
                "max_pixels"
            } else {
                "min_pixels"
            };
            return Err(bad(format!(
                "an image of {height} x {width} pixels resizes to {h} x {w} = {} pixels, outside `{key}` (min_pixels {}, max_pixels {}, multiples of {factor})",
                h * w,
                self.min_pixels,
                self.max_pixels
            )));
        }
        Ok((h, w))
    }

    /// The patches of `images`, in order ([`Images`]).
    pub fn process(&self, images: &[RgbImage]) -> Result<Images, HfError> {
        let (p, t, m) = (
            self.patch_size as usize,
            self.temporal_patch_size as usize,
            self.merge_size as usize,
        );
        let mut values: Vec<f32> = Vec::new();
        let mut grids = Vec::with_capacity(images.len());
        for (i, image) in images.iter().enumerate() {
            let (mut h, mut w) = (image.height, image.width);
            let resized;
            let data = if self.do_resize {
                let (rh, rw) = self.smart_resize(h as i64, w as i64).map_err(|e| match e {
                    HfError::BadImage { file, reason } => HfError::BadImage {
                        file,
                        reason: format!("image {i}: {reason}"),
                    },
                    other => other,
                })?;
                resized = resize_bicubic(image, rh as usize, rw as usize);
                (h, w) = (rh as usize, rw as usize);
                &resized
            } else {
                if h % (p * m) != 0 || w % (p * m) != 0 {
                    return Err(HfError::BadImage {
                        file: self.file.clone(),
                        reason: format!(
                            "image {i}: {h} x {w} pixels are not multiples of patch_size × merge_size = {} and `do_resize` is false",
                            p * m
                        ),
                    });
                }
                &image.data
            };
            // [H, W, 3] bytes → [3, H, W] f32, rescaled and normalised.
            let mut chw = vec![0f32; 3 * h * w];
            for (k, &byte) in data.iter().enumerate() {
                let (pixel, c) = (k / 3, k % 3);
                let mut x = if self.do_rescale {
                    (f64::from(byte) * self.rescale_factor) as f32
                } else {
                    f32::from(byte)
                };
                if self.do_normalize {
                    x = (x - self.image_mean[c]) / self.image_std[c];
                }
                chw[c * h * w + pixel] = x;
            }
            let (gh, gw) = (h / p, w / p);
            for bh in 0..gh / m {
                for bw in 0..gw / m {
                    for ih in 0..m {
                        for iw in 0..m {
                            let (row0, col0) = ((bh * m + ih) * p, (bw * m + iw) * p);
                            for c in 0..3 {
                                for _ in 0..t {
                                    for y in 0..p {
                                        let start = c * h * w + (row0 + y) * w + col0;
                                        values.extend_from_slice(&chw[start..start + p]);
                                    }
                                }
                            }
                        }
                    }
                }
            }
            grids.push([1, gh as i64, gw as i64]);
        }
        let dim = (3 * t * p * p) as i64;
        Ok(Images {
            pixel_values: Tensor::from_slice(&values).view([-1, dim]),
            grid_thw: grids,
        })
    }
}

/// Pillow's bicubic kernel (a = -0.5).
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// Pillow's `precompute_coeffs` and `normalize_coeffs_8bpc`: for each
/// output index the first input index and the fixed-point weights.
fn coefficients(input: usize, output: usize) -> Vec<(usize, Vec<i32>)> {
    let scale = input as f64 / output as f64;
    let filterscale = scale.max(1.0);
    let support = 2.0 * filterscale;
    (0..output)
        .map(|xx| {
            let center = (xx as f64 + 0.5) * scale;
            let ss = 1.0 / filterscale;
            // C's (int) casts truncate toward zero, as `as` does.
            let xmin = ((center - support + 0.5) as i64).max(0);
            let xmax = ((center + support + 0.5) as i64).min(input as i64) - xmin;
            let mut k: Vec<f64> = (0..xmax.max(0))
                .map(|x| bicubic(((x + xmin) as f64 - center + 0.5) * ss))
                .collect();
            let ww: f64 = k.iter().sum();
            if ww != 0.0 {
                k.iter_mut().for_each(|w| *w /= ww);
            }
            let one = f64::from(1u32 << PRECISION_BITS);
            let fixed = k
                .iter()
                .map(|&w| {
                    if w < 0.0 {
                        (-0.5 + w * one) as i32
                    } else {
                        (0.5 + w * one) as i32
                    }
                })
                .collect();
            (xmin as usize, fixed)
        })
        .collect()
}

/// Pillow's `clip8`: the fixed-point sum back to a byte.
fn clip8(sum: i32) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// One resampling pass of Pillow's: along the rows (`horizontal`) or the
/// columns of `data` (`h × w` RGB bytes) to `size`, rounding to bytes.
fn pass(data: &[u8], h: usize, w: usize, size: usize, horizontal: bool) -> Vec<u8> {
    let (input, lines) = if horizontal { (w, h) } else { (h, w) };
    let (out_h, out_w) = if horizontal { (h, size) } else { (size, w) };
    let at = |line: usize, i: usize| {
        if horizontal {
            line * w + i
        } else {
            i * w + line
        }
    };
    let half = 1i32 << (PRECISION_BITS - 1);
    let mut out = vec![0u8; out_h * out_w * 3];
    for (o, (first, k)) in coefficients(input, size).iter().enumerate() {
        for line in 0..lines {
            let target = if horizontal {
                line * out_w + o
            } else {
                o * out_w + line
            };
            for c in 0..3 {
                let sum = k.iter().enumerate().fold(half, |s, (i, &kk)| {
                    s.wrapping_add(i32::from(data[at(line, first + i) * 3 + c]) * kk)
                });
                out[target * 3 + c] = clip8(sum);
            }
        }
    }
    out
}

/// `PIL.Image.resize((width, height), Resampling.BICUBIC)` of an RGB image:
/// a pass along each axis whose size changes, each rounding to bytes.
/// Pillow 13 runs the vertical pass first when the height shrinks by a
/// larger factor than the width (`height/h < width/w`), the horizontal pass
/// first otherwise; this rule reproduces its order on the sizes of the
/// tests, on 43 of 44 resizes of common camera sizes and on 280 of 291
/// random size pairs of 8 to 90 pixels (where the order differs, pixels
/// differ by up to about 20/255).
fn resize_bicubic(image: &RgbImage, height: usize, width: usize) -> Vec<u8> {
    let (h, w) = (image.height, image.width);
    let vertical_first = height < h && height * w < width * h;
    let mut data = image.data.clone();
    let mut current_h = h;
    let mut current_w = w;
    let order = if vertical_first {
        [false, true]
    } else {
        [true, false]
    };
    for horizontal in order {
        if horizontal && width != current_w {
            data = pass(&data, current_h, current_w, width, true);
            current_w = width;
        } else if !horizontal && height != current_h {
            data = pass(&data, current_h, current_w, height, false);
            current_h = height;
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    fn processor(min: i64, max: i64) -> ImageProcessor {
        ImageProcessor {
            file: "preprocessor_config.json".into(),
            min_pixels: min,
            max_pixels: max,
            patch_size: 14,
            temporal_patch_size: 2,
            merge_size: 2,
            image_mean: [0.5; 3],
            image_std: [0.5; 3],
            rescale_factor: 1.0 / 255.0,
            do_resize: true,
            do_rescale: true,
            do_normalize: true,
        }
    }

    #[test]
    fn smart_resize_follows_transformers() {
        let p = processor(56 * 56, 28 * 28 * 1280);
        // round(480 / 28) = 17, round(640 / 28) = 23 (22.86).
        assert_eq!(p.smart_resize(480, 640).unwrap(), (476, 644));
        // Ties go to even: 70 / 28 = 2.5 → 2.
        assert_eq!(p.smart_resize(70, 70).unwrap(), (56, 56));
        // Too small: scaled up, ceil.
        assert_eq!(p.smart_resize(20, 30).unwrap(), (56, 84));
        // Too large: scaled down, floor.
        let (h, w) = p.smart_resize(4000, 3000).unwrap();
        assert!(
            h * w <= 28 * 28 * 1280 && h % 28 == 0 && w % 28 == 0,
            "{h} {w}"
        );
        let err = p.smart_resize(1, 300).unwrap_err().to_string();
        assert!(
            err.contains("aspect ratio") && err.contains("preprocessor_config.json"),
            "{err}"
        );
        // A narrow image whose floor rule leaves one factor on a side and
        // still too many pixels: refused, naming max_pixels.
        let err = processor(28 * 28, 28 * 28 * 4)
            .smart_resize(28 * 150, 28)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`max_pixels`"), "{err}");
    }

    /// An image already at its target size is not resampled; a constant
    /// image stays constant through both passes.
    #[test]
    fn resampling_keeps_constants_and_identity() {
        let image = RgbImage::new(3, 5, (0..45).map(|i| (i * 5) as u8).collect()).unwrap();
        assert_eq!(resize_bicubic(&image, 3, 5), image.data);
        let flat = RgbImage::new(7, 9, vec![200; 7 * 9 * 3]).unwrap();
        assert!(resize_bicubic(&flat, 12, 4).iter().all(|&v| v == 200));
    }
}

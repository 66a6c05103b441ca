//! The frozen frame encoder of LaST-R1's warm-up targets: PCA of a world's
//! camera frames, fitted once and then only applied.
//!
//! LaST-R1 supervises its latent chain of thought, during warm-up, with the
//! features of future frames under a frozen image encoder (DINOv3's CLS
//! token, its top-k channels). We have no DINOv3, so the targets come from a
//! small encoder fitted on the frames of the world the policy acts in: the
//! top `dim` principal directions of those frames. PCA because
//!
//! - it is what a linear autoencoder learns at its optimum: under squared
//!   reconstruction error the best rank-`dim` encoder/decoder pair spans the
//!   top principal subspace (Eckart–Young; Baldi & Hornik, 1989), so the
//!   codes keep as much of a frame as any `dim` linear features can;
//! - it is closed-form: one SVD, no training loop, no learning rate, no seed,
//!   no weights to download;
//! - it is deterministic: the same frames give bit-identical components
//!   (computed in f64, the sign of each direction fixed below), so the
//!   targets of a run reproduce.
//!
//! Pixels are scaled as the VLA scales its patches ([`crate::vla`]), bytes
//! in the frames' own layout (`H × W × C`, row-major):
//!
//! ```text
//! x = bytes / 127.5 − 1 ∈ [−1, 1]^P,      P = H · W · C
//! μ = mean of the n fitting frames' x      (bytes summed exactly, then scaled)
//! X − 1μᵀ = U S Vᵀ                         (thin SVD, f64, S descending)
//! W = V[:, :dim]ᵀ  ∈ R^{dim × P},          each row's largest-|value| entry
//!                                          (the first on ties) made positive
//! z = W (x − μ)  ∈ R^dim                   (the code: encode returns it as f32)
//! ```
//!
//! `x̂ = μ + Wᵀ z` is the best rank-`dim` affine reconstruction of the fitting
//! frames. `dim` is at most `min(n, P)`; directions past the rank of the
//! centred frames (at most `n − 1`) carry none of their variance (those
//! frames code 0 on them).
//!
//! The encoder is saved as one safetensors file (`mean` `[P]` f64,
//! `components` `[dim, P]` f64, `shape` `[3]` i64 = `[H, W, C]`), written
//! under a hidden temporary name, fsynced and renamed into place, so a reader
//! sees the old file or the new one, never a part; loading checks every
//! tensor's presence, kind and shape and names what is wrong.
//!
//! ```no_run
//! use embodyflow_models::frame_encoder::FrameEncoder;
//! let frames: Vec<Vec<u8>> = vec![vec![0; 32 * 32 * 3]; 64]; // the world's camera frames
//! let views: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
//! let encoder = FrameEncoder::fit(&views, 32, 32, 3, 16).unwrap();
//! encoder.save("runs/frame_encoder.safetensors".as_ref()).unwrap();
//! let encoder = FrameEncoder::load("runs/frame_encoder.safetensors".as_ref()).unwrap();
//! let targets = encoder.encode(&views[1..]).unwrap(); // [63, 16] f32
//! assert_eq!(targets.size(), [63, 16]);
//! ```

use std::path::{Path, PathBuf};

use embodyflow_core::{Classify, ErrorKind};
use tch::{Kind, Tensor};

/// Errors of fitting, applying, saving and loading a [`FrameEncoder`].
#[derive(Debug, thiserror::Error)]
pub enum FrameEncoderError {
    /// Fitting on no frames.
    #[error("no frames to fit the frame encoder on")]
    NoFrames,
    /// A frame shape with no pixels, or too many to index.
    #[error("frame shape {height}x{width}x{channels} has no pixels or too many")]
    BadShape {
        /// Frame height.
        height: usize,
        /// Frame width.
        width: usize,
        /// Channels per pixel.
        channels: usize,
    },
    /// A frame whose byte length is not `H · W · C`.
    #[error("frame {index} has {len} bytes, expected {expected}")]
    FrameSize {
        /// The frame's position in the input.
        index: usize,
        /// Its byte length.
        len: usize,
        /// `H · W · C`.
        expected: usize,
    },
    /// A code width of 0 or more than the frames give directions for.
    #[error(
        "dim {dim} must be between 1 and min(frames {frames}, pixels per frame {pixels}) = {}",
        .frames.min(.pixels)
    )]
    BadDim {
        /// The requested code width.
        dim: usize,
        /// Frames fitted on.
        frames: usize,
        /// Pixels (bytes) per frame.
        pixels: usize,
    },
    /// A saved encoder that is missing, unreadable or inconsistent.
    #[error("frame encoder file {path}: {reason}")]
    BadFile {
        /// The file at fault.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// Writing the encoder failed.
    #[error("writing frame encoder {path}: {reason}")]
    Write {
        /// The file (or temporary file) being written.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// libtorch failed while fitting or encoding.
    #[error("torch: {0}")]
    Torch(String),
}

impl Classify for FrameEncoderError {
    fn kind(&self) -> ErrorKind {
        match self {
            FrameEncoderError::Write { .. } | FrameEncoderError::Torch(_) => ErrorKind::Failure,
            _ => ErrorKind::BadInput,
        }
    }
}

fn torch(error: tch::TchError) -> FrameEncoderError {
    FrameEncoderError::Torch(error.to_string())
}

/// A frozen PCA frame encoder: `z = W (x − μ)` (see the module doc). Its
/// tensors live on the CPU in f64.
#[derive(Debug)]
pub struct FrameEncoder {
    height: usize,
    width: usize,
    channels: usize,
    mean: Tensor,
    components: Tensor,
}

/// `H · W · C`, checked: non-zero and small enough for tensor sizes.
fn frame_len(height: usize, width: usize, channels: usize) -> Result<usize, FrameEncoderError> {
    height
        .checked_mul(width)
        .and_then(|p| p.checked_mul(channels))
        .filter(|&p| p > 0 && i64::try_from(p).is_ok())
        .ok_or(FrameEncoderError::BadShape {
            height,
            width,
            channels,
        })
}

/// The frames' bytes as a `[n, P]` u8 tensor, every frame checked to be `P` bytes.
fn bytes(frames: &[&[u8]], pixels: usize) -> Result<Tensor, FrameEncoderError> {
    let mut flat = Vec::with_capacity(frames.len().saturating_mul(pixels));
    for (index, frame) in frames.iter().enumerate() {
        if frame.len() != pixels {
            return Err(FrameEncoderError::FrameSize {
                index,
                len: frame.len(),
                expected: pixels,
            });
        }
        flat.extend_from_slice(frame);
    }
    Tensor::from_slice(&flat)
        .f_view([frames.len() as i64, pixels as i64])
        .map_err(torch)
}

/// Bytes (any integer or float kind) to pixels in f64: `b / 127.5 − 1`.
fn scale(bytes: &Tensor) -> Tensor {
    bytes.to_kind(Kind::Double) / 127.5 - 1.0
}

impl FrameEncoder {
    /// Fits the encoder on `frames` (each `height · width · channels` bytes):
    /// their mean and top `dim` principal directions, `1 ≤ dim ≤ min(n, P)`.
    pub fn fit(
        frames: &[&[u8]],
        height: usize,
        width: usize,
        channels: usize,
        dim: usize,
    ) -> Result<FrameEncoder, FrameEncoderError> {
        let pixels = frame_len(height, width, channels)?;
        if frames.is_empty() {
            return Err(FrameEncoderError::NoFrames);
        }
        if dim == 0 || dim > frames.len().min(pixels) {
            return Err(FrameEncoderError::BadDim {
                dim,
                frames: frames.len(),
                pixels,
            });
        }
        let bytes = bytes(frames, pixels)?.to_kind(Kind::Double);
        tch::no_grad(|| {
            // Sums of bytes are exact in f64, so the mean of frames equal to
            // their mean frame is that frame's x, bit for bit.
            let mean =
                scale(&(bytes.sum_dim_intlist(0, false, Kind::Double) / frames.len() as f64));
            let centred = scale(&bytes) - &mean;
            // torch.svd (V, not Vᴴ): linalg_svd's driver argument, which tch
            // always passes, is refused on the CPU.
            let (_, _, v) = centred.f_svd(true, true).map_err(torch)?;
            let top = v.f_narrow(1, 0, dim as i64).map_err(torch)?.tr();
            let largest = top.abs().argmax(1, true);
            let sign = top.gather(1, &largest, false).sign();
            let components = (top * sign).contiguous();
            Ok(FrameEncoder {
                height,
                width,
                channels,
                mean,
                components,
            })
        })
    }

    /// The codes `W (x − μ)` of `frames`, `[n, dim]` f32 (no gradient: the
    /// encoder is frozen); `[0, dim]` for no frames.
    pub fn encode(&self, frames: &[&[u8]]) -> Result<Tensor, FrameEncoderError> {
        let x = self.pixels(frames)?;
        Ok(tch::no_grad(|| {
            (x - &self.mean)
                .matmul(&self.components.tr())
                .to_kind(Kind::Float)
        }))
    }

    /// The frames as pixels `x`, `[n, P]` f64, each checked to be `P` bytes.
    fn pixels(&self, frames: &[&[u8]]) -> Result<Tensor, FrameEncoderError> {
        Ok(scale(&bytes(frames, self.frame_len())?))
    }

    /// Frame height.
    pub fn height(&self) -> usize {
        self.height
    }

    /// Frame width.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Channels per pixel.
    pub fn channels(&self) -> usize {
        self.channels
    }

    /// Bytes per frame, `P = H · W · C`.
    pub fn frame_len(&self) -> usize {
        self.height * self.width * self.channels
    }

    /// Code width (rows of `W`).
    pub fn dim(&self) -> usize {
        self.components.size()[0] as usize
    }

    /// The mean frame `μ` in pixels, `[P]` f64.
    pub fn mean(&self) -> &Tensor {
        &self.mean
    }

    /// The principal directions `W`, `[dim, P]` f64, orthonormal rows.
    pub fn components(&self) -> &Tensor {
        &self.components
    }

    /// Writes the encoder to `path` as safetensors, atomically: a hidden
    /// temporary sibling, fsynced, renamed over `path` (replacing any file
    /// there), then the directory fsynced.
    pub fn save(&self, path: &Path) -> Result<(), FrameEncoderError> {
        let write_error = |path: &Path, reason: String| FrameEncoderError::Write {
            path: path.to_path_buf(),
            reason,
        };
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| write_error(path, "the path names no file".into()))?;
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let temp = dir.join(embodyflow_core::commit::staging_name(name));
        let shape =
            Tensor::from_slice(&[self.height as i64, self.width as i64, self.channels as i64]);
        let tensors = [
            ("mean", &self.mean),
            ("components", &self.components),
            ("shape", &shape),
        ];
        let written = Tensor::write_safetensors(&tensors, &temp)
            .map_err(|e| write_error(&temp, e.to_string()))
            .and_then(|()| {
                std::fs::File::open(&temp)
                    .and_then(|f| f.sync_all())
                    .map_err(|e| write_error(&temp, e.to_string()))
            })
            .and_then(|()| {
                std::fs::rename(&temp, path).map_err(|e| write_error(path, e.to_string()))
            });
        if written.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        written?;
        embodyflow_core::commit::sync_dir(dir).map_err(|e| write_error(dir, e.to_string()))
    }

    /// Loads an encoder [`FrameEncoder::save`] wrote, checking that it holds
    /// exactly `mean`, `components` and `shape` with consistent kinds and shapes.
    pub fn load(path: &Path) -> Result<FrameEncoder, FrameEncoderError> {
        let bad = |reason: String| FrameEncoderError::BadFile {
            path: path.to_path_buf(),
            reason,
        };
        let mut mean = None;
        let mut components = None;
        let mut shape = None;
        for (name, tensor) in Tensor::read_safetensors(path).map_err(|e| bad(e.to_string()))? {
            let slot = match name.as_str() {
                "mean" => &mut mean,
                "components" => &mut components,
                "shape" => &mut shape,
                _ => {
                    return Err(bad(format!(
                        "holds tensor `{name}`, which a frame encoder does not have"
                    )));
                }
            };
            *slot = Some(tensor);
        }
        let take = |tensor: Option<Tensor>, name: &str, kind: Kind| {
            let tensor = tensor.ok_or_else(|| bad(format!("lacks tensor `{name}`")))?;
            if tensor.kind() != kind {
                return Err(bad(format!(
                    "tensor `{name}` is {:?}, expected {kind:?}",
                    tensor.kind()
                )));
            }
            Ok(tensor)
        };
        let shape = take(shape, "shape", Kind::Int64)?;
        let mean = take(mean, "mean", Kind::Double)?;
        let components = take(components, "components", Kind::Double)?;
        if shape.size() != [3] {
            return Err(bad(format!(
                "tensor `shape` has shape {:?}, expected [3] ([height, width, channels])",
                shape.size()
            )));
        }
        let dims = Vec::<i64>::try_from(&shape).map_err(|e| bad(e.to_string()))?;
        let [height, width, channels] =
            [dims[0], dims[1], dims[2]].map(|d| usize::try_from(d).ok());
        let (Some(height), Some(width), Some(channels)) = (height, width, channels) else {
            return Err(bad(format!("tensor `shape` holds negative sizes {dims:?}")));
        };
        let pixels = frame_len(height, width, channels).map_err(|e| bad(e.to_string()))?;
        if mean.size() != [pixels as i64] {
            return Err(bad(format!(
                "tensor `mean` has shape {:?}, expected [{pixels}] for {height}x{width}x{channels} frames",
                mean.size()
            )));
        }
        let size = components.size();
        if size.len() != 2 || size[1] != pixels as i64 || size[0] < 1 || size[0] > pixels as i64 {
            return Err(bad(format!(
                "tensor `components` has shape {size:?}, expected [dim, {pixels}] with 1 <= dim <= {pixels}"
            )));
        }
        Ok(FrameEncoder {
            height,
            width,
            channels,
            mean,
            components,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn views(frames: &[Vec<u8>]) -> Vec<&[u8]> {
        frames.iter().map(Vec::as_slice).collect()
    }

    /// Values of a 1-D tensor (f64).
    fn values(tensor: &Tensor) -> Vec<f64> {
        Vec::try_from(&tensor.to_kind(Kind::Double).flatten(0, -1)).unwrap()
    }

    fn max_abs(tensor: &Tensor) -> f64 {
        tensor.abs().max().double_value(&[])
    }

    const H: usize = 4;
    const W: usize = 4;
    const C: usize = 3;
    const P: usize = H * W * C;

    /// Integer directions of the planted subspace (entries in −3..=3).
    fn planted_directions() -> (Vec<i32>, Vec<i32>) {
        let u = (0..P).map(|i| (i % 5) as i32 - 2).collect();
        let v = (0..P).map(|i| ((i * 3) % 7) as i32 - 3).collect();
        (u, v)
    }

    /// 10 frames `base + a_k u + b_k v` (bytes 81..=168): on a 2-D affine subspace.
    fn planted_frames() -> Vec<Vec<u8>> {
        let (u, v) = planted_directions();
        (0..10i32)
            .map(|k| {
                let (a, b) = (k - 5, (k * k) % 7 - 3);
                (0..P)
                    .map(|i| (100 + (i * 7) % 50) as i32 + a * u[i] + b * v[i])
                    .map(|x| u8::try_from(x).unwrap())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn frame_encoder_two_pixel_example_by_hand() {
        // x = [−1, −1] and [1, 1]: μ = 0, the one direction [1, 1]/√2 (its
        // largest entry, the first of two equal ones, positive), codes ∓√2.
        let frames = [vec![0u8, 0], vec![255, 255]];
        let encoder = FrameEncoder::fit(&views(&frames), 1, 1, 2, 1).unwrap();
        assert_eq!(values(encoder.mean()), [0.0, 0.0]);
        let r = std::f64::consts::FRAC_1_SQRT_2;
        for (got, want) in values(encoder.components()).iter().zip([r, r]) {
            assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        }
        let codes = encoder.encode(&views(&frames)).unwrap();
        assert_eq!(codes.size(), [2, 1]);
        assert_eq!(codes.kind(), Kind::Float);
        let root2 = std::f64::consts::SQRT_2;
        for (got, want) in values(&codes).iter().zip([-root2, root2]) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
    }

    #[test]
    fn frame_encoder_planted_subspace_reconstructs_exactly() {
        let frames = planted_frames();
        let encoder = FrameEncoder::fit(&views(&frames), H, W, C, 2).unwrap();
        assert_eq!((encoder.dim(), encoder.frame_len()), (2, P));
        let w = encoder.components();
        // Orthonormal rows.
        let gram = w.matmul(&w.tr());
        assert!(max_abs(&(gram - Tensor::eye(2, (Kind::Double, tch::Device::Cpu)))) < 1e-12);
        // Every frame is μ + Wᵀ W (x − μ).
        let centred = encoder.pixels(&views(&frames)).unwrap() - encoder.mean();
        let rebuilt = centred.matmul(&w.tr()).matmul(w);
        assert!(max_abs(&(&centred - rebuilt)) < 1e-10);
        // And the planted directions themselves lie in W's span.
        let (u, v) = planted_directions();
        for direction in [u, v] {
            let d = Tensor::from_slice(&direction).to_kind(Kind::Double) / 127.5;
            let projected = w.tr().matmul(&w.matmul(&d));
            assert!(max_abs(&(&d - projected)) < 1e-10);
        }
        // The codes are those projections, in f32.
        let codes = encoder.encode(&views(&frames)).unwrap();
        assert_eq!(codes.size(), [10, 2]);
        let want = centred.matmul(&w.tr());
        assert!(max_abs(&(codes.to_kind(Kind::Double) - want)) < 1e-5);
        // Sign convention: each row's largest-|value| entry is positive.
        for row in 0..2 {
            let row = w.get(row);
            let at = row.abs().argmax(0, false).int64_value(&[]);
            assert!(row.double_value(&[at]) > 0.0);
        }
    }

    #[test]
    fn frame_encoder_fit_is_bit_identical_twice() {
        let frames = planted_frames();
        let a = FrameEncoder::fit(&views(&frames), H, W, C, 5).unwrap();
        let b = FrameEncoder::fit(&views(&frames), H, W, C, 5).unwrap();
        assert!(a.mean().equal(b.mean()));
        assert!(a.components().equal(b.components()));
        assert!(
            a.encode(&views(&frames))
                .unwrap()
                .equal(&b.encode(&views(&frames)).unwrap())
        );
    }

    #[test]
    fn frame_encoder_mean_frame_codes_zero() {
        // Frames base ± d: their mean is the byte frame `base`.
        let base: Vec<u8> = (0..P).map(|i| (60 + i * 3) as u8).collect();
        let frames: Vec<Vec<u8>> = (1..=4u8)
            .flat_map(|k| {
                let up = base.iter().enumerate().map(|(i, &b)| b + k * (i % 3) as u8);
                let down = base.iter().enumerate().map(|(i, &b)| b - k * (i % 4) as u8);
                let up2 = base.iter().enumerate().map(|(i, &b)| b - k * (i % 3) as u8);
                let down2 = base.iter().enumerate().map(|(i, &b)| b + k * (i % 4) as u8);
                [up.collect(), down.collect(), up2.collect(), down2.collect()]
            })
            .collect();
        let encoder = FrameEncoder::fit(&views(&frames), H, W, C, 3).unwrap();
        let code = encoder.encode(&[&base]).unwrap();
        assert_eq!(code.size(), [1, 3]);
        assert_eq!(values(&code), [0.0, 0.0, 0.0]);
        assert_eq!(encoder.encode(&[]).unwrap().size(), [0, 3]);
    }

    #[test]
    fn frame_encoder_save_load_round_trips_bit_identically() {
        let frames = planted_frames();
        let encoder = FrameEncoder::fit(&views(&frames), H, W, C, 4).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("frame_encoder.safetensors");
        std::fs::write(&path, b"an older file, replaced").unwrap();
        encoder.save(&path).unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["frame_encoder.safetensors"]); // no temporary left
        let loaded = FrameEncoder::load(&path).unwrap();
        assert_eq!(
            (
                loaded.height(),
                loaded.width(),
                loaded.channels(),
                loaded.dim()
            ),
            (H, W, C, 4)
        );
        assert_eq!(loaded.mean().kind(), Kind::Double);
        assert!(loaded.mean().equal(encoder.mean()));
        assert!(loaded.components().equal(encoder.components()));
        assert!(
            loaded
                .encode(&views(&frames))
                .unwrap()
                .equal(&encoder.encode(&views(&frames)).unwrap())
        );
    }

    #[test]
    fn frame_encoder_bad_input_errors_name_index_and_numbers() {
        let ok = vec![7u8; 6];
        let short = vec![7u8; 5];
        assert!(matches!(
            FrameEncoder::fit(&[], 1, 2, 3, 1),
            Err(FrameEncoderError::NoFrames)
        ));
        let error = FrameEncoder::fit(&[&ok, &ok, &short], 1, 2, 3, 1).unwrap_err();
        assert!(matches!(
            error,
            FrameEncoderError::FrameSize {
                index: 2,
                len: 5,
                expected: 6
            }
        ));
        assert_eq!(error.to_string(), "frame 2 has 5 bytes, expected 6");
        let error = FrameEncoder::fit(&[&ok, &ok], 1, 2, 3, 0).unwrap_err();
        assert!(matches!(
            error,
            FrameEncoderError::BadDim {
                dim: 0,
                frames: 2,
                pixels: 6
            }
        ));
        let error = FrameEncoder::fit(&[&ok, &ok, &ok], 1, 2, 3, 4).unwrap_err();
        assert!(matches!(
            error,
            FrameEncoderError::BadDim {
                dim: 4,
                frames: 3,
                pixels: 6
            }
        ));
        assert_eq!(
            error.to_string(),
            "dim 4 must be between 1 and min(frames 3, pixels per frame 6) = 3"
        );
        let error = FrameEncoder::fit(&[&ok], 0, 2, 3, 1).unwrap_err();
        assert!(matches!(
            error,
            FrameEncoderError::BadShape {
                height: 0,
                width: 2,
                channels: 3
            }
        ));
        assert!(matches!(
            FrameEncoder::fit(&[&ok], usize::MAX, 2, 3, 1),
            Err(FrameEncoderError::BadShape { .. })
        ));
        assert_eq!(error.kind(), ErrorKind::BadInput);
        let encoder = FrameEncoder::fit(&[&ok, &vec![9u8; 6]], 1, 2, 3, 1).unwrap();
        assert!(matches!(
            encoder.encode(&[&ok, &short]),
            Err(FrameEncoderError::FrameSize {
                index: 1,
                len: 5,
                expected: 6
            })
        ));
    }

    /// The reason `load` gives for `path`, which must be a `BadFile` naming it.
    fn load_reason(path: &Path) -> String {
        match FrameEncoder::load(path) {
            Err(FrameEncoderError::BadFile { path: at, reason }) => {
                assert_eq!(at, path);
                reason
            }
            other => panic!("expected BadFile, got {other:?}"),
        }
    }

    #[test]
    fn frame_encoder_load_refuses_bad_files() {
        let frames = planted_frames();
        let encoder = FrameEncoder::fit(&views(&frames), H, W, C, 2).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.safetensors");
        encoder.save(&good).unwrap();
        let bytes = std::fs::read(&good).unwrap();

        load_reason(&dir.path().join("absent.safetensors"));
        let truncated = dir.path().join("truncated.safetensors");
        std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
        load_reason(&truncated);
        let garbage = dir.path().join("garbage.safetensors");
        std::fs::write(&garbage, b"not a safetensors file").unwrap();
        load_reason(&garbage);

        let write = |name: &str, tensors: &[(&str, &Tensor)]| {
            let path = dir.path().join(name);
            Tensor::write_safetensors(tensors, &path).unwrap();
            load_reason(&path)
        };
        let shape = Tensor::from_slice(&[H as i64, W as i64, C as i64]);
        let mean = encoder.mean();
        let components = encoder.components();
        assert_eq!(
            write("missing.safetensors", &[("mean", mean), ("shape", &shape)]),
            "lacks tensor `components`"
        );
        let extra = Tensor::zeros([1], (Kind::Double, tch::Device::Cpu));
        assert_eq!(
            write(
                "extra.safetensors",
                &[
                    ("mean", mean),
                    ("components", components),
                    ("shape", &shape),
                    ("scale", &extra)
                ]
            ),
            "holds tensor `scale`, which a frame encoder does not have"
        );
        let float = components.to_kind(Kind::Float);
        assert_eq!(
            write(
                "float.safetensors",
                &[("mean", mean), ("components", &float), ("shape", &shape)]
            ),
            "tensor `components` is Float, expected Double"
        );
        let other_shape = Tensor::from_slice(&[H as i64, W as i64, 1]);
        assert_eq!(
            write(
                "shape.safetensors",
                &[
                    ("mean", mean),
                    ("components", components),
                    ("shape", &other_shape)
                ]
            ),
            "tensor `mean` has shape [48], expected [16] for 4x4x1 frames"
        );
        let wide = Tensor::cat(&[components, &components.narrow(1, 0, 1)], 1);
        assert_eq!(
            write(
                "wide.safetensors",
                &[("mean", mean), ("components", &wide), ("shape", &shape)]
            ),
            "tensor `components` has shape [2, 49], expected [dim, 48] with 1 <= dim <= 48"
        );
        let negative = Tensor::from_slice(&[H as i64, -1, C as i64]);
        assert_eq!(
            write(
                "negative.safetensors",
                &[
                    ("mean", mean),
                    ("components", components),
                    ("shape", &negative)
                ]
            ),
            "tensor `shape` holds negative sizes [4, -1, 3]"
        );
    }
}

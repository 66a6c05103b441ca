//! The bytes of a closed-loop observation (`steps.observation`): the camera
//! images and one proprio vector, self-describing, so that `update-policy`
//! and every offline stage replay a decision without the world. It lives in
//! the core because both sides use it and neither may depend on the other:
//! the rollout layer encodes what a world rendered, the model stages decode
//! it into their input tensors; no world and no model is needed to read it.
//!
//! Layout (every integer little-endian). Version 1, one image:
//!
//! ```text
//! offset  size        field
//! 0       4           magic  b"EFOB"
//! 4       2  u16      format version (1)
//! 6       2  u16      height  H (pixels)
//! 8       2  u16      width   W (pixels)
//! 10      2  u16      channels C (3 for RGB)
//! 12      2  u16      proprio length P
//! 14      H·W·C       pixels, row-major, channels interleaved (HWC), u8
//! 14+HWC  4·P         proprio, f32 little-endian, finite
//! ```
//!
//! Version 2, several named images of one size (a robot's agent-view and
//! wrist cameras): the same fields, then the images' names, and the images
//! joined along the channels — image `k` of `N` is channels
//! `k·C/N .. (k+1)·C/N` of every pixel, so a model that reads `C` channels
//! sees every camera at each patch (the VLA's `channels`), and a reader
//! that wants one camera takes its channels:
//!
//! ```text
//! 0       14          as version 1, format version 2, C = all images' channels
//! 14      2  u16      N images (1..=C, N divides C)
//! 16      …           N names, each u8 length L (1..=255) + L bytes UTF-8, distinct
//! then    H·W·C       pixels (HWC, the images' channels one image after another)
//! then    4·P         proprio
//! ```
//!
//! Version 3, images of different sizes (a prompt's), is
//! [`crate::image_list`]'s; [`decode`] refuses it naming it.
//!
//! [`encode`] writes version 1 (one unnamed image), [`encode_named`]
//! version 2; [`decode`] reads both ([`Observation::names`] is empty for
//! version 1). The length is exact. Decoding checks the magic, the version,
//! the names, the length (too short: [`ObservationError::Truncated`]; too
//! long: [`ObservationError::TrailingBytes`]) and that every proprio value
//! is finite; [`Observation::expect_shape`] checks a decoded observation
//! against the shape a model was built for. Arbitrary bytes give an error,
//! never a panic.
//!
//! ```
//! use embodyflow_core::observation::{ObservationShape, decode, encode, encode_named};
//! let shape = ObservationShape { height: 2, width: 2, channels: 3, proprio: 2 };
//! let pixels = [7u8; 12];
//! let bytes = encode(&shape, &pixels, &[0.5, -1.0]).unwrap();
//! assert_eq!(bytes.len(), 14 + 12 + 8);
//! let observation = decode(&bytes).unwrap();
//! assert_eq!(observation.pixels, &pixels);
//! assert_eq!(observation.proprio, [0.5, -1.0]);
//! assert!(observation.expect_shape(&shape).is_ok());
//! assert!(decode(&bytes[..20]).is_err());
//!
//! // Two cameras of 2x2 RGB: 6 channels, named.
//! let two = ObservationShape { channels: 6, ..shape };
//! let bytes = encode_named(&two, &["agentview", "wrist"], &[1u8; 24], &[0.5, -1.0]).unwrap();
//! let observation = decode(&bytes).unwrap();
//! assert_eq!(observation.names, ["agentview", "wrist"]);
//! assert_eq!(observation.shape, two);
//! ```

/// The four bytes every observation starts with.
pub const MAGIC: [u8; 4] = *b"EFOB";

/// The format version of one unnamed image ([`encode`]).
pub const VERSION: u16 = 1;

/// The format version of several named images ([`encode_named`]).
pub const VERSION_NAMED: u16 = 2;

/// Bytes of the fixed header (before the pixels in version 1, before the
/// image count in version 2).
pub const HEADER_LEN: usize = 14;

/// The shape of an observation: image height, width and channels, proprio
/// length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ObservationShape {
    /// Image rows.
    pub height: usize,
    /// Image columns.
    pub width: usize,
    /// Channels per pixel (3 for RGB).
    pub channels: usize,
    /// Proprio values.
    pub proprio: usize,
}

impl ObservationShape {
    /// Pixel bytes: `height × width × channels`.
    pub fn pixel_len(&self) -> usize {
        self.height * self.width * self.channels
    }

    /// Encoded bytes of one unnamed image (version 1): header, pixels and
    /// proprio.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.pixel_len() + 4 * self.proprio
    }
}

impl std::fmt::Display for ObservationShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}x{}x{} image + {} proprio",
            self.height, self.width, self.channels, self.proprio
        )
    }
}

/// Why observation bytes could not be written or read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ObservationError {
    /// Fewer bytes than the header, or than the header announces.
    #[error("observation truncated: {found} bytes, expected {expected} ({what})")]
    Truncated {
        /// Bytes needed.
        expected: u64,
        /// Bytes present.
        found: usize,
        /// What was being read.
        what: &'static str,
    },
    /// More bytes than the header announces.
    #[error("observation has {found} bytes, its header announces {expected} ({shape})")]
    TrailingBytes {
        /// Bytes announced.
        expected: usize,
        /// Bytes present.
        found: usize,
        /// The announced shape.
        shape: ObservationShape,
    },
    /// Not an observation of this format.
    #[error("observation starts with {found:?}, expected the magic {MAGIC:?} (b\"EFOB\")")]
    BadMagic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// A format version this build does not read.
    #[error(
        "observation format version {found}; this build reads versions {VERSION}, {VERSION_NAMED} and 3"
    )]
    UnsupportedVersion {
        /// The version in the header.
        found: u16,
    },
    /// An image list (version 3, [`crate::image_list`]) where one frame of
    /// one size is read.
    #[error(
        "observation holds {count} images of different sizes (format version 3, a prompt's images): read it as an image list, not as one frame"
    )]
    ImageList {
        /// The images it holds.
        count: u16,
    },
    /// A decoded observation of another shape than expected.
    #[error("observation is {found}, expected {expected}")]
    ShapeMismatch {
        /// The shape asked for (e.g. the checkpoint's config).
        expected: ObservationShape,
        /// The observation's shape.
        found: ObservationShape,
    },
    /// A proprio value that is NaN or infinite.
    #[error("observation proprio value {index} is {value}, expected a finite number")]
    NonFiniteProprio {
        /// Its position.
        index: usize,
        /// The value.
        value: f32,
    },
    /// Buffers that disagree with the shape given to encode or decode into.
    #[error("{what}: {found} values for {shape}, expected {expected}")]
    BufferLength {
        /// Which buffer.
        what: &'static str,
        /// Values expected.
        expected: usize,
        /// Values given.
        found: usize,
        /// The shape.
        shape: ObservationShape,
    },
    /// Image names that do not fit the format or the shape.
    #[error("observation image names: {reason}")]
    BadNames {
        /// What is wrong with them.
        reason: String,
    },
    /// A dimension the header cannot hold.
    #[error(
        "observation {field} = {value} exceeds the format's limit {}",
        u16::MAX
    )]
    TooLarge {
        /// The dimension.
        field: &'static str,
        /// Its value.
        value: usize,
    },
}

impl crate::Classify for ObservationError {
    /// Bad bytes, buffers or shapes come from the caller's data: bad input.
    fn kind(&self) -> crate::ErrorKind {
        crate::ErrorKind::BadInput
    }
}

/// A decoded observation, borrowing its pixels from the bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation<'a> {
    /// Its shape.
    pub shape: ObservationShape,
    /// `height × width × channels` bytes, HWC.
    pub pixels: &'a [u8],
    /// The proprio vector.
    pub proprio: Vec<f32>,
    /// The images' names, in channel order (version 2); empty for one
    /// unnamed image (version 1).
    pub names: Vec<&'a str>,
}

impl Observation<'_> {
    /// `Ok` when the observation has shape `expected`, else
    /// [`ObservationError::ShapeMismatch`] naming both.
    pub fn expect_shape(&self, expected: &ObservationShape) -> Result<(), ObservationError> {
        if self.shape == *expected {
            Ok(())
        } else {
            Err(ObservationError::ShapeMismatch {
                expected: *expected,
                found: self.shape,
            })
        }
    }
}

/// Appends the encoding of one observation of one unnamed image to `out`
/// (version 1, see the module doc).
pub fn encode_into(
    shape: &ObservationShape,
    pixels: &[u8],
    proprio: &[f32],
    out: &mut Vec<u8>,
) -> Result<(), ObservationError> {
    encode_with(shape, &[], pixels, proprio, out)
}

/// The encoding of one observation of several named images (version 2):
/// `names` in channel order, `shape.channels` the images' channels together
/// (a multiple of the number of names), `pixels` HWC with image `k`'s
/// channels at `k·C/N .. (k+1)·C/N` of each pixel. No names: one unnamed
/// image, version 1 (as [`encode`]).
pub fn encode_named(
    shape: &ObservationShape,
    names: &[&str],
    pixels: &[u8],
    proprio: &[f32],
) -> Result<Vec<u8>, ObservationError> {
    let mut out = Vec::new();
    encode_with(shape, names, pixels, proprio, &mut out)?;
    Ok(out)
}

fn encode_with(
    shape: &ObservationShape,
    names: &[&str],
    pixels: &[u8],
    proprio: &[f32],
    out: &mut Vec<u8>,
) -> Result<(), ObservationError> {
    for (field, value) in [
        ("height", shape.height),
        ("width", shape.width),
        ("channels", shape.channels),
        ("proprio length", shape.proprio),
    ] {
        if value > usize::from(u16::MAX) {
            return Err(ObservationError::TooLarge { field, value });
        }
    }
    check_len("pixels", shape.pixel_len(), pixels.len(), shape)?;
    check_len("proprio", shape.proprio, proprio.len(), shape)?;
    if let Some((index, &value)) = proprio.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(ObservationError::NonFiniteProprio { index, value });
    }
    if !names.is_empty() {
        check_names(names, shape.channels)?;
    }
    out.reserve(shape.encoded_len() + names_len(names));
    out.extend_from_slice(&MAGIC);
    let version = if names.is_empty() {
        VERSION
    } else {
        VERSION_NAMED
    };
    for value in [
        version as usize,
        shape.height,
        shape.width,
        shape.channels,
        shape.proprio,
    ] {
        out.extend_from_slice(&(value as u16).to_le_bytes());
    }
    if !names.is_empty() {
        out.extend_from_slice(&(names.len() as u16).to_le_bytes());
        for name in names {
            out.push(name.len() as u8);
            out.extend_from_slice(name.as_bytes());
        }
    }
    out.extend_from_slice(pixels);
    for value in proprio {
        out.extend_from_slice(&value.to_le_bytes());
    }
    Ok(())
}

/// The encoding of one observation (see the module doc).
pub fn encode(
    shape: &ObservationShape,
    pixels: &[u8],
    proprio: &[f32],
) -> Result<Vec<u8>, ObservationError> {
    let mut out = Vec::new();
    encode_into(shape, pixels, proprio, &mut out)?;
    Ok(out)
}

/// Decodes and checks one observation (see the module doc).
pub fn decode(bytes: &[u8]) -> Result<Observation<'_>, ObservationError> {
    let (shape, names, start) = read_layout(bytes)?;
    let pixels = &bytes[start..start + shape.pixel_len()];
    let mut proprio = vec![0.0; shape.proprio];
    read_proprio(bytes, &shape, start, &mut proprio)?;
    Ok(Observation {
        shape,
        pixels,
        proprio,
        names,
    })
}

/// Decodes one observation of shape `expected` into caller buffers (a
/// model stage filling one row of its batch): `pixels` holds
/// `expected.pixel_len()` bytes, `proprio` `expected.proprio` values.
pub fn decode_into(
    bytes: &[u8],
    expected: &ObservationShape,
    pixels: &mut [u8],
    proprio: &mut [f32],
) -> Result<(), ObservationError> {
    check_len("pixels", expected.pixel_len(), pixels.len(), expected)?;
    check_len("proprio", expected.proprio, proprio.len(), expected)?;
    let (shape, _, start) = read_layout(bytes)?;
    if shape != *expected {
        return Err(ObservationError::ShapeMismatch {
            expected: *expected,
            found: shape,
        });
    }
    pixels.copy_from_slice(&bytes[start..start + shape.pixel_len()]);
    read_proprio(bytes, &shape, start, proprio)
}

/// The shape announced by the header, once the length is checked against
/// it.
pub fn read_header(bytes: &[u8]) -> Result<ObservationShape, ObservationError> {
    read_layout(bytes).map(|(shape, _, _)| shape)
}

/// The images' names of a version 2 observation, each with its length byte.
fn names_len(names: &[&str]) -> usize {
    if names.is_empty() {
        0
    } else {
        2 + names.iter().map(|n| 1 + n.len()).sum::<usize>()
    }
}

/// Why `names` cannot name the images of `channels` channels, if they
/// cannot: 1..=channels names dividing them, each 1..=255 bytes, distinct.
fn check_names(names: &[&str], channels: usize) -> Result<(), ObservationError> {
    let bad = |reason: String| Err(ObservationError::BadNames { reason });
    if names.is_empty() || names.len() > channels || channels % names.len() != 0 {
        return bad(format!(
            "{} names for {channels} channels (each image has the same channels: the count must divide them)",
            names.len()
        ));
    }
    for (i, name) in names.iter().enumerate() {
        if name.is_empty() || name.len() > 255 {
            return bad(format!(
                "name {i} is {} bytes, expected 1..=255",
                name.len()
            ));
        }
        if names[..i].contains(name) {
            return bad(format!("`{name}` is named twice"));
        }
    }
    Ok(())
}

/// The shape, the names (empty for version 1) and the offset of the pixels
/// of an observation, once its length is checked against them.
fn read_layout(bytes: &[u8]) -> Result<(ObservationShape, Vec<&str>, usize), ObservationError> {
    if bytes.len() < HEADER_LEN {
        return Err(ObservationError::Truncated {
            expected: HEADER_LEN as u64,
            found: bytes.len(),
            what: "header",
        });
    }
    let magic: [u8; 4] = bytes[..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(ObservationError::BadMagic { found: magic });
    }
    let field = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let version = field(4);
    if version == crate::image_list::VERSION_LIST {
        return Err(ObservationError::ImageList { count: field(6) });
    }
    if version != VERSION && version != VERSION_NAMED {
        return Err(ObservationError::UnsupportedVersion { found: version });
    }
    let (height, width, channels, proprio) = (field(6), field(8), field(10), field(12));
    let mut names = Vec::new();
    let mut start = HEADER_LEN;
    if version == VERSION_NAMED {
        let truncated = |expected: usize| ObservationError::Truncated {
            expected: expected as u64,
            found: bytes.len(),
            what: "the image names",
        };
        if bytes.len() < HEADER_LEN + 2 {
            return Err(truncated(HEADER_LEN + 2));
        }
        let count = field(HEADER_LEN);
        start += 2;
        for _ in 0..count {
            let len = usize::from(*bytes.get(start).ok_or_else(|| truncated(start + 1))?);
            let name = bytes
                .get(start + 1..start + 1 + len)
                .ok_or_else(|| truncated(start + 1 + len))?;
            let name = std::str::from_utf8(name).map_err(|_| ObservationError::BadNames {
                reason: format!("name {} is not UTF-8", names.len()),
            })?;
            names.push(name);
            start += 1 + len;
        }
        check_names(&names, channels.into())?;
    }
    // At most 2^16 · 256 + 65535^3 + 4 * 65535 bytes: no overflow in u64.
    let expected = start as u64
        + u64::from(height) * u64::from(width) * u64::from(channels)
        + 4 * u64::from(proprio);
    if (bytes.len() as u64) < expected {
        return Err(ObservationError::Truncated {
            expected,
            found: bytes.len(),
            what: "the pixels and proprio the header announces",
        });
    }
    let shape = ObservationShape {
        height: height.into(),
        width: width.into(),
        channels: channels.into(),
        proprio: proprio.into(),
    };
    if bytes.len() as u64 > expected {
        return Err(ObservationError::TrailingBytes {
            expected: expected as usize,
            found: bytes.len(),
            shape,
        });
    }
    Ok((shape, names, start))
}

fn read_proprio(
    bytes: &[u8],
    shape: &ObservationShape,
    pixels_at: usize,
    out: &mut [f32],
) -> Result<(), ObservationError> {
    let start = pixels_at + shape.pixel_len();
    for (index, (chunk, slot)) in bytes[start..].chunks_exact(4).zip(out).enumerate() {
        let value = f32::from_le_bytes(chunk.try_into().expect("4 bytes"));
        if !value.is_finite() {
            return Err(ObservationError::NonFiniteProprio { index, value });
        }
        *slot = value;
    }
    Ok(())
}

fn check_len(
    what: &'static str,
    expected: usize,
    found: usize,
    shape: &ObservationShape,
) -> Result<(), ObservationError> {
    if expected == found {
        Ok(())
    } else {
        Err(ObservationError::BufferLength {
            what,
            expected,
            found,
            shape: *shape,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rgb(size: usize, proprio: usize) -> ObservationShape {
        ObservationShape {
            height: size,
            width: size,
            channels: 3,
            proprio,
        }
    }

    #[test]
    fn the_layout_is_the_documented_one() {
        let shape = ObservationShape {
            height: 1,
            width: 2,
            channels: 3,
            proprio: 1,
        };
        let bytes = encode(&shape, &[1, 2, 3, 4, 5, 6], &[1.0]).unwrap();
        assert_eq!(
            bytes,
            [
                b'E', b'F', b'O', b'B', 1, 0, 1, 0, 2, 0, 3, 0, 1, 0, 1, 2, 3, 4, 5, 6, 0, 0, 0x80,
                0x3f
            ]
        );
    }

    #[test]
    fn each_kind_of_bad_bytes_is_named() {
        let shape = rgb(4, 5);
        let pixels: Vec<u8> = (0..48).collect();
        let good = encode(&shape, &pixels, &[0.1, 0.2, 0.3, 1.0, 0.0]).unwrap();
        assert!(matches!(
            decode(&good[..10]),
            Err(ObservationError::Truncated { what: "header", .. })
        ));
        let error = decode(&good[..good.len() - 1]).unwrap_err();
        assert!(
            matches!(
                error,
                ObservationError::Truncated {
                    expected: 82,
                    found: 81,
                    ..
                }
            ),
            "{error}"
        );
        let mut long = good.clone();
        long.push(0);
        let error = decode(&long).unwrap_err().to_string();
        assert!(
            error.contains("83 bytes") && error.contains("4x4x3"),
            "{error}"
        );
        let mut magic = good.clone();
        magic[0] = b'X';
        assert!(
            matches!(decode(&magic), Err(ObservationError::BadMagic { found }) if found == *b"XFOB")
        );
        let mut version = good.clone();
        version[4] = 4;
        assert_eq!(
            decode(&version).unwrap_err(),
            ObservationError::UnsupportedVersion { found: 4 }
        );
        // Version 3 is an image list, refused by name.
        version[4] = 3;
        assert!(matches!(
            decode(&version),
            Err(ObservationError::ImageList { .. })
        ));
        let mut nan = good.clone();
        let at = HEADER_LEN + 48 + 4 * 2;
        nan[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(matches!(
            decode(&nan),
            Err(ObservationError::NonFiniteProprio { index: 2, .. })
        ));
        let other = rgb(8, 5);
        let error = decode(&good).unwrap().expect_shape(&other).unwrap_err();
        assert_eq!(
            error.to_string(),
            "observation is 4x4x3 image + 5 proprio, expected 8x8x3 image + 5 proprio"
        );
        let (mut px, mut pr) = (vec![0; other.pixel_len()], vec![0.0; 5]);
        assert!(matches!(
            decode_into(&good, &other, &mut px, &mut pr),
            Err(ObservationError::ShapeMismatch { .. })
        ));
    }

    #[test]
    fn encoding_checks_its_inputs() {
        let shape = rgb(2, 2);
        assert!(matches!(
            encode(&shape, &[0; 11], &[0.0, 0.0]),
            Err(ObservationError::BufferLength {
                what: "pixels",
                expected: 12,
                found: 11,
                ..
            })
        ));
        assert!(matches!(
            encode(&shape, &[0; 12], &[0.0]),
            Err(ObservationError::BufferLength {
                what: "proprio",
                ..
            })
        ));
        assert!(matches!(
            encode(&shape, &[0; 12], &[0.0, f32::INFINITY]),
            Err(ObservationError::NonFiniteProprio { index: 1, .. })
        ));
        let wide = ObservationShape {
            height: 1,
            width: 70_000,
            channels: 1,
            proprio: 0,
        };
        assert_eq!(
            encode(&wide, &vec![0; 70_000], &[]).unwrap_err(),
            ObservationError::TooLarge {
                field: "width",
                value: 70_000
            }
        );
    }

    #[test]
    fn named_images_are_version_2_and_read_back_with_their_names() {
        let shape = ObservationShape {
            height: 1,
            width: 2,
            channels: 6,
            proprio: 1,
        };
        let pixels: Vec<u8> = (0..12).collect();
        let bytes = encode_named(&shape, &["agentview", "wrist"], &pixels, &[0.5]).unwrap();
        let mut expected = b"EFOB".to_vec();
        for field in [2u16, 1, 2, 6, 1, 2] {
            expected.extend_from_slice(&field.to_le_bytes());
        }
        expected.push(9);
        expected.extend_from_slice(b"agentview");
        expected.push(5);
        expected.extend_from_slice(b"wrist");
        expected.extend_from_slice(&pixels);
        expected.extend_from_slice(&0.5f32.to_le_bytes());
        assert_eq!(bytes, expected);
        let observation = decode(&bytes).unwrap();
        assert_eq!(observation.names, ["agentview", "wrist"]);
        assert_eq!(observation.pixels, &pixels[..]);
        assert_eq!(observation.proprio, [0.5]);
        let (mut px, mut pr) = (vec![0; 12], vec![0.0]);
        decode_into(&bytes, &shape, &mut px, &mut pr).unwrap();
        assert_eq!((px, pr), (pixels.clone(), vec![0.5]));
        // No names: version 1, byte for byte what `encode` writes.
        assert_eq!(
            encode_named(&shape, &[], &pixels, &[0.5]).unwrap(),
            encode(&shape, &pixels, &[0.5]).unwrap()
        );
        assert!(
            decode(&encode(&shape, &pixels, &[0.5]).unwrap())
                .unwrap()
                .names
                .is_empty()
        );
    }

    #[test]
    fn bad_image_names_are_named() {
        let shape = rgb(1, 0);
        let shape = ObservationShape {
            channels: 6,
            ..shape
        };
        let pixels = [0u8; 6];
        for (names, needle) in [
            (&["a", "b", "c", "d"][..], "4 names for 6 channels"),
            (&["a", "a"][..], "`a` is named twice"),
            (&["", "b"][..], "name 0 is 0 bytes"),
        ] {
            let error = encode_named(&shape, names, &pixels, &[])
                .unwrap_err()
                .to_string();
            assert!(error.contains(needle), "{names:?}: {error}");
        }
        let good = encode_named(&shape, &["left", "right"], &pixels, &[]).unwrap();
        for cut in [15, 17, 20] {
            assert!(
                matches!(
                    decode(&good[..cut]),
                    Err(ObservationError::Truncated {
                        what: "the image names",
                        ..
                    })
                ),
                "cut at {cut}"
            );
        }
        let mut not_utf8 = good.clone();
        not_utf8[17] = 0xff;
        assert!(
            decode(&not_utf8)
                .unwrap_err()
                .to_string()
                .contains("not UTF-8")
        );
        let mut long = good.clone();
        long.push(0);
        assert!(matches!(
            decode(&long),
            Err(ObservationError::TrailingBytes { expected, found, .. }) if found == expected + 1
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&bytes);
            let shape = rgb(2, 1);
            let _ = decode_into(&bytes, &shape, &mut [0; 12], &mut [0.0]);
        }

        #[test]
        fn headers_with_arbitrary_fields_never_panic(
            fields in proptest::array::uniform5(any::<u16>()),
            body in proptest::collection::vec(any::<u8>(), 0..128),
        ) {
            let mut bytes = MAGIC.to_vec();
            for (i, field) in fields.into_iter().enumerate() {
                let field = if i == 0 { VERSION + field % 2 } else { field % 8 };
                bytes.extend_from_slice(&field.to_le_bytes());
            }
            bytes.extend_from_slice(&body);
            if let Ok(observation) = decode(&bytes) {
                prop_assert_eq!(
                    observation.shape.encoded_len() + names_len(&observation.names),
                    bytes.len()
                );
                prop_assert!(observation.proprio.iter().all(|v| v.is_finite()));
            }
        }

        #[test]
        fn round_trip(
            height in 0usize..6, width in 0usize..6, channels in 1usize..4,
            seed in any::<u64>(), proprio in proptest::collection::vec(-1e6f32..1e6, 0..8),
        ) {
            let shape = ObservationShape { height, width, channels, proprio: proprio.len() };
            let pixels: Vec<u8> = (0..shape.pixel_len()).map(|i| (seed >> (i % 57)) as u8 ^ i as u8).collect();
            let bytes = encode(&shape, &pixels, &proprio).unwrap();
            prop_assert_eq!(bytes.len(), shape.encoded_len());
            let observation = decode(&bytes).unwrap();
            prop_assert_eq!(observation.shape, shape);
            prop_assert_eq!(observation.pixels, &pixels[..]);
            prop_assert_eq!(&observation.proprio, &proprio);
            let (mut px, mut pr) = (vec![0; shape.pixel_len()], vec![0.0; shape.proprio]);
            decode_into(&bytes, &shape, &mut px, &mut pr).unwrap();
            prop_assert_eq!(px, pixels);
            prop_assert_eq!(pr, proprio);
        }
    }
}

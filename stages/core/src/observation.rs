//! The bytes of a closed-loop observation (`steps.observation`): one
//! camera image and one proprio vector, self-describing, so that
//! `update-policy` and every offline stage replay a decision without the
//! world. It lives in the core because both sides use it and neither may
//! depend on the other: the rollout layer encodes what a world rendered,
//! the model stages decode it into their input tensors; no world and no
//! model is needed to read it.
//!
//! Layout (version 1, every integer little-endian):
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
//! The length is exact: `14 + H·W·C + 4·P` bytes. Decoding checks the magic,
//! the version, the length (too short: [`ObservationError::Truncated`]; too
//! long: [`ObservationError::TrailingBytes`]) and that every proprio value is
//! finite; [`Observation::expect_shape`] checks a decoded observation
//! against the shape a model was built for. Arbitrary bytes give an error,
//! never a panic.
//!
//! ```
//! use embodyflow_core::observation::{ObservationShape, decode, encode};
//! let shape = ObservationShape { height: 2, width: 2, channels: 3, proprio: 2 };
//! let pixels = [7u8; 12];
//! let bytes = encode(&shape, &pixels, &[0.5, -1.0]).unwrap();
//! assert_eq!(bytes.len(), 14 + 12 + 8);
//! let observation = decode(&bytes).unwrap();
//! assert_eq!(observation.pixels, &pixels);
//! assert_eq!(observation.proprio, [0.5, -1.0]);
//! assert!(observation.expect_shape(&shape).is_ok());
//! assert!(decode(&bytes[..20]).is_err());
//! ```

/// The four bytes every observation starts with.
pub const MAGIC: [u8; 4] = *b"EFOB";

/// The format version this module writes and reads.
pub const VERSION: u16 = 1;

/// Bytes before the pixels.
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

    /// Encoded bytes: header, pixels and proprio.
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
    #[error("observation format version {found}; this build reads version {VERSION}")]
    UnsupportedVersion {
        /// The version in the header.
        found: u16,
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

/// Appends the encoding of one observation to `out` (see the module doc).
pub fn encode_into(
    shape: &ObservationShape,
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
    out.reserve(shape.encoded_len());
    out.extend_from_slice(&MAGIC);
    for value in [
        VERSION as usize,
        shape.height,
        shape.width,
        shape.channels,
        shape.proprio,
    ] {
        out.extend_from_slice(&(value as u16).to_le_bytes());
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
    let shape = read_header(bytes)?;
    let pixels = &bytes[HEADER_LEN..HEADER_LEN + shape.pixel_len()];
    let mut proprio = vec![0.0; shape.proprio];
    read_proprio(bytes, &shape, &mut proprio)?;
    Ok(Observation {
        shape,
        pixels,
        proprio,
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
    let shape = read_header(bytes)?;
    if shape != *expected {
        return Err(ObservationError::ShapeMismatch {
            expected: *expected,
            found: shape,
        });
    }
    pixels.copy_from_slice(&bytes[HEADER_LEN..HEADER_LEN + shape.pixel_len()]);
    read_proprio(bytes, &shape, proprio)
}

/// The shape announced by the header, once the length is checked against
/// it.
pub fn read_header(bytes: &[u8]) -> Result<ObservationShape, ObservationError> {
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
    if version != VERSION {
        return Err(ObservationError::UnsupportedVersion { found: version });
    }
    let (height, width, channels, proprio) = (field(6), field(8), field(10), field(12));
    // At most 14 + 65535^3 + 4 * 65535 bytes: no overflow in u64.
    let expected = HEADER_LEN as u64
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
            expected: shape.encoded_len(),
            found: bytes.len(),
            shape,
        });
    }
    Ok(shape)
}

fn read_proprio(
    bytes: &[u8],
    shape: &ObservationShape,
    out: &mut [f32],
) -> Result<(), ObservationError> {
    let start = HEADER_LEN + shape.pixel_len();
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
        version[4] = 2;
        assert_eq!(
            decode(&version).unwrap_err(),
            ObservationError::UnsupportedVersion { found: 2 }
        );
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
                let field = if i == 0 { VERSION } else { field % 8 };
                bytes.extend_from_slice(&field.to_le_bytes());
            }
            bytes.extend_from_slice(&body);
            if let Ok(observation) = decode(&bytes) {
                prop_assert_eq!(observation.shape.encoded_len(), bytes.len());
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

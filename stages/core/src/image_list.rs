//! Several images of any sizes in one `steps.observation` value: the images
//! of a vision-language prompt (Qwen-VL takes each image at its own
//! resolution), format version 3 of [`crate::observation`]. Versions 1
//! and 2 hold one size, joined along the channels, as a closed-loop model
//! reads its cameras; version 3 lists the images one after another, each
//! with its name and size, and [`decode_image_list`] reads all three
//! versions into the same list, so a reader of prompt images takes
//! whatever a writer stored.
//!
//! Layout (every integer little-endian):
//!
//! ```text
//! offset  size        field
//! 0       4           magic  b"EFOB"
//! 4       2  u16      format version (3)
//! 6       2  u16      N images (at least 1)
//! 8       2  u16      proprio length P
//! 10      …           N entries: u8 name length L (1..=255), L bytes UTF-8 (distinct),
//!                     u16 height, u16 width, u16 channels (at least 1)
//! then    …           the images' pixels, image 0 first, each H·W·C bytes (HWC)
//! then    4·P         proprio, f32, finite
//! ```
//!
//! The length is exact; every size is read from the header and checked
//! against the bytes before any buffer is allocated (at most 65535 images
//! of 65535³ bytes: the sum is computed in `u64`). A closed-loop reader
//! ([`crate::observation::decode`]) refuses version 3 naming it.
//!
//! ```
//! use embodyflow_core::image_list::{Image, decode_image_list, encode_image_list};
//! let images = [
//!     Image { name: "scene".into(), height: 2, width: 3, channels: 3, pixels: vec![1; 18] },
//!     Image { name: "crop".into(), height: 1, width: 1, channels: 3, pixels: vec![2; 3] },
//! ];
//! let bytes = encode_image_list(&images, &[0.5]).unwrap();
//! let (read, proprio) = decode_image_list(&bytes).unwrap();
//! assert_eq!((read.as_slice(), proprio.as_slice()), (&images[..], &[0.5][..]));
//! assert!(embodyflow_core::observation::decode(&bytes).is_err());
//! ```

use crate::observation::{
    MAGIC, ObservationError, ObservationShape, VERSION, VERSION_NAMED, decode,
};

/// The format version of images of any sizes.
pub const VERSION_LIST: u16 = 3;

/// Bytes before the entries: magic, version, count, proprio length.
const LIST_HEADER_LEN: usize = 10;

/// One image of a list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    /// Its name (empty for the one image of a version 1 observation).
    pub name: String,
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
    /// Channels per pixel.
    pub channels: usize,
    /// `height × width × channels` bytes, HWC.
    pub pixels: Vec<u8>,
}

impl Image {
    fn pixel_len(&self) -> usize {
        self.height * self.width * self.channels
    }
}

/// The version 3 encoding of `images` (at least one, names distinct, 1 to
/// 255 bytes each) and `proprio`.
pub fn encode_image_list(images: &[Image], proprio: &[f32]) -> Result<Vec<u8>, ObservationError> {
    let bad = |reason: String| ObservationError::BadNames { reason };
    if images.is_empty() {
        return Err(bad("an image list holds at least one image".into()));
    }
    let too_large = |field: &'static str, value: usize| {
        (value > usize::from(u16::MAX)).then_some(ObservationError::TooLarge { field, value })
    };
    if let Some(error) = too_large("image count", images.len())
        .or_else(|| too_large("proprio length", proprio.len()))
    {
        return Err(error);
    }
    let names: Vec<&str> = images.iter().map(|i| i.name.as_str()).collect();
    check_names(&names)?;
    for image in images {
        if let Some(error) = too_large("height", image.height)
            .or_else(|| too_large("width", image.width))
            .or_else(|| too_large("channels", image.channels))
        {
            return Err(error);
        }
        let shape = ObservationShape {
            height: image.height,
            width: image.width,
            channels: image.channels,
            proprio: proprio.len(),
        };
        if image.channels == 0 {
            return Err(bad(format!("image `{}` has no channels", image.name)));
        }
        if image.pixels.len() != image.pixel_len() {
            return Err(ObservationError::BufferLength {
                what: "pixels",
                expected: image.pixel_len(),
                found: image.pixels.len(),
                shape,
            });
        }
    }
    if let Some((index, &value)) = proprio.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(ObservationError::NonFiniteProprio { index, value });
    }
    let mut out = Vec::new();
    out.extend_from_slice(&MAGIC);
    for value in [VERSION_LIST as usize, images.len(), proprio.len()] {
        out.extend_from_slice(&(value as u16).to_le_bytes());
    }
    for image in images {
        out.push(image.name.len() as u8);
        out.extend_from_slice(image.name.as_bytes());
        for value in [image.height, image.width, image.channels] {
            out.extend_from_slice(&(value as u16).to_le_bytes());
        }
    }
    for image in images {
        out.extend_from_slice(&image.pixels);
    }
    for value in proprio {
        out.extend_from_slice(&value.to_le_bytes());
    }
    Ok(out)
}

/// The images and proprio of an observation of any version: version 3's
/// list as stored, version 2's images split out of their joined channels
/// (named), version 1's one image (unnamed).
pub fn decode_image_list(bytes: &[u8]) -> Result<(Vec<Image>, Vec<f32>), ObservationError> {
    let version = bytes.get(4..6).map(|v| u16::from_le_bytes([v[0], v[1]]));
    if bytes.len() >= 4 && bytes[..4] == MAGIC && version == Some(VERSION_LIST) {
        return read_list(bytes);
    }
    let observation = decode(bytes)?;
    debug_assert!([VERSION, VERSION_NAMED].contains(&version.unwrap_or(0)));
    let shape = observation.shape;
    let names: Vec<String> = if observation.names.is_empty() {
        vec![String::new()]
    } else {
        observation.names.iter().map(|n| n.to_string()).collect()
    };
    let each = shape.channels / names.len();
    let images = names
        .into_iter()
        .enumerate()
        .map(|(k, name)| {
            let mut pixels = Vec::with_capacity(shape.height * shape.width * each);
            for pixel in observation.pixels.chunks_exact(shape.channels.max(1)) {
                pixels.extend_from_slice(&pixel[k * each..(k + 1) * each]);
            }
            Image {
                name,
                height: shape.height,
                width: shape.width,
                channels: each,
                pixels,
            }
        })
        .collect();
    Ok((images, observation.proprio))
}

/// Names of a list: 1..=255 bytes each, distinct.
fn check_names(names: &[&str]) -> Result<(), ObservationError> {
    for (i, name) in names.iter().enumerate() {
        let reason = if name.is_empty() || name.len() > 255 {
            format!("name {i} is {} bytes, expected 1..=255", name.len())
        } else if names[..i].contains(name) {
            format!("`{name}` is named twice")
        } else {
            continue;
        };
        return Err(ObservationError::BadNames { reason });
    }
    Ok(())
}

/// Reads a version 3 observation (magic and version already seen).
fn read_list(bytes: &[u8]) -> Result<(Vec<Image>, Vec<f32>), ObservationError> {
    let truncated = |expected: u64, what: &'static str| ObservationError::Truncated {
        expected,
        found: bytes.len(),
        what,
    };
    if bytes.len() < LIST_HEADER_LEN {
        return Err(truncated(LIST_HEADER_LEN as u64, "header"));
    }
    let field = |at: usize| usize::from(u16::from_le_bytes([bytes[at], bytes[at + 1]]));
    let (count, proprio_len) = (field(6), field(8));
    if count == 0 {
        return Err(ObservationError::BadNames {
            reason: "an image list holds at least one image".into(),
        });
    }
    // The entries, read before any pixel buffer exists.
    let mut entries: Vec<(&str, usize, usize, usize)> = Vec::new();
    let mut at = LIST_HEADER_LEN;
    for _ in 0..count {
        let len = usize::from(
            *bytes
                .get(at)
                .ok_or_else(|| truncated(at as u64 + 1, "the image entries"))?,
        );
        let end = at + 1 + len + 6;
        let entry = bytes
            .get(at + 1..end)
            .ok_or_else(|| truncated(end as u64, "the image entries"))?;
        let name = std::str::from_utf8(&entry[..len]).map_err(|_| ObservationError::BadNames {
            reason: format!("name {} is not UTF-8", entries.len()),
        })?;
        let dims = |k: usize| usize::from(u16::from_le_bytes([entry[len + k], entry[len + k + 1]]));
        let (height, width, channels) = (dims(0), dims(2), dims(4));
        if channels == 0 {
            return Err(ObservationError::BadNames {
                reason: format!("image `{name}` has no channels"),
            });
        }
        entries.push((name, height, width, channels));
        at = end;
    }
    let names: Vec<&str> = entries.iter().map(|e| e.0).collect();
    check_names(&names)?;
    let expected = at as u64
        + entries
            .iter()
            .map(|&(_, h, w, c)| h as u64 * w as u64 * c as u64)
            .sum::<u64>()
        + 4 * proprio_len as u64;
    if (bytes.len() as u64) < expected {
        return Err(truncated(
            expected,
            "the pixels and proprio the header announces",
        ));
    }
    if bytes.len() as u64 > expected {
        let (_, height, width, channels) = entries[0];
        return Err(ObservationError::TrailingBytes {
            expected: expected as usize,
            found: bytes.len(),
            shape: ObservationShape {
                height,
                width,
                channels,
                proprio: proprio_len,
            },
        });
    }
    let mut images = Vec::with_capacity(entries.len());
    for (name, height, width, channels) in entries {
        let len = height * width * channels;
        images.push(Image {
            name: name.to_string(),
            height,
            width,
            channels,
            pixels: bytes[at..at + len].to_vec(),
        });
        at += len;
    }
    let mut proprio = Vec::with_capacity(proprio_len);
    for (index, chunk) in bytes[at..].chunks_exact(4).enumerate() {
        let value = f32::from_le_bytes(chunk.try_into().expect("4 bytes"));
        if !value.is_finite() {
            return Err(ObservationError::NonFiniteProprio { index, value });
        }
        proprio.push(value);
    }
    Ok((images, proprio))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observation::{encode, encode_named};
    use proptest::prelude::*;

    fn image(name: &str, height: usize, width: usize, fill: u8) -> Image {
        Image {
            name: name.into(),
            height,
            width,
            channels: 3,
            pixels: (0..height * width * 3).map(|i| fill ^ i as u8).collect(),
        }
    }

    #[test]
    fn the_layout_is_the_documented_one() {
        let bytes =
            encode_image_list(&[image("a", 1, 1, 0), image("bc", 1, 2, 9)], &[1.0]).unwrap();
        let mut want = b"EFOB".to_vec();
        want.extend([3, 0, 2, 0, 1, 0]);
        want.extend([1, b'a', 1, 0, 1, 0, 3, 0]);
        want.extend([2, b'b', b'c', 1, 0, 2, 0, 3, 0]);
        want.extend([0, 1, 2]);
        want.extend([9, 8, 11, 10, 13, 12]);
        want.extend([0, 0, 0x80, 0x3f]);
        assert_eq!(bytes, want);
    }

    #[test]
    fn versions_1_and_2_read_as_lists_and_version_3_is_refused_by_the_closed_loop_reader() {
        let shape = ObservationShape {
            height: 1,
            width: 2,
            channels: 6,
            proprio: 0,
        };
        let joined = encode_named(
            &shape,
            &["a", "b"],
            &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
            &[],
        )
        .unwrap();
        let (images, _) = decode_image_list(&joined).unwrap();
        assert_eq!(images[0].pixels, [1, 2, 3, 7, 8, 9]);
        assert_eq!(
            (images[1].name.as_str(), &images[1].pixels[..]),
            ("b", &[4, 5, 6, 10, 11, 12][..])
        );
        let one = encode(
            &ObservationShape {
                channels: 3,
                ..shape
            },
            &[1, 2, 3, 4, 5, 6],
            &[],
        )
        .unwrap();
        let (images, _) = decode_image_list(&one).unwrap();
        assert_eq!((images.len(), images[0].name.as_str()), (1, ""));
        let list = encode_image_list(&[image("a", 2, 2, 0), image("b", 1, 3, 0)], &[]).unwrap();
        let error = decode(&list).unwrap_err().to_string();
        assert!(error.contains("images of different sizes"), "{error}");
    }

    #[test]
    fn bad_lists_are_named() {
        let refused = |images: &[Image]| encode_image_list(images, &[]).unwrap_err().to_string();
        assert!(refused(&[]).contains("at least one image"));
        assert!(
            refused(&[image("a", 1, 1, 0), image("a", 2, 1, 0)]).contains("`a` is named twice")
        );
        assert!(refused(&[image("", 1, 1, 0)]).contains("name 0 is 0 bytes"));
        let mut short = image("a", 2, 2, 0);
        short.pixels.pop();
        assert!(refused(&[short]).contains("11 values"));
        let good = encode_image_list(&[image("a", 2, 2, 0), image("b", 1, 1, 0)], &[0.5]).unwrap();
        for cut in 0..good.len() {
            assert!(
                matches!(
                    decode_image_list(&good[..cut]),
                    Err(ObservationError::Truncated { .. })
                ),
                "{cut}"
            );
        }
        let mut long = good.clone();
        long.push(0);
        assert!(matches!(
            decode_image_list(&long),
            Err(ObservationError::TrailingBytes { .. })
        ));
        let mut nan = good.clone();
        let n = nan.len();
        nan[n - 4..].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(matches!(
            decode_image_list(&nan),
            Err(ObservationError::NonFiniteProprio { index: 0, .. })
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_lists_never_panic(
            fields in proptest::collection::vec(any::<u8>(), 0..64),
            body in proptest::collection::vec(any::<u8>(), 0..128),
        ) {
            let mut bytes = MAGIC.to_vec();
            bytes.extend_from_slice(&VERSION_LIST.to_le_bytes());
            // Small counts and sizes, so that some lists are complete.
            bytes.extend(fields.iter().map(|b| b % 4));
            bytes.extend_from_slice(&body);
            if let Ok((images, proprio)) = decode_image_list(&bytes) {
                let pixels: usize = images.iter().map(Image::pixel_len).sum();
                prop_assert!(pixels + 4 * proprio.len() <= bytes.len());
                prop_assert_eq!(encode_image_list(&images, &proprio).unwrap(), bytes);
            }
        }

        #[test]
        fn round_trip(
            sizes in proptest::collection::vec((0usize..4, 0usize..4, 1usize..4), 1..4),
            proprio in proptest::collection::vec(-1e6f32..1e6, 0..4),
        ) {
            let images: Vec<Image> = sizes
                .iter()
                .enumerate()
                .map(|(k, &(height, width, channels))| Image {
                    name: format!("image{k}"),
                    height,
                    width,
                    channels,
                    pixels: (0..height * width * channels).map(|i| (i * 7 + k) as u8).collect(),
                })
                .collect();
            let bytes = encode_image_list(&images, &proprio).unwrap();
            prop_assert_eq!(decode_image_list(&bytes).unwrap(), (images, proprio));
        }
    }
}

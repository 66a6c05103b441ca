//! A plan prompt's images as the bytes of a `steps.observation`
//! ([`embodyflow_core::observation`]) and back: collect-rollouts records the
//! images a vision-language planner saw beside its prompt ids, and
//! update-policy and teacher-logp rebuild the same prompt from the row, so
//! sampling and scoring read the same pixels.
//!
//! One image is format version 1 (`H × W × 3`, no proprio); several of one
//! size are version 2 with the names `image0`, `image1`, … (channels
//! `3k .. 3k + 3` are image `k`); several of different sizes (Qwen-VL takes
//! each at its own resolution) are an image list, version 3
//! ([`embodyflow_core::image_list`]), named the same way. A text prompt has
//! no observation.
//!
//! ```
//! use embodyflow_models::images::{decode_images, encode_images};
//! use embodyflow_models::policy::RgbImage;
//! let image = RgbImage::new(2, 3, vec![9; 18]).unwrap();
//! let bytes = encode_images(&[image.clone()]).unwrap().unwrap();
//! assert_eq!(decode_images(&bytes).unwrap(), [image.clone()]);
//! let small = RgbImage::new(1, 1, vec![7; 3]).unwrap();
//! let bytes = encode_images(&[image.clone(), small.clone()]).unwrap().unwrap();
//! assert_eq!(decode_images(&bytes).unwrap(), [image, small]);
//! assert_eq!(encode_images(&[]).unwrap(), None);
//! ```

use embodyflow_core::Error;
use embodyflow_core::image_list::{Image, decode_image_list, encode_image_list};
use embodyflow_core::observation::{ObservationShape, encode, encode_named};
use embodyflow_hf::image::RgbImage;

/// The observation bytes of `images` (`None` without any).
pub fn encode_images(images: &[RgbImage]) -> Result<Option<Vec<u8>>, Error> {
    let Some(first) = images.first() else {
        return Ok(None);
    };
    let (height, width) = (first.height(), first.width());
    let names: Vec<String> = (0..images.len()).map(|k| format!("image{k}")).collect();
    let bad = |e: embodyflow_core::observation::ObservationError| {
        Error::BadInput(format!("encoding a prompt's images: {e}"))
    };
    if images
        .iter()
        .any(|i| (i.height(), i.width()) != (height, width))
    {
        let list: Vec<Image> = images
            .iter()
            .zip(names)
            .map(|(image, name)| Image {
                name,
                height: image.height(),
                width: image.width(),
                channels: 3,
                pixels: image.data().to_vec(),
            })
            .collect();
        return encode_image_list(&list, &[]).map(Some).map_err(bad);
    }
    let shape = ObservationShape {
        height,
        width,
        channels: 3 * images.len(),
        proprio: 0,
    };
    let bytes = if images.len() == 1 {
        encode(&shape, first.data(), &[])
    } else {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut pixels = Vec::with_capacity(shape.pixel_len());
        for pixel in 0..height * width {
            for image in images {
                pixels.extend_from_slice(&image.data()[3 * pixel..3 * pixel + 3]);
            }
        }
        encode_named(&shape, &names, &pixels, &[])
    };
    bytes.map(Some).map_err(bad)
}

/// The images of observation bytes [`encode_images`] wrote (any of the
/// three versions): RGB images, no proprio; anything else is bad input
/// saying what was found.
pub fn decode_images(bytes: &[u8]) -> Result<Vec<RgbImage>, Error> {
    let bad = |reason: String| Error::BadInput(format!("observation: {reason}"));
    let (images, proprio) = decode_image_list(bytes).map_err(|e| bad(e.to_string()))?;
    if let Some(image) = images.iter().find(|i| i.channels != 3) {
        return Err(bad(format!(
            "{} channels in image `{}`: a plan prompt's images are RGB (3 channels each) without proprio",
            image.channels, image.name
        )));
    }
    if !proprio.is_empty() {
        return Err(bad(format!(
            "{} proprio values: a plan prompt's images are RGB (3 channels each) without proprio",
            proprio.len()
        )));
    }
    images
        .into_iter()
        .map(|image| {
            RgbImage::new(image.height, image.width, image.pixels).map_err(|e| bad(e.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_of_one_or_several_sizes_round_trip_and_proprio_is_refused() {
        let a = RgbImage::new(2, 2, (0..12).collect()).unwrap();
        let b = RgbImage::new(2, 2, (100..112).collect()).unwrap();
        let bytes = encode_images(&[a.clone(), b.clone()]).unwrap().unwrap();
        assert_eq!(bytes[4], 2, "one size: joined channels (version 2)");
        assert_eq!(decode_images(&bytes).unwrap(), [a.clone(), b.clone()]);
        let small = RgbImage::new(1, 2, (50..56).collect()).unwrap();
        let bytes = encode_images(&[a.clone(), small.clone(), b.clone()])
            .unwrap()
            .unwrap();
        assert_eq!(bytes[4], 3, "several sizes: an image list (version 3)");
        assert_eq!(decode_images(&bytes).unwrap(), [a, small, b]);
        let shape = ObservationShape {
            height: 1,
            width: 1,
            channels: 3,
            proprio: 1,
        };
        let with_proprio = encode(&shape, &[1, 2, 3], &[0.5]).unwrap();
        let error = decode_images(&with_proprio).unwrap_err().to_string();
        assert!(error.contains("1 proprio"), "{error}");
    }
}

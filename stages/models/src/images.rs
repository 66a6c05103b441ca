//! A plan prompt's images as the bytes of a `steps.observation`
//! ([`embodyflow_core::observation`]) and back: collect-rollouts records the
//! images a vision-language planner saw beside its prompt ids, and
//! update-policy and teacher-logp rebuild the same prompt from the row, so
//! sampling and scoring read the same pixels.
//!
//! One image is format version 1 (`H × W × 3`, no proprio); several, of one
//! size, are version 2 with the names `image0`, `image1`, … (channels
//! `3k .. 3k + 3` are image `k`). A text prompt has no observation.
//!
//! ```
//! use embodyflow_models::images::{decode_images, encode_images};
//! use embodyflow_models::policy::RgbImage;
//! let image = RgbImage::new(2, 3, vec![9; 18]).unwrap();
//! let bytes = encode_images(&[image.clone()]).unwrap().unwrap();
//! assert_eq!(decode_images(&bytes).unwrap(), [image]);
//! assert_eq!(encode_images(&[]).unwrap(), None);
//! ```

use embodyflow_core::Error;
use embodyflow_core::observation::{ObservationShape, decode, encode, encode_named};
use embodyflow_hf::image::RgbImage;

/// The observation bytes of `images` (`None` without any); several images
/// must share one size.
pub fn encode_images(images: &[RgbImage]) -> Result<Option<Vec<u8>>, Error> {
    let Some(first) = images.first() else {
        return Ok(None);
    };
    let (height, width) = (first.height(), first.width());
    if let Some((k, other)) = images
        .iter()
        .enumerate()
        .find(|(_, i)| (i.height(), i.width()) != (height, width))
    {
        return Err(Error::BadInput(format!(
            "a prompt's images are stored together and must share one size: image 0 is {height} x {width}, image {k} {} x {}",
            other.height(),
            other.width()
        )));
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
        let names: Vec<String> = (0..images.len()).map(|k| format!("image{k}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut pixels = Vec::with_capacity(shape.pixel_len());
        for pixel in 0..height * width {
            for image in images {
                pixels.extend_from_slice(&image.data()[3 * pixel..3 * pixel + 3]);
            }
        }
        encode_named(&shape, &names, &pixels, &[])
    };
    bytes
        .map(Some)
        .map_err(|e| Error::BadInput(format!("encoding a prompt's images: {e}")))
}

/// The images of observation bytes [`encode_images`] wrote: RGB images
/// joined along the channels, no proprio; anything else is bad input
/// saying what was found.
pub fn decode_images(bytes: &[u8]) -> Result<Vec<RgbImage>, Error> {
    let bad = |reason: String| Error::BadInput(format!("observation: {reason}"));
    let observation = decode(bytes).map_err(|e| bad(e.to_string()))?;
    let shape = observation.shape;
    if shape.channels == 0 || shape.channels % 3 != 0 || shape.proprio != 0 {
        return Err(bad(format!(
            "{} channels and {} proprio values: a plan prompt's images are RGB (3 channels each) without proprio",
            shape.channels, shape.proprio
        )));
    }
    let count = shape.channels / 3;
    let pixels = shape.height * shape.width;
    (0..count)
        .map(|k| {
            let mut data = Vec::with_capacity(3 * pixels);
            for pixel in 0..pixels {
                let at = pixel * shape.channels + 3 * k;
                data.extend_from_slice(&observation.pixels[at..at + 3]);
            }
            RgbImage::new(shape.height, shape.width, data).map_err(|e| bad(e.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_images_round_trip_and_mixed_sizes_or_proprio_are_refused() {
        let a = RgbImage::new(2, 2, (0..12).collect()).unwrap();
        let b = RgbImage::new(2, 2, (100..112).collect()).unwrap();
        let bytes = encode_images(&[a.clone(), b.clone()]).unwrap().unwrap();
        assert_eq!(decode_images(&bytes).unwrap(), [a.clone(), b]);
        let small = RgbImage::new(1, 2, vec![0; 6]).unwrap();
        let error = encode_images(&[a, small]).unwrap_err().to_string();
        assert!(error.contains("image 1 1 x 2"), "{error}");
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

"""OpenVLA's image path for LIBERO frames, value for value, without
TensorFlow: the libero adapter's `image_path = "openvla"` and
`center_crop`.

OpenVLA's, OpenVLA-OFT's and SimpleVLA-RL's LIBERO code turn each camera
image (rendered at 256 px) into the policy's input with TensorFlow 2.15
(the version their pyproject pins):

- `resize_image` / `resize_image_for_policy` (OpenVLA's
  experiments/robot/libero/libero_utils.py, OFT's
  experiments/robot/openvla_utils.py, SimpleVLA-RL's
  verl/utils/libero_utils.py): `tf.image.encode_jpeg` (quality 95, 4:2:0
  chroma, libjpeg's ISLOW DCT), `tf.io.decode_image` (TensorFlow's default
  DCT is libjpeg-turbo's IFAST, with fancy upsampling), then
  `tf.image.resize(..., method="lanczos3", antialias=True)` in float32,
  rounded half to even, clipped and cast to uint8. `jpeg_round_trip`
  encodes with PIL (the same quantisation tables, sampling and DCT: the
  same coefficients) and decodes with libjpeg-turbo's IFAST DCT through
  `simplejpeg` (PIL's decoder has only ISLOW, which differs by up to 17
  per value); `lanczos3` is TensorFlow's scale-and-translate kernel
  (ComputeSpansCore, GatherRows then GatherColumns) in float32, operation
  for operation.
- `center_crop_image` / `crop_and_resize` (OpenVLA's
  experiments/robot/openvla_utils.py, OFT's, SimpleVLA-RL's
  verl/workers/rollout/rob_rollout.py): the image to float32 in [0, 1]
  (`convert_image_dtype`: x * (1/255)), `tf.image.crop_and_resize` of the
  central box of area 0.9 (side sqrt(0.9)) back to the image's size,
  bilinear, clipped to [0, 1], back to uint8 (x * 255.5, saturated,
  truncated). `center_crop` does that in float32 as TensorFlow's CPU
  kernel does.

Checked against TensorFlow 2.15.0 (tensorflow-cpu) on rendered LIBERO
frames and on the synthetic image of stages/gym/python/checks/
libero_reference.py, equal in every value.
"""

import functools
import io
import math

import numpy as np

F32 = np.float32
# OpenVLA's camera side (get_libero_env(resolution=256)) and crop area.
CAMERA_SIDE = 256
CROP_AREA = 0.9
JPEG_QUALITY = 95
# TensorFlow's lanczos3 kernel: radius 3, pi as its float constant.
LANCZOS_RADIUS = F32(3.0)
PI = F32(3.14159265359)
FLT_MIN = np.finfo(np.float32).tiny


def jpeg_round_trip(image):
    """`image` (H x W x 3 uint8) through a JPEG of quality 95 and back, as
    tf.image.encode_jpeg then tf.io.decode_image give it."""
    import simplejpeg
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return simplejpeg.decode_jpeg(buffer.getvalue(), colorspace="RGB", fastdct=True, fastupsample=False)


@functools.lru_cache(maxsize=1)
def c_sinf():
    """The C library's float sine (TensorFlow's std::sin of a float on
    Linux: glibc's sinf, which is not always the correctly rounded sine:
    the double sine rounded to float32 gives 105 of the 256 -> 224 lanczos3
    weights 1 ulp apart)."""
    import ctypes
    import ctypes.util

    libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    libm.sinf.restype = ctypes.c_float
    libm.sinf.argtypes = [ctypes.c_float]
    return libm.sinf


def sinf(x):
    """sinf(x) in float32, from the C library."""
    return F32(c_sinf()(float(x)))


def lanczos3(x):
    """TensorFlow's LanczosKernelFunc(3) in float32."""
    x = F32(abs(x))
    if x > LANCZOS_RADIUS:
        return F32(0.0)
    if float(x) <= 1e-3:
        return F32(1.0)
    numerator = F32(F32(LANCZOS_RADIUS * sinf(F32(PI * x))) * sinf(F32(F32(PI * x) / LANCZOS_RADIUS)))
    denominator = F32(F32(F32(PI * PI) * x) * x)
    return F32(numerator / denominator)


@functools.lru_cache(maxsize=16)
def spans(input_size, output_size):
    """TensorFlow's antialiased lanczos3 spans from `input_size` to
    `output_size` pixels (no translation): each output pixel's first input
    pixel and its weights (span_size of them, zero past its own span)."""
    scale = F32(output_size) / F32(input_size)
    inv_scale = F32(1.0 / float(scale))
    inv_translate = F32(-inv_scale * F32(0.0))
    kernel_scale = max(inv_scale, F32(1.0))
    reach = F32(LANCZOS_RADIUS * kernel_scale)
    span_size = min(2 * int(math.ceil(reach)) + 1, input_size)
    one_over_kernel_scale = F32(F32(1.0) / kernel_scale)
    starts = np.zeros(output_size, dtype=np.int64)
    weights = np.zeros((output_size, span_size), dtype=np.float32)
    for x in range(output_size):
        sample = F32(F32(F32(x) + F32(0.5)) * inv_scale) + inv_translate
        if sample < 0 or sample > input_size:
            continue
        start = int(math.ceil(F32(F32(sample - reach) - F32(0.5))))
        end = int(math.floor(F32(F32(sample + reach) - F32(0.5))))
        start = min(max(start, 0), input_size - 1)
        end = min(max(end, 0), input_size - 1) + 1
        taps, total = [], F32(0.0)
        for source in range(start, end):
            position = F32(F32(F32(source) + F32(0.5)) - sample)
            weight = lanczos3(F32(position * one_over_kernel_scale))
            total = F32(total + weight)
            taps.append(weight)
        if abs(total) >= 1000.0 * FLT_MIN:
            inverse = F32(F32(1.0) / total)
            weights[x, : len(taps)] = [F32(w * inverse) for w in taps]
        starts[x] = start
    return starts, weights


def gather(image, axis, starts, weights):
    """One pass of TensorFlow's GatherRows (axis 0) or GatherColumns (axis
    1): each output line the weighted sum of its span's input lines, the
    taps added in order in float32."""
    size = image.shape[axis]
    out_shape = list(image.shape)
    out_shape[axis] = len(starts)
    out = np.zeros(out_shape, dtype=np.float32)
    for k in range(weights.shape[1]):
        index = np.minimum(starts + k, size - 1)
        w = np.where(starts + k < size, weights[:, k], F32(0.0)).astype(np.float32)
        taken = np.take(image, index, axis=axis).astype(np.float32)
        shape = [1] * image.ndim
        shape[axis] = len(starts)
        out += w.reshape(shape) * taken
    return out


def resize(image, side):
    """`image` (H x W x 3 uint8) to `side` x `side` as OpenVLA's
    resize_image: the JPEG round trip, TensorFlow's antialiased lanczos3 in
    float32, rounded half to even, clipped to [0, 255]."""
    decoded = jpeg_round_trip(image)
    height, width = decoded.shape[:2]
    rows = gather(decoded.astype(np.float32), 0, *spans(height, side))
    resized = gather(rows, 1, *spans(width, side))
    return np.clip(np.rint(resized), 0, 255).astype(np.uint8)


def center_crop(image):
    """OpenVLA's center_crop_image: the central box of area 0.9 of `image`
    (H x W x 3 uint8) resized back to H x W by tf.image.crop_and_resize
    (bilinear, float32), as uint8."""
    height, width = image.shape[:2]
    pixels = image.astype(np.float32) * F32(1.0 / 255)
    side = min(max(np.sqrt(F32(CROP_AREA)), F32(0.0)), F32(1.0))
    offset = F32(F32(F32(1.0) - side) / F32(2.0))
    low, high = offset, F32(offset + side)

    def positions(size):
        """Each output index's input position, its two neighbours and its
        interpolation weight, per TensorFlow's CPU kernel."""
        scale = F32(F32(F32(high - low) * F32(size - 1)) / F32(size - 1))
        at = np.array([F32(F32(low * F32(size - 1)) + F32(F32(i) * scale)) for i in range(size)], dtype=np.float32)
        if (at < 0).any() or (at > size - 1).any():
            raise ValueError("the crop box reaches outside the image")
        below = np.floor(at).astype(np.int64)
        above = np.ceil(at).astype(np.int64)
        return below, above, (at - below.astype(np.float32)).astype(np.float32)

    top, bottom, y_lerp = positions(height)
    left, right, x_lerp = positions(width)
    x_lerp = x_lerp[None, :, None]
    top_left, top_right = pixels[top][:, left], pixels[top][:, right]
    bottom_left, bottom_right = pixels[bottom][:, left], pixels[bottom][:, right]
    upper = top_left + (top_right - top_left) * x_lerp
    lower = bottom_left + (bottom_right - bottom_left) * x_lerp
    crop = upper + (lower - upper) * y_lerp[:, None, None]
    crop = np.clip(crop, F32(0.0), F32(1.0)) * F32(255.5)
    return np.clip(crop, F32(0.0), F32(255.0)).astype(np.uint8)

"""The bridge's framed protocol, Python side (the Rust side is
stages/gym/src/protocol.rs; both must agree byte for byte).

A frame is `u32 LE length` + payload; the payload is `u32 LE header length`
+ the header (UTF-8 JSON object) + the body (binary: the observations of the
reply, EFOB bytes one after the other, their lengths in the header's
`obs_len` fields in order). Requests carry an empty body. A request's
header has its "id", which every frame answering it (the reply, progress
frames) carries too (see worker.py).

EFOB (embodyflow_core::observation): b"EFOB", u16 version, u16 height,
width, channels, proprio length; version 2 (several named images joined
along the channels) then u16 N and N names (u8 length + UTF-8); then
H*W*C pixel bytes (HWC) and the proprio as f32 little-endian. Version 1 is
one unnamed image.
"""

import json
import struct

MAX_FRAME = 1 << 30

# The protocol's output stream (the worker's original stdout), set by the
# worker; fd 1 then points at stderr so stray prints cannot corrupt frames.
OUT = None


class Malformed(Exception):
    """A frame that is not one of the protocol's."""


def read_exact(stream, n):
    """n bytes, or None at a clean end of stream before the first byte."""
    chunks = []
    got = 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            if got == 0:
                return None
            raise Malformed(f"stream ended inside a frame ({got} of {n} bytes)")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(stream):
    """(header dict, body bytes), or None when the stream has ended."""
    raw = read_exact(stream, 4)
    if raw is None:
        return None
    (length,) = struct.unpack("<I", raw)
    if length < 4 or length > MAX_FRAME:
        raise Malformed(f"frame length {length}")
    payload = read_exact(stream, length)
    if payload is None:
        raise Malformed("stream ended inside a frame")
    (header_len,) = struct.unpack("<I", payload[:4])
    if header_len > length - 4:
        raise Malformed(f"header length {header_len} in a frame of {length} bytes")
    header = json.loads(payload[4 : 4 + header_len].decode("utf-8"))
    return header, payload[4 + header_len :]


def write_frame(stream, header, body=b""):
    """Writes one frame and flushes. The header is UTF-8 JSON: a string
    holding a lone surrogate (text a damaged file decoded with
    surrogateescape, say) has it replaced by U+FFFD, which JSON readers
    that insist on Unicode (serde_json) accept."""
    text = json.dumps(header, separators=(",", ":"))
    # ASCII JSON escapes every surrogate as `\udXXX`: only a header holding
    # one (a pair for a character beyond the BMP, or a lone one) is looked at
    # again, so the frames of a rollout pay one substring search.
    if "\\ud" in text:
        unicode = json.dumps(header, separators=(",", ":"), ensure_ascii=False)
        text = unicode.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    head = text.encode("utf-8")
    stream.write(struct.pack("<II", 4 + len(head) + len(body), len(head)))
    stream.write(head)
    stream.write(body)
    stream.flush()


def efob_header(shape, proprio_len, names=()):
    """The header bytes of every EFOB observation of one shape: version 1
    without `names`, version 2 with the images' names (in channel order)."""
    height, width, channels = shape
    if not names:
        return struct.pack("<4sHHHHH", b"EFOB", 1, height, width, channels, proprio_len)
    head = struct.pack("<4sHHHHHH", b"EFOB", 2, height, width, channels, proprio_len, len(names))
    for name in names:
        raw = name.encode("utf-8")
        head += struct.pack("<B", len(raw)) + raw
    return head


def efob(pixels, shape, proprio, header=None, names=()):
    """EFOB bytes of one observation: `pixels` uint8 of shape (H, W, C)
    (any array-like of H*W*C values), `proprio` a float vector; `header`
    the shape's `efob_header` when the caller keeps it, else one is made
    with `names`."""
    import numpy as np

    height, width, channels = shape
    pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
    proprio = np.asarray(proprio, dtype="<f4")
    if pixels.size != height * width * channels:
        raise ValueError(f"{pixels.size} pixel bytes for a {height}x{width}x{channels} image")
    if not np.isfinite(proprio).all():
        raise ValueError("a proprio value is not finite")
    if header is None:
        header = efob_header(shape, proprio.size, names)
    return header + pixels.tobytes() + proprio.tobytes()

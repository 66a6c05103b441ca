//! The bridge's framed protocol over a worker's stdin/stdout pipes (the
//! Python side is `python/embodyflow_gym/protocol.py`; both agree byte for
//! byte).
//!
//! ```text
//! frame   = u32 LE payload length | payload            (length <= limit)
//! payload = u32 LE header length  | header | body
//! header  = a UTF-8 JSON object ("op" and "id" in requests; "ok" and the
//!           request's "id" in replies, "progress" and the id in progress
//!           frames; [`crate::worker`] checks the ids)
//! body    = the reply's observations, EFOB bytes (embodyflow_core::observation)
//!           one after the other, their lengths in the header's obs_len fields
//! ```
//!
//! A frame longer than the limit, a header length beyond its frame, a header
//! that is not a JSON object, or a stream that ends inside a frame is
//! malformed ([`FrameError`]); the caller kills the worker that sent it.
//!
//! ```
//! use embodyflow_gym::protocol::{FrameBuffer, MAX_FRAME, encode_frame};
//! let bytes = encode_frame(&serde_json::json!({"op": "close"}), b"");
//! let mut buffer = FrameBuffer::new(MAX_FRAME);
//! buffer.push(&bytes[..5]); // a read may return part of a frame
//! assert!(buffer.next_frame().unwrap().is_none());
//! buffer.push(&bytes[5..]);
//! let frame = buffer.next_frame().unwrap().unwrap();
//! assert_eq!(frame.header["op"], "close");
//! ```

use serde_json::{Map, Value};

/// The largest payload a frame may announce (1 GiB, the Python side's
/// limit too): a length beyond it is malformed, not an allocation.
pub const MAX_FRAME: usize = 1 << 30;

/// One frame: its JSON header and its binary body.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    /// The header object.
    pub header: Map<String, Value>,
    /// The body bytes.
    pub body: Vec<u8>,
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The stream ended cleanly before a frame (the worker exited).
    #[error("the stream ended")]
    Eof,
    /// The stream ended inside a frame.
    #[error("the stream ended inside a frame ({found} of {expected} bytes)")]
    Truncated {
        /// Bytes expected.
        expected: usize,
        /// Bytes read.
        found: usize,
    },
    /// Reading failed.
    #[error("reading the pipe: {0}")]
    Io(#[from] std::io::Error),
    /// A payload length beyond the limit, or shorter than its own header
    /// length field.
    #[error("frame announces {length} bytes, expected 4..={limit}")]
    BadLength {
        /// The announced length.
        length: u64,
        /// The limit.
        limit: usize,
    },
    /// A header length beyond the frame.
    #[error("frame of {length} bytes announces a header of {header} bytes")]
    BadHeaderLength {
        /// The payload length.
        length: usize,
        /// The announced header length.
        header: u64,
    },
    /// A header that is not a UTF-8 JSON object.
    #[error("header is not a JSON object: {0}")]
    BadHeader(String),
}

impl FrameError {
    /// Whether the stream simply ended (a worker that exited) rather than
    /// carried a bad frame.
    pub fn is_end(&self) -> bool {
        matches!(self, FrameError::Eof)
    }
}

/// The bytes of one frame.
pub fn encode_frame(header: &Value, body: &[u8]) -> Vec<u8> {
    let head = serde_json::to_vec(header).expect("a JSON value serializes");
    let mut out = Vec::with_capacity(8 + head.len() + body.len());
    out.extend_from_slice(&((4 + head.len() + body.len()) as u32).to_le_bytes());
    out.extend_from_slice(&(head.len() as u32).to_le_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(body);
    out
}

/// Frames cut from the bytes of a stream as they arrive: [`FrameBuffer::push`]
/// what a read returned, take every complete frame with
/// [`FrameBuffer::next_frame`], and call [`FrameBuffer::end`] when the
/// stream ends. A length beyond the limit is malformed as soon as its four
/// bytes are in, before anything is allocated for it.
#[derive(Debug)]
pub struct FrameBuffer {
    bytes: Vec<u8>,
    limit: usize,
}

impl FrameBuffer {
    /// A buffer for frames of at most `limit` payload bytes.
    pub fn new(limit: usize) -> FrameBuffer {
        FrameBuffer {
            bytes: Vec::new(),
            limit,
        }
    }

    /// Appends bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    /// The next complete frame, `None` until all its bytes are in.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let Some(word) = self.bytes.first_chunk::<4>() else {
            return Ok(None);
        };
        let length = u32::from_le_bytes(*word) as usize;
        if !(4..=self.limit).contains(&length) {
            return Err(FrameError::BadLength {
                length: length as u64,
                limit: self.limit,
            });
        }
        if self.bytes.len() < 4 + length {
            return Ok(None);
        }
        let payload: Vec<u8> = self.bytes.drain(..4 + length).skip(4).collect();
        decode_payload(payload).map(Some)
    }

    /// Whether a whole frame is in.
    pub fn has_frame(&self) -> bool {
        self.bytes
            .first_chunk::<4>()
            .is_some_and(|word| self.bytes.len() >= 4 + u32::from_le_bytes(*word) as usize)
    }

    /// The stream has ended: [`FrameError::Eof`] between frames,
    /// [`FrameError::Truncated`] inside one.
    pub fn end(&self) -> FrameError {
        match self.bytes.first_chunk::<4>() {
            None if self.bytes.is_empty() => FrameError::Eof,
            None => FrameError::Truncated {
                expected: 4,
                found: self.bytes.len(),
            },
            Some(word) => FrameError::Truncated {
                expected: u32::from_le_bytes(*word) as usize,
                found: self.bytes.len() - 4,
            },
        }
    }
}

/// A payload's header and body.
fn decode_payload(mut payload: Vec<u8>) -> Result<Frame, FrameError> {
    let length = payload.len();
    let header_len = u32::from_le_bytes(payload[..4].try_into().expect("4 bytes")) as usize;
    if header_len > length - 4 {
        return Err(FrameError::BadHeaderLength {
            length,
            header: header_len as u64,
        });
    }
    let header = match serde_json::from_slice::<Value>(&payload[4..4 + header_len]) {
        Ok(Value::Object(map)) => map,
        Ok(other) => return Err(FrameError::BadHeader(format!("found {other}"))),
        Err(e) => return Err(FrameError::BadHeader(e.to_string())),
    };
    payload.drain(..4 + header_len);
    Ok(Frame {
        header,
        body: payload,
    })
}

/// Splits a reply's body into the observations the header's `lengths`
/// announce; `None` when they do not add up to the body.
pub fn split_body<'a>(body: &'a [u8], lengths: &[usize]) -> Option<Vec<&'a [u8]>> {
    let mut out = Vec::with_capacity(lengths.len());
    let mut at = 0usize;
    for &len in lengths {
        let end = at.checked_add(len)?;
        out.push(body.get(at..end)?);
        at = end;
    }
    (at == body.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The first frame of a stream made of `bytes`, or the error at its end.
    fn read_frame(bytes: &mut &[u8], limit: usize) -> Result<Frame, FrameError> {
        let mut buffer = FrameBuffer::new(limit);
        buffer.push(bytes);
        let frame = buffer.next_frame()?.ok_or_else(|| buffer.end());
        *bytes = &bytes[bytes.len()..];
        frame
    }

    #[test]
    fn a_frame_round_trips_with_its_body() {
        let bytes = encode_frame(&json!({"op": "reset", "n": 2}), &[1, 2, 3]);
        // 4 + header `{"n":2,"op":"reset"}` (20 bytes) + 3 body bytes = 27.
        assert_eq!(&bytes[..4], &27u32.to_le_bytes());
        assert_eq!(&bytes[4..8], &20u32.to_le_bytes());
        let mut reader = &bytes[..];
        let frame = read_frame(&mut reader, MAX_FRAME).unwrap();
        assert_eq!(frame.header["op"], "reset");
        assert_eq!(frame.body, [1, 2, 3]);
        assert!(read_frame(&mut reader, MAX_FRAME).unwrap_err().is_end());
    }

    #[test]
    fn frames_come_out_whole_whatever_pieces_the_reads_return() {
        let mut bytes = encode_frame(&json!({"ok": true}), &[7; 3]);
        bytes.extend(encode_frame(&json!({"progress": true}), b""));
        let mut buffer = FrameBuffer::new(MAX_FRAME);
        let mut frames = Vec::new();
        for byte in &bytes {
            buffer.push(&[*byte]);
            while let Some(frame) = buffer.next_frame().unwrap() {
                frames.push(frame);
            }
        }
        assert_eq!(frames.len(), 2);
        assert_eq!(
            (&frames[0].header["ok"], &frames[0].body[..]),
            (&json!(true), &[7u8; 3][..])
        );
        assert_eq!(frames[1].header["progress"], true);
        assert!(buffer.end().is_end(), "the stream ended between frames");
        buffer.push(&bytes[..6]);
        assert!(matches!(
            buffer.end(),
            FrameError::Truncated { found: 2, .. }
        ));
    }

    #[test]
    fn lengths_beyond_the_limit_are_malformed_before_any_allocation() {
        let mut bytes = u32::MAX.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0; 8]);
        assert!(matches!(
            read_frame(&mut &bytes[..], MAX_FRAME),
            Err(FrameError::BadLength {
                length: 4_294_967_295,
                ..
            })
        ));
        let frame = encode_frame(&json!({}), &[0; 100]);
        assert!(matches!(
            read_frame(&mut &frame[..], 50),
            Err(FrameError::BadLength {
                length: 106,
                limit: 50
            })
        ));
        // A payload too short for its own header length field.
        assert!(matches!(
            read_frame(&mut &[2u8, 0, 0, 0, 0, 0][..], MAX_FRAME),
            Err(FrameError::BadLength { length: 2, .. })
        ));
    }

    #[test]
    fn bad_headers_and_truncation_are_named() {
        let mut bad_json = 13u32.to_le_bytes().to_vec();
        bad_json.extend_from_slice(&9u32.to_le_bytes());
        bad_json.extend_from_slice(b"{not json");
        assert!(matches!(
            read_frame(&mut &bad_json[..], MAX_FRAME),
            Err(FrameError::BadHeader(_))
        ));
        let mut array = 6u32.to_le_bytes().to_vec();
        array.extend_from_slice(&2u32.to_le_bytes());
        array.extend_from_slice(b"[]");
        let error = read_frame(&mut &array[..], MAX_FRAME).unwrap_err();
        assert_eq!(error.to_string(), "header is not a JSON object: found []");
        let mut long_header = 6u32.to_le_bytes().to_vec();
        long_header.extend_from_slice(&3u32.to_le_bytes());
        long_header.extend_from_slice(b"{}");
        assert!(matches!(
            read_frame(&mut &long_header[..], MAX_FRAME),
            Err(FrameError::BadHeaderLength {
                length: 6,
                header: 3
            })
        ));
        let whole = encode_frame(&json!({"ok": true}), &[9; 10]);
        assert!(matches!(
            read_frame(&mut &whole[..whole.len() - 1], MAX_FRAME),
            Err(FrameError::Truncated {
                found: 24,
                expected: 25
            })
        ));
        assert!(matches!(
            read_frame(&mut &whole[..2], MAX_FRAME),
            Err(FrameError::Truncated {
                found: 2,
                expected: 4
            })
        ));
    }

    #[test]
    fn bodies_split_only_when_the_lengths_add_up() {
        let body = [1u8, 2, 3, 4, 5];
        assert_eq!(
            split_body(&body, &[2, 3]).unwrap(),
            vec![&[1u8, 2][..], &[3, 4, 5][..]]
        );
        assert!(split_body(&body, &[2, 2]).is_none());
        assert!(split_body(&body, &[2, 4]).is_none());
        assert!(split_body(&body, &[usize::MAX, 1]).is_none());
    }
}

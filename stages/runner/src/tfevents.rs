//! TensorBoard event files, written directly: the TFRecord framing and the
//! three protobuf messages a scalar needs, about 100 lines with no crate.
//!
//! The maintained Rust writers either pull in a protobuf toolchain (prost
//! with its build step, for the whole `tensorflow/core/util/event.proto`
//! tree) or are unmaintained (`tensorboard-rs`, last released 2020); a
//! scalar event is five protobuf fields, so this module writes them itself.
//!
//! A file is a sequence of records (TensorFlow's
//! `tensorflow/core/lib/io/record_writer.cc`):
//!
//! ```text
//! u64 length (little endian) | u32 masked_crc32c(length bytes) | data | u32 masked_crc32c(data)
//! masked_crc32c(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8   (wrapping, u32)
//! ```
//!
//! CRC-32C is the Castagnoli polynomial (reflected 0x82F63B78, initial and
//! final value !0). Each record's data is an `Event` (`event.proto`):
//! `wall_time` (field 1, double), `step` (2, int64), `file_version` (3,
//! string, the first event: `brain.Event:2`) or `summary` (5): a `Summary`
//! (`summary.proto`) of `value` (1) messages, each with `tag` (1, string)
//! and `simple_value` (2, float). TensorBoard reads such scalars under the
//! scalars dashboard; `tensorboard --logdir DIR` finds every file named
//! `events.out.tfevents.*` under DIR, one run per directory.
//!
//! ```
//! use embodyflow_runner::tfevents::{EventWriter, Scalar};
//! let mut bytes = Vec::new();
//! let mut writer = EventWriter::new(&mut bytes, 1.7e9).unwrap();
//! writer.scalar(&Scalar { tag: "update/loss", step: 3, value: 0.5, wall_time: 1.7e9 }).unwrap();
//! assert_eq!(embodyflow_runner::tfevents::records(&bytes).unwrap().len(), 2);
//! ```

use std::io::Write;

/// The CRC-32C (Castagnoli) of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut crc = i as u32;
            let mut bit = 0;
            while bit < 8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0x82F6_3B78
                } else {
                    crc >> 1
                };
                bit += 1;
            }
            table[i] = crc;
            i += 1;
        }
        table
    };
    !data.iter().fold(!0u32, |crc, &byte| {
        TABLE[((crc ^ u32::from(byte)) & 0xff) as usize] ^ (crc >> 8)
    })
}

/// The masked CRC-32C a TFRecord stores.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    ((crc >> 15) | (crc << 17)).wrapping_add(0xa282_ead8)
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A length-delimited field (wire type 2).
fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// An `Event` with its wall time, step and one more field already encoded.
fn event(wall_time: f64, step: i64, rest: &[u8]) -> Vec<u8> {
    let mut out = vec![1 << 3 | 1];
    out.extend_from_slice(&wall_time.to_le_bytes());
    varint(&mut out, 2 << 3);
    varint(&mut out, step as u64);
    out.extend_from_slice(rest);
    out
}

/// One scalar: a tag (`step/name`), the global step, its value and the
/// Unix time it was measured.
#[derive(Debug, Clone, Copy)]
pub struct Scalar<'a> {
    /// TensorBoard's tag.
    pub tag: &'a str,
    /// The x of TensorBoard's step axis.
    pub step: i64,
    /// The value (stored as f32, as `simple_value` is).
    pub value: f64,
    /// Seconds since the Unix epoch.
    pub wall_time: f64,
}

/// Writes records of events to `out`.
pub struct EventWriter<W: Write> {
    out: W,
}

impl<W: Write> EventWriter<W> {
    /// Starts a file: the `file_version` event, at `wall_time`.
    pub fn new(out: W, wall_time: f64) -> std::io::Result<EventWriter<W>> {
        let mut writer = EventWriter { out };
        let mut version = Vec::new();
        bytes_field(&mut version, 3, b"brain.Event:2");
        writer.record(&event(wall_time, 0, &version))?;
        Ok(writer)
    }

    /// Continues a file that has its `file_version` event: only the
    /// events written next.
    pub fn append(out: W) -> EventWriter<W> {
        EventWriter { out }
    }

    /// Writes one scalar event.
    pub fn scalar(&mut self, scalar: &Scalar<'_>) -> std::io::Result<()> {
        let mut value = Vec::new();
        bytes_field(&mut value, 1, scalar.tag.as_bytes());
        varint(&mut value, 2 << 3 | 5);
        value.extend_from_slice(&(scalar.value as f32).to_le_bytes());
        let mut summary = Vec::new();
        bytes_field(&mut summary, 1, &value);
        let mut rest = Vec::new();
        bytes_field(&mut rest, 5, &summary);
        self.record(&event(scalar.wall_time, scalar.step, &rest))
    }

    fn record(&mut self, data: &[u8]) -> std::io::Result<()> {
        let length = (data.len() as u64).to_le_bytes();
        self.out.write_all(&length)?;
        self.out.write_all(&masked_crc32c(&length).to_le_bytes())?;
        self.out.write_all(data)?;
        self.out.write_all(&masked_crc32c(data).to_le_bytes())
    }

    /// The writer it wrote to.
    pub fn into_inner(self) -> W {
        self.out
    }
}

/// The records' data of an event file, each checked against both CRCs;
/// `None` when the framing or a CRC is wrong.
pub fn records(bytes: &[u8]) -> Option<Vec<&[u8]>> {
    let mut found = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let (length, after) = rest.split_at_checked(8)?;
        let (crc, after) = after.split_at_checked(4)?;
        if masked_crc32c(length).to_le_bytes() != crc {
            return None;
        }
        let n = usize::try_from(u64::from_le_bytes(length.try_into().ok()?)).ok()?;
        let (data, after) = after.split_at_checked(n)?;
        let (crc, after) = after.split_at_checked(4)?;
        if masked_crc32c(data).to_le_bytes() != crc {
            return None;
        }
        found.push(data);
        rest = after;
    }
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        // The CRC catalogue's check value of CRC-32/ISCSI (CRC-32C).
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn a_scalar_event_is_framed_and_encoded_as_tensorflow_writes_it() {
        let mut writer = EventWriter::new(Vec::new(), 2.0).unwrap();
        writer
            .scalar(&Scalar {
                tag: "a/b",
                step: 300,
                value: 0.5,
                wall_time: 2.0,
            })
            .unwrap();
        let bytes = writer.into_inner();
        let records = records(&bytes).unwrap();
        assert_eq!(records.len(), 2);
        let mut expected = vec![0x09];
        expected.extend_from_slice(&2.0f64.to_le_bytes());
        // step 300 = varint ac 02; summary (field 5) holding value (field 1)
        // holding tag "a/b" and simple_value 0.5f32.
        expected.extend_from_slice(&[0x10, 0xac, 0x02, 0x2a, 0x0c, 0x0a, 0x0a, 0x0a, 0x03]);
        expected.extend_from_slice(b"a/b");
        expected.push(0x15);
        expected.extend_from_slice(&0.5f32.to_le_bytes());
        assert_eq!(records[1], expected.as_slice());
        assert!(records[0].ends_with(b"brain.Event:2"));
        // A flipped byte fails its CRC.
        let mut broken = bytes.clone();
        let last = broken.len() - 6;
        broken[last] ^= 1;
        assert!(super::records(&broken).is_none());
    }
}

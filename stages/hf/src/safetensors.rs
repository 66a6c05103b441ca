//! The weights of a Hugging Face checkpoint: `model.safetensors`, or shards
//! listed by `model.safetensors.index.json` (`weight_map`: tensor name →
//! shard file), read and written in the safetensors format:
//!
//! ```text
//! u64 little-endian N | N bytes of JSON header | data
//! header = {"__metadata__": {...}, name: {"dtype": "F32", "shape": [r, c], "data_offsets": [b, e]}, ...}
//! ```
//!
//! with each tensor's bytes at `data[b..e]`, row-major, little-endian. The
//! header is parsed here (not by the `safetensors` crate, whose dtype enum
//! rejects a whole file over one tensor of an unknown dtype such as
//! `F8_E4M3`) so that every fault names its file and tensor: a shard in the
//! index but not on disk, a tensor absent or of another shape, a dtype other
//! than F32 and BF16. As transformers does, `model.safetensors` is used when
//! present, else the index.
//!
//! ```no_run
//! use embodyflow_hf::safetensors::Weights;
//! let weights = Weights::open("Qwen3-0.6B".as_ref()).unwrap();
//! let embed = weights.load("model.embed_tokens.weight", &[151936, 1024]).unwrap();
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};
use tch::{Kind, Tensor};

use crate::HfError;

/// The single-file weights name.
pub const SINGLE: &str = "model.safetensors";
/// The shard index name.
pub const INDEX: &str = "model.safetensors.index.json";

/// One tensor's place in a file.
#[derive(Debug)]
struct Entry {
    dtype: String,
    shape: Vec<i64>,
    begin: usize,
    end: usize,
}

/// A parsed safetensors file, its bytes in memory.
#[derive(Debug)]
struct File {
    path: PathBuf,
    bytes: Vec<u8>,
    data_start: usize,
    entries: BTreeMap<String, Entry>,
}

/// Bytes per element of the dtypes the format defines (for checking
/// offsets); `None` for names the format does not define.
fn dtype_size(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
        "I16" | "U16" | "F16" | "BF16" => 2,
        "I32" | "U32" | "F32" => 4,
        "I64" | "U64" | "F64" => 8,
        _ => return None,
    })
}

impl File {
    fn open(path: &Path) -> Result<File, HfError> {
        let bytes = std::fs::read(path).map_err(|source| HfError::Read {
            file: path.to_path_buf(),
            source,
        })?;
        let bad = |reason: String| HfError::BadWeights {
            file: path.to_path_buf(),
            reason,
        };
        let n = bytes
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as usize)
            .ok_or_else(|| bad("shorter than the 8-byte header length".into()))?;
        let data_start = 8usize
            .checked_add(n)
            .filter(|&end| end <= bytes.len())
            .ok_or_else(|| bad(format!("header length {n} runs past the end of the file")))?;
        let header: Map<String, Value> = serde_json::from_slice(&bytes[8..data_start])
            .map_err(|e| bad(format!("header: {e}")))?;
        let data_len = bytes.len() - data_start;
        let mut entries = BTreeMap::new();
        for (name, info) in header {
            if name == "__metadata__" {
                continue;
            }
            let field = |key: &str| {
                info.get(key)
                    .ok_or_else(|| bad(format!("tensor `{name}` has no `{key}`")))
            };
            let dtype = field("dtype")?
                .as_str()
                .ok_or_else(|| bad(format!("tensor `{name}`: `dtype` is not a string")))?
                .to_string();
            let numbers = |key: &str| -> Result<Vec<u64>, HfError> {
                field(key)?
                    .as_array()
                    .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
                    .ok_or_else(|| {
                        bad(format!(
                            "tensor `{name}`: `{key}` is not a list of integers"
                        ))
                    })
            };
            let shape = numbers("shape")?;
            let offsets = numbers("data_offsets")?;
            let [begin, end] = offsets[..] else {
                return Err(bad(format!(
                    "tensor `{name}`: `data_offsets` has {} numbers, expected 2",
                    offsets.len()
                )));
            };
            let (begin, end) = (begin as usize, end as usize);
            if begin > end || end > data_len {
                return Err(bad(format!(
                    "tensor `{name}`: data_offsets [{begin}, {end}] outside the {data_len} data bytes"
                )));
            }
            let numel: u64 = shape.iter().product();
            if let Some(size) = dtype_size(&dtype)
                && numel as usize * size != end - begin
            {
                return Err(bad(format!(
                    "tensor `{name}`: {dtype} {shape:?} needs {} bytes, data_offsets give {}",
                    numel as usize * size,
                    end - begin
                )));
            }
            let shape = shape.iter().map(|&d| d as i64).collect();
            entries.insert(
                name,
                Entry {
                    dtype,
                    shape,
                    begin,
                    end,
                },
            );
        }
        Ok(File {
            path: path.to_path_buf(),
            bytes,
            data_start,
            entries,
        })
    }
}

/// The weights of a checkpoint directory: every tensor name with the file
/// that holds it.
#[derive(Debug)]
pub struct Weights {
    files: Vec<File>,
    /// Tensor name → index into `files`.
    by_name: BTreeMap<String, usize>,
    /// What to name when a tensor is absent: the single file or the index.
    source: PathBuf,
}

impl Weights {
    /// Opens `dir/model.safetensors`, or else every shard that
    /// `dir/model.safetensors.index.json` names.
    pub fn open(dir: &Path) -> Result<Weights, HfError> {
        let single = dir.join(SINGLE);
        if single.is_file() {
            let file = File::open(&single)?;
            let by_name = file.entries.keys().map(|n| (n.clone(), 0)).collect();
            return Ok(Weights {
                files: vec![file],
                by_name,
                source: single,
            });
        }
        let index = dir.join(INDEX);
        if !index.is_file() {
            return Err(HfError::NoWeights {
                dir: dir.to_path_buf(),
            });
        }
        let text = std::fs::read_to_string(&index).map_err(|source| HfError::Read {
            file: index.clone(),
            source,
        })?;
        let bad = |reason: String| HfError::BadWeights {
            file: index.clone(),
            reason,
        };
        let parsed: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let map = parsed
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("no `weight_map` object".into()))?;
        let mut shards: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, shard) in map {
            let shard = shard
                .as_str()
                .ok_or_else(|| bad(format!("`weight_map.{name}` is not a file name")))?;
            shards
                .entry(shard.to_string())
                .or_default()
                .push(name.clone());
        }
        // Every shard must exist before any is read: a missing one is named
        // with the index that lists it.
        for shard in shards.keys() {
            if !dir.join(shard).is_file() {
                return Err(HfError::MissingShard {
                    index: index.clone(),
                    shard: shard.clone(),
                });
            }
        }
        let mut files = Vec::new();
        let mut by_name = BTreeMap::new();
        for (shard, names) in shards {
            let file = File::open(&dir.join(&shard))?;
            for name in names {
                if !file.entries.contains_key(&name) {
                    return Err(HfError::MissingTensor {
                        name,
                        file: file.path.clone(),
                    });
                }
                by_name.insert(name, files.len());
            }
            files.push(file);
        }
        Ok(Weights {
            files,
            by_name,
            source: index,
        })
    }

    /// The file holding `name` and its entry there.
    fn entry(&self, name: &str) -> Result<(&File, &Entry), HfError> {
        let file = self
            .by_name
            .get(name)
            .map(|&i| &self.files[i])
            .ok_or_else(|| HfError::MissingTensor {
                name: name.to_string(),
                file: self.source.clone(),
            })?;
        Ok((file, &file.entries[name]))
    }

    /// The kind tensor `name` is stored in: `Float` (F32) or `BFloat16`
    /// (BF16); any other dtype is an error naming the tensor and its file.
    pub fn kind(&self, name: &str) -> Result<Kind, HfError> {
        let (file, entry) = self.entry(name)?;
        match entry.dtype.as_str() {
            "F32" => Ok(Kind::Float),
            "BF16" => Ok(Kind::BFloat16),
            other => Err(HfError::UnsupportedDtype {
                name: name.to_string(),
                file: file.path.clone(),
                dtype: other.to_string(),
            }),
        }
    }

    /// The tensor `name` in its stored kind (see [`Weights::kind`]),
    /// checked to have `shape`.
    pub fn load(&self, name: &str, shape: &[i64]) -> Result<Tensor, HfError> {
        let (file, entry) = self.entry(name)?;
        if entry.shape != shape {
            return Err(HfError::WrongShape {
                name: name.to_string(),
                file: file.path.clone(),
                expected: shape.to_vec(),
                found: entry.shape.clone(),
            });
        }
        let kind = self.kind(name)?;
        let data = &file.bytes[file.data_start + entry.begin..file.data_start + entry.end];
        Tensor::f_from_data_size(data, shape, kind).map_err(|e| HfError::Torch(e.to_string()))
    }
}

/// Writes `tensors` as one safetensors file with transformers' metadata
/// (`{"format": "pt"}`), into `path.tmp` then renamed over `path`.
pub fn write(path: &Path, tensors: &[(String, Tensor)]) -> Result<(), HfError> {
    let fail = |source: std::io::Error| HfError::Write {
        file: path.to_path_buf(),
        source,
    };
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut data = Vec::new();
    for (name, tensor) in tensors {
        let dtype = match tensor.kind() {
            Kind::Float => "F32",
            Kind::BFloat16 => "BF16",
            other => {
                return Err(HfError::Torch(format!(
                    "cannot save `{name}` of kind {other:?}"
                )));
            }
        };
        let tensor = tensor.to_device(tch::Device::Cpu).contiguous();
        let numel = tensor.numel();
        let begin = data.len();
        data.resize(begin + numel * tensor.kind().elt_size_in_bytes(), 0);
        tensor
            .f_copy_data_u8(&mut data[begin..], numel)
            .map_err(|e| HfError::Torch(e.to_string()))?;
        header.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": tensor.size(), "data_offsets": [begin, data.len()]}),
        );
    }
    let mut head = serde_json::to_vec(&Value::Object(header)).map_err(|e| fail(e.into()))?;
    // The data starts 8-byte aligned, as the reference writer pads it.
    head.resize(head.len().div_ceil(8) * 8, b' ');
    let tmp = path.with_extension("safetensors.tmp");
    let mut bytes = Vec::with_capacity(8 + head.len() + data.len());
    bytes.extend_from_slice(&(head.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&head);
    bytes.extend_from_slice(&data);
    std::fs::write(&tmp, &bytes).map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_f32_and_bf16_with_exact_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let a = Tensor::from_slice(&[1.5f32, -2.0, 3.25, 0.0, 7.0, -0.5]).view([2, 3]);
        let b = Tensor::from_slice(&[0.75f32, 1.0]).to_kind(Kind::BFloat16);
        write(
            &dir.path().join(SINGLE),
            &[
                ("a".into(), a.shallow_clone()),
                ("b".into(), b.shallow_clone()),
            ],
        )
        .unwrap();
        let bytes = std::fs::read(dir.path().join(SINGLE)).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert_eq!(n % 8, 0);
        // 6 f32 + 2 bf16 = 28 data bytes after the header.
        assert_eq!(bytes.len(), 8 + n + 28);
        let w = Weights::open(dir.path()).unwrap();
        assert!(w.load("a", &[2, 3]).unwrap().equal(&a));
        let back = w.load("b", &[2]).unwrap();
        assert_eq!(back.kind(), Kind::BFloat16);
        assert!(back.equal(&b));
        let err = w.load("a", &[3, 2]).unwrap_err().to_string();
        assert!(
            err.contains("`a`") && err.contains("[3, 2]") && err.contains("[2, 3]"),
            "{err}"
        );
        let err = w.load("c", &[1]).unwrap_err().to_string();
        assert!(err.contains("`c`") && err.contains(SINGLE), "{err}");
    }

    #[test]
    fn offsets_that_disagree_with_the_shape_name_the_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let head = br#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
        let mut bytes = (head.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(head);
        bytes.extend_from_slice(&[0; 8]);
        std::fs::write(dir.path().join(SINGLE), bytes).unwrap();
        let err = Weights::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("`w`") && err.contains("12 bytes"), "{err}");
    }
}

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
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};
use tch::{Kind, Tensor, nn};

use crate::HfError;

/// The single-file weights name.
pub const SINGLE: &str = "model.safetensors";
/// The shard index name.
pub const INDEX: &str = "model.safetensors.index.json";

/// A tensor that a config implies: its name, its shape and the config keys
/// the shape (or the tensor's existence) follows from, which an error names.
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    /// The parameter name.
    pub name: String,
    /// The shape the config implies.
    pub shape: Vec<i64>,
    /// The config keys it follows from, e.g. `vocab_size, hidden_size`.
    pub keys: &'static str,
}

impl Expected {
    /// `name` of `shape`, following from `keys`.
    pub fn new(name: impl Into<String>, shape: &[i64], keys: &'static str) -> Expected {
        Expected {
            name: name.into(),
            shape: shape.to_vec(),
            keys,
        }
    }
}

/// One tensor's place in a file.
#[derive(Debug)]
struct Entry {
    dtype: String,
    shape: Vec<i64>,
    begin: u64,
    end: u64,
}

/// A safetensors file's header, parsed without reading its data: tensors
/// are read one by one when loaded.
#[derive(Debug)]
struct File {
    path: PathBuf,
    handle: std::fs::File,
    data_start: u64,
    entries: BTreeMap<String, Entry>,
}

/// Bytes per element of the dtypes the format defines (for checking
/// offsets); `None` for names the format does not define.
fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
        "I16" | "U16" | "F16" | "BF16" => 2,
        "I32" | "U32" | "F32" => 4,
        "I64" | "U64" | "F64" => 8,
        _ => return None,
    })
}

/// Whether `path` is a regular file (symbolic links followed, as a Hugging
/// Face cache links its blobs): `Ok(false)` when absent; a FIFO, a directory
/// or a device there is an error naming it, found before anything opens it
/// (opening a FIFO blocks until a writer comes).
pub fn regular_file(path: &Path) -> Result<bool, HfError> {
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(HfError::Read {
                file: path.to_path_buf(),
                source,
            });
        }
    };
    let file_type = metadata.file_type();
    if file_type.is_file() {
        return Ok(true);
    }
    use std::os::unix::fs::FileTypeExt;
    let what = if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_block_device() || file_type.is_char_device() {
        "a device"
    } else {
        "not a file"
    };
    Err(HfError::NotAFile {
        file: path.to_path_buf(),
        what,
    })
}

impl File {
    /// Parses the header of the safetensors file `path`, checking every
    /// tensor's offsets against its shape and the file's length.
    fn open(path: &Path) -> Result<File, HfError> {
        let read_error = |source| HfError::Read {
            file: path.to_path_buf(),
            source,
        };
        let bad = |reason: String| HfError::BadWeights {
            file: path.to_path_buf(),
            reason,
        };
        if !regular_file(path)? {
            return Err(read_error(std::io::ErrorKind::NotFound.into()));
        }
        let mut file = std::fs::File::open(path).map_err(read_error)?;
        let len = file.metadata().map_err(read_error)?.len();
        let mut prefix = [0u8; 8];
        if len < 8 {
            return Err(bad("shorter than the 8-byte header length".into()));
        }
        file.read_exact(&mut prefix).map_err(read_error)?;
        let n = u64::from_le_bytes(prefix);
        let data_start = 8u64
            .checked_add(n)
            .filter(|&end| end <= len)
            .ok_or_else(|| bad(format!("header length {n} runs past the end of the file")))?;
        let mut header = vec![0u8; n as usize];
        file.read_exact(&mut header).map_err(read_error)?;
        let header: Map<String, Value> =
            serde_json::from_slice(&header).map_err(|e| bad(format!("header: {e}")))?;
        let data_len = len - data_start;
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
            if begin > end || end > data_len {
                return Err(bad(format!(
                    "tensor `{name}`: data_offsets [{begin}, {end}] outside the {data_len} data bytes"
                )));
            }
            // The element count of a forged shape may overflow: it then
            // cannot fit the data either.
            let numel = shape
                .iter()
                .try_fold(1u64, |n, &d| n.checked_mul(d))
                .filter(|&n| i64::try_from(n).is_ok());
            let Some(numel) = numel else {
                return Err(bad(format!(
                    "tensor `{name}`: shape {shape:?} has more elements than any file holds"
                )));
            };
            if let Some(size) = dtype_size(&dtype)
                && numel.checked_mul(size) != Some(end - begin)
            {
                return Err(bad(format!(
                    "tensor `{name}`: {dtype} {shape:?} needs {} bytes, data_offsets give {}",
                    numel.saturating_mul(size),
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
            handle: file,
            data_start,
            entries,
        })
    }

    /// The bytes of `entry`, read from the file.
    fn read(&self, entry: &Entry) -> Result<Vec<u8>, HfError> {
        let read_error = |source| HfError::Read {
            file: self.path.clone(),
            source,
        };
        let mut data = vec![0u8; (entry.end - entry.begin) as usize];
        self.handle
            .read_exact_at(&mut data, self.data_start + entry.begin)
            .map_err(read_error)?;
        Ok(data)
    }
}

/// The weights of a checkpoint directory: every tensor name with the file
/// that holds it. Opening parses the headers only; [`Weights::check`]
/// compares them with what a config implies before any parameter is
/// allocated, and [`Weights::fill`] reads the tensors.
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
        if regular_file(&single)? {
            return Weights::open_file(&single);
        }
        let index = dir.join(INDEX);
        if !regular_file(&index)? {
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
            if !regular_file(&dir.join(shard))? {
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
                    return Err(bad(format!(
                        "`weight_map` puts tensor `{name}` in {shard}, which lacks it"
                    )));
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

    /// Opens the one safetensors file `path`.
    pub fn open_file(path: &Path) -> Result<Weights, HfError> {
        let file = File::open(path)?;
        let by_name = file.entries.keys().map(|n| (n.clone(), 0)).collect();
        Ok(Weights {
            files: vec![file],
            by_name,
            source: path.to_path_buf(),
        })
    }

    /// The single file, or the index of the shards.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Every tensor name the files hold.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// The file holding `name` and its entry there.
    fn entry(&self, expected: &Expected) -> Result<(&File, &Entry), HfError> {
        let name = &expected.name;
        let file = self
            .by_name
            .get(name)
            .map(|&i| &self.files[i])
            .ok_or_else(|| HfError::MissingTensor {
                name: name.to_string(),
                file: self.source.clone(),
                keys: expected.keys,
            })?;
        let entry = &file.entries[name];
        if entry.shape != expected.shape {
            return Err(HfError::WrongShape {
                name: name.to_string(),
                file: file.path.clone(),
                expected: expected.shape.clone(),
                found: entry.shape.clone(),
                keys: expected.keys,
            });
        }
        Ok((file, entry))
    }

    /// The kind tensor `name` is stored in: `Float` (F32) or `BFloat16`
    /// (BF16); any other dtype, or a tensor absent, is an error naming the
    /// tensor and its file.
    pub fn kind(&self, name: &str) -> Result<Kind, HfError> {
        let file = self
            .by_name
            .get(name)
            .map(|&i| &self.files[i])
            .ok_or_else(|| HfError::MissingTensor {
                name: name.to_string(),
                file: self.source.clone(),
                keys: "model_type",
            })?;
        kind_of(file, name, &file.entries[name])
    }

    /// Checks that every tensor of `expected` is stored with its shape and
    /// a dtype we load, reading nothing but the headers: a config that
    /// implies a vocabulary of 2^40 rows or 10^9 layers is an error naming
    /// the tensor, the file and the config keys before anything is
    /// allocated. The first mismatch ends the walk, so an absurd layer
    /// count costs no more than the tensors the files hold.
    pub fn check(&self, expected: impl IntoIterator<Item = Expected>) -> Result<(), HfError> {
        for expected in expected {
            let (file, entry) = self.entry(&expected)?;
            kind_of(file, &expected.name, entry)?;
        }
        Ok(())
    }

    /// The tensor `expected` names, in its stored kind, checked to have the
    /// expected shape.
    pub fn load(&self, expected: &Expected) -> Result<Tensor, HfError> {
        let (file, entry) = self.entry(expected)?;
        let kind = kind_of(file, &expected.name, entry)?;
        let data = file.read(entry)?;
        Tensor::f_from_data_size(&data, &expected.shape, kind)
            .map_err(|e| HfError::Torch(e.to_string()))
    }

    /// Copies every tensor of `expected` into the variable of its name in
    /// `vs` (cast to the variable's kind); a variable `expected` names that
    /// `vs` lacks, or one it leaves unloaded, is a bug of ours (the two
    /// describe one network).
    pub fn fill(
        &self,
        vs: &nn::VarStore,
        expected: impl IntoIterator<Item = Expected>,
    ) -> Result<(), HfError> {
        let mut variables = vs.variables();
        tch::no_grad(|| {
            for expected in expected {
                let value = self.load(&expected)?;
                let mut variable = variables.remove(&expected.name).ok_or_else(|| {
                    HfError::Torch(format!("no parameter `{}` to load into", expected.name))
                })?;
                variable
                    .f_copy_(&value)
                    .map_err(|e| HfError::Torch(format!("{}: {e}", expected.name)))?;
            }
            match variables.keys().next() {
                Some(name) => Err(HfError::Torch(format!(
                    "parameter `{name}` is not among the tensors to load"
                ))),
                None => Ok(()),
            }
        })
    }
}

/// The kind of a stored tensor we load (F32 or BF16).
fn kind_of(file: &File, name: &str, entry: &Entry) -> Result<Kind, HfError> {
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
        let expect = |name: &str, shape: &[i64]| Expected::new(name, shape, "n");
        assert!(w.load(&expect("a", &[2, 3])).unwrap().equal(&a));
        let back = w.load(&expect("b", &[2])).unwrap();
        assert_eq!(back.kind(), Kind::BFloat16);
        assert!(back.equal(&b));
        let err = w.load(&expect("a", &[3, 2])).unwrap_err().to_string();
        assert!(
            err.contains("`a`") && err.contains("[3, 2]") && err.contains("[2, 3]"),
            "{err}"
        );
        let err = w.load(&expect("c", &[1])).unwrap_err().to_string();
        assert!(err.contains("`c`") && err.contains(SINGLE), "{err}");
    }

    /// A header whose shape claims more elements than any file holds (the
    /// count overflows) is refused, not wrapped into a size that matches.
    #[test]
    fn a_shape_whose_element_count_overflows_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let huge = 1u64 << 32;
        let head = format!(
            r#"{{"w":{{"dtype":"F32","shape":[{huge},{huge},{huge},{huge}],"data_offsets":[0,0]}}}}"#
        );
        let mut bytes = (head.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(head.as_bytes());
        std::fs::write(dir.path().join(SINGLE), bytes).unwrap();
        let err = Weights::open(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("`w`") && err.contains("more elements"),
            "{err}"
        );
    }

    /// A FIFO or a directory named `model.safetensors` is refused by its
    /// type before it is opened: opening a FIFO would block until a writer
    /// came.
    #[test]
    fn a_fifo_or_a_directory_in_place_of_the_weights_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SINGLE);
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(made.success());
        let err = Weights::open(dir.path()).unwrap_err();
        assert!(matches!(err, HfError::NotAFile { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains(SINGLE) && text.contains("a FIFO"), "{text}");
        let err = Weights::open_file(&path).unwrap_err().to_string();
        assert!(err.contains("a FIFO"), "{err}");
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let err = Weights::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains(SINGLE) && err.contains("a directory"), "{err}");
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

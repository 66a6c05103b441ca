//! The registry of networks a checkpoint directory can hold, and loading a
//! checkpoint through it. [`NETS`] lists each network's declaration
//! ([`NetSpec`], from its [`PolicyNet`] implementation);
//! [`policy_net`] and [`policy_kind`] read which one a directory's
//! `config.json` names (our `kind` field, or transformers' `model_type`),
//! and a `kind` or `model_type` none declares is bad input naming
//! `config.json` and the key. [`Checkpoint::load_kind`] loads the network
//! it is asked for, refusing a directory that holds another (naming both
//! kinds), and checks that the files agree: every tensor the config
//! implies is in the weights with its shape and nothing else is, and the
//! tokenizer's vocabulary is the model's, each compared before any
//! parameter is allocated and the file at fault named; every file loading
//! may open must be a regular file (a FIFO is refused, not waited on).
//!
//! Adding a network is its module implementing [`PolicyNet`] and one line
//! in [`NETS`]; this is the one module that names every network.
//!
//! ```no_run
//! use embodyflow_models::checkpoint::{Checkpoint, PolicyKind};
//! use embodyflow_models::registry::policy_kind;
//! use embodyflow_models::vla::Vla;
//! let dir = std::path::Path::new("runs/sft/policy");
//! if policy_kind(dir).unwrap() == PolicyKind::Vla {
//!     let policy = Checkpoint::<Vla>::load_kind(dir, tch::Device::Cpu).unwrap();
//!     println!("{} ({} parameters)", policy.manifest.id, policy.num_parameters());
//! }
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::ModelError;
use crate::checkpoint::{
    Checkpoint, CheckpointManifest, FRAME_ENCODER_FILE, MANIFEST_FILE, built, io,
};
use crate::frame_encoder::FrameEncoder;
use crate::gpt::Gpt;
use crate::net::{
    ConfigTag, NetSpec, PolicyKind, PolicyNet, TOKENIZER_FILE, Tokens, WEIGHTS_FILE, bad,
};
use crate::tokenizer;
use crate::{hf, vl, vla};

/// Every network a checkpoint directory can hold, as each declares itself
/// ([`PolicyNet`]); [`policy_net`] finds a directory's among them by its
/// `config.json`. The first whose tag takes a config without `kind` and
/// `model_type` is the default.
pub const NETS: [NetSpec; 4] = [
    NetSpec::of::<Gpt>(),
    NetSpec::of::<vla::Vla>(),
    NetSpec::of::<hf::HfNet>(),
    NetSpec::of::<vl::VlPolicy>(),
];

/// Runs a stage's body on the network a declaration names, written once per
/// role: `plan: |M| ...` for a network that answers in one go (ours, a
/// Hugging Face decoder or vision-language model: `M:`
/// [`PlanNet`](crate::policy::PlanNet)), `closed_loop: |M| ...` for one
/// that acts step by step (a VLA); `|M| ...` alone for both. `M` names the
/// network's type in the body, so the body is checked against every network
/// of its role with the stage's own bounds. Evaluates to the body's value.
/// This is the one dispatch over networks: a new network adds its arm here
/// beside its line in [`NETS`] (a test checks that every declaration has
/// its arm), and no stage changes.
///
/// ```
/// use embodyflow_models::registry::NETS;
/// use embodyflow_models::net::PolicyNet;
/// let names: Vec<&str> = NETS
///     .iter()
///     .map(|net| embodyflow_models::with_net!(net, plan: |M| M::NAME, closed_loop: |M| M::NAME))
///     .collect();
/// assert_eq!(names, NETS.map(|net| net.name));
/// ```
#[macro_export]
macro_rules! with_net {
    ($net:expr, |$m:ident| $body:expr $(,)?) => {
        $crate::with_net!($net, plan: |$m| $body, closed_loop: |$m| $body)
    };
    ($net:expr, plan: |$plan:ident| $plan_body:expr, closed_loop: |$closed:ident| $closed_body:expr $(,)?) => {{
        let net: &$crate::net::NetSpec = $net;
        if net.is::<$crate::gpt::Gpt>() {
            type $plan = $crate::gpt::Gpt;
            $plan_body
        } else if net.is::<$crate::hf::HfNet>() {
            type $plan = $crate::hf::HfNet;
            $plan_body
        } else if net.is::<$crate::vl::VlPolicy>() {
            type $plan = $crate::vl::VlPolicy;
            $plan_body
        } else if net.is::<$crate::vla::Vla>() {
            type $closed = $crate::vla::Vla;
            $closed_body
        } else {
            unreachable!("{} is declared in NETS without its arm in with_net!", net.name)
        }
    }};
}

/// [`with_net!`] on the network checkpoint directory `dir` holds
/// ([`policy_net`]): `Result<T, ModelError>`, an error when `dir` holds no
/// network we know. A `?` in a body returns from the enclosing function.
///
/// ```no_run
/// # fn demo(dir: &std::path::Path) -> Result<(), embodyflow_models::ModelError> {
/// use embodyflow_models::checkpoint::Checkpoint;
/// let parameters = embodyflow_models::with_policy_net!(dir, |M| {
///     Checkpoint::<M>::load_kind(dir, tch::Device::Cpu)?.num_parameters()
/// })?;
/// # let _ = parameters; Ok(()) }
/// ```
#[macro_export]
macro_rules! with_policy_net {
    ($dir:expr, $($arms:tt)*) => {
        match $crate::registry::policy_net($dir) {
            Ok(net) => Ok($crate::with_net!(net, $($arms)*)),
            Err(error) => Err(error),
        }
    };
}

/// The kind of policy checkpoint `dir` holds ([`policy_net`]'s).
pub fn policy_kind(dir: &Path) -> Result<PolicyKind, ModelError> {
    Ok(policy_net(dir)?.kind)
}

/// The network checkpoint `dir` holds, among those of [`NETS`]:
/// the one whose [`ConfigTag`] `config.json` matches.
pub fn policy_net(dir: &Path) -> Result<&'static NetSpec, ModelError> {
    let path = dir.join("config.json");
    embodyflow_hf::safetensors::regular_file(&path)?;
    let (net, _) = read_config(&path)?;
    Ok(net)
}

/// The network of `object` (a `config.json` without its `kind`, `kind`
/// given apart) among the declared ones.
fn declared(
    kind: Option<&serde_json::Value>,
    object: &serde_json::Map<String, serde_json::Value>,
    path: &Path,
) -> Result<&'static NetSpec, ModelError> {
    let names = |ours: bool| -> String {
        NETS.iter()
            .filter_map(|net| match net.tag {
                ConfigTag::Kind { name, .. } if ours => Some(format!("\"{name}\"")),
                ConfigTag::ModelTypes(types) if !ours => {
                    Some(format!("{}: {}", net.name, types.join(", ")))
                }
                _ => None,
            })
            .collect::<Vec<_>>()
            .join(if ours { " or " } else { "; " })
    };
    let found = match (kind, object.get("model_type")) {
        (Some(kind), _) => {
            let name = kind.as_str().unwrap_or_default();
            NETS.iter()
                .find(|net| matches!(net.tag, ConfigTag::Kind { name: n, .. } if n == name))
                .ok_or_else(|| {
                    bad(
                        path,
                        format!(
                            "kind: {kind} is no network we know (expected {})",
                            names(true)
                        ),
                    )
                })?
        }
        (None, Some(model_type)) => {
            let name = model_type.as_str().unwrap_or_default();
            NETS.iter()
                .find(
                    |net| matches!(net.tag, ConfigTag::ModelTypes(types) if types.contains(&name)),
                )
                .ok_or_else(|| {
                    bad(
                        path,
                        format!(
                            "`model_type` {model_type} is no architecture we run (we run {})",
                            names(false)
                        ),
                    )
                })?
        }
        (None, None) => NETS
            .iter()
            .find(|net| matches!(net.tag, ConfigTag::Kind { default: true, .. }))
            .expect("the registry declares a default network"),
    };
    Ok(found)
}

/// `config.json` split into the network it declares and the rest.
fn read_config(path: &Path) -> Result<(&'static NetSpec, serde_json::Value), ModelError> {
    // A stage's output directory (`--policy runs/sft`) holds the checkpoint
    // in `policy/`.
    if !path.exists()
        && let Some(dir) = path.parent()
        && dir.join("policy").join("config.json").is_file()
    {
        return Err(bad(
            dir,
            format!(
                "is no checkpoint, but this directory holds `policy/`: pass {}",
                dir.join("policy").display()
            ),
        ));
    }
    let mut value: serde_json::Value = read_json(path)?;
    let object = value
        .as_object_mut()
        .ok_or_else(|| bad(path, "is not a JSON object"))?;
    let kind = object.remove("kind");
    let net = declared(kind.as_ref(), object, path)?;
    Ok((net, value))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| bad(path, e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| bad(path, e.to_string()))
}

impl<M: PolicyNet> Checkpoint<M> {
    /// Loads the checkpoint of network `M` in `dir` onto `device`, checking
    /// that its files agree and that it holds that kind.
    pub fn load_kind(dir: &Path, device: tch::Device) -> Result<Checkpoint<M>, ModelError> {
        // A run killed while committing this checkpoint is completed first.
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            embodyflow_core::commit::settle(parent)?;
        }
        if !dir.is_dir() {
            return Err(bad(dir, "no such checkpoint directory"));
        }
        check_file_types(dir, M::CARRIED)?;
        let config_path = dir.join("config.json");
        let (net, value) = read_config(&config_path)?;
        if !net.is::<M>() {
            return Err(bad(
                &config_path,
                format!("holds a {} policy, expected a {} policy", net.name, M::NAME),
            ));
        }
        let mut config = M::parse_config(value).map_err(|reason| bad(&config_path, reason))?;
        M::check(&config).map_err(|reason| bad(&config_path, reason))?;
        let manifest_path = dir.join(MANIFEST_FILE);
        // A Hugging Face model as downloaded has no manifest: its id is its
        // weights', and it has no parent.
        let manifest: CheckpointManifest = if M::DOWNLOADED && !manifest_path.exists() {
            CheckpointManifest {
                id: weights_id(dir)?,
                parent: None,
                written_by: "huggingface".into(),
                updates: 0,
            }
        } else {
            read_json(&manifest_path)?
        };
        let tokenizer_path = dir.join(TOKENIZER_FILE);
        let tokenizer = tokenizer::load(&tokenizer_path)?;
        let Tokens {
            special,
            format,
            carried,
        } = M::tokens(dir, &tokenizer, &config)?;
        // The config against the weights' headers, before anything the
        // config sizes is allocated.
        let weights = M::open_weights(dir, &mut config)?;
        // Building draws initial weights that the loaded ones replace.
        let (mut vars, model) = built::<M>(&config, device);
        model.load_weights(&mut vars, &weights)?;
        let encoder_path = dir.join(FRAME_ENCODER_FILE);
        let frame_encoder = if encoder_path.is_file() {
            let encoder =
                FrameEncoder::load(&encoder_path).map_err(|e| bad(&encoder_path, e.to_string()))?;
            Some(Arc::new(encoder))
        } else {
            None
        };
        Ok(Checkpoint {
            vars,
            model,
            tokenizer,
            special,
            format,
            carried,
            manifest,
            optimizer: None,
            frame_encoder,
        })
    }
}

impl Checkpoint<Gpt> {
    /// Loads the plan policy in `dir` onto `device`, checking that its files agree.
    pub fn load(dir: &Path, device: tch::Device) -> Result<Checkpoint, ModelError> {
        Checkpoint::load_kind(dir, device)
    }
}

/// The files a checkpoint's loader opens must be regular files where
/// present (symbolic links followed): a FIFO in their place would block the
/// stage until a writer came, a directory fail it late. Each is checked by
/// its type before anything is opened, and named.
fn check_file_types(dir: &Path, carried: &[&str]) -> Result<(), ModelError> {
    let names = [
        "config.json",
        MANIFEST_FILE,
        WEIGHTS_FILE,
        TOKENIZER_FILE,
        embodyflow_hf::safetensors::INDEX,
        FRAME_ENCODER_FILE,
        crate::optimizer::WEIGHTS_FILE,
        crate::optimizer::META_FILE,
    ]
    .into_iter()
    .chain(carried.iter().copied());
    for name in names {
        embodyflow_hf::safetensors::regular_file(&dir.join(name))?;
    }
    Ok(())
}

/// The id of a checkpoint without a manifest: the first 16 hex digits of
/// the BLAKE3 hash of its weight files (`model*.safetensors`, by name).
fn weights_id(dir: &Path) -> Result<String, ModelError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| io(dir, e))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("model") && n.ends_with(".safetensors"))
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(bad(dir, "no model*.safetensors weights"));
    }
    let mut hasher = blake3::Hasher::new();
    for file in &files {
        // A shard's name may be any `model*.safetensors`: its type is
        // checked here, before it is opened.
        embodyflow_hf::safetensors::regular_file(file)?;
        let mut reader = std::fs::File::open(file).map_err(|e| io(file, e))?;
        std::io::copy(&mut reader, &mut hasher).map_err(|e| io(file, e))?;
    }
    Ok(hasher.finalize().to_hex()[..16].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::pretty;
    use crate::net::Role;
    use crate::policy::PlanNet;

    /// A plan network's body sees its `PlanNet` bound.
    fn plan_role<M: PlanNet>() -> &'static str {
        M::NAME
    }

    /// Whether `M`'s [`Role`] type answers in one go.
    fn typed_one_shot<M: PolicyNet>() -> bool {
        <M::Role as Role>::ONE_SHOT
    }

    #[test]
    fn every_declared_network_has_its_arm_and_its_role() {
        for net in &NETS {
            let (name, role, typed) = crate::with_net!(
                net,
                plan: |M| (plan_role::<M>(), "plan", typed_one_shot::<M>()),
                closed_loop: |M| (M::NAME, "closed loop", typed_one_shot::<M>())
            );
            assert_eq!(name, net.name);
            assert_eq!(role == "plan", net.kind.is_one_shot(), "{}", net.name);
            assert_eq!(typed, net.kind.is_one_shot(), "{}: its Role", net.name);
        }
    }
    use crate::gpt::GptConfig;
    use crate::testing::{load_refused, tiny_config, tiny_tokenizer as tokenizer};

    /// The shared tiny shape (2 layers, width 32) with a context of 16 tokens.
    fn config(vocab_size: i64) -> GptConfig {
        tiny_config(vocab_size, 16)
    }

    #[test]
    fn save_load_round_trips_and_ids_follow_the_weights() {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = tokenizer();
        let vocab = tokenizer.get_vocab_size(true) as i64;
        let policy = Checkpoint::init(&config(vocab), tokenizer, tch::Device::Cpu).unwrap();
        let path = dir.path().join("ckpt");
        let manifest = policy.save(&path, "test", false).unwrap();
        assert_eq!(manifest.id.len(), 16);
        assert!(
            policy.save(&path, "test", false).is_err(),
            "refuses to overwrite"
        );
        let loaded = Checkpoint::load(&path, tch::Device::Cpu).unwrap();
        assert_eq!(loaded.manifest, manifest);
        let again = loaded
            .save(&dir.path().join("copy"), "test", false)
            .unwrap();
        assert_eq!(again.id, manifest.id, "same weights, same id");
        assert_eq!(again.parent.as_deref(), Some(manifest.id.as_str()));
        let ids = tch::Tensor::from_slice(&[3i64, 4, 5]).view([1, 3]);
        let diff = (policy.model.forward(&ids) - loaded.model.forward(&ids))
            .abs()
            .max()
            .double_value(&[]);
        assert_eq!(diff, 0.0);
    }

    #[test]
    fn a_stage_output_directory_points_to_its_policy() {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = tokenizer();
        let vocab = tokenizer.get_vocab_size(true) as i64;
        let policy = Checkpoint::init(&config(vocab), tokenizer, tch::Device::Cpu).unwrap();
        policy
            .save(&dir.path().join("policy"), "test", false)
            .unwrap();
        let expected = format!(
            "this directory holds `policy/`: pass {}",
            dir.path().join("policy").display()
        );
        let err = Checkpoint::load(dir.path(), tch::Device::Cpu)
            .err()
            .expect("not a checkpoint");
        assert!(err.to_string().contains(&expected), "{err}");
        let err = policy_kind(dir.path()).unwrap_err();
        assert!(err.to_string().contains(&expected), "{err}");
    }

    #[test]
    fn a_config_without_kind_is_a_plan_policy_and_kinds_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = tokenizer();
        let vocab = tokenizer.get_vocab_size(true) as i64;
        let policy = Checkpoint::init(&config(vocab), tokenizer, tch::Device::Cpu).unwrap();
        let path = dir.path().join("ckpt");
        policy.save(&path, "test", false).unwrap();
        let written = std::fs::read_to_string(path.join("config.json")).unwrap();
        assert!(written.contains("\"kind\": \"plan\""), "{written}");
        assert_eq!(policy_kind(&path).unwrap(), PolicyKind::Plan);
        // A checkpoint written before the VLA: the bare GptConfig.
        std::fs::write(path.join("config.json"), pretty(&config(vocab))).unwrap();
        assert_eq!(policy_kind(&path).unwrap(), PolicyKind::Plan);
        let loaded = Checkpoint::load(&path, tch::Device::Cpu).unwrap();
        assert_eq!(loaded.model.config(), &config(vocab));
        // Another kind, or none we know, is named.
        let vla = written.replace("\"kind\": \"plan\"", "\"kind\": \"vla\"");
        std::fs::write(path.join("config.json"), vla).unwrap();
        assert_eq!(policy_kind(&path).unwrap(), PolicyKind::Vla);
        let error = Checkpoint::load(&path, tch::Device::Cpu)
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("config.json") && error.contains("holds a vla policy, expected a plan"),
            "{error}"
        );
        let odd = written.replace("\"kind\": \"plan\"", "\"kind\": \"diffusion\"");
        std::fs::write(path.join("config.json"), odd).unwrap();
        let error = policy_kind(&path).err().unwrap().to_string();
        assert!(
            error.contains("config.json") && error.contains("diffusion"),
            "{error}"
        );
    }

    /// A fresh tiny policy saved as `dir/ckpt`: its path and vocabulary.
    fn saved(dir: &Path) -> (PathBuf, i64) {
        let tokenizer = tokenizer();
        let vocab = tokenizer.get_vocab_size(true) as i64;
        let policy = Checkpoint::init(&config(vocab), tokenizer, tch::Device::Cpu).unwrap();
        let path = dir.join("ckpt");
        policy.save(&path, "test", false).unwrap();
        (path, vocab)
    }

    #[test]
    fn mismatched_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let (path, vocab) = saved(dir.path());

        // A config whose width disagrees with the weights.
        let mut wider = config(vocab);
        wider.n_embd *= 2;
        std::fs::write(path.join("config.json"), pretty(&wider)).unwrap();
        let error = Checkpoint::load(&path, tch::Device::Cpu)
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("model.safetensors") && error.contains("shape"),
            "{error}"
        );

        // A config whose vocabulary disagrees with the tokenizer.
        std::fs::write(path.join("config.json"), pretty(&config(vocab + 5))).unwrap();
        let error = Checkpoint::load(&path, tch::Device::Cpu)
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("tokenizer.json") && error.contains("vocab_size"),
            "{error}"
        );

        // An extra layer in the config: the weights lack its tensors.
        let mut deeper = config(vocab);
        deeper.n_layer += 1;
        std::fs::write(path.join("config.json"), pretty(&deeper)).unwrap();
        let error = Checkpoint::load(&path, tch::Device::Cpu)
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("tensor `h.2.ln_1.weight` is missing") && error.contains("n_layer"),
            "{error}"
        );

        std::fs::write(path.join("config.json"), "{\"vocab_size\": 3}").unwrap();
        let error = Checkpoint::load(&path, tch::Device::Cpu)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("config.json"), "{error}");
    }

    /// Sizes no weights hold in a saved policy's config.json are refused on
    /// the weights' header, naming the tensor, the file and the keys,
    /// before any parameter is allocated (allocating them aborted the
    /// process); a vocabulary of 2^40 is the tokenizer's mismatch.
    #[test]
    fn absurd_sizes_in_config_json_are_refused_before_allocating() {
        let dir = tempfile::tempdir().unwrap();
        let (path, vocab) = saved(dir.path());
        let cases: [(&str, i64, &str); 5] = [
            ("n_layer", 1_000_000_000, "`h.2.ln_1.weight` is missing"),
            ("n_embd", 1 << 31, "`wte.weight` has shape"),
            ("n_ctx", 1 << 40, "`wpe.weight` has shape"),
            ("vocab_size", 1 << 40, "tokenizer.json"),
            ("n_embd", 1 << 62, "4 n_embd overflows"),
        ];
        for (key, value, needle) in cases {
            let mut written = serde_json::to_value(config(vocab)).unwrap();
            written[key] = serde_json::Value::from(value);
            std::fs::write(path.join("config.json"), written.to_string()).unwrap();
            let error = load_refused::<Gpt>(&path);
            assert!(
                error.contains(needle) && error.contains(key),
                "{key}: {error}"
            );
        }
    }

    /// A FIFO or a directory in place of a checkpoint file is refused by its
    /// type before anything opens it (opening the FIFO blocked the stage
    /// until a writer came; the directory failed late, as an I/O error).
    #[test]
    fn a_fifo_or_a_directory_in_place_of_a_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = saved(dir.path());
        for name in [WEIGHTS_FILE, "config.json", TOKENIZER_FILE] {
            let file = path.join(name);
            let kept = std::fs::read(&file).unwrap();
            std::fs::remove_file(&file).unwrap();
            let made = std::process::Command::new("mkfifo")
                .arg(&file)
                .status()
                .unwrap();
            assert!(made.success());
            let error = load_refused::<Gpt>(&path);
            assert!(
                error.contains(name) && error.contains("is a FIFO"),
                "{error}"
            );
            std::fs::remove_file(&file).unwrap();
            std::fs::create_dir(&file).unwrap();
            let error = load_refused::<Gpt>(&path);
            assert!(
                error.contains(name) && error.contains("is a directory"),
                "{error}"
            );
            std::fs::remove_dir(&file).unwrap();
            std::fs::write(&file, kept).unwrap();
        }
        Checkpoint::load(&path, tch::Device::Cpu).unwrap();
    }
}

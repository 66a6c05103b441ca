//! The numerics fingerprint of a stage process: what its floating-point
//! results depend on besides its inputs, config and binary.
//!
//! The same binary given the same inputs and config writes the same bits
//! only when these are the same too:
//!
//! - **the thread count** of the pool it computes on ([`crate::threads`]):
//!   libtorch's intra-op loops and rayon's reductions split a sum into one
//!   partial sum per thread, so 1 and 2 threads add in different orders
//!   (collect-rollouts' `old_logprobs` differed by up to 9.5e-7);
//! - **the CPU capability libtorch dispatches its kernels at**
//!   ([`CpuCapability`]): vectorised kernels of different widths add in
//!   different orders. libtorch takes `ATEN_CPU_CAPABILITY` when it names a
//!   level, else the best the CPU has: `avx512` with the `avx512vl`,
//!   `avx512bw`, `avx512dq` and `fma` flags, `avx2` with `avx2` and `fma`,
//!   else `default` ([`cpu_capability`], as ATen's `DispatchStub.cpp`
//!   decides);
//! - **the libtorch version** ([`libtorch_version`]).
//!
//! [`fingerprint`] is a pure function of these, by pool: a torch stage
//! depends on all three, a rayon stage on its thread count, a
//! single-threaded stage on none. The pipeline runner puts a step's
//! fingerprint into its cache key, and starts every stage process with its
//! thread count and `ATEN_CPU_CAPABILITY` set from it, on every backend, so
//! that a step computed with other numerics is never taken for this one.
//!
//! Not covered: MKL's and oneDNN's own choice of kernels inside libtorch,
//! which also follows the CPU (`MKL_ENABLE_INSTRUCTIONS`,
//! `ONEDNN_MAX_CPU_ISA`). So bit-identity is promised for the same machine
//! (or machines with the same CPU), binary, libtorch and thread count —
//! across reruns, resumed runs, shards and backends; across different CPUs
//! results agree to a tolerance only.
//!
//! ```
//! use embodyflow_core::numerics::{CpuCapability, Machine, cpu_capability, fingerprint};
//! use embodyflow_core::threads::Threads;
//! let cpuinfo = "processor\t: 0\nflags\t\t: fpu sse avx avx2 fma\n";
//! assert_eq!(cpu_capability(None, cpuinfo), CpuCapability::Avx2);
//! assert_eq!(cpu_capability(Some("default"), cpuinfo), CpuCapability::Default);
//! let machine = Machine { cpu_capability: CpuCapability::Avx2, libtorch: "2.13.0+cu130".into() };
//! let torch = fingerprint(Threads::Torch, 4, &machine);
//! assert_eq!(torch.threads, Some(4));
//! assert_eq!(torch.cpu_capability, Some(CpuCapability::Avx2));
//! assert_eq!(fingerprint(Threads::Rayon, 4, &machine).libtorch, None);
//! assert_eq!(fingerprint(Threads::Single, 4, &machine).threads, None);
//! ```

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::threads::Threads;

/// The variable libtorch reads its dispatch level from.
pub const CAPABILITY_VAR: &str = "ATEN_CPU_CAPABILITY";

/// A CPU capability libtorch dispatches its kernels at, lowest first.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum CpuCapability {
    /// The portable kernels.
    #[default]
    Default,
    /// 256-bit AVX2 kernels (with FMA).
    Avx2,
    /// 512-bit AVX-512 kernels.
    Avx512,
}

impl CpuCapability {
    /// Every level, lowest first.
    pub const ALL: [CpuCapability; 3] = [
        CpuCapability::Default,
        CpuCapability::Avx2,
        CpuCapability::Avx512,
    ];

    /// The name `ATEN_CPU_CAPABILITY` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            CpuCapability::Default => "default",
            CpuCapability::Avx2 => "avx2",
            CpuCapability::Avx512 => "avx512",
        }
    }

    /// The level a name means (exactly as libtorch spells it).
    pub fn parse(name: &str) -> Option<CpuCapability> {
        Self::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

impl fmt::Display for CpuCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The best level the CPU flags of `cpuinfo` (the text of `/proc/cpuinfo`)
/// allow: a level needs its flags on every processor listed.
pub fn best_capability(cpuinfo: &str) -> CpuCapability {
    let mut best = None::<CpuCapability>;
    for line in cpuinfo.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        if key.trim() != "flags" {
            continue;
        }
        let flags: Vec<&str> = value.split_whitespace().collect();
        let has = |names: &[&str]| names.iter().all(|n| flags.contains(n));
        let level = if has(&["avx512vl", "avx512bw", "avx512dq", "fma"]) {
            CpuCapability::Avx512
        } else if has(&["avx2", "fma"]) {
            CpuCapability::Avx2
        } else {
            CpuCapability::Default
        };
        best = Some(best.map_or(level, |b| b.min(level)));
    }
    best.unwrap_or_default()
}

/// The level libtorch dispatches at: `env` (the value of
/// `ATEN_CPU_CAPABILITY`) when it names a level, else the best `cpuinfo`
/// allows (libtorch ignores a value it does not know, with a warning).
pub fn cpu_capability(env: Option<&str>, cpuinfo: &str) -> CpuCapability {
    env.and_then(|v| CpuCapability::parse(v.trim()))
        .unwrap_or_else(|| best_capability(cpuinfo))
}

/// This machine's `/proc/cpuinfo` (empty when unreadable: `default`).
pub fn cpuinfo() -> String {
    std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default()
}

/// The level a process started now with this environment dispatches at.
pub fn this_process_capability() -> CpuCapability {
    cpu_capability(std::env::var(CAPABILITY_VAR).ok().as_deref(), &cpuinfo())
}

/// The version of the libtorch in directory `dir`: its `build-version`
/// file (a libtorch archive), else `__version__` in its `version.py` (the
/// `torch` Python package, which `scripts/setup` links as `.venv/libtorch`).
pub fn libtorch_version(dir: &Path) -> Option<String> {
    if let Ok(text) = std::fs::read_to_string(dir.join("build-version"))
        && !text.trim().is_empty()
    {
        return Some(text.trim().to_string());
    }
    let text = std::fs::read_to_string(dir.join("version.py")).ok()?;
    version_py(&text)
}

/// `__version__ = '2.13.0+cu130'` in a `torch/version.py`.
fn version_py(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == "__version__").then(|| value.trim().trim_matches(['\'', '"']).to_string())
    })
}

/// What a machine contributes to the fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// The level libtorch dispatches at ([`cpu_capability`]).
    pub cpu_capability: CpuCapability,
    /// The libtorch version ([`libtorch_version`]; `unknown` when not found).
    pub libtorch: String,
}

/// The numerics a process computes with, as far as its pool depends on
/// them; serialised into cache keys (absent parts as `null`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// Threads of its pool (torch and rayon stages).
    pub threads: Option<usize>,
    /// libtorch's dispatch level (torch stages).
    pub cpu_capability: Option<CpuCapability>,
    /// libtorch's version (torch stages).
    pub libtorch: Option<String>,
}

/// The fingerprint of a stage computing on `pool` with `threads` threads on
/// `machine`: what its results depend on, and nothing else (see the module
/// documentation).
pub fn fingerprint(pool: Threads, threads: usize, machine: &Machine) -> Fingerprint {
    let torch = pool == Threads::Torch;
    Fingerprint {
        threads: (pool != Threads::Single).then_some(threads),
        cpu_capability: torch.then_some(machine.cpu_capability),
        libtorch: torch.then(|| machine.libtorch.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AVX512: &str = "flags\t\t: fpu avx avx2 fma avx512f avx512dq avx512bw avx512vl\n";
    const AVX2: &str = "flags\t\t: fpu avx avx2 fma\n";

    #[test]
    fn the_level_is_the_variables_when_it_names_one_else_the_cpus_best() {
        assert_eq!(best_capability(AVX512), CpuCapability::Avx512);
        assert_eq!(best_capability(AVX2), CpuCapability::Avx2);
        // AVX2 without FMA, AVX-512 without its VL part: one level lower.
        assert_eq!(
            best_capability("flags : avx avx2\n"),
            CpuCapability::Default
        );
        assert_eq!(
            best_capability("flags : avx2 fma avx512f avx512bw avx512dq\n"),
            CpuCapability::Avx2
        );
        assert_eq!(best_capability(""), CpuCapability::Default);
        // Every processor must have the flags.
        assert_eq!(
            best_capability(&format!("{AVX512}\n{AVX2}")),
            CpuCapability::Avx2
        );
        for (env, cpu, level) in [
            (Some("avx2"), AVX512, CpuCapability::Avx2),
            (Some("default"), AVX512, CpuCapability::Default),
            (Some(" avx512 "), AVX2, CpuCapability::Avx512),
            (Some("AVX2"), AVX2, CpuCapability::Avx2),
            (Some("sse"), AVX512, CpuCapability::Avx512),
            (Some(""), AVX2, CpuCapability::Avx2),
            (None, AVX512, CpuCapability::Avx512),
        ] {
            assert_eq!(cpu_capability(env, cpu), level, "{env:?}");
        }
        assert!(CpuCapability::Default < CpuCapability::Avx2);
        assert!(CpuCapability::Avx2 < CpuCapability::Avx512);
        for level in CpuCapability::ALL {
            assert_eq!(CpuCapability::parse(level.as_str()), Some(level));
        }
    }

    #[test]
    fn the_libtorch_version_is_read_from_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(libtorch_version(dir.path()), None);
        std::fs::write(
            dir.path().join("version.py"),
            "from typing import Optional\n__version__ = '2.13.0+cu130'\ndebug = False\n",
        )
        .unwrap();
        assert_eq!(
            libtorch_version(dir.path()).as_deref(),
            Some("2.13.0+cu130")
        );
        std::fs::write(dir.path().join("build-version"), "2.5.1+cpu\n").unwrap();
        assert_eq!(libtorch_version(dir.path()).as_deref(), Some("2.5.1+cpu"));
    }

    #[test]
    fn each_pool_depends_on_its_own_part() {
        let machine = Machine {
            cpu_capability: CpuCapability::Avx512,
            libtorch: "2.13.0".into(),
        };
        let torch = fingerprint(Threads::Torch, 2, &machine);
        assert_eq!(
            serde_json::to_string(&torch).unwrap(),
            r#"{"threads":2,"cpu_capability":"avx512","libtorch":"2.13.0"}"#
        );
        assert_ne!(torch, fingerprint(Threads::Torch, 1, &machine));
        let rayon = fingerprint(Threads::Rayon, 2, &machine);
        assert_eq!((rayon.threads, rayon.cpu_capability), (Some(2), None));
        let single = fingerprint(Threads::Single, 2, &machine);
        assert_eq!(single, fingerprint(Threads::Single, 8, &machine));
    }
}

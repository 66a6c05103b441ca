//! Where a cluster step may run, checked before anything is submitted: a
//! node that can hold one process of each step ([`check_fits`]), and the
//! paths every node must see under `[backend] shared` ([`check_shared`]),
//! compared as the filesystem resolves them ([`resolved`]: `/home/me/run`
//! is `/mnt/home/me/run` when `/home` links to `/mnt/home`).

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use super::journal::bad;
use crate::backend::{Resources, Table};
use crate::error::{Result, RunnerError};
use crate::exec::RunOptions;
use crate::plan::Plan;

/// A path made absolute against the working directory, `.` and `..`
/// resolved without touching the filesystem (outputs do not exist yet).
pub(crate) fn absolute(path: &Path, cwd: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in cwd.join(path).components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// A path as the filesystem resolves it: made [`absolute`], then its
/// longest existing part with every symbolic link resolved
/// (`canonicalize`), the rest (outputs that do not exist yet) appended.
/// `/home/me/run` is `/mnt/home/me/run` when `/home` links to `/mnt/home`.
pub(crate) fn resolved(path: &Path, cwd: &Path) -> PathBuf {
    let full = absolute(path, cwd);
    let mut head = full.as_path();
    let mut tail = Vec::new();
    loop {
        if let Ok(real) = std::fs::canonicalize(head) {
            return tail.iter().rev().fold(real, |p, part| p.join(part));
        }
        match (head.parent(), head.file_name()) {
            (Some(parent), Some(name)) => {
                tail.push(name.to_os_string());
                head = parent;
            }
            _ => return full,
        }
    }
}

/// One node as the cluster describes it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub name: String,
    pub cpus: u32,
    pub mem_mb: u64,
    pub gpus: u32,
}

/// Whether a node can run one process of a step.
pub(crate) fn fits(node: &Node, resources: &Resources) -> bool {
    resources.cpus.unwrap_or(1) <= node.cpus
        && resources.mem_mb.unwrap_or(0) <= node.mem_mb
        && resources.gpus <= node.gpus
}

/// Bad input when a step asks for more than any of `nodes` has; `of`
/// names them (`partition `gpu``).
pub(crate) fn check_fits(plan: &Plan, nodes: &[Node], of: &str) -> Result<()> {
    let mut seen = BTreeSet::new();
    for instance in &plan.instances {
        if !seen.insert(&instance.step) || nodes.iter().any(|n| fits(n, &instance.resources)) {
            continue;
        }
        let r = &instance.resources;
        let described: Vec<String> = nodes
            .iter()
            .take(8)
            .map(|n| {
                format!(
                    "{}: {} CPUs, {} MiB, {} GPUs",
                    n.name, n.cpus, n.mem_mb, n.gpus
                )
            })
            .collect();
        return Err(bad(format!(
            "{}:{}: step `{}` asks for {} CPU(s), {} and {} GPU(s) per process; no node of {of} has that ({}{})",
            plan.file.display(),
            instance.line,
            instance.step,
            r.cpus.unwrap_or(1),
            r.mem_mb
                .map_or("the default memory".to_string(), |m| format!("{m} MiB")),
            r.gpus,
            if described.is_empty() {
                "no node is up".to_string()
            } else {
                described.join("; ")
            },
            if nodes.len() > 8 { "; …" } else { "" }
        )));
    }
    Ok(())
}

/// Bad input when the run directory, the working directory, the binaries or
/// an input of a step are not under `[backend] shared`: every node must see
/// them. `who` names the backend.
pub(crate) fn check_shared(
    plan: &Plan,
    backend: &Table,
    options: &RunOptions,
    exe: &Path,
    who: &str,
) -> Result<()> {
    let cwd = std::env::current_dir().map_err(|e| RunnerError::io(".", e))?;
    if backend.shared.is_empty() {
        return Err(bad(format!(
            "{}: the {who} backend needs [backend] shared = [\"/path\", …]: the roots of the filesystems every node sees; the run directory, the inputs, the binaries and the directory `pipeline` runs in must be under them",
            plan.file.display()
        )));
    }
    // Compared as the filesystem resolves them: a root or a path may be
    // reached through a symbolic link.
    let roots: Vec<PathBuf> = backend.shared.iter().map(|r| resolved(r, &cwd)).collect();
    let mut paths: Vec<(String, PathBuf)> = vec![
        ("the run directory".into(), plan.out.clone()),
        (
            "the directory `pipeline` runs in (jobs start there)".into(),
            cwd.clone(),
        ),
        ("the stage binaries".into(), options.bin_dir.clone()),
        ("the `pipeline` binary".into(), exe.to_path_buf()),
    ];
    for instance in &plan.instances {
        for path in &instance.external {
            paths.push((format!("an input of step `{}`", instance.id), path.clone()));
        }
    }
    for (what, path) in paths {
        let full = resolved(&path, &cwd);
        if !roots.iter().any(|root| full.starts_with(root)) {
            return Err(bad(format!(
                "{}: {what}, {}, is not under a shared root ([backend] shared: {}); every node must see it",
                plan.file.display(),
                full.display(),
                roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_roots_and_paths_are_compared_with_their_links_resolved() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("mnt/home");
        std::fs::create_dir_all(real.join("me/data")).unwrap();
        let home = dir.path().join("home");
        std::os::unix::fs::symlink(&real, &home).unwrap();
        let cwd = real.join("me");
        // A root given through the link, paths reached without it (and a
        // run directory that does not exist yet), and the other way round.
        let root = resolved(&home, &cwd);
        for path in ["data", "run/it0/collect", "../me/./data"] {
            let full = resolved(Path::new(path), &cwd);
            assert!(
                full.starts_with(&root),
                "{} under {}",
                full.display(),
                root.display()
            );
        }
        let through_link = resolved(&home.join("me/run"), &cwd);
        assert!(through_link.starts_with(resolved(&real, &cwd)));
        assert_eq!(through_link, real.canonicalize().unwrap().join("me/run"));
        // Not under it.
        assert!(!resolved(Path::new("/tmp"), &cwd).starts_with(&root));
    }

    #[test]
    fn paths_are_made_absolute_without_the_filesystem() {
        let cwd = Path::new("/shared/me/work");
        assert_eq!(
            absolute(Path::new("../data/./x"), cwd),
            Path::new("/shared/me/data/x")
        );
        assert_eq!(absolute(Path::new("/tmp/run"), cwd), Path::new("/tmp/run"));
    }

    #[test]
    fn nodes_hold_a_step_when_each_resource_fits() {
        let node = Node {
            name: "vm".into(),
            cpus: 2,
            mem_mb: 24105,
            gpus: 0,
        };
        let ask = |cpus, mem_mb, gpus| Resources {
            cpus: Some(cpus),
            mem_mb: Some(mem_mb),
            gpus,
        };
        assert!(fits(&node, &ask(2, 24105, 0)));
        assert!(!fits(&node, &ask(3, 100, 0)));
        assert!(!fits(&node, &ask(1, 100, 1)));
        assert!(!fits(&node, &ask(1, 24106, 0)));
    }
}

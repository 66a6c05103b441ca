//! The runner's own directory of a run directory, `OUT/_runner`, and its
//! lock belong to the user running the pipeline alone: they are made 0700
//! and 0600 whatever the umask, another user cannot open the lock (and so
//! cannot block runs on the directory), and a `_runner` others may write
//! into, or a lock that is a symbolic link, is refused before any stage
//! runs.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;

use embodyflow_tests::{Run, bin, run};

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

/// A pipeline of one quick step, written in `dir`.
fn pipeline(dir: &Path) -> std::path::PathBuf {
    let file = dir.join("tasks.toml");
    std::fs::write(
        &file,
        r#"
[pipeline]
name = "tasks"

[[step]]
name = "train"
stage = "generate-tasks"
seed = 1
set = { split = "train", count = 20 }
"#,
    )
    .unwrap();
    file
}

/// `pipeline run FILE --out OUT` under umask 000.
fn run_permissive(file: &Path, out: &Path) -> Run {
    Command::new("sh")
        .arg("-c")
        .arg("umask 000; exec \"$0\" \"$@\"")
        .arg(bin("pipeline"))
        .args(["run", s(file), "--out", s(out)])
        .output()
        .unwrap()
        .into()
}

#[test]
fn the_runner_directory_and_lock_are_private_under_a_permissive_umask() {
    let dir = tempfile::tempdir().unwrap();
    let file = pipeline(dir.path());
    let out = dir.path().join("run");
    let result = run_permissive(&file, &out);
    assert_eq!(result.code, 0, "{result}");
    let lock = out.join("_runner/lock");
    assert_eq!(mode(&out.join("_runner")), 0o700);
    assert_eq!(mode(&lock), 0o600);

    // Another user cannot open the lock, so cannot hold it (root only:
    // setpriv switches to `nobody`).
    let setpriv = Path::new("/usr/bin/setpriv");
    let root = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&lock).unwrap()) == 0;
    if root && setpriv.exists() {
        for path in [dir.path(), &out] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let other = Command::new(setpriv)
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(["sh", "-c", "exec 3<\"$0\" && echo opened", s(&lock)])
            .output()
            .unwrap();
        assert!(
            !other.status.success() && !String::from_utf8_lossy(&other.stdout).contains("opened"),
            "another user opened {}: {other:?}",
            lock.display()
        );
        // The run directory stays usable by its owner.
        let result = run("pipeline", &["run", s(&file), "--out", s(&out)]);
        assert_eq!(result.code, 0, "{result}");
    }
}

#[test]
fn a_runner_directory_others_may_write_or_a_linked_lock_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = pipeline(dir.path());
    let out = dir.path().join("run");
    let runner = out.join("_runner");
    std::fs::create_dir_all(&runner).unwrap();
    std::fs::set_permissions(&runner, std::fs::Permissions::from_mode(0o777)).unwrap();
    let result = run("pipeline", &["run", s(&file), "--out", s(&out)]);
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result.stderr.contains(&format!(
            "{} is writable by all users (mode 0777)",
            runner.display()
        )),
        "{result}"
    );
    assert!(!out.join("train").exists(), "no stage ran: {result}");

    std::fs::set_permissions(&runner, std::fs::Permissions::from_mode(0o700)).unwrap();
    let target = dir.path().join("target");
    std::fs::write(&target, "").unwrap();
    std::os::unix::fs::symlink(&target, runner.join("lock")).unwrap();
    let result = run("pipeline", &["run", s(&file), "--out", s(&out)]);
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result.stderr.contains(&format!(
            "{} is a symbolic link",
            runner.join("lock").display()
        )),
        "{result}"
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "");
}

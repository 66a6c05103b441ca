//! Directories that belong to the user running a process alone: the
//! runner's `OUT/_runner` (its lock), the kept bridge workers' socket
//! directory and, when a run directory is too long for a socket's address,
//! a socket directory under the shared temporary directory.
//!
//! One rule for all of them ([`private_dir`]): the directory is created
//! exclusively with mode 0700 and opened without following a symbolic
//! link; where one is already at the path it is used only if the caller
//! allows it ([`IfExists::Reuse`], a run's own directory from an earlier
//! start) and it is a real directory (not a symbolic link) owned by this
//! user that neither its group nor other users may write into, and it is
//! then made exactly 0700. A directory another user could have made first
//! or written into is never used: they could have put their own files, a
//! lock or a socket, there.
//!
//! ```no_run
//! use embodyflow_core::private_dir::{IfExists, private_dir};
//! let fd = private_dir(std::path::Path::new("runs/demo/_runner"), IfExists::Reuse).unwrap();
//! ```

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// What [`private_dir`] does with a directory already at its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IfExists {
    /// Refuse it: the directory must be made now (a path in a shared
    /// directory, which another user may have taken first).
    Refuse,
    /// Use it when it passes the checks (the module doc): the run's own
    /// directory, made by an earlier start.
    Reuse,
}

/// Why a private directory cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum PrivateDirError {
    /// The directory or its parent could not be made, opened or changed.
    #[error("{path}: {source}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Something is at the path that others could reach or that this user
    /// did not make.
    #[error("{path} {problem}")]
    Unsafe {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it, as a predicate of the path (`is a
        /// symbolic link`).
        problem: String,
    },
}

impl PrivateDirError {
    /// The directory named.
    pub fn path(&self) -> &Path {
        match self {
            PrivateDirError::Io { path, .. } | PrivateDirError::Unsafe { path, .. } => path,
        }
    }
}

/// The problem of an `Unsafe` error of a directory [`IfExists::Refuse`]
/// found already there.
pub const MADE_BY_SOMEONE_ELSE: &str = "exists already, made by someone other than this run";

/// Creates `dir` (and its missing parents) for this user alone, or, with
/// [`IfExists::Reuse`], opens the one already there if it is this user's
/// (the module doc's rule); returns it open (`O_DIRECTORY`, `O_NOFOLLOW`),
/// mode exactly 0700.
pub fn private_dir(dir: &Path, if_exists: IfExists) -> Result<OwnedFd, PrivateDirError> {
    use rustix::fs::{CWD, FileType, Mode, OFlags, fchmod, fstat, mkdirat, openat};
    let io = |source: std::io::Error| PrivateDirError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let refused = |problem: String| PrivateDirError::Unsafe {
        path: dir.to_path_buf(),
        problem,
    };
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| PrivateDirError::Io {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    let created = match mkdirat(CWD, dir, Mode::RWXU) {
        Ok(()) => true,
        Err(rustix::io::Errno::EXIST) if if_exists == IfExists::Reuse => false,
        Err(rustix::io::Errno::EXIST) => {
            return Err(refused(MADE_BY_SOMEONE_ELSE.into()));
        }
        Err(e) => return Err(io(e.into())),
    };
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = match openat(CWD, dir, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
            let what = match std::fs::symlink_metadata(dir) {
                Ok(m) if m.file_type().is_symlink() => "is a symbolic link",
                _ => "is not a directory",
            };
            return Err(refused(what.into()));
        }
        Err(e) => return Err(io(e.into())),
    };
    let stat = fstat(&fd).map_err(|e| io(e.into()))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        return Err(refused("is not a directory".into()));
    }
    let me = rustix::process::geteuid().as_raw();
    if stat.st_uid != me {
        return Err(refused(format!(
            "is owned by uid {}, not by this user (uid {me})",
            stat.st_uid
        )));
    }
    let mode = stat.st_mode & 0o7777;
    if !created && mode & 0o022 != 0 {
        return Err(refused(format!(
            "is writable by {} (mode {mode:04o}); `chmod 700` it",
            if mode & 0o002 != 0 {
                "all users"
            } else {
                "its group"
            }
        )));
    }
    if mode != 0o700 {
        // Exactly 0700, whatever the umask took away or an earlier run left.
        fchmod(&fd, Mode::RWXU).map_err(|e| io(e.into()))?;
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    }

    fn problem(dir: &Path, if_exists: IfExists) -> String {
        match private_dir(dir, if_exists) {
            Err(PrivateDirError::Unsafe { path, problem }) => {
                assert_eq!(path, dir);
                problem
            }
            other => panic!("{}: {other:?}", dir.display()),
        }
    }

    #[test]
    fn a_new_directory_is_0700_whatever_the_umask_and_its_parents_are_made() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b/private");
        let old = rustix::process::umask(rustix::fs::Mode::empty());
        let made = private_dir(&dir, IfExists::Refuse);
        rustix::process::umask(old);
        made.unwrap();
        assert_eq!(mode(&dir), 0o700);
        // Made once: a second start that must make it refuses it.
        assert_eq!(problem(&dir, IfExists::Refuse), MADE_BY_SOMEONE_ELSE);
        private_dir(&dir, IfExists::Reuse).unwrap();
    }

    #[test]
    fn a_directory_already_there_is_refused_or_reused_only_as_this_users_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        // Someone made it first: refused, left as it was.
        assert_eq!(problem(&dir, IfExists::Refuse), MADE_BY_SOMEONE_ELSE);
        assert_eq!(mode(&dir), 0o777);
        // Writable by others: refused even as the run's own.
        assert_eq!(
            problem(&dir, IfExists::Reuse),
            "is writable by all users (mode 0777); `chmod 700` it"
        );
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert_eq!(
            problem(&dir, IfExists::Reuse),
            "is writable by its group (mode 0770); `chmod 700` it"
        );
        // Readable by others only: kept, and closed to them.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&dir, IfExists::Reuse).unwrap();
        assert_eq!(mode(&dir), 0o700);

        // A symbolic link is not followed, to a directory or elsewhere.
        let target = tmp.path().join("target");
        std::fs::create_dir(&target).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(problem(&link, IfExists::Refuse), MADE_BY_SOMEONE_ELSE);
        assert_eq!(problem(&link, IfExists::Reuse), "is a symbolic link");
        let file = tmp.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert_eq!(problem(&file, IfExists::Reuse), "is not a directory");

        // Another user's directory (only root can make one here).
        if rustix::process::geteuid().is_root() {
            let theirs = tmp.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            assert_eq!(
                problem(&theirs, IfExists::Reuse),
                "is owned by uid 65534, not by this user (uid 0)"
            );
        }
    }
}

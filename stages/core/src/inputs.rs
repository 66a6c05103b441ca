//! Finding tables among a stage's `--input` directories.
//!
//! Each `--input DIR` is either a table directory (it holds a
//! `_manifest.parquet`) or a dataset directory whose subdirectories are tables;
//! a stage asks for tables by name and gets an error that lists what the
//! inputs hold when one is missing or given twice. Hidden directories (a
//! writer's unfinished `.<table>.tmp-…`) are never tables.
//!
//! ```no_run
//! # use embodyflow_core::inputs::Inputs;
//! # use embodyflow_schemas::TableName;
//! # fn demo() -> embodyflow_core::Result<()> {
//! let inputs = Inputs::resolve(&["runs/it0/rollouts".into(), "data/train".into()])?;
//! let steps = inputs.table(TableName::Steps)?;          // error if absent
//! let teacher = inputs.optional(TableName::TeacherLogp)?; // None if absent
//! # let _ = (steps, teacher); Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use embodyflow_schemas::TableName;

use crate::dataset::TableReader;
use crate::error::{Error, Result};
use crate::manifest::{InputRef, Manifest, is_table_dir};

/// The tables found in a stage's inputs.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    found: BTreeMap<String, PathBuf>,
    searched: Vec<PathBuf>,
}

impl Inputs {
    /// Scans the input directories.
    pub fn resolve(dirs: &[PathBuf]) -> Result<Inputs> {
        let mut inputs = Inputs {
            found: BTreeMap::new(),
            searched: dirs.to_vec(),
        };
        for dir in dirs {
            if !dir.is_dir() {
                return Err(Error::BadInput(format!(
                    "--input {}: no such directory",
                    dir.display()
                )));
            }
            // An interrupted commit here is completed before anything is listed,
            // so a stage sees all the tables one run committed, or none.
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                crate::commit::settle(parent)?;
            }
            crate::commit::settle(dir)?;
            if is_table_dir(dir) {
                inputs.add(dir)?;
                continue;
            }
            let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|e| Error::io(dir, e))?
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.is_dir()
                        && !p
                            .file_name()
                            .is_some_and(|n| n.to_string_lossy().starts_with('.'))
                })
                .collect();
            entries.sort();
            for entry in entries {
                if is_table_dir(&entry) {
                    inputs.add(&entry)?;
                }
            }
        }
        Ok(inputs)
    }

    fn add(&mut self, dir: &Path) -> Result<()> {
        let manifest = Manifest::read(dir)?;
        if let Some(first) = self.found.get(&manifest.table) {
            return Err(Error::DuplicateTable {
                table: manifest.table,
                first: first.clone(),
                second: dir.to_path_buf(),
            });
        }
        self.found.insert(manifest.table, dir.to_path_buf());
        Ok(())
    }

    /// Whether `lineage` (the tables a run read, by path and content hash)
    /// is what these inputs hold now.
    pub fn hold(&self, lineage: &[InputRef]) -> Result<bool> {
        for input in lineage {
            if self.found.get(&input.table) != Some(&input.path)
                || Manifest::read(&input.path)?.content_hash != input.content_hash
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Opens table `table`, which must be present.
    pub fn table(&self, table: TableName) -> Result<TableReader> {
        self.optional(table)?.ok_or_else(|| Error::TableNotFound {
            table: table.to_string(),
            searched: self.describe(),
        })
    }

    /// Opens table `table` if an input holds it.
    pub fn optional(&self, table: TableName) -> Result<Option<TableReader>> {
        self.found
            .get(table.as_str())
            .map(|dir| TableReader::open(dir, table))
            .transpose()
    }

    /// What the inputs hold, for messages.
    pub fn describe(&self) -> String {
        let dirs: Vec<String> = self
            .searched
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        let tables: Vec<&str> = self.found.keys().map(String::as_str).collect();
        format!(
            "[{}], which hold [{}]",
            dirs.join(", "),
            if tables.is_empty() {
                "no tables".to_string()
            } else {
                tables.join(", ")
            }
        )
    }
}

//! Table definitions: the parsed schema files.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use serde::Deserialize;

use crate::types::parse_type;

/// Parquet key-value metadata key holding the table name of a shard.
pub const META_TABLE: &str = "embodyflow.table";
/// Parquet key-value metadata key holding the schema version of a shard.
pub const META_VERSION: &str = "embodyflow.schema_version";

macro_rules! tables {
    ($($variant:ident => $name:literal),* $(,)?) => {
        /// The tables of the data contract, one per file in `schemas/`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum TableName {
            $(
                #[doc = concat!("The `", $name, "` table (`schemas/", $name, ".toml`).")]
                $variant,
            )*
        }

        impl TableName {
            /// Every table, in pipeline order.
            pub const ALL: &'static [TableName] = &[$(TableName::$variant),*];

            /// The table's name, which is also its directory name in a dataset.
            pub fn as_str(self) -> &'static str {
                match self { $(TableName::$variant => $name),* }
            }

            fn source(self) -> &'static str {
                match self {
                    $(TableName::$variant => include_str!(concat!("../", $name, ".toml"))),*
                }
            }
        }
    };
}

tables! {
    Tasks => "tasks",
    Trajectories => "trajectories",
    Steps => "steps",
    Rewards => "rewards",
    TeacherLogp => "teacher_logp",
    StepGates => "step_gates",
    Advantages => "advantages",
    Metrics => "metrics",
    Eval => "eval",
}

impl TableName {
    /// The parsed definition of the table (parsed once per process).
    pub fn def(self) -> &'static TableDef {
        static DEFS: OnceLock<HashMap<TableName, TableDef>> = OnceLock::new();
        let defs = DEFS.get_or_init(|| {
            TableName::ALL
                .iter()
                .map(|&table| {
                    let def = TableDef::parse(table.source()).unwrap_or_else(|err| {
                        panic!(
                            "schemas/{}.toml embedded in this binary is invalid: {err}",
                            table.as_str()
                        )
                    });
                    (table, def)
                })
                .collect()
        });
        &defs[&self]
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not one of the tables.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown table `{name}`; the tables are: {}", TableName::ALL.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(", "))]
pub struct UnknownTable {
    /// The name given.
    pub name: String,
}

impl FromStr for TableName {
    type Err = UnknownTable;
    fn from_str(name: &str) -> Result<Self, UnknownTable> {
        TableName::ALL
            .iter()
            .copied()
            .find(|t| t.as_str() == name)
            .ok_or_else(|| UnknownTable {
                name: name.to_string(),
            })
    }
}

/// One column of a table.
#[derive(Debug, Clone)]
pub struct ColumnDef {
    /// Column name.
    pub name: String,
    /// Arrow type.
    pub data_type: DataType,
    /// Whether the column may hold nulls.
    pub nullable: bool,
    /// What the column means, with its unit.
    pub doc: String,
    /// For integer columns: the inclusive range of valid values (`range =
    /// [lo, hi]` in the schema file); readers and writers reject others.
    pub range: Option<[i64; 2]>,
}

/// A parsed schema file.
#[derive(Debug, Clone)]
pub struct TableDef {
    /// Table name.
    pub name: String,
    /// Schema version; readers accept only this version.
    pub version: u32,
    /// Columns that identify a row.
    pub key: Vec<String>,
    /// The columns in storage order.
    pub columns: Vec<ColumnDef>,
    schema: SchemaRef,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    table: String,
    version: u32,
    key: Vec<String>,
    columns: Vec<RawColumn>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawColumn {
    name: String,
    #[serde(rename = "type")]
    data_type: String,
    nullable: bool,
    doc: String,
    #[serde(default)]
    range: Option<[i64; 2]>,
}

impl TableDef {
    /// Parses the text of a schema file.
    pub fn parse(text: &str) -> Result<TableDef, String> {
        let raw: RawTable = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut columns = Vec::with_capacity(raw.columns.len());
        for column in raw.columns {
            let data_type = parse_type(&column.data_type)
                .map_err(|e| format!("column `{}`: {e}", column.name))?;
            if columns.iter().any(|c: &ColumnDef| c.name == column.name) {
                return Err(format!("column `{}` is defined twice", column.name));
            }
            if let Some([lo, hi]) = column.range {
                if !matches!(
                    data_type,
                    DataType::Int8 | DataType::Int32 | DataType::Int64
                ) || lo > hi
                {
                    return Err(format!(
                        "column `{}`: `range = [{lo}, {hi}]` needs an integer column and lo <= hi",
                        column.name
                    ));
                }
            }
            columns.push(ColumnDef {
                name: column.name,
                data_type,
                nullable: column.nullable,
                doc: column.doc,
                range: column.range,
            });
        }
        for key in &raw.key {
            if !columns.iter().any(|c| &c.name == key) {
                return Err(format!("key column `{key}` is not a column"));
            }
        }
        let fields: Vec<Field> = columns
            .iter()
            .map(|c| Field::new(c.name.as_str(), c.data_type.clone(), c.nullable))
            .collect();
        let metadata = HashMap::from([
            (META_TABLE.to_string(), raw.table.clone()),
            (META_VERSION.to_string(), raw.version.to_string()),
        ]);
        let schema = Arc::new(Schema::new_with_metadata(fields, metadata));
        Ok(TableDef {
            name: raw.table,
            version: raw.version,
            key: raw.key,
            columns,
            schema,
        })
    }

    /// The Arrow schema, with the table name and version in its metadata.
    pub fn arrow_schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The column called `name`, if any.
    pub fn column(&self, name: &str) -> Option<&ColumnDef> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The column names, in storage order.
    pub fn column_names(&self) -> Vec<&str> {
        self.columns.iter().map(|c| c.name.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_file_parses_and_names_its_own_table() {
        for &table in TableName::ALL {
            let def = table.def();
            assert_eq!(def.name, table.as_str());
            assert!(def.version >= 1);
            assert!(!def.key.is_empty());
            for column in &def.columns {
                assert!(
                    !column.doc.trim().is_empty(),
                    "{table}.{} has no doc",
                    column.name
                );
            }
        }
    }

    #[test]
    fn bad_files_are_rejected_with_the_column() {
        let text = "table='x'\nversion=1\nkey=['a']\n[[columns]]\nname='a'\ntype='list<float>'\nnullable=false\ndoc='d'\n";
        let err = TableDef::parse(text).unwrap_err();
        assert!(err.contains("column `a`") && err.contains("float"), "{err}");
        let text = "table='x'\nversion=1\nkey=['b']\n[[columns]]\nname='a'\ntype='f32'\nnullable=false\ndoc='d'\n";
        assert!(
            TableDef::parse(text)
                .unwrap_err()
                .contains("key column `b`")
        );
    }

    #[test]
    fn table_names_parse_and_list_the_valid_ones() {
        assert_eq!(
            "teacher_logp".parse::<TableName>().unwrap(),
            TableName::TeacherLogp
        );
        let err = "rollouts".parse::<TableName>().unwrap_err().to_string();
        assert!(
            err.contains("rollouts") && err.contains("trajectories"),
            "{err}"
        );
    }
}

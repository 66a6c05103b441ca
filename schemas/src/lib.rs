//! The data contract: the fixed, versioned Arrow schemas of every table the
//! stages exchange, built from the TOML files in `schemas/` (one per table,
//! embedded at compile time, so a binary always carries the contract it was
//! built with), plus one serde row struct per table for code that works row by
//! row.
//!
//! A schema file names the table, its version, its key columns and, for each
//! column, a type in a small grammar (`utf8`, `binary`, `bool`, `i8`, `i32`,
//! `i64`, `f32`, `f64`, `list<T>`, `struct<name:T, ...>`, `?` after a nested
//! type for a nullable one), its nullability and a doc line. The test
//! `rows_match_schema_files` fails when a row struct and its file drift apart.
//!
//! ```
//! use embodyflow_schemas::TableName;
//! let def = TableName::Rewards.def();
//! assert_eq!(def.version, 4);
//! let schema = def.arrow_schema();
//! let step_match = schema.field_with_name("step_match").unwrap();
//! assert_eq!(embodyflow_schemas::format_type(step_match.data_type()), "list<i8>");
//! ```

mod def;
mod rows;
mod split;
mod types;

pub use def::{ColumnDef, META_TABLE, META_VERSION, TableDef, TableName, UnknownTable};
pub use rows::*;
pub use split::{Split, UnknownSplit};
pub use types::{TypeParseError, format_type, parse_type};

//! The column type grammar of the schema files, parsed into Arrow types and
//! printed back (for error messages that say `expected list<f32>, found
//! list<f64>`).
//!
//! ```text
//! type   := scalar | "list<" type ">" | "struct<" field ("," field)* ">"
//! field  := name ":" type
//! scalar := utf8 | binary | bool | i8 | i32 | i64 | f32 | f64
//! ```
//! A `?` directly after a nested type (list item or struct field) makes it
//! nullable; list items are named `item`.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Fields};

/// A type string that does not follow the grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad column type `{input}`: {reason}")]
pub struct TypeParseError {
    /// The full type string.
    pub input: String,
    /// What was wrong.
    pub reason: String,
}

/// Parses a type string of the grammar into an Arrow type.
pub fn parse_type(input: &str) -> Result<DataType, TypeParseError> {
    let mut parser = Parser { input, rest: input };
    let data_type = parser.data_type()?;
    parser.skip_space();
    if !parser.rest.is_empty() {
        return Err(parser.error(format!("unexpected trailing text `{}`", parser.rest)));
    }
    Ok(data_type)
}

/// Prints an Arrow type in the grammar of the schema files (the inverse of
/// [`parse_type`]); types outside the grammar print in Arrow's own notation.
pub fn format_type(data_type: &DataType) -> String {
    match data_type {
        DataType::Utf8 => "utf8".into(),
        DataType::Binary => "binary".into(),
        DataType::Boolean => "bool".into(),
        DataType::Int8 => "i8".into(),
        DataType::Int32 => "i32".into(),
        DataType::Int64 => "i64".into(),
        DataType::Float32 => "f32".into(),
        DataType::Float64 => "f64".into(),
        DataType::List(item) => format!("list<{}>", format_nested(item)),
        DataType::Struct(fields) => {
            let parts: Vec<String> = fields
                .iter()
                .map(|f| format!("{}:{}", f.name(), format_nested(f)))
                .collect();
            format!("struct<{}>", parts.join(", "))
        }
        other => other.to_string(),
    }
}

fn format_nested(field: &Field) -> String {
    let base = format_type(field.data_type());
    if field.is_nullable() {
        format!("{base}?")
    } else {
        base
    }
}

struct Parser<'a> {
    input: &'a str,
    rest: &'a str,
}

impl Parser<'_> {
    fn error(&self, reason: String) -> TypeParseError {
        TypeParseError {
            input: self.input.to_string(),
            reason,
        }
    }

    fn skip_space(&mut self) {
        self.rest = self.rest.trim_start();
    }

    fn eat(&mut self, token: &str) -> bool {
        self.skip_space();
        if let Some(rest) = self.rest.strip_prefix(token) {
            self.rest = rest;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, token: &str) -> Result<(), TypeParseError> {
        if self.eat(token) {
            Ok(())
        } else {
            Err(self.error(format!("expected `{token}` at `{}`", self.rest)))
        }
    }

    fn identifier(&mut self) -> Result<&str, TypeParseError> {
        self.skip_space();
        let end = self
            .rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(self.rest.len());
        if end == 0 {
            return Err(self.error(format!("expected a name at `{}`", self.rest)));
        }
        let (name, rest) = self.rest.split_at(end);
        self.rest = rest;
        Ok(name)
    }

    fn data_type(&mut self) -> Result<DataType, TypeParseError> {
        let name = self.identifier()?.to_string();
        Ok(match name.as_str() {
            "utf8" => DataType::Utf8,
            "binary" => DataType::Binary,
            "bool" => DataType::Boolean,
            "i8" => DataType::Int8,
            "i32" => DataType::Int32,
            "i64" => DataType::Int64,
            "f32" => DataType::Float32,
            "f64" => DataType::Float64,
            "list" => {
                self.expect("<")?;
                let item = self.nested("item")?;
                self.expect(">")?;
                DataType::List(Arc::new(item))
            }
            "struct" => {
                self.expect("<")?;
                let mut fields = Vec::new();
                loop {
                    let field_name = self.identifier()?.to_string();
                    self.expect(":")?;
                    fields.push(self.nested(&field_name)?);
                    if !self.eat(",") {
                        break;
                    }
                }
                self.expect(">")?;
                DataType::Struct(Fields::from(fields))
            }
            other => return Err(self.error(format!("unknown type `{other}`"))),
        })
    }

    fn nested(&mut self, name: &str) -> Result<Field, TypeParseError> {
        let data_type = self.data_type()?;
        let nullable = self.eat("?");
        Ok(Field::new(name, data_type, nullable))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_form() {
        for text in [
            "utf8",
            "list<f32>",
            "list<i8?>",
            "list<struct<action_id:i64?, action_name:utf8>>",
            "struct<a:list<bool>, b:f64?>",
        ] {
            assert_eq!(format_type(&parse_type(text).unwrap()), text);
        }
    }

    #[test]
    fn rejects_bad_types_with_the_reason() {
        let err = parse_type("list<float>").unwrap_err();
        assert!(err.to_string().contains("unknown type `float`"), "{err}");
        let err = parse_type("list<f32").unwrap_err();
        assert!(err.to_string().contains("expected `>`"), "{err}");
        let err = parse_type("f32 junk").unwrap_err();
        assert!(err.to_string().contains("trailing"), "{err}");
    }
}

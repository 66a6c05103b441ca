//! A small JSON parser that records where every value sits in the text.
//!
//! Step rewards must land on the tokens of one plan step's `action_id` or
//! `action_name`, and names repeat (in `language_plan`, in other steps), so a
//! text search cannot find them: the parser walks the JSON and keeps each
//! value's byte span. It accepts standard JSON (RFC 8259) and reports the byte
//! offset of the first error; it never panics on any input.
//!
//! ```
//! use embodyflow_algos::json_spans::{parse, Json};
//! let text = r#"{"a": [1, "x\"y"]}"#;
//! let value = parse(text).unwrap();
//! let Json::Array(items) = &value.get("a").unwrap().json else { panic!() };
//! assert_eq!(&text[items[1].span.clone()], r#""x\"y""#);
//! assert_eq!(items[1].json, Json::String("x\"y".into()));
//! ```

use std::ops::Range;

/// A JSON value with its byte span in the parsed text.
#[derive(Debug, Clone, PartialEq)]
pub struct Spanned {
    /// The value.
    pub json: Json,
    /// Its bytes in the text (strings include their quotes).
    pub span: Range<usize>,
}

/// A JSON value.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A number, as written.
    Number(String),
    /// A string, unescaped.
    String(String),
    /// An array.
    Array(Vec<Spanned>),
    /// An object: keys with their values, in order (duplicates kept).
    Object(Vec<(String, Spanned)>),
}

impl Spanned {
    /// The first value of key `key` when this is an object.
    pub fn get(&self, key: &str) -> Option<&Spanned> {
        match &self.json {
            Json::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Where and why parsing stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid JSON at byte {offset}: {reason}")]
pub struct JsonError {
    /// Byte offset of the problem.
    pub offset: usize,
    /// What was expected.
    pub reason: &'static str,
}

/// Parses `text`, which must hold one JSON value and nothing but white space.
pub fn parse(text: &str) -> Result<Spanned, JsonError> {
    let mut parser = Parser {
        bytes: text.as_bytes(),
        text,
        pos: 0,
        depth: 0,
    };
    let value = parser.value()?;
    parser.skip_ws();
    if parser.pos != text.len() {
        return Err(parser.error("trailing characters after the value"));
    }
    Ok(value)
}

/// Parses one JSON value starting at byte `start` of `text` and returns it with
/// the offset just past it (spans are offsets in `text`).
pub fn parse_prefix(text: &str, start: usize) -> Result<(Spanned, usize), JsonError> {
    let mut parser = Parser {
        bytes: text.as_bytes(),
        text,
        pos: start,
        depth: 0,
    };
    let value = parser.value()?;
    Ok((value, parser.pos))
}

const MAX_DEPTH: usize = 128;

struct Parser<'a> {
    bytes: &'a [u8],
    text: &'a str,
    pos: usize,
    depth: usize,
}

impl Parser<'_> {
    fn error(&self, reason: &'static str) -> JsonError {
        JsonError {
            offset: self.pos,
            reason,
        }
    }

    fn skip_ws(&mut self) {
        while self.pos < self.bytes.len()
            && matches!(self.bytes[self.pos], b' ' | b'\t' | b'\n' | b'\r')
        {
            self.pos += 1;
        }
    }

    fn value(&mut self) -> Result<Spanned, JsonError> {
        self.skip_ws();
        let start = self.pos;
        let json = match self.bytes.get(self.pos) {
            None => return Err(self.error("unexpected end of text")),
            Some(b'{') => self.object()?,
            Some(b'[') => self.array()?,
            Some(b'"') => Json::String(self.string()?),
            Some(b't') => self.literal("true", Json::Bool(true))?,
            Some(b'f') => self.literal("false", Json::Bool(false))?,
            Some(b'n') => self.literal("null", Json::Null)?,
            Some(b'-' | b'0'..=b'9') => self.number()?,
            Some(_) => return Err(self.error("expected a value")),
        };
        Ok(Spanned {
            json,
            span: start..self.pos,
        })
    }

    fn literal(&mut self, word: &'static str, json: Json) -> Result<Json, JsonError> {
        if self.bytes[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(json)
        } else {
            Err(self.error("expected true, false or null"))
        }
    }

    fn number(&mut self) -> Result<Json, JsonError> {
        let start = self.pos;
        if self.bytes[self.pos] == b'-' {
            self.pos += 1;
        }
        let digits = |p: &mut Self| {
            let s = p.pos;
            while p.pos < p.bytes.len() && p.bytes[p.pos].is_ascii_digit() {
                p.pos += 1;
            }
            p.pos > s
        };
        if !digits(self) {
            return Err(self.error("expected digits"));
        }
        if self.bytes.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            if !digits(self) {
                return Err(self.error("expected digits after the decimal point"));
            }
        }
        if matches!(self.bytes.get(self.pos), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.bytes.get(self.pos), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if !digits(self) {
                return Err(self.error("expected exponent digits"));
            }
        }
        Ok(Json::Number(self.text[start..self.pos].to_string()))
    }

    fn string(&mut self) -> Result<String, JsonError> {
        self.pos += 1; // opening quote
        let mut out = String::new();
        loop {
            let Some(&byte) = self.bytes.get(self.pos) else {
                return Err(self.error("unterminated string"));
            };
            match byte {
                b'"' => {
                    self.pos += 1;
                    return Ok(out);
                }
                b'\\' => {
                    let Some(&escape) = self.bytes.get(self.pos + 1) else {
                        return Err(self.error("unterminated escape"));
                    };
                    self.pos += 2;
                    match escape {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let unit = self.hex4()?;
                            let code = if (0xD800..0xDC00).contains(&unit)
                                && self.bytes[self.pos..].starts_with(b"\\u")
                            {
                                self.pos += 2;
                                let low = self.hex4()?;
                                0x10000
                                    + ((unit - 0xD800) << 10)
                                    + (low.wrapping_sub(0xDC00) & 0x3FF)
                            } else {
                                unit
                            };
                            out.push(char::from_u32(code).unwrap_or('\u{FFFD}'));
                        }
                        _ => return Err(self.error("invalid escape")),
                    }
                }
                0..=0x1F => return Err(self.error("control character in string")),
                _ => {
                    // Copy one UTF-8 character (the text is valid UTF-8).
                    let ch = self.text[self.pos..].chars().next().expect("in bounds");
                    out.push(ch);
                    self.pos += ch.len_utf8();
                }
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let digits = self
            .text
            .get(self.pos..self.pos + 4)
            .ok_or_else(|| self.error("short \\u escape"))?;
        let value = u32::from_str_radix(digits, 16).map_err(|_| self.error("bad \\u escape"))?;
        self.pos += 4;
        Ok(value)
    }

    fn enter(&mut self) -> Result<(), JsonError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            Err(self.error("nested too deeply"))
        } else {
            Ok(())
        }
    }

    fn array(&mut self) -> Result<Json, JsonError> {
        self.enter()?;
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.bytes.get(self.pos) == Some(&b']') {
            self.pos += 1;
            self.depth -= 1;
            return Ok(Json::Array(items));
        }
        loop {
            items.push(self.value()?);
            self.skip_ws();
            match self.bytes.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    self.depth -= 1;
                    return Ok(Json::Array(items));
                }
                _ => return Err(self.error("expected , or ] in array")),
            }
        }
    }

    fn object(&mut self) -> Result<Json, JsonError> {
        self.enter()?;
        self.pos += 1;
        let mut members = Vec::new();
        self.skip_ws();
        if self.bytes.get(self.pos) == Some(&b'}') {
            self.pos += 1;
            self.depth -= 1;
            return Ok(Json::Object(members));
        }
        loop {
            self.skip_ws();
            if self.bytes.get(self.pos) != Some(&b'"') {
                return Err(self.error("expected a string key"));
            }
            let key = self.string()?;
            self.skip_ws();
            if self.bytes.get(self.pos) != Some(&b':') {
                return Err(self.error("expected : after key"));
            }
            self.pos += 1;
            members.push((key, self.value()?));
            self.skip_ws();
            match self.bytes.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    self.depth -= 1;
                    return Ok(Json::Object(members));
                }
                _ => return Err(self.error("expected , or } in object")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn spans_point_at_values() {
        let text = r#" {"executable_plan": [{"action_name": "find a Mug", "action_id": 12}], "n": -1.5e3} "#;
        let value = parse(text).unwrap();
        let plan = value.get("executable_plan").unwrap();
        let Json::Array(steps) = &plan.json else {
            panic!()
        };
        assert_eq!(&text[steps[0].get("action_id").unwrap().span.clone()], "12");
        assert_eq!(
            &text[steps[0].get("action_name").unwrap().span.clone()],
            "\"find a Mug\""
        );
        assert_eq!(value.get("n").unwrap().json, Json::Number("-1.5e3".into()));
    }

    #[test]
    fn escapes_and_unicode() {
        let value = parse(r#""a\u00e9\ud83d\ude00\n😀""#).unwrap();
        assert_eq!(value.json, Json::String("aé😀\n😀".into()));
    }

    #[test]
    fn errors_carry_the_offset() {
        assert_eq!(parse("{\"a\": }").unwrap_err().offset, 6);
        assert!(parse("[1, 2").is_err());
        assert!(parse("{} x").is_err());
        assert!(parse(&"[".repeat(500)).is_err());
    }

    proptest! {
        #[test]
        fn never_panics(text in "\\PC{0,64}") {
            let _ = parse(&text);
        }

        #[test]
        fn agrees_with_serde_json_on_validity(text in "[\\[\\]{}\",:0-9a-z\\\\ ]{0,24}") {
            prop_assert_eq!(parse(&text).is_ok(), serde_json::from_str::<serde_json::Value>(&text).is_ok(), "{}", text);
        }
    }
}

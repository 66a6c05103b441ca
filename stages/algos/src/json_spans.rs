//! A small JSON parser that records where every value sits in the text.
//!
//! Step rewards must land on the tokens of one plan step's `action_id` or
//! `action_name`, and names repeat (in `language_plan`, in other steps), so a
//! text search cannot find them: the parser walks the JSON and keeps each
//! value's byte span. It reports the byte offset of the first error and never
//! panics on any input.
//!
//! It reads what Python's `json.loads` reads (the Embodied-R1 reference reward
//! parses with it), which is RFC 8259 JSON plus:
//! - `NaN`, `Infinity` and `-Infinity` are numbers;
//! - an unpaired UTF-16 surrogate escape (`"\ud800"`) is kept by Python; here
//!   the string becomes [`Json::StringWithSurrogates`], with U+FFFD in its
//!   place, so that it equals no text (as the Python string equals no valid
//!   text);
//! - an integer literal of more than 4 300 digits is an error (Python's
//!   `int` conversion limit, since 3.11 and 3.10.7);
//! - of duplicated keys the last counts ([`Spanned::get`]), as in a dict;
//! - nesting deeper than [`MAX_DEPTH`] is an error: Python raises
//!   `RecursionError` near its recursion limit of 1 000 (at 994 levels when
//!   called from module level with 3.11, one level fewer per caller frame), so
//!   the exact depth depends on the caller; no real answer comes near it.
//!
//! ```
//! use embodyflow_algos::json_spans::{parse, Json};
//! let text = r#"{"a": [1, "x\"y"], "a": [NaN]}"#;
//! let value = parse(text).unwrap();
//! let Json::Array(items) = &value.get("a").unwrap().json else { panic!() };
//! assert_eq!(items[0].json, Json::Number("NaN".into()));
//! let first = value.members().unwrap()[0].1.clone();
//! let Json::Array(items) = &first.json else { panic!() };
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
    /// A number, as written (`NaN`, `Infinity` and `-Infinity` included).
    Number(String),
    /// A string, unescaped.
    String(String),
    /// A string with an unpaired surrogate escape, unescaped with U+FFFD in
    /// place of each unpaired surrogate. Python keeps the surrogate, so the
    /// string equals no valid text: compare it with nothing.
    StringWithSurrogates(String),
    /// An array.
    Array(Vec<Spanned>),
    /// An object: keys with their values, in order (duplicates kept).
    Object(Vec<(String, Spanned)>),
}

impl Json {
    /// Whether this is a JSON integer literal (no fraction, no exponent), of
    /// any size: Python's `json.loads` gives an `int`.
    pub fn is_integer(&self) -> bool {
        matches!(self, Json::Number(n) if !n.contains(['.', 'e', 'E', 'N', 'I']))
    }
}

impl Spanned {
    /// The value of key `key` when this is an object; of duplicated keys the
    /// last, as Python's `json.loads` keeps it.
    pub fn get(&self, key: &str) -> Option<&Spanned> {
        self.members()?
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// The members when this is an object.
    pub fn members(&self) -> Option<&[(String, Spanned)]> {
        match &self.json {
            Json::Object(members) => Some(members),
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
    let mut parser = Parser::new(text, 0);
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
    let mut parser = Parser::new(text, start);
    let value = parser.value()?;
    Ok((value, parser.pos))
}

/// Deepest nesting of arrays and objects accepted (see the module doc).
pub const MAX_DEPTH: usize = 990;

/// Python's limit on the digits of an integer literal.
const MAX_INT_DIGITS: usize = 4300;

struct Parser<'a> {
    bytes: &'a [u8],
    text: &'a str,
    pos: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str, pos: usize) -> Parser<'a> {
        Parser {
            bytes: text.as_bytes(),
            text,
            pos,
            depth: 0,
        }
    }

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
            Some(b'"') => {
                let mut out = String::new();
                if self.string(Some(&mut out))? {
                    Json::StringWithSurrogates(out)
                } else {
                    Json::String(out)
                }
            }
            Some(_) => self.scalar()?,
        };
        Ok(Spanned {
            json,
            span: start..self.pos,
        })
    }

    /// A literal or a number.
    fn scalar(&mut self) -> Result<Json, JsonError> {
        let start = self.pos;
        let (word, json) = match self.bytes[start] {
            b't' => ("true", Some(Json::Bool(true))),
            b'f' => ("false", Some(Json::Bool(false))),
            b'n' => ("null", Some(Json::Null)),
            b'N' => ("NaN", None),
            b'I' => ("Infinity", None),
            b'-' if self.bytes[start..].starts_with(b"-Infinity") => ("-Infinity", None),
            b'-' | b'0'..=b'9' => {
                self.number()?;
                return Ok(Json::Number(self.text[start..self.pos].to_string()));
            }
            _ => return Err(self.error("expected a value")),
        };
        self.literal(word)?;
        Ok(json.unwrap_or_else(|| Json::Number(word.to_string())))
    }

    fn literal(&mut self, word: &'static str) -> Result<(), JsonError> {
        if self.bytes[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(())
        } else {
            Err(self.error("expected a value"))
        }
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, as Python reads it.
    fn number(&mut self) -> Result<(), JsonError> {
        if self.bytes[self.pos] == b'-' {
            self.pos += 1;
        }
        let digits = |p: &mut Self| {
            let s = p.pos;
            while p.pos < p.bytes.len() && p.bytes[p.pos].is_ascii_digit() {
                p.pos += 1;
            }
            p.pos - s
        };
        let integer_start = self.pos;
        let integer_digits = match self.bytes.get(self.pos) {
            Some(b'0') => {
                self.pos += 1;
                1
            }
            Some(b'1'..=b'9') => digits(self),
            _ => return Err(self.error("expected digits")),
        };
        let mut integer = true;
        if self.bytes.get(self.pos) == Some(&b'.')
            && self.bytes.get(self.pos + 1).is_some_and(u8::is_ascii_digit)
        {
            self.pos += 1;
            digits(self);
            integer = false;
        }
        if matches!(self.bytes.get(self.pos), Some(b'e' | b'E')) {
            let sign = usize::from(matches!(self.bytes.get(self.pos + 1), Some(b'+' | b'-')));
            if self
                .bytes
                .get(self.pos + 1 + sign)
                .is_some_and(u8::is_ascii_digit)
            {
                self.pos += 1 + sign;
                digits(self);
                integer = false;
            }
        }
        if integer && integer_digits > MAX_INT_DIGITS {
            self.pos = integer_start;
            return Err(self.error("integer of more than 4300 digits"));
        }
        Ok(())
    }

    /// Reads a string (the opening quote at `pos`), unescaped into `out`
    /// when given; returns whether it held an unpaired surrogate escape.
    fn string(&mut self, mut out: Option<&mut String>) -> Result<bool, JsonError> {
        self.pos += 1; // opening quote
        let mut surrogates = false;
        loop {
            let Some(&byte) = self.bytes.get(self.pos) else {
                return Err(self.error("unterminated string"));
            };
            match byte {
                b'"' => {
                    self.pos += 1;
                    return Ok(surrogates);
                }
                b'\\' => {
                    let Some(&escape) = self.bytes.get(self.pos + 1) else {
                        return Err(self.error("unterminated escape"));
                    };
                    let ch = match escape {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let unit = self.hex4(self.pos + 2)?;
                            self.pos += 6;
                            let mut code = unit;
                            // A high surrogate pairs with a following `\uXXXX`
                            // low surrogate; any other `\uXXXX` stays for the
                            // next round (Python's scanstring).
                            if (0xD800..0xDC00).contains(&unit)
                                && self.bytes[self.pos..].starts_with(b"\\u")
                            {
                                let low = self.hex4(self.pos + 2)?;
                                if (0xDC00..0xE000).contains(&low) {
                                    self.pos += 6;
                                    code = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                                }
                            }
                            if let Some(out) = out.as_deref_mut() {
                                out.push(char::from_u32(code).unwrap_or('\u{FFFD}'));
                            }
                            surrogates |= (0xD800..0xE000).contains(&code);
                            continue;
                        }
                        _ => return Err(self.error("invalid escape")),
                    };
                    self.pos += 2;
                    if let Some(out) = out.as_deref_mut() {
                        out.push(ch);
                    }
                }
                0..=0x1F => return Err(self.error("control character in string")),
                _ => {
                    // Copy the run up to the next quote, backslash or control character.
                    let run = self.bytes[self.pos..]
                        .iter()
                        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
                        .map_or(self.bytes.len(), |i| self.pos + i);
                    if let Some(out) = out.as_deref_mut() {
                        out.push_str(&self.text[self.pos..run]);
                    }
                    self.pos = run;
                }
            }
        }
    }

    /// Four hex digits at `at` (exactly `[0-9a-fA-F]{4}`).
    fn hex4(&self, at: usize) -> Result<u32, JsonError> {
        match self.bytes.get(at..at + 4) {
            Some(digits) if digits.iter().all(u8::is_ascii_hexdigit) => {
                Ok(digits.iter().fold(0, |acc, &d| {
                    acc * 16 + (d as char).to_digit(16).unwrap_or(0)
                }))
            }
            _ => Err(JsonError {
                offset: at,
                reason: "invalid \\uXXXX escape",
            }),
        }
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
            let mut key = String::new();
            self.string(Some(&mut key))?;
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

    // Each expectation below is what Python 3.11's `json.loads` returns (or
    // raises) for the same text.

    #[test]
    fn python_numbers() {
        for (text, ok) in [
            ("NaN", true),
            ("Infinity", true),
            ("-Infinity", true),
            ("-NaN", false),  // "Expecting value"
            ("nan", false),   // case matters
            ("01", false),    // "Extra data": 0, then 1
            ("-01", false),   // -0, then 1
            ("1.", false),    // 1, then "."
            ("1.e5", false),  // 1, then ".e5"
            ("1e", false),    // 1, then "e"
            ("1e+", false),   // 1, then "e+"
            ("-", false),     // "Expecting value"
            ("-0", true),     // int 0
            ("1.0e+5", true), // float
            ("[1.5E-3]", true),
        ] {
            assert_eq!(parse(text).is_ok(), ok, "{text}");
        }
        assert_eq!(parse("NaN").unwrap().json, Json::Number("NaN".into()));
        assert!(parse("-0").unwrap().json.is_integer());
        assert!(
            parse("123456789012345678901234567890")
                .unwrap()
                .json
                .is_integer()
        );
        for float in ["1.0", "1e2", "NaN", "-Infinity", "3E0"] {
            assert!(!parse(float).unwrap().json.is_integer(), "{float}");
        }
        // int(): at most 4300 digits (ValueError beyond); floats are not limited.
        let digits = "1".repeat(4300);
        assert!(parse(&digits).is_ok());
        assert!(parse(&format!("-{digits}")).is_ok());
        assert_eq!(
            parse(&format!("[{digits}1]")).unwrap_err(),
            JsonError {
                offset: 1,
                reason: "integer of more than 4300 digits"
            }
        );
        assert!(parse(&format!("{digits}1.0")).is_ok());
        assert!(parse(&format!("{digits}1e0")).is_ok());
    }

    #[test]
    fn python_surrogates_and_escapes() {
        let string = |text: &str| parse(text).map(|v| v.json);
        // '\ud800': kept unpaired.
        assert_eq!(
            string(r#""\ud800""#),
            Ok(Json::StringWithSurrogates("\u{FFFD}".into()))
        );
        assert_eq!(
            string(r#""\udc00x""#),
            Ok(Json::StringWithSurrogates("\u{FFFD}x".into()))
        );
        // '\ud800A': a non-low escape after a high surrogate is read on its own.
        assert_eq!(
            string(r#""\ud800\u0041""#),
            Ok(Json::StringWithSurrogates("\u{FFFD}A".into()))
        );
        // '\ud800\U0010fc00' for "\ud800\udbff\udc00".
        assert_eq!(
            string(r#""\ud800\udbff\udc00""#),
            Ok(Json::StringWithSurrogates("\u{FFFD}\u{10FC00}".into()))
        );
        assert_eq!(
            string(r#""\ud800\udc00""#),
            Ok(Json::String("\u{10000}".into()))
        );
        assert_eq!(
            string(r#""\uDBFF\uDFFF""#),
            Ok(Json::String("\u{10FFFF}".into()))
        );
        // "Invalid \uXXXX escape".
        for bad in [
            r#""\ud800\uzzzz""#,
            r#""\ud800\u12""#,
            r#""\u+123""#,
            r#""\u12""#,
            r#""\u-001""#,
        ] {
            assert!(string(bad).is_err(), "{bad}");
        }
        // DEL is not a control character for json; \x1f is.
        assert_eq!(string("\"\u{7f}\""), Ok(Json::String("\u{7f}".into())));
        assert!(string("\"\u{1f}\"").is_err());
        // Only space, tab, newline and carriage return separate tokens.
        assert!(parse(" \u{c}1").is_err());
        assert!(parse("1 \u{b}").is_err());
        assert!(parse("\u{feff}1").is_err());
    }

    #[test]
    fn duplicated_keys_keep_the_last() {
        // {'a': 2}
        let value = parse(r#"{"a": 1, "b": 0, "a": 2}"#).unwrap();
        assert_eq!(value.get("a").unwrap().json, Json::Number("2".into()));
        assert_eq!(value.members().unwrap().len(), 3);
    }

    #[test]
    fn nesting_up_to_the_limit() {
        let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert!(parse(&nested(MAX_DEPTH)).is_ok());
        assert!(parse(&nested(MAX_DEPTH + 1)).is_err());
        assert!(parse(&format!("{{\"a\": {}}}", nested(MAX_DEPTH - 1))).is_ok());
        assert!(parse(&format!("{{\"a\": {}}}", nested(MAX_DEPTH))).is_err());
    }

    proptest! {
        #[test]
        fn never_panics(text in "\\PC{0,64}") {
            let _ = parse(&text);
        }

        /// serde_json reads RFC 8259 as Python does, except for unpaired
        /// surrogates (it rejects them) and NaN/Infinity (upper case, outside
        /// this alphabet).
        #[test]
        fn agrees_with_serde_json_on_validity(text in "[\\[\\]{}\",:0-9a-z\\\\ .+-]{0,24}") {
            prop_assume!(!text.contains("\\ud"));
            prop_assert_eq!(parse(&text).is_ok(), serde_json::from_str::<serde_json::Value>(&text).is_ok(), "{}", text);
        }
    }
}

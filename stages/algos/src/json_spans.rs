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
//! [`Walker`] reads values from many starts (to find JSON inside prose) in
//! linear time overall, with the same grammar and no depth limit.
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
        self.skip_scalar()?;
        Ok(match &self.text[start..self.pos] {
            "true" => Json::Bool(true),
            "false" => Json::Bool(false),
            "null" => Json::Null,
            number => Json::Number(number.to_string()),
        })
    }

    /// Reads a literal or a number.
    fn skip_scalar(&mut self) -> Result<(), JsonError> {
        let word = match self.bytes[self.pos] {
            b't' => "true",
            b'f' => "false",
            b'n' => "null",
            b'N' => "NaN",
            b'I' => "Infinity",
            b'-' if self.bytes[self.pos..].starts_with(b"-Infinity") => "-Infinity",
            b'-' | b'0'..=b'9' => return self.number(),
            _ => return Err(self.error("expected a value")),
        };
        self.literal(word)
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

/// A container (`{…}` or `[…]`) that a [`Walker`] read to its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    /// Its bytes in the text.
    pub span: Range<usize>,
    /// An object (else an array).
    pub is_object: bool,
    /// Its nesting depth: 1 when it holds no container. [`parse_prefix`]
    /// from its start succeeds exactly when this is at most [`MAX_DEPTH`].
    pub depth: usize,
    /// Its members or items.
    pub len: usize,
    /// An object's watched keys: bit i when it has a member `watched[i]`.
    pub keys: u32,
    /// Bit i when the object's last member `watched[i]` holds an array.
    pub array_keys: u32,
    /// An array's: the union of `keys` over its items that are objects.
    pub item_keys: u32,
}

/// Reads the containers of a text from many starts in linear time overall,
/// to find the first that parses inside prose.
///
/// [`Walker::walk`] reads one value from a `{` or `[` with the grammar of
/// [`parse`] but without building it and without a depth limit (the stack is
/// on the heap), so the result at a position is the same whether the walk
/// starts there or reaches it inside another container. It reports every
/// container it closes and marks every container start it enters as
/// settled: a later start there would repeat the same walk, so callers skip
/// settled starts. Two walks cover the same bytes outside of strings only
/// when one entered the other's start, so over all starts each byte is read
/// at most twice (once as string content, once outside strings).
///
/// ```
/// use embodyflow_algos::json_spans::Walker;
/// let text = r#"say {"plan": [1, {"x": 2}] and [3]"#;
/// let mut walker = Walker::new(text, &["plan"]);
/// let mut closed = Vec::new();
/// for (start, _) in text.match_indices(['{', '[']) {
///     if !walker.is_settled(start) {
///         walker.walk(start, &mut |c| closed.push(&text[c.span.clone()]));
///     }
/// }
/// // The object fails at "and"; what it read inside was read once.
/// assert_eq!(closed, [r#"{"x": 2}"#, r#"[1, {"x": 2}]"#, "[3]"]);
/// ```
pub struct Walker<'a> {
    parser: Parser<'a>,
    watched: &'a [&'a str],
    settled: Vec<u64>,
    stack: Vec<Frame>,
    key: String,
}

struct Frame {
    found: Container,
    state: Expect,
    /// Watched-key bits of the member being read.
    member: u32,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A first member or item, or the closing bracket.
    First,
    /// A key.
    Key,
    /// A value.
    Value,
    /// A comma or the closing bracket.
    Next,
}

impl<'a> Walker<'a> {
    /// A walker over `text` that watches the object keys `watched` (at most 32).
    pub fn new(text: &'a str, watched: &'a [&'a str]) -> Walker<'a> {
        assert!(watched.len() <= 32, "at most 32 watched keys");
        Walker {
            parser: Parser::new(text, 0),
            watched,
            settled: vec![0; text.len() / 64 + 1],
            stack: Vec::new(),
            key: String::new(),
        }
    }

    /// Whether a walk already entered a container starting at `at`.
    pub fn is_settled(&self, at: usize) -> bool {
        self.settled
            .get(at / 64)
            .is_some_and(|word| word & (1 << (at % 64)) != 0)
    }

    /// Reads the value starting at `start` (a `{` or `[`; anything else
    /// reads nothing) to its end or its first error, calling `report` on
    /// every container it closes, innermost first.
    pub fn walk(&mut self, start: usize, report: &mut impl FnMut(&Container)) {
        if !matches!(self.parser.bytes.get(start), Some(b'{' | b'[')) {
            return;
        }
        self.parser.pos = start;
        self.open();
        while self.step(report) {}
        self.stack.clear();
    }

    fn open(&mut self) {
        let at = self.parser.pos;
        self.settled[at / 64] |= 1 << (at % 64);
        self.stack.push(Frame {
            found: Container {
                span: at..at,
                is_object: self.parser.bytes[at] == b'{',
                depth: 1,
                len: 0,
                keys: 0,
                array_keys: 0,
                item_keys: 0,
            },
            state: Expect::First,
            member: 0,
        });
        self.parser.pos += 1;
    }

    /// One token; false when the walk is over (closed or failed).
    fn step(&mut self, report: &mut impl FnMut(&Container)) -> bool {
        let parser = &mut self.parser;
        parser.skip_ws();
        let Some(top) = self.stack.last_mut() else {
            return false;
        };
        let close = if top.found.is_object { b'}' } else { b']' };
        let Some(&byte) = parser.bytes.get(parser.pos) else {
            return false;
        };
        match top.state {
            Expect::First if byte == close => return self.close(report),
            Expect::First | Expect::Key if top.found.is_object => {
                if byte != b'"' {
                    return false;
                }
                self.key.clear();
                if parser.string(Some(&mut self.key)).is_err() {
                    return false;
                }
                parser.skip_ws();
                if parser.bytes.get(parser.pos) != Some(&b':') {
                    return false;
                }
                parser.pos += 1;
                top.member = self
                    .watched
                    .iter()
                    .enumerate()
                    .filter(|(_, w)| **w == self.key)
                    .fold(0, |bits, (i, _)| bits | 1 << i);
                top.state = Expect::Value;
            }
            Expect::First | Expect::Key | Expect::Value => match byte {
                b'{' | b'[' => self.open(),
                b'"' => {
                    if parser.string(None).is_err() {
                        return false;
                    }
                    self.value_done(None);
                }
                _ => {
                    if parser.skip_scalar().is_err() {
                        return false;
                    }
                    self.value_done(None);
                }
            },
            Expect::Next if byte == b',' => {
                parser.pos += 1;
                top.state = if top.found.is_object {
                    Expect::Key
                } else {
                    Expect::Value
                };
            }
            Expect::Next if byte == close => return self.close(report),
            Expect::Next => return false,
        }
        true
    }

    fn close(&mut self, report: &mut impl FnMut(&Container)) -> bool {
        self.parser.pos += 1;
        let mut frame = self.stack.pop().expect("a container is open");
        frame.found.span.end = self.parser.pos;
        report(&frame.found);
        self.value_done(Some(&frame.found));
        !self.stack.is_empty()
    }

    /// Records a value read in the container on top (if any).
    fn value_done(&mut self, child: Option<&Container>) {
        let Some(top) = self.stack.last_mut() else {
            return;
        };
        let parent = &mut top.found;
        parent.len += 1;
        if parent.is_object {
            parent.keys |= top.member;
            if child.is_some_and(|c| !c.is_object) {
                parent.array_keys |= top.member;
            } else {
                parent.array_keys &= !top.member;
            }
        } else if let Some(c) = child.filter(|c| c.is_object) {
            parent.item_keys |= c.keys;
        }
        if let Some(c) = child {
            parent.depth = parent.depth.max(c.depth + 1);
        }
        top.state = Expect::Next;
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

    /// Every container the walks report, by start, over all `{`/`[` starts.
    fn walk_all(text: &str, watched: &[&str]) -> std::collections::BTreeMap<usize, Container> {
        let mut walker = Walker::new(text, watched);
        let mut found = std::collections::BTreeMap::new();
        for (start, _) in text.match_indices(['{', '[']) {
            if !walker.is_settled(start) {
                walker.walk(start, &mut |c| {
                    found.insert(c.span.start, c.clone());
                });
            }
        }
        found
    }

    #[test]
    fn walker_reports_depth_and_keys() {
        let text = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        let found = walk_all(&text, &[]);
        assert_eq!(found.len(), MAX_DEPTH + 1);
        assert_eq!(found[&0].depth, MAX_DEPTH + 1);
        assert!(parse_prefix(&text, 0).is_err());
        assert_eq!(found[&1].depth, MAX_DEPTH);
        assert!(parse_prefix(&text, 1).is_ok());
        let text = r#"{"a": [], "b": 1, "a": {}} [{"b": 2}, 3] {"a": [], "a": [1]}"#;
        let found = walk_all(text, &["a", "b"]);
        let object = &found[&0];
        assert_eq!(
            (object.len, object.keys, object.array_keys, object.depth),
            (3, 0b11, 0, 2)
        );
        let list = &found[&text.find("[{").unwrap()];
        assert_eq!((list.len, list.item_keys, list.is_object), (2, 0b10, false));
        let last = &found[&text.rfind('{').unwrap()];
        assert_eq!((last.keys, last.array_keys), (0b01, 0b01));
    }

    /// Pieces of JSON with stray quotes, brackets and prose.
    fn jsonish() -> impl Strategy<Value = String> {
        let piece = proptest::sample::select(vec![
            "{",
            "}",
            "[",
            "]",
            "\"",
            ",",
            ":",
            " ",
            "1",
            "-0",
            "1.5",
            "NaN",
            "\\",
            "x",
            "\"a\"",
            "\"a\": ",
            "\"b\": ",
            "null",
            "true",
            "\"\\ud800\"",
            "\"\\\"\"",
            "\u{e9}",
            "\n",
        ]);
        proptest::collection::vec(piece, 0..40).prop_map(|pieces| pieces.concat())
    }

    proptest! {
        /// Walks from every start report exactly the containers that
        /// parse_prefix reads, with their ends, sizes and keys.
        #[test]
        fn walker_agrees_with_parse_prefix(text in jsonish()) {
            let found = walk_all(&text, &["a", "b"]);
            for (start, _) in text.match_indices(['{', '[']) {
                match (parse_prefix(&text, start), found.get(&start)) {
                    (Err(_), None) => {}
                    (Ok((value, end)), Some(c)) => {
                        prop_assert_eq!(c.span.clone(), start..end);
                        let (len, is_object) = match &value.json {
                            Json::Object(m) => (m.len(), true),
                            Json::Array(items) => (items.len(), false),
                            _ => unreachable!("a container"),
                        };
                        prop_assert_eq!((c.len, c.is_object), (len, is_object));
                        let bits = |v: &Spanned, f: &dyn Fn(&Spanned) -> bool| {
                            ["a", "b"].iter().enumerate().filter(|(_, k)| v.get(k).is_some_and(f)).fold(0, |b, (i, _)| b | 1 << i)
                        };
                        prop_assert_eq!(c.keys, bits(&value, &|_| true));
                        prop_assert_eq!(c.array_keys, bits(&value, &|v| matches!(v.json, Json::Array(_))));
                        if let Json::Array(items) = &value.json {
                            prop_assert_eq!(c.item_keys, items.iter().fold(0, |b, i| b | bits(i, &|_| true)));
                        }
                    }
                    (parsed, walked) => prop_assert!(false, "{} at {}: parse {:?}, walk {:?}", text, start, parsed, walked),
                }
            }
        }

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

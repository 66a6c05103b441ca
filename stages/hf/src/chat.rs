//! A model's chat template rendered as transformers'
//! `tokenizer.apply_chat_template(messages, tools=..., tokenize=False,
//! add_generation_prompt=...)` renders it, with the Jinja engine
//! `minijinja`, not by hand.
//!
//! The template is `chat_template.jinja` when the directory has one (what
//! transformers 5 saves), else `tokenizer_config.json`'s `chat_template`
//! (a string, or a list of `{name, template}` of which `default` is used).
//! The environment is transformers' (`utils/chat_template_utils.py`):
//! `trim_blocks` and `lstrip_blocks`, loop controls, Python's string and
//! dict methods (`.strip()`, `.startswith()`, `.items()`, … through
//! minijinja-contrib's pycompat), `raise_exception(msg)` failing the render
//! with the template's message, and `tojson` as Python's
//! `json.dumps(x, ensure_ascii=False)` (`", "` and `": "` separators, no
//! HTML escaping; `indent=n` pretty-prints). The context is `messages`,
//! `tools` (or none), `documents` (none), `add_generation_prompt` and the
//! special tokens of `tokenizer_config.json` (`bos_token`, `eos_token`,
//! `pad_token`, `unk_token`), as transformers passes them.
//!
//! Limits: JSON objects in messages and tools keep serde_json's key order
//! (sorted), where Python keeps insertion order; `strftime_now` is not
//! defined (templates that test `strftime_now is defined` fall back to
//! their fixed date).
//!
//! ```no_run
//! use embodyflow_hf::chat::ChatTemplate;
//! let template = ChatTemplate::from_dir("Qwen2.5-0.5B-Instruct".as_ref()).unwrap();
//! let messages = serde_json::json!([{"role": "user", "content": "Put the cup in the sink."}]);
//! let prompt = template.render(&messages, None, true).unwrap();
//! assert!(prompt.ends_with("<|im_start|>assistant\n"));
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

use crate::HfError;

/// The name the template is registered under (no extension: no
/// autoescaping, as transformers' environment).
const NAME: &str = "chat_template";

/// A compiled chat template with the tokenizer's special tokens.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    special_tokens: BTreeMap<String, String>,
    /// The file the template came from, for errors.
    file: PathBuf,
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<String, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let result = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let mut ser = serde_json::Serializer::with_formatter(
                &mut out,
                serde_json::ser::PrettyFormatter::with_indent(&pad),
            );
            value.serialize(&mut ser)
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(
            &mut out, Spaced,
        )),
    };
    result.map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))?;
    String::from_utf8(out).map_err(|e| Error::new(ErrorKind::BadSerialization, e.to_string()))
}

/// Python's default separators: `", "` between items, `": "` after keys.
struct Spaced;

impl serde_json::ser::Formatter for Spaced {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// A special token as `tokenizer_config.json` writes it: a string or an
/// AddedToken object `{"content": ...}`.
fn token_text(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o
            .get("content")
            .and_then(|c| c.as_str())
            .map(str::to_string),
        _ => None,
    }
}

impl ChatTemplate {
    /// The template of a model directory (see the module doc for where it
    /// is looked up) with its special tokens.
    pub fn from_dir(dir: &Path) -> Result<ChatTemplate, HfError> {
        let config_file = dir.join("tokenizer_config.json");
        let config: serde_json::Map<String, serde_json::Value> = if config_file.is_file() {
            let text = std::fs::read_to_string(&config_file).map_err(|source| HfError::Read {
                file: config_file.clone(),
                source,
            })?;
            serde_json::from_str(&text).map_err(|e| HfError::BadConfig {
                file: config_file.clone(),
                reason: e.to_string(),
            })?
        } else {
            serde_json::Map::new()
        };
        let jinja = dir.join("chat_template.jinja");
        let (source, file) = if jinja.is_file() {
            let text = std::fs::read_to_string(&jinja).map_err(|source| HfError::Read {
                file: jinja.clone(),
                source,
            })?;
            (text, jinja)
        } else {
            let bad = |reason: String| HfError::BadConfig {
                file: config_file.clone(),
                reason,
            };
            let text = match config.get("chat_template") {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(serde_json::Value::Array(named)) => named
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str().map(str::to_string))
                    .ok_or_else(|| {
                        bad("`chat_template` lists no template named \"default\"".into())
                    })?,
                Some(other) => {
                    return Err(bad(format!(
                        "`chat_template` is {other}, expected a string"
                    )));
                }
                None => {
                    return Err(HfError::NoChatTemplate {
                        dir: dir.to_path_buf(),
                    });
                }
            };
            (text, config_file.clone())
        };
        let special_tokens = ["bos_token", "eos_token", "pad_token", "unk_token"]
            .into_iter()
            .filter_map(|key| Some((key.to_string(), token_text(config.get(key)?)?)))
            .collect();
        ChatTemplate::new(source, special_tokens, file)
    }

    /// Compiles `source`; `file` names it in errors.
    pub fn new(
        source: String,
        special_tokens: BTreeMap<String, String>,
        file: PathBuf,
    ) -> Result<ChatTemplate, HfError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(NAME, source)
            .map_err(|e| HfError::BadChatTemplate {
                file: file.clone(),
                reason: format!("{e:#}"),
            })?;
        Ok(ChatTemplate {
            env,
            special_tokens,
            file,
        })
    }

    /// The text of `messages` (a JSON list of `{role, content, ...}`), with
    /// `tools` (a JSON list of tool schemas) when given, ending with the
    /// assistant's turn header when `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, HfError> {
        let mut context: BTreeMap<String, Value> = self
            .special_tokens
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        context.insert("messages".into(), Value::from_serialize(messages));
        context.insert(
            "tools".into(),
            tools.map_or(Value::from(()), Value::from_serialize),
        );
        context.insert("documents".into(), Value::from(()));
        context.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| HfError::BadChatTemplate {
                file: self.file.clone(),
                reason: e.to_string(),
            })?;
        template
            .render(context)
            .map_err(|e| HfError::BadChatTemplate {
                file: self.file.clone(),
                reason: format!("{e:#}"),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(source: &str) -> ChatTemplate {
        let special = BTreeMap::from([("eos_token".to_string(), "</s>".to_string())]);
        ChatTemplate::new(source.to_string(), special, "t.jinja".into()).unwrap()
    }

    #[test]
    fn trim_and_lstrip_blocks_as_transformers() {
        // With trim_blocks the newline after a block tag goes, with
        // lstrip_blocks the indentation before it.
        let t = template(
            "{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content }}]\n  {% endif %}\n{% endfor %}{{ eos_token }}",
        );
        let text = t
            .render(
                &json!([{"role": "user", "content": "a"}, {"role": "x", "content": "b"}]),
                None,
                false,
            )
            .unwrap();
        assert_eq!(text, "[a]\n</s>");
    }

    #[test]
    fn tojson_as_python_json_dumps() {
        let t = template("{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}");
        let text = t
            .render(&json!([{"b": [1, 2], "a": "<é>"}]), None, false)
            .unwrap();
        assert_eq!(
            text,
            "{\"a\": \"<é>\", \"b\": [1, 2]}|{\n  \"a\": \"<é>\",\n  \"b\": [\n    1,\n    2\n  ]\n}"
        );
    }

    #[test]
    fn python_methods_and_raise_exception() {
        let t = template(
            "{{ messages[0].content.strip().split(',')[1] }}{% if messages[0].content.startswith(' x') %}!{% endif %}",
        );
        assert_eq!(
            t.render(&json!([{"content": " x,y "}]), None, false)
                .unwrap(),
            "y!"
        );
        let t = template("{{ raise_exception('roles must alternate') }}");
        let err = t.render(&json!([]), None, false).unwrap_err().to_string();
        assert!(
            err.contains("t.jinja") && err.contains("roles must alternate"),
            "{err}"
        );
    }

    #[test]
    fn template_from_tokenizer_config_with_added_token_objects() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            json!({
                "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}"}],
                "bos_token": {"content": "<s>", "lstrip": false},
            })
            .to_string(),
        )
        .unwrap();
        let t = ChatTemplate::from_dir(dir.path()).unwrap();
        assert_eq!(
            t.render(&json!([{"content": "hi"}]), None, true).unwrap(),
            "<s>hi"
        );
        std::fs::write(dir.path().join("tokenizer_config.json"), "{}").unwrap();
        let err = ChatTemplate::from_dir(dir.path()).unwrap_err();
        assert!(matches!(err, HfError::NoChatTemplate { .. }), "{err}");
        std::fs::write(dir.path().join("chat_template.jinja"), "{% if %}").unwrap();
        let err = ChatTemplate::from_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains("chat_template.jinja"), "{err}");
    }
}

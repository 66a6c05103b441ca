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
//! Every render first aliases reasoning as transformers does
//! (`_alias_reasoning_fields`): a message with `reasoning_content`,
//! `thinking` or `reasoning` gets the first of them as `reasoning_content`,
//! and as `thinking` when it has none.
//!
//! [`ChatTemplate::render_prompt_completion`] renders a prompt-completion
//! example as TRL does (`trl/data_utils.py`, `apply_chat_template`, read at
//! huggingface/trl commit f2cd5771, 2026-07-24): the prompt with
//! `add_generation_prompt=True` when its last message is from `user` or
//! `tool`, or continuing its final message (`continue_final_message=True`)
//! when it is from `assistant`; then prompt + completion rendered whole; the
//! prompt becomes the common prefix of the two renderings (DeepSeek-R1's
//! generation prompt differs) and the completion the rest of the whole.
//!
//! This crate has no libtorch: the `table` tool renders conversational
//! rollouts with it, and `embodyflow-hf` re-exports it as
//! `embodyflow_hf::chat`.
//!
//! Limits: JSON objects in messages and tools keep serde_json's key order
//! (sorted), where Python keeps insertion order; `strftime_now` is not
//! defined (templates that test `strftime_now is defined` fall back to
//! their fixed date).
//!
//! ```no_run
//! use embodyflow_chat::ChatTemplate;
//! let template = ChatTemplate::from_dir("Qwen2.5-0.5B-Instruct".as_ref()).unwrap();
//! let messages = serde_json::json!([{"role": "user", "content": "Put the cup in the sink."}]);
//! let prompt = template.render(&messages, None, true).unwrap();
//! assert!(prompt.ends_with("<|im_start|>assistant\n"));
//! let completion = serde_json::json!([{"role": "assistant", "content": "Done."}]);
//! let (prompt, completion) = template.render_prompt_completion(&messages, &completion, None, None).unwrap();
//! assert_eq!(completion, "Done.<|im_end|>\n");
//! ```

#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use embodyflow_core::{Classify, ErrorKind as ExitKind};
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

/// Templates that cannot be found, read, compiled or rendered; all are bad
/// input.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// A file that cannot be read.
    #[error("{file}: {source}")]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A `tokenizer_config.json` that is not JSON or whose `chat_template`
    /// is not a template.
    #[error("{file}: {reason}")]
    BadConfig {
        /// The config file.
        file: PathBuf,
        /// What was wrong, naming the key.
        reason: String,
    },
    /// A model directory without a chat template.
    #[error("{dir}: no chat_template.jinja and no `chat_template` in tokenizer_config.json")]
    NoChatTemplate {
        /// The model directory.
        dir: PathBuf,
    },
    /// A chat template that does not compile or fails to render (its own
    /// `raise_exception` included).
    #[error("{file}: chat template: {reason}")]
    BadChatTemplate {
        /// The file holding the template.
        file: PathBuf,
        /// The engine's message.
        reason: String,
    },
    /// Messages the template cannot be applied to as asked (transformers'
    /// and TRL's `ValueError`s).
    #[error("{file}: {reason}")]
    BadMessages {
        /// The file holding the template.
        file: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

impl Classify for ChatError {
    fn kind(&self) -> ExitKind {
        ExitKind::BadInput
    }
}

/// transformers' marker appended to the final message it continues.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// The reasoning fields transformers aliases (`_REASONING_FIELDS`).
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// transformers' `_alias_reasoning_fields`: `{"thinking": r, **message,
/// "reasoning_content": r}` for the first non-null reasoning field `r`.
fn alias_reasoning(messages: &serde_json::Value) -> serde_json::Value {
    let mut messages = messages.clone();
    if let Some(list) = messages.as_array_mut() {
        for message in list.iter_mut().filter_map(|m| m.as_object_mut()) {
            let reasoning = REASONING_FIELDS
                .iter()
                .find_map(|k| message.get(*k).filter(|v| !v.is_null()).cloned());
            if let Some(r) = reasoning {
                message.entry("thinking").or_insert_with(|| r.clone());
                message.insert("reasoning_content".into(), r);
            }
        }
    }
    messages
}

/// The name the template is registered under (no extension: no
/// autoescaping, as transformers' environment).
const NAME: &str = "chat_template";

/// A compiled chat template with the tokenizer's special tokens.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template's text (transformers checks it names the field it continues).
    source: String,
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
    pub fn from_dir(dir: &Path) -> Result<ChatTemplate, ChatError> {
        let config_file = dir.join("tokenizer_config.json");
        let config: serde_json::Map<String, serde_json::Value> = if config_file.is_file() {
            let text = std::fs::read_to_string(&config_file).map_err(|source| ChatError::Read {
                file: config_file.clone(),
                source,
            })?;
            serde_json::from_str(&text).map_err(|e| ChatError::BadConfig {
                file: config_file.clone(),
                reason: e.to_string(),
            })?
        } else {
            serde_json::Map::new()
        };
        let jinja = dir.join("chat_template.jinja");
        let (source, file) = if jinja.is_file() {
            let text = std::fs::read_to_string(&jinja).map_err(|source| ChatError::Read {
                file: jinja.clone(),
                source,
            })?;
            (text, jinja)
        } else {
            let bad = |reason: String| ChatError::BadConfig {
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
                    return Err(ChatError::NoChatTemplate {
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
    ) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(NAME, source.clone())
            .map_err(|e| ChatError::BadChatTemplate {
                file: file.clone(),
                reason: format!("{e:#}"),
            })?;
        Ok(ChatTemplate {
            env,
            source,
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
    ) -> Result<String, ChatError> {
        self.render_with(messages, tools, add_generation_prompt, None)
    }

    /// [`ChatTemplate::render`] with extra template variables (`kwargs`,
    /// transformers' `**kwargs` of `apply_chat_template`, TRL's per-example
    /// `chat_template_kwargs`); they override the special tokens of the same
    /// name, as in transformers.
    pub fn render_with(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String, ChatError> {
        let mut context: BTreeMap<String, Value> = self
            .special_tokens
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        for (key, value) in kwargs.into_iter().flatten() {
            context.insert(key.clone(), Value::from_serialize(value));
        }
        context.insert(
            "messages".into(),
            Value::from_serialize(alias_reasoning(messages)),
        );
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
            .map_err(|e| ChatError::BadChatTemplate {
                file: self.file.clone(),
                reason: e.to_string(),
            })?;
        template
            .render(context)
            .map_err(|e| ChatError::BadChatTemplate {
                file: self.file.clone(),
                reason: format!("{e:#}"),
            })
    }

    fn bad_messages(&self, reason: impl Into<String>) -> ChatError {
        ChatError::BadMessages {
            file: self.file.clone(),
            reason: reason.into(),
        }
    }

    /// transformers' `apply_chat_template(messages, continue_final_message=True)`
    /// for a final message with string `content`: rendered without the
    /// generation prompt and cut right after the final message's text, so
    /// generation continues it.
    pub fn render_continuing(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String, ChatError> {
        let mut chat = messages.clone();
        let Some(last) = chat.as_array_mut().and_then(|m| m.last_mut()) else {
            return Err(
                self.bad_messages("continue_final_message is set but the conversation is empty")
            );
        };
        let Some(final_message) = last.get("content").and_then(|c| c.as_str()) else {
            return Err(self.bad_messages(
                "continue_final_message is set but the final message has no string \"content\" to continue",
            ));
        };
        if !self.source.contains("content") {
            return Err(self.bad_messages(
                "continue_final_message is set to \"content\" but this is not an accepted field in the chat_template",
            ));
        }
        let final_message = final_message.to_string();
        last["content"] = format!("{final_message}{CONTINUE_TAG}").into();
        let rendered = self.render_with(&chat, tools, false, kwargs)?;
        let tag = CONTINUE_TAG.trim();
        let Some(at) = rendered
            .rfind(tag)
            .filter(|_| rendered.contains(final_message.trim()))
        else {
            return Err(self.bad_messages(format!(
                "continue_final_message is set but the final message does not appear in the chat after applying the chat template (final message: {:?})",
                final_message.trim()
            )));
        };
        Ok(if rendered[at..].starts_with(CONTINUE_TAG) {
            rendered[..at].to_string()
        } else {
            rendered[..at].trim_end().to_string()
        })
    }

    /// A prompt (a list of messages) rendered as TRL's `apply_chat_template`
    /// renders a prompt-only example: with the generation prompt after a
    /// `user` or `tool` message, continuing a final `assistant` message;
    /// another last role is refused, as TRL does.
    pub fn render_prompt(
        &self,
        prompt: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String, ChatError> {
        let last_role = prompt
            .as_array()
            .and_then(|m| m.last())
            .map(|m| m.get("role").and_then(|r| r.as_str()));
        match last_role {
            Some(Some("user" | "tool")) => self.render_with(prompt, tools, true, kwargs),
            Some(Some("assistant")) => self.render_continuing(prompt, tools, kwargs),
            Some(role) => Err(self.bad_messages(format!(
                "invalid role in the last message of the prompt: {}",
                role.unwrap_or("none")
            ))),
            None => Err(self.bad_messages("the prompt is not a non-empty list of messages")),
        }
    }

    /// A prompt-completion example rendered as TRL's `apply_chat_template`
    /// renders it (module doc): `(prompt, completion)`, the completion being
    /// the rendering of `prompt + completion` after the prompt's text.
    pub fn render_prompt_completion(
        &self,
        prompt: &serde_json::Value,
        completion: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<(String, String), ChatError> {
        let (Some(prompt_list), Some(completion_list)) = (prompt.as_array(), completion.as_array())
        else {
            return Err(self.bad_messages("prompt and completion must be lists of messages"));
        };
        let rendered_prompt = self.render_prompt(prompt, tools, kwargs)?;
        let whole: Vec<serde_json::Value> =
            prompt_list.iter().chain(completion_list).cloned().collect();
        let whole = self.render_with(&serde_json::Value::Array(whole), tools, false, kwargs)?;
        // The common prefix, character by character (Python's zip of two str).
        let common: usize = rendered_prompt
            .chars()
            .zip(whole.chars())
            .take_while(|(a, b)| a == b)
            .map(|(a, _)| a.len_utf8())
            .sum();
        Ok((whole[..common].to_string(), whole[common..].to_string()))
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
        assert!(matches!(err, ChatError::NoChatTemplate { .. }), "{err}");
        std::fs::write(dir.path().join("chat_template.jinja"), "{% if %}").unwrap();
        let err = ChatTemplate::from_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains("chat_template.jinja"), "{err}");
    }

    /// `<role>content</s>` per message, `<assistant>` + `generation` as the
    /// generation prompt.
    fn turns(generation: &str, content: &str) -> ChatTemplate {
        template(&format!(
            "{{% for m in messages %}}<{{{{ m.role }}}}>{{{{ m.content{content} }}}}</s>{{% endfor %}}{{% if add_generation_prompt %}}<assistant>{generation}{{% endif %}}"
        ))
    }

    #[test]
    fn prompt_completion_as_trl() {
        let prompt = json!([{"role": "user", "content": "hi"}]);
        let completion = json!([{"role": "assistant", "content": "ok"}]);
        let t = turns("", "");
        assert_eq!(
            t.render_prompt_completion(&prompt, &completion, None, None)
                .unwrap(),
            ("<user>hi</s><assistant>".into(), "ok</s>".into())
        );
        // A generation prompt the whole rendering lacks (DeepSeek-R1's
        // `<think>`): the prompt is the common prefix.
        let t = turns("<think>", "");
        assert_eq!(
            t.render_prompt_completion(&prompt, &completion, None, None)
                .unwrap(),
            ("<user>hi</s><assistant>".into(), "ok</s>".into())
        );
        // A prompt ending with the assistant's message is continued.
        let prompt = json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The answer is "}]);
        let completion = json!([{"role": "assistant", "content": "4"}]);
        let t = turns("", "");
        assert_eq!(
            t.render_prompt_completion(&prompt, &completion, None, None)
                .unwrap(),
            (
                "<user>hi</s><assistant>The answer is ".into(),
                "</s><assistant>4</s>".into()
            )
        );
        // A template that trims the content loses the tag's space: cut and
        // right-stripped, as transformers.
        let t = turns("", " | trim");
        assert_eq!(
            t.render_continuing(&prompt, None, None).unwrap(),
            "<user>hi</s><assistant>The answer is"
        );
        let system = json!([{"role": "system", "content": "s"}]);
        let err = t
            .render_prompt_completion(&system, &completion, None, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("t.jinja")
                && err.contains("invalid role in the last message of the prompt: system"),
            "{err}"
        );
        let no_content = template("{{ messages | length }}");
        let err = no_content
            .render_continuing(&prompt, None, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not an accepted field"), "{err}");
    }

    #[test]
    fn reasoning_is_aliased_and_kwargs_reach_the_template() {
        let t = template(
            "{{ messages[0].reasoning_content }}|{{ messages[0].thinking }}|{% if enable_thinking is false %}off{% endif %}|{{ eos_token }}",
        );
        let kwargs = json!({"enable_thinking": false, "eos_token": "<e>"});
        let text = t
            .render_with(
                &json!([{"role": "assistant", "reasoning": "r", "content": ""}]),
                None,
                false,
                kwargs.as_object(),
            )
            .unwrap();
        assert_eq!(text, "r|r|off|<e>");
        let text = t
            .render(
                &json!([{"role": "assistant", "reasoning_content": "a", "thinking": "b"}]),
                None,
                false,
            )
            .unwrap();
        assert_eq!(text, "a|b||</s>");
    }
}

//! Prompts from a chat template: a task's text as one user message with the
//! generation prompt, as transformers' `apply_chat_template(messages,
//! add_generation_prompt=True)` renders it, and the text read back out of
//! such a prompt. With images, the message's content is a list of parts,
//! the images first and then the text, as a processor's chat template
//! expects them:
//!
//! ```text
//! [{"role": "user", "content": "Put the mug in the sink."}]                      (no image)
//! [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Put the mug in the sink."}]}]
//! ```
//!
//! Qwen2.5-VL's template writes `<|vision_start|><|image_pad|><|vision_end|>`
//! for the image part; the model expands the placeholder to the image's
//! merged patch count.

use embodyflow_hf::HfError;
use embodyflow_hf::chat::ChatTemplate;

use crate::ModelError;

/// The `<|name|>` markers in `text` (no space inside), in order.
pub(crate) fn markers(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        loop {
            let start = rest.find("<|")?;
            let after = &rest[start + 2..];
            let end = after.find("|>")?;
            let inner = &after[..end];
            if !inner.is_empty() && !inner.contains(|c: char| c.is_whitespace() || c == '<') {
                let marker = &rest[start..start + 2 + end + 2];
                rest = &after[end + 2..];
                return Some(marker);
            }
            rest = after;
        }
    })
}

/// A user message's text that no task writes (a private-use character
/// around a name), to find where a template puts the message.
pub(crate) const USER_MARK: &str = "\u{e000}embodyflow-user-text\u{e000}";

/// `text` as one user message with the generation prompt, after `images`
/// image parts (none: the content is the text itself).
pub(crate) fn render_user(
    template: &ChatTemplate,
    text: &str,
    images: usize,
) -> Result<String, ModelError> {
    let content = if images == 0 {
        serde_json::Value::from(text)
    } else {
        let mut parts = vec![serde_json::json!({"type": "image"}); images];
        parts.push(serde_json::json!({"type": "text", "text": text}));
        serde_json::Value::from(parts)
    };
    let messages = serde_json::json!([{"role": "user", "content": content}]);
    Ok(template
        .render(&messages, None, true)
        .map_err(HfError::from)?)
}

/// The user message's text inside a prompt [`render_user`] rendered with
/// `images` image parts: `decoded` without the template's text before and
/// after the message; `None` when it is not such a prompt.
pub(crate) fn user_text<'a>(
    template: &ChatTemplate,
    decoded: &'a str,
    images: usize,
) -> Result<Option<&'a str>, ModelError> {
    let rendered = render_user(template, USER_MARK, images)?;
    let Some((before, after)) = rendered.split_once(USER_MARK) else {
        return Ok(None);
    };
    Ok(decoded
        .strip_prefix(before)
        .and_then(|rest| rest.strip_suffix(after)))
}

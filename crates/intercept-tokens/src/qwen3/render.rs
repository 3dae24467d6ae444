//! Full renders and the bridge, in the order and with the encode calls of renderers'
//! `Qwen3Renderer.render` and `bridge_to_next_turn` (each text encoded on its own where
//! renderers encode it on its own, joined where they join it: BPE merges depend on it).

use std::borrow::Cow;

use super::{scan, Qwen3Renderer};
use crate::message::{ChatMessage, Role, ToolSpec};
use crate::pycompat::text;
use crate::render::{Decline, Extension, RenderError, Rendered, ThinkingRetention};

const TOOLS_HEADER: &str = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>";

const TOOLS_FOOTER: &str = "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

/// The ids being written, with their message and sampled flags.
struct Out<'r> {
    r: &'r Qwen3Renderer,
    out: Rendered,
}

impl<'r> Out<'r> {
    fn new(r: &'r Qwen3Renderer) -> Self {
        Out {
            r,
            out: Rendered::default(),
        }
    }

    fn special(&mut self, id: u32, msg: i32, sampled: bool) {
        self.out.token_ids.push(id);
        self.out.message_indices.push(msg);
        self.out.sampled_mask.push(sampled);
    }

    fn ids(&mut self, ids: &[u32], msg: i32, sampled: bool) {
        self.out.token_ids.extend_from_slice(ids);
        let n = self.out.token_ids.len();
        self.out.message_indices.resize(n, msg);
        self.out.sampled_mask.resize(n, sampled);
    }

    /// One encode call (renderers' `_encode`: nothing for an empty text).
    fn text(&mut self, text: &str, msg: i32, sampled: bool) {
        if text.is_empty() {
            return;
        }
        let ids = self.r.tok.encode(text);
        self.ids(&ids, msg, sampled);
    }

    fn newline(&mut self, msg: i32, sampled: bool) {
        let r = self.r;
        self.ids(&r.enc.newline, msg, sampled);
    }

    /// `<|im_start|>{role}\n{content}<|im_end|>\n` of a system or user message.
    fn plain(&mut self, role: &str, content: &str, msg: i32) {
        let r = self.r;
        self.special(r.ids.im_start, msg, false);
        let mut s = String::with_capacity(role.len() + 1 + content.len());
        s.push_str(role);
        s.push('\n');
        s.push_str(content);
        self.text(&s, msg, false);
        self.special(r.ids.im_end, msg, false);
        self.newline(msg, false);
    }

    /// A tool result: consecutive tool messages share one `<|im_start|>user` turn.
    fn tool(&mut self, messages: &[ChatMessage], i: usize) {
        let r = self.r;
        let msg = i as i32;
        let prev_is_tool = i > 0 && messages[i - 1].role() == Role::Tool;
        let next_is_tool = messages.get(i + 1).is_some_and(|m| m.role() == Role::Tool);
        if !prev_is_tool {
            self.special(r.ids.im_start, msg, false);
            self.ids(&r.enc.user, msg, false);
        }
        self.newline(msg, false);
        self.special(r.ids.tool_response, msg, false);
        let content = messages[i].text();
        let mut s = String::with_capacity(content.len() + 2);
        s.push('\n');
        s.push_str(&content);
        s.push('\n');
        self.text(&s, msg, false);
        self.special(r.ids.tool_response_end, msg, false);
        if !next_is_tool {
            self.special(r.ids.im_end, msg, false);
            self.newline(msg, false);
        }
    }

    fn assistant(&mut self, m: &ChatMessage, i: usize, last_query: i64, is_last: bool) {
        let r = self.r;
        let msg = i as i32;
        let full = m.text();
        let mut content: &str = &full;
        let mut reasoning: Cow<'_, str> = Cow::Borrowed("");
        if let Some(rc) = m.reasoning_content() {
            reasoning = Cow::Borrowed(rc);
        } else if let Some((before, after)) = full.split_once("</think>") {
            let inner = if before.contains("<think>") {
                before.rsplit("<think>").next().unwrap_or_default()
            } else {
                before
            };
            reasoning = Cow::Borrowed(inner.trim_start_matches('\n').trim_end_matches('\n'));
            content = after.trim_start_matches('\n');
        }
        self.special(r.ids.im_start, msg, false);
        let assistant = &r.enc.assistant;
        self.ids(assistant, msg, false);

        let in_window = (i as i64) > last_query && (is_last || !reasoning.is_empty());
        let thinking = in_window || (!r.enable_thinking && reasoning.is_empty());
        let body: Cow<'_, str> = if thinking {
            let reasoning = reasoning.trim_matches('\n');
            let content = content.trim_start_matches('\n');
            let mut s = String::with_capacity(reasoning.len() + content.len() + 21);
            s.push_str("<think>\n");
            s.push_str(reasoning);
            s.push_str("\n</think>\n\n");
            s.push_str(content);
            Cow::Owned(s)
        } else {
            Cow::Borrowed(content)
        };
        let calls = m.tool_calls();
        if calls.is_empty() {
            self.text(&body, msg, true);
        } else {
            for (k, call) in calls.iter().enumerate() {
                if k == 0 {
                    if content.is_empty() {
                        self.text(&body, msg, true);
                    } else {
                        let mut s = String::with_capacity(body.len() + 1);
                        s.push_str(&body);
                        s.push('\n');
                        self.text(&s, msg, true);
                    }
                } else {
                    self.newline(msg, true);
                }
                self.special(r.ids.tool_call, msg, true);
                let mut s = String::with_capacity(call.name().len() + call.arguments().len() + 30);
                s.push_str("\n{\"name\": \"");
                s.push_str(call.name());
                s.push_str("\", \"arguments\": ");
                s.push_str(call.arguments());
                s.push_str("}\n");
                self.text(&s, msg, true);
                self.special(r.ids.tool_call_end, msg, true);
            }
        }
        self.special(r.ids.im_end, msg, true);
        self.newline(msg, false);
    }

    /// `<|im_start|>assistant\n`, and the empty think block when thinking is off.
    fn generation_prompt(&mut self) {
        let r = self.r;
        self.special(r.ids.im_start, -1, false);
        self.ids(&r.enc.assistant, -1, false);
        if !r.enable_thinking {
            self.ids(&r.enc.empty_think, -1, false);
        }
    }
}

/// renderers' `_is_user_query_message`: a user message that is not a bare tool response.
fn is_user_query(m: &ChatMessage) -> bool {
    if m.role() != Role::User {
        return false;
    }
    let t = m.text();
    let t = text::strip(&t);
    !(t.starts_with("<tool_response>") && t.ends_with("</tool_response>"))
}

pub(super) fn render(
    r: &Qwen3Renderer,
    messages: &[ChatMessage],
    tools: &[ToolSpec],
    add_generation_prompt: bool,
) -> Result<Rendered, RenderError> {
    let Some(first) = messages.first() else {
        return Err(RenderError::NoMessages);
    };
    let mut o = Out::new(r);
    let first_is_system = first.role() == Role::System;
    if !tools.is_empty() {
        let sys = if first_is_system { 0 } else { -1 };
        o.special(r.ids.im_start, sys, false);
        let mut s = String::from("system\n");
        if first_is_system {
            s.push_str(&first.text());
            s.push_str("\n\n");
        }
        s.push_str(TOOLS_HEADER);
        for tool in tools {
            s.push('\n');
            s.push_str(tool.dumped());
        }
        s.push_str(TOOLS_FOOTER);
        o.text(&s, sys, false);
        o.special(r.ids.im_end, sys, false);
        o.newline(sys, false);
    } else if first_is_system {
        o.plain("system", &first.text(), 0);
    }

    let last_query = messages
        .iter()
        .rposition(is_user_query)
        .unwrap_or(messages.len() - 1) as i64;
    let n = messages.len();
    for (i, m) in messages.iter().enumerate() {
        match m.role() {
            Role::System if i == 0 => {}
            Role::System => o.plain("system", &m.text(), i as i32),
            Role::User => o.plain("user", &m.text(), i as i32),
            Role::Assistant => o.assistant(m, i, last_query, i == n - 1),
            Role::Tool => o.tool(messages, i),
        }
    }
    if add_generation_prompt {
        o.generation_prompt();
    }
    Ok(o.out)
}

pub(super) fn extend(
    r: &Qwen3Renderer,
    previous_prompt_ids: &[u32],
    previous_completion_ids: &[u32],
    new_messages: &[ChatMessage],
) -> Result<Extension, Decline> {
    if previous_prompt_ids.is_empty() {
        return Err(Decline::EmptyPreviousPrompt);
    }
    if new_messages.is_empty() {
        return Err(Decline::NoNewMessages);
    }
    if new_messages.iter().any(|m| m.role() == Role::Assistant) {
        return Err(Decline::AssistantInTail);
    }
    let sc = r.scanner();
    let prefilled = scan::prompt_ends_in_reasoning(sc, previous_prompt_ids);
    let boundary = sc.initial(previous_completion_ids, prefilled, true);
    let mut close_think = false;
    if boundary.is_open() {
        if previous_completion_ids.iter().any(|&t| r.ids.is_stop(t)) {
            return Err(Decline::OpenReasoningAtStop);
        }
        close_think = true;
    }
    if r.retention == ThinkingRetention::ToolCycle && new_messages.iter().any(is_user_query) {
        return Err(Decline::ThinkingRetention);
    }

    // `trim_to_turn_close`: up to the completion's last close, or all of it with a
    // synthesised `<|im_end|>` (after the synthesised `</think>` of an open reasoning).
    let mut o = Out::new(r);
    let keep_completion = if close_think {
        None
    } else {
        previous_completion_ids
            .iter()
            .rposition(|&t| r.ids.is_stop(t))
            .map(|k| k + 1)
    };
    let keep = previous_prompt_ids.len()
        + match keep_completion {
            Some(k) => k,
            None => {
                if close_think {
                    o.special(r.ids.think_end, -1, false);
                }
                o.special(r.ids.im_end, -1, false);
                previous_completion_ids.len()
            }
        };
    o.newline(-1, false);
    for (k, m) in new_messages.iter().enumerate() {
        match m.role() {
            Role::User => o.plain("user", &m.text(), k as i32),
            Role::System => o.plain("system", &m.text(), k as i32),
            Role::Tool => o.tool(new_messages, k),
            Role::Assistant => return Err(Decline::AssistantInTail),
        }
    }
    o.generation_prompt();
    Ok(Extension {
        keep,
        ids: o.out.token_ids,
        message_indices: o.out.message_indices,
    })
}

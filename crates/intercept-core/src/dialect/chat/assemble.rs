//! The assembler of a streamed Chat completion: each chunk's effect, and the fast paths
//! of the usual chunk (a repeated prefix skipped, a delta read in place).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::dialect::{Assembled, Relay, StreamAssembler};
use crate::error::Error;
use crate::sse::SseEvent;
use crate::trace::episode::{Message, Role};

use super::chunk::{WireChunk, WireDelta};
use super::encode::{assembled_completion, OutChoice, OutFunction, OutMessage, OutToolCall};
use super::normalise_finish;

#[derive(Debug, Default, Clone)]
struct ToolCall {
    id: String,
    kind: String,
    name: String,
    arguments: String,
}

#[derive(Debug, Default, Clone)]
pub(super) struct ChatAssembler {
    hide_usage: bool,
    head: Option<Map<String, Value>>,
    content: String,
    saw_content: bool,
    reasoning_content: String,
    reasoning: String,
    refusal: Option<String>,
    tool_calls: BTreeMap<u64, ToolCall>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    done: bool,
    errors: Vec<String>,
    upstream_error: Option<String>,
    /// The members every chunk repeats before `choices` (`{"id":…,"object":…,
    /// "created":…,"model":…,`), byte for byte as the last fully parsed chunk had them;
    /// empty until found. A chunk that starts with them is parsed from `choices` on.
    prefix: Vec<u8>,
    /// Attempts left at finding `prefix` (an upstream whose chunks differ in it, say a
    /// `created` that changes, stops being looked at).
    prefix_tries: u8,
    /// `{` and the rest of a chunk after `prefix`, parsed in place of the chunk.
    scratch: String,
    /// The bytes around the delta of a chunk whose only effect was its delta (see
    /// [`delta_frame`]); empty until found. A chunk made of the same bytes around one
    /// JSON object is read as that delta alone.
    delta_head: Vec<u8>,
    delta_tail: Vec<u8>,
}

/// How many chunks of a stream may be searched for the repeated prefix.
const PREFIX_TRIES: u8 = 4;

/// The bytes of `chunk` up to and including the comma that closes its top-level members
/// before `"choices"`, when there are any and they form a valid object on their own.
fn repeated_prefix(chunk: &[u8]) -> Option<&[u8]> {
    // An unescaped quote cannot follow a comma inside a string, so `,"choices":` is a
    // member boundary; checking that what precedes it closes as an object makes sure it
    // is a top-level one (a nested `choices` leaves braces open).
    static CHOICES: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b",\"choices\":"));
    // (A `Finder` built once: `memmem::find` builds one at every call.)
    let comma = CHOICES.find(chunk)?;
    let mut probe = Vec::with_capacity(comma + 1);
    probe.extend_from_slice(&chunk[..comma]);
    probe.push(b'}');
    // Members whose effect is not the same when taken once as when repeated (a usage or
    // an error another chunk may change in between) are never skipped.
    let members: ProbedMembers<'_> = crate::body::from_json_bytes(&probe).ok()?;
    if members.usage.is_some() || members.error.is_some() {
        return None;
    }
    Some(&chunk[..=comma])
}

/// The members before `choices` that must not be skipped when present.
#[derive(Deserialize)]
struct ProbedMembers<'a> {
    #[serde(default, borrow)]
    usage: Option<&'a RawValue>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
}

/// A chunk read only to find where its one choice's `delta` sits.
#[derive(Deserialize)]
struct LocateDelta<'a> {
    #[serde(borrow)]
    choices: Vec<LocateChoice<'a>>,
}

#[derive(Deserialize)]
struct LocateChoice<'a> {
    #[serde(borrow)]
    delta: &'a RawValue,
}

/// For a chunk whose only effect is its delta (one choice, of index 0, no finish
/// reason, no usage, no error, as `chunk` was read): the bytes before the delta's value
/// and after it. Another chunk made of the same bytes around another JSON value differs
/// from this one only in that value, which is then its delta.
fn delta_frame<'d>(data: &'d [u8], chunk: &WireChunk<'_>) -> Option<(&'d [u8], &'d [u8])> {
    let choices = chunk.choices.as_ref()?;
    let [choice] = choices.as_slice() else {
        return None;
    };
    if choice.index != 0
        || choice.finish_reason.is_some()
        || choice.delta.is_none()
        || chunk.usage.is_some()
        || chunk.error.is_some()
    {
        return None;
    }
    let located: LocateDelta<'_> = crate::body::from_json_bytes(data).ok()?;
    let [choice] = located.choices.as_slice() else {
        return None;
    };
    let raw = choice.delta.get().as_bytes();
    let start = (raw.as_ptr() as usize).checked_sub(data.as_ptr() as usize)?;
    let end = start.checked_add(raw.len())?;
    (end <= data.len()).then(|| (&data[..start], &data[end..]))
}

/// The text of a delta that is exactly `open` (`{"content":"`, say) + a string + `"}`
/// with nothing in the string to unescape (no quote, backslash or control character):
/// that text as it stands.
fn plain_text<'d>(delta: &'d [u8], open: &[u8]) -> Option<&'d str> {
    let text = delta.strip_prefix(open)?.strip_suffix(br#""}"#)?;
    if text.iter().any(|&b| b == b'"' || b == b'\\' || b < 0x20) {
        return None;
    }
    std::str::from_utf8(text).ok()
}

impl ChatAssembler {
    /// An assembler; `hide_usage` drops the usage-only chunk the harness did not ask for.
    pub(super) fn new(hide_usage: bool) -> Self {
        ChatAssembler {
            hide_usage,
            prefix_tries: PREFIX_TRIES,
            ..ChatAssembler::default()
        }
    }

    /// Takes the effect of one chunk: an upstream error, the usage, the head (from the
    /// first chunk), and the call's choice (index 0).
    fn absorb(&mut self, chunk: WireChunk<'_>) -> Relay {
        if let Some(err) = chunk.error {
            self.upstream_error = Some(crate::dialect::error_text(&err.to_value()));
            return Relay::Forward;
        }
        let usage_only = chunk.choices.as_ref().is_some_and(Vec::is_empty);
        if let Some(u) = chunk.usage {
            self.usage = Some(u.to_value());
        }
        if self.head.is_none() {
            let mut head = Map::new();
            for (key, value) in [
                ("id", chunk.id),
                ("created", chunk.created),
                ("model", chunk.model),
                ("system_fingerprint", chunk.system_fingerprint),
                ("service_tier", chunk.service_tier),
            ] {
                if let Some(v) = value {
                    head.insert(key.to_owned(), v.to_value());
                }
            }
            self.head = Some(head);
        }
        for choice in chunk.choices.into_iter().flatten().filter(|c| c.index == 0) {
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason.into_owned());
            }
            if let Some(delta) = choice.delta {
                self.absorb_delta(delta);
            }
        }
        if usage_only && self.hide_usage {
            Relay::Drop
        } else {
            Relay::Forward
        }
    }

    /// The delta of the call's choice (index 0).
    fn absorb_delta(&mut self, delta: WireDelta<'_>) {
        if let Some(text) = delta.content {
            self.content.push_str(&text);
            self.saw_content = true;
        }
        if let Some(text) = delta.reasoning_content {
            self.reasoning_content.push_str(&text);
        }
        if let Some(text) = delta.reasoning {
            self.reasoning.push_str(&text);
        }
        if let Some(text) = delta.refusal {
            self.refusal.get_or_insert_with(String::new).push_str(&text);
        }
        for call in delta.tool_calls.into_iter().flatten() {
            let entry = self.tool_calls.entry(call.index).or_default();
            if let Some(id) = call.id.filter(|s| !s.is_empty()) {
                entry.id = id.into_owned();
            }
            if let Some(kind) = call.kind.filter(|s| !s.is_empty()) {
                entry.kind = kind.into_owned();
            }
            if let Some(f) = call.function {
                if let Some(name) = f.name.filter(|s| !s.is_empty()) {
                    entry.name = name.into_owned();
                }
                if let Some(args) = f.arguments {
                    entry.arguments.push_str(&args);
                }
            }
        }
    }
}

impl StreamAssembler for ChatAssembler {
    fn push(&mut self, event: &SseEvent<'_>) -> Relay {
        if self.done {
            return Relay::Withhold;
        }
        let Some(data) = event.data() else {
            return Relay::Forward;
        };
        if data.trim_ascii() == b"[DONE]" {
            self.done = true;
            return Relay::Withhold;
        }
        // The usual content chunk: the same bytes as an earlier one around another delta.
        if !self.delta_head.is_empty()
            && data.len() > self.delta_head.len() + self.delta_tail.len()
            && data.starts_with(&self.delta_head)
            && data.ends_with(&self.delta_tail)
        {
            let delta = &data[self.delta_head.len()..data.len() - self.delta_tail.len()];
            if let Some(text) = plain_text(delta, br#"{"content":""#) {
                self.content.push_str(text);
                self.saw_content = true;
                return Relay::Forward;
            }
            if let Some(text) = plain_text(delta, br#"{"reasoning_content":""#) {
                self.reasoning_content.push_str(text);
                return Relay::Forward;
            }
            if let Some(text) = plain_text(delta, br#"{"reasoning":""#) {
                self.reasoning.push_str(text);
                return Relay::Forward;
            }
            if let Ok(delta) = crate::body::from_json_bytes::<WireDelta<'_>>(delta) {
                self.absorb_delta(delta);
                return Relay::Forward;
            }
        }
        // The members already read from an earlier chunk, repeated byte for byte, are
        // skipped: they are only those whose effect was taken then (the head).
        if !self.prefix.is_empty() && data.len() > self.prefix.len() {
            if let Some(rest) = data
                .strip_prefix(self.prefix.as_slice())
                .and_then(|r| std::str::from_utf8(r).ok())
            {
                let mut scratch = std::mem::take(&mut self.scratch);
                scratch.clear();
                scratch.push('{');
                scratch.push_str(rest);
                let relay = serde_json::from_str::<WireChunk<'_>>(&scratch)
                    .ok()
                    .map(|chunk| self.absorb(chunk));
                self.scratch = scratch;
                if let Some(relay) = relay {
                    return relay;
                }
            }
        }
        if let Ok(chunk) = crate::body::from_json_bytes::<WireChunk<'_>>(&data) {
            if self.prefix_tries > 0 && chunk.error.is_none() && chunk.choices.is_some() {
                self.prefix_tries -= 1;
                self.prefix.clear();
                if let Some(p) = repeated_prefix(&data) {
                    self.prefix.extend_from_slice(p);
                }
                if let Some((head, tail)) = delta_frame(&data, &chunk) {
                    self.delta_head.clear();
                    self.delta_head.extend_from_slice(head);
                    self.delta_tail.clear();
                    self.delta_tail.extend_from_slice(tail);
                }
            }
            return self.absorb(chunk);
        }
        match crate::body::from_json_bytes::<Map<String, Value>>(&data) {
            Ok(chunk) => self.absorb(WireChunk::from_map(&chunk)),
            Err(e) => {
                if self.errors.len() < 4 {
                    self.errors
                        .push(format!("unreadable chat.completion.chunk: {e}"));
                }
                Relay::Forward
            }
        }
    }

    fn saw_terminal(&self) -> bool {
        self.done
    }

    fn finish(mut self: Box<Self>) -> Result<Assembled, Error> {
        if let Some(message) = self.upstream_error.take() {
            return Err(Error::upstream_status(502, message, None));
        }
        if let Some(e) = self.errors.drain(..).next() {
            return Err(Error::UpstreamMalformed(e));
        }
        if !self.done {
            return Err(Error::UpstreamMalformed(
                "upstream stream ended before its terminal event (`data: [DONE]`)".into(),
            ));
        }
        Ok((*self).assemble(Some("stop")))
    }

    fn partial(&self) -> Option<crate::RawJson> {
        let started = self.head.is_some() || self.saw_content || !self.tool_calls.is_empty();
        started.then(|| self.clone().assemble(None).response)
    }
}

impl ChatAssembler {
    /// The `chat.completion` built from what arrived; `default_finish` stands in for a
    /// finish reason the upstream did not send (`None`: `null`).
    fn assemble(self, default_finish: Option<&str>) -> Assembled {
        let has_tools = !self.tool_calls.is_empty();
        let finish_reason =
            normalise_finish(self.finish_reason).or_else(|| default_finish.map(str::to_owned));
        let choice = OutChoice {
            index: 0,
            message: OutMessage {
                role: "assistant",
                content: (self.saw_content || !has_tools).then_some(self.content.as_str()),
                reasoning_content: &self.reasoning_content,
                reasoning: &self.reasoning,
                refusal: self.refusal.as_deref(),
                tool_calls: self
                    .tool_calls
                    .values()
                    .map(|c| OutToolCall {
                        id: &c.id,
                        kind: if c.kind.is_empty() {
                            "function"
                        } else {
                            &c.kind
                        },
                        function: OutFunction {
                            name: &c.name,
                            arguments: &c.arguments,
                        },
                    })
                    .collect(),
            },
            finish_reason: finish_reason.as_deref(),
            logprobs: (),
        };
        let mut assembled = assembled_completion(
            self.head.as_ref(),
            "chat.completion",
            &choice,
            self.usage.as_ref(),
            finish_reason.as_deref().unwrap_or_default(),
        );
        // The sampled message as `summarize` reads it from the response just encoded:
        // none with tool calls; the text when `content` was written; `reasoning_content`,
        // else `reasoning`, when not empty (empty ones are not written).
        let content = choice.message.content.is_some();
        drop(choice);
        assembled.summary.message = (!has_tools).then(|| {
            let mut msg = Message::new(Role::Assistant);
            if content {
                msg.push_text(self.content);
            }
            if !self.reasoning_content.is_empty() {
                msg.push_reasoning(&self.reasoning_content);
            } else if !self.reasoning.is_empty() {
                msg.push_reasoning(&self.reasoning);
            }
            Box::new(msg)
        });
        assembled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::dialect::{ChatDialect, Dialect as _, Prepared};

    #[test]
    fn repeated_members_are_skipped_only_when_repeated_byte_for_byte() {
        let chunk = |created: u64, extra: &str, body: &str| {
            format!(
                "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":{created},\"model\":\"m\",{extra}\"choices\":[{body}]}}\n\n"
            )
        };
        let delta =
            |t: &str| format!(r#"{{"index":0,"delta":{{"content":"{t}"}},"finish_reason":null}}"#);
        // A `choices` nested in a member before the real one is not a member boundary:
        // no prefix then (every chunk is parsed whole).
        assert_eq!(
            repeated_prefix(br#"{"meta":{"a":1,"choices":2},"choices":[]}"#),
            None
        );
        assert_eq!(
            repeated_prefix(br#"{"id":"x","choices":[]}"#),
            Some(&br#"{"id":"x","#[..])
        );
        // A usage or an error before `choices` is never skipped.
        assert_eq!(
            repeated_prefix(br#"{"id":"x","usage":{"prompt_tokens":1},"choices":[]}"#),
            None
        );
        assert_eq!(
            repeated_prefix(br#"{"id":"x","usage":null,"choices":[]}"#),
            Some(&br#"{"id":"x","usage":null,"#[..])
        );
        assert_eq!(repeated_prefix(br#"{"x":[{"y":1,"choices":[]}]}"#), None);
        let events = [
            chunk(1, "", &delta("a")),
            chunk(1, "", &delta("b\\n")),
            // Another `created`: parsed whole, and becomes the prefix.
            chunk(2, "", &delta("c")),
            chunk(2, "", &delta("d")),
            // The same bytes around something that is not one object: read whole.
            chunk(
                2,
                "",
                r#"{"index":0,"delta":{"content":"x"},"extra":{"content":"y"},"finish_reason":null}"#,
            ),
            chunk(2, r#""meta":{"choices":1},"#, &delta("e")),
            chunk(
                2,
                "",
                r#"{"index":1,"delta":{"content":"other"}},{"index":0,"delta":{},"finish_reason":"stop"}"#,
            ),
            chunk(2, "", "").replace(
                r#""choices":[]}"#,
                r#""choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}"#,
            ),
            "data: [DONE]\n\n".to_owned(),
        ];
        let mut a = Box::new(ChatAssembler {
            prefix_tries: PREFIX_TRIES,
            ..ChatAssembler::default()
        });
        for e in &events {
            a.push(&SseEvent::new(e.as_bytes()));
        }
        // Parsed whole: the first chunk and the first with `created` 2; the rest after
        // the prefix.
        assert_eq!(a.prefix_tries, PREFIX_TRIES - 2);
        assert_eq!(
            a.prefix,
            br#"{"id":"c1","object":"chat.completion.chunk","created":2,"model":"m","#
        );
        assert_eq!(
            a.delta_head,
            br#"{"id":"c1","object":"chat.completion.chunk","created":2,"model":"m","choices":[{"index":0,"delta":"#
        );
        assert_eq!(a.delta_tail, br#","finish_reason":null}]}"#);
        let out = a.finish().expect("assembled").response.to_value();
        assert_eq!(out["choices"][0]["message"]["content"], "ab\ncdxe");
        assert_eq!(out["choices"][0]["finish_reason"], "stop");
        assert_eq!(out["created"], 1, "the head is the first chunk's");
        assert_eq!(out["usage"]["completion_tokens"], 5);
    }

    #[test]
    fn plain_text_is_taken_as_it_stands_and_anything_else_is_parsed() {
        let plain_content = |delta: &'static [u8]| plain_text(delta, br#"{"content":""#);
        assert_eq!(
            plain_text(br#"{"reasoning":"think"}"#, br#"{"reasoning":""#),
            Some("think")
        );
        assert_eq!(
            plain_content(r#"{"content":"hé there"}"#.as_bytes()),
            Some("hé there")
        );
        assert_eq!(plain_content(br#"{"content":""}"#), Some(""));
        for other in [
            &br#"{"content":"a\nb"}"#[..],
            br#"{"content":"say \"hi\""}"#,
            br#"{"content":"\u00e9"}"#,
            b"{\"content\":\"tab\there\"}",
            br#"{"content":"a","role":"assistant"}"#,
            br#"{"content": "spaced"}"#,
            br#"{"content":null}"#,
            br#"{"reasoning_content":"x"}"#,
            b"{\"content\":\"\xff\"}",
        ] {
            assert_eq!(
                plain_content(other),
                None,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    #[test]
    fn typical_chunks_take_the_typed_path() {
        for chunk in [
            r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","system_fingerprint":null,"choices":[{"index":0,"delta":{"role":"assistant","content":"hi","reasoning_content":null},"logprobs":null,"finish_reason":null}],"usage":null}"#,
            r#"{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\""}}]},"finish_reason":null}]}"#,
            r#"{"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}"#,
        ] {
            assert!(
                serde_json::from_str::<WireChunk<'_>>(chunk).is_ok(),
                "{chunk}"
            );
        }
        // A chunk of an unexpected shape still parses through the general path.
        let mut a = ChatDialect.assembler(&Prepared::default());
        let odd = "data: {\"choices\":[{\"index\":\"0\",\"delta\":{\"content\":\"x\"}}]}\n\n";
        assert_eq!(a.push(&SseEvent::new(odd.as_bytes())), Relay::Forward);
        a.push(&SseEvent::new(b"data: [DONE]\n\n"));
        assert!(a.finish().is_ok());
    }

    #[test]
    fn stream_without_done_is_an_error() {
        let mut a = ChatDialect.assembler(&Prepared::default());
        a.push(&SseEvent::new(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
        ));
        assert!(!a.saw_terminal());
        let e = a.finish().expect_err("truncated");
        assert_eq!(e.status(), 502);
        assert!(e.to_string().contains("terminal event"), "{e}");
    }

    #[test]
    fn a_stream_cut_short_keeps_what_arrived() {
        let mut a = ChatDialect.assembler(&Prepared::default());
        assert!(a.partial().is_none(), "nothing arrived yet");
        a.push(&SseEvent::new(
            b"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n",
        ));
        a.push(&SseEvent::new(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\n",
        ));
        let partial = a.partial().expect("something arrived").to_value();
        assert_eq!(partial["id"], "c1");
        assert_eq!(partial["choices"][0]["message"]["content"], "Hello");
        assert!(
            partial["choices"][0]["finish_reason"].is_null(),
            "{partial}"
        );
        // Taking the partial changes nothing: the stream can still complete.
        a.push(&SseEvent::new(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        ));
        a.push(&SseEvent::new(b"data: [DONE]\n\n"));
        let done = a.finish().expect("complete").response.to_value();
        assert_eq!(done["choices"][0]["finish_reason"], "stop");
        assert_eq!(done["choices"][0]["message"]["content"], "Hello");
    }
}

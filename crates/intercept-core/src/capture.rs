//! Token capture for training: read token ids and logprobs out of an OpenAI-compatible
//! engine's replies (vLLM's `return_token_ids` / `logprobs`) and strip what the harness
//! did not ask for, leaving every other byte as it arrived.
//!
//! A [`TokenCollector`] is made per call by [`Dialect::capture_tokens`](crate::Dialect::capture_tokens),
//! which also rewrites the request. It then sees the whole JSON response
//! ([`TokenCollector::strip_json`]) or every SSE event ([`TokenCollector::strip_event`]),
//! and [`TokenCollector::finish`] gives the [`CapturedTokens`] for the record.
//!
//! Stripping replaces a value the harness did not ask for with `null`, in place: vLLM
//! writes exactly `null` for `prompt_token_ids`, `token_ids` and `logprobs` when they are
//! not requested, so the harness gets the bytes a run without capture would have given.
//! Only the first choice (`index` 0) is captured (intercept serves `n = 1`).

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use bytes::{Bytes, BytesMut};
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::sse::SseEvent;
use crate::trace::record::TokenCapture;

/// Where a wire format keeps token ids and logprobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum CaptureShape {
    /// Chat Completions: `prompt_token_ids` at the top level, per choice `token_ids` and
    /// `logprobs.content[].logprob`.
    Chat,
    /// Legacy Completions: per choice `prompt_token_ids`, `token_ids` and
    /// `logprobs.token_logprobs[]`.
    Completions,
}

/// What a call's capture found, for the record.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CapturedTokens {
    /// Whether prompt and completion token ids were both returned.
    pub status: TokenCapture,
    /// The prompt's token ids.
    pub prompt_token_ids: Option<Vec<u32>>,
    /// The completion's token ids.
    pub completion_token_ids: Option<Vec<u32>>,
    /// The completion tokens' logprobs.
    pub completion_logprobs: Option<Vec<f64>>,
}

/// Reads token ids and logprobs out of one call's replies and strips them.
pub struct TokenCollector {
    shape: CaptureShape,
    keep_logprobs: bool,
    keep_token_ids: bool,
    prompt: Option<Vec<u32>>,
    completion: Option<Vec<u32>>,
    logprobs: Option<Vec<f64>>,
    unreadable: usize,
}

impl fmt::Debug for TokenCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenCollector")
            .field("shape", &self.shape)
            .field("keep_logprobs", &self.keep_logprobs)
            .field("keep_token_ids", &self.keep_token_ids)
            .field("prompt", &self.prompt.as_ref().map(Vec::len))
            .field("completion", &self.completion.as_ref().map(Vec::len))
            .field("logprobs", &self.logprobs.as_ref().map(Vec::len))
            .finish()
    }
}

/// The members of one JSON object, values as raw text borrowed from the input.
struct Members<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    let value: &'de RawValue = map.next_value()?;
                    out.push((key, value));
                }
                Ok(Members(out))
            }
        }
        deserializer.deserialize_map(V)
    }
}

#[derive(Deserialize)]
struct ChatLogprob {
    logprob: Option<f64>,
}

#[derive(Deserialize)]
struct ChatLogprobs {
    #[serde(default)]
    content: Option<Vec<ChatLogprob>>,
}

#[derive(Deserialize)]
struct CompletionLogprobs {
    #[serde(default)]
    token_logprobs: Option<Vec<Option<f64>>>,
}

/// Where `inner` (a sub-slice of `outer`) starts in `outer`.
fn offset(outer: &str, inner: &str) -> usize {
    inner.as_ptr() as usize - outer.as_ptr() as usize
}

fn is_null(v: &RawValue) -> bool {
    v.get() == "null"
}

/// What the harness itself asked for, of what token capture adds to a request: that
/// part is relayed to it as it is, the rest is captured and stripped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HarnessAsked {
    /// The request asked for logprobs.
    pub(crate) logprobs: bool,
    /// The request asked for token ids (`return_token_ids`).
    pub(crate) token_ids: bool,
}

impl TokenCollector {
    /// A collector for answers of `shape`; `asked` says what the harness asked for
    /// itself (relayed as it is).
    pub(crate) fn new(shape: CaptureShape, asked: HarnessAsked) -> Self {
        TokenCollector {
            shape,
            keep_logprobs: asked.logprobs,
            keep_token_ids: asked.token_ids,
            prompt: None,
            completion: None,
            logprobs: None,
            unreadable: 0,
        }
    }

    /// Reads one JSON object (a response or a stream chunk) and returns the ranges of
    /// `text` to replace with `null`.
    fn absorb(&mut self, text: &str) -> Vec<Range<usize>> {
        let mut strip = Vec::new();
        let Ok(Members(top)) = serde_json::from_str::<Members<'_>>(text) else {
            self.unreadable += 1;
            return strip;
        };
        for (key, value) in &top {
            match key.as_ref() {
                "prompt_token_ids" if self.shape == CaptureShape::Chat => {
                    self.prompt_ids(text, value, &mut strip)
                }
                "choices" => {
                    let Ok(choices) = serde_json::from_str::<Vec<&RawValue>>(value.get()) else {
                        continue;
                    };
                    for choice in choices {
                        self.choice(text, choice, &mut strip);
                    }
                }
                _ => {}
            }
        }
        strip
    }

    fn prompt_ids(&mut self, text: &str, value: &RawValue, strip: &mut Vec<Range<usize>>) {
        if is_null(value) {
            return;
        }
        if self.prompt.is_none() {
            self.prompt = serde_json::from_str(value.get()).ok();
        }
        if !self.keep_token_ids {
            let at = offset(text, value.get());
            strip.push(at..at + value.get().len());
        }
    }

    fn choice(&mut self, text: &str, choice: &RawValue, strip: &mut Vec<Range<usize>>) {
        let Ok(Members(members)) = serde_json::from_str::<Members<'_>>(choice.get()) else {
            return;
        };
        let first = members
            .iter()
            .find(|(k, _)| k == "index")
            .is_none_or(|(_, v)| v.get() == "0");
        for (key, value) in &members {
            let range = || {
                let at = offset(text, value.get());
                at..at + value.get().len()
            };
            match key.as_ref() {
                "token_ids" if !is_null(value) => {
                    if first {
                        if let Ok(ids) = serde_json::from_str::<Vec<u32>>(value.get()) {
                            self.completion.get_or_insert_with(Vec::new).extend(ids);
                        }
                    }
                    if !self.keep_token_ids {
                        strip.push(range());
                    }
                }
                "prompt_token_ids" if self.shape == CaptureShape::Completions => {
                    if first {
                        self.prompt_ids(text, value, strip);
                    } else if !is_null(value) && !self.keep_token_ids {
                        strip.push(range());
                    }
                }
                "logprobs" if !is_null(value) => {
                    if first {
                        let found: Option<Vec<f64>> = match self.shape {
                            CaptureShape::Chat => serde_json::from_str::<ChatLogprobs>(value.get())
                                .ok()
                                .and_then(|l| l.content)
                                .map(|c| c.into_iter().filter_map(|t| t.logprob).collect()),
                            CaptureShape::Completions => {
                                serde_json::from_str::<CompletionLogprobs>(value.get())
                                    .ok()
                                    .and_then(|l| l.token_logprobs)
                                    .map(|c| c.into_iter().flatten().collect())
                            }
                        };
                        if let Some(found) = found {
                            self.logprobs.get_or_insert_with(Vec::new).extend(found);
                        }
                    }
                    if !self.keep_logprobs {
                        strip.push(range());
                    }
                }
                _ => {}
            }
        }
    }

    /// Reads a complete JSON response; returns the bytes the harness gets (the input
    /// itself, shared, when nothing had to be stripped).
    pub fn strip_json(&mut self, body: &Bytes) -> Bytes {
        let Ok(text) = std::str::from_utf8(body) else {
            self.unreadable += 1;
            return body.clone();
        };
        let strip = self.absorb(text);
        splice(body, 0, &strip)
    }

    /// Reads one raw SSE event; returns the event the harness gets. Events without a
    /// JSON payload (`[DONE]`, comments) and events whose data spans several lines pass
    /// unchanged.
    pub fn strip_event(&mut self, event: &Bytes) -> Bytes {
        let parsed = SseEvent::new(event);
        let Some(Cow::Borrowed(data)) = parsed.data() else {
            return event.clone();
        };
        if data.first() != Some(&b'{') {
            return event.clone();
        }
        let Ok(text) = std::str::from_utf8(data) else {
            return event.clone();
        };
        let base = data.as_ptr() as usize - event.as_ptr() as usize;
        let strip = self.absorb(text);
        splice(event, base, &strip)
    }

    /// What was captured.
    pub fn finish(self) -> CapturedTokens {
        let status = if self.prompt.is_some() && self.completion.is_some() {
            TokenCapture::Captured
        } else {
            TokenCapture::Missing
        };
        CapturedTokens {
            status,
            prompt_token_ids: self.prompt,
            completion_token_ids: self.completion,
            completion_logprobs: self.logprobs,
        }
    }
}

/// `source` with each range (shifted by `base`) replaced by `null`.
fn splice(source: &Bytes, base: usize, ranges: &[Range<usize>]) -> Bytes {
    if ranges.is_empty() {
        return source.clone();
    }
    let mut ranges: Vec<Range<usize>> = ranges
        .iter()
        .map(|r| r.start + base..r.end + base)
        .collect();
    ranges.sort_by_key(|r| r.start);
    let mut out = BytesMut::with_capacity(source.len());
    let mut at = 0;
    for r in ranges {
        if r.start < at {
            continue;
        }
        out.extend_from_slice(&source[at..r.start]);
        out.extend_from_slice(b"null");
        at = r.end;
    }
    out.extend_from_slice(&source[at..]);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// A vLLM-like chunk with or without the capture fields.
    fn chunk(first: bool, ids: &[u32], lps: &[f64], capture: bool) -> String {
        let logprobs = if capture {
            json!({"content": ids.iter().zip(lps).map(|(i, l)| json!({"token": format!("t{i}"), "logprob": l, "bytes": [1], "top_logprobs": []})).collect::<Vec<_>>()})
        } else {
            json!(null)
        };
        let token_ids = if capture { json!(ids) } else { json!(null) };
        let mut v = json!({"id":"c","object":"chat.completion.chunk","created":1,"model":"m",
            "choices":[{"index":0,"delta":{"content":"x"},"logprobs":logprobs,"finish_reason":null,"token_ids":token_ids}]});
        if first {
            v["prompt_token_ids"] = if capture {
                json!([5, 6, 7])
            } else {
                json!(null)
            };
        }
        format!("data: {v}\n\n")
    }

    proptest! {
        /// Stripping a captured stream gives the bytes of the same stream without capture,
        /// and the collector holds exactly the ids and logprobs that were sent.
        #[test]
        fn stream_strips_to_the_uncaptured_bytes(
            pieces in prop::collection::vec((prop::collection::vec(0u32..200_000, 0..4), -20.0f64..0.0), 1..6),
        ) {
            let mut c = TokenCollector::new(CaptureShape::Chat, HarnessAsked::default());
            let mut ids_sent = Vec::new();
            let mut lps_sent = Vec::new();
            for (i, (ids, lp)) in pieces.iter().enumerate() {
                let lps: Vec<f64> = ids.iter().map(|_| *lp).collect();
                let captured = Bytes::from(chunk(i == 0, ids, &lps, true));
                let plain = chunk(i == 0, ids, &lps, false);
                prop_assert_eq!(&c.strip_event(&captured)[..], plain.as_bytes());
                ids_sent.extend(ids.iter().copied());
                lps_sent.extend(lps);
            }
            let done = Bytes::from_static(b"data: [DONE]\n\n");
            prop_assert_eq!(c.strip_event(&done), done);
            let t = c.finish();
            prop_assert_eq!(t.status, TokenCapture::Captured);
            prop_assert_eq!(t.prompt_token_ids, Some(vec![5, 6, 7]));
            prop_assert_eq!(t.completion_token_ids, Some(ids_sent));
            prop_assert_eq!(t.completion_logprobs, Some(lps_sent));
        }
    }

    #[test]
    fn a_chat_reply_is_captured_and_stripped() {
        let mut c = TokenCollector::new(CaptureShape::Chat, HarnessAsked::default());
        let reply = br#"{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"logprobs":{"content":[{"token":"hi","logprob":-0.5,"bytes":[104,105],"top_logprobs":[]}]},"finish_reason":"stop","token_ids":[6151]}],"prompt_token_ids":[1,2]}"#;
        let served = c.strip_json(&Bytes::from_static(reply));
        assert_eq!(&served[..], br#"{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"logprobs":null,"finish_reason":"stop","token_ids":null}],"prompt_token_ids":null}"#);
        let tokens = c.finish();
        assert_eq!(tokens.status, TokenCapture::Captured);
        assert_eq!(tokens.prompt_token_ids, Some(vec![1, 2]));
        assert_eq!(tokens.completion_token_ids, Some(vec![6151]));
        assert_eq!(tokens.completion_logprobs, Some(vec![-0.5]));
    }

    #[test]
    fn what_the_harness_asked_for_stays() {
        let mut c = TokenCollector::new(
            CaptureShape::Chat,
            HarnessAsked {
                logprobs: true,
                token_ids: true,
            },
        );
        let body = Bytes::from_static(
            br#"{"choices":[{"index":0,"logprobs":{"content":[{"logprob":-1.0}]},"token_ids":[3]}],"prompt_token_ids":[1]}"#,
        );
        assert_eq!(c.strip_json(&body), body);
        assert_eq!(c.finish().completion_logprobs, Some(vec![-1.0]));
    }

    #[test]
    fn without_ids_the_capture_is_missing_and_bytes_pass() {
        let mut c = TokenCollector::new(CaptureShape::Chat, HarnessAsked::default());
        let body = Bytes::from_static(
            br#"{"id":"x", "choices": [{"index": 0, "message": {"content": "hi"}, "logprobs": null}]}"#,
        );
        assert_eq!(c.strip_json(&body), body);
        let garbage = Bytes::from_static(b"<html>");
        assert_eq!(c.strip_json(&garbage), garbage);
        let t = c.finish();
        assert_eq!(t.status, TokenCapture::Missing);
        assert_eq!(t.completion_token_ids, None);
    }

    #[test]
    fn completions_shape_reads_per_choice_ids_and_token_logprobs() {
        let mut c = TokenCollector::new(CaptureShape::Completions, HarnessAsked::default());
        let ev = Bytes::from_static(
            b"data: {\"choices\":[{\"index\":0,\"text\":\"a\",\"logprobs\":{\"tokens\":[\"a\"],\"token_logprobs\":[-0.25],\"top_logprobs\":null,\"text_offset\":[0]},\"finish_reason\":null,\"prompt_token_ids\":[9,8],\"token_ids\":[4]}]}\n\n",
        );
        let out = c.strip_event(&ev);
        assert_eq!(
            &out[..],
            &b"data: {\"choices\":[{\"index\":0,\"text\":\"a\",\"logprobs\":null,\"finish_reason\":null,\"prompt_token_ids\":null,\"token_ids\":null}]}\n\n"[..]
        );
        let t = c.finish();
        assert_eq!(t.prompt_token_ids, Some(vec![9, 8]));
        assert_eq!(t.completion_token_ids, Some(vec![4]));
        assert_eq!(t.completion_logprobs, Some(vec![-0.25]));
    }
}

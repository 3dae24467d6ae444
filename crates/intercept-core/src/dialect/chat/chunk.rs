//! A `chat.completion.chunk` in types that borrow from its text, and the same types read
//! from a chunk parsed as a JSON object.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// A member of a chunk whose value is taken as a whole: as it stands in the chunk's
/// text, or out of a chunk parsed as a [`Value`].
#[derive(Clone, Copy)]
pub(super) enum Member<'a> {
    Raw(&'a RawValue),
    Parsed(&'a Value),
}

impl Member<'_> {
    pub(super) fn to_value(self) -> Value {
        match self {
            Member::Raw(raw) => serde_json::from_str(raw.get()).unwrap_or(Value::Null),
            Member::Parsed(value) => value.clone(),
        }
    }
}

impl<'a, 'de: 'a> Deserialize<'de> for Member<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'a RawValue>::deserialize(d).map(Member::Raw)
    }
}

/// A `chat.completion.chunk` as providers send it, read without building a
/// `serde_json::Value` tree (the hot path of every streamed call). Chunks that do not fit
/// these types are parsed as a JSON object and read through the same types
/// ([`WireChunk::from_map`]).
#[derive(Deserialize)]
pub(super) struct WireChunk<'a> {
    #[serde(default, borrow)]
    pub(super) error: Option<Member<'a>>,
    #[serde(default)]
    pub(super) choices: Option<Vec<WireChunkChoice<'a>>>,
    #[serde(default, borrow)]
    pub(super) usage: Option<Member<'a>>,
    #[serde(default, borrow)]
    pub(super) id: Option<Member<'a>>,
    #[serde(default, borrow)]
    pub(super) created: Option<Member<'a>>,
    #[serde(default, borrow)]
    pub(super) model: Option<Member<'a>>,
    #[serde(default, borrow)]
    pub(super) system_fingerprint: Option<Member<'a>>,
    #[serde(default, borrow)]
    pub(super) service_tier: Option<Member<'a>>,
}

#[derive(Deserialize)]
pub(super) struct WireChunkChoice<'a> {
    #[serde(default)]
    pub(super) index: u64,
    #[serde(default, borrow)]
    pub(super) finish_reason: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) delta: Option<WireDelta<'a>>,
}

#[derive(Deserialize)]
pub(super) struct WireDelta<'a> {
    #[serde(default, borrow)]
    pub(super) content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) reasoning: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) refusal: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) tool_calls: Option<Vec<WireToolDelta<'a>>>,
}

#[derive(Deserialize)]
pub(super) struct WireToolDelta<'a> {
    #[serde(default)]
    pub(super) index: u64,
    #[serde(default, borrow)]
    pub(super) id: Option<Cow<'a, str>>,
    #[serde(default, borrow, rename = "type")]
    pub(super) kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) function: Option<WireFunctionDelta<'a>>,
}

#[derive(Deserialize)]
pub(super) struct WireFunctionDelta<'a> {
    #[serde(default, borrow)]
    pub(super) name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) arguments: Option<Cow<'a, str>>,
}

impl<'a> WireChunk<'a> {
    /// A chunk that does not fit the wire types (a member of another type, a repeated
    /// key), read from its parsed object: a member of an unexpected type counts as
    /// absent, a present `error` is an error whatever its value, and a `null` head member
    /// is kept.
    pub(super) fn from_map(chunk: &'a Map<String, Value>) -> Self {
        let member = |key: &str| chunk.get(key).map(Member::Parsed);
        WireChunk {
            error: member("error"),
            choices: chunk
                .get("choices")
                .and_then(Value::as_array)
                .map(|choices| choices.iter().map(WireChunkChoice::from_value).collect()),
            usage: chunk
                .get("usage")
                .filter(|u| !u.is_null())
                .map(Member::Parsed),
            id: member("id"),
            created: member("created"),
            model: member("model"),
            system_fingerprint: member("system_fingerprint"),
            service_tier: member("service_tier"),
        }
    }
}

/// A string member of a parsed value, if it is one.
fn str_member<'a>(value: &'a Value, key: &str) -> Option<Cow<'a, str>> {
    value.get(key).and_then(Value::as_str).map(Cow::Borrowed)
}

/// A numeric index of a parsed value; 0 when absent or not a `u64`.
fn index_member(value: &Value) -> u64 {
    value.get("index").and_then(Value::as_u64).unwrap_or(0)
}

impl<'a> WireChunkChoice<'a> {
    fn from_value(choice: &'a Value) -> Self {
        WireChunkChoice {
            index: index_member(choice),
            finish_reason: str_member(choice, "finish_reason"),
            delta: choice.get("delta").map(WireDelta::from_value),
        }
    }
}

impl<'a> WireDelta<'a> {
    fn from_value(delta: &'a Value) -> Self {
        WireDelta {
            content: str_member(delta, "content"),
            reasoning_content: str_member(delta, "reasoning_content"),
            reasoning: str_member(delta, "reasoning"),
            refusal: str_member(delta, "refusal"),
            tool_calls: delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .map(|calls| calls.iter().map(WireToolDelta::from_value).collect()),
        }
    }
}

impl<'a> WireToolDelta<'a> {
    fn from_value(call: &'a Value) -> Self {
        WireToolDelta {
            index: index_member(call),
            id: str_member(call, "id"),
            kind: str_member(call, "type"),
            function: call.get("function").map(|f| WireFunctionDelta {
                name: str_member(f, "name"),
                arguments: str_member(f, "arguments"),
            }),
        }
    }
}

//! Token-in/token-out: a session with a `tokens` setting has each model call's
//! conversation rendered to token ids here (bridged from the previous turn's exact ids
//! when the conversation extends it), generated on the engine's token endpoint, and the
//! completion ids parsed back into the dialect's answer (`engine.rs`, `answer.rs`).
//!
//! - [`Tito`]: a session's renderer, its setting and the turns it can bridge from.
//! - [`Tito::plan`]: the prompt ids of one call, and how they were made.

mod answer;
mod engine;

use std::collections::VecDeque;
use std::sync::Arc;

use intercept_core::episode::{Message, Role, ToolCall};
use intercept_core::{DialectKind, Error, JsonBody, OnMismatch, TokenPath, TokensConfig};
use intercept_tokens::{ChatMessage, Renderer, RendererOptions, ToolSpec};
use parking_lot::Mutex;
use serde_json::Value;

pub(crate) use answer::AnswerWriter;
pub(crate) use engine::{request_body, EngineAnswer, TokenSlot};

/// Turns kept per session to bridge from: the last turn of each of a few conversations
/// that interleave (a harness and its subagents).
const TURNS_KEPT: usize = 4;

/// A message's key: its visible content hash (role, content, tool calls, tool-call id;
/// reasoning left out, since harnesses drop it when they send a turn back).
type Key = [u8; 16];

/// A session's token path: its renderer (its tokenizer loaded once per process), its
/// setting, and the last turns it can bridge from.
#[derive(Debug)]
pub(crate) struct Tito {
    pub(crate) config: TokensConfig,
    pub(crate) renderer: Arc<dyn Renderer>,
    turns: Mutex<VecDeque<Turn>>,
}

/// One finished turn: the conversation it covers (its request's messages and the
/// message it sampled), and the exact ids of its prompt and completion.
#[derive(Debug)]
struct Turn {
    keys: Vec<Key>,
    tools: u64,
    prompt_ids: Arc<[u32]>,
    completion_ids: Arc<[u32]>,
}

/// What a call sends to the engine.
#[derive(Debug)]
pub(crate) enum Plan {
    /// These prompt ids, made by `path` (with the reason it was not bridged).
    Ids {
        prompt_ids: Vec<u32>,
        path: TokenPath,
        reason: Option<String>,
    },
    /// The upstream's chat endpoint with `return_token_ids` (`on_mismatch = "chat"`).
    Chat { reason: String },
}

/// The request's conversation, read for the renderer and keyed for the bridge.
#[derive(Debug)]
pub(crate) struct Conversation {
    /// A Chat Completions request (only those can go to the chat endpoint instead).
    chat: bool,
    pub(crate) messages: Vec<ChatMessage>,
    pub(crate) tools: Vec<ToolSpec>,
    keys: Vec<Key>,
    tools_hash: u64,
}

/// What a successful turn leaves for the next: the conversation's keys and the ids.
#[derive(Debug)]
pub(crate) struct Pending {
    keys: Vec<Key>,
    tools: u64,
}

impl Tito {
    /// The token path of a session with `config`: its tokenizer (loaded once per process)
    /// and renderer. Blocking (a first load reads and parses the tokenizer's files): run
    /// it off the runtime's threads.
    pub(crate) fn load(config: &TokensConfig) -> Result<Self, Error> {
        let tokenizer = intercept_tokens::shared(&config.tokenizer).map_err(|e| {
            Error::invalid(format!(
                "tokens.tokenizer: {e} (a folder holding tokenizer.json and tokenizer_config.json, or the tokenizer.json file)"
            ))
        })?;
        let mut options = RendererOptions::default();
        if let Some(on) = config.enable_thinking {
            options = options.with_enable_thinking(on);
        }
        let renderer = intercept_tokens::renderer(&config.renderer, tokenizer, &options)
            .map_err(|e| Error::invalid(format!("tokens.renderer: {e}")))?;
        Ok(Tito {
            config: config.clone(),
            renderer,
            turns: Mutex::new(VecDeque::new()),
        })
    }

    /// The prompt ids of a call on `conversation`: bridged from the turn it extends, else
    /// rendered whole (or what `on_mismatch` says).
    pub(crate) fn plan(&self, conversation: &Conversation) -> Result<Plan, Error> {
        let (prefix, prompt_ids, completion_ids) = {
            let turns = self.turns.lock();
            let best = turns
                .iter()
                .filter(|t| {
                    t.tools == conversation.tools_hash
                        && t.keys.len() <= conversation.keys.len()
                        && conversation.keys[..t.keys.len()] == t.keys[..]
                })
                .max_by_key(|t| t.keys.len());
            match best {
                Some(t) => (
                    Some(t.keys.len()),
                    t.prompt_ids.clone(),
                    t.completion_ids.clone(),
                ),
                None if turns.is_empty() => (None, Arc::from([]), Arc::from([])),
                None => {
                    let tools_changed = turns.iter().any(|t| {
                        t.tools != conversation.tools_hash
                            && t.keys.len() <= conversation.keys.len()
                            && conversation.keys[..t.keys.len()] == t.keys[..]
                    });
                    drop(turns);
                    let reason = if tools_changed {
                        "tools_changed"
                    } else {
                        "history_edited"
                    };
                    return self.mismatch(conversation, reason);
                }
            }
        };
        let Some(prefix) = prefix else {
            return self.render(conversation, TokenPath::Rendered, Some("first_turn".into()));
        };
        let tail = &conversation.messages[prefix..];
        // verifiers' train client bridges only tool results, then at most one user
        // message: any other tail is rendered whole there, and so here.
        if !intercept_tokens::is_incremental_tail(tail) {
            return self.mismatch(conversation, "tail_not_incremental");
        }
        match self
            .renderer
            .bridge(&prompt_ids, &completion_ids, tail, &conversation.tools)
        {
            Ok(bridged) => Ok(Plan::Ids {
                prompt_ids: bridged.token_ids,
                path: TokenPath::Bridged,
                reason: None,
            }),
            Err(decline) => self.mismatch(conversation, decline.as_str()),
        }
    }

    fn mismatch(&self, conversation: &Conversation, reason: &str) -> Result<Plan, Error> {
        match self.config.on_mismatch {
            OnMismatch::Chat if conversation.chat => Ok(Plan::Chat {
                reason: reason.to_owned(),
            }),
            OnMismatch::Fail => Err(Error::Conflict(format!(
                "token path: this turn does not extend the previous turn's token ids ({reason}); \
                 the session's tokens.on_mismatch is \"fail\" (use \"render\" to render it whole, \
                 or \"chat\" to let the engine render it)"
            ))),
            _ => self.render(conversation, TokenPath::Rendered, Some(reason.to_owned())),
        }
    }

    fn render(
        &self,
        conversation: &Conversation,
        path: TokenPath,
        reason: Option<String>,
    ) -> Result<Plan, Error> {
        let rendered = self
            .renderer
            .render(&conversation.messages, &conversation.tools, true)
            .map_err(|e| {
                Error::invalid(format!("token path: cannot render the conversation: {e}"))
            })?;
        Ok(Plan::Ids {
            prompt_ids: rendered.token_ids,
            path,
            reason,
        })
    }

    /// A turn finished: what it covers (its conversation and the message it sampled)
    /// becomes the newest turn to bridge from.
    pub(crate) fn finished(
        &self,
        pending: Pending,
        sampled: &Message,
        prompt: &[u32],
        completion: &[u32],
    ) {
        let mut keys = pending.keys;
        keys.push(sampled.hashes().1);
        let turn = Turn {
            keys,
            tools: pending.tools,
            prompt_ids: Arc::from(prompt),
            completion_ids: Arc::from(completion),
        };
        let mut turns = self.turns.lock();
        // The turn it extends is superseded.
        turns.retain(|t| {
            !(t.keys.len() < turn.keys.len() && turn.keys[..t.keys.len()] == t.keys[..])
        });
        if turns.len() >= TURNS_KEPT {
            turns.pop_front();
        }
        turns.push_back(turn);
    }
}

/// `response` (a dialect's JSON answer) with `bad` as its `tool_call_errors`: on the
/// Chat message, at the top of a Responses or Anthropic answer.
pub(crate) fn with_malformed(
    kind: DialectKind,
    response: &intercept_core::RawJson,
    bad: &Value,
) -> intercept_core::RawJson {
    let mut value = response.to_value();
    let target = match kind {
        DialectKind::ChatCompletions => value.pointer_mut("/choices/0/message"),
        _ => Some(&mut value),
    };
    match target {
        Some(Value::Object(map)) => {
            map.insert("tool_call_errors".into(), bad.clone());
            intercept_core::RawJson::new(serde_json::to_vec(&value).unwrap_or_default().into())
        }
        _ => response.clone(),
    }
}

impl Conversation {
    /// The conversation of a request in `kind`'s dialect.
    pub(crate) fn read(kind: DialectKind, body: &JsonBody) -> Result<Self, Error> {
        let (messages, keys) = match kind {
            DialectKind::ChatCompletions => {
                let raw = body
                    .raw("messages")
                    .ok_or_else(|| Error::invalid("`messages` is required"))?;
                let text = std::str::from_utf8(raw)
                    .map_err(|_| Error::invalid("`messages` is not UTF-8"))?;
                let messages = ChatMessage::parse_array(text)
                    .map_err(|e| Error::invalid(format!("messages: {e}")))?;
                let view = intercept_core::episode::request_messages(kind, body)
                    .ok_or_else(|| Error::invalid("`messages` must be an array"))?;
                text_only(&view)?;
                let keys = view.iter().map(|m| m.hashes().1).collect();
                (messages, keys)
            }
            DialectKind::Responses | DialectKind::Messages => {
                if kind == DialectKind::Responses && body.raw("previous_response_id").is_some_and(|v| v != b"null") {
                    return Err(Error::invalid(
                        "token path: `previous_response_id` is not supported: send the whole conversation in `input` (store: false)",
                    ));
                }
                let view = intercept_core::episode::request_messages(kind, body)
                    .ok_or_else(|| Error::invalid("the request holds no conversation"))?;
                text_only(&view)?;
                let keys = view.iter().map(|m| m.hashes().1).collect();
                let messages = view.iter().map(chat_message).collect::<Result<_, _>>()?;
                (messages, keys)
            }
            _ => {
                return Err(Error::invalid(
                    "token path: legacy completions take a prompt, not a conversation; use chat completions",
                ))
            }
        };
        let tools = tools_of(kind, body)?;
        let tools_hash = body.raw("tools").map_or(0, xxhash_rust::xxh3::xxh3_64);
        Ok(Conversation {
            chat: kind == DialectKind::ChatCompletions,
            messages,
            tools,
            keys,
            tools_hash,
        })
    }

    /// What the turn leaves for the next, once it succeeds.
    pub(crate) fn pending(&self) -> Pending {
        Pending {
            keys: self.keys.clone(),
            tools: self.tools_hash,
        }
    }
}

/// Refuses a conversation with images or other non-text content: the renderer renders
/// text (a multimodal turn has no ids it could bridge).
fn text_only(messages: &[Message]) -> Result<(), Error> {
    let other = messages
        .iter()
        .flat_map(|m| &m.content)
        .find(|p| !matches!(p, intercept_core::episode::Part::Text { .. }));
    match other {
        None => Ok(()),
        Some(_) => Err(Error::invalid(
            "token path: this renderer renders text only, and the conversation holds an image              or another non-text part; send text, or use a session without `tokens` for              multimodal rollouts",
        )),
    }
}

/// A message of the core view as the renderer's Chat message.
fn chat_message(m: &Message) -> Result<ChatMessage, Error> {
    // Non-text parts were refused by `text_only`.
    let text = m
        .content
        .iter()
        .filter_map(|p| match p {
            intercept_core::episode::Part::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<String>();
    Ok(match m.role {
        Role::System => ChatMessage::system(text),
        Role::User => ChatMessage::user(text),
        Role::Tool => ChatMessage::tool(m.tool_call_id.clone().unwrap_or_default(), text),
        _ => ChatMessage::assistant(
            (!text.is_empty()).then_some(text),
            m.reasoning.clone(),
            m.tool_calls.iter().map(tool_call_in).collect(),
        ),
    })
}

fn tool_call_in(c: &ToolCall) -> intercept_tokens::ToolCallIn {
    let arguments = match &c.arguments {
        Value::String(s) => serde_json::to_string(s).unwrap_or_default(),
        other => other.to_string(),
    };
    intercept_tokens::ToolCallIn::new(Some(c.id.clone()), c.name.clone(), arguments)
}

/// The request's tools as the renderer's (Chat's shape, key order kept).
fn tools_of(kind: DialectKind, body: &JsonBody) -> Result<Vec<ToolSpec>, Error> {
    let Some(raw) = body.raw("tools").filter(|r| *r != b"null") else {
        return Ok(Vec::new());
    };
    let text = std::str::from_utf8(raw).map_err(|_| Error::invalid("`tools` is not UTF-8"))?;
    if kind == DialectKind::ChatCompletions {
        return ToolSpec::parse_array(text).map_err(|e| Error::invalid(format!("tools: {e}")));
    }
    // Responses `{type, name, description, parameters}` and Anthropic
    // `{name, description, input_schema}` become Chat's `{type, function: {...}}`.
    let tools: Vec<&serde_json::value::RawValue> =
        serde_json::from_str(text).map_err(|e| Error::invalid(format!("tools: {e}")))?;
    let mut out = Vec::with_capacity(tools.len());
    for tool in tools {
        let fields: std::collections::HashMap<&str, &serde_json::value::RawValue> =
            serde_json::from_str(tool.get())
                .map_err(|e| Error::invalid(format!("tools: each tool must be an object: {e}")))?;
        let string = |key: &str| -> Option<String> {
            fields
                .get(key)
                .and_then(|v| serde_json::from_str::<String>(v.get()).ok())
        };
        if kind == DialectKind::Responses
            && string("type").is_some_and(|k| k != "function" && k != "custom")
        {
            // Built-in tools (web search, file search, ...) are not the model's to call
            // through a chat template: they are left out.
            continue;
        }
        let Some(name) = string("name") else {
            return Err(Error::invalid("tools: every tool needs a `name`"));
        };
        let description = string("description").unwrap_or_default();
        let parameters = fields
            .get("parameters")
            .or_else(|| fields.get("input_schema"))
            .map_or("{}", |p| p.get());
        let strict = fields
            .get("strict")
            .and_then(|v| serde_json::from_str::<bool>(v.get()).ok());
        out.push(
            ToolSpec::function(&name, &description, parameters, strict)
                .map_err(|e| Error::invalid(format!("tools: {e}")))?,
        );
    }
    Ok(out)
}

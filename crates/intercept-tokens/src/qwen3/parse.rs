//! A Qwen3 completion read back (renderers' `parsing.parse_qwen3`): the initial reasoning
//! region, the content before the first tool call, and every `<tool_call>` block.

use super::scan::{Boundary, RegionEnd, Scanner};
use crate::pycompat::json::{self, Value};
use crate::pycompat::text;
use crate::render::{ParsedResponse, ParsedToolCall, ToolCallStatus};

pub(super) fn parse(sc: Scanner<'_>, completion_ids: &[u32], prefilled: bool) -> ParsedResponse {
    let ids = match completion_ids.iter().position(|&t| sc.ids.is_stop(t)) {
        Some(stop) => &completion_ids[..stop],
        None => completion_ids,
    };
    let boundary = sc.initial(ids, prefilled, true);
    let (region, end) = match &boundary {
        Boundary::None => (None, None),
        Boundary::Region { ids: region, end } => (Some(region.clone()), Some(*end)),
    };
    if let (Some(region), Some(RegionEnd::Open)) = (&region, end) {
        return ParsedResponse {
            content: String::new(),
            reasoning_content: Some(sc.region_text(&ids[region.clone()])),
            tool_calls: Vec::new(),
            reasoning_complete: false,
        };
    }
    let find = |target: u32, from: usize| {
        ids.get(from..)
            .and_then(|rest| rest.iter().position(|&t| t == target))
            .map(|p| from + p)
    };
    // Tool calls are looked for after the initial region only.
    let scan_start = match end {
        Some(RegionEnd::Tool(tool)) => tool,
        Some(RegionEnd::Close(_)) => find(sc.ids.think_end, 0).map_or(0, |p| p + 1),
        _ => 0,
    };
    let tc_start = find(sc.ids.tool_call, scan_start);
    let tool_calls = match tc_start {
        Some(start) => tool_calls(sc, ids, start),
        None => Vec::new(),
    };
    let content_ids = &ids[..tc_start.unwrap_or(ids.len())];

    let (content, reasoning) = match (region, end) {
        (Some(region), Some(RegionEnd::Tool(_))) => {
            let reasoning = text::strip(&sc.region_text(&ids[region])).to_owned();
            (String::new(), Some(reasoning))
        }
        (Some(region), _) => {
            let text = sc.tok.decode(content_ids);
            match text.split_once("</think>") {
                Some((_, after)) => {
                    let reasoning = text::strip(&sc.region_text(&ids[region])).to_owned();
                    (text::strip(after).to_owned(), Some(reasoning))
                }
                None => (text::strip(&text).to_owned(), None),
            }
        }
        (None, _) => (text::strip(&sc.tok.decode(content_ids)).to_owned(), None),
    };
    ParsedResponse {
        content,
        reasoning_content: reasoning.filter(|r| !r.is_empty()),
        tool_calls,
        reasoning_complete: true,
    }
}

/// Every `<tool_call>` block from `start` on; ids outside blocks are skipped.
fn tool_calls(sc: Scanner<'_>, ids: &[u32], start: usize) -> Vec<ParsedToolCall> {
    let mut out = Vec::new();
    let mut i = start;
    while i < ids.len() {
        if ids[i] != sc.ids.tool_call {
            i += 1;
            continue;
        }
        match ids[i + 1..].iter().position(|&t| t == sc.ids.tool_call_end) {
            None => {
                out.push(unclosed(sc, ids, i));
                break;
            }
            Some(p) => {
                let end = i + 1 + p;
                out.push(block(sc, &ids[i + 1..end], (i, end + 1)));
                i = end + 1;
            }
        }
    }
    out
}

/// A block that runs to the end of the completion.
pub(super) fn unclosed(sc: Scanner<'_>, ids: &[u32], open: usize) -> ParsedToolCall {
    ParsedToolCall {
        raw: text::strip(&sc.tok.decode(&ids[open + 1..])).to_owned(),
        name: None,
        arguments: None,
        status: ToolCallStatus::UnclosedBlock,
        token_span: (open, ids.len()),
    }
}

/// One closed block: its body's ids and its span.
pub(super) fn block(sc: Scanner<'_>, body: &[u32], span: (usize, usize)) -> ParsedToolCall {
    let decoded = sc.tok.decode(body);
    let raw = text::strip(&decoded);
    let Ok(value) = json::loads(raw) else {
        return ParsedToolCall {
            raw: raw.to_owned(),
            name: None,
            arguments: None,
            status: ToolCallStatus::InvalidJson,
            token_span: span,
        };
    };
    // `parsed.get("name", "")` and `parsed.get("arguments", {})` of a dict; `""` and
    // `{}` of anything else.
    let (name, arguments) = match &value {
        Value::Object(_) => (value.get("name"), value.get("arguments")),
        _ => (None, None),
    };
    let named = name.is_some_and(Value::truthy);
    ParsedToolCall {
        raw: raw.to_owned(),
        name: if named {
            name.and_then(Value::as_str)
                .map(|s| s.to_str_lossy().into_owned())
        } else {
            None
        },
        arguments: Some(verifiers_arguments(arguments)),
        status: if named {
            ToolCallStatus::Ok
        } else {
            ToolCallStatus::MissingName
        },
        token_span: span,
    }
}

/// verifiers' `tc.arguments if isinstance(tc.arguments, str) else json.dumps(tc.arguments
/// or {})`.
fn verifiers_arguments(arguments: Option<&Value<'_>>) -> String {
    match arguments {
        Some(Value::Str(s)) => s.to_str_lossy().into_owned(),
        Some(v) if v.truthy() => json::dumps(v, true).unwrap_or_default(),
        _ => String::from("{}"),
    }
}

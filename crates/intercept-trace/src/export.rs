//! Episodes as Parquet (`intercept trace export --format parquet`): one row per branch,
//! ready for a trainer (pyarrow, Hugging Face `datasets`).

use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{
    ArrayBuilder, BooleanBuilder, Float64Builder, ListBuilder, StringBuilder, StructBuilder,
    UInt32Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, FieldRef, Fields, Schema};
use intercept_core::episode::{Episode, Message, Part, Role};
use parquet::arrow::ArrowWriter;

/// What can go wrong writing an export.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The file could not be written.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Arrow or Parquet refused the data.
    #[error("{0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// Arrow refused the data.
    #[error("{0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// A column builder of the `messages` column is not of the kind its field needs (a
    /// defect of this exporter: report it).
    #[error("the Parquet exporter built field {0} of a message column with the wrong builder; this is a defect of intercept, please report it")]
    Builder(usize),
}

/// The fields of one content part (`messages.content` items): `type` (`text`, `image`
/// or `data`), then the one of `text`, `url` (an image reference) or `data` (canonical
/// JSON) that the type has; the others are null.
pub fn part_fields() -> Fields {
    Fields::from(vec![
        Field::new("type", DataType::Utf8, false),
        Field::new("text", DataType::Utf8, true),
        Field::new("url", DataType::Utf8, true),
        Field::new("data", DataType::Utf8, true),
    ])
}

/// The fields of one tool call (`messages.tool_calls` items): `id`, `name` and
/// `arguments` (JSON text, keys sorted, as Chat Completions' `function.arguments`).
pub fn tool_call_fields() -> Fields {
    Fields::from(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("arguments", DataType::Utf8, false),
    ])
}

/// The fields of one message (the items of `messages`), those of
/// [`intercept_core::episode::Message`]: `role` (`system`, `user`, `assistant`, `tool`),
/// `content` (a list of [`part_fields`]), `reasoning`, `tool_calls` (a list of
/// [`tool_call_fields`]), `tool_call_id` and `state` (opaque provider state).
pub fn message_fields() -> Fields {
    Fields::from(vec![
        Field::new("role", DataType::Utf8, false),
        Field::new("content", list_of(DataType::Struct(part_fields())), false),
        Field::new("reasoning", DataType::Utf8, true),
        Field::new(
            "tool_calls",
            list_of(DataType::Struct(tool_call_fields())),
            false,
        ),
        Field::new("tool_call_id", DataType::Utf8, true),
        Field::new("state", DataType::Utf8, true),
    ])
}

/// The item field of a list column: named `item`, never null.
fn item(data: DataType) -> FieldRef {
    Arc::new(Field::new("item", data, false))
}

fn list_of(data: DataType) -> DataType {
    DataType::List(item(data))
}

/// The columns of an export, one row per branch:
///
/// | column | type | what |
/// |---|---|---|
/// | `session` | string | the session (rollout) id |
/// | `leaf` | uint32 | the branch's leaf node |
/// | `path` | list\<uint32\> | node ids from the root to the leaf |
/// | `turns` | uint32 | sampled nodes on the path (of its token sequence, with tokens) |
/// | `token_ids` | list\<uint32\> | the leaf call's prompt ids then its completion ids (null without capture) |
/// | `mask` | list\<bool\> | true on every sampled token |
/// | `logprobs` | list\<float64\> | aligned with `token_ids`, 0 where `mask` is false (null when a turn has none) |
/// | `prompt_len` | uint32 | tokens before the first sampled one |
/// | `completion_tokens` | uint32 | sampled tokens |
/// | `messages` | list\<struct\> | the path's messages ([`message_fields`]) |
pub fn schema() -> Schema {
    let list = |name: &str, data: DataType| {
        Field::new(
            name,
            DataType::List(Arc::new(Field::new("item", data, true))),
            true,
        )
    };
    Schema::new(vec![
        Field::new("session", DataType::Utf8, false),
        Field::new("leaf", DataType::UInt32, false),
        list("path", DataType::UInt32),
        Field::new("turns", DataType::UInt32, false),
        list("token_ids", DataType::UInt32),
        list("mask", DataType::Boolean),
        list("logprobs", DataType::Float64),
        Field::new("prompt_len", DataType::UInt32, true),
        Field::new("completion_tokens", DataType::UInt32, true),
        Field::new(
            "messages",
            list_of(DataType::Struct(message_fields())),
            false,
        ),
    ])
}

/// A `list<struct>` builder whose items have `fields`, one string builder per field.
fn strings_list(fields: Fields) -> ListBuilder<StructBuilder> {
    let builders = fields
        .iter()
        .map(|_| Box::new(StringBuilder::new()) as Box<dyn ArrayBuilder>)
        .collect();
    let data = DataType::Struct(fields.clone());
    ListBuilder::new(StructBuilder::new(fields, builders)).with_field(item(data))
}

/// Builds the `messages` column: a list of message structs per row.
struct MessagesBuilder {
    list: ListBuilder<StructBuilder>,
}

/// The positions of [`message_fields`] and of the nested fields.
const ROLE: usize = 0;
const CONTENT: usize = 1;
const REASONING: usize = 2;
const TOOL_CALLS: usize = 3;
const TOOL_CALL_ID: usize = 4;
const STATE: usize = 5;

impl MessagesBuilder {
    fn new() -> Self {
        let fields = message_fields();
        let builders: Vec<Box<dyn ArrayBuilder>> = vec![
            Box::new(StringBuilder::new()),
            Box::new(strings_list(part_fields())),
            Box::new(StringBuilder::new()),
            Box::new(strings_list(tool_call_fields())),
            Box::new(StringBuilder::new()),
            Box::new(StringBuilder::new()),
        ];
        let data = DataType::Struct(fields.clone());
        MessagesBuilder {
            list: ListBuilder::new(StructBuilder::new(fields, builders)).with_field(item(data)),
        }
    }

    /// Appends one row: `messages`, in order.
    fn append<'a>(
        &mut self,
        messages: impl IntoIterator<Item = &'a Message>,
    ) -> Result<(), ExportError> {
        let structs = self.list.values();
        for m in messages {
            string(structs, ROLE)?.append_value(role_name(m.role));
            let content = list(structs, CONTENT)?;
            for part in &m.content {
                let (kind, text, url, data) = part_columns(part);
                let p = content.values();
                string(p, 0)?.append_value(kind);
                string(p, 1)?.append_option(text);
                string(p, 2)?.append_option(url);
                string(p, 3)?.append_option(data);
                p.append(true);
            }
            content.append(true);
            string(structs, REASONING)?.append_option(m.reasoning.as_deref());
            let calls = list(structs, TOOL_CALLS)?;
            for call in &m.tool_calls {
                let c = calls.values();
                string(c, 0)?.append_value(&call.id);
                string(c, 1)?.append_value(&call.name);
                string(c, 2)?.append_value(json_text(&call.arguments));
                c.append(true);
            }
            calls.append(true);
            string(structs, TOOL_CALL_ID)?.append_option(m.tool_call_id.as_deref());
            string(structs, STATE)?.append_option(m.state.as_deref());
            structs.append(true);
        }
        self.list.append(true);
        Ok(())
    }
}

/// The string builder of field `i` of a struct the export builds.
fn string(s: &mut StructBuilder, i: usize) -> Result<&mut StringBuilder, ExportError> {
    s.field_builder::<StringBuilder>(i)
        .ok_or(ExportError::Builder(i))
}

/// The list builder of field `i` (the `content` and `tool_calls` positions).
fn list(s: &mut StructBuilder, i: usize) -> Result<&mut ListBuilder<StructBuilder>, ExportError> {
    s.field_builder::<ListBuilder<StructBuilder>>(i)
        .ok_or(ExportError::Builder(i))
}

/// A role's name, as the trace log writes it.
fn role_name(role: Role) -> String {
    match role {
        Role::System => "system".into(),
        Role::User => "user".into(),
        Role::Assistant => "assistant".into(),
        Role::Tool => "tool".into(),
        other => serde_json::to_value(other)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
    }
}

/// A part's `type`, `text`, `url` and `data` columns.
fn part_columns(part: &Part) -> (String, Option<&str>, Option<&str>, Option<String>) {
    match part {
        Part::Text { text } => ("text".into(), Some(text), None, None),
        Part::Image { url } => ("image".into(), None, Some(url), None),
        Part::Data { value } => ("data".into(), None, None, Some(json_text(value))),
        other => {
            // A kind of part this exporter does not know: its tag, and the rest as data.
            let mut value = serde_json::to_value(other).unwrap_or_default();
            let kind = value
                .as_object_mut()
                .and_then(|o| o.remove("type"))
                .and_then(|t| t.as_str().map(str::to_owned))
                .unwrap_or_default();
            (kind, None, None, Some(json_text(&value)))
        }
    }
}

fn json_text(value: &serde_json::Value) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".into())
}

/// The branches of `episodes` as one Arrow batch (see [`schema`]).
pub fn branches_batch(episodes: &[Episode]) -> Result<RecordBatch, ExportError> {
    let mut session = StringBuilder::new();
    let mut leaf = UInt32Builder::new();
    let mut path = ListBuilder::new(UInt32Builder::new());
    let mut turns = UInt32Builder::new();
    let mut ids = ListBuilder::new(UInt32Builder::new());
    let mut mask = ListBuilder::new(BooleanBuilder::new());
    let mut logprobs = ListBuilder::new(Float64Builder::new());
    let mut prompt_len = UInt32Builder::new();
    let mut completion = UInt32Builder::new();
    let mut messages = MessagesBuilder::new();
    for e in episodes {
        for b in &e.branches {
            session.append_value(&e.session);
            leaf.append_value(b.leaf);
            path.values().append_slice(&b.path);
            path.append(true);
            turns.append_value(b.turns);
            match &b.token_ids {
                Some(t) => {
                    ids.values().append_slice(t);
                    ids.append(true);
                }
                None => ids.append(false),
            }
            match &b.mask {
                Some(m) => {
                    for &x in m {
                        mask.values().append_value(x);
                    }
                    mask.append(true);
                }
                None => mask.append(false),
            }
            match &b.logprobs {
                Some(l) => {
                    logprobs.values().append_slice(l);
                    logprobs.append(true);
                }
                None => logprobs.append(false),
            }
            prompt_len.append_option(b.prompt_len);
            completion.append_option(b.completion_tokens);
            messages.append(
                b.path
                    .iter()
                    .filter_map(|&n| e.nodes.get(n as usize).map(|n| &n.message)),
            )?;
        }
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(session.finish()),
        Arc::new(leaf.finish()),
        Arc::new(path.finish()),
        Arc::new(turns.finish()),
        Arc::new(ids.finish()),
        Arc::new(mask.finish()),
        Arc::new(logprobs.finish()),
        Arc::new(prompt_len.finish()),
        Arc::new(completion.finish()),
        Arc::new(messages.list.finish()),
    ];
    Ok(RecordBatch::try_new(Arc::new(schema()), columns)?)
}

/// Writes the branches of `episodes` to a Parquet file at `out` (see [`schema`]);
/// returns the rows written.
pub fn write_parquet(episodes: &[Episode], out: &Path) -> Result<usize, ExportError> {
    let batch = branches_batch(episodes)?;
    let tmp = out.with_extension("parquet.tmp");
    let file = std::fs::File::create(&tmp)?;
    let mut writer = ArrowWriter::try_new(file, batch.schema(), None)?;
    writer.write(&batch)?;
    writer.close()?;
    std::fs::rename(&tmp, out)?;
    Ok(batch.num_rows())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::{Array, ListArray, StructArray};
    use intercept_core::episode::{Branch, EpisodeSummary, Node, ToolCall};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use serde_json::json;

    fn node(id: u32, parent: Option<u32>, message: Message) -> Node {
        Node {
            id,
            parent,
            hash: format!("{id:032x}"),
            sampled: message.role == Role::Assistant,
            message,
            call: None,
            token_ids: None,
            mask: None,
            logprobs: None,
            token_start: false,
            token_break: None,
        }
    }

    fn branch(path: Vec<u32>) -> Branch {
        Branch {
            leaf: path.last().copied().unwrap_or(0),
            turns: 1,
            path,
            token_start: None,
            token_ids: None,
            mask: None,
            logprobs: None,
            prompt_len: None,
            completion_tokens: None,
        }
    }

    /// A system prompt, a user turn with an image, an assistant turn with reasoning and a
    /// tool call, the tool's result with a data part, and two answers (two branches).
    fn episode() -> Episode {
        let mut user = Message::text(Role::User, "what is in the picture?");
        user.content.push(Part::Image {
            url: "https://example.com/cat.png".into(),
        });
        let mut call = Message::new(Role::Assistant);
        call.reasoning = Some("look at it first".into());
        call.state = Some("sig-1".into());
        call.tool_calls.push(ToolCall {
            id: "call_1".into(),
            name: "look".into(),
            arguments: json!({"a": 1, "b": [true, null]}),
        });
        let mut result = Message::text(Role::Tool, "a cat");
        result.tool_call_id = Some("call_1".into());
        result.content.push(Part::Data {
            value: json!({"kind": "document", "pages": 2}),
        });
        let nodes = vec![
            node(0, None, Message::text(Role::System, "be brief")),
            node(1, Some(0), user),
            node(2, Some(1), call),
            node(3, Some(2), result),
            node(4, Some(3), Message::text(Role::Assistant, "A cat.")),
            node(5, Some(3), Message::text(Role::Assistant, "It is a cat.")),
        ];
        Episode {
            session: "rollout-1".into(),
            nodes,
            branches: vec![branch(vec![0, 1, 2, 3, 4]), branch(vec![0, 1, 2, 3, 5])],
            summary: EpisodeSummary::default(),
        }
    }

    fn strings(s: &StructArray, name: &str) -> Vec<Option<String>> {
        let column = s.column_by_name(name).unwrap().as_string::<i32>();
        column.iter().map(|v| v.map(str::to_owned)).collect()
    }

    #[test]
    fn messages_are_written_as_nested_lists_of_structs_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("branches.parquet");
        let rows = write_parquet(&[episode()], &out).unwrap();
        assert_eq!(rows, 2);

        let file = std::fs::File::open(&out).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap();
        let batches: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
        assert_eq!(batches.len(), 1);
        let batch = &batches[0];
        assert_eq!(batch.num_rows(), 2);
        let field = batch.schema().field_with_name("messages").unwrap().clone();
        assert_eq!(
            field.data_type(),
            &list_of(DataType::Struct(message_fields()))
        );

        let messages: &ListArray = batch.column_by_name("messages").unwrap().as_list::<i32>();
        assert_eq!(messages.value_offsets(), &[0, 5, 10]);
        let row: ArrayRef = messages.value(0);
        let row = row.as_struct();
        assert_eq!(
            strings(row, "role"),
            ["system", "user", "assistant", "tool", "assistant"].map(|r| Some(r.to_owned()))
        );
        assert_eq!(
            strings(row, "reasoning"),
            [None, None, Some("look at it first".to_owned()), None, None]
        );
        assert_eq!(strings(row, "state")[2].as_deref(), Some("sig-1"));
        assert_eq!(strings(row, "tool_call_id")[3].as_deref(), Some("call_1"));

        // Content parts: the user's text and image, the tool's text and data.
        let content = row.column_by_name("content").unwrap().as_list::<i32>();
        assert_eq!(content.value_offsets(), &[0, 1, 3, 3, 5, 6]);
        let user: ArrayRef = content.value(1);
        let user = user.as_struct();
        assert_eq!(
            strings(user, "type"),
            [Some("text".to_owned()), Some("image".to_owned())]
        );
        assert_eq!(
            strings(user, "text"),
            [Some("what is in the picture?".to_owned()), None]
        );
        assert_eq!(
            strings(user, "url"),
            [None, Some("https://example.com/cat.png".to_owned())]
        );
        let tool: ArrayRef = content.value(3);
        let tool = tool.as_struct();
        assert_eq!(strings(tool, "type")[1].as_deref(), Some("data"));
        let data: serde_json::Value =
            serde_json::from_str(strings(tool, "data")[1].as_deref().unwrap()).unwrap();
        assert_eq!(data, json!({"kind": "document", "pages": 2}));

        // Tool calls: only the third message has one.
        let calls = row.column_by_name("tool_calls").unwrap().as_list::<i32>();
        assert_eq!(calls.value_offsets(), &[0, 0, 0, 1, 1, 1]);
        let call: ArrayRef = calls.value(2);
        let call = call.as_struct();
        assert_eq!(strings(call, "id"), [Some("call_1".to_owned())]);
        assert_eq!(strings(call, "name"), [Some("look".to_owned())]);
        assert_eq!(
            strings(call, "arguments"),
            [Some(r#"{"a":1,"b":[true,null]}"#.to_owned())]
        );

        // The second branch ends in the other answer.
        let second: ArrayRef = messages.value(1);
        let last = second.as_struct().column_by_name("content").unwrap();
        let last = last.as_list::<i32>().value(4);
        assert_eq!(
            strings(last.as_struct(), "text"),
            [Some("It is a cat.".to_owned())]
        );
        assert_eq!(messages.null_count(), 0);
    }
}

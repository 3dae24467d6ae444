//! Episodes as Parquet (`intercept trace export --format parquet`): one row per branch,
//! ready for a trainer (pyarrow, Hugging Face `datasets`).

use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Float64Builder, ListBuilder, StringBuilder, UInt32Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use intercept_core::episode::Episode;
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
/// | `messages` | string | the path's messages, a JSON array ([`intercept_core::episode::Message`]) |
pub fn schema() -> Schema {
    let list = |name: &str, item: DataType| {
        Field::new(
            name,
            DataType::List(Arc::new(Field::new("item", item, true))),
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
        Field::new("messages", DataType::Utf8, false),
    ])
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
    let mut messages = StringBuilder::new();
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
            let path_messages: Vec<_> = b
                .path
                .iter()
                .filter_map(|&n| e.nodes.get(n as usize).map(|n| &n.message))
                .collect();
            messages.append_value(
                serde_json::to_string(&path_messages).unwrap_or_else(|_| "[]".into()),
            );
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
        Arc::new(messages.finish()),
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

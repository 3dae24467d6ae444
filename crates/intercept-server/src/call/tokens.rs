//! A call on the token path: the conversation rendered (or bridged) to ids, sent to the
//! engine's token endpoint, its answer turned into the dialect's as it arrives.

use std::sync::Arc;

use http::{Response, StatusCode};
use intercept_core::{Error, TurnTokens};
use tokio::time::Instant;

use super::Call;
use crate::tokens::{request_body, AnswerWriter, Conversation, EngineAnswer, Plan, Tito};
use crate::upstream::{MadeBody, UpstreamBody};

impl Call {
    /// Opens the call on the token path: `None` when this turn goes to the upstream's
    /// chat endpoint instead (`on_mismatch = "chat"`). The prompt ids wait in the call's
    /// token slot for the record; the completion ids join them as they arrive.
    pub(super) async fn open_tokens(
        &self,
        tito: &Arc<Tito>,
    ) -> Result<Option<(Response<UpstreamBody>, Instant)>, Error> {
        let kind = self.dialect.kind();
        let conversation = Conversation::read(kind, &self.body)?;
        let plan = tito.plan(&conversation)?;
        let (prompt_ids, path, reason) = match plan {
            Plan::Chat { reason } => {
                let mut slot = self.tokens.lock();
                slot.chat_reason = Some(reason);
                slot.pending = Some(conversation.pending());
                return Ok(None);
            }
            Plan::Ids {
                prompt_ids,
                path,
                reason,
            } => (prompt_ids, path, reason),
        };
        let stream = self.prepared.stream;
        let engine = tito.config.engine;
        let body = request_body(
            engine,
            &self.body,
            &prompt_ids,
            tito.renderer.stop_ids(),
            stream,
        )?;
        {
            let mut slot = self.tokens.lock();
            slot.tokens = Some(TurnTokens {
                prompt_ids,
                completion_ids: Vec::new(),
                logprobs: Vec::new(),
                path: Some(path),
                reason,
            });
            slot.pending = Some(conversation.pending());
        }
        let session = self.entry.session.id();
        let (resp, head_at) = self
            .send_to_engines(|base| {
                self.shared.upstream.engine_request(
                    self.entry.session.upstream(),
                    base,
                    engine.path(),
                    session,
                    body.clone(),
                )
            })
            .await?;
        if !resp.status().is_success() {
            return Ok(Some((resp, head_at)));
        }
        let include_usage = self
            .body
            .get::<serde_json::Value>("stream_options")
            .and_then(Result::ok)
            .and_then(|o| o.get("include_usage").and_then(serde_json::Value::as_bool))
            .unwrap_or(false);
        let writer = AnswerWriter::new(
            kind,
            self.body.str("model").unwrap_or_default(),
            include_usage,
        );
        let answer = EngineAnswer::new(
            resp.into_body(),
            stream,
            engine,
            tito.renderer.clone(),
            writer,
            self.tokens.clone(),
            self.shared.config.max_response_bytes,
        );
        let content_type = if stream {
            "text/event-stream"
        } else {
            "application/json"
        };
        let resp = Response::builder()
            .status(StatusCode::OK)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(UpstreamBody::Made(MadeBody::new(answer)))
            .map_err(|e| Error::Internal(format!("cannot build the answer: {e}")))?;
        Ok(Some((resp, head_at)))
    }
}

//! Request bodies the benchmarks send: OpenAI Chat Completions requests of a chosen size.
//!
//! The mock upstream echoes the *last* user message, so the padding that makes a body
//! large goes into an earlier (system) message: the response stays small whatever the
//! request size, and a streamed reply has enough text for many chunks.

/// The last user message of every benchmark request: 64 words (about 400 characters),
/// enough text for the mock to stream it in up to 400 pieces.
pub const USER_TEXT: &str = "please summarise the following benchmark transcript \
    in plain words and keep every number exact while you do it because the trainer \
    reads the reply and scores it against a reference answer that was written by a \
    careful person who counted each figure twice before filing it in the data set \
    used for this reinforcement learning run on the policy model under test today \
    thanks";

/// A chat request of about `target_bytes` bytes (never less than the bare request):
/// a system message padded with words, then [`USER_TEXT`]. With `stream`, it asks for
/// a stream.
pub fn chat_request(stream: bool, target_bytes: usize) -> Vec<u8> {
    let bare = build(stream, 0);
    let pad = target_bytes.saturating_sub(bare.len());
    build(stream, pad)
}

fn build(stream: bool, pad: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(pad + 768);
    out.extend_from_slice(br#"{"model":"harness-model","messages":[{"role":"system","content":"You are a careful assistant."#);
    const WORDS: &[u8] = b" lorem ipsum dolor sit amet consectetur adipiscing elit";
    let mut left = pad;
    while left > 0 {
        let n = left.min(WORDS.len());
        out.extend_from_slice(&WORDS[..n]);
        left -= n;
    }
    out.extend_from_slice(br#""},{"role":"user","content":""#);
    out.extend_from_slice(USER_TEXT.as_bytes());
    out.extend_from_slice(br#""}],"temperature":0.7,"max_tokens":256"#);
    if stream {
        out.extend_from_slice(br#","stream":true"#);
    }
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_valid_json_of_the_asked_size() {
        for (stream, size) in [(false, 2048), (true, 2048), (false, 1 << 20), (true, 10)] {
            let body = chat_request(stream, size);
            let value: serde_json::Value = serde_json::from_slice(&body).expect("valid JSON");
            assert_eq!(value["stream"].as_bool().unwrap_or(false), stream);
            assert_eq!(value["messages"][1]["content"], USER_TEXT);
            assert!(body.len() >= size, "{} < {size}", body.len());
            assert!(body.len() <= size.max(600) + 8, "{} > {size}", body.len());
        }
    }
}

//! A Hugging Face tokenizer loaded from its files, and the process-wide registry that
//! loads each one once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use serde::Deserialize;
use tokenizers::AddedToken;

use crate::bpe::FastBpe;

/// Why a tokenizer could not be loaded. The message names the path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// The path does not exist or cannot be read.
    #[error("tokenizer {path}: {message}")]
    Unreadable {
        /// The path that was asked for.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The files were read but are not a tokenizer this crate can use.
    #[error("tokenizer {path}: {message}")]
    Invalid {
        /// The path that was asked for.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// `tokenizer_config.json`, the parts that matter here.
#[derive(Debug, Default, Deserialize)]
struct TokenizerConfig {
    #[serde(default)]
    added_tokens_decoder: HashMap<String, AddedTokenConfig>,
    #[serde(default)]
    eos_token: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct AddedTokenConfig {
    content: String,
    #[serde(default)]
    lstrip: bool,
    #[serde(default)]
    rstrip: bool,
    #[serde(default)]
    normalized: bool,
    #[serde(default)]
    single_word: bool,
    #[serde(default)]
    special: bool,
}

/// A tokenizer: `tokenizer.json` (the model, its pre-tokenizer and decoder) plus the added
/// tokens that `tokenizer_config.json` declares (some models declare their special tokens
/// only there), so that every special token is one id.
///
/// Encoding adds no special tokens (`add_special_tokens=False`); decoding keeps them
/// (`skip_special_tokens=False`), as the renderers need.
#[derive(Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    eos_token: Option<String>,
    /// The vocabulary's size, added tokens included (counted once: `tokenizers` builds the
    /// whole vocabulary to count it).
    vocab_size: usize,
    /// Each id's bytes, when the decoder is byte-level (then decoding is these bytes
    /// joined, read as UTF-8 with U+FFFD for what is not).
    bytes: Option<ByteTable>,
    /// The fast encoder, for tokenizers of Qwen2's shape.
    fast: Option<FastBpe>,
}

/// Every token's bytes, in one buffer.
#[derive(Debug)]
struct ByteTable {
    bytes: Vec<u8>,
    /// `ends[id]` is where the bytes of `id` end (they start where `id - 1`'s end).
    ends: Vec<u32>,
}

impl ByteTable {
    /// The table of a tokenizer whose decoder is `ByteLevel` (GPT-2's byte alphabet),
    /// built as that decoder decodes one token: a token all of whose characters are in
    /// the alphabet gives their bytes, any other (an added token such as `<think>` whose
    /// characters are not) its UTF-8 text.
    fn build(inner: &tokenizers::Tokenizer) -> Option<Self> {
        if !matches!(
            inner.get_decoder(),
            Some(tokenizers::decoders::DecoderWrapper::ByteLevel(_))
        ) {
            return None;
        }
        let alphabet = byte_alphabet();
        let n = inner.get_vocab_size(true);
        let mut bytes = Vec::with_capacity(n * 8);
        let mut ends = Vec::with_capacity(n);
        let mut id: u32 = 0;
        // Ids may have holes; an id with no token decodes to nothing, as in `decode`.
        let max = inner
            .get_added_tokens_decoder()
            .keys()
            .copied()
            .max()
            .map_or(0, |m| m as usize + 1)
            .max(n);
        while (id as usize) < max {
            if let Some(token) = inner.id_to_token(id) {
                let start = bytes.len();
                let mut all = true;
                for c in token.chars() {
                    match alphabet(c) {
                        Some(b) => bytes.push(b),
                        None => {
                            all = false;
                            break;
                        }
                    }
                }
                if !all {
                    bytes.truncate(start);
                    bytes.extend_from_slice(token.as_bytes());
                }
            }
            ends.push(u32::try_from(bytes.len()).ok()?);
            id += 1;
        }
        bytes.shrink_to_fit();
        Some(ByteTable { bytes, ends })
    }

    fn get(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match self.ends.get(i) {
            Some(&end) => {
                let start = if i == 0 { 0 } else { self.ends[i - 1] };
                &self.bytes[start as usize..end as usize]
            }
            None => &[],
        }
    }
}

/// GPT-2's byte-level alphabet, read backwards: the byte each of its 256 characters
/// stands for.
fn byte_alphabet() -> impl Fn(char) -> Option<u8> {
    let mut table = [None; 324];
    for (b, c) in crate::bpe::byte_chars().iter().enumerate() {
        table[*c as usize] = u8::try_from(b).ok();
    }
    move |c: char| table.get(c as usize).copied().flatten()
}

impl Tokenizer {
    /// Loads a tokenizer from a folder holding `tokenizer.json` (and, if present,
    /// `tokenizer_config.json`), or from the `tokenizer.json` file itself (its
    /// `tokenizer_config.json` is then looked for beside it).
    pub fn load(path: impl AsRef<Path>) -> Result<Self, TokenizerError> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path).map_err(|e| TokenizerError::Unreadable {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let (json, dir) = if meta.is_dir() {
            (path.join("tokenizer.json"), path.to_owned())
        } else {
            let dir = path.parent().map(Path::to_owned).unwrap_or_default();
            (path.to_owned(), dir)
        };
        let json_bytes = std::fs::read(&json).map_err(|e| TokenizerError::Unreadable {
            path: json.clone(),
            message: e.to_string(),
        })?;
        let mut inner = tokenizers::Tokenizer::from_bytes(&json_bytes).map_err(|e| {
            TokenizerError::Invalid {
                path: json.clone(),
                message: format!("not a Hugging Face tokenizer.json: {e}"),
            }
        })?;
        let config_path = dir.join("tokenizer_config.json");
        let config: TokenizerConfig = match std::fs::read(&config_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| TokenizerError::Invalid {
                path: config_path.clone(),
                message: format!("not a tokenizer_config.json: {e}"),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => TokenizerConfig::default(),
            Err(e) => {
                return Err(TokenizerError::Unreadable {
                    path: config_path,
                    message: e.to_string(),
                })
            }
        };
        // Added tokens declared only in the config join the vocabulary at their ids, in
        // id order (the order `transformers` adds them in).
        let mut declared: Vec<(u32, AddedTokenConfig)> = config
            .added_tokens_decoder
            .into_iter()
            .filter_map(|(id, t)| id.parse::<u32>().ok().map(|id| (id, t)))
            .collect();
        declared.sort_by_key(|(id, _)| *id);
        for (id, t) in declared {
            if inner.token_to_id(&t.content) == Some(id) {
                continue;
            }
            let token = AddedToken::from(t.content.clone(), t.special)
                .lstrip(t.lstrip)
                .rstrip(t.rstrip)
                .normalized(t.normalized)
                .single_word(t.single_word);
            if t.special {
                inner.add_special_tokens(&[token]);
            } else {
                inner.add_tokens(&[token]);
            }
            if inner.token_to_id(&t.content) != Some(id) {
                return Err(TokenizerError::Invalid {
                    path: config_path.clone(),
                    message: format!(
                        "added token {:?} is declared as id {id} but tokenizer.json gives it another id",
                        t.content
                    ),
                });
            }
        }
        let eos_token = match config.eos_token {
            Some(serde_json::Value::String(s)) => Some(s),
            Some(serde_json::Value::Object(o)) => {
                o.get("content").and_then(|c| c.as_str()).map(str::to_owned)
            }
            _ => None,
        };
        let bytes = ByteTable::build(&inner);
        let mut added: Vec<(u32, AddedToken)> =
            inner.get_added_tokens_decoder().into_iter().collect();
        added.sort_by_key(|(id, _)| *id);
        let fast = FastBpe::build(&json_bytes, &inner, &added);
        Ok(Tokenizer {
            vocab_size: inner.get_vocab_size(true),
            inner,
            path: path.to_owned(),
            eos_token,
            bytes,
            fast,
        })
    }

    /// The path it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The `eos_token` of `tokenizer_config.json`, if it names one.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// The ids of `text`, without special tokens added around it (special tokens written
    /// in the text are still one id each).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        if text.is_empty() {
            return Vec::new();
        }
        if let Some(fast) = &self.fast {
            let mut out = Vec::with_capacity(text.len() / 3 + 4);
            fast.encode(text, &mut out);
            return out;
        }
        self.encode_reference(text)
    }

    /// [`encode`](Self::encode) through the Hugging Face pipeline itself, whichever the
    /// tokenizer (the reference the fast encoder is checked against).
    pub fn encode_reference(&self, text: &str) -> Vec<u32> {
        if text.is_empty() {
            return Vec::new();
        }
        match self.inner.encode_fast(text, false) {
            Ok(enc) => enc.get_ids().to_vec(),
            // Encoding a `&str` with a loaded BPE model does not fail; an empty answer is
            // the safe reading if a future model can.
            Err(_) => Vec::new(),
        }
    }

    /// The text of `ids`, special tokens included. Bytes that do not form whole UTF-8
    /// characters decode to U+FFFD, as Python's `errors="replace"`.
    pub fn decode(&self, ids: &[u32]) -> String {
        match &self.bytes {
            Some(table) => {
                let mut buf = Vec::with_capacity(ids.len() * 4);
                for &id in ids {
                    buf.extend_from_slice(table.get(id));
                }
                match String::from_utf8(buf) {
                    Ok(s) => s,
                    Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
                }
            }
            None => self.inner.decode(ids, false).unwrap_or_default(),
        }
    }

    /// The bytes this crate's own tables hold beside the Hugging Face tokenizer: each
    /// id's bytes (for decoding) and the fast encoder's merges.
    pub fn table_bytes(&self) -> usize {
        let bytes = self
            .bytes
            .as_ref()
            .map_or(0, |t| t.bytes.capacity() + t.ends.capacity() * 4);
        bytes + self.fast.as_ref().map_or(0, FastBpe::table_bytes)
    }

    /// The bytes one id decodes to, when the decoder is byte-level (`None` otherwise).
    /// An id outside the vocabulary gives no bytes, as [`decode`](Self::decode) skips it.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.bytes.as_ref().map(|t| t.get(id))
    }

    /// Whether [`encode`](Self::encode) runs this crate's encoder for byte-level BPE
    /// tokenizers of Qwen2's shape (Qwen2, Qwen2.5, Qwen3) rather than the Hugging Face
    /// pipeline; the ids are the same.
    pub fn has_fast_encoder(&self) -> bool {
        self.fast.is_some()
    }

    /// Whether the decoder is byte-level: decoding is each id's
    /// [`token_bytes`](Self::token_bytes) joined, so it can run incrementally
    /// ([`TextDecoder`](crate::TextDecoder)).
    pub fn is_byte_level(&self) -> bool {
        self.bytes.is_some()
    }

    /// The id of one token of the vocabulary (added tokens included).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token of one id.
    pub fn id_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The vocabulary's size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The Hugging Face tokenizer underneath.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Loads each tokenizer once per process: every caller naming the same files (by
/// canonical path) shares one [`Tokenizer`].
pub fn shared(path: impl AsRef<Path>) -> Result<Arc<Tokenizer>, TokenizerError> {
    /// One slot per canonical path: the first caller loads it while later ones wait on
    /// the slot (not on the whole registry), so a tokenizer is loaded once even when many
    /// sessions name it at once.
    type Slot = Arc<Mutex<Option<Arc<Tokenizer>>>>;
    static LOADED: OnceLock<Mutex<HashMap<PathBuf, Slot>>> = OnceLock::new();
    let path = path.as_ref();
    let key = std::fs::canonicalize(path).map_err(|e| TokenizerError::Unreadable {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    let slot = LOADED
        .get_or_init(Default::default)
        .lock()
        .entry(key.clone())
        .or_default()
        .clone();
    let mut slot = slot.lock();
    if let Some(t) = &*slot {
        return Ok(t.clone());
    }
    // A failed load leaves the slot empty: the next caller tries again.
    let loaded = Arc::new(Tokenizer::load(&key)?);
    *slot = Some(loaded.clone());
    Ok(loaded)
}

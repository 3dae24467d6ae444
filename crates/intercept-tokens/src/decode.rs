//! Decoding ids to text as they arrive, safe across ids that split a character.

use crate::Tokenizer;

/// Turns a byte-level tokenizer's ids (or raw bytes) into text incrementally, as
/// [`Tokenizer::decode`] would turn them all at once: a character split across ids is
/// held back until its last byte arrives, and bytes that cannot form one come out as
/// U+FFFD exactly where the whole decode puts them (the replacement of maximal invalid
/// subparts that `String::from_utf8_lossy` and the Hugging Face decoders use).
#[derive(Debug, Default, Clone)]
pub struct TextDecoder {
    pending: Vec<u8>,
}

impl TextDecoder {
    /// A decoder with nothing held back.
    pub fn new() -> Self {
        TextDecoder::default()
    }

    /// Appends the text of one id to `out`. An id a tokenizer without byte-level
    /// decoding cannot give bytes for is decoded on its own.
    pub fn push_id(&mut self, tokenizer: &Tokenizer, id: u32, out: &mut String) {
        match tokenizer.token_bytes(id) {
            Some(bytes) => self.push_bytes(bytes, out),
            None => {
                self.finish(out);
                out.push_str(&tokenizer.decode(&[id]));
            }
        }
    }

    /// Appends the text of `bytes` to `out`, holding back an unfinished character.
    pub fn push_bytes(&mut self, bytes: &[u8], out: &mut String) {
        if self.pending.is_empty() {
            match std::str::from_utf8(bytes) {
                Ok(s) => out.push_str(s),
                Err(_) => {
                    self.pending.extend_from_slice(bytes);
                    self.drain(out);
                }
            }
            return;
        }
        self.pending.extend_from_slice(bytes);
        self.drain(out);
    }

    fn drain(&mut self, out: &mut String) {
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix up to `valid` is UTF-8 by the error's own account.
                    out.push_str(&String::from_utf8_lossy(&rest[..valid]));
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{fffd}');
                            rest = &rest[valid + n..];
                        }
                        None => {
                            rest = &rest[valid..];
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let start = self.pending.len() - keep;
        self.pending.drain(..start);
    }

    /// Whether bytes of an unfinished character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Ends the text: held-back bytes come out as one U+FFFD, as at the end of a whole
    /// decode.
    pub fn finish(&mut self, out: &mut String) {
        if !self.pending.is_empty() {
            out.push('\u{fffd}');
            self.pending.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incremental(chunks: &[&[u8]]) -> String {
        let mut d = TextDecoder::new();
        let mut out = String::new();
        for c in chunks {
            d.push_bytes(c, &mut out);
        }
        d.finish(&mut out);
        out
    }

    #[test]
    fn matches_a_whole_lossy_decode_at_every_split() {
        let samples: Vec<Vec<u8>> = vec![
            "a😀中é\u{301}".as_bytes().to_vec(),
            vec![0xe4, 0xb8, 0x61, 0xf0, 0x9f, 0x98, 0x80, 0xff, 0xc3],
            vec![0xed, 0xa0, 0x80, 0x41, 0xf4, 0x90, 0x80, 0x80, 0xe2, 0x82],
            vec![0xc0, 0xaf, 0xe0, 0x80, 0xbf, 0xf0, 0x9f, 0x98],
        ];
        for bytes in samples {
            let whole = String::from_utf8_lossy(&bytes).into_owned();
            for i in 0..=bytes.len() {
                for j in i..=bytes.len() {
                    let got = incremental(&[&bytes[..i], &bytes[i..j], &bytes[j..]]);
                    assert_eq!(got, whole, "{bytes:?} split at {i}, {j}");
                }
            }
            let one_by_one: Vec<&[u8]> = bytes.chunks(1).collect();
            assert_eq!(incremental(&one_by_one), whole);
        }
    }
}

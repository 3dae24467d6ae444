//! The real Qwen3 tokenizer: its special tokens are single ids, and `encode`/`decode`
//! agree with Python's `transformers` (renderers' `load_tokenizer`) on tricky text.

mod support;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use support::{id_list, ids_of, oracle, quote, tokenizer};

const SPECIALS: &[&str] = &[
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
];

/// Texts where tokenizers tend to differ: whitespace runs, normalisation, scripts that
/// split into byte tokens, special-token strings inside text.
const TRICKY: &[&str] = &[
    "",
    "\n",
    "\n\n\n\n",
    "a\n\n\n b  \n\t \r\n\r\nc   ",
    "   leading and trailing   ",
    "emoji 😀👍🏽👨‍👩‍👧 and flags 🇫🇷",
    "中文字符和日本語のテキスト、한국어",
    "combining: e\u{301} a\u{308} \u{1100}\u{1161} Å vs A\u{30a}",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>",
    "<tool_response>\nok\n</tool_response><|endoftext|>",
    "text<think>glued</think>text<|im_end|>tail",
    "partial <|im_start| and <think without close </tool_call",
    "numbers 1234567890 3.14159 -0.0 1e-05 ١٢٣",
    "code:\n    def f(x):\n        return x  # ok\n\n\n",
    "\u{feff}bom \u{200b}zwsp \u{a0}nbsp \u{3000}ideographic",
    "ﬁ ligature, ①, Ⅻ, ｆｕｌｌｗｉｄｔｈ",
    "control \u{1}\u{1f}\u{7f} chars",
    "{\"key\": \"value with \\\"escapes\\\" and \\\\ backslash\"}",
];

#[test]
fn special_tokens_are_single_ids() {
    let Some(tok) = tokenizer() else { return };
    for s in SPECIALS {
        let id = tok
            .token_id(s)
            .unwrap_or_else(|| panic!("{s} is in the vocabulary"));
        assert_eq!(tok.encode(s), vec![id], "{s} encodes as one id");
        assert_eq!(tok.decode(&[id]), *s, "{s} decodes back");
    }
    // Between other text too.
    let ids = tok.encode("x<think>y</think>z");
    assert!(ids.contains(&tok.token_id("<think>").expect("known")));
    assert!(ids.contains(&tok.token_id("</think>").expect("known")));
    assert!(tok.is_byte_level());
}

#[test]
fn decode_by_bytes_matches_the_library() {
    let Some(tok) = tokenizer() else { return };
    // Every id alone, and runs of ids, including ones that split characters.
    let n = tok.vocab_size() as u32;
    for id in 0..n + 3 {
        let via_bytes = tok.decode(&[id]);
        let via_library = tok.inner().decode(&[id], false).expect("decodes");
        assert_eq!(via_bytes, via_library, "id {id}");
    }
    let mut x: u64 = 0x9e3779b97f4a7c15;
    for _ in 0..2000 {
        let len = (x % 9) as usize + 1;
        let ids: Vec<u32> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % u64::from(n)) as u32
            })
            .collect();
        assert_eq!(
            tok.decode(&ids),
            tok.inner().decode(&ids, false).expect("decodes"),
            "{ids:?}"
        );
    }
}

#[test]
fn encode_and_decode_agree_with_python() {
    let Some(tok) = tokenizer() else { return };
    let Some(mut py) = oracle() else { return };
    for text in TRICKY {
        let ours = tok.encode(text);
        let theirs =
            ids_of(&py.ask(&format!(r#"{{"op":"encode","text":{}}}"#, quote(text)))["ids"]);
        assert_eq!(ours, theirs, "encode({text:?})");
        let back = py.ask(&format!(r#"{{"op":"decode","ids":{}}}"#, id_list(&ours)));
        assert_eq!(
            back["text"].as_str(),
            Some(tok.decode(&ours).as_str()),
            "decode of {text:?}"
        );
    }
    // Ids that cut characters in the middle decode to U+FFFD the same way.
    let emoji = tok.encode("😀中");
    for cut in 0..=emoji.len() {
        let ids = &emoji[..cut];
        let back = py.ask(&format!(r#"{{"op":"decode","ids":{}}}"#, id_list(ids)));
        assert_eq!(
            back["text"].as_str(),
            Some(tok.decode(ids).as_str()),
            "{ids:?}"
        );
    }
}

#[test]
fn the_fast_encoder_matches_the_library() {
    let Some(tok) = tokenizer() else { return };
    assert!(
        tok.has_fast_encoder(),
        "Qwen3's tokenizer takes the fast path"
    );
    for text in TRICKY {
        assert_eq!(tok.encode(text), tok.encode_reference(text), "{text:?}");
    }
    // Every character below U+0800 and every 7th above, in contexts that exercise each
    // alternative of the pre-tokenizer: after an apostrophe, doubled, after a space,
    // before letters, digits and line breaks.
    let mut chunk = String::new();
    let mut contexts: Vec<String> = Vec::new();
    let flush = |chunk: &mut String, contexts: &mut Vec<String>| {
        if tok.encode(chunk) != tok.encode_reference(chunk) {
            for c in contexts.iter() {
                assert_eq!(tok.encode(c), tok.encode_reference(c), "{c:?}");
            }
            panic!("a chunk differs but none of its contexts alone: {chunk:?}");
        }
        chunk.clear();
        contexts.clear();
    };
    for code in (0..0x110000u32).filter(|c| *c < 0x800 || c % 7 == 0) {
        let Some(c) = char::from_u32(code) else {
            continue;
        };
        for ctx in [
            format!("'{c}l{c}"),
            format!("{c}{c} {c}x"),
            format!("\n{c}1 \r\n{c}\t\t{c}"),
        ] {
            chunk.push_str(&ctx);
            contexts.push(ctx);
        }
        if chunk.len() > 4096 {
            flush(&mut chunk, &mut contexts);
        }
    }
    flush(&mut chunk, &mut contexts);
}

/// Text from every class the pre-tokenizer tells apart, in any order.
fn mixed_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => "[a-zA-Z]{1,6}".prop_map(String::from),
        2 => prop::sample::select(vec![
            " ", "  ", "   ", "\n", "\n\n", "\r\n", "\t", " \n ", "\u{a0}", "\u{3000}",
            "\u{85}", "\u{2028}", "\u{1c}", "\u{b}", "\u{c}", " \t\n\n  ",
        ]).prop_map(String::from),
        2 => prop::sample::select(vec![
            "'s", "'S", "'t", "'re", "'RE", "'Ve", "'m", "'ll", "'LL", "'d", "'\u{17f}", "'x",
            "''", "'", "’s",
        ]).prop_map(String::from),
        2 => prop::sample::select(vec![
            "1", "42", "١٢", "½", "Ⅻ", "①", "３", "...", "!?", "{\"a\": [1, 2]}", "-->", "#",
            "😀", "👍🏽", "🇫🇷", "\u{200d}", "\u{301}", "\u{feff}",
        ]).prop_map(String::from),
        2 => prop::sample::select(vec![
            "中文", "日本語", "한국어", "Ελληνικά", "русский", "עברית", "العربية", "ไทย", "हिन्दी",
            "e\u{301}", "A\u{30a}", "\u{1100}\u{1161}", "Å", "ﬁ", "ǅ", "ß", "İ",
        ]).prop_map(String::from),
        1 => prop::sample::select(vec![
            "<think>", "</think>", "<|im_end|>", "<|im_start|>", "<tool_call>", "<|endoftext|>",
            "<|im_", "<think", "<<think>>",
        ]).prop_map(String::from),
        1 => any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|p| p.concat())
}

#[test]
fn the_fast_encoder_matches_on_generated_text() {
    let Some(tok) = tokenizer() else { return };
    TestRunner::new(Config {
        cases: 2048,
        failure_persistence: None,
        ..Config::default()
    })
    .run(&mixed_text(), |text| {
        prop_assert_eq!(tok.encode(&text), tok.encode_reference(&text), "{:?}", text);
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
    // Long words go through the heap merge.
    for long in [
        "=".repeat(300),
        "ab".repeat(200),
        "😀".repeat(50),
        "x".repeat(1000),
    ] {
        assert_eq!(tok.encode(&long), tok.encode_reference(&long));
    }
}

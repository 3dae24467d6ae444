//! `JsonBody`'s tests: parsing, editing, re-emitting, the scan against serde_json.

use super::*;
use proptest::prelude::*;
use serde_json::json;

#[test]
fn recorded_bodies_are_written_as_they_stand() {
    // Spacing, escapes and number spellings survive: nothing is parsed or re-escaped.
    let text = "{ \"a\" : [1.50, \"\\u00e9\\n\", {\"b\":null}],\"c\":\"é\" }";
    let raw = RawJson::new(Bytes::from(text));
    assert_eq!(serde_json::to_vec(&raw).unwrap(), text.as_bytes());
    let record = format!("{{\"response\":{text}}}");
    #[derive(Serialize)]
    struct Record<'a> {
        response: &'a RawJson,
    }
    assert_eq!(
        serde_json::to_string(&Record { response: &raw }).unwrap(),
        record
    );
    // Serialised to a `Value`, the text is parsed as JSON (not kept as a string).
    assert_eq!(
        serde_json::to_value(&raw).unwrap(),
        json!({"a": [1.5, "\u{e9}\n", {"b": null}], "c": "\u{e9}"})
    );
    // A request body: its slices and what was set, as one object.
    let mut body =
        JsonBody::parse(Bytes::from_static(b"{\"model\": \"x\",  \"n\":[ 1 ]}")).unwrap();
    body.set("model", &"y").unwrap();
    let out = serde_json::to_vec(&body).unwrap();
    assert_eq!(out, body.to_bytes());
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&out).unwrap(),
        json!({"model": "y", "n": [1]})
    );
}

#[test]
fn bytes_that_are_not_utf8_fail_to_serialise() {
    let raw = RawJson(Bytes::from_static(b"\"\xff\""));
    assert!(serde_json::to_vec(&raw).is_err());
}

/// The plain byte-by-byte scan `nests_deeper_than` must agree with.
fn deeper_by_bytes(bytes: &[u8], limit: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

proptest::proptest! {
    #[test]
    fn the_nesting_scan_agrees_with_the_byte_scan(
        bytes in proptest::collection::vec(
            proptest::sample::select(b"{}[]\"\\ax,:".to_vec()), 0..400),
        limit in 0usize..12,
    ) {
        proptest::prop_assert_eq!(nests_deeper_than(&bytes, limit), deeper_by_bytes(&bytes, limit));
    }
}

fn body(text: &str) -> JsonBody {
    JsonBody::parse(Bytes::from(text.to_owned())).expect("valid body")
}

#[test]
fn unchanged_body_is_one_shared_slice() {
    let text = r#"{"model": "a", "messages": [{"role":"user","content":"hi"}], "stream": true}"#;
    let b = body(text);
    let chunks = b.chunks();
    assert_eq!(
        b.to_value(),
        serde_json::from_str::<serde_json::Value>(text).expect("json")
    );
    assert!(b.is_true("stream"));
    assert!(chunks.iter().any(|c| c.len() > 60), "{chunks:?}");
}

#[test]
fn overrides_replace_in_place_and_append() {
    let mut b = body(r#"{"model":"a","messages":[],"temperature":1}"#);
    b.set("model", "policy").expect("set");
    b.set("top_p", &0.5).expect("set");
    assert!(b.remove("temperature"));
    assert_eq!(
        b.to_value(),
        json!({"model":"policy","messages":[],"top_p":0.5})
    );
    assert_eq!(
        b.keys().collect::<Vec<_>>(),
        vec!["model", "messages", "top_p"]
    );
    assert_eq!(b.encoded_len(), b.to_bytes().len());
}

#[test]
fn rejects_non_objects_with_clear_messages() {
    let e = JsonBody::parse(Bytes::from_static(b"[1,2]")).expect_err("array");
    assert_eq!(
        e.to_string(),
        "request body must be a JSON object, not an array"
    );
    let e = JsonBody::parse(Bytes::from_static(b"\"x\"")).expect_err("string");
    assert_eq!(
        e.to_string(),
        "request body must be a JSON object, not a string"
    );
    let e = JsonBody::parse(Bytes::from_static(b"{\"a\":")).expect_err("truncated");
    assert!(
        e.to_string().starts_with("request body is not valid JSON"),
        "{e}"
    );
    assert_eq!(e.status(), 400);
    assert!(JsonBody::parse(Bytes::from_static(b"")).is_err());
}

fn nested(depth: usize) -> String {
    // `{"a":` + `[` * (depth - 1) + `]` * (depth - 1) + `}`: `depth` levels in all.
    format!(
        "{{\"a\":{}{}}}",
        "[".repeat(depth - 1),
        "]".repeat(depth - 1)
    )
}

#[test]
fn nesting_is_limited_and_the_limit_is_what_serde_json_can_record() {
    let at_limit = body(&nested(MAX_JSON_DEPTH));
    // A body at the limit turns into a value (as a trace does when it is answered).
    assert_ne!(at_limit.to_value(), serde_json::Value::Null);
    let e = JsonBody::parse(Bytes::from(nested(MAX_JSON_DEPTH + 1))).expect_err("deep");
    assert_eq!(e.status(), 400);
    assert!(e.to_string().contains("more than 127 levels deep"), "{e}");
    // Brackets inside strings (escaped quotes too) do not count.
    let text = format!("{{\"a\":\"\\\"{}\",\"b\":[]}}", "[".repeat(500));
    assert!(JsonBody::parse(Bytes::from(text)).is_ok());
    // Deep and not an object: the depth is what is said, not "not an object".
    let deep_array = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let e = JsonBody::parse(Bytes::from(deep_array)).expect_err("deep array");
    assert!(e.to_string().contains("levels deep"), "{e}");
}

#[test]
fn invalid_utf8_is_named_as_such() {
    let e = JsonBody::parse(Bytes::from_static(b"{\"a\":\"\xff\"}")).expect_err("utf8");
    assert_eq!(e.status(), 400);
    assert!(e.to_string().contains("not valid UTF-8"), "{e}");
    assert!(e.to_string().contains("offset 6"), "{e}");
}

#[test]
fn escaped_keys_and_duplicates() {
    let b = body(r#"{"mo\u0064el":"x","k":1,"k":2}"#);
    assert_eq!(b.str("model").as_deref(), Some("x"));
    assert_eq!(b.to_value(), json!({"model":"x","k":2}));
}

#[test]
fn a_key_that_does_not_decode_is_invalid_json() {
    let e = JsonBody::parse(Bytes::from_static(br#"{"\ud800":1}"#)).expect_err("lone surrogate");
    let text = e.to_string();
    assert!(
        text.contains("not valid JSON") && text.contains("escape"),
        "{text}"
    );
    // In a value it is taken, as serde_json takes it when it skips a value.
    let b = JsonBody::parse(Bytes::from_static(br#"{"a":"\ud800"}"#)).expect("taken");
    assert_eq!(b.raw("a"), Some(&br#""\ud800""#[..]));
}

#[test]
fn serde_round_trip() {
    let b = body(r#"{"a":[1,2,{"b":null}]}"#);
    let s = serde_json::to_string(&b).expect("ser");
    assert_eq!(s, r#"{"a":[1,2,{"b":null}]}"#);
    let back: JsonBody = serde_json::from_str(&s).expect("de");
    assert_eq!(back, b);
}

/// Any JSON value, a few levels deep: integers and finite floats, strings with
/// quotes, backslashes, control and non-ASCII characters, keys that need escapes.
pub(super) fn arb_json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(serde_json::Value::from),
        "[a-z \\\\\"\u{e9}\u{1}\n/\u{1d11e}]{0,40}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map("[a-z\"\\\\]{1,4}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A body's members, keys and raw values, for comparing two parses.
fn members_of_body(b: &JsonBody) -> Vec<(String, Vec<u8>)> {
    b.members()
        .map(|(k, v)| (k.to_owned(), v.to_vec()))
        .collect()
}

/// One step of a conversation: what the next body is, next to the last one.
#[derive(Debug, Clone)]
enum Step {
    /// Elements appended to the array (the usual turn).
    Append(Vec<serde_json::Value>),
    /// An element in the middle replaced (an edited or compacted conversation).
    Replace(prop::sample::Index, serde_json::Value),
    /// The array cut back.
    Truncate(prop::sample::Index),
    /// A member after the array changed (the sampling settings).
    After(serde_json::Value),
    /// A member before the array changed (the array moves in the text).
    Before(serde_json::Value),
    /// Some byte of the text changed, removed or added (often not JSON any more).
    Byte(prop::sample::Index, u8, u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => prop::collection::vec(arb_json(), 0..4).prop_map(Step::Append),
        1 => (any::<prop::sample::Index>(), arb_json()).prop_map(|(i, v)| Step::Replace(i, v)),
        1 => any::<prop::sample::Index>().prop_map(Step::Truncate),
        1 => arb_json().prop_map(Step::After),
        1 => arb_json().prop_map(Step::Before),
        1 => (
            any::<prop::sample::Index>(),
            0u8..3,
            prop::sample::select(b"{}[]\",:\\ 0-x\n\x01".to_vec()),
        )
            .prop_map(|(i, e, b)| Step::Byte(i, e, b)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// A conversation's bodies parsed one after the other with a memo are parsed
    /// exactly as each alone: the same members, the same errors; pretty or compact,
    /// with the array anywhere among the members.
    #[test]
    fn parsing_after_the_previous_body_is_parsing_alone(
        before in prop::collection::btree_map("[a-m]{1,3}", arb_json(), 0..3),
        after in arb_json(),
        first in prop::collection::vec(arb_json(), 0..4),
        steps in prop::collection::vec(step(), 1..12),
        pretty in any::<bool>(),
    ) {
        let mut items = first;
        let mut tail = after;
        let mut before = before;
        let mut memo = ParseMemo::default();
        for st in steps {
            let mut raw = None;
            match st {
                Step::Append(more) => items.extend(more),
                Step::Replace(i, v) if !items.is_empty() => {
                    let i = i.index(items.len());
                    items[i] = v;
                }
                Step::Truncate(i) => items.truncate(i.index(items.len() + 1)),
                Step::After(v) => tail = v,
                Step::Before(v) => {
                    before.insert("b".into(), v);
                }
                Step::Byte(i, edit, byte) => {
                    let mut obj: serde_json::Map<String, serde_json::Value> =
                        before.clone().into_iter().collect();
                    obj.insert("messages".into(), items.clone().into());
                    obj.insert("zz".into(), tail.clone());
                    let mut bytes = serde_json::to_vec(&obj).unwrap();
                    let i = i.index(bytes.len() + 1);
                    match edit {
                        0 if i < bytes.len() => bytes[i] = byte,
                        1 if i < bytes.len() => { bytes.remove(i); }
                        _ => bytes.insert(i.min(bytes.len()), byte),
                    }
                    raw = Some(bytes);
                }
                Step::Replace(..) => {}
            }
            let bytes = raw.unwrap_or_else(|| {
                let mut obj: serde_json::Map<String, serde_json::Value> =
                    before.clone().into_iter().collect();
                obj.insert("messages".into(), items.clone().into());
                obj.insert("zz".into(), tail.clone());
                let value = serde_json::Value::Object(obj);
                if pretty {
                    serde_json::to_vec_pretty(&value).unwrap()
                } else {
                    serde_json::to_vec(&value).unwrap()
                }
            });
            let alone = JsonBody::parse(Bytes::from(bytes.clone()));
            let after = JsonBody::parse_after(Bytes::from(bytes.clone()), &mut memo);
            // And it leaves the members a parse from scratch leaves, and marks where
            // the marked array's elements end in this text.
            let mut fresh = ParseMemo::default();
            let _ = JsonBody::parse_after(Bytes::from(bytes.clone()), &mut fresh);
            prop_assert_eq!(&fresh.scanned, &memo.scanned);
            let marks = memo.scanned.as_ref().map(|s| s.marks.clone()).unwrap_or_default();
            for (m, ends) in marks {
                let scanned = memo.scanned.as_ref().unwrap();
                let value = &bytes[scanned.members[m].value.clone()];
                let elements: Vec<&serde_json::value::RawValue> =
                    serde_json::from_slice(value).expect("an array");
                let want: Vec<u32> = elements
                    .iter()
                    .map(|e| offset_in(&bytes, e.get().as_bytes()) + e.get().len())
                    .map(|end| end as u32)
                    .collect();
                prop_assert_eq!(ends, want);
            }
            match (alone, after) {
                (Ok(a), Ok(b)) => prop_assert_eq!(members_of_body(&a), members_of_body(&b)),
                (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
                (a, b) => prop_assert!(false, "alone {:?}, after {:?}", a.is_ok(), b.is_ok()),
            }
        }
    }
}

#[test]
fn a_grown_conversation_is_scanned_from_where_it_parts() {
    let mut memo = ParseMemo::default();
    let body = |n: usize| {
        let items: Vec<_> = (0..n)
            .map(|i| json!({"role": "user", "content": format!("m{i}")}))
            .collect();
        Bytes::from(
            serde_json::to_vec(&json!({"model": "m", "messages": items, "tools": [1, 2]})).unwrap(),
        )
    };
    let marks = |memo: &ParseMemo| {
        let marks = &memo.scanned.as_ref().expect("scanned").marks;
        marks
            .iter()
            .map(|(m, ends)| (*m, ends.len()))
            .collect::<Vec<_>>()
    };
    JsonBody::parse_after(body(3), &mut memo).expect("first");
    // Keys in order: messages, model, tools; one mark per element.
    assert_eq!(marks(&memo), [(0, 3), (2, 2)]);
    JsonBody::parse_after(body(5), &mut memo).expect("grown");
    assert_eq!(marks(&memo), [(0, 5), (2, 2)]);
    // A body that is not JSON leaves no memo, and the next is parsed whole.
    assert!(JsonBody::parse_after(Bytes::from_static(b"{\"messages\": [1,"), &mut memo).is_err());
    assert!(memo.scanned.is_none());
    let again = JsonBody::parse_after(body(6), &mut memo).expect("whole");
    assert_eq!(again.to_value()["messages"][5]["content"], "m5");
}

proptest! {
    #[test]
    fn edits_equal_value_edits(
        obj in prop::collection::btree_map("[a-z]{1,3}", arb_json(), 0..6),
        set_key in "[a-z]{1,3}",
        set_val in arb_json(),
        rm_key in "[a-z]{1,3}",
        pretty in any::<bool>(),
    ) {
        let mut expected: serde_json::Map<String, serde_json::Value> = obj.into_iter().collect();
        let text = if pretty {
            serde_json::to_string_pretty(&expected).expect("ser")
        } else {
            serde_json::to_string(&expected).expect("ser")
        };
        let mut b = JsonBody::parse(Bytes::from(text)).expect("parse");
        b.set(&set_key, &set_val).expect("set");
        expected.insert(set_key, set_val);
        b.remove(&rm_key);
        expected.remove(&rm_key);
        let out = b.to_bytes();
        let got: serde_json::Value = serde_json::from_slice(&out).expect("valid JSON out");
        prop_assert_eq!(got, serde_json::Value::Object(expected));
        // The pieces sent upstream and the bytes written into a record are the same.
        let pieces: Vec<u8> = b.chunks().concat();
        prop_assert_eq!(&pieces[..], &out[..]);
        prop_assert_eq!(b.encoded_len(), out.len());
    }
}

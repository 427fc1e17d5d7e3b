//! Random inputs for model loading: 10,000 seeded mutations each of a small valid
//! `config.json` (keys removed, renamed or duplicated, values retyped or replaced
//! by huge, negative, fractional or non-JSON numbers, then bits flipped, bytes
//! inserted and the text cut) read with `BertConfig::from_file`, and of a tiny
//! valid safetensors file (the 8-byte header length replaced, the JSON header's
//! dtypes, shapes and data_offsets changed to unknown, negative, huge,
//! overlapping or out-of-range values, tensors removed, renamed or retyped, then
//! bits flipped and the file cut or extended) loaded with `load_safetensors`.
//!
//! Asserted for every input: no panic; a config that loads is one the model can
//! be built from; an error names the file and, for `config.json`, the line and
//! column of a syntax error or a field that is missing or was changed; for
//! safetensors, `header` or a tensor the header holds; a weights file that loads
//! accounts for every parameter.

mod common;

use std::cell::RefCell;
use std::path::Path;

use burn::backend::Flex;
use drove_bert::{BertConfig, BertError, BertForTokenClassification, load_safetensors};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use serde_json::{Map, Value, json};

/// Random inputs per target.
const CASES: u32 = 10_000;
/// Fixed, so that every run feeds the same inputs.
const CONFIG_SEED: [u8; 32] = *b"drove config.json random inputs!";
const WEIGHTS_SEED: [u8; 32] = *b"drove safetensors random inputs!";

fn runner(seed: &[u8; 32]) -> TestRunner {
    let config = Config {
        cases: CASES,
        failure_persistence: None,
        rng_algorithm: RngAlgorithm::ChaCha,
        fork: false,
        timeout: 0,
        max_shrink_iters: 4096,
        ..Config::default()
    };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, seed))
}

/// Replaces a file by a new one: truncating and rewriting it in place makes ext4
/// flush it on close (`auto_da_alloc`), ten times slower.
fn rewrite(path: &Path, bytes: &[u8]) {
    let _ = std::fs::remove_file(path);
    std::fs::write(path, bytes).unwrap();
}

/// Whether `word` appears in `text` as a whole identifier (so that `vocab_size`
/// is not found inside `type_vocab_size`).
fn names_word(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        !text[..at].chars().next_back().is_some_and(ident)
            && !text[at + word.len()..].chars().next().is_some_and(ident)
    })
}

// ---------------------------------------------------------------- config.json

const FIELDS: [&str; 11] = [
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
];

/// A valid HuggingFace-style `config.json`, with fields the model does not read.
fn valid_config() -> Value {
    json!({
        "architectures": ["BertForMaskedLM"],
        "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": 32,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": 64,
        "model_type": "bert",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "pad_token_id": 0,
        "type_vocab_size": 2,
        "vocab_size": 100
    })
}

/// Values a field might hold by mistake.
fn odd_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        Just(json!(true)),
        Just(json!("gelu")),
        Just(json!("relu")),
        Just(json!("32")),
        Just(json!("")),
        Just(json!([])),
        Just(json!([32])),
        Just(json!({})),
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(1)),
        Just(json!(3)),
        Just(json!(0.5)),
        Just(json!(1.0)),
        Just(json!(32.0)),
        Just(json!(-0.0)),
        Just(json!(1e308)),
        Just(json!(-1e308)),
        Just(json!(5e-324)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(1u64 << 40)),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_filter_map("finite", |x| x.is_finite().then(|| json!(x))),
        "\\PC{0,8}".prop_map(Value::String),
    ]
}

#[derive(Clone, Debug)]
enum ConfigEdit {
    Remove(Index),
    Set(Index, Value),
    Rename(Index, String),
    Add(String, Value),
    NotAnObject(Value),
}

/// An edit of the text, after the JSON is written.
#[derive(Clone, Debug)]
enum TextEdit {
    FlipBit(Index, u8),
    SetByte(Index, u8),
    Truncate(Index),
    InsertBytes(Index, Vec<u8>),
    /// Replaces the `n`th number by a word JSON does not have (`NaN`, ...).
    NotANumber(Index, &'static str),
    /// Writes a key a second time, with another value.
    DuplicateKey(Index, &'static str),
}

fn config_edit() -> impl Strategy<Value = ConfigEdit> {
    let key = prop_oneof![
        prop::sample::select(FIELDS.to_vec()).prop_map(str::to_string),
        Just("vocab size".to_string()),
        Just("VOCAB_SIZE".to_string()),
        "[a-z_]{1,12}",
    ];
    prop_oneof![
        3 => any::<Index>().prop_map(ConfigEdit::Remove),
        6 => (any::<Index>(), odd_value()).prop_map(|(i, v)| ConfigEdit::Set(i, v)),
        1 => (any::<Index>(), key.clone()).prop_map(|(i, k)| ConfigEdit::Rename(i, k)),
        1 => (key, odd_value()).prop_map(|(k, v)| ConfigEdit::Add(k, v)),
        1 => odd_value().prop_map(ConfigEdit::NotAnObject),
    ]
}

fn text_edit() -> impl Strategy<Value = TextEdit> {
    prop_oneof![
        (any::<Index>(), 0u8..8).prop_map(|(i, b)| TextEdit::FlipBit(i, b)),
        (any::<Index>(), prop::sample::select(b"{}[],:\"0-.e \n\xff".to_vec()))
            .prop_map(|(i, b)| TextEdit::SetByte(i, b)),
        any::<Index>().prop_map(TextEdit::Truncate),
        (any::<Index>(), prop::collection::vec(any::<u8>(), 1..5))
            .prop_map(|(i, b)| TextEdit::InsertBytes(i, b)),
        (
            any::<Index>(),
            prop::sample::select(vec!["NaN", "Infinity", "-Infinity", "1e999", "0x20", "+1", "01"])
        )
            .prop_map(|(i, w)| TextEdit::NotANumber(i, w)),
        (any::<Index>(), prop::sample::select(vec!["0", "-5", "\"x\"", "null", "64"]))
            .prop_map(|(i, v)| TextEdit::DuplicateKey(i, v)),
    ]
}

fn edit_config(json: &mut Value, edit: &ConfigEdit) {
    let Value::Object(map) = json else { return };
    let keys: Vec<String> = map.keys().cloned().collect();
    let key = |i: &Index| (!keys.is_empty()).then(|| keys[i.index(keys.len())].clone());
    match edit {
        ConfigEdit::Remove(i) => {
            if let Some(k) = key(i) {
                map.remove(&k);
            }
        }
        ConfigEdit::Set(i, v) => {
            if let Some(k) = key(i) {
                map.insert(k, v.clone());
            }
        }
        ConfigEdit::Rename(i, new) => {
            if let Some(v) = key(i).and_then(|k| map.remove(&k)) {
                map.insert(new.clone(), v);
            }
        }
        ConfigEdit::Add(k, v) => {
            map.insert(k.clone(), v.clone());
        }
        ConfigEdit::NotAnObject(v) => *json = v.clone(),
    }
}

fn edit_bytes(bytes: &mut Vec<u8>, edit: &TextEdit) {
    match edit {
        TextEdit::FlipBit(i, bit) if !bytes.is_empty() => {
            let at = i.index(bytes.len());
            bytes[at] ^= 1 << bit;
        }
        TextEdit::SetByte(i, b) if !bytes.is_empty() => {
            let at = i.index(bytes.len());
            bytes[at] = *b;
        }
        TextEdit::Truncate(i) => bytes.truncate(i.index(bytes.len() + 1)),
        TextEdit::InsertBytes(i, b) => {
            let at = i.index(bytes.len() + 1);
            bytes.splice(at..at, b.iter().copied());
        }
        TextEdit::NotANumber(i, word) => {
            // Spans of digits (with sign, point and exponent) that follow a `:`.
            let numeric = |b: &u8| b.is_ascii_digit() || b"+-.eE".contains(b);
            let numbers: Vec<(usize, usize)> = (0..bytes.len())
                .filter(|&at| bytes[at] == b':')
                .filter_map(|at| {
                    let start = at + 1 + bytes[at + 1..].iter().take_while(|b| **b == b' ').count();
                    let len = bytes[start..].iter().take_while(|b| numeric(b)).count();
                    (len > 0).then_some((start, start + len))
                })
                .collect();
            if !numbers.is_empty() {
                let (start, end) = numbers[i.index(numbers.len())];
                bytes.splice(start..end, word.bytes());
            }
        }
        TextEdit::DuplicateKey(i, value) => {
            let field = FIELDS[i.index(FIELDS.len())];
            if let Some(open) = bytes.iter().position(|&b| b == b'{') {
                let entry = format!("\"{field}\": {value}, ");
                bytes.splice(open + 1..open + 1, entry.bytes());
            }
        }
        TextEdit::FlipBit(..) | TextEdit::SetByte(..) => {}
    }
}

fn check_config(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let valid = valid_config();
    match BertConfig::from_file(path) {
        Ok(c) => {
            let ok = c.num_attention_heads > 0
                && c.hidden_size.is_multiple_of(c.num_attention_heads)
                && [
                    c.vocab_size,
                    c.hidden_size,
                    c.intermediate_size,
                    c.max_position_embeddings,
                    c.type_vocab_size,
                ]
                .iter()
                .all(|&n| n > 0)
                && (0.0..1.0).contains(&c.hidden_dropout_prob)
                && (0.0..1.0).contains(&c.attention_probs_dropout_prob)
                && c.layer_norm_eps.is_finite()
                && c.layer_norm_eps > 0.0
                && c.hidden_act == "gelu";
            if ok { Ok(()) } else { Err(format!("accepted a config the model cannot use: {c:?}")) }
        }
        Err(e) => {
            let msg = e.to_string();
            let BertError::Config { path: named, .. } = &e else {
                return Err(format!("not a config error: {msg}"));
            };
            if named != path || !msg.starts_with(&format!("{}: ", path.display())) {
                return Err(format!("does not name the file: {msg}"));
            }
            let Ok(text) = std::str::from_utf8(bytes) else {
                return if msg.contains("cannot read") {
                    Ok(())
                } else {
                    Err(format!("not UTF-8, but: {msg}"))
                };
            };
            let json: Value = match serde_json::from_str(text) {
                Ok(json) => json,
                Err(syntax) => {
                    let at = format!("line {} column {}", syntax.line(), syntax.column());
                    return if msg.contains(&at) {
                        Ok(())
                    } else {
                        Err(format!("a syntax error not at {at}: {msg}"))
                    };
                }
            };
            let Value::Object(map) = json else {
                return if msg.contains("expected a JSON object") {
                    Ok(())
                } else {
                    Err(format!("not an object, but: {msg}"))
                };
            };
            // A field the message names that is missing or was changed.
            let culprit = FIELDS.iter().find(|f| names_word(&msg, f) && map.get(**f) != valid.get(**f));
            match culprit {
                Some(_) => Ok(()),
                None => Err(format!("names no missing or changed field: {msg}")),
            }
        }
    }
}

#[test]
fn mutated_config_json_never_panics_and_errors_name_the_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    let valid = serde_json::to_vec_pretty(&valid_config()).unwrap();
    std::fs::write(&path, &valid).unwrap();
    BertConfig::from_file(&path).expect("the fixture itself loads");
    let strategy =
        (prop::collection::vec(config_edit(), 0..3), prop::collection::vec(text_edit(), 0..3), any::<bool>());
    let started = std::time::Instant::now();
    let result = runner(&CONFIG_SEED).run(&strategy, |(edits, text_edits, pretty)| {
        let mut json = valid_config();
        for e in &edits {
            edit_config(&mut json, e);
        }
        let mut bytes =
            if pretty { serde_json::to_vec_pretty(&json) } else { serde_json::to_vec(&json) }.unwrap();
        for e in &text_edits {
            edit_bytes(&mut bytes, e);
        }
        rewrite(&path, &bytes);
        check_config(&path, &bytes).map_err(|why| {
            TestCaseError::fail(format!("{why}\ninput: {:?}", String::from_utf8_lossy(&bytes)))
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    eprintln!("{CASES} mutated config.json files in {:.2?}", started.elapsed());
}

#[test]
fn a_field_of_the_wrong_type_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    let mut json = valid_config();
    json["intermediate_size"] = json!("64");
    std::fs::write(&path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
    let err = BertConfig::from_file(&path).unwrap_err().to_string();
    assert!(err.contains("config.json") && err.contains("field `intermediate_size`: invalid type"), "{err}");
    json["intermediate_size"] = json!(64);
    json["layer_norm_eps"] = json!(-1.0);
    std::fs::write(&path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
    let err = BertConfig::from_file(&path).unwrap_err().to_string();
    assert!(err.contains("layer_norm_eps must be a positive number"), "{err}");
}

// ---------------------------------------------------------------- safetensors

/// The smallest model with every kind of tensor: one layer, width 2.
fn tiny() -> BertConfig {
    BertConfig {
        vocab_size: 3,
        hidden_size: 2,
        num_hidden_layers: 1,
        num_attention_heads: 1,
        intermediate_size: 2,
        max_position_embeddings: 2,
        type_vocab_size: 1,
        ..BertConfig::tiny(3)
    }
}

const LABELS: usize = 2;

/// Every parameter of `tiny()` with its HuggingFace name and PyTorch shape
/// (the pooler left out: the model has none).
fn tensors(c: &BertConfig) -> Vec<(String, Vec<usize>)> {
    common::hf_tensors(c, "bert.", Some(LABELS))
        .into_iter()
        .filter(|(name, _)| !name.contains("pooler"))
        .collect()
}

/// A valid file's JSON header and data (F32, values 0.5 apart).
fn valid_weights() -> (Map<String, Value>, Vec<u8>) {
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!({ "format": "pt" }));
    let mut data = Vec::new();
    for (name, shape) in tensors(&tiny()) {
        let n: usize = shape.iter().product();
        let start = data.len();
        for k in 0..n {
            data.extend_from_slice(&(k as f32 * 0.5).to_le_bytes());
        }
        header.insert(name, json!({ "dtype": "F32", "shape": shape, "data_offsets": [start, data.len()] }));
    }
    (header, data)
}

fn file(header: &Map<String, Value>, data: &[u8]) -> Vec<u8> {
    let text = serde_json::to_vec(header).unwrap();
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&text);
    bytes.extend_from_slice(data);
    bytes
}

#[derive(Clone, Debug)]
enum HeaderEdit {
    Dtype(Index, Value),
    Shape(Index, Value),
    Offsets(Index, Value),
    /// Moves both offsets of a tensor by the same amount (wrapping into negatives).
    Shift(Index, i64),
    /// Gives a tensor the offsets of another (overlap).
    CopyOffsets(Index, Index),
    RemoveKey(Index, &'static str),
    RemoveTensor(Index),
    Rename(Index, String),
    Entry(Index, Value),
    Metadata(Value),
}

#[derive(Clone, Debug)]
enum FileEdit {
    /// Replaces the 8-byte header length.
    Length(u64),
    /// Adds to the header length (wrapping).
    LengthBy(i64),
    FlipBit(Index, u8),
    Truncate(Index),
    InsertBytes(Index, Vec<u8>),
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(0)),
        Just(json!(1)),
        Just(json!(2)),
        Just(json!(-1)),
        Just(json!(1.5)),
        Just(json!(u32::MAX)),
        Just(json!(1u64 << 32)),
        Just(json!(1u64 << 61)),
        Just(json!(i64::MAX)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(1e300)),
        Just(json!("8")),
        Just(Value::Null),
        (0u64..200).prop_map(|n| json!(n)),
    ]
}

fn header_edit() -> impl Strategy<Value = HeaderEdit> {
    let dtype = prop_oneof![
        prop::sample::select(vec![
            "F32", "F16", "BF16", "F64", "I64", "U8", "BOOL", "F4", "F6_E2M3", "F8_E4M3", "C64", "f32",
            "F33", "",
        ])
        .prop_map(|d| json!(d)),
        number(),
    ];
    let shape = prop_oneof![
        prop::collection::vec(number(), 0..4).prop_map(Value::Array),
        prop::collection::vec(0u64..5, 0..4).prop_map(|v| json!(v)),
        Just(json!([u64::MAX, 2])),
        Just(json!([1u64 << 32, 1u64 << 32])),
        Just(json!("2,2")),
    ];
    let offsets = prop_oneof![
        (number(), number()).prop_map(|(a, b)| json!([a, b])),
        (0u64..400, 0u64..400).prop_map(|(a, b)| json!([a, b])),
        prop::collection::vec(number(), 0..4).prop_map(Value::Array),
        Just(json!({"start": 0})),
    ];
    prop_oneof![
        2 => (any::<Index>(), dtype).prop_map(|(i, v)| HeaderEdit::Dtype(i, v)),
        2 => (any::<Index>(), shape).prop_map(|(i, v)| HeaderEdit::Shape(i, v)),
        2 => (any::<Index>(), offsets).prop_map(|(i, v)| HeaderEdit::Offsets(i, v)),
        2 => (any::<Index>(), prop_oneof![-16i64..16, Just(i64::MAX), Just(i64::MIN)])
            .prop_map(|(i, d)| HeaderEdit::Shift(i, d)),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| HeaderEdit::CopyOffsets(a, b)),
        1 => (any::<Index>(), prop::sample::select(vec!["dtype", "shape", "data_offsets"]))
            .prop_map(|(i, k)| HeaderEdit::RemoveKey(i, k)),
        1 => any::<Index>().prop_map(HeaderEdit::RemoveTensor),
        1 => (any::<Index>(), prop_oneof![Just(String::new()), Just("__metadata__".to_string()), "\\PC{0,6}"])
            .prop_map(|(i, n)| HeaderEdit::Rename(i, n)),
        1 => (any::<Index>(), prop_oneof![number(), Just(json!([])), Just(json!({})), Just(json!("F32"))])
            .prop_map(|(i, v)| HeaderEdit::Entry(i, v)),
        1 => prop_oneof![Just(json!({"a": 1})), Just(json!("pt")), Just(Value::Null), Just(json!({"a": "b"}))]
            .prop_map(HeaderEdit::Metadata),
    ]
}

fn file_edit() -> impl Strategy<Value = FileEdit> {
    prop_oneof![
        prop_oneof![
            Just(0u64),
            Just(1),
            Just(7),
            Just(u64::MAX),
            Just(1 << 63),
            Just(100_000_001),
            0u64..4000
        ]
        .prop_map(FileEdit::Length),
        prop_oneof![-8i64..8, Just(i64::MIN)].prop_map(FileEdit::LengthBy),
        (any::<Index>(), 0u8..8).prop_map(|(i, b)| FileEdit::FlipBit(i, b)),
        any::<Index>().prop_map(FileEdit::Truncate),
        (any::<Index>(), prop::collection::vec(any::<u8>(), 1..9))
            .prop_map(|(i, b)| FileEdit::InsertBytes(i, b)),
    ]
}

fn edit_header(header: &mut Map<String, Value>, edit: &HeaderEdit) {
    let names: Vec<String> = header.keys().filter(|k| *k != "__metadata__").cloned().collect();
    if names.is_empty() {
        return;
    }
    let name = |i: &Index| names[i.index(names.len())].clone();
    let field = |header: &mut Map<String, Value>, i: &Index, key: &str, v: Value| {
        if let Some(Value::Object(entry)) = header.get_mut(&name(i)) {
            entry.insert(key.to_string(), v);
        }
    };
    match edit {
        HeaderEdit::Dtype(i, v) => field(header, i, "dtype", v.clone()),
        HeaderEdit::Shape(i, v) => field(header, i, "shape", v.clone()),
        HeaderEdit::Offsets(i, v) => field(header, i, "data_offsets", v.clone()),
        HeaderEdit::Shift(i, d) => {
            let move_by = |v: &Value| v.as_i64().map(|n| json!(n.wrapping_add(*d)));
            if let Some(offsets) = header.get_mut(&name(i)).and_then(|e| e.get_mut("data_offsets"))
                && let Some([a, b]) = offsets.as_array().map(Vec::as_slice)
                && let (Some(a), Some(b)) = (move_by(a), move_by(b))
            {
                *offsets = json!([a, b]);
            }
        }
        HeaderEdit::CopyOffsets(a, b) => {
            if let Some(offsets) = header.get(&name(b)).and_then(|e| e.get("data_offsets")).cloned() {
                field(header, a, "data_offsets", offsets);
            }
        }
        HeaderEdit::RemoveKey(i, key) => {
            if let Some(Value::Object(entry)) = header.get_mut(&name(i)) {
                entry.remove(*key);
            }
        }
        HeaderEdit::RemoveTensor(i) => {
            header.remove(&name(i));
        }
        HeaderEdit::Rename(i, new) => {
            if let Some(v) = header.remove(&name(i)) {
                header.insert(new.clone(), v);
            }
        }
        HeaderEdit::Entry(i, v) => {
            header.insert(name(i), v.clone());
        }
        HeaderEdit::Metadata(v) => {
            header.insert("__metadata__".into(), v.clone());
        }
    }
}

fn edit_file(bytes: &mut Vec<u8>, edit: &FileEdit) {
    match edit {
        FileEdit::Length(n) if bytes.len() >= 8 => bytes[..8].copy_from_slice(&n.to_le_bytes()),
        FileEdit::LengthBy(d) if bytes.len() >= 8 => {
            let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()).wrapping_add_signed(*d);
            bytes[..8].copy_from_slice(&n.to_le_bytes());
        }
        FileEdit::FlipBit(i, bit) if !bytes.is_empty() => {
            let at = i.index(bytes.len());
            bytes[at] ^= 1 << bit;
        }
        FileEdit::Truncate(i) => bytes.truncate(i.index(bytes.len() + 1)),
        FileEdit::InsertBytes(i, b) => {
            let at = i.index(bytes.len() + 1);
            bytes.splice(at..at, b.iter().copied());
        }
        _ => {}
    }
}

/// The tensor names of the file's header, when it can be read at all.
fn header_names(bytes: &[u8]) -> Vec<String> {
    let Some(len) = bytes.get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap())) else { return vec![] };
    let Some(text) = usize::try_from(len).ok().and_then(|n| bytes.get(8..8usize.checked_add(n)?)) else {
        return vec![];
    };
    serde_json::from_slice::<Map<String, Value>>(text)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

fn check_weights(
    model: &mut BertForTokenClassification<Flex>,
    path: &Path,
    bytes: &[u8],
) -> Result<(), String> {
    let names = header_names(bytes);
    match load_safetensors(model, path, &Default::default()) {
        Ok(report) => {
            let expected = tensors(&tiny()).len();
            if report.loaded + report.missing.len() != expected {
                return Err(format!(
                    "{} loaded and {} missing of {expected}",
                    report.loaded,
                    report.missing.len()
                ));
            }
            match report.unexpected.iter().find(|u| !names.contains(u)) {
                Some(u) => Err(format!("reports {u:?} as unused, which the file does not hold")),
                None => Ok(()),
            }
        }
        Err(e) => {
            let msg = e.to_string();
            if !msg.starts_with(&format!("{}: ", path.display())) {
                return Err(format!("does not name the file: {msg}"));
            }
            let tensor = names
                .iter()
                .find(|n| msg.contains(&format!("tensor {n}: ")) || msg.contains(&format!("tensor {n} ")));
            match (&e, tensor) {
                (BertError::Shape { tensor: t, .. }, _) if names.contains(t) => Ok(()),
                (BertError::Weights { .. }, Some(_)) => Ok(()),
                (BertError::Weights { .. }, None) if msg.contains("header") => Ok(()),
                _ => Err(format!("names neither the header nor a tensor it holds: {msg}")),
            }
        }
    }
}

#[test]
fn mutated_safetensors_never_panic_and_errors_name_the_header_or_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let device = Default::default();
    let model = RefCell::new(tiny().init_token_classification::<Flex>(LABELS, &device));
    let (header, data) = valid_weights();
    std::fs::write(&path, file(&header, &data)).unwrap();
    let report = load_safetensors(&mut model.borrow_mut(), &path, &device).expect("the fixture itself loads");
    assert!(report.missing.is_empty() && report.unexpected.is_empty(), "{report:?}");
    let strategy = (prop::collection::vec(header_edit(), 0..4), prop::collection::vec(file_edit(), 0..3));
    let started = std::time::Instant::now();
    let result = runner(&WEIGHTS_SEED).run(&strategy, |(header_edits, file_edits)| {
        let (mut header, data) = valid_weights();
        for e in &header_edits {
            edit_header(&mut header, e);
        }
        let mut bytes = file(&header, &data);
        for e in &file_edits {
            edit_file(&mut bytes, e);
        }
        rewrite(&path, &bytes);
        check_weights(&mut model.borrow_mut(), &path, &bytes).map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    eprintln!("{CASES} mutated safetensors files in {:.2?}", started.elapsed());
}

/// Offsets that add up to `usize::MAX`: the safetensors crate's own check of the
/// file's length overflows (a panic in debug builds); the loader refuses first.
#[test]
fn offsets_near_usize_max_are_an_error_not_an_overflow() {
    let mut header = Map::new();
    let mut start = 0usize;
    // Eight tensors of the most bytes one may declare (2^61 - 1: its size in bits
    // must fit), then one of the 7 bytes left.
    for (k, size) in [usize::MAX / 8; 8].into_iter().chain([7]).enumerate() {
        let end = start + size;
        header
            .insert(format!("t{k}"), json!({ "dtype": "U8", "shape": [size], "data_offsets": [start, end] }));
        start = end;
    }
    assert_eq!(start, usize::MAX);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    std::fs::write(&path, file(&header, &[])).unwrap();
    let device = Default::default();
    let mut model = tiny().init_token_classification::<Flex>(LABELS, &device);
    let err = load_safetensors(&mut model, &path, &device).unwrap_err().to_string();
    assert!(err.contains("model.safetensors") && err.contains("tensor t0"), "{err}");
}

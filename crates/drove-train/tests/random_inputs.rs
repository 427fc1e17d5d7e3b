//! Random inputs for resuming from a checkpoint: 10,000 seeded mutations of the
//! `state.json` of a small valid checkpoint written here (keys removed, renamed
//! or added, values retyped or replaced by huge, negative, fractional or
//! non-JSON numbers, the top level replaced, then bits flipped, bytes inserted
//! and the text cut) are loaded with `checkpoint::load` and, as the NER loop
//! does on resume, read as a `LoopState`.
//!
//! Asserted for every input: no panic; an error names `state.json` and the line
//! and column of a syntax error, or the field that is missing or was changed; a
//! state that loads restores the optimizer's step it holds. A checkpoint whose
//! `model.safetensors` declares offsets adding up to `usize::MAX` is an error
//! naming a tensor, not an overflow.

use std::path::Path;

use drove_train::checkpoint::{self, LoopState};
use drove_train::flat::{AdamWSettings, FlatAdamW, FlatParams};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use serde_json::{Value, json};

/// Random inputs per target.
const CASES: u32 = 10_000;
/// Fixed, so that every run feeds the same inputs.
const SEED: [u8; 32] = *b"drove state.json random inputs!!";

/// The fields of `state.json`: the loop's and the optimizer's.
const FIELDS: [&str; 10] = [
    "epoch",
    "batch",
    "position",
    "global_step",
    "world_size",
    "batch_size",
    "seed",
    "train_sentences",
    "history",
    "optimizer_step",
];

fn params() -> FlatParams {
    FlatParams {
        names: vec!["a.weight".into(), "a.bias".into()],
        shapes: vec![vec![2, 2], vec![2]],
        values: vec![vec![1.0, 2.0, 3.0, 4.0], vec![5.0, 6.0]],
    }
}

fn state() -> LoopState {
    LoopState {
        position: 0,
        epoch: 1,
        batch: 3,
        global_step: 7,
        world_size: 2,
        batch_size: 8,
        seed: 42,
        train_sentences: 100,
        history: vec![json!({ "epoch": 1, "f1": 0.5 })],
    }
}

/// Values a field might hold by mistake.
fn odd_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        Just(json!(false)),
        Just(json!("7")),
        Just(json!("")),
        Just(json!([])),
        Just(json!([1, 2])),
        Just(json!({})),
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(7)),
        Just(json!(2.5)),
        Just(json!(7.0)),
        Just(json!(-0.0)),
        Just(json!(1e308)),
        Just(json!(u64::MAX)),
        Just(json!(usize::MAX)),
        Just(json!(i64::MIN)),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_filter_map("finite", |x| x.is_finite().then(|| json!(x))),
        "\\PC{0,8}".prop_map(Value::String),
    ]
}

#[derive(Clone, Debug)]
enum StateEdit {
    Remove(Index),
    Set(Index, Value),
    Rename(Index, String),
    Add(String, Value),
    NotAnObject(Value),
}

#[derive(Clone, Debug)]
enum TextEdit {
    FlipBit(Index, u8),
    SetByte(Index, u8),
    Truncate(Index),
    InsertBytes(Index, Vec<u8>),
    /// Replaces the `n`th number by a word JSON does not have (`NaN`, ...).
    NotANumber(Index, &'static str),
}

fn state_edit() -> impl Strategy<Value = StateEdit> {
    let key = prop_oneof![prop::sample::select(FIELDS.to_vec()).prop_map(str::to_string), "[a-z_]{1,12}"];
    prop_oneof![
        3 => any::<Index>().prop_map(StateEdit::Remove),
        6 => (any::<Index>(), odd_value()).prop_map(|(i, v)| StateEdit::Set(i, v)),
        1 => (any::<Index>(), key.clone()).prop_map(|(i, k)| StateEdit::Rename(i, k)),
        1 => (key, odd_value()).prop_map(|(k, v)| StateEdit::Add(k, v)),
        1 => odd_value().prop_map(StateEdit::NotAnObject),
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
        (any::<Index>(), prop::sample::select(vec!["NaN", "Infinity", "-Infinity", "1e999", "0x7", "+7"]))
            .prop_map(|(i, w)| TextEdit::NotANumber(i, w)),
    ]
}

fn edit_state(json: &mut Value, edit: &StateEdit) {
    let Value::Object(map) = json else { return };
    let keys: Vec<String> = map.keys().cloned().collect();
    let key = |i: &Index| (!keys.is_empty()).then(|| keys[i.index(keys.len())].clone());
    match edit {
        StateEdit::Remove(i) => {
            if let Some(k) = key(i) {
                map.remove(&k);
            }
        }
        StateEdit::Set(i, v) => {
            if let Some(k) = key(i) {
                map.insert(k, v.clone());
            }
        }
        StateEdit::Rename(i, new) => {
            if let Some(v) = key(i).and_then(|k| map.remove(&k)) {
                map.insert(new.clone(), v);
            }
        }
        StateEdit::Add(k, v) => {
            map.insert(k.clone(), v.clone());
        }
        StateEdit::NotAnObject(v) => *json = v.clone(),
    }
}

fn edit_text(bytes: &mut Vec<u8>, edit: &TextEdit) {
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
        TextEdit::FlipBit(..) | TextEdit::SetByte(..) => {}
    }
}

/// Replaces a file by a new one: truncating and rewriting it in place makes ext4
/// flush it on close (`auto_da_alloc`), ten times slower.
fn rewrite(path: &Path, bytes: &[u8]) {
    let _ = std::fs::remove_file(path);
    std::fs::write(path, bytes).unwrap();
}

/// Whether `word` appears in `text` as a whole identifier.
fn names_word(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        !text[..at].chars().next_back().is_some_and(ident)
            && !text[at + word.len()..].chars().next().is_some_and(ident)
    })
}

/// Ok if the message names a field that `json` lacks or holds another value in
/// than the valid state did.
fn names_a_culprit(msg: &str, json: &Value, valid: &Value) -> Result<(), String> {
    match FIELDS.iter().find(|f| names_word(msg, f) && json.get(**f) != valid.get(**f)) {
        Some(_) => Ok(()),
        None => Err(format!("names no missing or changed field: {msg}")),
    }
}

fn check(dir: &Path, bytes: &[u8], valid: &Value) -> Result<(), String> {
    let state_path = dir.join("state.json");
    let (mut p, mut o) = (params(), FlatAdamW::new(AdamWSettings::default(), &params()));
    let json: Option<Value> = serde_json::from_slice(bytes).ok();
    match checkpoint::load(dir, &mut p, &mut o) {
        Err(e) => {
            let msg = e.to_string();
            if !msg.contains(&state_path.display().to_string()) {
                return Err(format!("does not name {}: {msg}", state_path.display()));
            }
            match &json {
                None => {
                    let syntax = serde_json::from_slice::<Value>(bytes).unwrap_err();
                    let at = format!("line {} column {}", syntax.line(), syntax.column());
                    if msg.contains(&at) { Ok(()) } else { Err(format!("a syntax error not at {at}: {msg}")) }
                }
                Some(v) if !v.is_object() => {
                    if msg.contains("JSON object") {
                        Ok(())
                    } else {
                        Err(format!("not an object, but: {msg}"))
                    }
                }
                Some(v) => names_a_culprit(&msg, v, valid),
            }
        }
        Ok(loaded) => {
            let Some(json) = json else { return Err("loaded a state.json that is not JSON".into()) };
            if loaded.state != json || Some(o.step) != json["optimizer_step"].as_u64() {
                return Err(format!("restored step {} from {json}", o.step));
            }
            if p != params() {
                return Err("the parameters changed".into());
            }
            // As the NER loop reads it on resume.
            match LoopState::from_json(loaded.state) {
                Ok(_) => Ok(()),
                Err(e) => names_a_culprit(&e, &json, valid),
            }
        }
    }
}

#[test]
fn mutated_state_json_never_panics_and_errors_name_the_file_and_field() {
    let root = tempfile::tempdir().unwrap();
    let p = params();
    let mut o = FlatAdamW::new(AdamWSettings::default(), &p);
    o.step = 7;
    let dir = checkpoint::save(root.path(), &p, &o, &state(), &[], 1).unwrap();
    let text = std::fs::read(dir.join("state.json")).unwrap();
    let valid: Value = serde_json::from_slice(&text).unwrap();
    check(&dir, &text, &valid).expect("the fixture itself loads");
    let strategy =
        (prop::collection::vec(state_edit(), 0..3), prop::collection::vec(text_edit(), 0..3), any::<bool>());
    let config = Config {
        cases: CASES,
        failure_persistence: None,
        rng_algorithm: RngAlgorithm::ChaCha,
        fork: false,
        timeout: 0,
        max_shrink_iters: 4096,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &SEED));
    let started = std::time::Instant::now();
    let result = runner.run(&strategy, |(edits, text_edits, pretty)| {
        let mut json = valid.clone();
        for e in &edits {
            edit_state(&mut json, e);
        }
        let mut bytes =
            if pretty { serde_json::to_vec_pretty(&json) } else { serde_json::to_vec(&json) }.unwrap();
        for e in &text_edits {
            edit_text(&mut bytes, e);
        }
        rewrite(&dir.join("state.json"), &bytes);
        check(&dir, &bytes, &valid).map_err(|why| {
            TestCaseError::fail(format!("{why}\ninput: {:?}", String::from_utf8_lossy(&bytes)))
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    eprintln!("{CASES} mutated state.json files in {:.2?}", started.elapsed());
}

#[test]
fn a_field_of_the_wrong_type_is_named() {
    let err = LoopState::from_json(json!({
        "epoch": 1, "batch": "3", "global_step": 7, "world_size": 2, "batch_size": 8,
        "seed": 42, "train_sentences": 100, "history": []
    }))
    .unwrap_err();
    assert!(err.contains("field `batch`: invalid type"), "{err}");
}

/// Offsets that add up to `usize::MAX`: the safetensors crate's own check of the
/// file's length overflows (a panic in debug builds); the loader refuses first.
#[test]
fn checkpoint_offsets_near_usize_max_are_an_error_not_an_overflow() {
    let root = tempfile::tempdir().unwrap();
    let p = params();
    let o = FlatAdamW::new(AdamWSettings::default(), &p);
    let dir = checkpoint::save(root.path(), &p, &o, &state(), &[], 1).unwrap();
    let mut header = serde_json::Map::new();
    let mut start = 0usize;
    for (k, size) in [usize::MAX / 8; 8].into_iter().chain([7]).enumerate() {
        let end = start + size;
        header
            .insert(format!("t{k}"), json!({ "dtype": "U8", "shape": [size], "data_offsets": [start, end] }));
        start = end;
    }
    let text = serde_json::to_vec(&header).unwrap();
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&text);
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    let (mut q, mut o2) = (params(), o.clone());
    let err = checkpoint::load(&dir, &mut q, &mut o2).unwrap_err().to_string();
    assert!(err.contains("model.safetensors") && err.contains("tensor t0"), "{err}");
}

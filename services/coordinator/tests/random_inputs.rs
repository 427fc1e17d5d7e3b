//! Random inputs for the coordinator's request validation: 10,000 seeded
//! requests, each a valid one of a random call (join, heartbeat, leave, put and
//! get key, push, query, watch, publish, fetch) with fields replaced by odd
//! values: run ids empty, 128 or 129 bytes or of any characters, world sizes,
//! ranks and timeouts negative, zero or huge, steps and values NaN or infinite,
//! aggregations unknown, blob names, sizes and sha256s wrong, headers missing or
//! repeated, chunks over the limit. They are made against one store, in order,
//! so later calls meet the runs and blobs earlier ones made; the services are
//! called in process (request streams framed here), so no network is involved.
//!
//! Asserted for every request: no panic and no internal error; a request with a
//! field that is wrong by itself is refused as INVALID_ARGUMENT naming that
//! field (`points[i].step`, `header.sha256`, `chunk 2`, ...); any other
//! INVALID_ARGUMENT names a field of the request; other refusals (no run, run
//! full, rank taken, no blob) name the run or blob; what is accepted answers
//! consistently (acknowledgements per batch, a published blob fetched back
//! byte for byte in chunks within the limit).

// Messages are built with `..Default::default()` even where every field is
// given, so that fields added to the protocol leave this test compiling.
#![allow(clippy::needless_update)]

use std::time::Duration;

use drove_coordinator::{MetricsService, RendezvousService, WeightsService};
use drove_proto::v1::metrics_server::Metrics;
use drove_proto::v1::rendezvous_server::Rendezvous;
use drove_proto::v1::weights_server::Weights;
use drove_proto::v1::{
    BlobHeader, FetchRequest, GetKeyRequest, HeartbeatRequest, JoinRequest, LeaveRequest, MetricPoint,
    PublishChunk, PushRequest, PutKeyRequest, QueryRequest, WatchRequest,
};
use drove_store::Store;
use futures::FutureExt as _;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use prost::bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio_stream::StreamExt as _;
use tonic::codec::{Codec as _, Streaming};
use tonic::{Code, Request, Status};

/// Random inputs.
const CASES: u32 = 10_000;
/// Fixed, so that every run feeds the same inputs.
const SEED: [u8; 32] = *b"drove coordinator random inputs!";
/// The weights service's chunk limit here: small, so that chunks exceed it.
const MAX_CHUNK: usize = 16;
/// The largest world the coordinator accepts.
const MAX_WORLD: i32 = 1 << 16;

// ------------------------------------------------------------------ requests

#[derive(Clone, Debug)]
enum Call {
    Join(JoinRequest),
    Heartbeat(HeartbeatRequest),
    Leave(LeaveRequest),
    PutKey(PutKeyRequest),
    GetKey(GetKeyRequest),
    Push(Vec<PushRequest>),
    Query(QueryRequest),
    Watch(WatchRequest),
    Publish(Publish),
    Fetch(FetchRequest),
}

/// A publish: a blob cut into chunks, then damaged.
#[derive(Clone, Debug)]
struct Publish {
    data: Vec<u8>,
    chunk: usize,
    name: String,
    /// Added to the true size (wrapping), or the size to declare.
    size: Size,
    sha: Sha,
    /// The first chunk without its header.
    headless: bool,
    /// A chunk after the first that carries a header too.
    second_header: Option<Index>,
    /// No chunk at all.
    empty: bool,
}

#[derive(Clone, Debug)]
enum Size {
    Off(i64),
    Is(u64),
}

#[derive(Clone, Debug)]
enum Sha {
    Right,
    Upper,
    /// Well-formed, but of other bytes.
    Other,
    Text(String),
}

impl Publish {
    fn size(&self) -> u64 {
        match self.size {
            Size::Off(d) => (self.data.len() as u64).wrapping_add_signed(d),
            Size::Is(n) => n,
        }
    }

    fn sha(&self) -> String {
        match &self.sha {
            Sha::Right => hex(&Sha256::digest(&self.data)),
            Sha::Upper => hex(&Sha256::digest(&self.data)).to_uppercase(),
            Sha::Other => hex(&Sha256::digest(b"other")),
            Sha::Text(s) => s.clone(),
        }
    }

    fn chunks(&self) -> Vec<PublishChunk> {
        if self.empty {
            return Vec::new();
        }
        let mut chunks: Vec<PublishChunk> = self
            .data
            .chunks(self.chunk)
            .map(|c| PublishChunk { data: Bytes::copy_from_slice(c), ..Default::default() })
            .collect();
        if chunks.is_empty() {
            chunks.push(PublishChunk::default());
        }
        let header = BlobHeader {
            name: self.name.clone(),
            size: self.size(),
            sha256: self.sha(),
            ..Default::default()
        };
        if !self.headless {
            chunks[0].header = Some(header.clone());
        }
        if let Some(i) = self.second_header
            && chunks.len() > 1
        {
            let at = 1 + i.index(chunks.len() - 1);
            chunks[at].header = Some(header);
        }
        chunks
    }
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Run ids: a few that recur (so calls meet each other's runs), and odd ones.
fn run_id() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => prop::sample::select(vec!["r1", "r2", "run-3", "m"]).prop_map(String::from),
        1 => Just(String::new()),
        1 => Just("x".repeat(128)),
        1 => Just("x".repeat(129)),
        1 => Just("\u{e9}".repeat(64)),
        1 => Just("\u{e9}".repeat(65)),
        1 => Just("a\0b".to_string()),
        2 => "\\PC{1,10}",
    ]
}

fn small_or_odd_i32(valid: std::ops::Range<i32>) -> impl Strategy<Value = i32> {
    prop_oneof![
        8 => valid,
        1 => Just(-1),
        1 => Just(0),
        1 => Just(i32::MIN),
        1 => Just(i32::MAX),
        1 => Just(MAX_WORLD),
        1 => Just(MAX_WORLD + 1),
        1 => any::<i32>(),
    ]
}

fn millis() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => Just(0i64),
        2 => 1i64..5,
        1 => Just(-1),
        1 => Just(i64::MIN),
        1 => Just(i64::MAX),
        1 => any::<i64>(),
    ]
}

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        8 => 0.0..1000.0f64,
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
        1 => Just(-0.0),
        1 => Just(-1.0),
        1 => Just(f64::MAX),
        1 => Just(5e-324),
        1 => any::<f64>(),
    ]
}

fn text(valid: &'static str) -> impl Strategy<Value = String> {
    prop_oneof![6 => Just(valid.to_string()), 1 => Just(String::new()), 1 => "\\PC{1,8}"]
}

fn point() -> impl Strategy<Value = MetricPoint> {
    (run_id(), small_or_odd_i32(0..4), float(), text("loss"), float(), prop_oneof![Just(0i64), any::<i64>()])
        .prop_map(|(run_id, rank, step, name, value, wall_time_unix_ms)| MetricPoint {
            run_id,
            rank,
            step,
            name,
            value,
            wall_time_unix_ms,
            ..Default::default()
        })
}

fn publish() -> impl Strategy<Value = Publish> {
    let name = prop_oneof![
        8 => prop::sample::select(vec!["w", "model/init.bin", "a-b_c.d"]).prop_map(String::from),
        1 => Just(String::new()),
        1 => Just("n".repeat(256)),
        1 => Just("n".repeat(257)),
        1 => Just("../up".to_string()),
        1 => Just("sp ace".to_string()),
        1 => "\\PC{1,6}",
    ];
    let size = prop_oneof![
        8 => Just(Size::Off(0)),
        2 => (-3i64..4).prop_map(Size::Off),
        1 => Just(Size::Is(u64::MAX)),
        1 => Just(Size::Is(0)),
    ];
    let sha = prop_oneof![
        8 => Just(Sha::Right),
        1 => Just(Sha::Upper),
        1 => Just(Sha::Other),
        1 => Just(Sha::Text(String::new())),
        1 => Just(Sha::Text("a".repeat(63))),
        1 => Just(Sha::Text("g".repeat(64))),
        1 => "\\PC{64}".prop_map(Sha::Text),
    ];
    (
        prop::collection::vec(any::<u8>(), 0..48),
        1usize..=20,
        name,
        size,
        sha,
        prop::bool::weighted(0.05),
        prop::option::weighted(0.05, any::<Index>()),
        prop::bool::weighted(0.03),
    )
        .prop_map(|(data, chunk, name, size, sha, headless, second_header, empty)| Publish {
            data,
            chunk,
            name,
            size,
            sha,
            headless,
            second_header,
            empty,
        })
}

fn call() -> impl Strategy<Value = Call> {
    let join = (
        run_id(),
        small_or_odd_i32(1..4),
        text("127.0.0.1:29500"),
        text("a"),
        small_or_odd_i32(-1..3),
        millis(),
    )
        .prop_map(|(run_id, world_size, address, host, requested_rank, timeout_ms)| {
            Call::Join(JoinRequest {
                run_id,
                world_size,
                address,
                host,
                requested_rank,
                timeout_ms,
                ..Default::default()
            })
        });
    let heartbeat =
        (run_id(), small_or_odd_i32(0..3), prop::bool::weighted(0.2)).prop_map(|(run_id, rank, observer)| {
            Call::Heartbeat(HeartbeatRequest { run_id, rank, observer, ..Default::default() })
        });
    let leave = (run_id(), small_or_odd_i32(0..3), prop_oneof![4 => Just(String::new()), 1 => "\\PC{1,8}"])
        .prop_map(|(run_id, rank, error)| {
            Call::Leave(LeaveRequest { run_id, rank, error, ..Default::default() })
        });
    let value =
        prop_oneof![20 => prop::collection::vec(any::<u8>(), 0..16), 1 => Just(vec![7u8; (1 << 20) + 1])];
    let put = (run_id(), text("k"), value).prop_map(|(run_id, key, value)| {
        Call::PutKey(PutKeyRequest { run_id, key, value, ..Default::default() })
    });
    let get = (run_id(), text("k"), millis()).prop_map(|(run_id, key, wait_ms)| {
        Call::GetKey(GetKeyRequest { run_id, key, wait_ms, ..Default::default() })
    });
    let push = prop::collection::vec(
        prop::collection::vec(point(), 0..4).prop_map(|points| PushRequest { points, ..Default::default() }),
        0..3,
    )
    .prop_map(Call::Push);
    let step = || prop::option::of(float());
    let aggregation = prop_oneof![8 => 0i32..7, 1 => Just(-1), 1 => Just(7), 1 => any::<i32>()];
    let query = (run_id(), prop_oneof![Just(String::new()), text("loss")], step(), step(), aggregation)
        .prop_map(|(run_id, name, min_step, max_step, aggregation)| {
            Call::Query(QueryRequest { run_id, name, min_step, max_step, aggregation, ..Default::default() })
        });
    let watch = (run_id(), prop_oneof![Just(String::new()), text("loss")])
        .prop_map(|(run_id, name)| Call::Watch(WatchRequest { run_id, name, ..Default::default() }));
    let fetch_name = prop_oneof![
        6 => prop::sample::select(vec!["w", "model/init.bin", "a-b_c.d"]).prop_map(String::from),
        1 => Just(String::new()),
        1 => "\\PC{1,6}",
    ];
    let chunk_bytes = prop_oneof![4 => 0u32..24, 1 => Just(u32::MAX), 1 => any::<u32>()];
    let fetch = (fetch_name, chunk_bytes).prop_map(|(name, chunk_bytes)| {
        Call::Fetch(FetchRequest { name, chunk_bytes, ..Default::default() })
    });
    prop_oneof![
        3 => join,
        2 => heartbeat,
        2 => leave,
        1 => put,
        1 => get,
        3 => push,
        2 => query,
        1 => watch,
        3 => publish().prop_map(Call::Publish),
        2 => fetch,
    ]
}

// ------------------------------------------------------------------ oracles

/// Whether `word` appears in `text` whole (not inside a longer identifier, so
/// that `rank` is not found in `requested_rank`, nor `chunk 1` in `chunk 10`).
fn names_word(text: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        !text[..at].chars().next_back().is_some_and(ident)
            && !text[at + word.len()..].chars().next().is_some_and(ident)
    })
}

fn bad_run_id(run_id: &str) -> bool {
    run_id.is_empty() || run_id.len() > 128
}

/// The fields of one point that are wrong by themselves.
fn bad_point(p: &MetricPoint, i: usize) -> Vec<String> {
    let mut bad = Vec::new();
    let mut flag = |is_bad: bool, field: &str| {
        if is_bad {
            bad.push(format!("points[{i}].{field}"));
        }
    };
    flag(bad_run_id(&p.run_id), "run_id");
    flag(p.rank < 0, "rank");
    flag(!p.step.is_finite() || p.step < 0.0, "step");
    flag(p.name.is_empty(), "name");
    flag(!p.value.is_finite(), "value");
    bad
}

fn bad_name(name: &str) -> bool {
    name.is_empty()
        || name.len() > 256
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || "._/-".contains(c))
}

fn bad_publish(p: &Publish) -> Vec<String> {
    let chunks = p.chunks();
    let Some(first) = chunks.first().and_then(|c| c.header.as_ref()) else { return vec!["header".into()] };
    let mut bad = Vec::new();
    if bad_name(&first.name) {
        bad.push("header.name".into());
    }
    let sha = first.sha256.to_ascii_lowercase();
    let well_formed = sha.len() == 64 && sha.chars().all(|c| c.is_ascii_hexdigit());
    if !well_formed {
        bad.push("header.sha256".into());
    }
    let mut written = 0u64;
    for (i, c) in chunks.iter().enumerate() {
        if (i > 0 && c.header.is_some())
            || c.data.len() > MAX_CHUNK
            || written + c.data.len() as u64 > first.size
        {
            bad.push(format!("chunk {i}"));
            return bad;
        }
        written += c.data.len() as u64;
    }
    if written != first.size {
        bad.push("header.size".into());
    } else if well_formed && sha != hex(&Sha256::digest(&p.data)) {
        bad.push("header.sha256".into());
    }
    bad
}

/// What a call's answer must be: the fields wrong by themselves, the fields of
/// the request, the codes other than INVALID_ARGUMENT it may be refused with,
/// and what such a refusal must name.
struct Expect {
    bad: Vec<String>,
    fields: Vec<String>,
    codes: Vec<Code>,
    names: Vec<String>,
}

fn expect(call: &Call) -> Expect {
    let strs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let flags = |v: &[(bool, &str)]| v.iter().filter(|(b, _)| *b).map(|(_, f)| f.to_string()).collect();
    let run = |id: &str| vec![format!("{id:?}")];
    match call {
        Call::Join(r) => Expect {
            bad: flags(&[
                (bad_run_id(&r.run_id), "run_id"),
                (!(1..=MAX_WORLD).contains(&r.world_size), "world_size"),
                (r.address.is_empty(), "address"),
                (r.timeout_ms < 0, "timeout_ms"),
            ]),
            fields: strs(&["run_id", "world_size", "address", "host", "requested_rank", "timeout_ms"]),
            codes: vec![Code::FailedPrecondition, Code::AlreadyExists, Code::DeadlineExceeded, Code::Aborted],
            names: run(&r.run_id),
        },
        Call::Heartbeat(r) => Expect {
            bad: flags(&[(bad_run_id(&r.run_id), "run_id")]),
            fields: strs(&["run_id", "rank"]),
            codes: vec![Code::NotFound],
            names: run(&r.run_id),
        },
        Call::Leave(r) => Expect {
            bad: flags(&[(bad_run_id(&r.run_id), "run_id")]),
            fields: strs(&["run_id", "rank", "error"]),
            codes: vec![],
            names: run(&r.run_id),
        },
        Call::PutKey(r) => Expect {
            bad: flags(&[
                (bad_run_id(&r.run_id), "run_id"),
                (r.key.is_empty(), "key"),
                (r.value.len() > 1 << 20, "value"),
            ]),
            fields: strs(&["run_id", "key", "value"]),
            codes: vec![Code::NotFound],
            names: run(&r.run_id),
        },
        Call::GetKey(r) => Expect {
            bad: flags(&[(bad_run_id(&r.run_id), "run_id"), (r.wait_ms < 0, "wait_ms")]),
            fields: strs(&["run_id", "key", "wait_ms"]),
            codes: vec![Code::NotFound],
            names: run(&r.run_id),
        },
        Call::Query(r) => Expect {
            bad: flags(&[
                (bad_run_id(&r.run_id), "run_id"),
                (r.min_step.is_some_and(f64::is_nan), "min_step"),
                (r.max_step.is_some_and(f64::is_nan), "max_step"),
                (!(0..7).contains(&r.aggregation), "aggregation"),
            ]),
            fields: strs(&["run_id", "name", "min_step", "max_step", "aggregation"]),
            codes: vec![],
            names: vec![],
        },
        Call::Watch(r) => Expect {
            bad: flags(&[(bad_run_id(&r.run_id), "run_id")]),
            fields: strs(&["run_id", "name"]),
            codes: vec![],
            names: vec![],
        },
        Call::Fetch(r) => Expect {
            bad: flags(&[(r.name.is_empty(), "name")]),
            fields: strs(&["name", "chunk_bytes"]),
            codes: vec![Code::NotFound],
            names: vec![format!("{:?}", r.name)],
        },
        Call::Publish(p) => Expect { bad: bad_publish(p), fields: vec![], codes: vec![], names: vec![] },
        // Checked batch by batch in `check_push`.
        Call::Push(_) => Expect { bad: vec![], fields: vec![], codes: vec![], names: vec![] },
    }
}

/// Checks a refusal against what the call must be refused with, if at all.
fn check_refusal(e: &Expect, status: &Status) -> Result<(), String> {
    let msg = status.message();
    if status.code() == Code::InvalidArgument {
        if !e.bad.is_empty() {
            return match e.bad.iter().any(|f| names_word(msg, f)) {
                true => Ok(()),
                false => Err(format!("refused without naming any of {:?}: {msg}", e.bad)),
            };
        }
        return match e.fields.iter().any(|f| names_word(msg, f)) {
            true => Ok(()),
            false => Err(format!("INVALID_ARGUMENT naming no field of {:?}: {msg}", e.fields)),
        };
    }
    if !e.bad.is_empty() {
        return Err(format!(
            "{:?} should be INVALID_ARGUMENT naming one of {:?}: {msg}",
            status.code(),
            e.bad
        ));
    }
    if !e.codes.contains(&status.code()) {
        return Err(format!("unexpected {:?}: {msg}", status.code()));
    }
    match e.names.iter().any(|n| msg.contains(n.as_str())) {
        true => Ok(()),
        false => Err(format!("{:?} naming none of {:?}: {msg}", status.code(), e.names)),
    }
}

fn accepted(e: &Expect) -> Result<(), String> {
    match e.bad.is_empty() {
        true => Ok(()),
        false => Err(format!("accepted with {:?} wrong", e.bad)),
    }
}

// ------------------------------------------------------------------ calls

/// gRPC-framed messages as a request stream, decoded as the server would.
fn streaming<T: prost::Message + Default + Send + 'static>(messages: &[T]) -> Streaming<T> {
    let mut frames = Vec::new();
    for m in messages {
        let body = m.encode_to_vec();
        frames.push(0u8);
        frames.extend_from_slice(&(body.len() as u32).to_be_bytes());
        frames.extend_from_slice(&body);
    }
    let decoder = tonic_prost::ProstCodec::<T, T>::new().decoder();
    Streaming::new_request(decoder, http_body_util::Full::new(Bytes::from(frames)), None, None)
}

struct Services {
    rendezvous: RendezvousService,
    metrics: MetricsService,
    weights: WeightsService,
}

/// The result of a call that may wait (join, get key): polled once, then
/// dropped if still waiting, as a client that gives up would.
fn once<T>(f: impl Future<Output = Result<T, Status>>) -> Option<Result<T, Status>> {
    f.now_or_never()
}

fn check_unary<T>(e: &Expect, result: Option<Result<T, Status>>) -> Result<(), String> {
    match result {
        None | Some(Ok(_)) => accepted(e),
        Some(Err(status)) if status.code() == Code::Internal => {
            Err(format!("internal error: {}", status.message()))
        }
        Some(Err(status)) => check_refusal(e, &status),
    }
}

async fn check_push(s: &Services, batches: &[PushRequest]) -> Result<(), String> {
    let acks =
        s.metrics.push(Request::new(streaming(batches))).await.map_err(|e| format!("push refused: {e:?}"))?;
    let answers: Vec<Result<u64, Status>> = acks.into_inner().map(|a| a.map(|a| a.stored)).collect().await;
    // Each batch is acknowledged until the first with a wrong point, which ends
    // the stream with an error naming that point's index and field.
    let mut sent = 0u64;
    for (b, batch) in batches.iter().enumerate() {
        let bad = batch.points.iter().enumerate().map(|(i, p)| bad_point(p, i)).find(|f| !f.is_empty());
        match (answers.get(b), bad) {
            (Some(Ok(stored)), None) => {
                sent += batch.points.len() as u64;
                if *stored != sent {
                    return Err(format!("batch {b}: acknowledged {stored} points of {sent}"));
                }
            }
            (Some(Err(status)), Some(fields)) => {
                let e = Expect { bad: fields, fields: vec![], codes: vec![], names: vec![] };
                check_refusal(&e, status)?;
                return match answers.len() == b + 1 {
                    true => Ok(()),
                    false => Err(format!("{} answers after the refusal of batch {b}", answers.len() - b - 1)),
                };
            }
            (answer, bad) => return Err(format!("batch {b} (wrong: {bad:?}) answered {answer:?}")),
        }
    }
    match answers.len() == batches.len() {
        true => Ok(()),
        false => Err(format!("{} answers to {} batches", answers.len(), batches.len())),
    }
}

async fn check_publish(s: &Services, p: &Publish) -> Result<(), String> {
    let e = expect(&Call::Publish(p.clone()));
    match s.weights.publish(Request::new(streaming(&p.chunks()))).await {
        Ok(info) => {
            accepted(&e)?;
            let info = info.into_inner();
            let sha = hex(&Sha256::digest(&p.data));
            if info.name != p.name || info.size != p.data.len() as u64 || info.sha256 != sha {
                return Err(format!("published as {info:?}"));
            }
            // Fetched back whole, in chunks within the limit.
            let chunks = s
                .weights
                .fetch(Request::new(FetchRequest { name: p.name.clone(), ..Default::default() }))
                .await
                .map_err(|e| format!("fetching it back: {e:?}"))?;
            check_fetched(chunks.into_inner(), 0).await
        }
        Err(status) if status.code() == Code::Internal => {
            Err(format!("internal error: {}", status.message()))
        }
        Err(status) => check_refusal(&e, &status),
    }
}

/// A fetched blob: the first chunk carries its info, every chunk is within
/// the limit, the bytes hash to the sha256 the info names.
async fn check_fetched(
    stream: impl tokio_stream::Stream<Item = Result<drove_proto::v1::FetchChunk, Status>>,
    chunk_bytes: u32,
) -> Result<(), String> {
    let chunks: Vec<_> = stream.collect().await;
    let limit = match chunk_bytes as usize {
        0 => (1 << 20).min(MAX_CHUNK),
        n => n.min(MAX_CHUNK),
    };
    let mut data = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        let c = c.as_ref().map_err(|e| format!("chunk {i}: {e:?}"))?;
        if c.data.len() > limit || (i == 0) != c.info.is_some() {
            return Err(format!("chunk {i} of {} bytes (limit {limit}), info {:?}", c.data.len(), c.info));
        }
        data.extend_from_slice(&c.data);
    }
    let info = chunks.first().and_then(|c| c.as_ref().ok()).and_then(|c| c.info.clone());
    match info {
        Some(info) if info.size == data.len() as u64 && info.sha256 == hex(&Sha256::digest(&data)) => Ok(()),
        info => Err(format!("fetched {} bytes for {info:?}", data.len())),
    }
}

async fn check(s: &Services, call: &Call) -> Result<(), String> {
    let e = expect(call);
    match call {
        Call::Join(r) => check_unary(&e, once(s.rendezvous.join(Request::new(r.clone())))),
        Call::GetKey(r) => check_unary(&e, once(s.rendezvous.get_key(Request::new(r.clone())))),
        Call::Heartbeat(r) => check_unary(&e, Some(s.rendezvous.heartbeat(Request::new(r.clone())).await)),
        Call::Leave(r) => check_unary(&e, Some(s.rendezvous.leave(Request::new(r.clone())).await)),
        Call::PutKey(r) => check_unary(&e, Some(s.rendezvous.put_key(Request::new(r.clone())).await)),
        Call::Query(r) => check_unary(&e, Some(s.metrics.query(Request::new(r.clone())).await)),
        Call::Watch(r) => check_unary(&e, Some(s.metrics.watch(Request::new(r.clone())).await)),
        Call::Push(batches) => check_push(s, batches).await,
        Call::Publish(p) => check_publish(s, p).await,
        Call::Fetch(r) => match s.weights.fetch(Request::new(r.clone())).await {
            Ok(chunks) => {
                accepted(&e)?;
                check_fetched(chunks.into_inner(), r.chunk_bytes).await
            }
            Err(status) => check_unary::<()>(&e, Some(Err(status))),
        },
    }
}

#[test]
fn random_requests_never_panic_and_refusals_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (_closing, closing_rx) = tokio::sync::watch::channel(false);
    let services = runtime.block_on(async {
        Services {
            rendezvous: RendezvousService::new(store.clone(), Duration::from_millis(5)).unwrap(),
            metrics: MetricsService::new(store.clone(), closing_rx),
            weights: WeightsService::new(store.clone(), MAX_CHUNK),
        }
    });
    let config = Config {
        cases: CASES,
        failure_persistence: None,
        rng_algorithm: RngAlgorithm::ChaCha,
        fork: false,
        timeout: 0,
        // Calls change the services' state, so a failure does not replay
        // exactly; shrinking still narrows the request down.
        max_shrink_iters: 256,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &SEED));
    let started = std::time::Instant::now();
    let result = runner.run(&call(), |call| {
        runtime
            .block_on(check(&services, &call))
            .map_err(|why| TestCaseError::fail(format!("{why}\nrequest: {call:?}")))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    eprintln!("{CASES} random requests in {:.2?}", started.elapsed());
}

/// A world size near `i32::MAX` used to be allocated (tables of that many
/// workers) before anything else was checked.
#[test]
fn a_huge_world_size_is_refused_not_allocated() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let status = runtime.block_on(async {
        let service = RendezvousService::new(store, Duration::from_millis(5)).unwrap();
        let req = JoinRequest {
            run_id: "big".into(),
            world_size: i32::MAX,
            address: "127.0.0.1:1".into(),
            requested_rank: -1,
            ..Default::default()
        };
        service.join(Request::new(req)).await.unwrap_err()
    });
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("world_size must be 1 to 65536"), "{}", status.message());
}

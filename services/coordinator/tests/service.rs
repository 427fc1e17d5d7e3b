//! The real server on loopback, driven with the generated clients.
use std::collections::BTreeSet;
use std::time::Duration;

use drove_control::Clients;
use drove_proto::v1::{
    Aggregation, BlobHeader, FetchRequest, JoinRequest, LeaveRequest, ListBlobsRequest, ListRunsRequest,
    MetricPoint, PublishChunk, PushRequest, QueryRequest, WatchRequest,
};
use sha2::{Digest, Sha256};
use tonic::Code;

struct Fixture {
    server: drove_coordinator::Server,
    addr: String,
    _store: tempfile::TempDir,
}

async fn fixture(token: Option<&str>) -> Fixture {
    let store = tempfile::tempdir().unwrap();
    let config = drove_coordinator::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: store.path().to_path_buf(),
        token: token.map(str::to_string),
        ..Default::default()
    };
    let server = drove_coordinator::start(&config).await.unwrap();
    let addr = server.addr().to_string();
    Fixture { server, addr, _store: store }
}

async fn clients(f: &Fixture, token: Option<&str>) -> Clients {
    Clients::connect(&f.addr, token).await.unwrap()
}

fn join(run: &str, world: i32, i: usize, timeout_ms: i64) -> JoinRequest {
    JoinRequest {
        run_id: run.into(),
        world_size: world,
        address: format!("127.0.0.1:{}", 20000 + i),
        host: if i.is_multiple_of(2) { "a".into() } else { "b".into() },
        requested_rank: -1,
        timeout_ms,
        restart_count: 0,
        ..Default::default()
    }
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_workers_get_ranks_0_to_3_once_and_identical_peer_tables() {
    let f = fixture(None).await;
    let mut handles = Vec::new();
    for i in 0..4 {
        let mut c = clients(&f, None).await;
        handles.push(tokio::spawn(async move {
            c.rendezvous.join(join("r4", 4, i, 10_000)).await.map(|r| r.into_inner())
        }));
    }
    let mut responses = Vec::new();
    for h in handles {
        responses.push(h.await.unwrap().expect("join succeeds"));
    }
    let ranks: BTreeSet<i32> = responses.iter().map(|r| r.rank).collect();
    assert_eq!(ranks, (0..4).collect());
    assert!(responses.iter().all(|r| r.world_size == 4 && r.peers == responses[0].peers));
    let peers = &responses[0].peers;
    assert_eq!(peers.iter().map(|p| p.rank).collect::<Vec<_>>(), [0, 1, 2, 3]);
    // Local ranks count within each host, in rank order.
    for host in ["a", "b"] {
        let locals: Vec<i32> = peers.iter().filter(|p| p.host == host).map(|p| p.local_rank).collect();
        assert_eq!(locals, [0, 1], "host {host}");
    }
    for r in &responses {
        assert_eq!(r.local_rank, peers[r.rank as usize].local_rank);
    }
    // A fifth worker is refused, saying the run is full.
    let mut c = clients(&f, None).await;
    let err = c.rendezvous.join(join("r4", 4, 9, 1000)).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("is full: 4 of 4"), "{}", err.message());
    f.server.shutdown().await;
}

/// The stored (state, joined) of every run whose id starts with `prefix`.
async fn stored_states(c: &mut Clients, prefix: &str) -> Vec<(String, String, i32)> {
    let runs = c.metrics.list_runs(ListRunsRequest {}).await.unwrap().into_inner().runs;
    let mut states: Vec<_> = runs
        .into_iter()
        .filter(|r| r.run_id.starts_with(prefix))
        .map(|r| {
            let state = r.state().to_string();
            (r.run_id, state, r.joined)
        })
        .collect();
    states.sort();
    states
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_joins_and_leaves_store_the_state_of_the_last_one() {
    // Joins and leaves of one run arrive at once; what is stored must be the
    // state after the last of them, whatever order their writes would take.
    // (Before the writes moved under the run lock, a first join's "rendezvous"
    // could land after the last join's "running", as a CI run saw.)
    const RUNS: usize = 16;
    const WORLD: usize = 4;
    let f = fixture(None).await;
    let mut c = clients(&f, None).await;
    let mut workers = Vec::new();
    for _ in 0..WORLD {
        workers.push(clients(&f, None).await);
    }
    for k in 0..RUNS {
        let run = format!("race-{k}");
        let calls = workers.iter().enumerate().map(|(i, w)| {
            let (mut w, req) = (w.rendezvous.clone(), join(&run, WORLD as i32, i, 10_000));
            tokio::spawn(async move { w.join(req).await.map(|r| r.into_inner().rank) })
        });
        for call in calls.collect::<Vec<_>>() {
            call.await.unwrap().expect("join");
        }
    }
    let want = |state: &str| -> Vec<(String, String, i32)> {
        let mut v: Vec<_> =
            (0..RUNS).map(|k| (format!("race-{k}"), state.to_string(), WORLD as i32)).collect();
        v.sort();
        v
    };
    assert_eq!(stored_states(&mut c, "race-").await, want("running"));
    for k in 0..RUNS {
        let calls = workers.iter().enumerate().map(|(rank, w)| {
            let mut w = w.rendezvous.clone();
            let req = LeaveRequest {
                run_id: format!("race-{k}"),
                rank: rank as i32,
                error: String::new(),
                ..Default::default()
            };
            tokio::spawn(async move { w.leave(req).await.map(|_| ()) })
        });
        for call in calls.collect::<Vec<_>>() {
            call.await.unwrap().expect("leave");
        }
    }
    assert_eq!(stored_states(&mut c, "race-").await, want("finished"));
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_world_that_never_fills_times_out_every_joined_worker() {
    let f = fixture(None).await;
    let mut handles = Vec::new();
    for i in 0..2 {
        let mut c = clients(&f, None).await;
        handles.push(tokio::spawn(async move { c.rendezvous.join(join("r3", 3, i, 300)).await }));
    }
    for h in handles {
        let err = h.await.unwrap().unwrap_err();
        assert_eq!(err.code(), Code::DeadlineExceeded);
        assert!(
            err.message().contains("did not fill") && err.message().contains("of 3 workers"),
            "{}",
            err.message()
        );
    }
    // The places were given back: a full world can still form.
    let mut handles = Vec::new();
    for i in 0..3 {
        let mut c = clients(&f, None).await;
        handles.push(tokio::spawn(async move { c.rendezvous.join(join("r3", 3, i, 10_000)).await }));
    }
    for h in handles {
        assert!(h.await.unwrap().is_ok());
    }
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_invalid_arguments_naming_the_field() {
    let f = fixture(None).await;
    let mut c = clients(&f, None).await;
    for (req, field) in [
        (JoinRequest { world_size: 0, ..join("x", 1, 0, 100) }, "world_size"),
        (JoinRequest { world_size: -2, ..join("x", 1, 0, 100) }, "world_size"),
        (JoinRequest { run_id: String::new(), ..join("x", 1, 0, 100) }, "run_id"),
        (JoinRequest { requested_rank: 5, ..join("x", 2, 0, 100) }, "requested_rank"),
    ] {
        let err = c.rendezvous.join(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(err.message().contains(field), "{field}: {}", err.message());
    }
    let point = |step: f64, value: f64, run: &str| MetricPoint {
        run_id: run.into(),
        rank: 0,
        step,
        name: "loss".into(),
        value,
        wall_time_unix_ms: 0,
    };
    for (p, field) in [
        (point(f64::NAN, 1.0, "m"), "points[1].step"),
        (point(-1.0, 1.0, "m"), "points[1].step"),
        (point(1.0, f64::INFINITY, "m"), "points[1].value"),
        (point(1.0, 1.0, ""), "points[1].run_id"),
    ] {
        let batch = PushRequest { points: vec![point(0.0, 1.0, "m"), p] };
        let mut acks = c.metrics.push(tokio_stream::iter(vec![batch])).await.unwrap().into_inner();
        let err = acks.message().await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains(field), "{field}: {}", err.message());
    }
    // Nothing of the refused batches was stored.
    let q = c
        .metrics
        .query(QueryRequest { run_id: "m".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(q.points.is_empty());
    // An oversized chunk.
    let big = vec![0u8; (4 << 20) + 1];
    let chunks = vec![PublishChunk {
        header: Some(BlobHeader {
            name: "big".into(),
            size: big.len() as u64,
            sha256: hex(&Sha256::digest(&big)),
        }),
        data: big.into(),
    }];
    let err = c.weights.publish(tokio_stream::iter(chunks)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("chunk 0") && err.message().contains("chunk limit"), "{}", err.message());
    f.server.shutdown().await;
}

fn blob(n: usize) -> Vec<u8> {
    let mut s = 0x1234_5678_9abc_def0u64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

fn chunks(name: &str, data: &[u8], sha: &str, size: u64, chunk: usize) -> Vec<PublishChunk> {
    data.chunks(chunk)
        .enumerate()
        .map(|(i, d)| PublishChunk {
            header: (i == 0).then(|| BlobHeader { name: name.into(), size, sha256: sha.into() }),
            data: d.to_vec().into(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_published_in_chunks_reaches_three_fetchers_byte_identical() {
    let f = fixture(None).await;
    let mut c = clients(&f, None).await;
    let data = blob(10 << 20 | 12345);
    let sha = hex(&Sha256::digest(&data));
    let info = c
        .weights
        .publish(tokio_stream::iter(chunks("model/init", &data, &sha, data.len() as u64, 1 << 20)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (info.name.as_str(), info.size, info.sha256.as_str()),
        ("model/init", data.len() as u64, sha.as_str())
    );
    let mut handles = Vec::new();
    for k in 0..3u32 {
        let mut c = clients(&f, None).await;
        handles.push(tokio::spawn(async move {
            let mut s = c
                .weights
                .fetch(FetchRequest { name: "model/init".into(), chunk_bytes: 300_000 + k })
                .await
                .unwrap()
                .into_inner();
            let mut got = Vec::new();
            let mut first = None;
            while let Some(chunk) = s.message().await.unwrap() {
                if first.is_none() {
                    first = chunk.info.clone();
                }
                got.extend_from_slice(&chunk.data);
            }
            (first, got)
        }));
    }
    for h in handles {
        let (first, got) = h.await.unwrap();
        assert_eq!(first.unwrap().sha256, sha);
        assert_eq!(hex(&Sha256::digest(&got)), sha);
        assert!(got == data);
    }
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_publishes_are_refused_and_leave_nothing_visible() {
    let f = fixture(None).await;
    let mut c = clients(&f, None).await;
    let data = blob(3 << 20);
    let sha = hex(&Sha256::digest(&data));
    // Wrong checksum.
    let wrong = hex(&Sha256::digest(b"something else"));
    let err = c
        .weights
        .publish(tokio_stream::iter(chunks("w", &data, &wrong, data.len() as u64, 1 << 20)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("sha256"), "{}", err.message());
    // A chunk past the declared size.
    let err = c
        .weights
        .publish(tokio_stream::iter(chunks("w", &data, &sha, (2 << 20) + 5, 1 << 20)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("chunk 2 goes past the declared header.size"), "{}", err.message());
    // Fewer bytes than declared.
    let err = c
        .weights
        .publish(tokio_stream::iter(chunks("w", &data, &sha, (4 << 20) as u64, 1 << 20)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let list = c.weights.list(ListBlobsRequest {}).await.unwrap().into_inner();
    assert!(list.blobs.is_empty(), "{list:?}");
    let err = c.weights.fetch(FetchRequest { name: "w".into(), chunk_bytes: 0 }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let files: Vec<_> = std::fs::read_dir(f._store.path().join("blobs")).unwrap().collect();
    assert!(files.is_empty(), "partial files left: {files:?}");
    f.server.shutdown().await;
}

fn points(run: &str, rank: i32, steps: std::ops::Range<i32>) -> Vec<MetricPoint> {
    steps
        .flat_map(|s| {
            [
                MetricPoint {
                    run_id: run.into(),
                    rank,
                    step: s as f64,
                    name: "loss".into(),
                    value: (s * 10 + rank) as f64,
                    wall_time_unix_ms: 0,
                },
                MetricPoint {
                    run_id: run.into(),
                    rank,
                    step: s as f64,
                    name: "lr".into(),
                    value: 0.5,
                    wall_time_unix_ms: 1,
                },
            ]
        })
        .collect()
}

#[allow(clippy::too_many_lines)] // tests are exempt: one scenario, read top to bottom
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_from_four_ranks_aggregate_as_sent_and_watchers_follow() {
    let f = fixture(None).await;
    let mut c = clients(&f, None).await;
    // The watch starts before any point exists; its response arrives with the first point.
    let mut wc = clients(&f, None).await;
    let watch_call = tokio::spawn(async move {
        wc.metrics.watch(WatchRequest { run_id: "m4".into(), name: "loss".into() }).await
    });
    for rank in 0..4 {
        let mut c = clients(&f, None).await;
        let batches = vec![
            PushRequest { points: points("m4", rank, 0..5) },
            PushRequest { points: points("m4", rank, 5..10) },
        ];
        let mut acks = c.metrics.push(tokio_stream::iter(batches)).await.unwrap().into_inner();
        let mut last = 0;
        while let Some(a) = acks.message().await.unwrap() {
            last = a.stored;
        }
        assert_eq!(last, 20);
    }
    let q = |agg: Aggregation| QueryRequest {
        run_id: "m4".into(),
        name: "loss".into(),
        aggregation: agg as i32,
        ..Default::default()
    };
    let mean = c.metrics.query(q(Aggregation::Mean)).await.unwrap().into_inner().points;
    assert_eq!(mean.len(), 10);
    for p in &mean {
        let s = p.step;
        assert_eq!((p.rank, p.count), (-1, 4));
        assert_eq!(p.value, s * 10.0 + 1.5);
    }
    for (agg, want) in
        [(Aggregation::Min, 0.0), (Aggregation::Max, 3.0), (Aggregation::Sum, 6.0), (Aggregation::Count, 4.0)]
    {
        for p in c.metrics.query(q(agg)).await.unwrap().into_inner().points {
            let expected = if agg == Aggregation::Sum {
                p.step * 40.0 + want
            } else if agg == Aggregation::Count {
                want
            } else {
                p.step * 10.0 + want
            };
            assert_eq!(p.value, expected, "{agg:?} at step {}", p.step);
        }
    }
    let raw = c.metrics.query(q(Aggregation::Raw)).await.unwrap().into_inner().points;
    assert_eq!(raw.len(), 40);
    let ranged = QueryRequest { min_step: Some(3.0), max_step: Some(4.0), ..q(Aggregation::Raw) };
    assert_eq!(c.metrics.query(ranged).await.unwrap().into_inner().points.len(), 8);
    // The watcher saw the 40 loss points, then sees a new one as it arrives.
    let mut watch = tokio::time::timeout(Duration::from_secs(10), watch_call)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .into_inner();
    let mut seen = 0;
    while seen < 40 {
        let p =
            tokio::time::timeout(Duration::from_secs(10), watch.message()).await.unwrap().unwrap().unwrap();
        assert_eq!(p.name, "loss");
        seen += 1;
    }
    let late = MetricPoint {
        run_id: "m4".into(),
        rank: 2,
        step: 99.0,
        name: "loss".into(),
        value: 7.0,
        wall_time_unix_ms: 0,
    };
    let mut acks = c
        .metrics
        .push(tokio_stream::iter(vec![PushRequest { points: vec![late] }]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(acks.message().await.unwrap().unwrap().stored, 1);
    let p = tokio::time::timeout(Duration::from_secs(3), watch.message())
        .await
        .expect("watch timed out")
        .unwrap()
        .unwrap();
    assert_eq!((p.step, p.value, p.rank), (99.0, 7.0, 2));
    let runs = c.metrics.list_runs(ListRunsRequest {}).await.unwrap().into_inner().runs;
    let m4 = runs.iter().find(|r| r.run_id == "m4").expect("run listed");
    assert_eq!((m4.state().word(), m4.points), ("metrics-only", 81));
    // Shutting down with a watcher still connected ends its stream.
    f.server.shutdown().await;
    let end = tokio::time::timeout(Duration::from_secs(10), watch.message()).await.expect("the stream ends");
    assert!(!matches!(end, Ok(Some(_))), "{end:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_calls_without_it_or_with_a_wrong_one_are_refused_and_write_nothing() {
    let f = fixture(Some("s3cret")).await;
    for token in [None, Some("wrong")] {
        let mut c = clients(&f, token).await;
        let err = c.rendezvous.join(join("t", 1, 0, 1000)).await.unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{token:?}");
        let err = c
            .metrics
            .push(tokio_stream::iter(vec![PushRequest { points: points("t", 0, 0..3) }]))
            .await
            .map(|_| ())
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
        let data = blob(1000);
        let sha = hex(&Sha256::digest(&data));
        let err =
            c.weights.publish(tokio_stream::iter(chunks("t", &data, &sha, 1000, 500))).await.unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
        let err = c.metrics.list_runs(ListRunsRequest {}).await.unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
        assert!(err.message().contains("token"), "{}", err.message());
    }
    let mut ok = clients(&f, Some("s3cret")).await;
    assert!(ok.metrics.list_runs(ListRunsRequest {}).await.unwrap().into_inner().runs.is_empty());
    assert!(ok.weights.list(ListBlobsRequest {}).await.unwrap().into_inner().blobs.is_empty());
    assert!(ok.rendezvous.join(join("t", 1, 0, 1000)).await.is_ok());
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_serving_and_reflection_lists_the_drove_services() {
    let f = fixture(Some("tok")).await;
    let channel = drove_control::endpoint(&f.addr, None).unwrap().connect().await.unwrap();
    // Health stays open (orchestrators probe it without a token).
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    for service in ["", "drove.v1.Rendezvous", "drove.v1.Weights", "drove.v1.Metrics"] {
        let r = health
            .check(tonic_health::pb::HealthCheckRequest { service: service.into() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.status(),
            tonic_health::pb::health_check_response::ServingStatus::Serving,
            "{service:?}"
        );
    }
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let token = drove_control::Token::new(Some("tok")).unwrap();
    let mut refl = ServerReflectionClient::with_interceptor(channel, token);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut resp = refl.server_reflection_info(tokio_stream::iter(vec![req])).await.unwrap().into_inner();
    let msg = resp.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = msg.message_response else { panic!("{msg:?}") };
    let names: BTreeSet<String> = list.service.into_iter().map(|s| s.name).collect();
    for s in ["drove.v1.Rendezvous", "drove.v1.Weights", "drove.v1.Metrics", "grpc.health.v1.Health"] {
        assert!(names.contains(s), "{s} missing from {names:?}");
    }
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_clients_that_trust_its_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (cert_path, key_path, ca_path) =
        (dir.path().join("c.pem"), dir.path().join("k.pem"), dir.path().join("ca.pem"));
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
    std::fs::write(&ca_path, cert.cert.pem()).unwrap();
    let config = drove_coordinator::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: dir.path().join("store"),
        tls_cert: Some(cert_path),
        tls_key: Some(key_path),
        ..Default::default()
    };
    let server = drove_coordinator::start(&config).await.unwrap();
    let url = format!("https://localhost:{}", server.addr().port());
    // Without a trusted CA the client refuses to start, saying how to fix it.
    let err = drove_control::endpoint(&url, None).unwrap_err().to_string();
    assert!(err.contains("DROVE_TLS_CA"), "{err}");
    let endpoint = drove_control::endpoint(&url, Some(&ca_path)).unwrap();
    let channel = endpoint.connect().await.unwrap();
    let mut metrics = drove_proto::v1::metrics_client::MetricsClient::new(channel);
    assert!(metrics.list_runs(ListRunsRequest {}).await.unwrap().into_inner().runs.is_empty());
    // A plain-text client cannot talk to it.
    let plain = format!("127.0.0.1:{}", server.addr().port());
    let refused = match Clients::connect(&plain, None).await {
        Err(_) => true,
        Ok(mut c) => c.metrics.list_runs(ListRunsRequest {}).await.is_err(),
    };
    assert!(refused);
    server.shutdown().await;
}

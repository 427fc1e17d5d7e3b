//! The real `drove-coordinator` process: killed with SIGKILL and restarted on the
//! same store, it still has every point it acknowledged, and an elastic run's
//! generations.
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use drove_control::Clients;
use std::time::Duration;

use drove_proto::v1::{
    Aggregation, Generation, GenerationState, GenerationsRequest, JoinRequest, MetricPoint, PushRequest,
    QueryRequest,
};

struct Coordinator(Child);

impl Drop for Coordinator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the binary on a free port and reads the address it prints.
fn start(store: &std::path::Path) -> (Coordinator, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_drove-coordinator"))
        .args(["--listen", "127.0.0.1:0", "--store"])
        .arg(store)
        .env_remove("DROVE_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting drove-coordinator");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("drove-coordinator listening on ")
        .unwrap_or_else(|| panic!("{line:?}"))
        .to_string();
    (Coordinator(child), addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_points_survive_sigkill_and_restart() {
    let store = tempfile::tempdir().unwrap();
    let (mut first, addr) = start(store.path());
    let mut c = Clients::connect(&addr, None).await.unwrap();
    let batches: Vec<PushRequest> = (0..20)
        .map(|b| PushRequest {
            points: (0..500)
                .map(|i| MetricPoint {
                    run_id: "durable".into(),
                    rank: i % 4,
                    step: (b * 125 + i / 4) as f64,
                    name: "loss".into(),
                    value: (b * 500 + i) as f64,
                    wall_time_unix_ms: 0,
                })
                .collect(),
        })
        .collect();
    let mut acks = c.metrics.push(tokio_stream::iter(batches)).await.unwrap().into_inner();
    let mut acked = 0;
    while let Some(a) = acks.message().await.unwrap() {
        acked = a.stored;
    }
    assert_eq!(acked, 10_000);
    // SIGKILL: no chance to flush anything.
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    let (_second, addr) = start(store.path());
    let mut c = Clients::connect(&addr, None).await.unwrap();
    let q =
        QueryRequest { run_id: "durable".into(), aggregation: Aggregation::Raw as i32, ..Default::default() };
    let points = c.metrics.query(q).await.unwrap().into_inner().points;
    assert_eq!(points.len(), 10_000);
    let mut values: Vec<i64> = points.iter().map(|p| p.value as i64).collect();
    values.sort_unstable();
    assert_eq!(values, (0..10_000).collect::<Vec<_>>());
}

/// A join of member `id` to the elastic run of exactly three members.
fn member(id: &str) -> JoinRequest {
    JoinRequest {
        run_id: "elastic".into(),
        member_id: id.into(),
        address: format!("{id}.local:29500"),
        host: "h".into(),
        min_size: 3,
        max_size: 3,
        timeout_ms: 30_000,
        ..Default::default()
    }
}

/// The run's generations; none while the coordinator does not know the run
/// yet (`NOT_FOUND`, before the first join arrived).
async fn generations(c: &mut Clients) -> Vec<Generation> {
    let req = GenerationsRequest { run_id: "elastic".into() };
    match c.rendezvous.generations(req).await {
        Ok(r) => r.into_inner().generations,
        Err(s) if s.code() == tonic::Code::NotFound => Vec::new(),
        Err(s) => panic!("Generations: {s}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_forming_at_sigkill_completes_after_the_restart() {
    let bound = Duration::from_secs(20);
    let store = tempfile::tempdir().unwrap();
    let (mut first, addr) = start(store.path());
    let mut waiting = Vec::new();
    for id in ["a", "b"] {
        let mut c = Clients::connect(&addr, None).await.unwrap();
        waiting.push(tokio::spawn(async move { c.rendezvous.join(member(id)).await }));
    }
    // Both admitted (visible in the listing only: their calls wait for c).
    let mut c = Clients::connect(&addr, None).await.unwrap();
    tokio::time::timeout(bound, async {
        while generations(&mut c).await.first().is_none_or(|g| g.members.len() < 2) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a and b admitted");
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    for call in waiting {
        assert!(call.await.unwrap().is_err(), "a call to the killed coordinator fails");
    }

    let (_second, addr) = start(store.path());
    let mut c = Clients::connect(&addr, None).await.unwrap();
    let resumed = generations(&mut c).await;
    assert_eq!(resumed.len(), 1);
    assert_eq!(resumed[0].state(), GenerationState::Forming);
    let mut ids: Vec<&str> = resumed[0].members.iter().map(|m| m.member_id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["a", "b"]);
    // a and b call Join again (the same ids and addresses: their own joins),
    // and c comes: the generation closes.
    let mut calls = Vec::new();
    for id in ["a", "b", "c"] {
        let mut c = Clients::connect(&addr, None).await.unwrap();
        calls.push(tokio::spawn(async move { c.rendezvous.join(member(id)).await }));
    }
    let mut answers = Vec::new();
    for call in calls {
        let answer = tokio::time::timeout(bound, call).await.expect("within the bound").unwrap();
        answers.push(answer.expect("the generation forms").into_inner());
    }
    for r in &answers {
        assert_eq!((r.generation, r.world_size, &r.peers), (1, 3, &answers[0].peers));
    }
    let formed = generations(&mut c).await;
    assert_eq!((formed.len(), formed[0].state(), formed[0].world_size), (1, GenerationState::Running, 3));
}

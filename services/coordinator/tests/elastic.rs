//! Elastic runs on the real server on loopback: generations form, re-form
//! without a lost member or with a newcomer, refuse a left-out member, and
//! are listed by the Generations RPC.
use std::future::Future;
use std::time::Duration;

use drove_control::Clients;
use drove_proto::v1::{
    EndKind, Generation, GenerationEnd, GenerationState, GenerationsRequest, HeartbeatRequest, JoinRequest,
    JoinResponse, LeaveRequest, ListRunsRequest,
};
use tonic::{Code, Status};

/// Every test's calls end within this (a hang fails instead of blocking).
const BOUND: Duration = Duration::from_secs(20);
const SETTLE_MS: i64 = 200;

struct Fixture {
    server: drove_coordinator::Server,
    addr: String,
    _store: tempfile::TempDir,
}

async fn fixture(heartbeat_timeout_ms: u64) -> Fixture {
    let store = tempfile::tempdir().unwrap();
    let config = drove_coordinator::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: store.path().to_path_buf(),
        heartbeat_timeout_ms,
        ..Default::default()
    };
    let server = drove_coordinator::start(&config).await.unwrap();
    let addr = server.addr().to_string();
    Fixture { server, addr, _store: store }
}

async fn clients(f: &Fixture) -> Clients {
    Clients::connect(&f.addr, None).await.unwrap()
}

/// `fut`, failing the test if it takes longer than [`BOUND`].
async fn bounded<T>(fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, fut).await.expect("the call ended within the bound")
}

/// A join of member `id` to elastic run `run` of `min..=max` members.
fn member(run: &str, id: &str, min: i32, max: i32) -> JoinRequest {
    JoinRequest {
        run_id: run.into(),
        address: format!("{id}.local:29500"),
        host: if id < "m" { "a".into() } else { "b".into() },
        requested_rank: -1,
        timeout_ms: 10_000,
        member_id: id.into(),
        min_size: min,
        max_size: max,
        settle_ms: SETTLE_MS,
        ..Default::default()
    }
}

/// The same member re-joining after generation `after` at `step`, for `cause`.
fn rejoin(req: JoinRequest, after: i64, step: i64, cause: &GenerationEnd) -> JoinRequest {
    JoinRequest { after_generation: after, step, cause: Some(cause.clone()), ..req }
}

fn end(kind: EndKind, members: &[&str]) -> GenerationEnd {
    GenerationEnd {
        kind: kind.into(),
        members: members.iter().map(|m| m.to_string()).collect(),
        detail: String::new(),
    }
}

async fn join(c: &Clients, req: JoinRequest) -> Result<JoinResponse, Status> {
    c.rendezvous.clone().join(req).await.map(tonic::Response::into_inner)
}

async fn generations(c: &Clients, run: &str) -> Result<Vec<Generation>, Status> {
    let req = GenerationsRequest { run_id: run.into() };
    c.rendezvous.clone().generations(req).await.map(|r| r.into_inner().generations)
}

/// Waits until the run's generations satisfy `ready` (a join admitted by
/// another task is only visible through the listing), asking every 20 ms.
async fn until(c: &Clients, run: &str, ready: impl Fn(&[Generation]) -> bool) -> Vec<Generation> {
    bounded(async {
        loop {
            if let Ok(gens) = generations(c, run).await
                && ready(&gens)
            {
                return gens;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

fn has_member(gens: &[Generation], number: i64, id: &str) -> bool {
    gens.iter().any(|g| g.number == number && g.members.iter().any(|m| m.member_id == id))
}

/// Member ids by rank.
fn by_rank(r: &JoinResponse) -> Vec<&str> {
    r.peers.iter().map(|p| p.member_id.as_str()).collect()
}

/// Generation 1 of `ids` (as many as `max`: it closes at once).
async fn generation_1(c: &Clients, run: &str, ids: &[&str], min: i32) -> Vec<JoinResponse> {
    let max = ids.len() as i32;
    let joins = ids.iter().map(|id| join(c, member(run, id, min, max)));
    let answers = bounded(futures::future::join_all(joins)).await;
    answers.into_iter().map(|a| a.expect("generation 1 forms")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_form_generation_1_at_max_with_one_peer_table() {
    let f = fixture(30_000).await;
    let c = clients(&f).await;
    let answers = generation_1(&c, "g1", &["a", "b", "c"], 1).await;
    let mut ranks: Vec<i32> = answers.iter().map(|r| r.rank).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1, 2]);
    for r in &answers {
        assert_eq!((r.generation, r.world_size, &r.peers), (1, 3, &answers[0].peers));
        assert_eq!(r.local_rank, r.peers[r.rank as usize].local_rank);
    }
    let mut ids = by_rank(&answers[0]);
    ids.sort_unstable();
    assert_eq!(ids, ["a", "b", "c"]);
    let gens = generations(&c, "g1").await.unwrap();
    assert_eq!(gens.len(), 1);
    assert_eq!((gens[0].number, gens[0].state(), gens[0].world_size), (1, GenerationState::Running, 3));
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survivors_of_a_lost_member_form_generation_2_ranked_by_their_old_ranks() {
    let f = fixture(30_000).await;
    let c = clients(&f).await;
    let answers = generation_1(&c, "lost", &["a", "b", "c"], 2).await;
    let order = by_rank(&answers[0]);
    let (first, lost, last) = (order[0], order[1], order[2]);
    let cause = GenerationEnd {
        detail: "peer closed the connection".into(),
        ..end(EndKind::ClosedConnection, &[lost])
    };
    let (x, y) = bounded(async {
        tokio::join!(
            join(&c, rejoin(member("lost", last, 2, 3), 1, 41, &cause)),
            join(&c, rejoin(member("lost", first, 2, 3), 1, 42, &cause)),
        )
    })
    .await;
    let (x, y) = (x.expect("generation 2 forms"), y.expect("generation 2 forms"));
    assert_eq!((x.generation, y.generation), (2, 2));
    assert_eq!(x.peers, y.peers);
    assert_eq!(by_rank(&x), [first, last], "ordered by their ranks in generation 1");
    assert_eq!((x.rank, y.rank), (1, 0));
    let gens = generations(&c, "lost").await.unwrap();
    assert_eq!(
        gens.iter().map(|g| (g.number, g.state())).collect::<Vec<_>>(),
        [(1, GenerationState::Ended), (2, GenerationState::Running)]
    );
    assert_eq!(gens[0].end.as_ref(), Some(&cause));
    assert_eq!((gens[0].last_step, gens[1].first_step), (42, 42));
    assert!(gens[0].ended_ms > 0 && gens[1].started_ms >= gens[0].ended_ms);
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_waits_while_generation_1_is_told_to_re_form_then_joins_last() {
    let f = fixture(30_000).await;
    let c = clients(&f).await;
    // min 2 of max 4: generation 1 closes once its settle time passes.
    let joins = ["a", "b"].map(|id| join(&c, member("grow", id, 2, 4)));
    let first: Vec<JoinResponse> =
        bounded(futures::future::join_all(joins)).await.into_iter().map(Result::unwrap).collect();
    assert_eq!(first[0].world_size, 2);
    let other = clients(&f).await;
    let newcomer = tokio::spawn(async move { join(&other, member("grow", "n", 2, 4)).await });
    until(&c, "grow", |gens| has_member(gens, 2, "n")).await;
    let beat = HeartbeatRequest {
        run_id: "grow".into(),
        member_id: "a".into(),
        generation: 1,
        ..Default::default()
    };
    let beat = c.rendezvous.clone().heartbeat(beat).await.unwrap().into_inner();
    assert_eq!((beat.generation, beat.reform), (2, true));
    assert_eq!(beat.reform_cause, Some(end(EndKind::MemberAdded, &["n"])));
    let cause = beat.reform_cause.unwrap();
    let old = by_rank(&first[0]);
    let (x, y, n) = bounded(async {
        tokio::join!(
            join(&c, rejoin(member("grow", old[1], 2, 4), 1, 7, &cause)),
            join(&c, rejoin(member("grow", old[0], 2, 4), 1, 7, &cause)),
            async { newcomer.await.unwrap() },
        )
    })
    .await;
    let (x, y, n) = (x.unwrap(), y.unwrap(), n.unwrap());
    assert_eq!(by_rank(&n), [old[0], old[1], "n"], "the old members by rank, the newcomer last");
    assert!(x.peers == n.peers && y.peers == n.peers && n.generation == 2 && n.rank == 2);
    let gens = generations(&c, "grow").await.unwrap();
    assert_eq!(gens[0].end.as_ref().map(|e| e.kind()), Some(EndKind::MemberAdded));
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_left_out_of_the_running_generation_is_refused() {
    let f = fixture(30_000).await;
    let c = clients(&f).await;
    let answers = generation_1(&c, "stale", &["a", "b", "c"], 2).await;
    assert_eq!(answers.len(), 3);
    let cause = end(EndKind::ClosedConnection, &["c"]);
    let (x, y) = bounded(async {
        tokio::join!(
            join(&c, rejoin(member("stale", "a", 2, 3), 1, 5, &cause)),
            join(&c, rejoin(member("stale", "b", 2, 3), 1, 5, &cause)),
        )
    })
    .await;
    assert_eq!((x.unwrap().generation, y.unwrap().world_size), (2, 2));
    let err = bounded(join(&c, rejoin(member("stale", "c", 2, 3), 1, 5, &end(EndKind::Unspecified, &[]))))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("member \"c\" was left out of run \"stale\": generation 2 formed without it"),
        "{}",
        err.message()
    );
    // Once the others finished the run, it is still left out (the id does not start over).
    for id in ["a", "b"] {
        let leave =
            LeaveRequest { run_id: "stale".into(), member_id: id.into(), step: 9, ..Default::default() };
        c.rendezvous.clone().leave(leave).await.unwrap();
    }
    let err = bounded(join(&c, rejoin(member("stale", "c", 2, 3), 1, 5, &end(EndKind::Unspecified, &[]))))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(err.message().contains("the run has finished without it"), "{}", err.message());
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_members_claiming_one_id_from_two_addresses_are_refused() {
    let f = fixture(30_000).await;
    let c = clients(&f).await;
    let other = clients(&f).await;
    let first = tokio::spawn(async move {
        join(&other, JoinRequest { timeout_ms: 1_000, ..member("twice", "a", 2, 3) }).await
    });
    until(&c, "twice", |gens| has_member(gens, 1, "a")).await;
    let other = JoinRequest { address: "elsewhere:29500".into(), ..member("twice", "a", 2, 3) };
    let err = bounded(join(&c, other)).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert!(
        err.message().contains("member \"a\" is already in generation 1 of run \"twice\" from a.local:29500"),
        "{}",
        err.message()
    );
    // The same member retrying from its own address is the same join.
    let retry = join(&c, JoinRequest { timeout_ms: 1_000, ..member("twice", "a", 2, 3) });
    let (first, retry) = bounded(async { tokio::join!(async { first.await.unwrap() }, retry) }).await;
    for err in [first.unwrap_err(), retry.unwrap_err()] {
        assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    }
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_min_a_join_times_out_naming_the_lost_members_and_the_min() {
    let f = fixture(30_000).await;
    let c = clients(&f).await;
    generation_1(&c, "few", &["a", "b", "c"], 2).await;
    let lone = JoinRequest { timeout_ms: 500, ..member("few", "a", 2, 3) };
    let err =
        bounded(join(&c, rejoin(lone, 1, 3, &end(EndKind::CollectiveDeadline, &[])))).await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);
    let m = err.message();
    assert!(m.contains("generation 2 did not form"), "{m}");
    assert!(m.contains("members [\"a\"] joined (min_size 2"), "{m}");
    let lost = m.split("lost: ").nth(1).unwrap_or_default();
    assert!(lost.contains("\"b\"") && lost.contains("\"c\"") && !lost.contains("\"a\""), "{m}");
    // It was withdrawn: generation 2 forms without members.
    let gens = generations(&c, "few").await.unwrap();
    assert_eq!((gens[1].state(), gens[1].members.len()), (GenerationState::Forming, 0));
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_elastic_joins_are_invalid_arguments_naming_the_field() {
    let f = fixture(30_000).await;
    let c = clients(&f).await;
    for (req, field) in [
        (member("bad", "a", 0, 3), "min_size"),
        (member("bad", "a", 3, 2), "min_size"),
        (member("bad", "a", 1, 70_000), "max_size"),
        (member("bad", "", 1, 2), "member_id"),
        (member("bad", &"m".repeat(129), 1, 2), "member_id"),
        (JoinRequest { after_generation: -1, ..member("bad", "a", 1, 2) }, "after_generation"),
        (JoinRequest { settle_ms: -1, ..member("bad", "a", 1, 2) }, "settle_ms"),
        (JoinRequest { step: -1, ..member("bad", "a", 1, 2) }, "step"),
        (JoinRequest { after_generation: 3, ..member("bad", "a", 1, 1) }, "after_generation"),
    ] {
        let err = bounded(join(&c, req)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(err.message().contains(field), "{field}: {}", err.message());
    }
    // One member of max 1: running at once. A fixed join cannot join it, nor
    // an elastic join with other sizes.
    bounded(join(&c, member("mixed", "a", 1, 1))).await.unwrap();
    let fixed =
        JoinRequest { run_id: "mixed".into(), world_size: 2, address: "x:1".into(), ..Default::default() };
    let err = bounded(join(&c, fixed)).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("run \"mixed\" is elastic (min_size 1, max_size 1)"), "{}", err.message());
    let err = bounded(join(&c, member("mixed", "b", 1, 2))).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("min_size 1, max_size 2") && err.message().contains("max_size 1"),
        "{}",
        err.message()
    );
    // And an elastic join cannot join a fixed world.
    let fixed =
        JoinRequest { run_id: "fixed".into(), world_size: 1, address: "x:1".into(), ..Default::default() };
    bounded(join(&c, fixed)).await.unwrap();
    let err = bounded(join(&c, member("fixed", "a", 1, 2))).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("run \"fixed\" is a fixed world of 1 workers"), "{}", err.message());
    assert_eq!(generations(&c, "fixed").await.unwrap(), [], "a fixed world has no generations");
    assert_eq!(generations(&c, "nowhere").await.unwrap_err().code(), Code::NotFound);
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_member_does_not_fail_the_run_the_others_are_told_to_re_form() {
    let f = fixture(1_000).await;
    let c = clients(&f).await;
    generation_1(&c, "quiet", &["a", "b", "c"], 2).await;
    let beat = |id: &str| HeartbeatRequest {
        run_id: "quiet".into(),
        member_id: id.into(),
        generation: 1,
        ..Default::default()
    };
    c.rendezvous.clone().heartbeat(beat("c")).await.unwrap();
    // a and b keep beating (as their heartbeat threads do) until told to re-form; c fell silent.
    let told = bounded(async {
        loop {
            let b = c.rendezvous.clone().heartbeat(beat("b")).await.unwrap().into_inner();
            let a = c.rendezvous.clone().heartbeat(beat("a")).await.unwrap().into_inner();
            if a.reform {
                return a;
            }
            assert!(!b.reform || b.reform_cause.is_some());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(told.reform_cause, Some(end(EndKind::Heartbeat, &["c"])));
    assert_eq!(told.generation, 2);
    assert_ne!(told.state(), drove_proto::v1::RunState::Failed);
    assert!(told.error.is_empty(), "{}", told.error);
    let cause = told.reform_cause.unwrap();
    let (x, y) = bounded(async {
        tokio::join!(
            join(&c, rejoin(member("quiet", "a", 2, 3), 1, 9, &cause)),
            join(&c, rejoin(member("quiet", "b", 2, 3), 1, 9, &cause)),
        )
    })
    .await;
    assert_eq!((x.unwrap().world_size, y.unwrap().generation), (2, 2), "c was named lost: not waited for");
    f.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_leaving_finishes_the_generation_and_the_run() {
    let f = fixture(30_000).await;
    let c = clients(&f).await;
    generation_1(&c, "done", &["a", "b"], 1).await;
    for (id, step) in [("a", 99), ("b", 100)] {
        let leave = LeaveRequest { run_id: "done".into(), member_id: id.into(), step, ..Default::default() };
        c.rendezvous.clone().leave(leave).await.unwrap();
    }
    let gens = generations(&c, "done").await.unwrap();
    assert_eq!((gens[0].state(), gens[0].last_step), (GenerationState::Ended, 100));
    assert_eq!(gens[0].end.as_ref().map(|e| e.kind()), Some(EndKind::Finished));
    let runs = c.metrics.clone().list_runs(ListRunsRequest {}).await.unwrap().into_inner().runs;
    let run = runs.iter().find(|r| r.run_id == "done").unwrap();
    assert_eq!((run.state().word(), run.world_size), ("finished", 2));
    // An error fails the run: its generation ends failed with the detail.
    generation_1(&c, "oom", &["a", "b"], 1).await;
    let leave = LeaveRequest {
        run_id: "oom".into(),
        member_id: "b".into(),
        error: "out of memory".into(),
        ..Default::default()
    };
    c.rendezvous.clone().leave(leave).await.unwrap();
    let gens = generations(&c, "oom").await.unwrap();
    assert_eq!(
        gens[0].end.as_ref().map(|e| (e.kind(), e.detail.as_str())),
        Some((EndKind::Failed, "out of memory"))
    );
    let beat = HeartbeatRequest { run_id: "oom".into(), observer: true, ..Default::default() };
    let beat = c.rendezvous.clone().heartbeat(beat).await.unwrap().into_inner();
    assert_eq!((beat.state(), beat.error.as_str()), (drove_proto::v1::RunState::Failed, "out of memory"));
    f.server.shutdown().await;
}

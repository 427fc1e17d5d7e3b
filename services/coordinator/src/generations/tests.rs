use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use drove_proto::v1;

use super::machine::natural_order;
use super::*;
use crate::run_state::RunState;

const SETTLE: Duration = Duration::from_millis(200);

fn join(member: &str, after: i64) -> MemberJoin {
    MemberJoin {
        member_id: member.into(),
        address: format!("{member}:1"),
        host: "h".into(),
        min: 2,
        max: 3,
        after,
        settle: SETTLE,
        step: 0,
        cause: GenerationEnding::of(v1::EndKind::Unspecified, &[]),
    }
}

fn rejoin(member: &str, after: i64, step: i64, cause: GenerationEnding) -> MemberJoin {
    MemberJoin { step, cause, ..join(member, after) }
}

/// Generation 1 of `members` (2 or 3), running, ranks in member id order.
fn running(members: &[&str], t0: Instant) -> Generations {
    let mut run = Generations::new("r", 2, 3);
    for m in members {
        assert_eq!(run.join(&join(m, 0), t0, 1), Ok(1));
    }
    assert!(run.try_close(t0 + SETTLE, 2), "closes at max or once settled");
    assert_eq!(run.generation(1).unwrap().state, GenerationState::Running);
    run
}

fn ranks(run: &Generations, number: i64) -> Vec<(String, Option<usize>)> {
    run.generation(number).unwrap().members.iter().map(|m| (m.member_id.clone(), m.rank)).collect()
}

#[test]
fn the_stored_words_stay_and_a_bad_one_is_named_with_the_three_it_could_be() {
    // A store written before the words moved to drove-proto must still load.
    assert_eq!(GenerationState::ALL.map(GenerationState::as_str), ["forming", "running", "ended"]);
    let err = "paused".parse::<GenerationState>().unwrap_err();
    assert_eq!(err.value, "paused");
    assert_eq!(err.to_string(), "\"paused\" is not a generation state (forming, running or ended)");
}

#[test]
fn a_state_reads_back_from_its_word() {
    for s in GenerationState::ALL {
        assert_eq!(s.as_str().parse(), Ok(s));
    }
    let err = "paused".parse::<GenerationState>().unwrap_err();
    assert!(err.to_string().contains("\"paused\" is not a generation state"), "{err}");
}

#[test]
fn generation_1_closes_at_max_at_once_and_below_max_only_once_settled() {
    let t0 = Instant::now();
    let mut run = Generations::new("r", 2, 3);
    run.join(&join("a", 0), t0, 1).unwrap();
    assert!(!run.try_close(t0 + SETTLE * 10, 1), "below min: never");
    assert_eq!(run.settle_deadline(), None);
    run.join(&join("b", 0), t0, 1).unwrap();
    assert_eq!(run.settle_deadline(), Some(t0 + SETTLE));
    assert!(!run.try_close(t0, 1), "min, but not settled");
    run.join(&join("c", 0), t0, 1).unwrap();
    assert!(run.try_close(t0, 1), "max: at once");
    assert_eq!(ranks(&run, 1), [("a".into(), Some(0)), ("b".into(), Some(1)), ("c".into(), Some(2))]);
    assert_eq!(run.run_state(), RunState::Running);
    let (rank, peers) = run.world_of(1, "b").unwrap();
    assert_eq!((rank, peers.len(), peers[2].member_id.as_str()), (1, 3, "c"));
    assert_eq!(peers.iter().map(|p| p.local_rank).collect::<Vec<_>>(), [0, 1, 2]);
}

#[test]
fn a_retry_is_idempotent_and_another_address_for_one_id_is_refused() {
    let t0 = Instant::now();
    let mut run = Generations::new("r", 2, 3);
    assert_eq!(run.join(&join("a", 0), t0, 1), Ok(1));
    assert_eq!(run.join(&join("a", 0), t0, 1), Ok(1));
    assert_eq!(run.generation(1).unwrap().world_size(), 1);
    let other = MemberJoin { address: "elsewhere:2".into(), ..join("a", 0) };
    let err = run.join(&other, t0, 1).unwrap_err();
    assert_eq!(err.code(), tonic::Code::AlreadyExists);
    assert!(err.to_string().contains("already in generation 1 of run \"r\" from a:1"), "{err}");
}

#[test]
fn a_full_forming_generation_and_disagreeing_sizes_are_refused() {
    let t0 = Instant::now();
    let mut run = Generations::new("r", 2, 3);
    for m in ["a", "b", "c"] {
        run.join(&join(m, 0), t0, 1).unwrap();
    }
    let err = run.join(&join("d", 0), t0, 1).unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert!(err.to_string().contains("max_size 3"), "{err}");
    let err = run.join(&MemberJoin { min: 1, ..join("d", 0) }, t0, 1).unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.to_string().contains("min_size 1, max_size 3") && err.to_string().contains("min_size 2"),
        "{err}"
    );
    let err = run.join(&join("d", 4), t0, 1).unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.to_string().contains("after_generation 4"), "{err}");
}

#[test]
fn survivors_re_form_at_once_when_every_member_not_lost_is_back() {
    let t0 = Instant::now();
    let mut run = running(&["a", "b", "c"], t0);
    let lost = GenerationEnding {
        detail: "peer closed".into(),
        ..GenerationEnding::of(v1::EndKind::ClosedConnection, &["b"])
    };
    assert_eq!(run.join(&rejoin("c", 1, 7, lost.clone()), t0, 5), Ok(2));
    let g1 = run.generation(1).unwrap();
    assert_eq!((g1.state, g1.end.as_ref(), g1.ended_ms), (GenerationState::Ended, Some(&lost), 5));
    assert!(g1.lost.contains("b"));
    assert!(!run.try_close(t0, 6), "one of min 2");
    assert_eq!(run.join(&rejoin("a", 1, 8, lost), t0, 6), Ok(2));
    assert!(run.try_close(t0, 7), "a and c are back; b was named lost");
    assert_eq!(ranks(&run, 2), [("a".into(), Some(0)), ("c".into(), Some(1))], "by their old ranks");
    assert_eq!(run.generation(1).unwrap().last_step, 8);
    assert_eq!(run.generation(2).unwrap().first_step, 8);
    assert_eq!(run.run_state(), RunState::Running);
    // Generation 1 changed, then 2 was opened and closed: both to store.
    let changed: Vec<i64> = run.take_changed().iter().map(|g| g.number).collect();
    assert_eq!(changed, [1, 2]);
    assert!(run.take_changed().is_empty());
}

#[test]
fn without_a_loss_named_the_forming_generation_waits_for_the_settle_time() {
    let t0 = Instant::now();
    let mut run = running(&["a", "b", "c"], t0);
    let deadline = GenerationEnding::of(v1::EndKind::CollectiveDeadline, &[]);
    let t1 = t0 + Duration::from_secs(1);
    run.join(&rejoin("a", 1, 3, deadline.clone()), t1, 5).unwrap();
    run.join(&rejoin("c", 1, 3, deadline), t1, 5).unwrap();
    assert!(!run.try_close(t1, 6), "b may still come");
    assert_eq!(run.settle_deadline(), Some(t1 + SETTLE));
    assert!(run.try_close(t1 + SETTLE, 6));
    assert_eq!(ranks(&run, 2), [("a".into(), Some(0)), ("c".into(), Some(1))]);
}

#[test]
fn a_newcomer_waits_for_the_running_generation_whose_members_are_told_to_re_form() {
    let t0 = Instant::now();
    let mut run = running(&["a", "b"], t0);
    assert_eq!(run.join(&join("n", 0), t0, 3), Ok(2));
    assert!(!run.try_close(t0 + SETTLE * 10, 3), "generation 1 still runs");
    assert_eq!(run.settle_deadline(), None);
    let beat = run.heartbeat("a", 1, t0).unwrap();
    assert_eq!(
        beat,
        Heard {
            newest: 2,
            reform: true,
            cause: Some(GenerationEnding::of(v1::EndKind::MemberAdded, &["n"]))
        }
    );
    let added = GenerationEnding::of(v1::EndKind::MemberAdded, &["n"]);
    run.join(&rejoin("b", 1, 4, added.clone()), t0, 4).unwrap();
    assert!(!run.try_close(t0, 4), "a is not back");
    run.join(&rejoin("a", 1, 4, added.clone()), t0, 4).unwrap();
    assert!(run.try_close(t0, 5));
    assert_eq!(ranks(&run, 2), [("a".into(), Some(0)), ("b".into(), Some(1)), ("n".into(), Some(2))]);
    assert_eq!(run.generation(1).unwrap().end, Some(added));
    let beat = run.heartbeat("a", 2, t0).unwrap();
    assert_eq!(beat, Heard { newest: 2, reform: false, cause: None });
}

#[test]
fn a_member_the_world_re_formed_without_was_left_out() {
    let t0 = Instant::now();
    let mut run = running(&["a", "b", "c"], t0);
    let lost = GenerationEnding::of(v1::EndKind::ClosedConnection, &["c"]);
    run.join(&rejoin("a", 1, 1, lost.clone()), t0, 2).unwrap();
    run.join(&rejoin("b", 1, 1, lost), t0, 2).unwrap();
    assert!(run.try_close(t0, 3));
    let err =
        run.join(&rejoin("c", 1, 1, GenerationEnding::of(v1::EndKind::Unspecified, &[])), t0, 4).unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        err.to_string(),
        "member \"c\" was left out of run \"r\": generation 2 formed without it (it was last in generation 1)"
    );
    // As a new member (after_generation 0) it is a newcomer of generation 3.
    assert_eq!(run.join(&join("c", 0), t0, 5), Ok(3));
}

#[test]
fn a_withdrawn_join_gives_its_place_back_and_the_shortfall_names_the_lost() {
    let t0 = Instant::now();
    let mut run = running(&["a", "b", "c"], t0);
    run.join(&rejoin("a", 1, 1, GenerationEnding::of(v1::EndKind::CollectiveDeadline, &[])), t0, 2).unwrap();
    let why = run.shortfall(2);
    assert!(why.contains("[\"a\"] joined (min_size 2") && why.contains("lost: [\"b\", \"c\"]"), "{why}");
    assert!(!run.withdraw(2, "a", "other:1"), "another address's join is not this one");
    assert!(run.withdraw(2, "a", "a:1"));
    assert_eq!(run.forming().unwrap().world_size(), 0);
}

#[test]
fn a_silent_member_is_named_lost_once_and_the_others_re_form() {
    let t0 = Instant::now();
    let mut run = running(&["a", "b", "c"], t0);
    let timeout = Duration::from_secs(1);
    for m in ["a", "b", "c"] {
        run.heartbeat(m, 1, t0).unwrap();
    }
    let later = t0 + timeout;
    run.heartbeat("a", 1, later).unwrap();
    run.heartbeat("c", 1, later).unwrap();
    assert_eq!(run.lose_silent(timeout, later), ["b"]);
    assert!(run.lose_silent(timeout, later).is_empty(), "once");
    assert_eq!(run.run_state(), RunState::Rendezvous, "generation 2 forms");
    let beat = run.heartbeat("a", 1, later).unwrap();
    assert_eq!(
        beat,
        Heard { newest: 2, reform: true, cause: Some(GenerationEnding::of(v1::EndKind::Heartbeat, &["b"])) }
    );
    let cause = beat.cause.unwrap();
    run.join(&rejoin("a", 1, 9, cause.clone()), later, 3).unwrap();
    run.join(&rejoin("c", 1, 9, cause), later, 3).unwrap();
    assert!(run.try_close(later, 4), "b was named lost");
    assert_eq!(run.generation(2).unwrap().world_size(), 2);
}

#[test]
fn leaving_finishes_the_run_once_every_member_left_and_an_error_fails_it() {
    let t0 = Instant::now();
    let mut run = running(&["a", "b"], t0);
    run.leave("a", 10, "", 5).unwrap();
    assert_eq!(run.outcome(), None);
    run.leave("b", 12, "", 6).unwrap();
    assert_eq!(run.outcome(), Some(RunState::Finished));
    let g1 = run.generation(1).unwrap();
    assert_eq!(
        (g1.last_step, g1.ended_ms, g1.end.as_ref().map(|e| e.kind)),
        (12, 6, Some(v1::EndKind::Finished))
    );

    let mut run = running(&["a", "b"], t0);
    run.join(&join("n", 0), t0, 3).unwrap();
    run.leave("b", 4, "out of memory", 7).unwrap();
    assert_eq!(run.outcome(), Some(RunState::Failed));
    for g in &run.generations {
        assert_eq!(g.state, GenerationState::Ended, "generation {}", g.number);
        assert_eq!(g.end.as_ref().unwrap().detail, "out of memory");
    }
    let err = run.leave("z", 1, "", 8).unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(err.to_string().contains("member \"z\" is in no generation of run \"r\""), "{err}");
}

#[test]
fn a_resumed_forming_generation_settles_from_the_resume() {
    let t0 = Instant::now();
    let mut run = Generations::new("r", 2, 3);
    run.join(&join("a", 0), t0, 1).unwrap();
    run.join(&join("b", 0), t0, 1).unwrap();
    let t1 = t0 + Duration::from_secs(60);
    let mut resumed = Generations::resume("r", 2, 3, run.generations.clone(), t1);
    assert_eq!(resumed.join(&join("a", 0), t1, 2), Ok(1), "a retry after the restart");
    assert!(!resumed.try_close(t1, 2));
    assert!(resumed.try_close(t1 + SETTLE, 2));
}

#[test]
fn a_retry_after_its_generation_closed_is_answered_but_a_member_that_ran_re_forms() {
    let t0 = Instant::now();
    let mut run = running(&["a", "b", "c"], t0);
    assert_eq!(run.join(&join("a", 0), t0, 3), Ok(1), "a retry: no heartbeat in generation 1 yet");
    assert_eq!(run.generation(1).unwrap().state, GenerationState::Running);
    assert!(run.world_of(1, "a").is_some());
    let moved = MemberJoin { address: "a:2".into(), ..join("a", 0) };
    // c still waits for its answer (a coordinator restart cut its call) and
    // beats for the generation before: its retry is still a retry.
    run.heartbeat("c", 0, t0).unwrap();
    assert_eq!(run.join(&join("c", 0), t0, 3), Ok(1), "a beat for an older generation: still a retry");
    assert_eq!(run.generation(1).unwrap().state, GenerationState::Running);
    run.heartbeat("b", 1, t0).unwrap();
    assert_eq!(run.join(&join("b", 0), t0, 3), Ok(2), "b ran in generation 1: it was restarted");
    assert_eq!(run.generation(1).unwrap().state, GenerationState::Ended);
    assert_eq!(run.join(&moved, t0, 3), Ok(2), "from another address: not a retry");
}

#[test]
fn newcomers_take_ranks_by_member_id_in_natural_order_whichever_joined_first() {
    let t0 = Instant::now();
    let mut run = Generations::new("r", 2, 3);
    for m in ["h.7.slot-10", "h.7.slot-2", "h.7.slot-1"] {
        run.join(&join(m, 0), t0, 1).unwrap();
    }
    assert!(run.try_close(t0, 1));
    let ids: Vec<_> = ranks(&run, 1).into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids, ["h.7.slot-1", "h.7.slot-2", "h.7.slot-10"]);
    assert_eq!(natural_order("pod-007", "pod-7"), std::cmp::Ordering::Less, "equal values: by bytes");
    assert_eq!(natural_order("pod-9", "pod-10"), std::cmp::Ordering::Less);
    assert_eq!(natural_order("b", "a10"), std::cmp::Ordering::Greater);
}

#[test]
fn a_member_lost_three_generations_in_a_row_is_left_out_and_named() {
    let t0 = Instant::now();
    let mut run = running(&["a", "b", "c"], t0);
    let lose_b = |run: &mut Generations, g: i64| {
        let lost = GenerationEnding::of(v1::EndKind::ClosedConnection, &["b"]);
        run.join(&rejoin("a", g, 1, lost.clone()), t0, 1).unwrap();
        run.join(&rejoin("c", g, 1, lost), t0, 1).unwrap();
        assert!(run.try_close(t0, 1), "a and c re-form without b after generation {g}");
    };
    let b_returns = |run: &mut Generations, g: i64| -> Result<i64, GenerationError> {
        let added = run.join(&join("b", 0), t0, 1)?;
        let cause = GenerationEnding::of(v1::EndKind::MemberAdded, &["b"]);
        run.join(&rejoin("a", g, 2, cause.clone()), t0, 1).unwrap();
        run.join(&rejoin("c", g, 2, cause), t0, 1).unwrap();
        assert!(run.try_close(t0, 1), "max: b back at once");
        Ok(added)
    };
    lose_b(&mut run, 1); // generation 2: a, c
    assert_eq!(b_returns(&mut run, 2), Ok(3));
    lose_b(&mut run, 3); // generation 4
    assert_eq!(run.lost_in_a_row("b"), [1, 3], "generation 2 was without b: the row goes on");
    assert_eq!(b_returns(&mut run, 4), Ok(5));
    lose_b(&mut run, 5); // generation 6
    let err = run.join(&join("b", 0), t0, 1).unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        err.to_string(),
        "member \"b\" is left out of run \"r\": it was lost in 3 of its generations in a row ([1, 3, 5]), and a member lost 3 times in a row does not join again"
    );
    assert!(run.lost_in_a_row("a").is_empty(), "a was in every generation, never lost");
    assert_eq!(run.running().map(|g| g.number), Some(6), "the others' world runs on");
}

#[test]
fn a_generation_a_member_ends_without_being_lost_breaks_its_row() {
    let t0 = Instant::now();
    let mut run = running(&["a", "b", "c"], t0);
    let lost = GenerationEnding::of(v1::EndKind::ClosedConnection, &["b"]);
    run.join(&rejoin("a", 1, 1, lost.clone()), t0, 1).unwrap();
    run.join(&rejoin("c", 1, 1, lost), t0, 1).unwrap();
    assert!(run.try_close(t0, 1));
    run.join(&join("b", 0), t0, 1).unwrap();
    let added = GenerationEnding::of(v1::EndKind::MemberAdded, &["b"]);
    run.join(&rejoin("a", 2, 2, added.clone()), t0, 1).unwrap();
    run.join(&rejoin("c", 2, 2, added), t0, 1).unwrap();
    assert!(run.try_close(t0, 1));
    assert_eq!(run.lost_in_a_row("b"), [1]);
    // Generation 3 ends by a's loss: b was in it and not lost.
    let lose_a = GenerationEnding::of(v1::EndKind::ClosedConnection, &["a"]);
    run.join(&rejoin("b", 3, 3, lose_a.clone()), t0, 1).unwrap();
    run.join(&rejoin("c", 3, 3, lose_a), t0, 1).unwrap();
    assert!(run.lost_in_a_row("b").is_empty(), "{:?}", run.lost_in_a_row("b"));
    assert_eq!(run.lost_in_a_row("a"), [3]);
}

#[test]
fn a_survivor_named_lost_by_another_that_re_joins_is_not_lost() {
    let t0 = Instant::now();
    let mut run = running(&["a", "b", "c"], t0);
    // c is gone; a re-joins first, dropping its connections, so b sees a
    // closed connection from a and names it.
    let c_lost = GenerationEnding::of(v1::EndKind::ClosedConnection, &["c"]);
    run.join(&rejoin("a", 1, 5, c_lost.clone()), t0, 1).unwrap();
    run.join(&rejoin("b", 1, 5, GenerationEnding::of(v1::EndKind::ClosedConnection, &["a"])), t0, 1).unwrap();
    assert!(run.try_close(t0, 1), "a and b back, c lost");
    assert_eq!(run.generation(1).unwrap().lost, BTreeSet::from(["c".to_string()]));
    assert!(run.lost_in_a_row("a").is_empty());
    // Named before it re-joins: back all the same.
    let mut run = running(&["a", "b", "c"], t0);
    run.join(&rejoin("b", 1, 5, GenerationEnding::of(v1::EndKind::ClosedConnection, &["a"])), t0, 1).unwrap();
    run.join(&rejoin("a", 1, 5, c_lost), t0, 1).unwrap();
    assert_eq!(run.generation(1).unwrap().lost, BTreeSet::from(["c".to_string()]));
}

/// The store reads back what the machine made (the data is the store's; the
/// transitions are the machine's).
#[test]
fn generations_read_back_as_stored_and_start_over_with_their_run() {
    use v1::EndKind;
    let dir = tempfile::tempdir().unwrap();
    let store = crate::store::Store::open(dir.path()).unwrap();
    assert_eq!(store.generations("e").unwrap(), None);
    let t0 = std::time::Instant::now();
    let mut run = Generations::new("e", 1, 2);
    let join = |id: &str, after: i64, cause: GenerationEnding| MemberJoin {
        member_id: id.into(),
        address: format!("{id}:1"),
        host: "h".into(),
        min: 1,
        max: 2,
        after,
        settle: std::time::Duration::from_millis(5),
        step: 3,
        cause,
    };
    let none = GenerationEnding::of(EndKind::Unspecified, &[]);
    run.join(&join("a", 0, none.clone()), t0, 1).unwrap();
    run.join(&join("b", 0, none), t0, 1).unwrap();
    assert!(run.try_close(t0, 2));
    let lost = GenerationEnding {
        detail: "closed".into(),
        ..GenerationEnding::of(EndKind::ClosedConnection, &["b"])
    };
    run.join(&join("a", 1, lost), t0, 3).unwrap();
    for g in run.take_changed() {
        store.put_generation("e", 1, 2, g).unwrap();
    }
    let (min, max, stored) = store.generations("e").unwrap().unwrap();
    assert_eq!((min, max, stored.len()), (1, 2, 2));
    for (got, want) in stored.iter().zip(&run.generations) {
        assert_eq!(&Generation { last_join: want.last_join, ..got.clone() }, want);
    }
    assert!(store.has_run("e").is_ok_and(|has| !has), "no runs row was written here");
    store.remove_generations("e").unwrap();
    assert_eq!(store.generations("e").unwrap(), None);
}

//! The notes of a 2-rank run with 2 loader workers each, as the watcher sends
//! them: first the story (PyTorch seeds worker k from a base seed drawn from
//! torch's generator, seeded 42 on every rank), then the fix (each worker
//! seeded from its rank), compared as `drove run` compares them.
//!
//! ```sh
//! cargo run -p drove-watch --example compare
//! ```

use drove_watch::{Note, NoteComparer};

fn notes(fingerprint: impl Fn(usize, u32) -> String) -> Vec<Note> {
    let mut out = Vec::new();
    for rank in 0..2 {
        for worker in 0..2u32 {
            let fp = fingerprint(rank, worker);
            let streams = format!(
                r#"{{"t":"streams","rank":{rank},"loader":0,"epoch":0,"worker":{worker},"fp":{{"random":"{fp}","torch":"{fp}"}}}}"#
            );
            let drawn = format!(
                r#"{{"t":"drawn","rank":{rank},"loader":0,"epoch":0,"worker":{worker},"streams":["random"]}}"#
            );
            out.push(Note::parse(streams.as_bytes()).expect("a streams note"));
            out.push(Note::parse(drawn.as_bytes()).expect("a drawn note"));
        }
    }
    out
}

fn show(title: &str, notes: Vec<Note>) {
    println!("{title}:");
    let mut comparer = NoteComparer::new(2);
    let mut alarms = 0;
    for note in notes {
        for (finding, fix) in comparer.add(note).alarms {
            alarms += 1;
            println!("  diversity alarm: {finding}\n    fix: {fix}");
        }
    }
    for warning in comparer.warnings() {
        println!("  warning: {warning}");
    }
    if alarms == 0 {
        println!("  no alarm");
    }
}

fn main() {
    show("every rank seeded 42, workers seeded by PyTorch", notes(|_, worker| format!("base42+{worker}")));
    show("each worker seeded from its rank", notes(|rank, worker| format!("rank{rank}-worker{worker}")));
}

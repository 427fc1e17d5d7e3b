//! A small token classifier of its own, on made-up data, trained through
//! `drove_train::Replica` in a world of one (`SingleProcess`). With ranks of
//! their own (`DROVE_RANK`, `DROVE_WORLD_SIZE` and `DROVE_PEERS` or
//! `DROVE_RENDEZVOUS_DIR`), swap in `drove_launch::connect_from_env()?`
//! and nothing else changes: each rank passes its own rows.
//!
//! ```text
//! cargo run --release -p drove-train --example replica [-- backend]
//! ```
use burn::backend::{Autodiff, Flex};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::{Int, Tensor, TensorData};
use drove_collective::SingleProcess;
use drove_train::{Placement, Replica, ReplicaOptions, Schedule};

type B = Autodiff<Flex>;
const SEQ: usize = 12;
const LABELS: usize = 5;

#[path = "support/tagger.rs"]
mod tagger;
use tagger::Tagger;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let placement: Placement = std::env::args().nth(1).as_deref().unwrap_or("host").parse()?;
    let device = Default::default();
    let model = Tagger::<B>::new(50, 16, LABELS, &device);
    let options = ReplicaOptions {
        lr: 1e-3,
        schedule: Schedule::warmup_linear(0.1, 30),
        clip_norm: 1.0,
        placement,
        ..ReplicaOptions::default()
    };
    let mut replica = Replica::new(model, &SingleProcess, options, &device)?;
    // 16 rows of ids; each token's label is a function of its id.
    let ids: Vec<i64> = (0..16 * SEQ).map(|i| 1 + (i as i64 * 7) % 49).collect();
    let labels: Vec<i64> = ids.iter().map(|&t| t % LABELS as i64).collect();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    for step in 0..30 {
        let outcome = replica.step(&vec![(); 16], |model, micro| {
            let (r, n) = (micro.rows.clone(), micro.rows.len());
            let x = Tensor::<B, 2, Int>::from_data(
                TensorData::new(ids[r.start * SEQ..r.end * SEQ].to_vec(), [n, SEQ]),
                &device,
            );
            let y = Tensor::<B, 1, Int>::from_data(
                TensorData::new(labels[r.start * SEQ..r.end * SEQ].to_vec(), [n * SEQ]),
                &device,
            );
            let logits = model.forward(x);
            loss_fn.forward(logits.reshape([n * SEQ, LABELS]), y)
        })?;
        if step % 5 == 0 || step == 29 {
            println!(
                "step {step:2}: loss {:.4}, gradient norm {:.3}, lr {:.2e} ({placement} placement, {} micro-batches took {:?})",
                outcome.local_loss,
                outcome.grad_norm.unwrap_or(0.0),
                outcome.lr.unwrap_or(0.0),
                drove_train::micro::MicroBatches::resolve(0, 16),
                outcome.times.compute,
            );
        }
    }
    Ok(())
}

//! Counts the reads and uploads of a small computation on the CPU backend.
//!
//! `cargo run -p drove-kernels --example transfers`

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use drove_kernels::transfer;

fn main() {
    let device = Default::default();
    let before = transfer::transfers();
    let x: Tensor<Flex, 2> = transfer::upload(TensorData::new(vec![0.5f32; 12], [3, 4]), &device);
    let loss = transfer::read_scalar((x.clone() * x).sum());
    let counted = transfer::transfers() - before;
    println!("loss {loss}: {} read(s), {} upload(s)", counted.reads, counted.uploads);
}

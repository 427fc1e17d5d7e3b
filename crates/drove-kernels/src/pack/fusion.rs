//! [`PackBackend`] under burn's fusion: a custom operation of the fusion
//! stream with the parts as its inputs and the packed buffer as its one
//! output (as dropout's `fusion.rs`), which runs the inner backend's pack
//! when the stream executes, so nothing is flushed or read.

use std::marker::PhantomData;

use burn::tensor::ops::FloatTensor;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use super::PackBackend;

/// The operation the fusion stream executes: the inner backend's pack.
#[derive(Debug)]
struct Pack<B> {
    desc: CustomOpIr,
    backend: PhantomData<fn() -> B>,
}

impl<B: FusionBackend + PackBackend> Operation<B::FusionRuntime> for Pack<B> {
    fn execute(&self, handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>) {
        let parts = self.desc.inputs.iter().map(|part| handles.get_float_tensor::<B>(part)).collect();
        let [output] = &self.desc.outputs[..] else { unreachable!("a pack has one output") };
        handles.register_float_tensor::<B>(&output.id, B::pack(parts));
    }
}

impl<B: FusionBackend + PackBackend> PackBackend for Fusion<B> {
    fn pack(parts: Vec<FloatTensor<Self>>) -> FloatTensor<Self> {
        let first = parts.first().expect("packing needs a part");
        let (client, dtype) = (first.client.clone(), first.dtype);
        let total: usize = parts.iter().map(|p| p.shape.num_elements()).sum();
        let streams = OperationStreams::with_inputs(&parts);
        let output = TensorIr::uninit(client.create_empty_handle(), [total].into(), dtype);
        let inputs: Vec<TensorIr> = parts.into_iter().map(|p| p.into_ir()).collect();
        let desc = CustomOpIr::new("drove_pack", &inputs, &[output]);
        let operation = Pack::<B> { desc: desc.clone(), backend: PhantomData };
        let mut outputs = client.register(streams, OperationIr::Custom(desc), operation);
        outputs.remove(0)
    }
}

//! [`DropoutBackend`] under burn's fusion: a custom operation in the fusion
//! stream (the pattern of burn-vision's connected components), executed in
//! order with the operations around it, so nothing is flushed or read.

use std::marker::PhantomData;

use burn::tensor::ops::FloatTensor;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

use super::{DropoutBackend, Mask};

/// The operation the fusion stream executes: the inner backend's dropout.
#[derive(Debug)]
struct Masked<B> {
    desc: CustomOpIr,
    mask: Mask,
    backend: PhantomData<fn() -> B>,
}

impl<B: FusionBackend + DropoutBackend> Operation<B::FusionRuntime> for Masked<B> {
    fn execute(&self, handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>) {
        let ([input], [output]) = self.desc.as_fixed();
        let x = handles.get_float_tensor::<B>(input);
        handles.register_float_tensor::<B>(&output.id, B::masked(x, self.mask));
    }
}

impl<B: FusionBackend + DropoutBackend> DropoutBackend for Fusion<B> {
    fn masked(x: FloatTensor<Self>, mask: Mask) -> FloatTensor<Self> {
        let client = x.client.clone();
        let streams = OperationStreams::with_inputs([&x]);
        let output = TensorIr::uninit(client.create_empty_handle(), x.shape.clone(), x.dtype);
        let desc = CustomOpIr::new("drove_dropout", &[x.into_ir()], &[output]);
        let operation = Masked::<B> { desc: desc.clone(), mask, backend: PhantomData };
        let mut outputs = client.register(streams, OperationIr::Custom(desc), operation);
        outputs.remove(0)
    }
}

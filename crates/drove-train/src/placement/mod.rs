//! Where a [`Replica`](crate::Replica) keeps its parameters, gradients and
//! optimizer state, and that placement's part of a step.
//!
//! The user picks a [`Placement`] in the options; the replica then holds one
//! [`PlacementStep`] ([`step`]), the host's ([`host`]: flat buffers, the CPU
//! fast path) or the backend's ([`backend`]: tensors on the device). Each owns its
//! optimizer state and the gradients summed since the last update, in its own
//! type, so the gradients of one placement can never reach the other's update.
//! The replica runs the forward and backward passes and the loss all-reduce;
//! a placement takes each pass's gradients, sums them, and makes the update
//! (the gradient all-reduce through the replica's one door,
//! [`GradientAllReduce`](crate::gradients::GradientAllReduce), clipping,
//! AdamW).

mod backend;
mod host;
mod step;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;

use drove_device::DeviceChoice;

use crate::device::DeviceAdamW;
use crate::flat::{AdamWSettings, FlatAdamW, FlatParams};
use backend::BackendPlacement;
use host::HostPlacement;
pub(crate) use step::{Gradients, PlacementStep, Reset, UpdateSettings};

/// Where a replica keeps its parameters, gradients and optimizer state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// Flat `f32` buffers in host memory, updated by [`FlatAdamW`] on rayon's
    /// threads: the CPU fast path. The model's tensors are rewritten from the
    /// buffers after every update.
    #[default]
    Host,
    /// Tensors on the backend's device, updated by the same AdamW in burn ops
    /// ([`DeviceAdamW`]); gradients cross to the host only inside the bucket
    /// all-reduce ([`BucketAllReduce`](drove_device::BucketAllReduce)), which a
    /// device collective replaces.
    Backend,
}

impl Placement {
    /// Where parameters and optimizer state live on `device` unless asked
    /// otherwise: flat host buffers on the CPU (its fast path), tensors on
    /// the device on a GPU.
    pub fn default_for(device: DeviceChoice) -> Placement {
        if device.is_gpu() { Placement::Backend } else { Placement::Host }
    }
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "host" => Ok(Placement::Host),
            "backend" | "device" => Ok(Placement::Backend),
            other => Err(format!("unknown placement {other:?}: expected host or backend")),
        }
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Placement::Host => "host",
            Placement::Backend => "backend",
        })
    }
}

/// What a fresh placement starts from.
pub(crate) struct StartState<'a, B: AutodiffBackend> {
    /// The (broadcast) parameters.
    pub params: FlatParams,
    /// AdamW's settings.
    pub adamw: AdamWSettings,
    /// Whether each parameter decays.
    pub decay: Vec<bool>,
    /// Where the model lives.
    pub device: &'a B::Device,
}

impl Placement {
    /// The placement's state for a model whose parameters are `start.params`.
    pub(crate) fn start<B, M>(self, start: StartState<'_, B>) -> Box<dyn PlacementStep<B, M>>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
    {
        match self {
            Placement::Host => {
                let mut optim = FlatAdamW::new(start.adamw, &start.params);
                optim.decay = start.decay;
                Box::new(HostPlacement::<B>::new(start.params, optim, start.device))
            }
            Placement::Backend => {
                let optim = DeviceAdamW::new(start.adamw, &start.params.shapes, start.decay, start.device);
                Box::new(BackendPlacement::<B>::new(optim, start.device))
            }
        }
    }
}

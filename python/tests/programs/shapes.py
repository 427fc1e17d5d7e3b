"""A rank program for the launch test: rank 1 passes a mask of another shape;
every rank prints what mask_agreement raised, as one JSON line."""

import json

import torch
import torch.distributed as dist

import drove.torch

dist.init_process_group("gloo")
rank = dist.get_rank()
rows = 3 if rank == 1 else 2
try:
    drove.torch.mask_agreement(torch.zeros((rows, 8), dtype=torch.bool), probability=0.15, step=0)
    print(json.dumps({"rank": rank, "error": None}), flush=True)
except drove.torch.MaskShapeError as e:
    print(json.dumps({"rank": rank, "error": str(e), "type": type(e).__name__}), flush=True)
dist.destroy_process_group()

"""Wall time per call of ps.softmax on small CUDA tensors, beside torch.softmax, in each way torch
can hand a tensor over: plain, requiring grad (forward; forward and backward), under torch.vmap
and inside torch.compile. Host cost, not bandwidth: the tensors are small.

    python3 tools/torch_call_cost.py [--calls 3000]
"""

from __future__ import annotations

import argparse

import torch

import portable_softmax as ps
from portable_softmax.bench import back_to_back_us


def ways(softmax, x: torch.Tensor, leaf: torch.Tensor, grad: torch.Tensor) -> dict:
    compiled = torch.compile(lambda t: softmax(t) * 2, fullgraph=True)
    return {
        "plain": lambda: softmax(x),
        "requires grad, forward": lambda: softmax(leaf),
        "requires grad, forward + backward": lambda: torch.autograd.grad(softmax(leaf), leaf, grad),
        "vmap over the first dim": lambda: torch.vmap(softmax)(x),
        "torch.compile (x * 2 after)": lambda: compiled(x),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for shape in [(8, 1000), (64, 1024)]:
        x = torch.randn(shape, device="cuda")
        leaf, grad = x.clone().requires_grad_(), torch.randn_like(x)
        ours = ways(ps.softmax, x, leaf, grad)
        theirs = ways(lambda t: torch.softmax(t, -1), x, leaf, grad)
        for way in ours:
            try:
                mine = f"{back_to_back_us(torch, ours[way], args.calls, warmup=200):7.1f} us"
            except Exception as e:  # an older build: the way that fails is named, the rest go on
                mine = f"fails ({type(e).__name__})"
            reference = back_to_back_us(torch, theirs[way], args.calls, warmup=200)
            print(f"{str(shape):12s} {way:36s} ours {mine}   torch.softmax {reference:7.1f} us")


if __name__ == "__main__":
    main()

"""A tiny DDP training job: every rank fits y = 3x + 2 on its own shard of samples, and DDP
averages the gradients, so the ranks keep one model.

Run by torchrun (ORBIT's `torchrun` task type: spec.yaml): gloo on CPU, nccl with one GPU per
rank when CUDA is there. Rank 0 logs one JSON line per step to $ORBIT_ARTIFACTS_DIR/logging.jsonl
(step, max_steps, loss: what `orbit status` shows as progress) and saves the model to
checkpoints/ at the end. Every rank prints a line now and then: artifacts/ranks/RANK.log.
By hand: `torchrun --standalone --nproc-per-node 2 train.py --steps 50`.
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds per step, to watch it")
    parser.add_argument("--width", type=int, default=0, help="hidden units: an MLP, to load a GPU")
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() and local_rank < torch.cuda.device_count()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of {world} on {device} ({dist.get_backend()})", flush=True)

    net = torch.nn.Linear(1, 1)
    if args.width:
        hidden = [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
        net = torch.nn.Sequential(torch.nn.Linear(1, args.width), torch.nn.ReLU(), *hidden,
                                  torch.nn.Linear(args.width, 1))  # fmt: skip
    model = DistributedDataParallel(net.to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    out = Path(os.environ.get("ORBIT_ARTIFACTS_DIR", "artifacts"))
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    log = open(out / "logging.jsonl", "a", encoding="utf-8") if rank == 0 else None  # noqa: SIM115
    started = time.monotonic()
    for step in range(1, args.steps + 1):
        generator = torch.Generator().manual_seed(step * world + rank)  # this rank's shard
        x = torch.rand(args.batch, 1, generator=generator) * 2 - 1
        y = 3 * x + 2
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients of every rank here
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean = mean.item() / world
        if log is not None:
            elapsed = time.monotonic() - started
            line = {"step": step, "max_steps": args.steps, "loss": round(mean, 6),
                    "steps_per_s": round(step / elapsed, 2)}  # fmt: skip
            log.write(json.dumps(line) + "\n")
            log.flush()
        if step % 20 == 0 or step == args.steps:
            print(f"step {step}/{args.steps}: loss {mean:.5f}", flush=True)
        time.sleep(args.sleep)
    if rank == 0:
        torch.save(model.module.state_dict(), out / "checkpoints" / f"step-{args.steps}.pt")
        fitted = f"w={net.weight.item():.3f} b={net.bias.item():.3f}" if not args.width else ""
        print(f"done: loss {mean:.5f} {fitted}".rstrip(), flush=True)
    # torch 2.13's gloo (CPU) now and then aborts a rank here, after its last step: SIGABRT,
    # "terminate called without an active exception" (about 2 runs in 100 on a loaded 2-core
    # machine). The steps and the checkpoint are done by then; ORBIT reports the rank's end.
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

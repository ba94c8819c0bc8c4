"""A tiny training job with no dependencies: fits y = 3x + 2 by SGD.

It logs one JSON line per step to $ORBIT_ARTIFACTS_DIR/logging.jsonl (the form HF Trainer and
ms-swift use) and writes a checkpoint to $ORBIT_ARTIFACTS_DIR/checkpoints/ every --save-every
steps and at the end. Given $ORBIT_RESUME_FROM (a checkpoint an earlier attempt left: ORBIT
sets it when an attempt resumes, after a preemption say), it goes on from that step; each
step's sample depends only on its number, so a resumed run ends where an unbroken one would.
Run it by hand too: `python3 train.py --steps 50`.
"""

import argparse
import json
import os
import random
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--sleep", type=float, default=0.01, help="seconds per step, to watch it")
    parser.add_argument("--save-every", type=int, default=50, help="steps between checkpoints")
    args = parser.parse_args()

    out = Path(os.environ.get("ORBIT_ARTIFACTS_DIR", "artifacts"))
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    w, b, first = 0.0, 0.0, 1
    resume = os.environ.get("ORBIT_RESUME_FROM")
    if resume:
        state = json.loads(Path(resume).read_text())
        w, b, first = state["w"], state["b"], state["step"] + 1
        print(f"resumed from step {state['step']} ({resume})", flush=True)
    print(f"run {os.environ.get('ORBIT_RUN_ID', 'manual')}: training to step {args.steps}")
    with open(out / "logging.jsonl", "a", encoding="utf-8") as log:
        for step in range(first, args.steps + 1):
            rng = random.Random(step)
            x = rng.uniform(-1, 1)
            y = 3 * x + 2 + rng.gauss(0, 0.05)
            err = (w * x + b) - y
            w -= args.lr * 2 * err * x
            b -= args.lr * 2 * err
            line = {"step": step, "max_steps": args.steps, "loss": round(err * err, 6)}
            log.write(json.dumps(line) + "\n")
            log.flush()
            if step % 50 == 0 or step == args.steps:
                print(f"step {step}: loss {err * err:.5f} w={w:.3f} b={b:.3f}", flush=True)
            if step % args.save_every == 0 or step == args.steps:
                save(out, step, w, b)
            time.sleep(args.sleep)
    print(f"done at step {args.steps}: w={w:.3f} b={b:.3f}")


def save(out: Path, step: int, w: float, b: float) -> None:
    """Written aside and renamed: a checkpoint is never seen half-written."""
    final = out / "checkpoints" / f"step-{step}.json"
    partial = final.with_name(final.name + ".partial")
    partial.write_text(json.dumps({"step": step, "w": w, "b": b}) + "\n")
    os.replace(partial, final)


if __name__ == "__main__":
    main()

"""A tiny training job with no dependencies: fits y = 3x + 2 by SGD.

It logs one JSON line per step to $ORBIT_ARTIFACTS_DIR/logging.jsonl (the form HF Trainer and
ms-swift use) and writes a checkpoint to $ORBIT_ARTIFACTS_DIR/checkpoints/. Run it by hand too:
`python3 train.py --steps 50`.
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
    args = parser.parse_args()

    out = Path(os.environ.get("ORBIT_ARTIFACTS_DIR", "artifacts"))
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    w, b = 0.0, 0.0
    print(f"run {os.environ.get('ORBIT_RUN_ID', 'manual')}: training for {args.steps} steps")
    with open(out / "logging.jsonl", "a", encoding="utf-8") as log:
        for step in range(1, args.steps + 1):
            x = rng.uniform(-1, 1)
            y = 3 * x + 2 + rng.gauss(0, 0.05)
            err = (w * x + b) - y
            w -= args.lr * 2 * err * x
            b -= args.lr * 2 * err
            log.write(json.dumps({"step": step, "loss": round(err * err, 6)}) + "\n")
            log.flush()
            if step % 50 == 0 or step == args.steps:
                print(f"step {step}: loss {err * err:.5f} w={w:.3f} b={b:.3f}", flush=True)
            time.sleep(args.sleep)
    checkpoint = out / "checkpoints" / f"step-{args.steps}.json"
    checkpoint.write_text(json.dumps({"step": args.steps, "w": w, "b": b}) + "\n")
    print(f"saved {checkpoint.name}: w={w:.3f} b={b:.3f}")


if __name__ == "__main__":
    main()

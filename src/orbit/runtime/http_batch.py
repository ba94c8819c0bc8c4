"""The `http` task on the node: send a request, or a batch of them, to a model server already
running there, and keep every response. Standard library only: it runs with whatever python3
the node has.

Its settings come as JSON in ORBIT_HTTP_REQUEST (orbit.core.tasks.http shapes them). Bodies
are the one `json` value, or one per line of the staged requests.jsonl, read as they are sent:
a batch of millions is not held in memory. At most `concurrency` requests are in flight.

Under $ORBIT_ARTIFACTS_DIR:
- `save` (responses.jsonl): a line per request as it completes (not in order):
  {"index", "status", "elapsed_s", "response" (JSON, or text), "error"}
- logging.jsonl: {"step": done, "max_steps": total} as they complete, so `orbit status` shows
  "step 120/1000" and an estimated end;
and on stdout the first few responses (previews) and a line every 5 % or 10 s.

Exit 0 if no more than `allow_failures` requests failed (no answer, or a status >= 400);
1 otherwise, with the failures counted by kind. SIGTERM (a cancel) stops sending at once."""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import itertools
import json
import os
import random
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

PREVIEWS = 3
PREVIEW_CHARS = 300
# what the server could not take, so that sending it again is safe: a refused connection,
# too many requests, its proxy's or its own "not now"
AGAIN = frozenset({"ConnectionRefusedError", "http 429", "http 502", "http 503", "http 504"})


def bodies(config: dict[str, Any]) -> tuple[Iterator[bytes | None], int | None]:
    """Each request's body, and how many there are (None where not known up front)."""
    if config.get("jsonl_file"):
        path = config["jsonl_file"]
        with open(path, "rb") as f:
            total = sum(1 for line in f if line.strip())

        def lines() -> Iterator[bytes | None]:
            with open(path, "rb") as f:
                for line in f:
                    if line.strip():
                        yield line.strip()

        return lines(), total
    if "json" in config:
        return iter([json.dumps(config["json"]).encode()]), 1
    return iter([None]), 1


def send(
    config: dict[str, Any], headers: dict[str, str], index: int, body: bytes | None
) -> dict[str, Any]:
    """One request, sent again (up to `retries` times) while the server could not take it:
    a refused connection, 429, 502, 503 or 504. Never after a timeout or a reset mid-answer,
    where the server may have done the work already."""
    started = time.monotonic()
    tries = 0
    while True:
        status, text, error, asked = attempt(config, headers, body)
        if error not in AGAIN or tries >= config.get("retries", 0):
            break
        time.sleep(pause(tries, asked))
        tries += 1
    try:
        response: Any = json.loads(text) if text else None
    except ValueError:
        response = text
    return {
        "index": index,
        "status": status,
        "elapsed_s": round(time.monotonic() - started, 4),
        "response": response,
        "error": error,
        "tries": tries + 1,
    }


def attempt(
    config: dict[str, Any], headers: dict[str, str], body: bytes | None
) -> tuple[int | None, str, str | None, float | None]:
    """(status, text, error, the Retry-After it asked for) of one try."""
    request = urllib.request.Request(
        config["url"], data=body, method=config["method"], headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=config["timeout_s"]) as answer:
            return answer.status, answer.read().decode("utf-8", "replace"), None, None
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace")
        return exc.code, text, f"http {exc.code}", retry_after(exc.headers.get("Retry-After"))
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        error = "timeout" if isinstance(reason, TimeoutError) else f"{type(reason).__name__}"
        return None, str(reason), error, None


def pause(tries: int, asked: float | None) -> float:
    """Full jitter from 0.5 s, capped at 30 s, on top of what the server asked for (as
    orbit.model.backoff does; this file travels alone, with the standard library only)."""
    jitter: float = random.random() * min(30.0, 0.5 * 2.0**tries)
    return jitter + (asked or 0.0)


def retry_after(value: str | None) -> float | None:
    """Retry-After as seconds: delay-seconds or an HTTP-date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), 3600.0)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    left = (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    return min(max(left, 0.0), 3600.0)


def main() -> int:
    config = json.loads(os.environ["ORBIT_HTTP_REQUEST"])
    if config.get("service"):  # one the node advertises: its agent says where
        services = json.loads(os.environ.get("ORBIT_SERVICES") or "{}")
        if config["service"] not in services:
            known = ", ".join(sorted(services)) or "none"
            print(f"orbit http: service {config['service']}: not on this node (it has: {known})",
                  file=sys.stderr)  # fmt: skip
            return 2
        config["url"] = services[config["service"]] + config["path"]
    headers = {"content-type": "application/json", **config.get("headers", {})}
    for name, var in config.get("headers_from_env", {}).items():
        if var not in os.environ:
            print(f"orbit http: headers_from_env.{name}: ${var} is not set here", file=sys.stderr)
            return 2
        headers[name] = os.environ[var]
    artifacts = os.environ.get("ORBIT_ARTIFACTS_DIR", "artifacts")
    save = os.path.join(artifacts, config["save"])
    os.makedirs(os.path.dirname(save) or ".", exist_ok=True)
    stream, total = bodies(config)
    print(f"orbit http: {total} request(s) to {config['method']} {config['url']}, "
          f"{config['concurrency']} at a time", flush=True)  # fmt: skip
    done = 0
    failed: Counter[str] = Counter()  # (not Counter[str](): 3.8 cannot subscript it)
    last_said, every = time.monotonic(), max(1, (total or 0) // 20)
    # one `with` of three, not a parenthesized group: that needs 3.10, and this runs on 3.8
    with contextlib.ExitStack() as held:
        out = held.enter_context(open(save, "a", encoding="utf-8"))
        progress_path = os.path.join(artifacts, "logging.jsonl")
        progress = held.enter_context(open(progress_path, "a", encoding="utf-8"))
        pool = held.enter_context(
            ThreadPoolExecutor(config["concurrency"], thread_name_prefix="http")
        )
        in_flight: set[Future[dict[str, Any]]] = set()
        numbered = enumerate(stream)

        def top_up() -> None:
            for index, body in itertools.islice(numbered, config["concurrency"] - len(in_flight)):
                in_flight.add(pool.submit(send, config, headers, index, body))

        top_up()
        while in_flight:
            finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for future in finished:
                in_flight.discard(future)
                record = future.result()
                done += 1
                if record["error"]:
                    failed[record["error"]] += 1
                out.write(json.dumps(record) + "\n")
                out.flush()
                progress.write(json.dumps({"step": done, "max_steps": total}) + "\n")
                progress.flush()
                if done <= PREVIEWS:
                    preview = json.dumps(record["response"])[:PREVIEW_CHARS]
                    print(f"[{record['index']}] {record['status']}: {preview}", flush=True)
                if done % every == 0 or time.monotonic() - last_said >= 10 or done == total:
                    last_said = time.monotonic()
                    print(f"{done}/{total} done, {sum(failed.values())} failed", flush=True)
            top_up()
    bad = sum(failed.values())
    kinds = ", ".join(f"{kind} x{n}" for kind, n in failed.most_common())
    if bad > config.get("allow_failures", 0):
        print(f"orbit http: {bad} of {done} request(s) failed: {kinds}", file=sys.stderr)
        return 1
    print(f"orbit http: {done} request(s) answered" + (f"; {bad} failed: {kinds}" if bad else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

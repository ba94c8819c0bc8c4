"""Which environment variable names hold secrets. ORBIT never freezes their values into a
bundle or the store (DESIGN: job.json carries env "no secret values"), and never shows them.

A name is cut into words at separators and at camelCase steps (`HfToken` -> HF, TOKEN), in
upper case. A word that is a secret's word (`TOKEN`) or ends in one where separators were left
out (`HFTOKEN`, `AWSSECRETACCESSKEY`, `WANDB_APIKEY`) makes the name secret, and so do a few
whole-name forms (`*_KEY`, `*_PAT`, `*_DSN`, `DATABASE_URL`, `PRIVATE_KEY*`). Words are whole:
`TOKENIZERS_PARALLELISM`, `MAX_TOKENS`, `AUTHOR`, `MONKEY` and `PATTERN` are not secrets."""

from __future__ import annotations

import re

# a word that names a secret wherever it stands in the name
_WORDS = frozenset({"TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "AUTH"})
# the end of a word written without separators: HFTOKEN, OPENAIAPIKEY, AWSSECRETACCESSKEY
_WORD_ENDS = (
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "APIKEY",
    "ACCESSKEY",
    "SECRETKEY",
    "PRIVATEKEY",
    "DATABASEURL",
)
# a last word that makes a secret when something comes before it: WANDB_API_KEY, GITHUB_PAT,
# SENTRY_DSN (the DSN holds the key)
_LAST_WORDS = frozenset({"KEY", "PAT", "DSN"})
# words in a row, anywhere: DATABASE_URL (it carries the password), PRIVATE_KEY_PEM
_RUNS = (("DATABASE", "URL"), ("PRIVATE", "KEY"))
# separators, then the camelCase steps of what is left: "AWSSecretKey" -> AWS, Secret, Key
_SPLIT = re.compile(r"[^A-Za-z0-9]+")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


def words(name: str) -> list[str]:
    """`HfToken` -> [HF, TOKEN]; `aws_secretAccessKey` -> [AWS, SECRET, ACCESS, KEY]."""
    return [w.upper() for part in _SPLIT.split(name) for w in _CAMEL.findall(part)]


def looks_secret(name: str) -> bool:
    """`HF_TOKEN`, `HfToken`, `HFTOKEN`, `WANDB_APIKEY`, `AWS_SECRET_ACCESS_KEY`, `GITHUB_PAT`,
    `DATABASE_URL`: yes. `AUTHOR`, `MONKEY`, `TOKENIZERS_PARALLELISM`, `CUDA_VISIBLE_DEVICES`:
    no."""
    found = words(name)
    if any(w in _WORDS or w.endswith(_WORD_ENDS) for w in found):
        return True
    if len(found) > 1 and found[-1] in _LAST_WORDS:
        return True
    return any(_has_run(found, run) for run in _RUNS)


def _has_run(found: list[str], run: tuple[str, ...]) -> bool:
    size = len(run)
    return any(tuple(found[i : i + size]) == run for i in range(len(found) - size + 1))

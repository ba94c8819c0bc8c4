"""Which env names and values ORBIT takes for secrets: every way people spell a credential's
name, the shapes issued tokens really have, and the ordinary names and values of ML jobs that
must pass untouched."""

from __future__ import annotations

import pytest

from orbit.model.env_check import check_env
from orbit.model.errors import InvalidInput, Refused
from orbit.model.secret_names import looks_secret
from orbit.model.secret_shapes import secret_shape

SECRET_NAMES = [
    "HF_TOKEN",
    "HfToken",
    "hfToken",
    "HFTOKEN",
    "hf-token",
    "AWS_SECRET_ACCESS_KEY",
    "AWSSECRETACCESSKEY",
    "awsSecretAccessKey",
    "WANDB_API_KEY",
    "WANDB_APIKEY",
    "OPENAI_APIKEY",
    "OpenAiApiKey",
    "GITHUB_PAT",
    "SENTRY_DSN",
    "DATABASE_URL",
    "APP_DATABASE_URL",
    "PRIVATE_KEY",
    "PRIVATE_KEY_PEM",
    "PRIVATEKEY",
    "SSH_PRIVATE_KEY",
    "DB_PASSWORD",
    "OAUTH_CLIENT_SECRET",
    "GH_TOKEN",
    "AUTH",
]
PLAIN_NAMES = [
    "AUTHOR",
    "MONKEY",
    "KEYBOARD",
    "TOKENIZERS_PARALLELISM",
    "MAX_TOKENS",
    "NUM_TOKENS_PER_STEP",
    "CUDA_VISIBLE_DEVICES",
    "PATH",
    "PATTERN",
    "PAT",
    "DSN",
    "HF_HOME",
    "HF_DATASETS_CACHE",
    "WANDB_PROJECT",
    "DATABASE_NAME",
    "MASTER_PORT",
    "PYTHONPATH",
    "OMP_NUM_THREADS",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_a_secrets_name_is_caught_however_it_is_spelled(name: str) -> None:
    assert looks_secret(name)


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_an_ordinary_name_passes(name: str) -> None:
    assert not looks_secret(name)


SECRET_VALUES = {
    "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh": "a Hugging Face token",
    "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8": "a GitHub token",
    "github_pat_11ABCDEFG0" + "a" * 20 + "_" + "B" * 30: "a GitHub token",
    "sk-" + "Ab3dEf6hIj9lMn2pQr5tUv8xYz1bCd4fGh7jKl0nOp3r": "an API key (sk-...)",
    "sk-proj-" + "Ab3dEf6hIj9lMn2pQr5t_Uv8xYz1bCd4fGh7jKl0nOp3r-Ab3dEf6h": "an API key (sk-...)",
    "AKIAIOSFODNN7EXAMPLE": "an AWS access key id",
    "glpat-" + "xY1z2AbC3dEfGh4IjKlM": "a GitLab token",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----": (
        "a private key"
    ),
    "-----BEGIN PRIVATE KEY-----": "a private key",
    "postgresql://orbit:hunter2@db.lab/orbit": "a URL with a password",
    "--token=hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh": "a Hugging Face token",
}
PLAIN_VALUES = [
    "/data/models/llama-3-8b",
    "sk-learn",
    "sk-learn-baseline-version-two-final",
    "hf_cache",
    "hf_transfer",
    "meta-llama/Meta-Llama-3-8B-Instruct",
    "0123456789abcdef0123456789abcdef01234567",  # a commit
    "ghp_short",
    "AKIA",
    "https://huggingface.co/datasets/imdb",
    "postgresql://orbit@db.lab/orbit",
    "ssh://git@github.com/org/repo.git",
    "-----BEGIN PUBLIC KEY-----",
    "expandable_segments:True",
]


@pytest.mark.parametrize(("value", "kind"), list(SECRET_VALUES.items()))
def test_a_credentials_shape_is_caught_in_any_value(value: str, kind: str) -> None:
    assert secret_shape(value) == kind


@pytest.mark.parametrize("value", PLAIN_VALUES)
def test_an_ordinary_value_passes(value: str) -> None:
    assert secret_shape(value) is None


def test_the_refusal_names_the_field_and_never_the_value() -> None:
    token = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh"
    with pytest.raises(Refused) as caught:
        check_env({"MODEL": "gpt2", "MY_VAR": token})
    line = str(caught.value)
    assert line.startswith("env.MY_VAR: the value looks like a Hugging Face token; ")
    assert token not in line and "\n" not in line
    assert "orbit secrets set NAME" in line
    with pytest.raises(Refused, match=r"^env\.HfToken: the name looks like a secret's; "):
        check_env({"HfToken": "x"})
    with pytest.raises(InvalidInput, match=r"^env\.BAD-NAME: not an environment variable name"):
        check_env({"BAD-NAME": token})
    check_env({"TOKENIZERS_PARALLELISM": "false", "HF_HOME": "/data/hf"})

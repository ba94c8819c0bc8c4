"""The override whitelist, the merge of overrides over a template's defaults, and `--set`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbit.model.errors import InvalidInput, Refused
from orbit.model.models import ExecutionDefaults, ExecutionOverrides, ExecutionTemplate, Resources
from orbit.model.overrides import is_allowed, parse_overrides, resolve, set_paths
from orbit.model.spec import load_spec, parse_sets, to_submission

DEFAULT_RESOURCES = Resources(gpu_type="H100", gpu_count=1, cpu_count=8, memory_gb=64)
DEFAULTS = ExecutionDefaults(
    target=None,
    detach=True,
    resources=DEFAULT_RESOURCES,
    runtime_env={"HF_HOME": "/data/hf", "TOKENIZERS_PARALLELISM": "false"},
    stop_grace_s=30,
)

# Every path a submission can set here (runtime_env keys drawn from a small set).
ENV_KEYS = ["HF_HOME", "WANDB_MODE", "NCCL_DEBUG"]
LEAVES = [
    "target",
    "detach",
    "stop_grace_s",
    "resources.gpu_type",
    "resources.gpu_count",
    "resources.cpu_count",
    "resources.memory_gb",
    "resources.gpu_memory_gb",
    *(f"runtime_env.{k}" for k in ENV_KEYS),
]
ALLOWABLE = sorted({*LEAVES, "resources", "runtime_env"})


def template(allowed: tuple[str, ...] | list[str]) -> ExecutionTemplate:
    return ExecutionTemplate(
        id="rental",
        placement={"kind": "ssh"},
        launch_mode={"kind": "host_process"},
        defaults=DEFAULTS,
        allow_overrides=tuple(allowed),
    )


# --- the whitelist ----------------------------------------------------------------------------

segments = st.sampled_from(["resources", "gpu_count", "runtime_env", "HF_HOME", "a", "b", "x"])
dotted = st.lists(segments, min_size=1, max_size=4).map(".".join)


@given(dotted, st.lists(dotted, max_size=5))
def test_path_is_allowed_iff_it_or_a_parent_is_listed(path: str, allowed: list[str]) -> None:
    covered = any(path == a or path.startswith(a + ".") for a in allowed)
    assert is_allowed(path, tuple(allowed)) is covered


def test_a_sibling_with_a_common_prefix_is_no_parent() -> None:
    assert not is_allowed("resources_extra", ("resources",))
    assert not is_allowed("resources", ("resources.gpu_count",))
    assert is_allowed("resources.gpu_count", ("resources",))
    assert is_allowed("runtime_env.HF_HOME", ("runtime_env",))


@st.composite
def overrides_raw(draw: st.DrawFn) -> dict[str, Any]:
    """A raw override mapping that is valid, setting a random handful of leaves."""
    raw: dict[str, Any] = {}
    for leaf in draw(st.lists(st.sampled_from(LEAVES), min_size=1, max_size=5, unique=True)):
        head, _, tail = leaf.partition(".")
        value: Any
        match leaf:
            case "target":
                value = draw(st.sampled_from(["h100-a", "h100-b", None]))
            case "detach":
                value = draw(st.booleans())
            case "stop_grace_s":
                value = draw(st.integers(0, 600))
            case "resources.gpu_type":
                value = draw(st.sampled_from(["A100", "H200", None]))
            case "resources.gpu_count" | "resources.cpu_count" | "resources.memory_gb":
                value = draw(st.integers(1, 16))
            case "resources.gpu_memory_gb":
                value = draw(st.sampled_from([None, 0, 20, 40.5]))
            case _:
                value = draw(st.text("abc/01", min_size=0, max_size=5))
        if tail:
            raw.setdefault(head, {})[tail] = value
        else:
            raw[head] = value
    return raw


@given(overrides_raw(), st.lists(st.sampled_from(ALLOWABLE), max_size=6, unique=True))
def test_resolve_accepts_exactly_the_whitelisted_overrides(
    raw: dict[str, Any], allowed: list[str]
) -> None:
    overrides = parse_overrides(raw, "spec.yaml: overrides")
    paths = set_paths(overrides)
    refused = [p for p in paths if not any(p == a or p.startswith(a + ".") for a in allowed)]
    tpl = template(allowed)
    if not refused:
        request = resolve(tpl, overrides)
        assert request.template_id == "rental"
        assert request.backend_key == "ssh_host_process"
        return
    with pytest.raises(Refused) as info:
        resolve(tpl, overrides)
    message = str(info.value)
    named = re.search(r"override '([^']+)' is not allowed by template 'rental'", message)
    assert named is not None, message
    assert named.group(1) in refused
    listed = message.rsplit("allow_overrides: ", 1)[1].rstrip(")")
    if allowed:
        assert listed.split(", ") == allowed
    else:
        assert listed == "nothing"
    assert "\n" not in message


def test_refusal_names_the_field_and_lists_what_is_allowed() -> None:
    with pytest.raises(Refused) as info:
        resolve(template(["resources", "stop_grace_s"]), parse_overrides({"target": "h1"}, "s"))
    assert str(info.value) == (
        "override 'target' is not allowed by template 'rental' "
        "(allow_overrides: resources, stop_grace_s)"
    )
    with pytest.raises(Refused, match=r"'resources\.gpu_count'.*allow_overrides: nothing"):
        resolve(template([]), parse_overrides({"resources": {"gpu_count": 2}}, "s"))


def test_nothing_set_means_nothing_to_refuse() -> None:
    request = resolve(template([]), ExecutionOverrides())
    assert request.resources == DEFAULT_RESOURCES
    assert request.runtime_env == DEFAULTS.runtime_env
    assert request.stop_grace_s == 30
    assert request.target is None
    assert request.detach is True


# --- the merge --------------------------------------------------------------------------------


@given(overrides_raw())
def test_resolve_lays_overrides_over_defaults_without_dropping_any(raw: dict[str, Any]) -> None:
    request = resolve(template(ALLOWABLE), parse_overrides(raw, "s"))
    res = raw.get("resources", {})
    for name in type(DEFAULT_RESOURCES).model_fields:
        default = getattr(DEFAULT_RESOURCES, name)
        assert getattr(request.resources, name) == res.get(name, default), name
    assert request.runtime_env == {**DEFAULTS.runtime_env, **raw.get("runtime_env", {})}
    for name in ("target", "detach", "stop_grace_s"):
        assert getattr(request, name) == raw.get(name, getattr(DEFAULTS, name)), name


def test_nested_resources_merge_keeps_the_other_defaults() -> None:
    overrides = parse_overrides({"resources": {"gpu_count": 4}}, "s")
    request = resolve(template(["resources.gpu_count"]), overrides)
    assert request.resources == Resources(gpu_type="H100", gpu_count=4, cpu_count=8, memory_gb=64)
    assert request.runtime_env == DEFAULTS.runtime_env  # untouched siblings stay too


def test_a_null_for_a_required_value_is_invalid_input_not_a_traceback() -> None:
    for raw, field in [
        ({"resources": {"gpu_count": None}}, "resources.gpu_count"),
        ({"stop_grace_s": None}, "stop_grace_s"),
        ({"detach": None}, "detach"),
    ]:
        with pytest.raises(InvalidInput, match=re.escape(field)):
            resolve(template(ALLOWABLE), parse_overrides(raw, "s"))
    # target may be cleared: null is a real value for it
    assert resolve(template(ALLOWABLE), parse_overrides({"target": None}, "s")).target is None


@pytest.mark.parametrize(
    ("raw", "field", "what"),
    [
        ({"resources": {"gpu_cont": 1}}, "resources.gpu_cont", "unknown key"),
        ({"gpus": 2}, "gpus", "unknown key"),
        ({"resources": {"gpu_count": -1}}, "resources.gpu_count", "greater than or equal"),
        ({"resources": {"gpu_count": "many"}}, "resources.gpu_count", "valid integer"),
        ({"stop_grace_s": 7200}, "stop_grace_s", "less than or equal"),
        ({"runtime_env": {"A": ["x"]}}, "runtime_env.A", "valid string"),
    ],
)
def test_bad_overrides_are_invalid_input_naming_the_field(
    raw: dict[str, Any], field: str, what: str
) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_overrides(raw, "spec.yaml: overrides")
    message = str(info.value)
    assert message.startswith(f"spec.yaml: overrides: {field}: ")
    assert what in message
    assert "\n" not in message


# --- --set key=value --------------------------------------------------------------------------


def test_parse_sets_examples() -> None:
    assert parse_sets(["a.b=2", "x=true", "y=[1,2]"]) == {"a": {"b": 2}, "x": True, "y": [1, 2]}
    assert parse_sets(["target=h100-a", "resources.gpu_type=null"]) == {
        "target": "h100-a",
        "resources": {"gpu_type": None},
    }
    assert parse_sets(["a.b=1", "a.c=x", "a.b=3"]) == {"a": {"b": 3, "c": "x"}}
    assert parse_sets(["msg=a=b"]) == {"msg": "a=b"}  # only the first '=' splits
    assert parse_sets(["empty="]) == {"empty": ""}
    assert parse_sets([]) == {}


@pytest.mark.parametrize("item", ["novalue", "=3", "a..b=1", ".a=1", "a.=1", " =1"])
def test_parse_sets_refuses_what_is_not_key_value(item: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_sets([item])
    message = str(info.value)
    assert repr(item) in message
    assert "expected key=value" in message


keys = st.lists(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), min_size=1, max_size=4)


@given(keys, st.integers(-(10**6), 10**6) | st.booleans())
def test_parse_sets_nests_dotted_keys(parts: list[str], value: int | bool) -> None:
    expected: Any = value
    for part in reversed(parts):
        expected = {part: expected}
    text = str(value).lower() if isinstance(value, bool) else str(value)
    assert parse_sets([f"{'.'.join(parts)}={text}"]) == expected


def test_sets_reach_the_submission_through_the_spec(tmp_path: Path) -> None:
    spec_file = tmp_path / "SPEC.yaml"
    spec_file.write_text(
        "experiment: demo\n"
        "task_type: command\n"
        "template: local\n"
        "task: {command: 'echo hi'}\n"
        "overrides: {resources: {cpu_count: 2}, runtime_env: {A: '1'}}\n"
    )
    spec = load_spec(spec_file, ["resources.gpu_count=1", "runtime_env.B=two"])
    assert spec.overrides == {
        "resources": {"cpu_count": 2, "gpu_count": 1},
        "runtime_env": {"A": "1", "B": "two"},
    }
    submission = to_submission(spec, str(spec_file))
    assert submission.overrides.resources is not None
    assert submission.overrides.resources.gpu_count == 1
    bad = load_spec(spec_file, ["resources.gpu_cont=1"])
    with pytest.raises(InvalidInput, match=r"overrides: resources\.gpu_cont: unknown key"):
        to_submission(bad, str(spec_file))


def test_a_gpu_memory_reservation_is_an_override_like_the_others() -> None:
    overrides = parse_overrides({"resources": {"gpu_memory_gb": 20}}, "s")
    assert set_paths(overrides) == ["resources.gpu_memory_gb"]
    request = resolve(template(["resources.gpu_memory_gb"]), overrides)
    assert request.resources.gpu_memory_gb == 20.0
    assert request.resources.gpu_count == 1  # the rest stays the template's
    assert resolve(template([]), ExecutionOverrides()).resources.gpu_memory_gb is None
    with pytest.raises(InvalidInput, match="gpu_memory_gb"):
        parse_overrides({"resources": {"gpu_memory_gb": -1}}, "s")

"""The accelerator half of the resource descriptor: the compact request form (`gpu:
H100:80GB:2`), what it matches, and the catalog model of an accelerator as NVML names it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbit.model.errors import InvalidInput
from orbit.scheduler.resources import MODELS, GpuAsk, canonical_model, parse_gpu

H100S = ("H100-80GB", "H100-NVL")
A100S = ("A100-40GB", "A100-80GB")


@pytest.mark.parametrize(
    ("written", "ask"),
    [
        ("H100", GpuAsk(H100S)),  # a family: both memory sizes
        ("h100:2", GpuAsk(H100S, count=2)),
        ("A100-80GB:2", GpuAsk(("A100-80GB",), count=2)),
        (":80GB:2", GpuAsk(memory_gb=80.0, count=2)),
        ("80g", GpuAsk(memory_gb=80.0)),
        ("A100..H100:4", GpuAsk((*A100S, *H100S), count=4)),
        ("[H100, A100-80GB]", GpuAsk(("A100-80GB", *H100S))),
        ("[L4,T4]:24GB", GpuAsk(("T4", "L4"), memory_gb=24.0)),
        ("any:8", GpuAsk(count=8)),
        ("4", GpuAsk(count=4)),
        (4, GpuAsk(count=4)),
        ("none", GpuAsk(count=0)),
        (0, GpuAsk(count=0)),
        (None, GpuAsk(count=0)),
    ],
)
def test_the_compact_form_reads_as_people_write_it(written: str | int | None, ask: GpuAsk) -> None:
    assert parse_gpu(written) == ask
    assert parse_gpu(ask.text()) == ask  # and it writes itself back the same


@pytest.mark.parametrize(
    ("written", "says"),
    [
        ("H10", "resources.gpu: unknown accelerator model 'H10'; nearest known: H100"),
        ("Z9000", "resources.gpu: unknown accelerator model 'Z9000'; known: A10, A100"),
        ("H100..A100", "resources.gpu: range 'H100..A100' runs backwards; write it low..high"),
        ("H100:2:3", "resources.gpu: 'H100:2:3' gives the count twice"),
        ("H100:80GB:40GB", "resources.gpu: 'H100:80GB:40GB' gives the memory twice"),
        ("2:H100", "resources.gpu: 'H100' in '2:H100' is neither a memory (80GB) nor a count"),
        ("[]", "resources.gpu: an empty list of models"),
        ("A100:0", "resources.gpu: 'A100:0' asks for 0 GPUs of a kind; write none"),
        (-1, "resources.gpu: a count of GPUs is 0 or more, not -1"),
        (True, "resources.gpu: expected MODELS:MEMORY:COUNT"),
    ],
)
def test_what_does_not_read_is_refused_in_one_line_naming_the_field(
    written: str | int, says: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_gpu(written)
    assert str(refused.value).startswith(says)
    assert "\n" not in str(refused.value)


@given(
    models=st.lists(st.sampled_from(sorted(m.name for m in MODELS.values())), max_size=4),
    memory=st.one_of(st.none(), st.integers(1, 200).map(float)),
    count=st.integers(1, 64),
)
def test_any_ask_written_compactly_reads_back_the_same(
    models: list[str], memory: float | None, count: int
) -> None:
    ordered = tuple(sorted(set(models), key=lambda n: MODELS[n.upper()].rank))
    ask = GpuAsk(ordered, memory, count)
    assert parse_gpu(ask.text()) == ask


def test_an_ask_matches_by_model_and_memory() -> None:
    ask = parse_gpu("A100..H100:48GB:2")
    assert ask.matches("A100-80GB", 80.0) and ask.matches("H100-80GB", 80.0)
    assert not ask.matches("A100-40GB", 40.0)  # in the range, short of memory
    assert not ask.matches("L40S", 48.0)  # memory enough, not in the range
    assert not ask.matches(None, 80.0)  # a model the catalog lacks is none of those named
    assert parse_gpu(":24GB").matches(None, 24.0)  # any model: memory alone decides


def test_a_nodes_accelerators_map_onto_the_catalog() -> None:
    # the name NVML gave on a real H100 node (the recording the NVML tests replay)
    recording = Path(__file__).parents[1] / "data" / "nvml" / "h100-recording.json"
    assert "NVIDIA H100 80GB HBM3" in recording.read_text()
    assert json.loads(recording.read_text())["format"]
    assert canonical_model("NVIDIA H100 80GB HBM3", 81559) == "H100-80GB"
    assert canonical_model("NVIDIA H100 NVL", 95830) == "H100-NVL"
    assert canonical_model("NVIDIA A100-SXM4-80GB", 81920) == "A100-80GB"
    assert canonical_model("NVIDIA A100-PCIE-40GB", 40960) == "A100-40GB"
    assert canonical_model("Tesla T4", 15360) == "T4"
    assert canonical_model("NVIDIA A10G", 23028) == "A10G"
    assert canonical_model("NVIDIA GeForce RTX 4090", 24564) is None  # not in the catalog

"""The Gemma 4 catalog entries, their pull (a checkpoint repository is a directory of
files: the Hugging Face Hub cannot exist here, `snapshot_download` is mocked as
`hf_hub_download` is in test_catalog.py), the gemma4-chat format, and the engine a model
gets by default: the triton engine where CUDA is present and it runs the architecture,
llama.cpp elsewhere, logged and carried in each decision's provenance."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

from decider import Decider, YesNo
from decider.bench.random_gemma4 import write_gemma4
from decider.catalog import CHECKPOINT_FILES, Catalog
from decider.commands import main
from decider.engine_choice import choose_engine
from decider.engines import host
from decider.logs import configure
from decider.prompts import FORMATS
from helpers.gemma4_models import VOCAB
from helpers.seeds import seeded

GEMMA4 = {"gemma-4-e2b-it": "gguf", "gemma-4-e2b-it-w4a16": "checkpoint",
          "gemma-4-e4b-it": "gguf", "gemma-4-e4b-it-w4a16": "checkpoint",
          "gemma-4-31b-it": "gguf", "gemma-4-31b-it-w4a16": "checkpoint",
          "gemma-4-26b-a4b-it": "gguf"}


def test_the_public_gemma4_instruct_models_are_shipped_with_their_markup(tmp_path):
    cat = Catalog(user_file=tmp_path / "none.toml", cache_dir=tmp_path)
    for name, layout in GEMMA4.items():
        entry = cat.get(name)
        assert (entry.source, entry.layout, entry.engine, entry.prompt_format) == (
            "huggingface", layout, "auto", "gemma4-chat"), name
        assert entry.repo.startswith("google/gemma-4-") and "-it-qat-" in entry.repo
        assert entry.file.endswith("_q4_0-it.gguf") if layout == "gguf" else not entry.file
    for name in ("gemma-3-1b-it", "gemma-3-4b-it", "gemma-3-270m"):  # a preference now
        assert cat.get(name).engine == "auto"


def test_the_gemma4_chat_format_ends_on_the_empty_thought_block():
    fmt = FORMATS["gemma4-chat"]
    prefix = fmt.render_prefix("The parcel is late.", "Be brief.")
    assert prefix == (("<|turn>", True),
                      ("user\nBe brief.\n\nText: The parcel is late.\n\n", False))
    suffix = fmt.render_suffix("Question: Late? (yes or no)")
    assert suffix[-7:] == (("<turn|>", True), ("\n", False), ("<|turn>", True), ("model\n", False),
                           ("<|channel>", True), ("thought\n", False), ("<channel|>", True))
    assert fmt.surface_forms("yes") == ["yes", "Yes"] and fmt.answer_end == "<turn|>"


def test_pull_fetches_a_checkpoint_repository_as_a_directory(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    calls = []

    def fake_snapshot(repo_id, revision, local_dir, allow_patterns):  # the Hub's contract
        calls.append((repo_id, revision, tuple(allow_patterns)))
        Path(local_dir).mkdir(parents=True, exist_ok=True)
        (Path(local_dir) / "config.json").write_text("{}")
        (Path(local_dir) / "model-00001-of-00002.safetensors").write_bytes(b"x" * 10)
        return local_dir

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    monkeypatch.setenv("DECIDER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DECIDER_CATALOG", str(tmp_path / "none.toml"))
    cat = Catalog()
    entry = cat.get("gemma-4-e2b-it-w4a16")
    assert not cat.is_present(entry)
    assert main(["pull", "gemma-4-e2b-it-w4a16"]) == 0
    assert Path(capsys.readouterr().out.strip()) == cat.local_path(entry)
    assert calls == [("google/gemma-4-E2B-it-qat-w4a16-ct", None, tuple(CHECKPOINT_FILES))]
    assert cat.is_present(entry) and cat.locate(entry).is_dir()
    assert main(["pull", "gemma-4-e2b-it-w4a16"]) == 0 and len(calls) == 1  # present


@pytest.fixture
def info_logs():
    """Info-level logs on (the CLI's default shows warnings only), captured by capture_logs."""
    configure("info", "json", io.StringIO())
    yield
    structlog.reset_defaults()


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory):
    """A dense and a mixture-of-experts tiny Gemma 4, each loadable by llama.cpp."""
    d = tmp_path_factory.mktemp("choice")
    dense = write_gemma4(d / "dense.gguf", seeded("dense"), layers=6, pattern=6, vocab=VOCAB,
                         synthetic_vocab=True)
    moe = write_gemma4(d / "moe.gguf", seeded("moe"), layers=6, pattern=6, vocab=VOCAB,
                       experts=(4, 2, 64), synthetic_vocab=True)
    return dense, moe


def test_by_default_a_gpu_host_gets_the_triton_engine_and_a_cpu_host_llama_cpp(
        gguf_pair, tmp_path, monkeypatch, info_logs):
    dense, moe = gguf_pair
    cat = Catalog(user_file=tmp_path / "none.toml", cache_dir=tmp_path)
    entry = cat.get(str(dense))
    assert not host.cuda_present()  # this machine: no CUDA
    with capture_logs() as logs:
        assert choose_engine(entry, dense) == "llama"
    assert logs[-1]["event"] == "engine chosen" and "no CUDA" in logs[-1]["reason"]
    # a CUDA host (the one thing that cannot exist here)
    monkeypatch.setattr(host, "cuda_present", lambda: True)
    with capture_logs() as logs:
        assert choose_engine(entry, dense) == "triton"
        assert choose_engine(cat.get(str(moe)), moe) == "llama"  # no experts in triton
        assert choose_engine(entry, dense, asked="reference") == "reference"
    assert [r["reason"] for r in logs] == ["CUDA present and the triton engine runs gemma4",
                                          "the triton engine has no mixture-of-experts "
                                          "layers yet", "asked for"]
    pinned = type(entry)(name="pinned", source="file", path=str(dense), engine="llama")
    assert choose_engine(pinned, dense) == "llama"


def test_the_chosen_engine_is_in_the_decisions_provenance(gguf_pair, info_logs):
    dense, _ = gguf_pair
    with capture_logs() as logs, Decider(str(dense), n_ctx=256) as d:
        decision = d.decide("a late parcel", [YesNo("late?")])
    assert decision.engine == "llama" == decision.to_dict()["engine"]
    assert any(r["event"] == "engine chosen" and r["engine"] == "llama" for r in logs)

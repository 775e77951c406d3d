"""Only the prompt template's own markers are special tokens: markup in a ticket, an
instruction, a question or a label is tokenized as the text it is, in every engine
(llama.cpp, and the torch engines through the same vocabulary), on the real
gemma-3-270m tokenizer."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from decider import Choice, Label, MultiLabel, Request, Scale, YesNo
from decider.engines.vocab import Vocab
from decider.errors import InvalidRequest
from decider.plan import build_plan
from decider.prompts import FORMATS

CONTROL = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<start_of_turn>": 105, "<end_of_turn>": 106}
MARKUP = "".join(CONTROL) + " </s> <mask>"  # </s> is user-defined and control at once


def all_ids(plan) -> list[int]:
    job = plan.job
    return [*job.prefix, *(t for b in job.branches for t in (*b.suffix, *sum(b.candidates, ())))]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_markup_in_every_user_field_stays_text(decider, fmt):
    tok = decider.engine.tokenize
    request = Request(f"My parcel {MARKUP} never came", (
        YesNo(f"Late {MARKUP}?"),
        Choice("Topic?", ["billing", Label("shipping", f"parcels {MARKUP}")]),
        MultiLabel("Which?", [Label("refund", MARKUP)]),
    ), instructions=f"Answer {MARKUP}")
    plan = build_plan(request, FORMATS[fmt], tok, decider.engine.info.bos_id)
    ids = all_ids(plan)
    # Gemma 4's markers are not tokens of Gemma 3's vocabulary: text there, no control ids
    template = {"plain": [], "gemma-chat": [105, 106], "gemma4-chat": []}[fmt]
    markers = [t for t in ids if t in CONTROL.values() or t == 212]
    # BOS and the template's markers, nothing from the user: a chat turn opens once in
    # the prefix and once a branch; the user's spelled control tokens are text
    assert sorted(set(markers)) == sorted({2, *template})
    assert plan.job.prefix.count(2) == 1 and plan.job.prefix[0] == 2
    if fmt == "gemma-chat":
        assert plan.job.prefix[:2] == (2, 105)
        assert plan.job.prefix.count(105) == 1
        assert all(b.suffix.count(105) == b.suffix.count(106) == 1 for b in plan.job.branches)
    assert tok("<start_of_turn>", special=True) == [105]


def test_the_triton_engines_vocabulary_gives_the_llama_engines_ids(decider, model_path):
    vocab = Vocab(model_path, True)  # what the triton and reference engines tokenize with
    try:
        for text in (MARKUP, f"a{MARKUP}b", "plain words", "<start_of_turn>user\n"):
            assert vocab.tokenize(text) == decider.engine.tokenize(text)
            assert vocab.tokenize(text, special=True) == decider.engine.tokenize(text, True)
        assert not set(vocab.tokenize(MARKUP)) & {0, 1, 2, 105, 106, 212}
    finally:
        vocab.close()


@pytest.mark.parametrize("question, field", [
    (Choice("Q?", ["fine", "<eos>"]), "questions[0].labels[1]"),
    (MultiLabel("Q?", ["<start_of_turn>"]), "questions[0].labels[0]"),
    (Scale("Q?", ["low", "high</s>"]), "questions[0].levels[1]"),
])
def test_a_label_that_spells_a_control_token_is_refused(decider, fault_file, question, field):
    fault_file.write_text("oom")  # a pass that began would fail with OOM
    with pytest.raises(InvalidRequest) as info:
        decider.decide("text", [question])
    assert [v.field for v in info.value.violations] == [field]
    assert "control token" in info.value.violations[0].description
    assert fault_file.exists()  # refused before any engine pass
    fault_file.unlink()


# Texts made of what a cut could break: spaces and runs of them, llama.cpp's own space
# character, `>▁</` (the one Gemma 3 token that holds a space after another character),
# markup and control spellings, words, other scripts; pieces of any other text between.
PARTS = st.sampled_from([" ", "  ", "   ", "\u2581", " \u2581", "\n", "\n\n", "\t", "\u3000",
                         ">", "<", "/", "> </", "></", "</s>", "<eos>", "<start_of_turn>",
                         "a", "the", "The", "refund", "parcel", "é", "中文", "🙂", ".", ",",
                         "0", "42", "ﬁ", "\u200b"])
TEXTS = st.lists(PARTS | st.text(max_size=4), max_size=40).map("".join)


@pytest.fixture(scope="module")
def both_tokenizers(model_path):
    """The vocabulary's tokenize (plain text piece by piece, cached) and llama.cpp's on
    the whole text, from two loads of the real gemma-3-270m tokenizer."""
    import llama_cpp as ll

    from decider.engines.llama_lib import captured_log, load_model, tokenize_with

    vocab = Vocab(model_path, True)
    params = ll.llama_model_default_params()
    params.vocab_only = True
    with captured_log() as lines:
        model = load_model(model_path, params, lines)
    yield vocab.tokenize, functools.partial(tokenize_with, ll.llama_model_get_vocab(model))
    vocab.close()
    ll.llama_model_free(model)


@given(text=TEXTS)
def test_plain_text_piece_by_piece_gives_the_whole_texts_ids(both_tokenizers, text):
    pieces, whole = both_tokenizers
    assert pieces(text) == whole(text)
    assert pieces(text) == whole(text)  # the second time from the cache
    assert pieces(text, special=True) == whole(text, True)


def test_a_text_is_not_cut_inside_the_token_that_spans_a_space(both_tokenizers):
    pieces, whole = both_tokenizers
    ids = whole("x> </y")
    assert pieces("x> </y") == ids
    assert ids != whole("x>") + whole(" </y")  # what a cut there would have given

"""Label mass of one model under several prompt formats, on the same prompts.

Label mass is the share of the answer position's probability that falls on the labels'
tokens: how much the model answers in label space. Fifty short English sentences, each
asked a yes/no question and a three-option choice in one request; the medians (and the
accuracy, the sentences being labelled by hand) per format and question.

    .venv/bin/python -m decider pull smollm2-135m-instruct
    .venv/bin/python scripts/label_mass.py smollm2-135m-instruct --formats plain chat-template
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from decider import Choice, Decider, YesNo
from decider.catalog import Catalog

POSITIVE = [
    "I love this movie, it was wonderful!", "The staff were friendly and quick.",
    "Best pizza I have had in years.", "The update fixed every problem I had.",
    "What a beautiful sunny morning.", "My new phone works perfectly.",
    "The concert was amazing from start to finish.", "Thank you, the refund arrived today.",
    "This book made me smile on every page.", "The hotel room was clean and quiet.",
    "Great service, I will come back.", "The kids had a fantastic time at the park.",
    "Delivery was early and the box was intact.", "I passed my driving test!",
    "The new teacher is kind and patient.", "Our team won the final.",
    "The soup was warm and delicious.",
]
NEGATIVE = [
    "Worst service ever, I want my money back.", "The train was late again and nobody cared.",
    "My order arrived broken.", "The app crashes every time I open it.",
    "The food was cold and tasteless.", "I waited two hours on the phone for nothing.",
    "This is the most boring film I have seen.", "The room smelled of smoke and mould.",
    "They charged me twice and refuse to help.", "My laptop died after one week.",
    "The noise from next door kept me awake all night.", "I lost my wallet on the bus.",
    "The instructions were useless and confusing.", "Rude staff and dirty tables.",
    "The parcel never came.", "I regret buying this jacket.",
    "The meeting was a complete waste of time.",
]
NEUTRAL = [
    "The meeting is at three o'clock.", "The shop opens at nine on weekdays.",
    "The parcel weighs two kilograms.", "I took the bus to work today.",
    "The report has twelve pages.", "It is supposed to rain on Tuesday.",
    "The library is on Main Street.", "My sister lives in Lisbon.",
    "The form asks for a phone number.", "The train leaves from platform four.",
    "We moved the desk to the other room.", "The manual is available in French.",
    "The password must have eight characters.", "He ordered a coffee and a sandwich.",
    "The museum closes on Mondays.", "The invoice number is on the top right.",
]
TEXTS = [(t, "positive") for t in POSITIVE] + [(t, "negative") for t in NEGATIVE] + [
    (t, "neutral") for t in NEUTRAL]
YES_NO = YesNo("Is the writer pleased?")
CHOICE = Choice("What is the sentiment of the text?", ["positive", "negative", "neutral"])


def measure(decider: Decider) -> dict[str, tuple[float, float]]:
    """Per question: the median label mass and the accuracy over TEXTS."""
    masses: dict[str, list[float]] = {"yes/no": [], "choice": []}
    right: dict[str, int] = {"yes/no": 0, "choice": 0}
    for text, truth in TEXTS:
        yes_no, choice = decider.decide(text, [YES_NO, CHOICE]).answers
        masses["yes/no"].append(yes_no.label_mass)
        masses["choice"].append(choice.label_mass)
        right["yes/no"] += yes_no.decision == (truth == "positive")
        right["choice"] += choice.label == truth
    return {q: (statistics.median(m), right[q] / len(TEXTS)) for q, m in masses.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    parser.add_argument("--formats", nargs="+", default=["plain", "chat-template"])
    parser.add_argument("--n-threads", type=int, default=None)
    args = parser.parse_args()
    catalog = Catalog()
    entry = catalog.get(args.model)
    print(f"model {entry.name}, {len(TEXTS)} texts, a yes/no and a 3-option choice each")
    print(f"{'format':<15} {'question':<8} {'median label mass':>18} {'accuracy':>9}")
    for name in args.formats:
        asked = dataclasses.replace(entry, prompt_format=name)
        with Decider(asked, catalog=catalog, n_ctx=2048, n_threads=args.n_threads) as decider:
            for question, (mass, accuracy) in measure(decider).items():
                print(f"{name:<15} {question:<8} {mass:>18.3f} {accuracy:>9.2f}")


if __name__ == "__main__":
    main()

"""The simple baseline a decision is compared with: logistic regression on TF-IDF
features, fitted on the training texts and their gold answers (scikit-learn, imported
when it is fitted)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np


def tfidf_probabilities(train_texts: Sequence[str], train_answers: Sequence[Hashable],
                        test_texts: Sequence[str],
                        labels: Sequence[Hashable] | int) -> np.ndarray:
    """Test probabilities, an n_test x K array whose columns follow `labels`: the answers
    in order (names), or their count K when the answers are the indices 0..K-1.

    A label that no training item has gets probability 0 on every item (the model cannot
    predict what it never saw); the rows still sum to 1 over the others. Training needs
    at least two distinct answers; a training answer that is not a label is a ValueError.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    labels = range(labels) if isinstance(labels, int) else labels
    column = {label: j for j, label in enumerate(labels)}
    unknown = set(train_answers) - set(column)
    if unknown:
        raise ValueError(f"training answers {sorted(map(str, unknown))} are not among the "
                         "labels")
    if len(set(train_answers)) < 2:
        raise ValueError("the training split needs at least two distinct answers")
    model = Pipeline([
        ("tfidf", TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), min_df=2)),
        ("logistic", LogisticRegression(max_iter=1000)),
    ])
    model.fit(list(train_texts), list(train_answers))
    out = np.zeros((len(test_texts), len(column)))
    out[:, [column[c] for c in model.classes_]] = model.predict_proba(list(test_texts))
    return out

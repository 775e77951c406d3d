"""Fitting one branch's adjustment (decider/calibration.py: softmax(log p / T + W log p +
bias)) on labelled examples, the form chosen by cross-validated log loss.

The forms, simplest first: none (the model's own probabilities), temperature (one
parameter; rescales confidence, never changes the choice), bias (the temperature and a
bias per answer but the first: Platt scaling for yes/no, vector scaling for options;
undoes the model's prior over the options) and matrix (the bias form, and each answer's
logit also a weighted sum of every answer's log-probability: matrix scaling; for yes/no
beta calibration, Kull et al. 2017, whose two log terms bend the map where Platt's
cannot). The bias and the weights carry a Gaussian prior, so a class absent from a fold
does not drive its bias to minus infinity, and the matrix form falls back to the bias
form as the prior tightens; its strength is chosen with the form (`RIDGES`): many
options and few examples each want a strong one, two options and hundreds a weak one.
The form with the lowest held-out log loss over `folds` folds wins (the simpler within
`SIMPLER_WITHIN` of it: noise should not buy parameters), and is refitted on all the
examples; its out-of-fold probabilities are returned too, for choosing an abstention
threshold on predictions the fit never saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

from ..calibration import Adjustment

FORMS = ("none", "temperature", "bias", "matrix")
_PRIORED = ("bias", "matrix")  # the forms whose prior's strength is chosen
SIMPLER_WITHIN = 1e-3  # nats of held-out log loss a simpler form may lose and still win
# the bias's prior strengths tried, strongest first: a penalty of r * sum(bias^2) / n on
# the mean log loss, a prior sd of 1 / sqrt(2 r) nats (0.18 to 5.7): a small model's own
# prior over 77 intents needs biases of several nats (docs/experiments.md, 2026-12-07)
RIDGES = (16.0, 4.0, 1.0, 0.25, 0.0625, 0.015625)
_TINY = 1e-300


@dataclass(frozen=True, slots=True)
class Fitted:
    adjustment: Adjustment
    cv_log_loss: dict[str, float]  # held-out log loss of each form tried (the bias's best)
    held_out: np.ndarray  # out-of-fold probabilities of the chosen form (n x K)
    ridge: float | None = None  # the prior's strength, where the bias or matrix form won


def log_probs(probabilities: Sequence[Sequence[float]]) -> np.ndarray:
    return np.log(np.maximum(np.asarray(probabilities, dtype=np.float64), _TINY))


def fit_branch(logp: np.ndarray, gold: np.ndarray, answers: Sequence[str], folds: int = 5,
               seed: int = 0, forms: Sequence[str] = FORMS,
               ridges: Sequence[float] = RIDGES) -> Fitted:
    """logp: the model's log-probabilities (n x K, answers in `answers` order); gold: the
    right answer's index per example; ridges: the prior strengths to choose from."""
    gold = np.asarray(gold)
    n = len(gold)
    folds = min(folds, n)
    fold_of = np.random.default_rng(seed).permutation(n) % folds if folds > 1 else None
    tried = [(form, r) for form in forms for r in (ridges if form in _PRIORED else (0.0,))]
    losses, held = {}, {}
    for form, ridge in tried if fold_of is not None else ():
        out = np.empty_like(logp)
        for k in range(folds):
            test = fold_of == k
            params = _fit(form, logp[~test], gold[~test], ridge)
            out[test] = _probabilities(params, logp[test])
        held[form, ridge], losses[form, ridge] = out, _log_loss(out, gold)
    least = min(losses.values(), default=0.0)
    best = next((t for t in tried if t in losses and losses[t] <= least + SIMPLER_WITHIN),
                ("none", 0.0))
    params = _fit(best[0], logp, gold, best[1])
    a, bias, weights = params
    adjustment = Adjustment(
        1.0 / a, {name: float(b) for name, b in zip(answers, bias) if b}, best[0],
        {name: {of: float(w) for of, w in zip(answers, row) if w}
         for name, row in zip(answers, weights) if row.any()})
    by_form = {}
    for (form, _), loss in losses.items():
        by_form[form] = min(loss, by_form.get(form, loss))
    return Fitted(adjustment, by_form, held.get(best, _probabilities(params, logp)),
                  best[1] if best[0] in _PRIORED else None)


def contextual(probabilities: Sequence[Sequence[float]], answers: Sequence[str]) -> Adjustment:
    """Calibrate Before Use (Zhao et al., 2021): the model's mean answer to content-free
    texts estimates its prior over the answers; dividing it out is a bias of -log prior."""
    prior = np.mean(np.asarray(probabilities, dtype=np.float64), axis=0)
    bias = -np.log(np.maximum(prior / prior.sum(), _TINY))
    bias -= bias[0]  # only differences matter: the first answer's bias is 0
    return Adjustment(1.0, {name: float(b) for name, b in zip(answers, bias) if b},
                      "contextual")


Params = tuple[float, np.ndarray, np.ndarray]  # inverse temperature, bias, weights


def _fit(form: str, logp: np.ndarray, gold: np.ndarray, ridge: float) -> Params:
    """(inverse temperature a, bias per answer, K x K weights) minimising the mean log loss
    plus the prior's penalty on the bias and the weights."""
    n, k = len(gold), logp.shape[1]
    if form == "none" or n == 0:
        return 1.0, np.zeros(k), np.zeros((k, k))
    n_bias = k - 1 if form in _PRIORED else 0
    n_weights = k * k if form == "matrix" else 0
    onehot = np.eye(k)[gold]
    ridge = ridge / n

    def unpack(theta: np.ndarray) -> Params:
        bias = np.concatenate([[0.0], theta[1:1 + n_bias]]) if n_bias else np.zeros(k)
        weights = theta[1 + n_bias:].reshape(k, k) if n_weights else np.zeros((k, k))
        return np.exp(theta[0]), bias, weights

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        params = unpack(theta)
        a, logq = params[0], _log_softmax(_logits(params, logp))
        residual = (np.exp(logq) - onehot) / n  # d loss / d z
        value = -np.mean(logq[np.arange(n), gold]) + ridge * np.sum(theta[1:] ** 2)
        grad = [[a * np.sum(residual * logp)]]
        if n_bias:
            grad.append(residual.sum(axis=0)[1:])
        if n_weights:
            grad.append((residual.T @ logp).ravel())
        return value, np.concatenate(grad) + 2 * ridge * np.concatenate([[0.0], theta[1:]])

    theta = minimize(loss, np.zeros(1 + n_bias + n_weights), jac=True, method="L-BFGS-B").x
    return unpack(theta)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def _logits(params: Params, logp: np.ndarray) -> np.ndarray:
    a, bias, weights = params
    if not weights.any():  # no n x K x K product for the forms without weights
        return a * logp + bias
    return a * logp + logp @ weights.T + bias


def _probabilities(params: Params, logp: np.ndarray) -> np.ndarray:
    return np.exp(_log_softmax(_logits(params, logp)))


def _log_loss(probabilities: np.ndarray, gold: np.ndarray) -> float:
    return float(-np.mean(np.log(np.maximum(probabilities[np.arange(len(gold)), gold],
                                            1e-12))))

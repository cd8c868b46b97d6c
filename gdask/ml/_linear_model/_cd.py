"""Coordinate descent for the elastic net on the Gram matrix (host, numba).

Minimises ``1/2 w^T Q w - q^T w + alpha ||w||_1 + beta/2 ||w||^2 (+ 1/2 y^T y)`` (``Q = X^T X``,
``q = X^T y`` of the centered, weighted data: the Gram matrix all-gathered from the blocks), the
problem scikit-learn's Lasso and ElasticNet solve with ``alpha = n alpha' l1_ratio`` and
``beta = n alpha' (1 - l1_ratio)``. Cyclic (or random) coordinate updates with soft thresholding,
the duality gap as the stopping criterion (checked when the largest relative coordinate change
falls below ``tol``, the gap against ``tol * y^T y``) and Gap Safe screening (Fercoq, Gramfort &
Salmon 2015, Ndiaye et al. 2017): the iterates and stopping rule of scikit-learn's solver.
"""

from __future__ import annotations

import threading

import numpy as np
from numba import njit

__all__ = ["CD_LOCK", "cd_gram", "enet_gap"]

#: numba compiles a kernel on its first call; two threads compiling at once fail ("no compiled object
#: yet"): callers hold this lock (the solve is short next to the pass over the data)
CD_LOCK = threading.Lock()


@njit(cache=True)
def enet_gap(w, alpha, beta, Qw, q, y_norm2, XtA, positive):
    """``(duality gap, dual norm of X^T R - beta w)``; fills ``XtA``."""
    d = w.shape[0]
    w_l2 = 0.0
    if beta > 0:
        w_l2 = np.dot(w, w)
    q_w = np.dot(q, w)
    r_norm2 = y_norm2 + np.dot(w, Qw) - 2.0 * q_w
    ry = y_norm2 - q_w
    if alpha == 0 and positive:
        # no L1 term but w >= 0: the squared norm of the projected gradient (0 exactly at the optimum)
        dual = 0.0
        for j in range(d):
            XtA[j] = q[j] - Qw[j] - beta * w[j]
            pg = w[j] - max(w[j] + XtA[j], 0.0)
            dual += pg * pg
        return dual, dual
    if alpha == 0:
        dual = 0.0
        for j in range(d):
            XtA[j] = q[j] - Qw[j]
            dual += XtA[j] * XtA[j]
        if beta == 0:
            return dual, dual  # least squares: the gradient's squared norm
        return r_norm2 + 0.5 * beta * w_l2 - ry + dual / (2.0 * beta), dual
    dual = -np.inf if positive else 0.0
    l1 = 0.0
    for j in range(d):
        XtA[j] = q[j] - Qw[j] - beta * w[j]
        v = XtA[j] if positive else abs(XtA[j])
        if v > dual:
            dual = v
        l1 += abs(w[j])
    primal = 0.5 * (r_norm2 + beta * w_l2) + alpha * l1
    scale = alpha / dual if dual > alpha else 1.0
    dual_obj = -0.5 * scale * scale * (r_norm2 + beta * w_l2) + scale * ry
    return primal - dual_obj, dual


@njit(cache=True)
def _screen(w, alpha, beta, Q, Qw, XtA, dual, gap, active, excluded):
    """Gap Safe rule: drop the features whose coefficient is provably 0 at the optimum; the count
    of those left (listed first in ``active``)."""
    d = w.shape[0]
    radius = np.sqrt(2.0 * abs(gap)) / alpha
    n_active = 0
    for j in range(d):
        if excluded[j]:
            continue
        if Q[j, j] == 0:
            w[j] = 0.0
            excluded[j] = True
            continue
        xj_theta = XtA[j] / max(alpha, dual)
        if (1.0 - abs(xj_theta)) / np.sqrt(Q[j, j] + beta) <= radius:
            active[n_active] = j
            n_active += 1
        else:
            if w[j] != 0:
                Qw -= w[j] * Q[j]
                w[j] = 0.0
            excluded[j] = True
    return n_active


@njit(cache=True)
def _sweep(w, alpha, beta, Q, q, Qw, active, n_active, positive, random, screening):
    """One pass over the active coordinates: ``(largest |change|, largest |w_j|)``."""
    w_max = 0.0
    dw_max = 0.0
    for f in range(n_active):
        j = np.random.randint(0, n_active) if random else f
        if screening:
            j = active[j]
        if Q[j, j] == 0.0:
            continue
        wj = w[j]
        tmp = q[j] - Qw[j] + wj * Q[j, j]
        if positive and tmp < 0:
            w[j] = 0.0
        else:
            w[j] = np.sign(tmp) * max(abs(tmp) - alpha, 0.0) / (Q[j, j] + beta)
        if w[j] != wj:
            Qw += (w[j] - wj) * Q[j]
        dw_max = max(dw_max, abs(w[j] - wj))
        w_max = max(w_max, abs(w[j]))
    return dw_max, w_max


@njit(cache=True)
def cd_gram(w, alpha, beta, Q, q, y_norm2, max_iter, tol, positive, random, seed, screening):
    """Coordinate descent from ``w`` (updated in place): ``(w, gap, scaled tol, iterations, converged)``."""
    d = w.shape[0]
    if random:
        np.random.seed(seed)
    Qw = Q @ w
    XtA = np.zeros(d)
    if alpha == 0:
        screening = False
    d_w_tol = tol
    tol = tol * y_norm2
    gap, dual = enet_gap(w, alpha, beta, Qw, q, y_norm2, XtA, positive)
    if 0 <= gap <= tol:
        return w, gap, tol, 0, True
    active = np.arange(d)
    excluded = np.zeros(d, dtype=np.bool_)
    n_active = d
    if screening:
        n_active = _screen(w, alpha, beta, Q, Qw, XtA, dual, gap, active, excluded)
    for it in range(max_iter):
        dw_max, w_max = _sweep(w, alpha, beta, Q, q, Qw, active, n_active, positive, random, screening)
        if w_max == 0.0 or dw_max / w_max <= d_w_tol or it == max_iter - 1:
            gap, dual = enet_gap(w, alpha, beta, Qw, q, y_norm2, XtA, positive)
            if gap <= tol:
                return w, gap, tol, it + 1, True
            if screening:
                n_active = _screen(w, alpha, beta, Q, Qw, XtA, dual, gap, active, excluded)
    return w, gap, tol, max_iter, False

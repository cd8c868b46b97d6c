"""LSTM regression and classification over sequence GDataSets (scikit-learn API), trained
data-parallel on the devices with PyTorch (``pip install 'gdask[torch]'``).

The sequences ``(n, T, f)`` live in device memory as a 3-D GDataSet (time-major blocks, the layout
cuDNN's LSTM reads) for the whole fit; each device worker trains a replica of the model on the rows it
holds and the gradients are all-reduced every step (:mod:`gdask.ml._lstm._torch`). After the first
epoch nothing is copied from the host when the data fits on the devices; data larger than the
devices streams through the window cache. This module does not import torch: the estimators do, when
they fit or predict.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import replace
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin

from gdask import config
from gdask._compat import scheduler_workers
from gdask.devices import array_namespace, module_available, to_numpy
from gdask.gdataset import GDataSet, Progress, default_block_rows, from_array, run_loop
from gdask.gdataset.engine import device_memories
from gdask.ml._base import DeviceEstimatorMixin, Input, host_array, shared_docs

__all__ = ["LSTMClassifier", "LSTMRegressor"]

_OPTIMIZERS = ("adam", "sgd")
#: blocks per device worker when X is split here (finer blocks: shares closer to the devices' speeds)
_BLOCKS_PER_DEVICE = 4


def _require_torch() -> Any:
    """The ``gdask.ml._lstm._torch`` module; ImportError naming the extra when torch is missing."""
    if not module_available("torch"):
        raise ImportError("gdask's LSTM estimators need PyTorch, which is not installed: "
                          "pip install 'gdask[torch]'")
    from gdask.ml._lstm import _torch

    return _torch


def _add_feature_axis(b: Any) -> Any:
    """``(rows, T)`` -> ``(rows, T, 1)``: a view, already time-major for a Fortran-ordered block."""
    return b[:, :, None]


def _on_a_cluster() -> bool:
    """Whether a fit here runs on a Dask cluster (a current Client), not in this one process."""
    try:
        from distributed import default_client

        default_client()
    except (ImportError, ValueError):
        return False
    return True


def _gradients() -> str:
    """How a fit on a cluster sums each step's gradient: config ``gdask.ml.torch.gradients``."""
    value = str(config.get("ml.torch.gradients", "blocks"))
    if value not in ("blocks", "workers"):
        raise ValueError(f"gdask.ml.torch.gradients must be 'blocks' or 'workers', got {value!r}")
    return value


def _n_devices() -> int:
    try:
        from distributed import default_client

        return max(1, len(scheduler_workers(default_client())))
    except (ImportError, ValueError):
        return 1


class _LSTMBase(DeviceEstimatorMixin, BaseEstimator):
    """What the regressor and the classifier share: parameters, input handling, the fit."""

    _task = "regression"
    _ints_to = np.float32  # non-float sequences are trained in float32

    def __init__(self, hidden_size: int = 32, *, num_layers: int = 1, dropout: float = 0.0,
                 bidirectional: bool = False, epochs: int = 20, batch_size: int = 128, lr: float = 1e-3,
                 optimizer: str = "adam", weight_decay: float = 0.0, random_state: Any = None, verbose: int = 0,
                 validation_fraction: float = 0.1, early_stopping: bool = False, n_iter_no_change: int = 10,
                 tol: float = 1e-4, block_rows: int | None = None, callback: Any = None,
                 gpu: float | None = None, memory: Any = None, job_name: str | None = None,
                 output_type: str | None = None) -> None:
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.dropout = dropout
        self.bidirectional = bidirectional
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.optimizer = optimizer
        self.weight_decay = weight_decay
        self.random_state = random_state
        self.verbose = verbose
        self.validation_fraction = validation_fraction
        self.early_stopping = early_stopping
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.block_rows = block_rows
        self.callback = callback
        self.gpu = gpu
        self.memory = memory
        self.job_name = job_name
        self.output_type = output_type

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        tags.input_tags.three_d_array = True
        return tags

    # -- validation ------------------------------------------------------------------------------------
    def _check_params(self) -> None:
        def integer(name: str, low: int) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")

        def real(name: str, low: float, high: float | None = None, *, open_low: bool = False) -> None:
            v = getattr(self, name)
            ok = not isinstance(v, bool) and isinstance(v, numbers.Real) and (v > low if open_low else v >= low)
            if ok and high is not None:
                ok = v < high
            if not ok:
                rng = f"{'>' if open_low else '>='} {low}" + ("" if high is None else f" and < {high}")
                raise ValueError(f"{name} must be a number {rng}, got {v!r}")

        integer("hidden_size", 1)
        integer("num_layers", 1)
        integer("epochs", 0)
        integer("batch_size", 1)
        integer("n_iter_no_change", 1)
        real("dropout", 0.0, 1.0)
        real("lr", 0.0, open_low=True)
        real("weight_decay", 0.0)
        real("tol", 0.0)
        real("validation_fraction", 0.0, 1.0, open_low=True)
        if self.optimizer not in _OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {_OPTIMIZERS}, got {self.optimizer!r}")
        if self.block_rows is not None:
            integer("block_rows", 1)
        if self.callback is not None and not callable(self.callback):
            raise ValueError(f"callback must be callable or None, got {type(self.callback).__name__}")

    def _sequences(self, X: Any, reset: bool) -> tuple[Any, Input]:
        """(sequences, the adapted input): a host ``(n, T, f)`` array, a device (CuPy) one, or a
        GDataSet (lazy input, cuDF); a 2-D X is ``n`` univariate sequences ``(n, T, 1)``."""
        inp = self._input(X, reset=reset, ndim=None, dtype=(np.float32, np.float64), allow_nd=True, features=False)
        x = inp.data
        if x.ndim == 2:
            x = x.map_blocks(_add_feature_axis, name="add-feature-axis") if isinstance(x, GDataSet) else x[:, :, None]
        if x.ndim != 3:
            raise ValueError(f"X must be sequences of shape (n_samples, n_timesteps, n_features) or "
                             f"(n_samples, n_timesteps); got shape {x.shape}")
        if x.shape[0] < 1 or x.shape[1] < 1 or x.shape[2] < 1:
            raise ValueError(f"X has shape {x.shape}: it needs at least one sample, time step and feature")
        if reset:
            self.input_shape_ = tuple(int(s) for s in x.shape[1:])
            if not inp.kind.host:
                self.n_features_in_ = int(x.shape[1])
        elif tuple(x.shape[1:]) != self.input_shape_:
            raise ValueError(f"X has sequences of shape {tuple(x.shape[1:])}, but {type(self).__name__} was "
                             f"fitted on sequences of shape {self.input_shape_} (time steps, features)")
        return x, inp

    def _blocked(self, x: Any) -> GDataSet:
        if isinstance(x, GDataSet):
            return x
        n, T, f = x.shape
        rows = self.block_rows
        if rows is None:
            rows = min(math.ceil(n / (_BLOCKS_PER_DEVICE * _n_devices())),
                       default_block_rows(n, T * f * x.dtype.itemsize))
        return from_array(x, block_rows=max(1, int(rows)))

    def _seed(self, reset: bool) -> int:
        """The fit's seed: an int ``random_state`` itself, else drawn from it (``None``: fresh)."""
        if reset or not hasattr(self, "_seed_"):
            rs = self.random_state
            if isinstance(rs, numbers.Integral) and not isinstance(rs, bool):
                self._seed_ = int(rs)
            else:
                from sklearn.utils import check_random_state

                self._seed_ = int(check_random_state(rs).randint(np.iinfo(np.int32).max))
        return self._seed_

    # -- fit ---------------------------------------------------------------------------------------------
    def fit(self, X: Any, y: Any) -> _LSTMBase:
        """Train the model for ``epochs`` epochs (fewer when the stopping rule ends it).

        Parameters
        ----------
        X : array-like, CuPy array, dask array or GDataSet of shape (n_samples, n_timesteps, n_features)
            Sequences; a 2-D X is read as univariate sequences ``(n_samples, n_timesteps)``.
        y : array-like, GDataSet or dask array of shape (n_samples,) or (n_samples, n_outputs)
            Targets (regressor) or class labels (classifier).

        Returns
        -------
        self
        """
        self._check_params()
        with self._job():
            return self._fit(X, y, partial=False)

    def partial_fit(self, X: Any, y: Any, **kwargs: Any) -> _LSTMBase:
        """One more epoch over ``X``, ``y`` from the current model and optimizer state (the first call
        starts from the initial model)."""
        self._check_params()
        with self._job():
            return self._fit(X, y, partial=True, **kwargs)

    def _fit(self, X: Any, y: Any, *, partial: bool, classes: Any = None) -> _LSTMBase:
        lt = _require_torch()
        if y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target y is None")
        first = not (partial and hasattr(self, "_state"))
        x, _ = self._sequences(X, reset=first)
        G = self._blocked(x)
        n = G.shape[0]
        yh = host_array(y)
        codes, n_outputs = self._targets(yh, n, first, classes)
        Y = from_array(codes if codes.dtype.kind in "iu" else codes.astype(G.dtype, copy=False),
                       block_rows=G.row_blocks)
        spec = lt.ModelSpec(n_features=int(G.shape[2]), hidden_size=int(self.hidden_size),
                            num_layers=int(self.num_layers), dropout=float(self.dropout),
                            bidirectional=bool(self.bidirectional), n_outputs=n_outputs, dtype=str(G.dtype))
        seed = self._seed(reset=first)
        if first:
            state = lt.TrainState(lt.initial_state(spec, seed))
            self.loss_curve_, self.history_, self.h2d_bytes_, self.epoch_times_ = [], [], [], []
            self.validation_scores_ = [] if self.early_stopping else None
            self.restarts_ = 0
        else:
            if self._spec != spec:
                raise ValueError(f"partial_fit got data that does not fit the model: {spec} vs {self._spec}")
            state = replace(self._state, stopped=False)
        n_val = math.ceil(self.validation_fraction * n) if self.early_stopping and not partial else 0
        if n_val and n - n_val < 1:
            raise ValueError(f"validation_fraction={self.validation_fraction} leaves no training rows of {n}")
        epochs = state.epoch + 1 if partial else int(self.epochs)
        trainer = lt.LSTMTrainer(spec, self._task, G.row_blocks, epochs=epochs, batch_size=int(self.batch_size),
                                 lr=float(self.lr), optimizer=self.optimizer, weight_decay=float(self.weight_decay),
                                 seed=seed, n_validation=n_val, early_stopping=bool(self.early_stopping),
                                 n_iter_no_change=int(self.n_iter_no_change), tol=float(self.tol),
                                 row_bytes=int(math.prod(G.shape[1:]) * G.dtype.itemsize),
                                 device_memory=min(device_memories(), default=None),
                                 combine=_gradients() if _on_a_cluster() else "workers")
        progress = Progress(self.verbose, self.callback, total=epochs, desc=type(self).__name__)
        res = run_loop(trainer, {"X": G, "Y": Y}, state, progress=progress)
        self._spec, self._state = spec, res.state
        for rec in res.history:
            if "loss" not in rec:
                continue
            self.loss_curve_.append(float(rec["loss"]))
            self.h2d_bytes_.append(int(rec.get("h2d_bytes", 0)))
            self.epoch_times_.append(float(rec.get("seconds", 0.0)))
            if self.validation_scores_ is not None and "validation_score" in rec:
                self.validation_scores_.append(float(rec["validation_score"]))
        self.history_.extend(res.history)
        self.restarts_ += res.restarts
        self.fit_mode_ = res.mode
        self.n_iter_ = int(res.state.epoch)
        if self.early_stopping and not partial:
            self.best_validation_score_ = res.state.best
            self.best_loss_ = None
        else:
            self.best_loss_ = res.state.best
        params = res.state.best_model if (self.early_stopping and not partial
                                          and res.state.best_model is not None) else res.state.model
        self._params = params
        return self

    # -- predict ------------------------------------------------------------------------------------------
    def _outputs(self, X: Any) -> tuple[Any, Input, GDataSet | None]:
        """(model outputs of shape (n_samples, n_outputs): NumPy, or CuPy for CuPy input; the
        adapted input; the GDataSet they came from, if any)."""
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self, "n_outputs_")
        lt = _require_torch()
        x, inp = self._sequences(X, reset=False)
        spec = self._spec
        if inp.kind.host:
            return lt.predict_host(spec, self._params, x.astype(spec.dtype, copy=False)), inp, None
        if not isinstance(x, GDataSet):
            flat = lt.flat_params(spec, self._params)
            return lt.predict_block(x.astype(spec.dtype, copy=False), spec, flat), inp, None
        G = x if x.dtype == np.dtype(spec.dtype) else x.astype(spec.dtype)
        out = G.map_blocks(lt.predict_block, spec, lt.flat_params(spec, self._params), dtype=np.dtype(spec.dtype),
                           ncols=spec.n_outputs, name="lstm-predict")
        return to_numpy(out.compute()), inp, G

    def _host_y(self, y: Any) -> Any:
        return host_array(y)


@shared_docs
class LSTMRegressor(RegressorMixin, _LSTMBase):
    """Sequence regression with an LSTM (``torch.nn.LSTM``, cuDNN on GPUs) over device-resident
    blocks, trained data-parallel on every device worker; scikit-learn API.

    The model is ``nn.LSTM`` over the time steps and a linear layer on the last layer's final hidden
    state; the loss is the mean squared error (``nn.MSELoss``). Each step is one global mini-batch of
    ``batch_size`` rows, split among the workers by where its rows live (blocks are placed in
    proportion to the devices' measured speeds, so a slow device gets a smaller share). Each worker
    computes one gradient per block it holds, these are all-reduced with ``torch.distributed``
    (gloo, NCCL on CUDA) and added in block order, and every replica takes the same step: with the
    same seed, data and batch size the loss curve is a single-process loop's up to rounding, and the
    same bits however the blocks are placed (see :mod:`gdask.ml._lstm._torch` for the epoch order;
    config ``gdask.ml.torch.gradients: workers`` takes one gradient per worker instead of one per
    block: fewer backward passes, bits that depend on the placement).
    The epoch loop runs on the workers, one task per worker for the whole fit; without a Client it
    runs in this process on the local device, one gradient per batch: a plain PyTorch loop's bits.
    Data larger than the devices is streamed through the window cache in windows of blocks that fit
    on one device, rows shuffled within each window: an order that does not depend on the placement
    either. A worker lost during the fit restarts it on the workers from the last finished epoch,
    with the same bits as a fit that lost none, on the devices or streamed (at most config
    ``gdask.engine.max-restarts`` times, then a ``CollectiveError``).

    Parameters
    ----------
    hidden_size : int, default 32
        Hidden units of each LSTM layer.
    num_layers : int, default 1
        Stacked LSTM layers.
    dropout : float, default 0.0
        Dropout between LSTM layers (as ``nn.LSTM``: no effect with one layer). On a cluster the
        masks are seeded per epoch, step and block (whoever holds it), so with dropout a
        data-parallel fit is not a single process's.
    bidirectional : bool, default False
    epochs : int, default 20
        Passes over the training rows at most (the stopping rule may end the fit earlier).
    batch_size : int, default 128
        Rows of one global mini-batch (all workers together).
    lr : float, default 1e-3
        Learning rate.
    optimizer : {"adam", "sgd"}, default "adam"
    weight_decay : float, default 0.0
        L2 penalty of the optimizer.
    random_state : int, RandomState or None
        Seeds the initial weights, the epochs' shuffles and the validation split: an int is the seed
        itself (``torch.manual_seed(seed)`` before the model is built, ``np.random.default_rng([seed,
        epoch])`` for the epoch's order), a RandomState or None draws one.
    verbose : int, default 0
        Print one line per epoch (loss, validation score, host->device bytes).
    validation_fraction : float, default 0.1
        Share of the rows set aside to score each epoch when ``early_stopping``.
    early_stopping : bool, default False
        Stop once the validation R^2 did not improve by ``tol`` for more than ``n_iter_no_change``
        epochs and keep the best epoch's weights; without it the same rule watches the training loss
        (as scikit-learn's MLP).
    n_iter_no_change : int, default 10
    tol : float, default 1e-4
    block_rows : int, optional
        Rows per block when X is split here (not a GDataSet); default: 4 blocks per device worker.
    callback : callable, optional
        ``callback(record)`` after every epoch (``epoch``, ``loss``, ``h2d_bytes``, ``seconds``,
        ``shares`` = ``{worker address: training rows it computed}``, ...).
    {job_parameters}
    {output_type_parameter}

    Attributes
    ----------
    loss_curve_ : list of float
        Mean training loss of each epoch (over its mini-batches, as they were trained).
    validation_scores_ : list of float or None
        Validation R^2 of each epoch (``early_stopping`` only).
    best_loss_, best_validation_score_ : float
    n_iter_ : int
        Epochs trained.
    h2d_bytes_ : list of int
        Bytes copied host->device by gdask on all devices in each epoch (0 once the data is on the
        devices; the window cache's copies when the data is larger).
    epoch_times_ : list of float
        Seconds of each epoch.
    history_ : list of dict
        The per-epoch records (as given to ``callback``).
    fit_mode_ : str
        "workers" (a Client's device workers) or "local" (no Client: this process).
    restarts_ : int
        Times the fit resumed from its last finished epoch after losing a worker.
    input_shape_ : tuple
        ``(n_timesteps, n_features)`` of the sequences.
    n_features_in_ : int
        ``X.shape[1]`` (the time steps), as scikit-learn counts a 3-D X's features.
    n_outputs_ : int

    Examples
    --------
    >>> X = gdask.from_array(windows.astype("float32"))           # (n, 20, 1)   # doctest: +SKIP
    >>> reg = gdask.ml.LSTMRegressor(hidden_size=16, epochs=20, random_state=0).fit(X, y)  # doctest: +SKIP
    >>> reg.score(X_test, y_test)                                                 # doctest: +SKIP
    """

    _task = "regression"

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        tags.regressor_tags.poor_score = True  # a few epochs of stochastic training
        return tags

    def _targets(self, y: Any, n: int, first: bool, classes: Any) -> tuple[np.ndarray, int]:
        from sklearn.utils.validation import check_array

        y = check_array(y, ensure_2d=False, dtype=[np.float64, np.float32], input_name="y")
        if y.ndim not in (1, 2):
            raise ValueError(f"y must have shape (n_samples,) or (n_samples, n_outputs), got {y.shape}")
        if y.shape[0] != n:
            raise ValueError(f"Found input variables with inconsistent numbers of samples: [{n}, {y.shape[0]}]")
        k = 1 if y.ndim == 1 else y.shape[1]
        if first:
            self.n_outputs_ = k
            self._y_ndim = y.ndim
        elif k != self.n_outputs_:
            raise ValueError(f"y has {k} outputs, but the model was fitted with {self.n_outputs_}")
        return y, k

    def predict(self, X: Any) -> Any:
        """Predicted targets, shape (n_samples,) or (n_samples, n_outputs) as ``y`` was: NumPy (CuPy
        for CuPy input; see ``output_type``)."""
        out, inp, G = self._outputs(X)
        return self._to_output(out[:, 0] if self._y_ndim == 1 else out, inp.kind, G)

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """R^2 of the predictions (``y`` and weights may be GDataSets or dask arrays)."""
        from sklearn.metrics import r2_score

        w = None if sample_weight is None else self._host_y(sample_weight)
        return float(r2_score(self._host_y(y), to_numpy(self.predict(X)), sample_weight=w))


class LSTMClassifier(ClassifierMixin, _LSTMBase):
    """Sequence classification with an LSTM over device-resident blocks, trained data-parallel on
    every device worker; scikit-learn API.

    As :class:`LSTMRegressor`, with a linear head of one logit per class and the cross-entropy loss
    (``nn.CrossEntropyLoss``); ``predict_proba`` is the softmax of the logits and early stopping
    watches the validation accuracy. Labels may be any values ``np.unique`` sorts.

    Parameters
    ----------
    See :class:`LSTMRegressor`.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    loss_curve_, validation_scores_, n_iter_, h2d_bytes_, epoch_times_, history_, fit_mode_, restarts_
        As :class:`LSTMRegressor` (validation scores are accuracies).
    """

    _task = "classification"

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.poor_score = True  # a few epochs of stochastic training
        tags.classifier_tags.multi_label = False
        return tags

    def _targets(self, y: Any, n: int, first: bool, classes: Any) -> tuple[np.ndarray, int]:
        from sklearn.utils.multiclass import check_classification_targets
        from sklearn.utils.validation import column_or_1d

        y = column_or_1d(y, warn=True)
        if y.shape[0] != n:
            raise ValueError(f"Found input variables with inconsistent numbers of samples: [{n}, {y.shape[0]}]")
        check_classification_targets(y)
        if first:
            labels = np.unique(y) if classes is None else np.unique(np.asarray(classes))
            if len(labels) < 2:
                raise ValueError("LSTMClassifier needs samples of at least 2 classes in the data, but the data "
                                 f"contains only one class: {labels[0]!r}")
            self.classes_ = labels
            self.n_outputs_ = len(labels)
        codes = np.searchsorted(self.classes_, y)
        codes = np.minimum(codes, len(self.classes_) - 1)
        if not np.array_equal(self.classes_[codes], y):
            unknown = sorted(set(np.asarray(y).tolist()) - set(self.classes_.tolist()))
            raise ValueError(f"y contains labels {unknown[:5]} that are not in classes_ {self.classes_.tolist()}; "
                             "pass every class to the first partial_fit (classes=...)")
        return codes.astype(np.int64), len(self.classes_)

    def partial_fit(self, X: Any, y: Any, classes: Any = None) -> LSTMClassifier:
        """One more epoch (see :meth:`LSTMRegressor.partial_fit`); ``classes`` (every label of the
        whole data) is needed on the first call, as scikit-learn's ``partial_fit``."""
        if not hasattr(self, "_state") and classes is None:
            raise ValueError("classes must be passed on the first call to partial_fit.")
        return super().partial_fit(X, y, classes=classes)

    def predict_proba(self, X: Any) -> Any:
        """Class probabilities (softmax of the logits), shape (n_samples, n_classes): NumPy (CuPy for
        CuPy input; see ``output_type``)."""
        z, inp, G = self._outputs(X)
        xp = array_namespace(z)
        z = z - xp.max(z, axis=1, keepdims=True)
        e = xp.exp(z)
        return self._to_output(e / xp.sum(e, axis=1, keepdims=True), inp.kind, G)

    def predict_log_proba(self, X: Any) -> Any:
        """Logarithm of :meth:`predict_proba`."""
        p = self.predict_proba(X)
        return array_namespace(p).log(p)

    def predict(self, X: Any) -> Any:
        """Class labels: ``classes_[argmax]`` of the logits (NumPy; CuPy for CuPy input and numeric
        classes; see ``output_type``)."""
        z, inp, G = self._outputs(X)
        idx = to_numpy(array_namespace(z).argmax(z, axis=1))
        return self._to_output(self.classes_[idx], inp.kind, G)

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Mean accuracy (``y`` and weights may be GDataSets or dask arrays)."""
        from sklearn.metrics import accuracy_score

        w = None if sample_weight is None else self._host_y(sample_weight)
        return float(accuracy_score(self._host_y(y), self.predict(X), sample_weight=w))

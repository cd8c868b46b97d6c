"""The torch side of gdask's LSTM estimators: the model, the data-parallel trainer on the iteration
engine, and prediction on blocks.

Imported only when an LSTM estimator fits or predicts (``import gdask.ml`` does not import torch).

Training is data-parallel: one model replica per device worker, the epoch loop in one task per
worker (the iteration engine's loop on the workers). Every step each worker computes, for each of its
blocks, the gradient of the SUM of the per-row losses over the rows of the global mini-batch that live
in that block; those per-block partials are all-reduced with ``torch.distributed`` (gloo; NCCL on CUDA
devices) in a process group made for the fit, each into its block's own slot, then added in block
order, divided by the global batch size, and every replica takes the same optimizer step. So with the
same seed, data and global batch the loss curve is a single process's (up to the rounding of the
sum's order), and it is the same bits whichever worker holds which block: a fit resumed after a lost
worker, on fewer workers, continues exactly as it would have gone (data on the devices).

The epoch's order: data that fits on the devices is shuffled globally, ``np.random.default_rng([seed,
epoch]).permutation`` over the training rows, cut into global batches of ``batch_size`` rows (the last
one smaller), whoever holds the rows; the validation rows of ``early_stopping`` are the first
``ceil(validation_fraction * n)`` of ``np.random.default_rng([seed, VALIDATION_STREAM]).permutation(n)``.
Data larger than the devices is read through the window cache in windows of blocks that fit on one
device (:class:`~gdask.ml._lstm._parallel.StreamPlan`): the epoch shuffles rows within each window
and walks the windows forward on even epochs and backward on odd ones, so the blocks left on the
devices are the next needed; global batches of that order, as above. The window size comes from the
smallest device's memory when the fit starts and stays for the fit: the order depends on the data,
the seed and that size, never on the placement, and a streamed fit has the same bits however its
blocks are placed and after a lost worker (not those of the same data on the devices: another order).
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from gdask.devices import asarray_like, current_device, to_numpy
from gdask.gdataset import IterativeAlgorithm, LoopContext, time_major
from gdask.ml._lstm._parallel import GlobalPlan, ProcessGroup, StreamPlan, training_malloc

__all__ = ["ModelSpec", "SequenceModel", "LSTMTrainer", "TrainState", "initial_state", "predict_block",
           "predict_host", "as_tensor", "VALIDATION_STREAM"]

#: the second seed word of the validation split (epochs use 0, 1, 2, ...)
VALIDATION_STREAM = 1 << 30
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class ModelSpec:
    """What the model is: everything needed to build it again anywhere."""

    n_features: int
    hidden_size: int
    num_layers: int
    dropout: float
    bidirectional: bool
    n_outputs: int
    dtype: str = "float32"


class SequenceModel(nn.Module):
    """``nn.LSTM`` (time-major input ``(T, batch, f)``, as cuDNN takes it) and a linear head on the
    last layer's final hidden state (both directions' when bidirectional)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.bidirectional = spec.bidirectional
        self.lstm = nn.LSTM(spec.n_features, spec.hidden_size, num_layers=spec.num_layers,
                            dropout=spec.dropout if spec.num_layers > 1 else 0.0,
                            bidirectional=spec.bidirectional)
        self.head = nn.Linear(spec.hidden_size * (2 if spec.bidirectional else 1), spec.n_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, (h, _) = self.lstm(x)
        last = torch.cat([h[-2], h[-1]], dim=1) if self.bidirectional else h[-1]
        return self.head(last)


def build(spec: ModelSpec, params: dict[str, np.ndarray] | None = None, device: Any = "cpu") -> SequenceModel:
    """The model of ``spec`` on ``device`` (with ``params``, a host state dict, when given)."""
    model = SequenceModel(spec).to(dtype=_DTYPES[spec.dtype])
    if params is not None:
        model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in params.items()})
    return model.to(device)


def _host_tree(x: Any) -> Any:
    """A state dict (nested dicts / lists of tensors) with every tensor as a NumPy array."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy().copy()
    if isinstance(x, dict):
        return {k: _host_tree(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_host_tree(v) for v in x)
    return x


def _torch_tree(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x.copy())
    if isinstance(x, dict):
        return {k: _torch_tree(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_torch_tree(v) for v in x)
    return x


def initial_state(spec: ModelSpec, seed: int) -> dict[str, np.ndarray]:
    """The initial parameters from ``seed`` (torch's default initialisation, the global RNG left
    untouched): the same on every replica and in a plain ``torch.manual_seed(seed)`` script that
    builds ``nn.LSTM`` then ``nn.Linear``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = build(spec)
    return _host_tree(model.state_dict())


def as_tensor(x: Any) -> torch.Tensor:
    """A torch tensor on ``x``'s memory, without a copy: ``from_numpy`` for host arrays, DLPack for
    device arrays (CuPy, array-API arrays)."""
    if isinstance(x, np.ndarray):
        with warnings.catch_warnings():  # blocks received from other workers may be read-only: never written
            warnings.filterwarnings("ignore", message=".*not writable.*", category=UserWarning)
            return torch.from_numpy(x)
    return torch.from_dlpack(x)


def torch_device(dev: Any) -> torch.device:
    """The torch device of a gdask device: CUDA device 0 of the worker (its ``CUDA_VISIBLE_DEVICES``
    GPU) for the cuda backend, the CPU for emulated devices."""
    return torch.device("cuda", 0) if getattr(dev, "backend", "") == "cuda" else torch.device("cpu")


# -- the trainer ----------------------------------------------------------------------------------------
@dataclass
class TrainState:
    """A fit's state between epochs (small host data: also its checkpoint): model and optimizer
    state dicts as NumPy arrays, the stopping rule's counters."""

    model: dict  # the parameters (state dict)
    epoch: int = 0  # epochs trained
    optim: dict | None = None  # the optimizer's state dict (None: a fresh optimizer)
    best: float | None = None  # the best training loss (or validation score) so far
    best_model: dict | None = None  # the parameters of the best validation score (early stopping)
    no_improve: int = 0  # epochs without improvement by tol
    stopped: bool = False  # the stopping rule ended the fit


@dataclass
class _Block:
    """One block's tensors on the torch device: ``x`` time-major ``(T, rows, f)``, ``y`` targets."""

    x: torch.Tensor
    y: torch.Tensor
    nbytes: int


class LSTMTrainer(IterativeAlgorithm):
    """Data-parallel mini-batch training on the iteration engine (loop on the workers only).

    The state is a :class:`TrainState`: model and optimizer state dicts as NumPy arrays, the
    early-stopping counters. ``combine`` says how each step's gradient is summed (see ``self.combine``).
    ``ctx.checkpoint`` after every epoch: the fit shows per-epoch progress and resumes from the last
    finished epoch.
    """

    name = "lstm"
    modes = ("workers",)

    def __init__(self, spec: ModelSpec, task: str, row_blocks: tuple[int, ...], *, epochs: int, batch_size: int,
                 lr: float, optimizer: str, weight_decay: float, seed: int, n_validation: int, early_stopping: bool,
                 n_iter_no_change: int, tol: float, row_bytes: int, window_fraction: float = 0.5,
                 device_memory: int | None = None, combine: str = "blocks") -> None:
        if combine not in ("blocks", "workers"):
            raise ValueError(f"combine must be 'blocks' or 'workers', got {combine!r}")
        self.spec = spec
        #: "blocks": each step's gradient is the sum of per-block partials in block order (the same bits
        #: whichever worker holds which block); "workers": one gradient per worker over its rows of the
        #: batch, in the batch's order, summed by the all-reduce (one backward per step and worker, but
        #: the bits depend on the placement; with one worker, a plain single-process loop's bits)
        self.combine = combine
        self.task = task
        self.row_blocks = tuple(int(r) for r in row_blocks)
        self.epochs = int(epochs)
        self.batch_size = int(batch_size)
        self.lr = float(lr)
        self.optimizer = optimizer
        self.weight_decay = float(weight_decay)
        self.seed = int(seed)
        self.n_validation = int(n_validation)
        self.early_stopping = bool(early_stopping)
        self.n_iter_no_change = int(n_iter_no_change)
        self.tol = float(tol)
        self.row_bytes = int(row_bytes)
        #: data larger than the devices: blocks a window of the epoch's order holds (``window_fraction``
        #: of the smallest device's memory, ``device_memory``, when the fit starts: fixed for the fit,
        #: resumes included); without it, one window of every block
        block_bytes = max(1, max(self.row_blocks, default=1) * self.row_bytes)
        self.window_blocks = (max(1, int(float(window_fraction) * device_memory // block_bytes)) if device_memory
                              else max(1, len(self.row_blocks)))

    # -- rows -----------------------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return sum(self.row_blocks)

    def split(self) -> tuple[np.ndarray, np.ndarray]:
        """(training rows, validation rows): sorted global row numbers."""
        n = self.n
        if self.n_validation <= 0:
            return np.arange(n, dtype=np.int64), np.empty(0, np.int64)
        perm = np.random.default_rng([self.seed, VALIDATION_STREAM]).permutation(n)
        return np.sort(perm[self.n_validation:]), np.sort(perm[:self.n_validation])

    def epoch_order(self, epoch: int, train: np.ndarray) -> np.ndarray:
        """The epoch's global order of the training rows (data that fits on the devices)."""
        return train[np.random.default_rng([self.seed, int(epoch)]).permutation(len(train))]

    def steps(self, n_train: int) -> int:
        return max(1, math.ceil(n_train / self.batch_size))

    # -- the model ----------------------------------------------------------------------------------------
    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        if self.optimizer == "adam":
            return torch.optim.Adam(model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        return torch.optim.SGD(model.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    def loss_sum(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The sum over rows of the per-row loss: squared error averaged over the outputs
        (``nn.MSELoss``), or cross-entropy (``nn.CrossEntropyLoss``)."""
        if self.task == "classification":
            return nn.functional.cross_entropy(out, y, reduction="sum")
        y = y.reshape(out.shape)
        return ((out - y) ** 2).mean(dim=1).sum()

    # -- the driver ----------------------------------------------------------------------------------------
    def run(self, state: TrainState, ctx: LoopContext) -> TrainState:
        dev = current_device()
        tdev = torch_device(dev)
        group = ProcessGroup(ctx, tdev)
        try:
            with training_malloc() if ctx.mode == "workers" else contextlib.nullcontext():
                return self._train(state, ctx, dev, tdev, group)
        finally:
            group.close()

    def _train(self, state: TrainState, ctx: LoopContext, dev: Any, tdev: torch.device,
               group: ProcessGroup) -> TrainState:
        """The epochs, from ``state`` to the end (or the stopping rule)."""
        offsets = np.cumsum((0,) + self.row_blocks)
        local = ctx.local()
        model = build(self.spec, state.model, tdev)
        opt = self.make_optimizer(model)
        if state.optim is not None:
            opt.load_state_dict(_torch_tree(state.optim))
        params = [p for p in model.parameters()]
        train, val = self.split()
        cache: dict[int, _Block] = {}
        while state.epoch < self.epochs and not state.stopped:
            epoch = state.epoch
            h2d0 = int(getattr(dev, "bytes_h2d", 0))
            busy = [0.0]
            if ctx.streaming:
                plan = StreamPlan(self.seed, epoch, self.window_blocks, self.batch_size, offsets, train, local)
                ctx.hint(plan.reads)
            else:
                plan = GlobalPlan(self.epoch_order(epoch, train), self.batch_size, offsets, local)
            loss_total, mine = 0.0, 0
            with torch.random.fork_rng(devices=[0] if tdev.type == "cuda" else []):
                model.train()
                if self.combine == "workers":  # dropout masks: seeded per epoch and rank
                    torch.manual_seed(int(np.random.default_rng([self.seed, epoch, ctx.rank, 7]).integers(2**31)))
                for step, (parts, inv) in enumerate(plan):
                    loss_total += self._step(model, opt, params, parts, inv, local, cache, plan, group, dev, tdev,
                                             busy, (epoch, step))
                    mine += sum(int(rows.size) for _, rows in parts)
            if ctx.streaming:
                cache.clear()
            record, score = self._end_of_epoch(model, state, ctx, local, offsets, val, cache, group, dev, tdev,
                                               loss_total / max(len(train), 1), h2d0)
            record["shares"] = dict(ctx.allgather((ctx.address, mine)))  # training rows per worker
            ctx.observe("lstm-epoch", sum(self.row_blocks[b] for b, _ in local) * self.row_bytes, busy[0])
            state = self._next_state(state, model, opt, record["loss"], score)
            ctx.checkpoint(state, **record, seconds_compute=busy[0],
                           line=_line(state.epoch, record, self.task))
        return state

    def _step(self, model, opt, params, parts, inv, local, cache, plan, group, dev, tdev, busy, when) -> float:
        """One optimizer step; ``parts`` = ``[(local position, block-local rows)]``: the rows of the
        global batch this worker holds, block by block (``inv``: their order in the batch, see
        :class:`GlobalPlan`); ``when`` = (epoch, step). Returns the batch's summed loss (all ranks)."""
        t = time.perf_counter()
        width = sum(p.numel() for p in params) + 2
        n_slots = len(self.row_blocks) if self.combine == "blocks" else 1

        def partial(x: torch.Tensor, y: torch.Tensor, slot: torch.Tensor) -> None:
            """The gradient of the summed loss over rows ``x, y``, the loss and the row count, into ``slot``."""
            opt.zero_grad(set_to_none=True)
            loss = self.loss_sum(model(x), y)
            loss.backward()
            slot[:-2] = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                                   for p in params])
            slot[-2] = loss.detach()
            slot[-1] = float(y.shape[0])

        def rows(pos: int, r: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
            blk = self._tensors(pos, local, cache, tdev)
            idx = torch.from_numpy(r).to(tdev)
            return blk.x.index_select(1, idx), blk.y.index_select(0, idx)

        def compute() -> torch.Tensor:
            slots = torch.zeros((n_slots, width), dtype=params[0].dtype, device=tdev)
            if self.combine == "blocks":
                for pos, r in parts:
                    b = local[pos][0]
                    if self.spec.dropout > 0:  # the block's own dropout masks: the same whoever holds it
                        torch.manual_seed(int(np.random.default_rng([self.seed, *when, b, 7]).integers(2**31)))
                    partial(*rows(pos, r), slots[b])
            elif parts:  # this worker's rows at once, in the batch's order (all of it: what one process computes)
                xs, ys = zip(*(rows(pos, r) for pos, r in parts))
                x = xs[0] if len(xs) == 1 else torch.cat(xs, dim=1)
                y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=0)
                if inv is not None:
                    order = torch.from_numpy(inv).to(tdev)
                    x, y = x.index_select(1, order), y.index_select(0, order)
                partial(x, y, slots[0])
            if tdev.type == "cuda":
                torch.cuda.synchronize(tdev)
            return slots

        slots = dev.compute(compute)  # emulated devices: timed and slowed down by their speed
        busy[0] += time.perf_counter() - t
        group.allreduce(slots)  # "blocks": each block's slot comes from its one holder, exact in any order
        flat = in_block_order(slots)
        lsum, total = float(flat[-2]), float(flat[-1])
        if total > 0:  # the gradient of the batch's mean loss, the same on every replica
            grads = flat[:-2] / total
            o = 0
            for p in params:
                k = p.numel()
                p.grad = grads[o:o + k].view_as(p)
                o += k
            opt.step()
        plan.done(parts, cache)
        return lsum

    def _tensors(self, pos: int, local: list, cache: dict, tdev: torch.device) -> _Block:
        blk = cache.get(pos)
        if blk is None:
            arrays = local[pos][1]
            xb, yb = arrays["X"], arrays["Y"]
            blk = cache[pos] = _Block(as_tensor(time_major(xb)).to(tdev), as_tensor(yb).to(tdev), _nbytes(xb))
        return blk

    def _end_of_epoch(self, model, state, ctx, local, offsets, val, cache, group, dev, tdev, loss, h2d0):
        """The epoch's record (all ranks agree): loss, validation score, host->device bytes (those of
        the validation pass included)."""
        sums = self._validation_sums(model, ctx, local, offsets, val, cache, tdev) if val.size else None
        t = torch.zeros((1 + (0 if sums is None else len(self.row_blocks)), 1 + (0 if sums is None else
                                                                                  sums.shape[1])),
                        dtype=torch.float64, device=tdev)
        t[0, 0] = float(int(getattr(dev, "bytes_h2d", 0)) - h2d0)  # a count of bytes: exact in any order
        if sums is not None:
            t[1:, 1:] = torch.from_numpy(sums).to(tdev)
        group.allreduce(t)
        stats = t.cpu()
        record = {"epoch": state.epoch + 1, "loss": float(loss), "h2d_bytes": int(stats[0, 0])}
        score = None
        if sums is not None:
            score = _score(self.task, in_block_order(stats[1:, 1:], count=0).numpy(), self.spec.n_outputs)
            record["validation_score"] = score
        return record, score

    def _validation_sums(self, model, ctx, local, offsets, val, cache, tdev) -> np.ndarray:
        """Per-block sums over the validation rows of this worker's blocks, one row per block of the
        data (zeros for others' blocks): regression ``[count, SSE_k..., sum_k..., sumsq_k...]``,
        classification ``[count, correct]``."""
        k = self.spec.n_outputs
        table = np.zeros((len(self.row_blocks), 1 + (3 * k if self.task == "regression" else 1)))
        model.eval()
        with torch.no_grad():
            for pos, (b, _) in enumerate(local):
                rows = val[(val >= offsets[b]) & (val < offsets[b + 1])] - offsets[b]
                if not rows.size:
                    continue
                sums = table[b]
                blk = self._tensors(pos, local, cache, tdev)
                for j in range(0, rows.size, 4 * self.batch_size):
                    idx = torch.from_numpy(rows[j:j + 4 * self.batch_size]).to(tdev)
                    out = model(blk.x.index_select(1, idx))
                    y = blk.y.index_select(0, idx)
                    sums[0] += idx.numel()
                    if self.task == "classification":
                        sums[1] += float((out.argmax(dim=1) == y).sum())
                    else:
                        y = y.reshape(out.shape).to(torch.float64)
                        o = out.to(torch.float64)
                        sums[1:1 + k] += ((o - y) ** 2).sum(dim=0).cpu().numpy()
                        sums[1 + k:1 + 2 * k] += y.sum(dim=0).cpu().numpy()
                        sums[1 + 2 * k:] += (y * y).sum(dim=0).cpu().numpy()
                if ctx.streaming:
                    cache.pop(pos, None)
        model.train()
        return table

    def _next_state(self, state: TrainState, model, opt, loss: float, score: float | None) -> TrainState:
        """The state after an epoch, with scikit-learn MLP's stopping rule: stop once the training loss
        (or, with early stopping, the validation score) did not improve by ``tol`` for more than
        ``n_iter_no_change`` epochs."""
        best, no_improve, best_model = state.best, state.no_improve, state.best_model
        params = _host_tree(model.state_dict())
        if self.early_stopping and score is not None:
            no_improve = no_improve + 1 if best is not None and score < best + self.tol else 0
            if best is None or score > best:
                best, best_model = score, params
        else:
            no_improve = no_improve + 1 if best is not None and loss > best - self.tol else 0
            if best is None or loss < best:
                best = loss
        return replace(state, epoch=state.epoch + 1, model=params, optim=_host_tree(opt.state_dict()), best=best,
                       best_model=best_model, no_improve=no_improve, stopped=no_improve > self.n_iter_no_change)


def in_block_order(slots: torch.Tensor, count: int = -1) -> torch.Tensor:
    """The sum of the rows of ``slots`` (one per block of the data) whose column ``count`` is
    positive, added one by one in block order: the same bits whichever worker computed which row."""
    used = torch.nonzero(slots[:, count] > 0).flatten().tolist()
    if not used:
        return torch.zeros_like(slots[0])
    acc = slots[used[0]].clone()
    for b in used[1:]:
        acc += slots[b]
    return acc


def _nbytes(x: Any) -> int:
    return int(getattr(x, "nbytes", 0) or 0)


def _score(task: str, sums: np.ndarray, k: int) -> float:
    count = sums[0]
    if count <= 0:
        return float("nan")
    if task == "classification":
        return float(sums[1] / count)
    sse, s, sq = sums[1:1 + k], sums[1 + k:1 + 2 * k], sums[1 + 2 * k:1 + 3 * k]
    sst = sq - s * s / count
    r2 = np.where(sst > 0, 1 - sse / np.where(sst > 0, sst, 1), np.where(sse > 0, 0.0, 1.0))
    return float(r2.mean())


def _line(epoch: int, record: dict, task: str) -> str:
    line = f"epoch {epoch}: loss {record['loss']:.6g}"
    if "validation_score" in record:
        line += f", validation {'accuracy' if task == 'classification' else 'R^2'} {record['validation_score']:.4f}"
    return line + f", host->device {record['h2d_bytes']} B"


# -- prediction -------------------------------------------------------------------------------------------
def predict_host(spec: ModelSpec, params: dict[str, np.ndarray], x: np.ndarray, batch: int = 4096) -> np.ndarray:
    """Model outputs for host sequences ``x`` ``(n, T, f)``, on the CPU, in batches."""
    model = build(spec, params)
    model.eval()
    out = []
    with torch.no_grad():
        for j in range(0, x.shape[0], batch):
            xb = torch.from_numpy(np.ascontiguousarray(x[j:j + batch].transpose(1, 0, 2)))
            out.append(model(xb).numpy())
    return np.concatenate(out) if out else np.empty((0, spec.n_outputs), dtype=spec.dtype)


def predict_block(block: Any, spec: ModelSpec, flat: Any) -> Any:
    """Model outputs for one sequence block where it lives (its time-major memory read in place);
    ``flat`` = the parameters as one vector. NumPy out for host blocks, the block's array type else."""
    tdev = torch_device(current_device())
    model = build(spec, device=tdev)
    nn.utils.vector_to_parameters(as_tensor(np.asarray(to_numpy(flat))).to(tdev, _DTYPES[spec.dtype]),
                                  model.parameters())
    model.eval()
    with torch.no_grad():
        out = model(as_tensor(time_major(block)).to(tdev, _DTYPES[spec.dtype]))
    if isinstance(block, np.ndarray):
        return out.cpu().numpy()
    if type(block).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy.from_dlpack(out)  # where torch computed it: no copy
    return asarray_like(out.cpu().numpy(), block)  # other namespaces (strict devices): copied onto the block's device


def flat_params(spec: ModelSpec, params: dict[str, np.ndarray]) -> np.ndarray:
    """The parameters as one host vector in ``model.parameters()`` order."""
    model = build(spec, params)
    return nn.utils.parameters_to_vector(model.parameters()).detach().numpy().copy()

"""LSTM training: gdask (data-parallel on the devices) vs a plain single-process PyTorch loop, one run.

Two workloads, each with the same model (``nn.LSTM`` + a linear head on the last hidden state), data,
seed, global batch size, learning rate (Adam) and epochs in every implementation:

* ``sine``: next-value regression of noisy sine windows ``(n, T, 1)`` (random phase and frequency),
  mean squared error, R^2 on held-out windows;
* ``classify``: synthetic sequence classification ``(n, T, 2)``: a noisy sinusoid whose frequency is
  the class (3 classes) beside a noise channel, cross-entropy, accuracy on held-out sequences.

Implementations:

(a) gdask on ``--devices`` devices (CUDA devices where present, else emulated), the data persisted
    as a 3-D GDataSet that fits on the devices (``gdask.ml.LSTMRegressor`` / ``LSTMClassifier``);
(b) a plain single-process PyTorch loop with a ``DataLoader`` over host NumPy (what users write
    today), the batches moved ``.to(device)`` every step, in the epoch order gdask documents
    (``np.random.default_rng([seed, epoch]).permutation``): the same batches as (a). Splitting a batch
    over the workers changes the float32 rounding of its sums, which training can amplify over the
    epochs (in float64 the curves agree to about 1e-12), so (a) and (b) must agree in the first
    epoch's loss (1e-4) and in the final score (0.02);
(c) gdask with the data twice the devices' memory, read through the window cache (each worker
    shuffles within windows of its blocks: another order, so (c) agrees with (b) in the final score
    (0.02), not to rounding).

Per epoch each prints the time, the bytes copied host->device (gdask: its devices' counters; (b):
the bytes of the batches it moves ``.to(device)``, which a GPU copies and the CPU does not) and the
training loss; then the final score. Every implementation first fits one warm-up epoch (imports,
torch's lazy initialisation), not timed. On emulated devices all figures are CPU figures.

    python benchmarks/lstm.py                           # both workloads, 2 devices
    python benchmarks/lstm.py --rows 100000 --epochs 10 --json lstm.json
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import _common
import numpy as np


def sine_data(n, T, seed, noise=0.1):
    rng = np.random.default_rng(seed)
    t0 = rng.uniform(0, 2 * np.pi, n)[:, None]
    w = rng.uniform(0.2, 0.4, n)[:, None]
    s = np.sin(w * np.arange(T + 1)[None, :] + t0) + noise * rng.standard_normal((n, T + 1))
    return s[:, :T, None].astype(np.float32), s[:, T].astype(np.float32)


def classify_data(n, T, seed, classes=3, noise=0.3):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    freq = 0.15 + 0.3 * y / max(classes - 1, 1)
    t0 = rng.uniform(0, 2 * np.pi, n)[:, None]
    sig = np.sin(freq[:, None] * np.arange(T)[None, :] + t0) + noise * rng.standard_normal((n, T))
    X = np.stack([sig, rng.standard_normal((n, T))], axis=2).astype(np.float32)
    return X, y.astype(np.int64)


# -- (b): the plain PyTorch loop --------------------------------------------------------------------
def plain_loop(X, y, Xt, yt, task, a, seed, device, record):
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Sampler, TensorDataset

    class Model(nn.Module):
        def __init__(self, f, h, k):
            super().__init__()
            self.lstm = nn.LSTM(f, h)
            self.head = nn.Linear(h, k)

        def forward(self, x):  # (T, batch, f)
            _, (hn, _) = self.lstm(x)
            return self.head(hn[-1])

    class EpochOrder(Sampler):  # the epoch order gdask documents, so that the loss curves are comparable
        def __init__(self, n):
            self.n, self.epoch = n, 0

        def __iter__(self):
            return iter(np.random.default_rng([seed, self.epoch]).permutation(self.n).tolist())

        def __len__(self):
            return self.n

    k = 1 if task == "sine" else int(y.max()) + 1
    torch.manual_seed(seed)
    model = Model(X.shape[2], a.hidden, k).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    order = EpochOrder(len(X))
    loader = DataLoader(TensorDataset(torch.from_numpy(X), torch.from_numpy(y)), batch_size=a.batch_size,
                        sampler=order)
    loss_fn = nn.MSELoss() if task == "sine" else nn.CrossEntropyLoss()
    for epoch in range(a.epochs):
        order.epoch = epoch
        t, moved, total = time.perf_counter(), 0, 0.0
        for xb, yb in loader:
            moved += xb.nbytes + yb.nbytes
            xb, yb = xb.to(device), yb.to(device)
            out = model(xb.transpose(0, 1))
            loss = loss_fn(out[:, 0], yb) if task == "sine" else loss_fn(out, yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(yb)
        if device != "cpu":
            torch.cuda.synchronize()
        record({"epoch": epoch + 1, "seconds": time.perf_counter() - t, "h2d_bytes": moved, "loss": total / len(X)})
    model.eval()
    with torch.no_grad():
        out = model(torch.from_numpy(np.ascontiguousarray(Xt.transpose(1, 0, 2))).to(device)).cpu().numpy()
    if task == "sine":
        p = out[:, 0]
        return float(1 - ((p - yt) ** 2).sum() / ((yt - yt.mean()) ** 2).sum())
    return float((out.argmax(1) == yt).mean())


# -- (a) and (c): gdask -------------------------------------------------------------------------------
def gdask_fit(X, y, Xt, yt, task, a, seed, record, block_rows):
    import gdask
    from gdask.ml import LSTMClassifier, LSTMRegressor

    cls = LSTMRegressor if task == "sine" else LSTMClassifier
    G = gdask.from_array(X, block_rows=block_rows).persist()
    kw = dict(hidden_size=a.hidden, batch_size=a.batch_size, lr=a.lr, random_state=seed)
    cls(epochs=1, **kw).fit(G, y)  # warm-up: torch imported and initialised on the workers
    est = cls(epochs=a.epochs, callback=record, **kw).fit(G, y)
    return est.score(Xt, yt), est


def _agree(x, y, rtol):
    return bool(np.allclose(x, y, rtol=rtol, atol=0))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="*", default=["sine", "classify"], choices=["sine", "classify"])
    p.add_argument("--backend", default="auto", choices=["auto", "emulated", "cuda"])
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--rows", type=int, default=20_000, help="training sequences")
    p.add_argument("--test-rows", type=int, default=2_000)
    p.add_argument("--timesteps", type=int, default=20)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--blocks-per-device", type=int, default=8)
    p.add_argument("--torch-threads", type=int, default=1,
                   help="intra-op threads of (b) (gdask's workers run one each: OMP_NUM_THREADS=1)")
    p.add_argument("--skip", nargs="*", default=[], choices=["a", "b", "c"])
    p.add_argument("--json", default=None, help="write results to this file")
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore", message="Sending large graph")  # the data is sent once, at persist
    import torch
    from distributed import Client

    import gdask

    torch.set_num_threads(a.torch_threads)
    backend = gdask.devices.discover(None if a.backend == "auto" else a.backend).backend
    device = "cuda" if backend == "cuda" and torch.cuda.is_available() else "cpu"
    data = {}
    for task in a.tasks:
        make = sine_data if task == "sine" else classify_data
        X, y = make(a.rows, a.timesteps, a.seed)
        Xt, yt = make(a.test_rows, a.timesteps, a.seed + 1)
        data[task] = (X, y, Xt, yt)
    block_rows = math.ceil(a.rows / (a.devices * a.blocks_per_device))
    results: list[dict] = []

    def run(task, impl, fn):
        epochs: list[dict] = []

        def record(r):
            epochs.append({"epoch": int(r["epoch"]), "seconds": float(r["seconds"]),
                           "h2d_bytes": int(r["h2d_bytes"]), "loss": float(r["loss"])})

        score, extra = fn(record)
        results.append({"task": task, "impl": impl, "epochs": epochs, "score": score,
                        "final_loss": epochs[-1]["loss"] if epochs else None, **extra})

    if "b" not in a.skip:
        for task, (X, y, Xt, yt) in data.items():
            plain_loop(X[: a.batch_size * 2], y[: a.batch_size * 2], Xt[:8], yt[:8], task,
                       argparse.Namespace(**{**vars(a), "epochs": 1}), a.seed, device, lambda r: None)  # warm-up
            run(task, "b", lambda rec, d=(X, y, Xt, yt), t=task: (plain_loop(*d, t, a, a.seed, device, rec), {}))
    kind = ndev = None
    if "a" not in a.skip:
        with gdask.LocalGPUCluster(n_devices=a.devices, backend=a.backend, dashboard_address=":0") as cluster, \
                Client(cluster):
            _common.warmed()
            kind, ndev = cluster.backend, len(cluster.device_specs)
            for task, (X, y, Xt, yt) in data.items():
                run(task, "a", lambda rec, d=(X, y, Xt, yt), t=task: (
                    lambda s_e: (s_e[0], {"shares": s_e[1].history_[-1].get("shares"),
                                          "mode": s_e[1].fit_mode_}))(gdask_fit(*d, t, a, a.seed, rec, block_rows)))
    if "c" not in a.skip:
        for task, (X, y, Xt, yt) in data.items():
            # total device memory = half the data (2x device memory through the window)
            mem = max(X.nbytes // (2 * a.devices), 4 * (X.nbytes // (a.devices * a.blocks_per_device)))
            with gdask.LocalGPUCluster(n_devices=a.devices, backend=a.backend, device_memory=mem,
                                       dashboard_address=":0") as cluster, Client(cluster) as client:
                _common.warmed(client)
                kind, ndev = cluster.backend, len(cluster.device_specs)
                run(task, "c", lambda rec, d=(X, y, Xt, yt), t=task: (
                    lambda s_e: (s_e[0], {"device_memory": mem * a.devices, "data_bytes": X.nbytes,
                                          "window": {k: v for k, v in gdask.window_cache.stats(client).items()
                                                     if k in ("hits", "misses", "prefetch_hits", "reads",
                                                              "bytes_h2d")}}))(
                        gdask_fit(*d, t, a, a.seed, rec, block_rows)))
    kind = kind or backend
    setup = _common.setup(["torch", "scikit-learn"], torch_threads_b=a.torch_threads, gdask_worker_threads=1,
                          device=f"{ndev or a.devices} {kind} devices" + (" (emulated: CPU figures)"
                                                                            if kind == "emulated" else ""),
                          baseline_device=device)
    print(f"\nLSTM training: {a.rows:,} sequences x {a.timesteps} steps, hidden {a.hidden}, batch {a.batch_size}, "
          f"Adam lr {a.lr}, {a.epochs} epochs, seed {a.seed}; (a) gdask on {ndev or a.devices} {kind} devices, (b) "
          f"plain PyTorch + DataLoader on {device}, (c) gdask, data 2x the devices' memory")
    _common.print_setup(setup)
    print(f"{'task':<9}{'impl':<5}{'epoch':>6}{'seconds':>9}{'host->device B':>16}{'loss':>12}")
    for r in results:
        for e in r["epochs"]:
            print(f"{r['task']:<9}{r['impl']:<5}{e['epoch']:>6}{e['seconds']:>9.3f}{e['h2d_bytes']:>16,}"
                  f"{e['loss']:>12.6f}")
    print(f"\n{'task':<9}{'impl':<5}{'mean epoch s':>13}{'final loss':>12}{'score':>9}  (R^2 for sine, accuracy for "
          "classify)")
    for r in results:
        mean_s = float(np.mean([e["seconds"] for e in r["epochs"]])) if r["epochs"] else float("nan")
        r["mean_epoch_s"] = mean_s
        print(f"{r['task']:<9}{r['impl']:<5}{mean_s:>13.3f}{r['final_loss']:>12.6f}{r['score']:>9.4f}")
    agreement = {}
    for task in a.tasks:
        rows = {r["impl"]: r for r in results if r["task"] == task}
        ag = {}
        if "a" in rows and "b" in rows:  # the same batches: the same curve, up to float32 rounding
            la = np.array([e["loss"] for e in rows["a"]["epochs"]])
            lb = np.array([e["loss"] for e in rows["b"]["epochs"]])
            ag["a_b_first_epoch_loss"] = _agree(la[:1], lb[:1], 1e-4)
            ag["a_b_max_rel_loss_diff"] = float(np.max(np.abs(la - lb) / np.abs(lb)))
            ag["a_b_score"] = bool(abs(rows["a"]["score"] - rows["b"]["score"]) <= 0.02)
            ag["a_b_epoch_time_ratio"] = rows["a"]["mean_epoch_s"] / rows["b"]["mean_epoch_s"]
        if "c" in rows and "b" in rows:  # another order: statistically the same fit
            ag["c_b_score"] = bool(abs(rows["c"]["score"] - rows["b"]["score"]) <= 0.02)
            ag["c_b_final_loss_ratio"] = rows["c"]["final_loss"] / rows["b"]["final_loss"]
        agreement[task] = ag
        print(f"{task}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in ag.items()))
    _common.write_json(a.json, {"backend": kind, "devices": ndev or a.devices, "rows": a.rows,
                                "timesteps": a.timesteps, "hidden": a.hidden, "epochs": a.epochs,
                                "batch_size": a.batch_size, "lr": a.lr, "setup": setup, "results": results,
                                "agreement": agreement})
    ok = all(v for ag in agreement.values() for k, v in ag.items() if isinstance(v, bool))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""opcast.train: learned kernel predictors fitted on opcast datasets, that transfer to unseen GPUs.

    opcast train fit DATASET... --out MODELS_DIR [--name NAME] [--estimator xgb|tile-mlp|auto]
                     [--holdout-device NAME ...]
    opcast train eval --models MODELS_DIR DATASET... [--json] [--plot FILE.png]

- :mod:`.features`: the features of a row on a device, from the op registry and the hardware
  catalog only (shared by fit and predict); rows are grouped by (op, direction, dtype class).
- :mod:`.estimators`: ``xgb`` (boosted trees on log(time / roofline)) and ``tile-mlp``
  (NeuSight's tiles-in-waves model with an MLP utilisation bounded by the roofline).
- :mod:`.fit`: one predictor per group; held-out folds leave out a whole device and a fifth of
  the shapes; ``auto`` keeps the estimator with the lower held-out median APE on the left-out devices, and
  where another is better on held-out shapes of the training devices, that one too, for those devices
  and boards of their compute die (:class:`~.fit.SeenSplit`).
- :mod:`.artifacts`: ``MODELS_DIR/<name>/`` (one file per predictor + meta.json with hashes and
  versions), :func:`~.artifacts.load_model_set` and :class:`~.artifacts.ModelSet` for predict.
- :mod:`.evaluate`: MAPE, median / p90 absolute percentage error and share within 10 %.
- :mod:`.splits`: honest held-out splits, rows grouped by shape and by whole device.
- :mod:`.cli`: the ``opcast train`` commands.

The embedded default ``models/default`` is re-made, reproducibly (seed 0), by
``bash benchmarks/train_default_models.sh``: it replays ``../shared/published`` (NeuSight, Vidur,
arXiv 2509.22832) into a temporary folder and runs
``opcast train fit <that folder> data/datasets --out models --name default --seed 0 --jobs 2``.
``benchmarks/train_benchmark.py`` reports the held-out accuracy tables.
"""

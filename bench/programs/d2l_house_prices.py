"""Port of Dive into Deep Learning's "Predicting House Prices on Kaggle" (PyTorch tab): the Kaggle
table preprocessed with pandas (numeric columns standardised, their NaNs set to 0, categoricals
one-hot encoded with a NaN indicator), a linear model trained with Adam on the squared loss of
the raw prices, judged by the RMSE of the log prices, selected by K-fold cross-validation, then
refitted on all the training rows to predict the test rows.

Source: github.com/d2l-ai/d2l-en, ``chapter_multilayer-perceptrons/kaggle-house-price.md`` (the
``#@tab pytorch`` and ``#@tab all`` cells) and ``d2l/torch.py`` (``load_array``) at commit
10a5845b68ec600922bdc411d83e231603e89631, the last version of the section that trains with
Adam (later versions moved to d2l's ``Trainer``/``LinearRegression`` with SGD) (sample code
MIT-0, ``LICENSE-SAMPLECODE``). Written anew from the facts of that file; no code copied.

Kept: ``all_features = pd.concat((train_data.iloc[:, 1:-1], test_data.iloc[:, 1:]))`` (the
``Id`` and ``SalePrice`` columns dropped); the numeric columns standardised as ``(x - x.mean())
/ x.std()`` over train and test together (pandas: NaNs skipped, ddof 1), then ``fillna(0)``;
``pd.get_dummies(all_features, dummy_na=True)`` (numeric columns first, then one indicator per
level of each object column, levels sorted, plus its NaN indicator); ``train_features``,
``test_features`` and ``train_labels = SalePrice.values.reshape(-1, 1)`` as float32 tensors;
``loss = nn.MSELoss()``; ``get_net()`` = ``nn.Sequential(nn.Linear(in_features, 1))``;
``log_rmse`` (predictions clamped to [1, inf), ``sqrt(loss(log(clipped_preds),
log(labels)))``); ``train(net, train_features, train_labels, test_features, test_labels,
num_epochs, learning_rate, weight_decay, batch_size)``: ``d2l.load_array`` (a shuffling
``DataLoader`` over a ``TensorDataset``), ``torch.optim.Adam(lr, weight_decay)``, per batch
``zero_grad``, ``loss(net(X), y)``, ``backward``, ``step``, per epoch the train (and valid) log
rmse; ``get_k_fold_data`` (fold ``i`` of ``X.shape[0] // k`` rows is the validation, the
others concatenated in order); ``k_fold`` (a fresh ``get_net()`` per fold, the last epoch's
log rmse summed and averaged); the section's hyperparameters ``k, num_epochs, lr,
weight_decay, batch_size = 5, 100, 5, 0, 64``; ``train_and_pred`` (one net on all 1,460
training rows, then the test predictions).
Replaced: the Kaggle CSVs (not downloadable here) by a synthetic table of the same shape and
kinds: 1,460 train and 1,459 test rows, an ``Id``, 36 numeric and 43 categorical columns (Ames'
79) named and scaled like Ames' (areas, years, counts, ratings; ``LotFrontage``, ``MasVnrArea``
and ``GarageYrBlt`` missing in 17.7%, 0.5% and 5.3% of the rows as in the real file; ``Alley``,
``PoolQC``, ``Fence``, ``MiscFeature`` mostly missing, the basement, garage and fireplace
ratings missing where there is none), 296 columns after the one-hot encoding (331 in the book),
and ``SalePrice`` log-normal and right-skewed (median ~155,000, log std 0.40 as in Ames),
generated from correlated size and quality factors, the neighbourhood, the zoning, the kitchen
and the sale condition, with noise; the numpy pipeline below does
what the pandas calls do (pandas is not installed here). Shrunk: nothing else (the section's
epochs, folds and batch size); CPU; no plots, no ``submission.csv``.
Measure only (not in the program): the test rows' true prices (generated with the table, never
given to the program) score ``train_and_pred``'s predictions by the same log rmse; all log
rmses are also computed with ``(n, 1)`` labels whatever shape the program used.

nndx, as the author would add it after README.md: in ``train`` (where the loop is), for the
first fold's training (the one the section plots): ``nndx.probe(net, (X, y), loss,
optimizer=optimizer, data=(train_features, train_labels, test_features, test_labels))`` on the
first batch of ``train_iter`` before the epochs; ``nndx.Monitor(net, optimizer, every=10,
loss_fn=loss)`` around them, the batch loss computed through ``mon.loss_fn`` and logged every
batch, each epoch's valid log rmse logged as ``split="val"``; after them ``nndx.probe(...,
monitor=mon)`` on the same batch and ``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils import data

from bench.programs.harness import Measure, Nndx, NullMonitor, Source, Variant
from nndx.report import CauseCode as C

NAME = "d2l_house_prices"
SOURCE = Source("d2l-ai/d2l-en", "chapter_multilayer-perceptrons/kaggle-house-price.md",
                "10a5845b68ec600922bdc411d83e231603e89631", "MIT-0")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the section's PyTorch code as published (synthetic Ames-like table of the same shape)"),
        Variant(
            "labels_not_reshaped",
            "train_labels = tensor(train_data.SalePrice.values) without .reshape(-1, 1): the labels are (n,) "
            "while the net outputs (n, 1), so nn.MSELoss broadcasts every batch to (64, 64) and fits every "
            "prediction to every price in the batch; the net learns the mean price (PyTorch only warns)",
            (C.SHAPE_BROADCAST,),
            ("https://github.com/pytorch/pytorch/issues/16045",
             "https://github.com/pytorch/pytorch/issues/19699",
             "https://github.com/pytorch/pytorch/issues/19991"),
            Measure("valid_log_rmse_true", "K-fold average valid log rmse (labels as (n, 1)) at least 1.5x the "
                    "healthy run's", lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
        Variant(
            "nan_not_filled",
            "the all_features[numeric_features].fillna(0) line is left out after the standardisation: the "
            "missing LotFrontage / MasVnrArea / GarageYrBlt values stay NaN in the float tensors, nearly every "
            "batch has one, the first step turns the weights to NaN and every log rmse is NaN",
            (C.NAN_IN_DATA,),
            ("https://github.com/Nixtla/neuralforecast/issues/186",
             "https://github.com/aramis-lab/clinicadl/issues/106",
             "https://github.com/PriorLabs/TabPFN/issues/108"),
            Measure("valid_log_rmse", "K-fold average valid log rmse not finite, or at least 1.5x the healthy run's",
                    lambda healthy, buggy: not buggy < 1.5 * healthy),
        ),
    )
}

N_TRAIN, N_TEST = 1460, 1459
K, NUM_EPOCHS, LR, WEIGHT_DECAY, BATCH_SIZE = 5, 100, 5, 0, 64

NEIGHBORHOODS = ["Blmngtn", "Blueste", "BrDale", "BrkSide", "ClearCr", "CollgCr", "Crawfor", "Edwards", "Gilbert",
                 "IDOTRR", "MeadowV", "Mitchel", "NAmes", "NPkVill", "NWAmes", "NoRidge", "NridgHt", "OldTown",
                 "SWISU", "Sawyer", "SawyerW", "Somerst", "StoneBr", "Timber", "Veenker"]  # fmt: skip


# --------------------------------------------------------------------------- the Kaggle table, synthetic


def _choice(rng: np.random.Generator, levels: list[str], p: list[float], n: int) -> np.ndarray:
    return np.array(rng.choice(levels, size=n, p=np.asarray(p) / np.sum(p)), dtype=object)


def _missing(rng: np.random.Generator, column: np.ndarray, fraction: float) -> np.ndarray:
    column = column.copy()
    column[rng.random(len(column)) < fraction] = np.nan if column.dtype != object else None
    return column


def house_table(seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """(train_data, test_data, test_prices): the two CSVs as ordered column dicts (numeric
    columns float64 with NaN, categorical ones object with None) and the hidden test prices."""
    rng = np.random.default_rng(20210805 + seed)
    n = N_TRAIN + N_TEST
    size = rng.normal(size=n)  # latent size of the house
    quality = 0.5 * size + np.sqrt(0.75) * rng.normal(size=n)  # bigger houses are better built
    age = -0.4 * quality + np.sqrt(0.84) * rng.normal(size=n)
    hood = rng.integers(0, len(NEIGHBORHOODS), size=n)
    hood_effect = np.random.default_rng(7).normal(0, 0.15, size=len(NEIGHBORHOODS))

    year_built = np.clip(np.round(1972 - 28 * age), 1872, 2010)
    gr_liv = np.round(np.exp(7.27 + 0.33 * size + 0.05 * rng.normal(size=n)))
    second = np.where(rng.random(n) < 0.43, np.round(gr_liv * rng.uniform(0.3, 0.5, n)), 0.0)
    first = gr_liv - second
    bsmt = np.where(rng.random(n) < 0.03, 0.0, np.round(first * rng.uniform(0.7, 1.05, n)))
    garage_cars = np.clip(np.round(1.8 + 0.6 * size + 0.3 * quality + 0.5 * rng.normal(size=n)), 0, 4)
    overall_qual = np.clip(np.round(6.1 + 1.4 * quality), 1, 10)
    zoning = _choice(rng, ["RL", "RM", "FV", "RH", "C (all)"], [79, 15, 4.4, 1.1, 0.7], n)
    zoning_effect = {"RL": 0.0, "RM": -0.12, "FV": 0.08, "RH": -0.1, "C (all)": -0.5}
    kitchen = np.where(quality > 1.0, "Ex", np.where(quality > 0.2, "Gd", np.where(quality > -1.3, "TA", "Fa")))
    kitchen_effect = {"Ex": 0.08, "Gd": 0.03, "TA": 0.0, "Fa": -0.06}

    numeric = {
        "MSSubClass": _choice(rng, ["20", "60", "50", "120", "30", "160", "70", "80", "90", "190"],
                              [37, 21, 10, 6, 5, 4, 4, 4, 4, 3], n).astype(float),  # fmt: skip
        "LotFrontage": _missing(rng, np.round(np.clip(70 + 15 * size + 18 * rng.normal(size=n), 21, 313)), 0.177),
        "LotArea": np.round(np.exp(9.1 + 0.25 * size + 0.45 * rng.normal(size=n))),
        "OverallQual": overall_qual,
        "OverallCond": np.clip(np.round(5.6 + 0.4 * age + 1.0 * rng.normal(size=n)), 1, 9),
        "YearBuilt": year_built,
        "YearRemodAdd": np.maximum(year_built, np.clip(np.round(1985 - 18 * age + 12 * rng.normal(size=n)), 1950, 2010)),
        "MasVnrArea": _missing(rng, np.where(rng.random(n) < 0.59, 0.0,
                                             np.round(np.exp(5.2 + 0.4 * quality + 0.6 * rng.normal(size=n)))), 0.005),
        "BsmtFinSF1": np.round(bsmt * rng.uniform(0, 0.9, n)),
        "TotalBsmtSF": bsmt,
        "1stFlrSF": first,
        "2ndFlrSF": second,
        "GrLivArea": gr_liv,
        "FullBath": np.clip(np.round(1.55 + 0.45 * size + 0.2 * quality + 0.35 * rng.normal(size=n)), 0, 3),
        "BedroomAbvGr": np.clip(np.round(2.9 + 0.6 * size + 0.6 * rng.normal(size=n)), 0, 8),
        "TotRmsAbvGrd": np.clip(np.round(6.5 + 1.4 * size + 0.7 * rng.normal(size=n)), 2, 14),
        "Fireplaces": np.clip(np.round(0.6 + 0.35 * quality + 0.3 * size + 0.5 * rng.normal(size=n)), 0, 3),
        "GarageYrBlt": _missing(rng, np.maximum(year_built, np.round(year_built + 10 * np.abs(rng.normal(size=n)))),
                                0.055),
        "GarageCars": garage_cars,
        "GarageArea": np.round(np.clip(garage_cars * 240 + 60 * rng.normal(size=n), 0, 1418)),
        "WoodDeckSF": np.where(rng.random(n) < 0.52, 0.0, np.round(np.exp(5.1 + 0.5 * rng.normal(size=n)))),
        "MoSold": rng.integers(1, 13, size=n).astype(float),
        "YrSold": rng.integers(2006, 2011, size=n).astype(float),
    }
    categorical = {
        "MSZoning": _missing(rng, zoning, 0.001),
        "Street": _choice(rng, ["Pave", "Grvl"], [99.6, 0.4], n),
        "Alley": _missing(rng, _choice(rng, ["Grvl", "Pave"], [55, 45], n), 0.94),
        "LotShape": _choice(rng, ["Reg", "IR1", "IR2", "IR3"], [63, 33, 3, 1], n),
        "Neighborhood": np.array([NEIGHBORHOODS[h] for h in hood], dtype=object),
        "BldgType": _choice(rng, ["1Fam", "TwnhsE", "Duplex", "Twnhs", "2fmCon"], [84, 8, 3.5, 3, 2], n),
        "HouseStyle": np.array(np.where(second > 0, "2Story", "1Story"), dtype=object),
        "ExterQual": np.array(np.where(quality > 0.8, "Gd", "TA"), dtype=object),
        "KitchenQual": _missing(rng, np.array(kitchen, dtype=object), 0.001),
        "GarageType": _missing(rng, _choice(rng, ["Attchd", "Detchd", "BuiltIn", "Basment"], [63, 27, 6, 2], n),
                               0.055),  # fmt: skip
        "PoolQC": _missing(rng, _choice(rng, ["Gd", "Ex", "Fa"], [1, 1, 1], n), 0.995),
        "Fence": _missing(rng, _choice(rng, ["MnPrv", "GdPrv", "GdWo", "MnWw"], [11, 4, 4, 1], n), 0.8),
        "SaleCondition": _choice(rng, ["Normal", "Partial", "Abnorml", "Family", "Alloca", "AdjLand"],
                                 [82, 8.6, 6.9, 1.4, 0.8, 0.3], n),  # fmt: skip
    }
    no_bsmt, no_garage = bsmt == 0, np.isnan(numeric["GarageYrBlt"])
    numeric.update({
        "BsmtFinSF2": np.where(rng.random(n) < 0.89, 0.0, np.round(np.exp(5.5 + 0.6 * rng.normal(size=n)))),
        "BsmtUnfSF": np.round(np.clip(bsmt - numeric["BsmtFinSF1"], 0, None)),
        "LowQualFinSF": np.where(rng.random(n) < 0.98, 0.0, np.round(np.exp(5.3 + 0.5 * rng.normal(size=n)))),
        "BsmtFullBath": np.where(no_bsmt, 0.0, (rng.random(n) < 0.42).astype(float)),
        "BsmtHalfBath": (rng.random(n) < 0.06).astype(float),
        "HalfBath": ((second > 0) & (rng.random(n) < 0.8)).astype(float),
        "KitchenAbvGr": 1.0 + (rng.random(n) < 0.05),
        "OpenPorchSF": np.where(rng.random(n) < 0.45, 0.0, np.round(np.exp(4.0 + 0.7 * rng.normal(size=n)))),
        "EnclosedPorch": np.where((age > 0.5) & (rng.random(n) < 0.4), np.round(rng.uniform(50, 300, n)), 0.0),
        "3SsnPorch": np.where(rng.random(n) < 0.98, 0.0, np.round(rng.uniform(100, 400, n))),
        "ScreenPorch": np.where(rng.random(n) < 0.92, 0.0, np.round(rng.uniform(80, 350, n))),
        "PoolArea": np.where(rng.random(n) < 0.995, 0.0, np.round(rng.uniform(400, 800, n))),
        "MiscVal": np.where(rng.random(n) < 0.96, 0.0, np.round(np.exp(6.3 + 0.8 * rng.normal(size=n)))),
    })

    def graded(levels: list[str], cuts: list[float], noise: float = 0.6) -> np.ndarray:
        """A quality rating (best first) that follows the latent quality, with noise."""
        score = quality + noise * rng.normal(size=n)
        return np.array([levels[int(np.searchsorted(cuts, -s))] for s in score], dtype=object)

    def blank(column: np.ndarray, where: np.ndarray) -> np.ndarray:
        column = column.copy()
        column[where] = None
        return column

    categorical.update({
        "Utilities": _choice(rng, ["AllPub", "NoSeWa"], [99.9, 0.1], n),
        "LandContour": _choice(rng, ["Lvl", "Bnk", "HLS", "Low"], [90, 4, 3.5, 2.5], n),
        "LotConfig": _choice(rng, ["Inside", "Corner", "CulDSac", "FR2", "FR3"], [72, 18, 6.4, 3.2, 0.3], n),
        "LandSlope": _choice(rng, ["Gtl", "Mod", "Sev"], [94.7, 4.5, 0.8], n),
        "Condition1": _choice(rng, ["Norm", "Feedr", "Artery", "RRAn", "PosN", "RRAe", "PosA", "RRNn", "RRNe"],
                              [86, 5.5, 3.3, 1.8, 1.3, 0.7, 0.5, 0.3, 0.1], n),  # fmt: skip
        "Condition2": _choice(rng, ["Norm", "Feedr", "Artery", "RRNn", "PosN"], [99, 0.4, 0.2, 0.2, 0.2], n),
        "RoofStyle": _choice(rng, ["Gable", "Hip", "Flat", "Gambrel", "Mansard", "Shed"],
                             [78, 19.6, 0.9, 0.8, 0.5, 0.2], n),  # fmt: skip
        "RoofMatl": _choice(rng, ["CompShg", "Tar&Grv", "WdShngl", "WdShake", "Metal"], [98.2, 0.8, 0.4, 0.4, 0.2], n),
        "Exterior1st": _choice(rng, ["VinylSd", "HdBoard", "MetalSd", "Wd Sdng", "Plywood", "CemntBd", "BrkFace",
                                     "WdShing", "Stucco", "AsbShng"], [35, 15, 15, 14, 7, 4, 3.4, 1.8, 1.7, 1.4], n),
        "Exterior2nd": _choice(rng, ["VinylSd", "MetalSd", "HdBoard", "Wd Sdng", "Plywood", "CmentBd", "Wd Shng",
                                     "Stucco", "BrkFace", "AsbShng"], [34, 14.6, 14, 13.5, 9.7, 4.1, 2.6, 1.8, 1.7, 1.4],
                               n),  # fmt: skip
        "MasVnrType": _missing(rng, np.array(np.where(numeric["MasVnrArea"] > 0, "BrkFace", "None"), dtype=object),
                               0.005),  # fmt: skip
        "ExterCond": _choice(rng, ["TA", "Gd", "Fa", "Ex", "Po"], [87.8, 10, 2, 0.2, 0.1], n),
        "Foundation": np.array(np.where(year_built > 1980, "PConc", np.where(year_built > 1945, "CBlock", "BrkTil")),
                               dtype=object),  # fmt: skip
        "BsmtQual": blank(graded(["Ex", "Gd", "TA", "Fa"], [-1.2, 0.0, 1.4]), no_bsmt),
        "BsmtCond": blank(_choice(rng, ["TA", "Gd", "Fa", "Po"], [92, 4.5, 3.1, 0.1], n), no_bsmt),
        "BsmtExposure": blank(_choice(rng, ["No", "Av", "Gd", "Mn"], [67, 15.5, 9.4, 8], n), no_bsmt),
        "BsmtFinType1": blank(_choice(rng, ["Unf", "GLQ", "ALQ", "BLQ", "Rec", "LwQ"], [30, 29, 15, 10, 9, 5], n),
                              no_bsmt),  # fmt: skip
        "BsmtFinType2": blank(_choice(rng, ["Unf", "Rec", "LwQ", "BLQ", "ALQ", "GLQ"], [88, 3.7, 3.2, 2.3, 1.3, 1], n),
                              no_bsmt),  # fmt: skip
        "Heating": _choice(rng, ["GasA", "GasW", "Grav", "Wall", "OthW", "Floor"], [97.8, 1.2, 0.5, 0.3, 0.1, 0.1], n),
        "HeatingQC": graded(["Ex", "Gd", "TA", "Fa"], [-0.3, 0.5, 1.8], 0.9),
        "CentralAir": np.array(np.where(age + 0.5 * rng.normal(size=n) > 1.6, "N", "Y"), dtype=object),
        "Electrical": _missing(rng, _choice(rng, ["SBrkr", "FuseA", "FuseF", "FuseP"], [91.4, 6.4, 1.9, 0.3], n),
                               0.001),  # fmt: skip
        "Functional": _choice(rng, ["Typ", "Min2", "Min1", "Mod", "Maj1", "Maj2", "Sev"],
                              [93, 2.3, 2.1, 1, 1, 0.3, 0.1], n),  # fmt: skip
        "FireplaceQu": blank(graded(["Ex", "Gd", "TA", "Fa", "Po"], [-1.8, -0.2, 0.8, 1.6]),
                             numeric["Fireplaces"] == 0),  # fmt: skip
        "GarageFinish": blank(graded(["Fin", "RFn", "Unf"], [-0.4, 0.4], 1.0), no_garage),
        "GarageQual": blank(_choice(rng, ["TA", "Fa", "Gd", "Ex", "Po"], [95, 3.5, 1, 0.2, 0.2], n), no_garage),
        "GarageCond": blank(_choice(rng, ["TA", "Fa", "Gd", "Po", "Ex"], [96, 2.5, 0.7, 0.5, 0.1], n), no_garage),
        "PavedDrive": _choice(rng, ["Y", "N", "P"], [91.8, 6.2, 2], n),
        "MiscFeature": _missing(rng, _choice(rng, ["Shed", "Gar2", "Othr", "TenC"], [93, 4, 2, 1], n), 0.963),
        "SaleType": np.array(np.where(categorical["SaleCondition"] == "Partial", "New",
                                      _choice(rng, ["WD", "COD", "ConLD", "ConLI", "CWD", "ConLw", "Oth", "Con"],
                                              [94, 3.3, 0.7, 0.5, 0.3, 0.4, 0.3, 0.2], n)), dtype=object),
    })
    log_price = (12.02 + 0.12 * (overall_qual - 6.1) + 0.42 * (np.log(gr_liv) - 7.27)
                 + 0.0022 * (year_built - 1972) + 0.05 * (garage_cars - 1.8) + 0.00008 * (bsmt - 1000)
                 + hood_effect[hood] + np.array([zoning_effect[z] for z in zoning])
                 + np.array([kitchen_effect[k] for k in kitchen])
                 + np.where(categorical["SaleCondition"] == "Abnorml", -0.1, 0.0) + 0.09 * rng.normal(size=n))
    price = np.round(np.exp(log_price))

    def rows(sl: slice, with_price: bool) -> dict[str, np.ndarray]:
        table: dict[str, np.ndarray] = {"Id": np.arange(1, n + 1, dtype=float)[sl]}
        for name, column in list(numeric.items())[:3]:
            table[name] = column[sl]
        table["MSZoning"] = categorical["MSZoning"][sl]  # the CSV interleaves the kinds of columns
        for name, column in list(numeric.items())[3:]:
            table[name] = column[sl]
        for name, column in list(categorical.items())[1:]:
            table[name] = column[sl]
        if with_price:
            table["SalePrice"] = price[sl]
        return table

    return rows(slice(0, N_TRAIN), True), rows(slice(N_TRAIN, n), False), price[N_TRAIN:]


# --------------------------------------------------------------------------- pandas, as the section uses it


def concat(*tables: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``pd.concat`` of row blocks: the union of the columns, missing ones NaN (None if object)."""
    names: list[str] = []
    for table in tables:
        names += [c for c in table if c not in names]
    out = {}
    for name in names:
        parts = []
        for table in tables:
            length = len(next(iter(table.values())))
            if name in table:
                parts.append(table[name])
            else:
                kind = next(t[name].dtype for t in tables if name in t)
                parts.append(np.full(length, None, dtype=object) if kind == object else np.full(length, np.nan))
        out[name] = np.concatenate(parts)
    return out


def get_dummies(features: dict[str, np.ndarray], dummy_na: bool = True) -> tuple[np.ndarray, list[str]]:
    """``pd.get_dummies(features, dummy_na=True).values`` (as float) and its column names."""
    numeric = [c for c, v in features.items() if v.dtype != object]
    columns, names = [features[c] for c in numeric], list(numeric)
    for c, v in features.items():
        if v.dtype != object:
            continue
        for level in sorted({x for x in v if x is not None}):
            columns.append((v == level).astype(float))
            names.append(f"{c}_{level}")
        if dummy_na:
            columns.append(np.array([x is None for x in v], dtype=float))
            names.append(f"{c}_nan")
    return np.stack(columns, axis=1), names


# --------------------------------------------------------------------------- the section


def load_array(data_arrays, batch_size, is_train=True, generator=None):
    dataset = data.TensorDataset(*data_arrays)
    return data.DataLoader(dataset, batch_size, shuffle=is_train, generator=generator)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    loader_gen = torch.Generator().manual_seed(seed)
    train_data, test_data, test_prices = house_table(seed)
    columns = list(train_data)

    # all_features = pd.concat((train_data.iloc[:, 1:-1], test_data.iloc[:, 1:]))
    all_features = concat({c: train_data[c] for c in columns[1:-1]},
                          {c: test_data[c] for c in list(test_data)[1:]})  # fmt: skip
    for c, v in all_features.items():
        if v.dtype != object:  # (x - x.mean()) / (x.std()), NaNs skipped, then fillna(0)
            v = (v - np.nanmean(v)) / np.nanstd(v, ddof=1)
            all_features[c] = v if variant == "nan_not_filled" else np.where(np.isnan(v), 0.0, v)
    values, _names = get_dummies(all_features, dummy_na=True)

    n_train = N_TRAIN
    train_features = torch.tensor(values[:n_train], dtype=torch.float32)
    test_features = torch.tensor(values[n_train:], dtype=torch.float32)
    prices = train_data["SalePrice"]
    if variant == "labels_not_reshaped":
        train_labels = torch.tensor(prices, dtype=torch.float32)
    else:
        train_labels = torch.tensor(prices.reshape(-1, 1), dtype=torch.float32)

    loss = nn.MSELoss()
    in_features = train_features.shape[1]

    def get_net():
        net = nn.Sequential(nn.Linear(in_features, 1))
        return net

    def log_rmse(net, features, labels):
        # To further stabilize the value when the logarithm is taken, set the value less than 1 as 1
        clipped_preds = torch.clamp(net(features), 1, float("inf"))
        rmse = torch.sqrt(loss(torch.log(clipped_preds), torch.log(labels)))
        return rmse.item()

    def true_log_rmse(net, features, labels):  # measure only: labels as (n, 1) whatever the program used
        with torch.no_grad():
            clipped_preds = torch.clamp(net(features), 1, float("inf"))
            return float(torch.sqrt(((torch.log(clipped_preds) - torch.log(labels.reshape(-1, 1))) ** 2).mean()))

    watched = {"fold": 0}
    true_valid: list[float] = []

    def train(net, train_features, train_labels, test_features, test_labels,
              num_epochs, learning_rate, weight_decay, batch_size, watch=False):  # fmt: skip
        train_ls, test_ls = [], []
        train_iter = load_array((train_features, train_labels), batch_size, generator=loader_gen)
        # The Adam optimization algorithm is used here
        optimizer = torch.optim.Adam(net.parameters(), lr=learning_rate, weight_decay=weight_decay)
        if watch:
            batch = next(iter(load_array((train_features, train_labels), batch_size,
                                         generator=torch.Generator().manual_seed(seed))))  # fmt: skip
            nndx_data = (train_features, train_labels, test_features, test_labels)
            nx.preflight(net, batch, loss, optimizer=optimizer, data=nndx_data)
            mon = nx.monitor(net, optimizer, every=10, loss_fn=loss)
        else:
            mon = NullMonitor(loss)
        for epoch in range(num_epochs):
            for X, y in train_iter:
                optimizer.zero_grad()
                l = mon.loss_fn(net(X), y)  # noqa: E741
                l.backward()
                optimizer.step()
                if watch:
                    nx.timed(lambda: mon.log(l))  # noqa: B023
            train_ls.append(log_rmse(net, train_features, train_labels))
            if test_labels is not None:
                test_ls.append(log_rmse(net, test_features, test_labels))
                if watch:
                    nx.timed(lambda: mon.log(test_ls[-1], split="val"))
        if watch:
            nx.finish(mon, net, batch, loss, optimizer=optimizer, data=nndx_data)
        if test_labels is not None:
            true_valid.append(true_log_rmse(net, test_features, test_labels))
        return train_ls, test_ls

    def get_k_fold_data(k, i, X, y):
        assert k > 1
        fold_size = X.shape[0] // k
        X_train, y_train = None, None
        for j in range(k):
            idx = slice(j * fold_size, (j + 1) * fold_size)
            X_part, y_part = X[idx, :], y[idx]
            if j == i:
                X_valid, y_valid = X_part, y_part
            elif X_train is None:
                X_train, y_train = X_part, y_part
            else:
                X_train = torch.cat([X_train, X_part], 0)
                y_train = torch.cat([y_train, y_part], 0)
        return X_train, y_train, X_valid, y_valid

    def k_fold(k, X_train, y_train, num_epochs, learning_rate, weight_decay, batch_size):
        train_l_sum, valid_l_sum = 0, 0
        for i in range(k):
            fold = get_k_fold_data(k, i, X_train, y_train)
            net = get_net()
            train_ls, valid_ls = train(net, *fold, num_epochs, learning_rate, weight_decay, batch_size,
                                       watch=i == watched["fold"])  # fmt: skip
            train_l_sum += train_ls[-1]
            valid_l_sum += valid_ls[-1]
            # print(f'fold {i + 1}, train log rmse {float(train_ls[-1]):f}, valid log rmse {float(valid_ls[-1]):f}')
        return train_l_sum / k, valid_l_sum / k

    train_l, valid_l = k_fold(K, train_features, train_labels, NUM_EPOCHS, LR, WEIGHT_DECAY, BATCH_SIZE)

    def train_and_pred(train_features, test_features, train_labels, num_epochs, lr, weight_decay, batch_size):
        net = get_net()
        train_ls, _ = train(net, train_features, train_labels, None, None, num_epochs, lr, weight_decay,
                            batch_size)  # fmt: skip
        with torch.no_grad():
            preds = net(test_features).detach().numpy()  # the submission's SalePrice column
        return train_ls, preds.reshape(1, -1)[0]

    train_ls, preds = train_and_pred(train_features, test_features, train_labels, NUM_EPOCHS, LR, WEIGHT_DECAY,
                                     BATCH_SIZE)  # fmt: skip
    clipped = np.clip(preds, 1, None)
    test_log_rmse = float(np.sqrt(np.mean((np.log(clipped) - np.log(test_prices)) ** 2)))
    return {"train_log_rmse": float(train_l), "valid_log_rmse": float(valid_l),
            "valid_log_rmse_true": float(np.mean(true_valid)), "final_train_log_rmse": float(train_ls[-1]),
            "test_log_rmse": test_log_rmse, "n_features": float(in_features),
            "price_log_std": float(np.log(train_data["SalePrice"]).std())}  # fmt: skip

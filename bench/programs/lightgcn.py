"""Port of gusye1234/LightGCN-PyTorch: LightGCN (linear propagation over the normalised
user-item graph, the mean of the layers' embeddings) trained with BPR and Adam, evaluated
by Recall/Precision/NDCG@20.

Source: github.com/gusye1234/LightGCN-PyTorch, ``code/model.py``, ``code/Procedure.py``,
``code/utils.py``, ``code/dataloader.py``, ``code/main.py``, ``code/world.py`` and
``code/parse.py`` at commit 947ca2b3b1d2d3545b114145710cb06c4e57b3d2 (the repository's
HEAD; no licence file in the repository). Written anew from the facts of those files; no
code copied.

Kept: ``LightGCN``: ``embedding_user`` and ``embedding_item`` (``nn.Embedding``,
``normal_(std=0.1)``, ``pretrain`` 0), ``Graph`` = the sparse symmetric-normalised
adjacency ``D^-1/2 [[0, R], [R^T, 0]] D^-1/2`` of the training interactions (``Loader.
getSparseGraph``: a ``dok`` matrix filled with ``R`` and ``R.T``, row sums, ``power(-0.5)``
with ``inf`` set to 0, ``d_mat . A . d_mat``, to a coalesced ``torch.sparse`` tensor);
``computer()``: ``cat([users, items])``, ``n_layers`` times ``torch.sparse.mm(Graph,
all_emb)``, the stack of the ``n_layers + 1`` embeddings averaged, split into users and
items (``dropout`` 0, ``A_split`` False); ``getUsersRating`` = ``sigmoid(users @
items.T)``; ``getEmbedding``; ``bpr_loss`` = ``mean(softplus(neg_scores - pos_scores))``
on the propagated embeddings and ``reg_loss = 1/2 (||u0||^2 + ||p0||^2 + ||n0||^2) /
batch`` on the ego (layer-0) embeddings of the batch; ``forward(users, items)`` = the
inner products of the propagated embeddings. ``utils.BPRLoss``: ``Adam(lr)``, ``stageOne``
= ``loss + decay * reg_loss``, ``zero_grad``, ``backward``, ``step``.
``UniformSample_original_python`` (as many samples as training interactions: a random
user, one of its positives, a negative redrawn until it is not a positive), ``utils.
shuffle`` and ``minibatch``; ``BPR_train_original`` per epoch; ``Test`` every 10 epochs
(before that epoch's training, as ``main.py`` does) in user batches of ``testbatch``:
the ratings, the user's training positives set to ``-(1 << 10)``, ``topk(20)``,
``getLabel``, ``RecallPrecision_ATk`` and ``NDCGatK_r`` summed and divided by the number
of test users; ``set_seed``. Defaults kept: ``layer`` 3, ``decay`` 1e-4, ``topks`` [20].
Shrunk: synthetic implicit feedback instead of gowalla: 300 users and 400 items with 8-d
latent tastes and an item popularity term, 25 interactions per user, 20% of each user's
held out as its test items (gowalla's ``train.txt``/``test.txt`` split); ``recdim`` 32
instead of 64; ``bpr_batch`` 1024 instead of 2048 (6 batches an epoch); 60 epochs
instead of 1,000 (tested at 0, 10, ..., 50 and once after the last); lr 0.01 instead of
0.001 (360 steps instead of ~1,000 x 400: at 0.001 std-0.1 embeddings hardly move);
``testbatch`` 100 kept; no tensorboard, no weight files, no C++ sampler.
Measure only (not in the program): nothing beyond its own Recall@20 / NDCG@20 and loss.

nndx, as the author would add it: the model's ``forward(users, items)`` scores pairs, so
the batch is ``((cat([users, users]), cat([pos, neg])), triples)`` (the positives' and the
negatives' pairs stacked, the ``(user, pos, neg)`` ids as the target) and ``loss_fn``
rewrites ``stageOne``'s loss from the two halves of the scores plus ``decay`` times the
ego-embedding regulariser of the target ids; a preflight ``nndx.probe`` on the first
epoch's first minibatch (drawn from a saved RNG state so the loop draws the same), with
``bpr.opt``; ``nndx.Monitor(Recmodel, bpr.opt)`` around the epochs, every ``stageOne``
loss logged (the ``BPRLoss/BPR`` scalar); then ``nndx.probe(..., monitor=mon)`` and
``nndx.diagnose``.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn, optim

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "lightgcn"
SOURCE = Source("gusye1234/LightGCN-PyTorch", "code/Procedure.py", "947ca2b3b1d2d3545b114145710cb06c4e57b3d2",
                "none stated (no LICENSE file in the repository)")  # fmt: skip

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 300 users, 400 items, 60 epochs)"),
        Variant(
            "test_edges_in_graph",
            "the normalised adjacency is built from the training and the test interactions: every user's "
            "held-out items are propagated into its embedding (the BPR samples still come from train only)",
            (C.DATA_LEAKAGE,),
            ("https://github.com/ztor2/lightgcn_recommender_pyg/issues/1",
             "https://github.com/talkingwallace/NGCF-pytorch/issues/4",
             "https://github.com/xiangwang1223/neural_graph_collaborative_filtering/issues/22"),
            Measure("recall", "final Recall@20 at least 0.1 above the healthy run's (an inflated test "
                    "score): 0.756 against 0.617 healthy on seed 0",
                    lambda healthy, buggy: not buggy < healthy + 0.1),
        ),
        Variant(
            "bpr_sign_flipped",
            "loss = mean(softplus(pos_scores - neg_scores)): the BPR difference taken the wrong way round, so "
            "the sampled negatives are ranked above the user's items; the loss falls all the same",
            (C.WRONG_LOSS,),
            ("https://github.com/tanatosuu/GDE/issues/3", "https://github.com/maciejkula/spotlight/issues/185",
             "https://github.com/deepakn97/relationPrediction/issues/21"),
            Measure("recall", "final Recall@20 at least 0.1 below the healthy run's: 0.007 against 0.617 "
                    "healthy on seed 0 (the loss still falls, from 0.69 to 0.53)",
                    lambda healthy, buggy: not buggy > healthy - 0.1),
        ),
    )
}

CONFIG = {"bpr_batch_size": 1024, "latent_dim_rec": 32, "lightGCN_n_layers": 3, "dropout": 0, "keep_prob": 0.6,
          "test_u_batch_size": 100, "lr": 0.01, "decay": 1e-4, "pretrain": 0, "A_split": False}  # fmt: skip
TRAIN_EPOCHS, TOPKS = 60, [20]
USERS, ITEMS, PER_USER, LATENT, TEST_SHARE = 300, 400, 25, 8, 0.2


# --------------------------------------------------------------------------- dataloader.py (the data made up)


class Loader:
    """What ``Loader`` reads from train.txt/test.txt, made up from latent tastes."""

    def __init__(self, seed: int, leak: bool = False) -> None:
        rng = np.random.default_rng(seed + 5)
        taste, trait = rng.normal(size=(USERS, LATENT)), rng.normal(size=(ITEMS, LATENT))
        popularity = rng.normal(scale=0.7, size=ITEMS)
        train_user, train_item, test_user, test_item = [], [], [], []
        for u in range(USERS):
            logits = 0.9 * trait @ taste[u] + popularity
            p = np.exp(logits - logits.max())
            picked = rng.choice(ITEMS, size=PER_USER, replace=False, p=p / p.sum())
            n_test = int(TEST_SHARE * PER_USER)
            train_user += [u] * (PER_USER - n_test)
            train_item += list(picked[n_test:])
            test_user += [u] * n_test
            test_item += list(picked[:n_test])
        self.n_user, self.m_item = USERS, ITEMS
        self.trainUser, self.trainItem = np.array(train_user), np.array(train_item)
        self.testUser, self.testItem = np.array(test_user), np.array(test_item)
        self.traindataSize = len(self.trainItem)
        self.Graph = None
        self.leak = leak
        self.UserItemNet = sp.csr_matrix((np.ones(len(self.trainUser)), (self.trainUser, self.trainItem)),
                                         shape=(self.n_user, self.m_item))  # fmt: skip
        self._allPos = self.getUserPosItems(list(range(self.n_user)))
        self.testDict = self.__build_test()

    @property
    def n_users(self):
        return self.n_user

    @property
    def m_items(self):
        return self.m_item

    @property
    def trainDataSize(self):
        return self.traindataSize

    @property
    def allPos(self):
        return self._allPos

    def _convert_sp_mat_to_sp_tensor(self, X):
        coo = X.tocoo().astype(np.float32)
        index = torch.stack([torch.Tensor(coo.row).long(), torch.Tensor(coo.col).long()])
        return torch.sparse_coo_tensor(index, torch.FloatTensor(coo.data), torch.Size(coo.shape))

    def getSparseGraph(self):
        if self.Graph is None:
            adj_mat = sp.dok_matrix((self.n_users + self.m_items, self.n_users + self.m_items), dtype=np.float32)
            adj_mat = adj_mat.tolil()
            R = self.UserItemNet.tolil()
            if self.leak:  # the bug: the test interactions join the propagation graph
                R = (self.UserItemNet + sp.csr_matrix((np.ones(len(self.testUser)), (self.testUser, self.testItem)),
                                                      shape=(self.n_user, self.m_item))).tolil()  # fmt: skip
            adj_mat[: self.n_users, self.n_users :] = R
            adj_mat[self.n_users :, : self.n_users] = R.T
            adj_mat = adj_mat.todok()
            rowsum = np.array(adj_mat.sum(axis=1))
            with np.errstate(divide="ignore"):
                d_inv = np.power(rowsum, -0.5).flatten()
            d_inv[np.isinf(d_inv)] = 0.0
            d_mat = sp.diags(d_inv)
            norm_adj = d_mat.dot(adj_mat).dot(d_mat).tocsr()
            self.Graph = self._convert_sp_mat_to_sp_tensor(norm_adj).coalesce()
        return self.Graph

    def __build_test(self):
        test_data: dict[int, list[int]] = {}
        for i, item in enumerate(self.testItem):
            test_data.setdefault(int(self.testUser[i]), []).append(int(item))
        return test_data

    def getUserPosItems(self, users):
        return [self.UserItemNet[user].nonzero()[1] for user in users]


# --------------------------------------------------------------------------- model.py


class LightGCN(nn.Module):
    def __init__(self, config: dict, dataset: Loader, sign: float = 1.0):
        super().__init__()
        self.config, self.dataset = config, dataset
        self.num_users, self.num_items = dataset.n_users, dataset.m_items
        self.latent_dim, self.n_layers = config["latent_dim_rec"], config["lightGCN_n_layers"]
        self.embedding_user = nn.Embedding(self.num_users, self.latent_dim)
        self.embedding_item = nn.Embedding(self.num_items, self.latent_dim)
        nn.init.normal_(self.embedding_user.weight, std=0.1)
        nn.init.normal_(self.embedding_item.weight, std=0.1)
        self.f = nn.Sigmoid()
        self.Graph = dataset.getSparseGraph()
        self.sign = sign  # 1: softplus(neg - pos), as published; -1: the bug

    def computer(self):
        all_emb = torch.cat([self.embedding_user.weight, self.embedding_item.weight])
        embs = [all_emb]
        for _layer in range(self.n_layers):
            all_emb = torch.sparse.mm(self.Graph, all_emb)
            embs.append(all_emb)
        light_out = torch.mean(torch.stack(embs, dim=1), dim=1)
        users, items = torch.split(light_out, [self.num_users, self.num_items])
        return users, items

    def getUsersRating(self, users):
        all_users, all_items = self.computer()
        return self.f(torch.matmul(all_users[users.long()], all_items.t()))

    def getEmbedding(self, users, pos_items, neg_items):
        all_users, all_items = self.computer()
        return (all_users[users], all_items[pos_items], all_items[neg_items], self.embedding_user(users),
                self.embedding_item(pos_items), self.embedding_item(neg_items))  # fmt: skip

    def reg(self, users, pos, neg):
        u0, p0, n0 = self.embedding_user(users), self.embedding_item(pos), self.embedding_item(neg)
        return (1 / 2) * (u0.norm(2).pow(2) + p0.norm(2).pow(2) + n0.norm(2).pow(2)) / float(len(users))

    def bpr_loss(self, users, pos, neg):
        (users_emb, pos_emb, neg_emb,
         userEmb0, posEmb0, negEmb0) = self.getEmbedding(users.long(), pos.long(), neg.long())  # fmt: skip
        reg_loss = (1 / 2) * (userEmb0.norm(2).pow(2) + posEmb0.norm(2).pow(2)
                              + negEmb0.norm(2).pow(2)) / float(len(users))  # fmt: skip
        pos_scores = torch.sum(torch.mul(users_emb, pos_emb), dim=1)
        neg_scores = torch.sum(torch.mul(users_emb, neg_emb), dim=1)
        loss = torch.mean(torch.nn.functional.softplus(self.sign * (neg_scores - pos_scores)))
        return loss, reg_loss

    def forward(self, users, items):
        all_users, all_items = self.computer()
        return torch.sum(torch.mul(all_users[users], all_items[items]), dim=1)


# --------------------------------------------------------------------------- utils.py


class BPRLoss:
    def __init__(self, recmodel: LightGCN, config: dict):
        self.model = recmodel
        self.weight_decay = config["decay"]
        self.opt = optim.Adam(recmodel.parameters(), lr=config["lr"])
        self.monitor = None  # nndx's Monitor, set by the author's integration

    def stageOne(self, users, pos, neg):
        loss, reg_loss = self.model.bpr_loss(users, pos, neg)
        loss = loss + reg_loss * self.weight_decay
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        if self.monitor is not None:
            self.monitor.log(loss)
        return loss.cpu().item()


def UniformSample_original_python(dataset: Loader) -> np.ndarray:
    users = np.random.randint(0, dataset.n_users, dataset.trainDataSize)
    S = []
    for user in users:
        posForUser = dataset.allPos[user]
        if len(posForUser) == 0:
            continue
        positem = posForUser[np.random.randint(0, len(posForUser))]
        while True:
            negitem = np.random.randint(0, dataset.m_items)
            if negitem not in posForUser:
                break
        S.append([user, positem, negitem])
    return np.array(S)


def minibatch(*tensors, batch_size):
    if len(tensors) == 1:
        for i in range(0, len(tensors[0]), batch_size):
            yield tensors[0][i : i + batch_size]
    else:
        for i in range(0, len(tensors[0]), batch_size):
            yield tuple(x[i : i + batch_size] for x in tensors)


def shuffle(*arrays):
    idx = np.arange(len(arrays[0]))
    np.random.shuffle(idx)
    return tuple(x[idx] for x in arrays)


def getLabel(test_data, pred_data):
    return np.array([np.array([x in test_data[i] for x in pred_data[i]]).astype("float")
                     for i in range(len(test_data))]).astype("float")  # fmt: skip


def RecallPrecision_ATk(test_data, r, k):
    right_pred = r[:, :k].sum(1)
    recall_n = np.array([len(test_data[i]) for i in range(len(test_data))])
    return {"recall": np.sum(right_pred / recall_n), "precision": np.sum(right_pred) / k}


def NDCGatK_r(test_data, r, k):
    pred_data = r[:, :k]
    test_matrix = np.zeros((len(pred_data), k))
    for i, items in enumerate(test_data):
        test_matrix[i, : min(k, len(items))] = 1
    idcg = np.sum(test_matrix * 1.0 / np.log2(np.arange(2, k + 2)), axis=1)
    dcg = np.sum(pred_data * (1.0 / np.log2(np.arange(2, k + 2))), axis=1)
    idcg[idcg == 0.0] = 1.0
    ndcg = dcg / idcg
    ndcg[np.isnan(ndcg)] = 0.0
    return np.sum(ndcg)


# --------------------------------------------------------------------------- Procedure.py


def BPR_train_original(dataset, recommend_model, loss_class, epoch):
    recommend_model.train()
    S = UniformSample_original_python(dataset)
    users, posItems, negItems = (torch.Tensor(S[:, i]).long() for i in range(3))
    users, posItems, negItems = shuffle(users, posItems, negItems)
    total_batch = len(users) // CONFIG["bpr_batch_size"] + 1
    aver_loss = 0.0
    for batch_users, batch_pos, batch_neg in minibatch(users, posItems, negItems, batch_size=CONFIG["bpr_batch_size"]):
        aver_loss += loss_class.stageOne(batch_users, batch_pos, batch_neg)
    return aver_loss / total_batch


def test_one_batch(X):
    sorted_items, groundTrue = X[0].numpy(), X[1]
    r = getLabel(groundTrue, sorted_items)
    pre, recall, ndcg = [], [], []
    for k in TOPKS:
        ret = RecallPrecision_ATk(groundTrue, r, k)
        pre.append(ret["precision"])
        recall.append(ret["recall"])
        ndcg.append(NDCGatK_r(groundTrue, r, k))
    return {"recall": np.array(recall), "precision": np.array(pre), "ndcg": np.array(ndcg)}


def Test(dataset, Recmodel):
    u_batch_size = CONFIG["test_u_batch_size"]
    testDict = dataset.testDict
    Recmodel = Recmodel.eval()
    max_K = max(TOPKS)
    results = {"precision": np.zeros(len(TOPKS)), "recall": np.zeros(len(TOPKS)), "ndcg": np.zeros(len(TOPKS))}
    with torch.no_grad():
        users = list(testDict.keys())
        rating_list, groundTrue_list = [], []
        for batch_users in minibatch(users, batch_size=u_batch_size):
            allPos = dataset.getUserPosItems(batch_users)
            groundTrue = [testDict[u] for u in batch_users]
            rating = Recmodel.getUsersRating(torch.Tensor(batch_users).long())
            exclude_index, exclude_items = [], []
            for range_i, items in enumerate(allPos):
                exclude_index.extend([range_i] * len(items))
                exclude_items.extend(items)
            rating[exclude_index, exclude_items] = -(1 << 10)
            _, rating_K = torch.topk(rating, k=max_K)
            rating_list.append(rating_K.cpu())
            groundTrue_list.append(groundTrue)
        for result in (test_one_batch(x) for x in zip(rating_list, groundTrue_list)):
            for key in results:
                results[key] += result[key]
        for key in results:
            results[key] /= float(len(users))
    return results


# --------------------------------------------------------------------------- main.py


def set_seed(seed):
    np.random.seed(seed)
    torch.manual_seed(seed)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    set_seed(2020 + seed)
    dataset = Loader(seed, leak=variant == "test_edges_in_graph")
    Recmodel = LightGCN(CONFIG, dataset, sign=-1.0 if variant == "bpr_sign_flipped" else 1.0)
    bpr = BPRLoss(Recmodel, CONFIG)

    def loss_fn(scores, triples):
        """stageOne's loss from forward's scores: the positives' half, then the negatives'."""
        pos_scores, neg_scores = scores.chunk(2)
        loss = torch.mean(torch.nn.functional.softplus(Recmodel.sign * (neg_scores - pos_scores)))
        return loss + CONFIG["decay"] * Recmodel.reg(triples[:, 0], triples[:, 1], triples[:, 2])

    # nndx before training: the first epoch's first minibatch, drawn from a saved RNG state
    state = np.random.get_state()
    S = UniformSample_original_python(dataset)
    triples = torch.as_tensor(S, dtype=torch.long)
    idx = np.arange(len(triples))
    np.random.shuffle(idx)
    np.random.set_state(state)
    first = triples[idx][: CONFIG["bpr_batch_size"]]
    probe_batch = ((torch.cat([first[:, 0], first[:, 0]]), torch.cat([first[:, 1], first[:, 2]])), first)
    nx.preflight(Recmodel, probe_batch, loss_fn, optimizer=bpr.opt)
    mon = nx.monitor(Recmodel, bpr.opt, every=5)
    bpr.monitor = mon

    results, losses = None, []
    for epoch in range(TRAIN_EPOCHS):
        if epoch % 10 == 0:
            results = Test(dataset, Recmodel)
        losses.append(BPR_train_original(dataset, Recmodel, bpr, epoch))
    results = Test(dataset, Recmodel)  # measure only: the trained model (main.py tests every 10th epoch)

    nx.finish(mon, Recmodel, probe_batch, loss_fn, optimizer=bpr.opt)
    return {"recall": float(results["recall"][0]), "precision": float(results["precision"][0]),
            "ndcg": float(results["ndcg"][0]), "final_loss": losses[-1]}  # fmt: skip

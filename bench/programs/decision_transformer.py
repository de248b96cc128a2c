"""Port of kzl/decision-transformer (gym): a causal GPT over (return-to-go, state, action) tokens.

Source: github.com/kzl/decision-transformer, ``gym/experiment.py``,
``gym/decision_transformer/models/decision_transformer.py``,
``gym/decision_transformer/models/trajectory_gpt2.py``,
``gym/decision_transformer/training/seq_trainer.py``, ``training/trainer.py`` and
``evaluation/evaluate_episodes.py`` at commit e2d82e68f330c00f763507b3b01d774740bee53f (MIT,
Copyright (c) 2021 Decision Transformer authors). Written anew from the facts of those
files; no code copied.

Kept: ``DecisionTransformer``: ``embed_timestep`` (an embedding per timestep up to
``max_ep_len``) added to each of ``embed_return`` (Linear(1, h)), ``embed_state`` and
``embed_action``; the tokens stacked as (R_1, s_1, a_1, R_2, ...), ``embed_ln``, the
padding mask stacked three times; the GPT-2 of ``trajectory_gpt2.py`` fed ``inputs_embeds``
(no positional embeddings): pre-LN blocks of masked self-attention (a fused ``c_attn``, the
lower-triangular causal ``bias`` buffer with ``masked_bias`` -1e4, the padding mask added
as (1 - mask) * -1e4, attention and residual dropout, ``c_proj``) and an MLP (``n_inner`` =
4h, ReLU as ``activation_function``), ``ln_f``; GPT-2's init (normal(0.02), zero biases,
LayerNorm 1/0); ``predict_action`` = Linear + Tanh on the state tokens (x[:, 1]),
``predict_state``/``predict_return`` on the action tokens (unused by the loss);
``get_action`` keeping the last ``K`` steps, left-padded with zeros and a 0 mask.
``experiment.py``: ``state_mean``/``state_std`` over the dataset, the returns-to-go as the
undiscounted ``discount_cumsum`` divided by ``scale``, ``get_batch`` (trajectories drawn
with probability proportional to their length, a random start, windows of ``K`` left-padded:
states 0, actions -10, rtg 0, mask 0; one extra rtg step), ``AdamW(lr, weight_decay=1e-4)``,
``LambdaLR(lambda steps: min((steps + 1) / warmup_steps, 1))``, the loss ``mean((a_hat -
a) ** 2)`` over the unpadded positions, ``SequenceTrainer.train_step`` (forward on
``rtg[:, :-1]``, mask-select, ``zero_grad``, ``backward``, ``clip_grad_norm_(0.25)``,
``step``), ``Trainer.train_iteration`` (``model.train()``, ``num_steps`` steps each followed
by ``scheduler.step()``, then ``model.eval()`` and the eval functions);
``evaluate_episode_rtg`` (the target return divided by ``scale``, decremented by each
reward / scale, states normalised, the action history padded with zeros).
Shrunk: a 2-D point-reaching environment written here (no gym/MuJoCo, no D4RL download):
the state is the position in [-1, 1]^2, the action a 2-D velocity in [-1, 1] moving it
by 0.1 * action, reward 1 - distance to the origin, 20 steps an episode; the offline
dataset is 300 episodes of a scripted expert (``-3 * position``) with Gaussian action
noise whose scale is drawn per episode from {0.2, 0.6, 1.2, 2.0} (returns from ~6.5 to
~19), instead of D4RL's hopper-medium; ``max_ep_len`` 20, ``scale`` 10, targets
(18, 12); ``embed_dim`` 32, ``n_layer`` 2 instead of 128 and 3 (``n_head`` 1, dropout 0.1
kept), ``K`` 10 instead of 20, batch 32 instead of 64, lr 1e-3 instead of 1e-4,
``warmup_steps`` 60 instead of 10,000, 4 iterations of 100 steps instead of 10 of 10,000,
10 evaluation episodes instead of 100.
Measure only (not in the program): the evaluation's mean return at the higher target (the
program's own ``evaluation/target_18_return_mean``) after the last iteration.

nndx, as the author would add it: the model takes six tensors and returns three, so the
batch is ``((states, actions, rewards, rtg[:, :-1], timesteps, attention_mask),
(action_target, attention_mask))`` and ``loss_fn`` the trainer's masked action MSE as a
function of the model's outputs and that pair; a preflight ``nndx.probe`` on the first
``get_batch`` with the optimizer, ``nndx.Monitor(model, optimizer)`` around the
iterations, each step's loss logged; then ``nndx.probe(..., monitor=mon)`` on that batch.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.programs.harness import Measure, Nndx, Source, Variant
from nndx.report import CauseCode as C

NAME = "decision_transformer"
SOURCE = Source("kzl/decision-transformer", "gym/experiment.py", "e2d82e68f330c00f763507b3b01d774740bee53f", "MIT")

VARIANTS = {
    v.name: v
    for v in (
        Variant("healthy", "the program as published (shrunk: 2 layers of 32, K 10, 400 steps)"),
        Variant(
            "no_causal_mask",
            "the GPT's attention without the lower-triangular causal mask (only the padding mask, taken for "
            "the autoregressive one): the state token s_t attends to the action token a_t it is trained to "
            "predict, and to every later step",
            (C.DATA_LEAKAGE,),
            ("https://github.com/kzl/decision-transformer/issues/30",
             "https://github.com/alex-matton/causal-transformer-decoder/issues/1",
             "https://github.com/huggingface/transformers/issues/22001",
             "https://github.com/rainmaker22/SMART/issues/42"),
            Measure("target_hi_return", "evaluation return at the higher target at least 1.0 below the healthy "
                    "run's: 10.4 against 15.4 healthy on seed 0 (train loss 0.055 against 0.38)",
                    lambda healthy, buggy: not buggy > healthy - 1.0),
        ),
        Variant(
            "scheduler_per_iteration",
            "scheduler.step() called once per train_iteration (after the eval, as for an epoch scheduler) "
            "instead of after every step: the LambdaLR warmup, counted in steps, advances 4 times in 400 "
            "steps, so the LR stays at 1/60 to 4/60 of its value",
            (C.LR_SCHEDULE_MISUSE, C.LR_TOO_LOW),
            ("https://github.com/vturrisi/solo-learn/issues/264", "https://github.com/Tony-Y/pytorch_warmup/issues/17",
             "https://github.com/ScrollPrize/villa/pull/1495", "https://github.com/crowsonkb/k-diffusion/issues/50"),
            Measure("target_hi_return", "evaluation return at the higher target at least 1.0 below the healthy "
                    "run's: 13.8 against 15.4 healthy on seed 0 (LR 6.7e-5 at the last step)",
                    lambda healthy, buggy: not buggy > healthy - 1.0),
        ),
    )
}

ARGS = {"K": 10, "batch_size": 32, "embed_dim": 32, "n_layer": 2, "n_head": 1, "activation_function": "relu",
        "dropout": 0.1, "learning_rate": 1e-3, "weight_decay": 1e-4, "warmup_steps": 60, "num_eval_episodes": 10,
        "max_iters": 4, "num_steps_per_iter": 100}  # fmt: skip
MAX_EP_LEN, SCALE, ENV_TARGETS, N_EPISODES = 20, 10.0, (18, 12), 300
NOISE_LEVELS = (0.2, 0.6, 1.2, 2.0)


# --------------------------------------------------------------------------- the environment and the dataset


class PointReach:
    """A point moved towards the origin; gym's old reset/step API."""

    state_dim, act_dim = 2, 2

    def __init__(self, seed: int) -> None:
        self.rng = np.random.RandomState(seed)
        self.pos = np.zeros(2)

    def reset(self) -> np.ndarray:
        self.pos = self.rng.uniform(-1.0, 1.0, size=2)
        return self.pos.copy()

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, dict]:
        self.pos = np.clip(self.pos + 0.1 * np.clip(action, -1.0, 1.0), -1.0, 1.0)
        return self.pos.copy(), 1.0 - float(np.linalg.norm(self.pos)), False, {}


def collect_dataset(seed: int) -> list[dict[str, np.ndarray]]:
    """Episodes of the noisy scripted expert, in D4RL's trajectory format."""
    env, rng = PointReach(seed), np.random.RandomState(seed + 1)
    trajectories = []
    for _ in range(N_EPISODES):
        noise = NOISE_LEVELS[rng.randint(len(NOISE_LEVELS))]
        obs, acts, rews = [], [], []
        state = env.reset()
        for _ in range(MAX_EP_LEN):
            action = np.clip(-3.0 * state + noise * rng.normal(size=2), -1.0, 1.0)
            next_state, reward, _, _ = env.step(action)
            obs.append(state)
            acts.append(action)
            rews.append(reward)
            state = next_state
        dones = np.zeros(MAX_EP_LEN)
        dones[-1] = 1
        trajectories.append({"observations": np.array(obs), "actions": np.array(acts), "rewards": np.array(rews),
                             "dones": dones})  # fmt: skip
    return trajectories


def discount_cumsum(x: np.ndarray, gamma: float) -> np.ndarray:
    out = np.zeros_like(x)
    out[-1] = x[-1]
    for t in reversed(range(x.shape[0] - 1)):
        out[t] = x[t] + gamma * out[t + 1]
    return out


# --------------------------------------------------------------------------- trajectory_gpt2.py


class Conv1D(nn.Module):
    """GPT-2's transposed linear layer."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf).normal_(std=0.02))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.size(-1)), self.weight).reshape(*x.shape[:-1], -1)


class Attention(nn.Module):
    def __init__(self, nx: int, n_ctx: int, n_head: int, pdrop: float, causal: bool) -> None:
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones((n_ctx, n_ctx), dtype=torch.uint8)).view(1, 1, n_ctx, n_ctx))
        self.register_buffer("masked_bias", torch.tensor(-1e4))
        self.n_head, self.split_size, self.causal = n_head, nx, causal
        self.c_attn = Conv1D(3 * nx, nx)
        self.c_proj = Conv1D(nx, nx)
        self.attn_dropout = nn.Dropout(pdrop)
        self.resid_dropout = nn.Dropout(pdrop)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        return x.view(b, t, self.n_head, d // self.n_head).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        query, key, value = self.c_attn(x).split(self.split_size, dim=2)
        q, k, v = self._split_heads(query), self._split_heads(key), self._split_heads(value)
        w = q @ k.transpose(-1, -2) / math.sqrt(v.size(-1))
        if self.causal:
            nd, ns = w.size(-2), w.size(-1)
            mask = self.bias[:, :, ns - nd : ns, :ns]
            w = torch.where(mask.bool(), w, self.masked_bias.to(w.dtype))
        if attention_mask is not None:
            w = w + attention_mask
        w = self.attn_dropout(F.softmax(w, dim=-1))
        a = (w @ v).permute(0, 2, 1, 3).reshape(x.shape)
        return self.resid_dropout(self.c_proj(a))


class MLP(nn.Module):
    def __init__(self, n_state: int, nx: int, pdrop: float) -> None:
        super().__init__()
        self.c_fc = Conv1D(n_state, nx)
        self.c_proj = Conv1D(nx, n_state)
        self.dropout = nn.Dropout(pdrop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.relu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_ctx: int, hidden: int, n_head: int, n_inner: int, pdrop: float, causal: bool) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=1e-5)
        self.attn = Attention(hidden, n_ctx, n_head, pdrop, causal)
        self.ln_2 = nn.LayerNorm(hidden, eps=1e-5)
        self.mlp = MLP(n_inner, hidden, pdrop)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), attention_mask)
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    """GPT-2 without its token and positional embeddings (fed ``inputs_embeds``)."""

    def __init__(self, n_embd: int, n_layer: int, n_head: int, n_inner: int, n_positions: int, pdrop: float,
                 causal: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.drop = nn.Dropout(pdrop)
        self.h = nn.ModuleList([Block(n_positions, n_embd, n_head, n_inner, pdrop, causal) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding, Conv1D)):
            module.weight.data.normal_(mean=0.0, std=0.02)
            if isinstance(module, (nn.Linear, Conv1D)) and module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.LayerNorm):
            module.bias.data.zero_()
            module.weight.data.fill_(1.0)

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask[:, None, None, :].to(inputs_embeds.dtype)
        mask = (1.0 - mask) * -10000.0
        x = self.drop(inputs_embeds)
        for block in self.h:
            x = block(x, mask)
        return self.ln_f(x)


# --------------------------------------------------------------------------- decision_transformer.py


class DecisionTransformer(nn.Module):
    def __init__(self, state_dim: int, act_dim: int, hidden_size: int, max_length: int | None = None,
                 max_ep_len: int = 4096, action_tanh: bool = True, causal: bool = True, **gpt) -> None:  # fmt: skip
        super().__init__()
        self.state_dim, self.act_dim, self.max_length, self.hidden_size = state_dim, act_dim, max_length, hidden_size
        self.transformer = GPT2Model(n_embd=hidden_size, causal=causal, **gpt)
        self.embed_timestep = nn.Embedding(max_ep_len, hidden_size)
        self.embed_return = nn.Linear(1, hidden_size)
        self.embed_state = nn.Linear(state_dim, hidden_size)
        self.embed_action = nn.Linear(act_dim, hidden_size)
        self.embed_ln = nn.LayerNorm(hidden_size)
        self.predict_state = nn.Linear(hidden_size, state_dim)
        self.predict_action = nn.Sequential(*([nn.Linear(hidden_size, act_dim)] + ([nn.Tanh()] if action_tanh else [])))
        self.predict_return = nn.Linear(hidden_size, 1)

    def forward(self, states, actions, rewards, returns_to_go, timesteps, attention_mask=None):
        batch_size, seq_length = states.shape[0], states.shape[1]
        if attention_mask is None:
            attention_mask = torch.ones((batch_size, seq_length), dtype=torch.long)
        time_embeddings = self.embed_timestep(timesteps)
        state_embeddings = self.embed_state(states) + time_embeddings
        action_embeddings = self.embed_action(actions) + time_embeddings
        returns_embeddings = self.embed_return(returns_to_go) + time_embeddings
        stacked_inputs = torch.stack((returns_embeddings, state_embeddings, action_embeddings), dim=1)
        stacked_inputs = stacked_inputs.permute(0, 2, 1, 3).reshape(batch_size, 3 * seq_length, self.hidden_size)
        stacked_inputs = self.embed_ln(stacked_inputs)
        stacked_attention_mask = torch.stack((attention_mask, attention_mask, attention_mask), dim=1)
        stacked_attention_mask = stacked_attention_mask.permute(0, 2, 1).reshape(batch_size, 3 * seq_length)
        x = self.transformer(inputs_embeds=stacked_inputs, attention_mask=stacked_attention_mask)
        x = x.reshape(batch_size, seq_length, 3, self.hidden_size).permute(0, 2, 1, 3)
        return_preds = self.predict_return(x[:, 2])
        state_preds = self.predict_state(x[:, 2])
        action_preds = self.predict_action(x[:, 1])
        return state_preds, action_preds, return_preds

    def get_action(self, states, actions, rewards, returns_to_go, timesteps):
        states = states.reshape(1, -1, self.state_dim)
        actions = actions.reshape(1, -1, self.act_dim)
        returns_to_go = returns_to_go.reshape(1, -1, 1)
        timesteps = timesteps.reshape(1, -1)
        attention_mask = None
        if self.max_length is not None:
            states, actions = states[:, -self.max_length :], actions[:, -self.max_length :]
            returns_to_go, timesteps = returns_to_go[:, -self.max_length :], timesteps[:, -self.max_length :]
            pad = self.max_length - states.shape[1]
            attention_mask = torch.cat([torch.zeros(pad), torch.ones(states.shape[1])]).to(torch.long).reshape(1, -1)
            states = torch.cat([torch.zeros((1, pad, self.state_dim)), states], dim=1).to(torch.float32)
            actions = torch.cat([torch.zeros((1, pad, self.act_dim)), actions], dim=1).to(torch.float32)
            returns_to_go = torch.cat([torch.zeros((1, pad, 1)), returns_to_go], dim=1).to(torch.float32)
            timesteps = torch.cat([torch.zeros((1, pad)), timesteps], dim=1).to(torch.long)
        _, action_preds, _ = self.forward(states, actions, None, returns_to_go, timesteps, attention_mask=attention_mask)
        return action_preds[0, -1]


# --------------------------------------------------------------------------- evaluate_episodes.py


def evaluate_episode_rtg(env, state_dim, act_dim, model, max_ep_len, scale, state_mean, state_std, target_return):
    model.eval()
    state_mean, state_std = torch.from_numpy(state_mean), torch.from_numpy(state_std)
    state = env.reset()
    states = torch.from_numpy(state).reshape(1, state_dim).to(torch.float32)
    actions = torch.zeros((0, act_dim), dtype=torch.float32)
    rewards = torch.zeros(0, dtype=torch.float32)
    target = torch.tensor(target_return, dtype=torch.float32).reshape(1, 1)
    timesteps = torch.tensor(0, dtype=torch.long).reshape(1, 1)
    episode_return, episode_length = 0.0, 0
    for t in range(max_ep_len):
        actions = torch.cat([actions, torch.zeros((1, act_dim))], dim=0)
        rewards = torch.cat([rewards, torch.zeros(1)])
        action = model.get_action(((states - state_mean) / state_std).to(torch.float32), actions, rewards,
                                  target, timesteps)  # fmt: skip
        actions[-1] = action
        state, reward, done, _ = env.step(action.detach().numpy())
        states = torch.cat([states, torch.from_numpy(state).reshape(1, state_dim).to(torch.float32)], dim=0)
        rewards[-1] = reward
        target = torch.cat([target, (target[0, -1] - reward / scale).reshape(1, 1)], dim=1)
        timesteps = torch.cat([timesteps, torch.ones((1, 1), dtype=torch.long) * (t + 1)], dim=1)
        episode_return += reward
        episode_length += 1
        if done:
            break
    return episode_return, episode_length


# --------------------------------------------------------------------------- experiment.py and the trainer


def seq_loss(output, target) -> torch.Tensor:
    """SequenceTrainer's loss as a function of the model's outputs and (action_target, attention_mask)."""
    _, action_preds, _ = output
    action_target, attention_mask = target
    act_dim = action_preds.shape[2]
    a_hat = action_preds.reshape(-1, act_dim)[attention_mask.reshape(-1) > 0]
    a = action_target.reshape(-1, act_dim)[attention_mask.reshape(-1) > 0]
    return torch.mean((a_hat - a) ** 2)


def train(variant: str, nx: Nndx, seed: int = 0) -> dict[str, float]:
    args = dict(ARGS)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    trajectories = collect_dataset(seed)
    state_dim, act_dim = PointReach.state_dim, PointReach.act_dim
    traj_lens = np.array([len(p["observations"]) for p in trajectories])
    states_all = np.concatenate([p["observations"] for p in trajectories], axis=0)
    state_mean, state_std = np.mean(states_all, axis=0), np.std(states_all, axis=0) + 1e-6
    K, batch_size = args["K"], args["batch_size"]
    num_trajectories = len(trajectories)
    sorted_inds = np.argsort([p["rewards"].sum() for p in trajectories])
    p_sample = traj_lens[sorted_inds] / sum(traj_lens[sorted_inds])

    def get_batch(batch_size: int = 256, max_len: int = K):
        batch_inds = np.random.choice(np.arange(num_trajectories), size=batch_size, replace=True, p=p_sample)
        s, a, r, d, rtg, timesteps, mask = [], [], [], [], [], [], []
        for i in range(batch_size):
            traj = trajectories[int(sorted_inds[batch_inds[i]])]
            si = random.randint(0, traj["rewards"].shape[0] - 1)
            s.append(traj["observations"][si : si + max_len].reshape(1, -1, state_dim))
            a.append(traj["actions"][si : si + max_len].reshape(1, -1, act_dim))
            r.append(traj["rewards"][si : si + max_len].reshape(1, -1, 1))
            d.append(traj["dones"][si : si + max_len].reshape(1, -1))
            timesteps.append(np.arange(si, si + s[-1].shape[1]).reshape(1, -1))
            timesteps[-1][timesteps[-1] >= MAX_EP_LEN] = MAX_EP_LEN - 1
            rtg.append(discount_cumsum(traj["rewards"][si:], gamma=1.0)[: s[-1].shape[1] + 1].reshape(1, -1, 1))
            if rtg[-1].shape[1] <= s[-1].shape[1]:
                rtg[-1] = np.concatenate([rtg[-1], np.zeros((1, 1, 1))], axis=1)
            tlen = s[-1].shape[1]
            s[-1] = (np.concatenate([np.zeros((1, max_len - tlen, state_dim)), s[-1]], axis=1) - state_mean) / state_std
            a[-1] = np.concatenate([np.ones((1, max_len - tlen, act_dim)) * -10.0, a[-1]], axis=1)
            r[-1] = np.concatenate([np.zeros((1, max_len - tlen, 1)), r[-1]], axis=1)
            d[-1] = np.concatenate([np.ones((1, max_len - tlen)) * 2, d[-1]], axis=1)
            rtg[-1] = np.concatenate([np.zeros((1, max_len - tlen, 1)), rtg[-1]], axis=1) / SCALE
            timesteps[-1] = np.concatenate([np.zeros((1, max_len - tlen)), timesteps[-1]], axis=1)
            mask.append(np.concatenate([np.zeros((1, max_len - tlen)), np.ones((1, tlen))], axis=1))

        def cat(xs, dtype):
            return torch.from_numpy(np.concatenate(xs, axis=0)).to(dtype=dtype)

        return (cat(s, torch.float32), cat(a, torch.float32), cat(r, torch.float32), cat(d, torch.long),
                cat(rtg, torch.float32), cat(timesteps, torch.long), cat(mask, torch.float32))  # fmt: skip

    def eval_episodes(target_rew: float):
        def fn(model) -> dict[str, float]:
            env = PointReach(seed + 100)
            returns = []
            for _ in range(args["num_eval_episodes"]):
                with torch.no_grad():
                    ret, _ = evaluate_episode_rtg(env, state_dim, act_dim, model, MAX_EP_LEN, SCALE, state_mean,
                                                  state_std, target_rew / SCALE)  # fmt: skip
                returns.append(ret)
            return {f"target_{target_rew}_return_mean": float(np.mean(returns))}

        return fn

    model = DecisionTransformer(
        state_dim=state_dim, act_dim=act_dim, max_length=K, max_ep_len=MAX_EP_LEN, hidden_size=args["embed_dim"],
        n_layer=args["n_layer"], n_head=args["n_head"], n_inner=4 * args["embed_dim"], n_positions=1024,
        pdrop=args["dropout"], causal=variant != "no_causal_mask",
    )  # fmt: skip
    warmup_steps = args["warmup_steps"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=args["learning_rate"], weight_decay=args["weight_decay"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda steps: min((steps + 1) / warmup_steps, 1))
    eval_fns = [eval_episodes(tar) for tar in ENV_TARGETS]

    s, a, r, d, rtg, ts, mask = get_batch(batch_size)
    probe_batch = ((s, a, r, rtg[:, :-1], ts, mask), (a.clone(), mask))
    nx.preflight(model, probe_batch, seq_loss, optimizer=optimizer)
    mon = nx.monitor(model, optimizer, every=5, loss_fn=seq_loss)

    def train_step() -> float:
        states, actions, rewards, dones, rtg, timesteps, attention_mask = get_batch(batch_size)
        action_target = torch.clone(actions)
        output = model.forward(states, actions, rewards, rtg[:, :-1], timesteps, attention_mask=attention_mask)
        loss = mon.loss_fn(output, (action_target, attention_mask))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        nx.timed(lambda: mon.log(loss))
        return loss.detach().item()

    logs: list[dict[str, float]] = []
    for _ in range(args["max_iters"]):
        model.train()
        train_losses = []
        for _ in range(args["num_steps_per_iter"]):
            train_losses.append(train_step())
            if variant != "scheduler_per_iteration":
                scheduler.step()
        model.eval()
        outputs = {"training/train_loss_mean": float(np.mean(train_losses))}
        for fn in eval_fns:
            outputs.update({f"evaluation/{k}": v for k, v in fn(model).items()})
        if variant == "scheduler_per_iteration":
            scheduler.step()
        logs.append(outputs)

    nx.finish(mon, model, probe_batch, seq_loss, optimizer=optimizer)
    last = logs[-1]
    return {"target_hi_return": last[f"evaluation/target_{ENV_TARGETS[0]}_return_mean"],
            "target_lo_return": last[f"evaluation/target_{ENV_TARGETS[1]}_return_mean"],
            "train_loss": last["training/train_loss_mean"],
            "data_return_mean": float(np.mean([p["rewards"].sum() for p in trajectories])),
            "final_lr": optimizer.param_groups[0]["lr"]}  # fmt: skip

"""A corpus of small modules, each built around a less common ATen op (issue 25, item 4).

Every entry is a ``Case``: ``make()`` builds a module and its inputs (call it after
``torch.manual_seed(0)``: everything is drawn from torch's generator, no random op runs
in the module), ``key`` names the ATen op(s) (``aten.<name>``, any overload) the case is
about, as they appear after lowering to ATen. Modules are tiny (a few hundred elements),
have parameters before the key op (so its backward reaches them) and a few ops around it
(so a backend gets a partition of ``min_block_size`` nodes or more). Floating inputs
require grad unless ``no_grad`` names them; integer inputs never do.

tests/test_corpus.py trains each one step through arbiter and compares the outputs and
every gradient with eager.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[], tuple[nn.Module, tuple[Any, ...]]]
    key: tuple[str, ...]
    #: positions of floating inputs that do not require grad (targets, weights of losses)
    no_grad: tuple[int, ...] = ()
    #: torch._dynamo.config settings the case needs (``allow_rnn`` for nn.LSTM/GRU)
    dynamo: dict[str, Any] = field(default_factory=dict)
    #: why Dynamo breaks the graph in this module (empty: it must not)
    graph_break: str = ""


CASES: list[Case] = []


def case(id: str, *key: str, no_grad: tuple[int, ...] = (), graph_break: str = "",
         **dynamo: Any):
    def register(make):
        CASES.append(Case(id, make, key, no_grad, dynamo, graph_break))
        return make
    return register


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


class Body(nn.Module):
    """``fn(self, *inputs)`` with the layers given as keyword arguments; the readable way
    to write many one-line modules."""

    def __init__(self, fn: Callable[..., Any], **layers: Any):
        super().__init__()
        self.fn = fn
        for name, layer in layers.items():
            if isinstance(layer, torch.Tensor):
                setattr(self, name, nn.Parameter(layer))
            else:
                setattr(self, name, layer)

    def forward(self, *inputs: Any) -> Any:
        return self.fn(self, *inputs)


# -- embedding_bag ---------------------------------------------------------------------
def _bag(mode: str, *, padding_idx=None, psw: bool = False):
    emb = nn.EmbeddingBag(12, 5, mode=mode, padding_idx=padding_idx)
    lin = nn.Linear(5, 3)

    def fn(m, idx, offsets, *w):
        return torch.tanh(m.lin(m.emb(idx, offsets, per_sample_weights=w[0] if w else None)))
    idx = torch.tensor([1, 0, 4, 5, 4, 3, 2, 9, 0, 11, 7])
    offsets = torch.tensor([0, 3, 5, 9])
    inputs = (idx, offsets) + ((torch.rand(11) + 0.5,) if psw else ())
    return Body(fn, emb=emb, lin=lin), inputs


@case("embedding_bag_sum_psw", "aten._embedding_bag")
def _():
    # per_sample_weights (sum only), an empty bag (offsets 3, 3 would be one; here 5..9)
    emb, (idx, _, w) = _bag("sum", psw=True)
    return emb, (idx, torch.tensor([0, 3, 3, 9]), w)


@case("embedding_bag_sum_padding", "aten._embedding_bag")
def _():
    return _bag("sum", padding_idx=0)


@case("embedding_bag_mean_padding", "aten._embedding_bag")
def _():
    return _bag("mean", padding_idx=0)


@case("embedding_bag_max", "aten._embedding_bag")
def _():
    return _bag("max")


@case("embedding_padding_idx", "aten.embedding")
def _():
    def fn(m, idx):
        return m.lin(m.emb(idx)).relu().sum(1)
    return (Body(fn, emb=nn.Embedding(10, 4, padding_idx=2), lin=nn.Linear(4, 3)),
            (torch.tensor([[1, 2, 3, 2], [9, 0, 2, 5]]),))


# -- ctc_loss ---------------------------------------------------------------------------
@case("ctc_loss", "aten._ctc_loss",
      graph_break="aten._ctc_loss has no meta kernel (Dynamo: 'Dynamic shape operator "
                  "(no meta kernel)'): the loss runs in eager between two graphs, whose "
                  "gradients are still checked")
def _():
    def fn(m, x, targets):
        logp = m.lin(x).log_softmax(2)
        return F.ctc_loss(logp, targets, [7, 6], [3, 2], blank=0)
    x = randn(7, 2, 4)  # (T, N, features)
    targets = torch.tensor([[1, 2, 2], [3, 1, 0]])
    return Body(fn, lin=nn.Linear(4, 5)), (x, targets)


# -- grid_sample ------------------------------------------------------------------------
def _grid_sample(mode: str, align_corners: bool, padding_mode: str):
    def fn(m, x):
        y = m.conv(x)
        grid = F.affine_grid(m.theta.unsqueeze(0).expand(2, 2, 3), [2, 3, 4, 5],
                             align_corners=align_corners)
        out = F.grid_sample(y, grid, mode=mode, padding_mode=padding_mode,
                            align_corners=align_corners)
        return torch.tanh(out * 2)
    theta = torch.tensor([[1.2, 0.1, 0.05], [-0.15, 0.9, 0.1]]) + 0.01 * randn(2, 3)
    return Body(fn, conv=nn.Conv2d(2, 3, 1), theta=theta), (randn(2, 2, 5, 6),)


for _mode, _ac, _pad in [("bilinear", False, "zeros"), ("bilinear", True, "border"),
                         ("nearest", False, "reflection"), ("nearest", True, "zeros")]:
    case(f"grid_sample_{_mode}_ac{int(_ac)}_{_pad}", "aten.grid_sampler_2d")(
        lambda _m=_mode, _a=_ac, _p=_pad: _grid_sample(_m, _a, _p))


# -- interpolate ------------------------------------------------------------------------
def _interp(x: torch.Tensor, conv: nn.Module, **kw: Any):
    def fn(m, x):
        return torch.sin(F.interpolate(m.conv(x), **kw)) * 1.5
    return Body(fn, conv=conv), (x,)


@case("interpolate_nearest", "aten._unsafe_index")
def _():
    return _interp(randn(1, 2, 3, 4), nn.Conv2d(2, 2, 1), scale_factor=2, mode="nearest")


@case("interpolate_nearest_exact_down", "aten._unsafe_index")
def _():
    return _interp(randn(1, 2, 7, 5), nn.Conv2d(2, 2, 1), size=(3, 4), mode="nearest-exact")


@case("interpolate_bilinear_ac0_down", "aten._unsafe_index")
def _():
    return _interp(randn(1, 2, 7, 5), nn.Conv2d(2, 2, 1), size=(3, 4), mode="bilinear",
                   align_corners=False)


@case("interpolate_bilinear_ac1_up", "aten._unsafe_index")
def _():
    return _interp(randn(1, 2, 3, 4), nn.Conv2d(2, 2, 1), scale_factor=1.5,
                   mode="bilinear", align_corners=True)


@case("interpolate_bicubic_ac0", "aten._unsafe_index")
def _():
    return _interp(randn(1, 2, 4, 3), nn.Conv2d(2, 2, 1), size=(7, 5), mode="bicubic",
                   align_corners=False)


@case("interpolate_bicubic_ac1", "aten._unsafe_index")
def _():
    return _interp(randn(1, 2, 4, 3), nn.Conv2d(2, 2, 1), size=(6, 7), mode="bicubic",
                   align_corners=True)


@case("interpolate_trilinear_ac0", "aten._unsafe_index")
def _():
    return _interp(randn(1, 2, 2, 3, 4), nn.Conv3d(2, 2, 1), size=(3, 5, 6),
                   mode="trilinear", align_corners=False)


@case("interpolate_trilinear_ac1", "aten._unsafe_index")
def _():
    return _interp(randn(1, 2, 3, 3, 2), nn.Conv3d(2, 2, 1), size=(4, 2, 5),
                   mode="trilinear", align_corners=True)


@case("interpolate_linear_ac0", "aten._unsafe_index")
def _():
    return _interp(randn(2, 3, 5), nn.Conv1d(3, 2, 1), size=8, mode="linear",
                   align_corners=False)


@case("interpolate_area", "aten._adaptive_avg_pool2d")
def _():
    return _interp(randn(1, 2, 7, 5), nn.Conv2d(2, 2, 1), size=(3, 2), mode="area")


# -- cumulative ops ---------------------------------------------------------------------
@case("cumsum", "aten.cumsum")
def _():
    def fn(m, x):
        return torch.tanh(m.lin(x).cumsum(1) * 0.5)
    return Body(fn, lin=nn.Linear(4, 6)), (randn(3, 4),)


@case("cumprod", "aten.cumprod")
def _():
    def fn(m, x):
        return (1 + 0.3 * torch.tanh(m.lin(x))).cumprod(1) - 1
    return Body(fn, lin=nn.Linear(4, 6)), (randn(3, 4),)


@case("cummax_logcumsumexp", "aten.cummax", "aten.logcumsumexp")
def _():
    def fn(m, x):
        y = m.lin(x)
        values, indices = y.cummax(1)
        return values * 2 + y.logcumsumexp(1), indices
    return Body(fn, lin=nn.Linear(4, 6)), (randn(3, 4),)


@case("logcumsumexp_wide_range", "aten.logcumsumexp")
def _():
    # log-space values spanning more than float32's exp range (a masked log-probability
    # at -150 next to ordinary ones): the prefix sums stay finite in eager
    def fn(m, x):
        return (m.lin(x).tanh() + m.offset).logcumsumexp(1) * 0.5
    offset = torch.tensor([-150.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    return Body(fn, lin=nn.Linear(4, 6), offset=offset), (randn(3, 4),)


# -- scatter / index --------------------------------------------------------------------
@case("scatter_add", "aten.scatter_add")
def _():
    def fn(m, x, index):
        src = m.lin(x)
        return torch.tanh(m.base.scatter_add(1, index, src))
    index = torch.tensor([[0, 2, 2, 4], [1, 1, 0, 3], [4, 4, 4, 0]])
    return Body(fn, lin=nn.Linear(3, 4), base=randn(3, 5)), (randn(3, 3), index)


@case("index_add", "aten.index_add")
def _():
    def fn(m, x, index):
        return torch.tanh(m.base.index_add(0, index, m.lin(x), alpha=0.5))
    return (Body(fn, lin=nn.Linear(3, 4), base=randn(5, 4)),
            (randn(6, 3), torch.tensor([0, 2, 2, 4, 1, 2])))


@case("index_put_accumulate", "aten.index_put")
def _():
    def fn(m, x, rows, cols):
        return torch.tanh(m.base.index_put((rows, cols), m.lin(x).sum(1), accumulate=True))
    return (Body(fn, lin=nn.Linear(3, 4), base=randn(4, 5)),
            (randn(6, 3), torch.tensor([0, 1, 1, 3, 0, 1]), torch.tensor([4, 2, 2, 0, 4, 2])))


@case("scatter_reduce_amax", "aten.scatter_reduce")
def _():
    def fn(m, x, index):
        return m.base.scatter_reduce(1, index, m.lin(x), "amax", include_self=True) * 2
    index = torch.tensor([[0, 2, 2, 4], [1, 1, 0, 3], [4, 4, 4, 0]])
    return Body(fn, lin=nn.Linear(3, 4), base=randn(3, 5)), (randn(3, 3), index)


@case("scatter_reduce_mean", "aten.scatter_reduce")
def _():
    def fn(m, x, index):
        return torch.sin(m.base.scatter_reduce(1, index, m.lin(x), "mean", include_self=False))
    index = torch.tensor([[0, 2, 2, 4], [1, 1, 0, 3], [4, 4, 4, 0]])
    return Body(fn, lin=nn.Linear(3, 4), base=randn(3, 5)), (randn(3, 3), index)


@case("gather", "aten.gather")
def _():
    def fn(m, x, index):
        return torch.tanh(m.lin(x)).gather(1, index) * 3
    return Body(fn, lin=nn.Linear(3, 5)), (randn(4, 3), torch.tensor(
        [[0, 4, 4], [1, 2, 3], [3, 3, 0], [2, 0, 1]]))


# -- fold / unfold, pixel shuffle -------------------------------------------------------
@case("fold_unfold", "aten.im2col", "aten.col2im")
def _():
    def fn(m, x):
        cols = F.unfold(m.conv(x), 3, dilation=1, padding=1, stride=2)  # (1, 2*9, L)
        cols = m.lin(cols.transpose(1, 2)).transpose(1, 2)
        return F.fold(cols, (5, 6), 3, padding=1, stride=2)
    return Body(fn, conv=nn.Conv2d(2, 2, 1), lin=nn.Linear(18, 18)), (randn(1, 2, 5, 6),)


@case("tensor_unfold", "aten.unfold")
def _():
    def fn(m, x):
        windows = m.lin(x).unfold(1, 3, 2)  # (2, 3, 4, 3): sliding windows over dim 1
        return (windows * m.w).sum(-1).tanh()
    return Body(fn, lin=nn.Linear(4, 4), w=randn(3)), (randn(2, 7, 4),)


@case("pixel_shuffle", "aten.pixel_shuffle", "aten.pixel_unshuffle")
def _():
    def fn(m, x):
        y = F.pixel_shuffle(m.conv(x), 2)  # (1, 2, 6, 4)
        return m.conv2(F.pixel_unshuffle(torch.sin(y), 2)).tanh()
    return (Body(fn, conv=nn.Conv2d(3, 8, 1), conv2=nn.Conv2d(8, 3, 1)),
            (randn(1, 3, 3, 2),))


# -- topk / sort ------------------------------------------------------------------------
@case("topk", "aten.topk")
def _():
    def fn(m, x):
        values, indices = m.lin(x).topk(3, dim=-1)
        return values.tanh() * 2, indices
    return Body(fn, lin=nn.Linear(4, 7)), (randn(3, 4),)


@case("sort", "aten.sort")
def _():
    def fn(m, x):
        values, indices = m.lin(x).sort(dim=-1, descending=True)
        return values * m.rank_w, indices
    return Body(fn, lin=nn.Linear(4, 6), rank_w=randn(6)), (randn(3, 4),)


# -- pooling ----------------------------------------------------------------------------
@case("max_unpool2d", "aten.max_unpool2d")
def _():
    def fn(m, x):
        y, indices = F.max_pool2d(m.conv(x), 2, return_indices=True)
        return m.conv2(F.max_unpool2d(y * 2, indices, 2, output_size=(6, 4)))
    return (Body(fn, conv=nn.Conv2d(2, 3, 1), conv2=nn.Conv2d(3, 2, 1)),
            (randn(1, 2, 6, 4),))


@case("adaptive_avg_pool1d", "aten._adaptive_avg_pool2d", "aten.adaptive_avg_pool1d")
def _():
    def fn(m, x):
        return torch.tanh(F.adaptive_avg_pool1d(m.conv(x), 3)) * 2
    return Body(fn, conv=nn.Conv1d(2, 3, 1)), (randn(2, 2, 7),)


@case("adaptive_avg_pool2d", "aten._adaptive_avg_pool2d")
def _():
    def fn(m, x):
        return torch.tanh(F.adaptive_avg_pool2d(m.conv(x), (3, 2))) * 2
    return Body(fn, conv=nn.Conv2d(2, 3, 1)), (randn(1, 2, 7, 5),)


@case("adaptive_max_pool1d", "aten.adaptive_max_pool2d", "aten.adaptive_max_pool1d")
def _():
    def fn(m, x):
        return torch.tanh(F.adaptive_max_pool1d(m.conv(x), 3)) * 2
    return Body(fn, conv=nn.Conv1d(2, 3, 1)), (randn(2, 2, 7),)


@case("adaptive_max_pool2d", "aten.adaptive_max_pool2d")
def _():
    def fn(m, x):
        y, indices = F.adaptive_max_pool2d(m.conv(x), (3, 4), return_indices=True)
        return torch.tanh(y) * 2, indices
    return Body(fn, conv=nn.Conv2d(2, 3, 1)), (randn(1, 2, 7, 5),)


# -- classification losses --------------------------------------------------------------
@case("cross_entropy_weight_ignore_smooth", "aten.nll_loss_forward")
def _():
    weight = torch.tensor([0.5, 2.0, 1.0, 3.0, 0.7])

    def fn(m, x, y):
        return F.cross_entropy(m.lin(x), y, weight=weight, ignore_index=2,
                               label_smoothing=0.1)
    return Body(fn, lin=nn.Linear(3, 5)), (randn(6, 3), torch.tensor([0, 2, 4, 1, 2, 3]))


@case("cross_entropy_2d_ignore", "aten.nll_loss2d_forward")
def _():
    def fn(m, x, y):
        return F.cross_entropy(m.conv(x), y, ignore_index=0, reduction="sum")
    y = torch.tensor([[[0, 1, 2], [3, 0, 1]], [[2, 2, 3], [1, 0, 0]]])
    return Body(fn, conv=nn.Conv2d(2, 4, 1)), (randn(2, 2, 2, 3), y)


@case("cross_entropy_probs_smooth", "aten._log_softmax")
def _():
    def fn(m, x, target):  # class probabilities as the target (they get a gradient too)
        return F.cross_entropy(m.lin(x), target, label_smoothing=0.2)
    return Body(fn, lin=nn.Linear(3, 4)), (randn(5, 3), torch.rand(5, 4).softmax(1))


@case("nll_loss_weight_ignore_sum", "aten.nll_loss_forward")
def _():
    weight = torch.tensor([1.5, 0.5, 2.0, 1.0])

    def fn(m, x, y):
        return F.nll_loss(m.lin(x).log_softmax(1), y, weight=weight, ignore_index=1,
                          reduction="sum")
    return Body(fn, lin=nn.Linear(3, 4)), (randn(6, 3), torch.tensor([0, 1, 3, 2, 1, 3]))


@case("binary_cross_entropy_weight", "aten.binary_cross_entropy", no_grad=(1,))
def _():
    def fn(m, x, target):
        return F.binary_cross_entropy(torch.sigmoid(m.lin(x)), target, weight=m.w.detach())
    return (Body(fn, lin=nn.Linear(3, 4), w=torch.rand(4) + 0.5),
            (randn(5, 3), torch.rand(5, 4)))


@case("bce_with_logits_pos_weight", "aten.binary_cross_entropy_with_logits", no_grad=(1,))
def _():
    pos_weight = torch.tensor([0.5, 2.0, 1.0, 3.0])

    def fn(m, x, target):
        return F.binary_cross_entropy_with_logits(m.lin(x), target, pos_weight=pos_weight,
                                                  weight=torch.tensor([1.0, 0.5, 2.0, 1.0]))
    return Body(fn, lin=nn.Linear(3, 4)), (randn(5, 3), torch.rand(5, 4))


@case("kl_div_batchmean", "aten.kl_div", "aten.xlogy")
def _():
    def fn(m, x, target):
        return F.kl_div(m.lin(x).log_softmax(1), target, reduction="batchmean")
    return Body(fn, lin=nn.Linear(3, 4)), (randn(5, 3), torch.rand(5, 4).softmax(1))


@case("kl_div_log_target", "aten.exp")  # kl_div decomposed: exp(t) * (t - x)
def _():
    def fn(m, x, target):
        return F.kl_div(m.lin(x).log_softmax(1), target, reduction="sum", log_target=True)
    return Body(fn, lin=nn.Linear(3, 4)), (randn(5, 3), torch.rand(5, 4).log_softmax(1))


# -- regression and margin losses -------------------------------------------------------
@case("smooth_l1_huber", "aten.smooth_l1_loss", "aten.huber_loss")
def _():
    def fn(m, x, target):
        y = m.lin(x)
        return F.smooth_l1_loss(y, target, beta=0.5) + F.huber_loss(y, target, delta=0.7,
                                                                     reduction="sum")
    return Body(fn, lin=nn.Linear(3, 4)), (randn(5, 3), randn(5, 4) * 2)


@case("margin_ranking_hinge_soft_margin", "aten.margin_ranking_loss",
      "aten.hinge_embedding_loss", "aten.soft_margin_loss", no_grad=(1,))
def _():
    def fn(m, x, y):
        a, b = m.lin(x).unbind(1)
        return (F.margin_ranking_loss(a, b, y, margin=0.3)
                + F.hinge_embedding_loss(a - b, y, margin=0.5)
                + F.soft_margin_loss(a * b, y))
    return Body(fn, lin=nn.Linear(3, 2)), (randn(6, 3), torch.tensor(
        [1.0, -1.0, -1.0, 1.0, 1.0, -1.0]))


@case("multi_margin_weight", "aten.clamp_min")  # decomposed in training
def _():
    def fn(m, x, y):
        return F.multi_margin_loss(m.lin(x), y, p=1, margin=0.8,
                                   weight=torch.tensor([1.0, 2.0, 0.5, 1.5]))
    return Body(fn, lin=nn.Linear(3, 4)), (randn(6, 3), torch.tensor([0, 1, 3, 2, 1, 3]))


@case("multilabel_margin", "aten.any")  # decomposed in training: where, gather, any
def _():
    def fn(m, x, y):
        return F.multilabel_margin_loss(m.lin(x), y)
    y = torch.tensor([[3, 0, -1, 1], [1, 2, 3, -1], [0, -1, 2, 2]])
    return Body(fn, lin=nn.Linear(3, 4)), (randn(3, 3), y)


@case("triplet_cosine_embedding", "aten.norm", "aten.clamp_min", no_grad=(3,))
def _():
    def fn(m, a, p, n, y):
        a, p, n = m.lin(a), m.lin(p), m.lin(n)
        return (F.triplet_margin_loss(a, p, n, margin=0.5, p=2)
                + F.cosine_embedding_loss(a, n, y, margin=0.1))
    return (Body(fn, lin=nn.Linear(3, 4)),
            (randn(5, 3), randn(5, 3), randn(5, 3), torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0])))


# -- normalization ----------------------------------------------------------------------
@case("group_norm", "aten.native_group_norm")
def _():
    def fn(m, x):
        return torch.tanh(m.gn(m.conv(x)))
    return (Body(fn, conv=nn.Conv2d(2, 4, 1), gn=nn.GroupNorm(2, 4)),
            (randn(2, 2, 3, 3),))


@case("instance_norm", "aten.native_batch_norm", "aten._native_batch_norm_legit")
def _():
    def fn(m, x):
        return torch.tanh(m.inorm(m.conv(x)))
    return (Body(fn, conv=nn.Conv2d(2, 3, 1), inorm=nn.InstanceNorm2d(3, affine=True)),
            (randn(2, 2, 3, 4),))


@case("layer_norm_2d", "aten.native_layer_norm")
def _():
    def fn(m, x):
        return m.ln(m.lin(x)).relu() * 2
    return (Body(fn, lin=nn.Linear(3, 4), ln=nn.LayerNorm([5, 4])), (randn(2, 5, 3),))


@case("batch_norm_train", "aten._native_batch_norm_legit_functional")
def _():
    def fn(m, x):
        return torch.tanh(m.bn(m.conv(x)))
    return (Body(fn, conv=nn.Conv2d(2, 3, 1), bn=nn.BatchNorm2d(3, momentum=0.3)),
            (randn(4, 2, 3, 3),))


@case("batch_norm1d_train", "aten._native_batch_norm_legit_functional")
def _():
    def fn(m, x):
        return torch.sin(m.bn(m.lin(x)))
    return Body(fn, lin=nn.Linear(3, 4), bn=nn.BatchNorm1d(4)), (randn(6, 3),)


# -- transposed convolutions ------------------------------------------------------------
@case("conv_transpose2d_groups_dilation", "aten.convolution")
def _():
    def fn(m, x):
        return torch.tanh(m.convt(x))
    convt = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2,
                               dilation=2)
    return Body(fn, convt=convt), (randn(1, 4, 3, 3),)


@case("conv_transpose1d_groups", "aten.convolution")
def _():
    def fn(m, x):
        return torch.sin(m.convt(x)) * 2
    return (Body(fn, convt=nn.ConvTranspose1d(4, 2, 3, stride=3, groups=2, dilation=1,
                                              padding=2)),
            (randn(2, 4, 5),))


# -- masking, selection, reductions -----------------------------------------------------
@case("masked_fill_where", "aten.masked_fill", "aten.where")
def _():
    def fn(m, x):
        y = m.lin(x)
        z = torch.where(y > 0, y * 2, torch.exp(y) - 1)
        return z.masked_fill(x[:, :1] < -0.3, -0.5) + y.masked_fill(y < 0.1, 0.0)
    return Body(fn, lin=nn.Linear(3, 4)), (randn(6, 3),)


@case("logsumexp", "aten.logsumexp")
def _():
    def fn(m, x):
        y = m.lin(x)
        return y.logsumexp(1) + y.logsumexp(0, keepdim=True).sum()
    return Body(fn, lin=nn.Linear(3, 4)), (randn(5, 3),)


@case("norms", "aten.linalg_vector_norm")
def _():
    def fn(m, x):
        y = m.lin(x)
        return (torch.linalg.vector_norm(y, 3, dim=1) + y.norm(dim=1)
                + torch.linalg.vector_norm(y, 1.5, dim=1) + y.norm(p=float("inf"), dim=1))
    return Body(fn, lin=nn.Linear(3, 4)), (randn(5, 3),)


@case("var_std_correction", "aten.var", "aten.std")
def _():
    def fn(m, x):
        y = m.lin(x)
        return (y.var(1, correction=2) + y.std(0, correction=0).sum()
                + torch.var_mean(y, 1, correction=0)[0])
    return Body(fn, lin=nn.Linear(3, 5)), (randn(6, 3),)


@case("cdist", "aten._cdist_forward")
def _():
    def fn(m, x, y):
        a, b = m.lin(x), m.lin(y)
        return torch.cdist(a, b, p=2) + torch.cdist(a, b, p=1) * 0.5
    return Body(fn, lin=nn.Linear(3, 4)), (randn(2, 4, 3), randn(2, 5, 3))


@case("einsum", "aten.bmm")
def _():
    def fn(m, x, y):
        a = torch.einsum("bij,jk->bik", x, m.w)
        b = torch.einsum("bi,bi->b", x[:, 0], y[:, 0, :3]).sin()
        return torch.einsum("bik,bjk->bij", a, y).tanh() + b[:, None, None]
    return Body(fn, w=randn(3, 4)), (randn(2, 4, 3), randn(2, 5, 4))


@case("cosine_similarity_normalize", "aten.clamp_min")
def _():
    def fn(m, x, y):
        a = F.normalize(m.lin(x), dim=1)
        return F.cosine_similarity(a, m.lin(y), dim=1) + F.pairwise_distance(a, y[:, :4])
    return Body(fn, lin=nn.Linear(5, 4)), (randn(4, 5), randn(4, 5))


# -- recurrent --------------------------------------------------------------------------
# allow_rnn: Dynamo's default runs nn.LSTM/GRU in eager, outside the graph
@case("lstm", "aten.sigmoid", "aten.mm", allow_rnn=True)
def _():
    def fn(m, x):
        out, (h, c) = m.rnn(x)
        return out.tanh().sum(1) + h[0] + c[0]
    return Body(fn, rnn=nn.LSTM(3, 4, batch_first=True)), (randn(2, 4, 3),)


@case("gru_bidirectional", "aten.sigmoid", "aten.mm", allow_rnn=True)
def _():
    def fn(m, x):
        out, h = m.rnn(x)
        return out.sum(0) * 2 + h.transpose(0, 1).reshape(2, 4)
    return Body(fn, rnn=nn.GRU(3, 2, bidirectional=True)), (randn(3, 2, 3),)


# -- activations (no random one: no rrelu, no dropout) ----------------------------------
@case("glu_prelu", "aten.glu", "aten._prelu_kernel")
def _():
    def fn(m, x):
        return m.prelu(F.glu(m.conv(x), dim=1)) * 2
    return (Body(fn, conv=nn.Conv1d(2, 6, 1), prelu=nn.PReLU(3, init=0.1)),
            (randn(2, 2, 5),))


@case("activations_smooth", "aten.elu", "aten.softplus", "aten.mish")
def _():
    def fn(m, x):
        y = m.lin(x)
        return (F.elu(y, alpha=0.7) + F.selu(y) + F.celu(y, alpha=1.3)
                + F.softplus(y, beta=2.0, threshold=1.0) + F.mish(y) + F.silu(y)
                + F.gelu(y, approximate="tanh") + F.logsigmoid(y) + F.softsign(y))
    return Body(fn, lin=nn.Linear(3, 8)), (randn(5, 3),)


@case("activations_piecewise", "aten.hardswish", "aten.hardtanh", "aten.leaky_relu")
def _():
    def fn(m, x):
        y = m.lin(x) * 3
        return (F.hardswish(y) + F.hardsigmoid(y) + F.hardtanh(y, -1.5, 0.5)
                + F.leaky_relu(y, 0.2) + F.relu6(y) + F.tanhshrink(y)
                + F.softshrink(y, 0.4) + F.hardshrink(y, 0.6))
    return Body(fn, lin=nn.Linear(3, 8)), (randn(5, 3),)


# -- shape ops --------------------------------------------------------------------------
@case("roll_flip", "aten.roll", "aten.flip")
def _():
    def fn(m, x):
        y = m.lin(x)
        return torch.tanh(y.roll(2, 1) * y.flip(0) + y.roll((1, -1), (0, 1)))
    return Body(fn, lin=nn.Linear(3, 5)), (randn(4, 3),)


@case("unbind_stack_cat", "aten.unbind", "aten.cat", "aten.stack")
def _():
    def fn(m, x):
        a, b, c = m.lin(x).unbind(1)
        return torch.cat([torch.stack([a * b, c], 1), (a + c).unsqueeze(1)], 1).tanh()
    return Body(fn, lin=nn.Linear(3, 3)), (randn(5, 3),)


@case("repeat_interleave", "aten.repeat_interleave")
def _():
    def fn(m, x):
        y = m.lin(x)
        repeats = torch.tensor([1, 3, 2])
        return (y.repeat_interleave(repeats, dim=1, output_size=6)
                + y.repeat_interleave(2, dim=1)).tanh()
    return Body(fn, lin=nn.Linear(4, 3)), (randn(2, 4),)


@case("tril_triu", "aten.tril", "aten.triu")
def _():
    def fn(m, x):
        y = m.lin(x).view(2, 4, 4)
        return (y.tril(-1) @ y.triu(1)).tanh() + y.triu().sum()
    return Body(fn, lin=nn.Linear(3, 16)), (randn(2, 3),)


@case("bucketize_side_input", "aten.bucketize")
def _():
    boundaries = torch.tensor([-1.0, -0.2, 0.3, 1.1])

    def fn(m, x):
        y = m.lin(x)
        bucket = torch.bucketize(y.detach(), boundaries)  # no gradient: a side input
        return (y * m.scale[bucket]).tanh() + bucket * 0.1
    return Body(fn, lin=nn.Linear(3, 4), scale=randn(5)), (randn(6, 3),)


def case_by_id(id: str) -> Case:
    return next(c for c in CASES if c.id == id)


# -- one training step, compiled and eager ----------------------------------------------
@dataclass
class Outcome:
    """What one training step of a case gave, compiled (``got``) and eager (``want``)."""

    case: Case
    #: (what, got, want): each output, each gradient (parameters by name, inputs by
    #: position), each buffer after the step (batch norm's running statistics)
    pairs: list[tuple[str, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    error: str = ""  # the exception the compiled step raised, if any
    #: key op -> {"forward"/"backward"/"inference": backends that ran its nodes}
    key_backends: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    #: "partition id (kind): from -> to at stage: reason" for each runtime fallback
    fallbacks: list[str] = field(default_factory=list)
    graph_breaks: int = 0
    graphs: int = 0
    report: Any = None
    seconds: float = 0.0

    def mismatches(self, rtol: float = 1e-4, atol: float = 1e-5) -> list[str]:
        """Each output, gradient or buffer that differs from eager: floating ones beyond
        ``atol + rtol * |want|`` (NaN equal to NaN), the others unless equal."""
        bad = []
        for what, got, want in self.pairs:
            if got is None or want is None:
                if (got is None) != (want is None):
                    bad.append(f"{what}: {'no gradient' if got is None else 'unexpected'}")
                continue
            if got.shape != want.shape or got.dtype != want.dtype:
                bad.append(f"{what}: {got.dtype}{list(got.shape)}, eager "
                           f"{want.dtype}{list(want.shape)}")
            elif got.is_floating_point():
                err = (got - want).abs().nan_to_num(0.0)
                nan = got.isnan() != want.isnan()
                if nan.any() or (err > atol + rtol * want.abs()).any():
                    bad.append(f"{what}: max error {err.max().item():.3g}"
                               + (" (NaN differs)" if nan.any() else ""))
            elif not torch.equal(got, want):
                bad.append(f"{what}: {int((got != want).sum())} of {got.numel()} differ")
        return bad

    def ran_on(self, kind: str = "forward") -> set[str]:
        """Backends that ran the key ops' nodes in graphs of ``kind``."""
        return {b for by_kind in self.key_backends.values() for b in by_kind.get(kind, ())}


def _loss_weights(outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Fixed random weights for each floating output, so the gradient coming in is not all
    ones (a generator of its own: torch's global stream is left alone)."""
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outputs]


def _flat(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _step(module: nn.Module, inputs: tuple[Any, ...], c: Case):
    args = [x.detach().clone().requires_grad_(x.is_floating_point() and k not in c.no_grad)
            if isinstance(x, torch.Tensor) else x for k, x in enumerate(inputs)]
    outs = _flat(module(*args))
    floats = [o for o in outs if o.is_floating_point()]
    loss = sum((o * w).sum() for o, w in zip(floats, _loss_weights(floats)))
    loss.backward()
    return outs, args


def train_step(c: Case, backend: Any) -> Outcome:
    """One forward, a weighted sum of the outputs as the loss, and one backward, through
    ``torch.compile(module, backend=backend)`` and in eager on a copy of the module.
    Dynamo is reset before (the caller resets after, once it read the report)."""
    import copy
    import time

    import arbiter

    torch._dynamo.reset()
    torch.manual_seed(0)
    module, inputs = c.make()
    ref = copy.deepcopy(module)
    outcome = Outcome(c)
    want_outs, want_args = _step(ref, inputs, c)
    compiled = torch.compile(module, backend=backend)
    start = time.perf_counter()
    try:
        with torch._dynamo.config.patch(**c.dynamo):
            got_outs, got_args = _step(compiled, inputs, c)
    except Exception as exc:  # noqa: BLE001 - recorded, the test reports it
        outcome.error = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:400]
        got_outs, got_args = None, None
    outcome.seconds = time.perf_counter() - start
    if got_outs is not None:
        outcome.pairs += [(f"output {k}", g.detach(), w.detach())
                          for k, (g, w) in enumerate(zip(got_outs, want_outs))]
        outcome.pairs += [(f"grad input {k}", g.grad, w.grad)
                          for k, (g, w) in enumerate(zip(got_args, want_args))
                          if isinstance(w, torch.Tensor) and w.requires_grad]
        ref_params = dict(ref.named_parameters())
        outcome.pairs += [(f"grad {name}", p.grad, ref_params[name].grad)
                          for name, p in module.named_parameters()]
        ref_buffers = dict(ref.named_buffers())
        outcome.pairs += [(f"buffer {name}", b, ref_buffers[name])
                          for name, b in module.named_buffers()]
    rep = arbiter.report_for(compiled, advice=False)
    outcome.report = rep
    if rep is not None:
        outcome.graph_breaks = rep.graph_breaks.breaks if rep.graph_breaks else 0
        outcome.graphs = len(rep.graphs)
        for g in rep.graphs:
            backend_of = {p.id: (p.backend if p.compiled else p.planned_backend)
                          for p in g.partitions}
            for n in g.graph:
                packet = n.op.rsplit(".", 1)[0]
                if packet in c.key:
                    outcome.key_backends.setdefault(packet, {}).setdefault(
                        g.kind, set()).add(backend_of[n.partition])
            outcome.fallbacks += [f"{p.id} ({g.kind}): {f.from_backend} -> {f.to_backend} "
                                  f"at {f.stage}: {f.reason}"
                                  for p in g.partitions for f in p.fallbacks]
    return outcome

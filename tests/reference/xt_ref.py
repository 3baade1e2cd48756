#!/usr/bin/env python3
"""xt_ref.py: an independent float64 PyTorch reference of ../shared/XT-SEMANTICS.md.

Written from the specification alone (x-transformers itself is neither imported nor copied),
for checking xtc on models that mix many options per layer. It covers what xtc supports:
TransformerWrapper over Decoder / Encoder / CrossAttender, ViTransformerWrapper,
ContinuousTransformerWrapper, XTransformer and xtc's own EncoderDecoder(encoder, decoder).

A model is described by the same constructor calls as a .xtf file (class Call), so one
description gives both the .xtf text (Call.to_xtf) and the computation (run_model). Every
parameter is created on first use under its exact state_dict name with seeded random values
that are representable in float32 (the weights file is F32), away from their special init
values (LayerNorm weight 1, ReZero g 0, ...) so that a swapped or ignored parameter shows.
The arithmetic is float64 throughout; gradients come from torch.autograd.

Section numbers (§) refer to XT-SEMANTICS.md. Needs only Debian's python3-torch (1.13).
"""
import math

import torch

torch.set_default_dtype(torch.float64)

FLT_MAX = 3.4028234663852886e38  # masked logits are filled with -FLT_MAX, not -inf (§1)


# ---------------------------------------------------------------------------------------------
# Model descriptions: constructor calls, as written in .xtf
# ---------------------------------------------------------------------------------------------

class Call:
    """A constructor call such as Decoder(dim = 32, depth = 2); kwargs keep their order."""

    def __init__(self, ctor, **kwargs):
        self.ctor = ctor
        self.kwargs = kwargs

    def get(self, key, default=None):
        v = self.kwargs.get(key, default)
        return default if v is None else v

    def to_xtf(self, indent=0):
        pad = " " * (indent + 4)
        lines = ["%s%s = %s," % (pad, k, _lit(v, indent + 4)) for k, v in self.kwargs.items()]
        return "%s(\n%s\n%s)" % (self.ctor, "\n".join(lines), " " * indent)


def _lit(v, indent):
    if isinstance(v, Call):
        return v.to_xtf(indent)
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "None"
    return repr(v)


# ---------------------------------------------------------------------------------------------
# Parameters by state_dict name
# ---------------------------------------------------------------------------------------------

def uniform(bound):
    return lambda shape, g: (torch.rand(shape, generator=g) * 2 - 1) * bound


def normal(mean, std):
    return lambda shape, g: mean + std * torch.randn(shape, generator=g)


class Params:
    """name -> float64 tensor, created on first use. P.sub("encoder.") is a view that prefixes
    names and shares the storage (how the composed models name their halves)."""

    def __init__(self, seed):
        self.gen = torch.Generator().manual_seed(seed)
        self.values = {}      # full name -> tensor (parameters require grad, buffers do not)
        self.buffers = set()  # full names of persistent buffers (no gradient, §11)
        self.prefix = ""
        self.preset = {}      # full name -> given value (load), used instead of a random draw

    def sub(self, prefix):
        view = Params.__new__(Params)
        view.__dict__.update(self.__dict__)
        view.prefix = self.prefix + prefix
        return view

    def __call__(self, name, shape, init=None, value=None):
        """The parameter `name` [shape]; created from init(shape, gen), or from value (then a
        buffer), the first time it is asked for."""
        full = self.prefix + name
        t = self.values.get(full)
        if t is None:
            if full in self.preset:
                raw = self.preset[full]
            else:
                raw = value if value is not None else init(tuple(shape), self.gen)
            t = raw.float().double()  # exactly representable in the F32 weights file
            if value is None:
                t.requires_grad_(True)
            else:
                self.buffers.add(full)
            self.values[full] = t
        if tuple(t.shape) != tuple(shape):
            raise ValueError("%s has shape %s, asked for %s" % (full, tuple(t.shape), tuple(shape)))
        return t

    def alias(self, name, target):
        """A tied parameter: `name` is the very tensor `target` (its key appears twice)."""
        self.values[self.prefix + name] = self.values[self.prefix + target]


# ---------------------------------------------------------------------------------------------
# Building blocks (§1, §6, §8)
# ---------------------------------------------------------------------------------------------

def linear(P, name, x, out, bias=True):
    """nn.Linear: y = x @ W.T + b, W stored [out, in] (§1); torch's default init range."""
    fan_in = x.shape[-1]
    y = x @ P(name + ".weight", (out, fan_in), uniform(fan_in ** -0.5)).T
    if bias:
        y = y + P(name + ".bias", (out,), uniform(fan_in ** -0.5))
    return y


def layer_norm(P, name, x, eps=1e-5):
    """nn.LayerNorm(d): biased variance, eps inside the sqrt, weight and bias (§8)."""
    d = x.shape[-1]
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    w = P(name + ".weight", (d,), normal(1.0, 0.2))
    b = P(name + ".bias", (d,), normal(0.0, 0.2))
    return (x - mean) / torch.sqrt(var + eps) * w + b


def scale_or_rms_norm(P, name, x, gdim, eps):
    """ScaleNorm (g [1], eps 1e-5) and RMSNorm (g [dim], eps 1e-8):
    x / clamp(||x|| * dim^-0.5, min=eps) * g, a clamp, not an added eps (§8)."""
    d = x.shape[-1]
    norm = torch.sqrt((x * x).sum(-1, keepdim=True)) * d ** -0.5
    return x / norm.clamp(min=eps) * P(name + ".g", (gdim,), normal(1.0, 0.2))


def gelu(x):
    """nn.GELU(): the exact erf form (§6)."""
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def relu_squared(x):
    return torch.relu(x) ** 2


def feed_forward(P, p, x, mult=4, glu=False, relu_sq=False, post_act_ln=False, dim_out=None):
    """FeedForward (§6). Keys: net.0.0 (or net.0.proj with glu), net.1 (post_act_ln), net.3."""
    dim = x.shape[-1]
    inner = int(dim * mult)
    act = relu_squared if relu_sq else gelu
    if glu:  # GEGLU: val, gate = proj(x).chunk(2); the SECOND half is the gate
        val, gate = linear(P, p + ".net.0.proj", x, 2 * inner).chunk(2, dim=-1)
        h = val * act(gate)
    else:
        h = act(linear(P, p + ".net.0.0", x, inner))
    if post_act_ln:
        h = layer_norm(P, p + ".net.1", h)
    return linear(P, p + ".net.3", h, dim_out or dim)


def gru_cell(P, p, inp, hidden):
    """nn.GRUCell(input = branch output, hidden = residual), row blocks r, z, n (§4)."""
    d = inp.shape[-1]
    b = d ** -0.5
    gi = inp @ P(p + ".weight_ih", (3 * d, d), uniform(b)).T + P(p + ".bias_ih", (3 * d,), uniform(b))
    gh = hidden @ P(p + ".weight_hh", (3 * d, d), uniform(b)).T + P(p + ".bias_hh", (3 * d,), uniform(b))
    i_r, i_z, i_n = gi.chunk(3, dim=-1)
    h_r, h_z, h_n = gh.chunk(3, dim=-1)
    r = torch.sigmoid(i_r + h_r)
    z = torch.sigmoid(i_z + h_z)
    c = torch.tanh(i_n + r * h_n)
    return (1 - z) * c + z * hidden


def cross_entropy(logits, targets):
    """Mean over targets != -100 of logsumexp(z) - z[target] (DESIGN.md, parity README)."""
    keep = targets != -100
    z = logits[keep]
    t = targets[keep]
    return (torch.logsumexp(z, -1) - z.gather(-1, t[:, None])[:, 0]).mean()


# ---------------------------------------------------------------------------------------------
# AttentionLayers configuration (§2, §4)
# ---------------------------------------------------------------------------------------------

LAYER_DEFAULTS = dict(
    heads=8, cross_attend=False, only_cross=False, use_scalenorm=False, use_rmsnorm=False,
    use_rezero=False, rel_pos_bias=False, rel_pos_num_buckets=32, rel_pos_max_distance=128,
    position_infused_attn=False, rotary_pos_emb=False, rotary_emb_dim=None, sandwich_coef=None,
    residual_attn=False, cross_residual_attn=False, macaron=False, pre_norm=True,
    gate_residual=False, scale_residual=False, sandwich_norm=False, use_qk_norm_attn=False,
    qk_norm_attn_seq_len=None, alibi_pos_bias=False, alibi_num_heads=None, alibi_learned=False,
    shift_tokens=0, custom_layers=None, par_ratio=None)
ATTN_DEFAULTS = dict(dim_head=64, talking_heads=False, head_scale=False, num_mem_kv=0,
                     dropout=0.0, on_attn=False, gate_values=False, qk_norm=False,
                     scale_init_value=None, sparse_topk=None, use_entmax15=False,
                     max_attend_past=None, collab_heads=False, collab_compression=0.3)
FF_DEFAULTS = dict(mult=4, glu=False, relu_squared=False, post_act_ln=False, dropout=0.0)


class Layers:
    """The options of one Decoder / Encoder / CrossAttender call. attn_* go to every Attention
    and ff_* to every FeedForward, prefix stripped (§2). Unknown keys raise here (the library
    would ignore them; a typo in a case must not go unnoticed)."""

    def __init__(self, call):
        kw = dict(call.kwargs)
        self.causal = call.ctor == "Decoder"
        if call.ctor == "CrossAttender":  # may be causal: its 'a' layers, token shifts, ALiBi class
            self.causal = bool(kw.pop("causal", False))
            kw.update(cross_attend=True, only_cross=True)
        self.dim, self.depth = kw.pop("dim"), kw.pop("depth")
        o, a, f = dict(LAYER_DEFAULTS), dict(ATTN_DEFAULTS), dict(FF_DEFAULTS)
        for k, v in kw.items():
            if k.startswith("attn_") and k[5:] in a:
                a[k[5:]] = v
            elif k.startswith("ff_") and k[3:] in f:
                f[k[3:]] = v
            elif k in o:
                o[k] = v
            else:
                raise ValueError("xt_ref: unknown or unsupported option %s" % k)
        for k, v in o.items():
            setattr(self, k, v)
        self.attn, self.ff = a, f
        self.dim_head = a["dim_head"]
        # use_qk_norm_attn turns qk_norm on in every Attention (§9)
        self.qk_norm = a["qk_norm"] or self.use_qk_norm_attn
        if self.use_qk_norm_attn:
            L = self.qk_norm_attn_seq_len
            self.scale_init = -math.log(math.log2(L * L - L)) if L else -3.0
        else:
            self.scale_init = a["scale_init_value"] if a["scale_init_value"] is not None else -3.0
        # rotary dimension: max(rotary_emb_dim or dim_head // 2, 32) (§7.2)
        rd = self.rotary_emb_dim if self.rotary_emb_dim is not None else self.dim_head // 2
        self.rotary_dim = max(rd, 32)
        # absolute positions are disabled by any of these (§3)
        self.has_pos_emb = self.rotary_pos_emb or self.rel_pos_bias or self.position_infused_attn
        # the layer list (§4)
        if self.cross_attend and self.only_cross:
            block = ("c", "f")
        elif self.cross_attend:
            block = ("a", "c", "f")
        else:
            block = ("a", "f")
        if self.macaron:
            block = ("f",) + block
        k = self.sandwich_coef
        if self.custom_layers:  # §4: custom_layers, then par_ratio, then sandwich_coef
            self.layer_types = tuple(self.custom_layers)
        elif self.par_ratio:  # the PAR layout: attention in the first two thirds
            par_depth = self.depth * len(block)
            assert 1 < self.par_ratio <= par_depth
            block = tuple(t for t in block if t != "f")
            par_attn = par_depth // self.par_ratio
            depth_cut = par_depth * 2 // 3
            par_width = (depth_cut + depth_cut // par_attn) // par_attn
            par_head = (block + ("f",) * (par_width - len(block))) * par_attn
            self.layer_types = par_head + ("f",) * (par_depth - len(par_head))
        elif k:
            self.layer_types = ("a",) * k + block * (self.depth - k) + ("f",) * k
        else:
            self.layer_types = block * self.depth


def fp32_inv_freq(dim):
    """1 / 10000^(arange(0, dim, 2) / dim), computed in float32 as the library stores it."""
    return 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


def t5_bucket(I, J, causal, num_buckets, max_distance):
    """T5 relative-position bucket [I, J] of k_pos - q_pos, q_pos = arange(I), k_pos =
    arange(J): misaligned when J > I, a quirk of 0.23.0 (§7.3). The log is float32."""
    q_pos = torch.arange(I)[:, None]
    k_pos = torch.arange(J)[None, :]
    n = q_pos - k_pos  # = -rel
    if causal:
        nb, ret = num_buckets, torch.zeros_like(n)
        n = n.clamp(min=0)
    else:
        nb = num_buckets // 2
        ret = (n < 0).long() * nb  # the offset goes to future keys
        n = n.abs()
    max_exact = nb // 2
    ratio = torch.log(n.to(torch.float32) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (ratio * (nb - max_exact)).long()
    large = large.clamp(max=nb - 1)
    return ret + torch.where(n < max_exact, n, large)


def rotate(t, freqs):
    """Rotary on t[b, h, m, dh] with the LAST m rows of freqs [L, rd] (§7.2): half split
    (x1 = first rd/2, x2 = next rd/2), not interleaved; features past rd are left alone."""
    rd = freqs.shape[-1]
    f = freqs[freqs.shape[0] - t.shape[-2]:]
    x, rest = t[..., :rd], t[..., rd:]
    x1, x2 = x[..., : rd // 2], x[..., rd // 2:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return torch.cat((x * f.cos() + rotated * f.sin(), rest), dim=-1)


def alibi_slopes(heads):
    """ALiBi's slopes (§7.4, x-transformers 0.23.0 AlibiPositionalBias._get_slopes): for a power
    of two n, start * start^i with start = 2^(-2^-(log2 n - 3)); otherwise the slopes of the power
    of two p below, then every other slope of 2p. Stored as float32."""
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(heads).is_integer():
        s = power_of_2(heads)
    else:
        p = 2 ** math.floor(math.log2(heads))
        s = power_of_2(p) + power_of_2(2 * p)[0::2][:heads - p]
    return torch.tensor(s, dtype=torch.float32).double()


def alibi_bias(S, pos, I, J):
    """The ALiBi bias added to the logits [b, h, I, J] (§7.4, as 0.23.0 computes it). Fixed slopes
    (causal, not learned): j * slope on every row. Learned (alibi_learned, or not causal):
    (j - i) * exp(logslope); bidirectional: tril(|j - i| * past) + triu(|j - i| * future), with a
    plus sign. Positions count from 0 on both axes; heads past alibi_num_heads get no bias."""
    j = torch.arange(J).double()
    if "alibi_fixed" in pos:
        return j[None, None, None, :] * pos["alibi_fixed"]
    d = (j[None, :] - torch.arange(I).double()[:, None])[None, None]
    if "alibi_future" not in pos:
        return d * pos["alibi_past"]
    d = d.abs()
    return torch.tril(d * pos["alibi_past"]) + torch.triu(d * pos["alibi_future"])


def shift_tokens(x, shifts, mask):
    """ShiftTokens (§4): the features split into chunks of dim // len(shifts); chunk k moves along
    the sequence by shifts[k] (zero fill), its masked positions zeroed first; a shift of 0 leaves
    the chunk alone, and so do the features past the chunks."""
    f = x.shape[-1] // len(shifts)
    chunks = x.split(f, dim=-1)
    out = []
    for t, a in zip(chunks[:len(shifts)], shifts):
        if a != 0:
            if mask is not None:
                t = t.masked_fill(~mask[..., None], 0.0)
            t = torch.nn.functional.pad(t, (0, 0, a, -a))
        out.append(t)
    return torch.cat(out + list(chunks[len(shifts):]), dim=-1)


def sinusoids(inv_freq, positions):
    """Position-infused attention's S(p) = cat(sin(p * inv_freq), cos(p * inv_freq)) (§5 step 2)."""
    ang = positions.double()[:, None] * inv_freq[None, :]
    return torch.cat((ang.sin(), ang.cos()), dim=-1)


class Entmax15(torch.autograd.Function):
    """1.5-entmax over the last axis (§10): the exact sort-based forward, on every entry (the
    -FLT_MAX ones drop out of the support by themselves in float64: their tau exceeds them);
    the backward dX = dY g - g sum(dY g) / sum(g) with g = sqrt(Y)."""

    @staticmethod
    def forward(ctx, x):
        X = (x - x.max(-1, keepdim=True).values) / 2
        Xs = X.sort(-1, descending=True).values
        rho = torch.arange(1, X.shape[-1] + 1, dtype=X.dtype)
        mean = Xs.cumsum(-1) / rho
        mean_sq = (Xs * Xs).cumsum(-1) / rho
        delta = (1 - rho * (mean_sq - mean * mean)) / rho
        tau = mean - delta.clamp(min=0).sqrt()
        support = (tau <= Xs).sum(-1, keepdim=True)
        y = (X - tau.gather(-1, support - 1)).clamp(min=0) ** 2
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        y, = ctx.saved_tensors
        g = y.sqrt()
        dx = dy * g
        return dx - g * dx.sum(-1, keepdim=True) / g.sum(-1, keepdim=True)


# ---------------------------------------------------------------------------------------------
# Attention (§5), in the library's exact order of operations
# ---------------------------------------------------------------------------------------------

def attention(P, S, p, x, *, cross, pos, mask=None, context=None, context_mask=None, prev=None,
              mem=None):
    """x [b, n, dim] is the normed stream. Returns (output, pre_softmax_attn)."""
    b, n, dim = x.shape
    h, dh, a = S.heads, S.dim_head, S.attn
    inner = h * dh

    # 1. keys/values come from the context (cross) or from x, after the XL memory if any
    kv = context if cross else x
    if mem is not None:
        kv = torch.cat((mem, kv), dim=1)
    q_in, k_in = x, kv

    # 2. position-infused attention (self only): sinusoids on the q and k inputs, not v
    if not cross and S.position_infused_attn:
        offset = k_in.shape[1] - n
        q_in = q_in + sinusoids(pos["pia"], torch.arange(n) + offset)
        k_in = k_in + sinusoids(pos["pia"], torch.arange(k_in.shape[1]))

    # 3. projections without bias, heads split 'b n (h d) -> b h n d'
    def heads(t):
        return t.reshape(b, t.shape[1], h, dh).transpose(1, 2)

    if a["collab_heads"]:  # collaborative heads: q and k shared, int(compression h dh) wide;
        qk = int(a["collab_compression"] * inner)  # each head scales q by its mixing row
        mix = P(p + ".collab_mixing", (h, qk), normal(0.0, 1.0))
        q = torch.einsum("bid,hd->bhid", linear(P, p + ".to_q", q_in, qk, bias=False), mix)
        k = linear(P, p + ".to_k", k_in, qk, bias=False)[:, None]  # one k for every head
    else:
        q = heads(linear(P, p + ".to_q", q_in, inner, bias=False))
        k = heads(linear(P, p + ".to_k", k_in, inner, bias=False))
    v = heads(linear(P, p + ".to_v", kv, inner, bias=False))

    # 4. rotary on q, k AND v (self only)
    if not cross and S.rotary_pos_emb:
        q, k, v = rotate(q, pos["rotary"]), rotate(k, pos["rotary"]), rotate(v, pos["rotary"])

    # 5. padding mask on queries AND keys
    input_mask = None
    if mask is not None or (cross and context_mask is not None):
        q_mask = mask if mask is not None else torch.ones(b, n, dtype=torch.bool)
        if cross:
            k_mask = context_mask if context_mask is not None else torch.ones(b, k.shape[2], dtype=torch.bool)
        else:
            k_mask = q_mask
        input_mask = q_mask[:, None, :, None] & k_mask[:, None, None, :]

    # 6. memory key/values: prepended, broadcast over the batch, never rotated, never masked
    M = a["num_mem_kv"]
    if M > 0:
        mem_k = P(p + ".mem_k", (h, M, dh), normal(0.0, 1.0)).expand(b, h, M, dh)
        mem_v = P(p + ".mem_v", (h, M, dh), normal(0.0, 1.0)).expand(b, h, M, dh)
        k = torch.cat((mem_k, k), dim=2)
        v = torch.cat((mem_v, v), dim=2)
        if input_mask is not None:
            pad = torch.ones(b, 1, n, M, dtype=torch.bool)
            input_mask = torch.cat((pad, input_mask), dim=-1)

    if a["collab_heads"]:  # after the memory key/values (which 0.23.0 cannot combine with it)
        k = k.expand(-1, h, -1, -1)

    # 7. qk_norm: l2-normalised q and k, learned per-head log-temperature (§9)
    if S.qk_norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True)).clamp(min=1e-12)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True)).clamp(min=1e-12)
        s = P(p + ".scale", (1, h, 1, 1), normal(S.scale_init, 0.3))
        scale = 1.0 / s.exp().clamp(min=1e-2)
    else:
        scale = dh ** -0.5

    # 8. scaled logits [b, h, i, j]
    dots = (q @ k.transpose(-1, -2)) * scale
    I, J = dots.shape[-2:]

    # 9. residual attention: add the previous layer's pre-softmax logits; remember these
    if prev is not None:
        dots = dots + prev
    pre_softmax_attn = dots

    # 10. talking heads, before the softmax: a 1x1 conv over heads, no bias
    if a["talking_heads"]:
        w = P(p + ".pre_softmax_talking_heads.weight", (h, h, 1, 1), normal(0.0, 0.5))
        dots = torch.einsum("gh,bhij->bgij", w[:, :, 0, 0], dots)

    # 11. T5 relative position bias (self only), scaled by sqrt(dim_head) (§7.3)
    if not cross and S.rel_pos_bias:
        bucket = t5_bucket(I, J, S.causal, S.rel_pos_num_buckets, S.rel_pos_max_distance)
        bias = pos["rel_table"][bucket]  # [i, j, h]
        dots = dots + bias.permute(2, 0, 1)[None] * dh ** 0.5
    if not cross and S.alibi_pos_bias:  # or ALiBi, at the same point (§7.4)
        dots = dots + alibi_bias(S, pos, I, J)

    # 12. masks with -FLT_MAX: padding, max_attend_past, then causal j > i + (J - I) (self only)
    if input_mask is not None:
        dots = dots.masked_fill(~input_mask, -FLT_MAX)
    # ... max_attend_past (0.23.0: on every attention, cross too; keys counted over all J, so
    # memory key/values and XL memories further back than the window are masked as well) ...
    if a["max_attend_past"] is not None:
        dist = torch.arange(J - I, J)[:, None] - torch.arange(J)[None, :]
        dots = dots.masked_fill(dist > a["max_attend_past"], -FLT_MAX)
    if not cross and S.causal:
        future = torch.arange(J)[None, :] > torch.arange(I)[:, None] + (J - I)
        dots = dots.masked_fill(future, -FLT_MAX)

    # 13. sparse_topk (when k < J): logits below the row's k-th largest are masked too, ties
    # kept; the threshold only feeds the comparison, so no gradient flows through it
    if a["sparse_topk"] is not None and a["sparse_topk"] < J:
        vk = dots.topk(a["sparse_topk"], dim=-1).values[..., -1:]
        dots = dots.masked_fill(dots < vk, -FLT_MAX)

    # 14. softmax (max-subtracted; a fully masked row is uniform), or entmax15 (§10)
    attn = Entmax15.apply(dots) if a["use_entmax15"] else torch.softmax(dots, dim=-1)

    # 15. talking heads, after the softmax
    if a["talking_heads"]:
        w = P(p + ".post_softmax_talking_heads.weight", (h, h, 1, 1), normal(0.0, 0.5))
        attn = torch.einsum("gh,bhij->bgij", w[:, :, 0, 0], attn)

    # 16. weighted values, head scale, heads merged 'b h n d -> b n (h d)'
    out = attn @ v
    if a["head_scale"]:
        out = out * P(p + ".head_scale_params", (1, h, 1, 1), normal(1.0, 0.3))
    out = out.transpose(1, 2).reshape(b, n, inner)

    # 17. gate_values: sigmoid gate from the normed input x (not the PIA-shifted q input)
    if a["gate_values"]:
        out = out * torch.sigmoid(linear(P, p + ".to_v_gate", x, inner))

    # 18. output projection with bias; on_attn: Linear(inner, 2 dim) + GLU = a * sigmoid(g)
    if a["on_attn"]:
        val, gate = linear(P, p + ".to_out.0", out, 2 * dim).chunk(2, dim=-1)
        out = val * torch.sigmoid(gate)
    else:
        out = linear(P, p + ".to_out", out, dim)
    return out, pre_softmax_attn


# ---------------------------------------------------------------------------------------------
# AttentionLayers forward (§4)
# ---------------------------------------------------------------------------------------------

def block_norm(P, S, name, x):
    """The norm class of the stack; Identity under use_rezero (§4, §8)."""
    if S.use_rezero:
        return x
    if S.use_rmsnorm:
        return scale_or_rms_norm(P, name, x, S.dim, 1e-8)
    if S.use_scalenorm:
        return scale_or_rms_norm(P, name, x, 1, 1e-5)
    return layer_norm(P, name, x)


def attention_layers(P, S, x, mask=None, context=None, context_mask=None, mems=None):
    """Returns (x, hiddens): hiddens are the inputs (before the norm) of the 'a' layers, the
    Transformer-XL memories of the next segment (§10)."""
    # per-stack position tables, shared by every self-attention layer
    pos = {}
    mem_len = mems[0].shape[1] if mems else 0
    if S.rotary_pos_emb:  # theta[p] = p * inv_freq, freqs = cat(theta, theta), p < mem + n
        inv = P("attn_layers.rotary_pos_emb.inv_freq", (S.rotary_dim // 2,),
                value=fp32_inv_freq(S.rotary_dim))
        theta = torch.arange(mem_len + x.shape[1]).double()[:, None] * inv[None, :]
        pos["rotary"] = torch.cat((theta, theta), dim=-1)
    if S.position_infused_attn:
        pos["pia"] = P("attn_layers.pia_pos_emb.inv_freq", (S.dim // 2,), value=fp32_inv_freq(S.dim))
    if S.rel_pos_bias:  # one table [buckets, heads] for every self-attention layer
        pos["rel_table"] = P("attn_layers.rel_pos.relative_attention_bias.weight",
                             (S.rel_pos_num_buckets, S.heads), normal(0.0, 0.3))
    if S.alibi_pos_bias:  # slopes [1, h, 1, 1], zero past alibi_num_heads
        ha = S.alibi_num_heads or S.heads
        base = alibi_slopes(ha)
        pad = torch.zeros(S.heads - ha)

        def slopes(logs):
            return torch.cat((logs.exp().reshape(ha), pad))[None, :, None, None]
        if S.alibi_learned or not S.causal:  # learned log-slopes, drawn around log(base)
            past = P("attn_layers.rel_pos.learned_logslopes", (1, ha, 1, 1),
                     lambda shape, g: base.log().reshape(shape) + 0.3 * torch.randn(shape, generator=g))
            pos["alibi_past"] = slopes(past)
            if not S.causal:
                # 0.23.0 makes both parameters of one tensor (nn.Parameter(log_slopes) twice): they
                # share storage, so every state_dict holds equal values (and load_state_dict leaves
                # both with the second's); each still gets its own gradient
                future = P("attn_layers.rel_pos.learned_logslopes_future", (1, ha, 1, 1),
                           lambda shape, g: past.detach().clone())
                pos["alibi_future"] = slopes(future)
        else:  # fixed: non-persistent, not in the state dict
            pos["alibi_fixed"] = torch.cat((base, pad))[None, :, None, None]
    shifts = S.shift_tokens
    if not isinstance(shifts, tuple):
        shifts = (shifts,) * len(S.layer_types)

    mems = list(mems) if mems else None
    hiddens = []
    prev_attn = prev_cross_attn = None
    last = len(S.layer_types) - 1
    for i, t in enumerate(S.layer_types):
        li = "attn_layers.layers.%d" % i
        mem = None
        if t == "a":
            hiddens.append(x)
            mem = mems.pop(0) if mems else None
        residual = x
        qk_layer = S.use_qk_norm_attn and t in ("a", "c")  # qk-norm layers: post-branch norm only
        if S.pre_norm and not qk_layer:
            x = block_norm(P, S, li + ".0.0", x)
        blk = li + ".1" + (".fn" if S.use_rezero else "")  # Rezero wraps the block
        if shifts[i] > 0:  # ShiftTokens wraps the block; 'f' blocks are called without the mask
            s = shifts[i]
            x = shift_tokens(x, range(0 if S.causal else -s, s + 1), mask if t != "f" else None)
            blk += ".fn"
        if t == "a":
            out, pre = attention(P, S, blk, x, cross=False, pos=pos, mask=mask,
                                 prev=prev_attn, mem=mem)
        elif t == "c":
            out, pre = attention(P, S, blk, x, cross=True, pos=pos, mask=mask, context=context,
                                 context_mask=context_mask, prev=prev_cross_attn)
        else:
            f = S.ff
            if S.macaron:  # Scale(0.5, FeedForward): keys one level deeper, output halved
                out = 0.5 * feed_forward(P, blk + ".fn", x, f["mult"], f["glu"], f["relu_squared"],
                                         f["post_act_ln"])
            else:
                out = feed_forward(P, blk, x, f["mult"], f["glu"], f["relu_squared"], f["post_act_ln"])
        if S.use_rezero:
            out = out * P(li + ".1.g", (1,), normal(0.6, 0.2))
        if S.sandwich_norm or qk_layer:
            out = block_norm(P, S, li + ".0.1", out)
        if S.scale_residual:
            residual = residual * P(li + ".2.residual_scale", (S.dim,), normal(1.0, 0.2))
        x = gru_cell(P, li + ".2.gru", out, residual) if S.gate_residual else out + residual
        if t == "a" and S.residual_attn:
            prev_attn = pre
        if t == "c" and S.cross_residual_attn:
            prev_cross_attn = pre
        if not S.pre_norm and i != last:  # post-norm; the last one is the wrapper's norm
            x = block_norm(P, S, li + ".0.2", x)
    return x, hiddens


# ---------------------------------------------------------------------------------------------
# Wrappers (§3, §10) and xtc's EncoderDecoder
# ---------------------------------------------------------------------------------------------

def transformer_wrapper(P, call, tokens, mask=None, context=None, context_mask=None, mems=None):
    """TransformerWrapper (§3). Returns (logits, final-normed embeddings, hiddens)."""
    S = Layers(call.kwargs["attn_layers"])
    b, n = tokens.shape
    dim = S.dim
    emb_dim = call.get("emb_dim", dim)
    V = call.kwargs["num_tokens"]
    emb = P("token_emb.weight", (V, emb_dim), normal(0.0, (2.0 / emb_dim) ** 0.5))
    x = emb[tokens]  # not scaled by sqrt(dim)
    if call.get("use_pos_emb", True) and not S.has_pos_emb:  # learned, scaled by emb_dim^-0.5
        pe = P("pos_emb.emb.weight", (call.kwargs["max_seq_len"], emb_dim), normal(0.0, 1.0))
        x = x + pe[:n] * emb_dim ** -0.5
    if emb_dim != dim:
        x = linear(P, "project_emb", x, dim)
    M = call.get("num_memory_tokens", 0)
    if M > 0:  # memory tokens prepended; the padding mask is padded with True
        x = torch.cat((P("memory_tokens", (M, dim), normal(0.0, 1.0)).expand(b, M, dim), x), dim=1)
        if mask is not None:
            mask = torch.cat((torch.ones(b, M, dtype=torch.bool), mask), dim=1)
    x, hiddens = attention_layers(P, S, x, mask, context, context_mask, mems)
    x = layer_norm(P, "norm", x)  # always LayerNorm, whatever the stack's norm
    x = x[:, M:]
    if call.get("tie_embedding", False):
        logits = x @ emb.T  # no bias, no to_logits
    else:
        logits = linear(P, "to_logits", x, V)
    return logits, x, hiddens


def vit_wrapper(P, call, img):
    """ViTransformerWrapper (§10). Returns (logits or None, final-normed embeddings)."""
    S = Layers(call.kwargs["attn_layers"])
    dim, p = S.dim, call.kwargs["patch_size"]
    b, c, H, W = img.shape
    hp, wp = H // p, W // p
    # 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)'
    x = img.reshape(b, c, hp, p, wp, p).permute(0, 2, 4, 3, 5, 1).reshape(b, hp * wp, p * p * c)
    x = linear(P, "patch_to_embedding", x, dim)
    cls = P("cls_token", (1, 1, dim), normal(0.0, 1.0)).expand(b, 1, dim)
    x = torch.cat((cls, x), dim=1)
    n = x.shape[1]
    x = x + P("pos_embedding", (1, hp * wp + 1, dim), normal(0.0, 1.0))[:, :n]  # not scaled
    x, _ = attention_layers(P, S, x)
    x = layer_norm(P, "norm", x)
    logits = None
    if call.get("num_classes"):  # mlp_head = FeedForward(dim, dim_out = classes) on the cls token
        logits = feed_forward(P, "mlp_head", x[:, 0], dim_out=call.kwargs["num_classes"])
    return logits, x


def continuous_wrapper(P, call, x, mask=None):
    """ContinuousTransformerWrapper (§10); emb_dim is accepted and ignored.
    Returns (output, final-normed embeddings)."""
    S = Layers(call.kwargs["attn_layers"])
    dim = S.dim
    if call.get("dim_in"):
        x = linear(P, "project_in", x, dim)
    if call.get("use_pos_emb", True) and not S.has_pos_emb:
        pe = P("pos_emb.emb.weight", (call.kwargs["max_seq_len"], dim), normal(0.0, 1.0))
        x = x + pe[: x.shape[1]] * dim ** -0.5
    x, _ = attention_layers(P, S, x, mask)
    x = layer_norm(P, "norm", x)
    out = linear(P, "project_out", x, call.kwargs["dim_out"]) if call.get("dim_out") else x
    return out, x


def xtransformer_halves(call):
    """XTransformer's routing (§10): enc_* / dec_* prefixes, dim shared. Returns the two
    TransformerWrapper calls it stands for."""
    enc = {k[4:]: v for k, v in call.kwargs.items() if k.startswith("enc_")}
    dec = {k[4:]: v for k, v in call.kwargs.items() if k.startswith("dec_")}
    ew = {k: enc.pop(k) for k in ("num_tokens", "max_seq_len", "emb_dropout", "num_memory_tokens")
          if k in enc}
    dw = {k: dec.pop(k) for k in ("num_tokens", "max_seq_len", "emb_dropout") if k in dec}
    dim = call.kwargs["dim"]
    return (Call("TransformerWrapper", attn_layers=Call("Encoder", dim=dim, **enc), **ew),
            Call("TransformerWrapper",
                 attn_layers=Call("Decoder", dim=dim, cross_attend=True, **dec), **dw))


def xl_mems(inp):
    """The Transformer-XL memories mems.0, mems.1, ... of the inputs, or None."""
    mems = []
    while "mems.%d" % len(mems) in inp:
        mems.append(inp["mems.%d" % len(mems)])
    return mems or None


def run_model(P, call, inp):
    """The forward pass of a model on its named inputs (DESIGN.md "Module interface").
    Returns (outputs dict, loss or None)."""
    ctor = call.ctor
    if ctor == "TransformerWrapper":
        mems = xl_mems(inp)
        s = call.get("shift_mem_down", 0)
        if s and mems:  # the list rotated: layer l gets mems.<l + s>, and extends that one
            mems = mems[s:] + mems[:s]
        logits, _, hiddens = transformer_wrapper(
            P, call, inp["tokens"], inp.get("mask"), inp.get("context"), inp.get("context_mask"), mems)
        out = {"logits": logits}
        K = call.get("max_mem_len", 0)
        if K:  # new mems: cat(mems, hiddens)[:, -max_mem_len:], detached (§10)
            old = mems or [hdn[:, :0] for hdn in hiddens]
            for l, (m, hdn) in enumerate(zip(old, hiddens)):
                out["mems.%d" % l] = torch.cat((m, hdn), dim=1)[:, -K:].detach()
        loss = cross_entropy(logits, inp["targets"]) if "targets" in inp else None
        return out, loss
    if ctor == "ViTransformerWrapper":
        logits, _ = vit_wrapper(P, call, inp["image"])
        return {"logits": logits}, (logits * inp["loss_weights"]).mean()
    if ctor == "ContinuousTransformerWrapper":
        out, _ = continuous_wrapper(P, call, inp["x"], inp.get("mask"))
        return {"output": out}, (out * inp["loss_weights"]).mean()
    if ctor == "XTransformer":
        enc, dec = xtransformer_halves(call)
        src_mask, tgt = inp.get("src_mask"), inp["tgt"]
        _, context, _ = transformer_wrapper(P.sub("encoder."), enc, inp["src"], src_mask)
        if call.get("tie_token_emb", False):  # one embedding module, listed under both names
            P.alias("decoder.net.token_emb.weight", "encoder.token_emb.weight")
        tgt_mask = inp.get("tgt_mask")
        if tgt_mask is not None and tgt_mask.shape[1] == tgt.shape[1]:
            tgt_mask = tgt_mask[:, :-1]  # AutoregressiveWrapper cuts a full-length mask
        logits, _, _ = transformer_wrapper(P.sub("decoder.net."), dec, tgt[:, :-1], tgt_mask,
                                           context, src_mask)
        # the loss is over every position: padded targets are not excluded
        return {"logits": logits}, cross_entropy(logits, tgt[:, 1:])
    if ctor == "EncoderDecoder":
        enc, dec = call.kwargs["encoder"], call.kwargs["decoder"]
        E, src_mask = P.sub("encoder."), inp.get("src_mask")
        if enc.ctor == "ViTransformerWrapper":
            _, context = vit_wrapper(E, enc, inp["image"])
        elif enc.ctor == "ContinuousTransformerWrapper":
            _, context = continuous_wrapper(E, enc, inp["src"], src_mask)
        else:
            _, context, _ = transformer_wrapper(E, enc, inp["src"], src_mask)
        logits, _, _ = transformer_wrapper(P.sub("decoder."), dec, inp["tokens"], inp.get("mask"),
                                           context, src_mask)
        loss = cross_entropy(logits, inp["targets"]) if "targets" in inp else None
        return {"logits": logits}, loss
    raise ValueError("xt_ref: unknown model constructor %s" % ctor)


def gradients(P, loss):
    """d loss / d parameter for every parameter (not buffers), zero where unused. A tied
    parameter's gradient is the total, under each of its names."""
    names = [k for k in P.values if k not in P.buffers]
    uniq = []
    for k in names:
        if not any(P.values[k] is u for u in uniq):
            uniq.append(P.values[k])
    grads = torch.autograd.grad(loss, uniq, allow_unused=True)
    out = {}
    for k in names:
        j = next(i for i, u in enumerate(uniq) if u is P.values[k])
        g = grads[j]
        out[k] = torch.zeros_like(P.values[k]) if g is None else g
    return out
